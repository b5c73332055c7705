"""A checkpoint's skeleton (its id, time and channel versions) stored as JSON, as a delta.

From one checkpoint to the next, LangGraph changes the versions of a few
channels and what a few nodes have seen; the rest is repeated. A skeleton is
stored as ``{"delta": ...}`` (only what differs from its parent's), or
``{"full": ...}``, both plain JSON; one holding anything JSON cannot carry
exactly (a tuple, bytes) is left to LangGraph's serde instead. Pure: no I/O.
"""

from __future__ import annotations

import json
from typing import Any

VERSIONS = ("channel_versions", "versions_seen")
"""The fields stored as what changed since the parent checkpoint."""


def is_plain(value: Any) -> bool:
    """Whether JSON holds `value` exactly: dicts with str keys, lists, str, int, finite floats.

    Checked by a round trip through the C JSON codec: a tuple, an int key, bytes, a set
    or NaN does not come back equal (or does not go at all).
    """
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return False
    return bool(json.loads(text) == value)


def encode(skeleton: dict[str, Any], parent: dict[str, Any] | None) -> dict[str, Any] | None:
    """The stored form of `skeleton`: a delta from `parent` where exact, else full; None if not.

    Args:
        skeleton: the checkpoint without its channel values.
        parent: the parent checkpoint's skeleton, as `decode` rebuilt it, if known.
    """
    if not is_plain(skeleton):
        return None
    if parent is not None and _only_grows(skeleton, parent):
        return {"delta": _delta(skeleton, parent)}
    return {"full": skeleton}


def decode(stored: dict[str, Any], parent: dict[str, Any] | None) -> dict[str, Any]:
    """The skeleton `encode` stored, rebuilt on its parent's when it is a delta.

    Raises:
        ValueError: a delta whose parent is unknown.
    """
    if "full" in stored:
        return dict(stored["full"])
    if parent is None:
        raise ValueError("a checkpoint stored as a delta needs its parent's skeleton")
    delta = stored["delta"]
    rebuilt = {k: v for k, v in delta.items() if k not in VERSIONS}
    for field in VERSIONS:
        rebuilt[field] = {**parent.get(field, {}), **delta.get(field, {})}
    return rebuilt


def _only_grows(skeleton: dict[str, Any], parent: dict[str, Any]) -> bool:
    """Whether every versioned key of the parent is still in the child (a delta can't drop one)."""
    for field in VERSIONS:
        now, before = skeleton.get(field), parent.get(field, {})
        if type(now) is not dict or type(before) is not dict or not before.keys() <= now.keys():
            return False
    return True


def _delta(skeleton: dict[str, Any], parent: dict[str, Any]) -> dict[str, Any]:
    delta = {k: v for k, v in skeleton.items() if k not in VERSIONS}
    for field in VERSIONS:
        before, now = parent.get(field, {}), skeleton.get(field, {})
        delta[field] = {k: v for k, v in now.items() if before.get(k) != v or k not in before}
    return delta
