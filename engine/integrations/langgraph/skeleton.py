"""A checkpoint's skeleton (its id, time and channel versions) stored as JSON, as a patch.

From one checkpoint to the next, LangGraph changes the versions of a few
channels and, for the nodes that ran, a few of the versions they have seen; the
rest is repeated. A skeleton is stored as ``{"patch": ...}`` (only what differs
from its parent's: changed top-level keys, changed channel versions, and per
node the changed versions it saw), or ``{"full": ...}``, both plain JSON; one
holding anything JSON cannot carry exactly (a tuple, bytes) is left to
LangGraph's serde instead. Skeletons written before patches, ``{"delta": ...}``
(every top-level key, and the versioned fields' changed entries one level
deep), are still read. Pure: no I/O.
"""

from __future__ import annotations

import math
from typing import Any

VERSIONS = ("channel_versions", "versions_seen")
"""The fields stored as what changed since the parent checkpoint."""
_NESTED = "versions_seen"
"""The versioned field whose entries are themselves versions (node → channel → version)."""
_OWN = frozenset({"id"})
"""Keys a checkpoint never shares with its parent: always in its patch (the saver stores the
id with the event and takes it out before saving)."""


def is_plain(value: Any) -> bool:
    """Whether JSON holds `value` exactly: dicts with str keys, lists, str, int, finite floats.

    Checked by type, exactly: a tuple, an int key, bytes, a set, NaN or a subclass
    (an enum, a named tuple) would not come back as it went, so it is not plain.
    A walk over the value's types costs a third of a round trip through the JSON
    codec, and the saver asks this of every checkpoint it saves.
    """
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        return all(type(key) is str and is_plain(item) for key, item in value.items())
    if kind is list:
        return all(map(is_plain, value))
    return False


def encode(skeleton: dict[str, Any], parent: dict[str, Any] | None) -> dict[str, Any] | None:
    """The stored form of `skeleton`: a patch on `parent` where exact, else full; None if not.

    Args:
        skeleton: the checkpoint without its channel values.
        parent: the parent checkpoint's skeleton, as `decode` rebuilt it, if known.
    """
    if not is_plain(skeleton):
        return None
    if parent is not None and _only_grows(skeleton, parent):
        return {"patch": _patch(skeleton, parent)}
    return {"full": skeleton}


def decode(stored: dict[str, Any], parent: dict[str, Any] | None) -> dict[str, Any]:
    """The skeleton `encode` stored, rebuilt on its parent's when it is a patch or delta.

    Raises:
        ValueError: a patch or delta whose parent is unknown.
    """
    if "full" in stored:
        return dict(stored["full"])
    if parent is None:
        raise ValueError("a checkpoint stored as a delta needs its parent's skeleton")
    if "patch" in stored:
        return _patched(stored["patch"], parent)
    delta = stored["delta"]
    rebuilt = {k: v for k, v in delta.items() if k not in VERSIONS}
    for field in VERSIONS:
        rebuilt[field] = {**parent.get(field, {}), **delta.get(field, {})}
    return rebuilt


def _patched(patch: dict[str, Any], parent: dict[str, Any]) -> dict[str, Any]:
    """`parent` with `patch` applied: its keys replaced, its versions merged in."""
    rebuilt = {k: v for k, v in parent.items() if k not in _OWN}
    rebuilt.update((k, v) for k, v in patch.items() if k not in VERSIONS)
    rebuilt["channel_versions"] = {
        **parent.get("channel_versions", {}),
        **patch.get("channel_versions", {}),
    }
    seen = dict(parent.get(_NESTED, {}))
    for node, versions in patch.get(_NESTED, {}).items():
        seen[node] = {**seen.get(node, {}), **versions}
    rebuilt[_NESTED] = seen
    return rebuilt


def _only_grows(skeleton: dict[str, Any], parent: dict[str, Any]) -> bool:
    """Whether the child keeps every key of the parent, down to what each node has seen
    (a patch cannot drop one)."""
    if not parent.keys() - _OWN <= skeleton.keys():
        return False
    for field in VERSIONS:
        now, before = skeleton.get(field), parent.get(field, {})
        if not _grows(now, before):
            return False
    seen, before_seen = skeleton[_NESTED], parent.get(_NESTED, {})
    return all(_grows(seen[node], before_seen.get(node, {})) for node in seen)


def _grows(now: Any, before: Any) -> bool:
    """Whether `now` and `before` are dicts and `now` has every key of `before`."""
    return type(now) is dict and type(before) is dict and before.keys() <= now.keys()


def _patch(skeleton: dict[str, Any], parent: dict[str, Any]) -> dict[str, Any]:
    """What differs from `parent`: changed keys, changed versions, per node changed seen ones."""
    patch = {
        k: v
        for k, v in skeleton.items()
        if k in _OWN or (k not in VERSIONS and (k not in parent or not _same(parent[k], v)))
    }
    versions = _changed(skeleton["channel_versions"], parent.get("channel_versions", {}))
    if versions:
        patch["channel_versions"] = versions
    before_seen = parent.get(_NESTED, {})
    seen = {
        node: changed
        for node, versions_seen in skeleton[_NESTED].items()
        if (changed := _changed(versions_seen, before_seen.get(node, {})))
        or node not in before_seen
    }
    if seen:
        patch[_NESTED] = seen
    return patch


def _changed(now: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The entries of `now` that `before` lacks or holds another value for."""
    return {k: v for k, v in now.items() if k not in before or not _same(before[k], v)}


def _same(a: Any, b: Any) -> bool:
    """Whether two plain values are equal with the same types throughout (``1 == 1.0 == True``
    for Python, not for what a checkpoint stored)."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
