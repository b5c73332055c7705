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
_FLAT = frozenset({str, int, float, bool, type(None)})
"""The types of a version (or any value JSON holds flat): equal and of the same type as the
parent's plain one, it is plain too."""
_NEW: Any = object()
"""A node the parent had not seen anything for."""


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
    if parent is not None:
        patch = _patch(skeleton, parent)
        if patch is not None:
            return {"patch": patch}
    return {"full": skeleton} if is_plain(skeleton) else None


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


def _patch(skeleton: dict[str, Any], parent: dict[str, Any]) -> dict[str, Any] | None:
    """What differs from `parent` (changed keys, changed versions, per node changed seen ones);
    None when a patch cannot rebuild `skeleton` exactly: it drops a key of the parent (down to
    what each node has seen), or holds what JSON would change.

    One pass, the saver's per-checkpoint work: what is left out equals the parent's (plain)
    value with the same types throughout, and every key is checked to be a str, so the
    skeleton is plain exactly when the patch is.
    """
    if not parent.keys() - _OWN <= skeleton.keys():
        return None
    patch: dict[str, Any] = {}
    for key, value in skeleton.items():
        if type(key) is not str:
            return None
        if key in VERSIONS:
            continue
        if not is_plain(value):  # the few top-level values: checked whole, nested keys too
            return None
        if key in _OWN or key not in parent or not _same(parent[key], value):
            patch[key] = value
    versions = _changed(skeleton.get("channel_versions"), parent.get("channel_versions", {}))
    if versions is None:
        return None
    if versions:
        patch["channel_versions"] = versions
    seen = _seen_changed(skeleton.get(_NESTED), parent.get(_NESTED, {}))
    if seen is None:
        return None
    if seen:
        patch[_NESTED] = seen
    return patch


def _seen_changed(now: Any, before: Any) -> dict[str, Any] | None:
    """Per node, the versions it saw anew (a node new since `before`: all, even none); None as
    `_changed` says."""
    if type(now) is not dict or type(before) is not dict or not before.keys() <= now.keys():
        return None
    seen: dict[str, Any] = {}
    for node, versions in now.items():
        if type(node) is not str:
            return None
        had = before.get(node, _NEW)
        changed = _changed(versions, {} if had is _NEW else had)
        if changed is None:
            return None
        if changed or had is _NEW:
            seen[node] = changed
    return seen


def _changed(now: Any, before: Any) -> dict[str, Any] | None:
    """The entries of `now` that `before` lacks or holds another value for; None unless both
    are dicts, `now` has every key of `before`, and the entries are plain."""
    if type(now) is not dict or type(before) is not dict or not before.keys() <= now.keys():
        return None
    changed: dict[str, Any] = {}
    held_at = before.get
    for key, value in now.items():
        if type(key) is not str:
            return None
        held = held_at(key, _NEW)
        if held is value:
            continue  # the parent's own value, which is plain
        kind = type(value)
        if kind is type(held) and kind in _FLAT and held == value:
            continue  # a version equal to the parent's, of its type: plain too (finite, say)
        if not is_plain(value):
            return None
        if kind is type(held) and kind not in _FLAT and _same(held, value):
            continue
        changed[key] = value
    return changed


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
