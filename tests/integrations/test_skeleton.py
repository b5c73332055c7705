"""Checkpoint skeletons stored as JSON: deltas from the parent only where they rebuild exactly."""

from __future__ import annotations

import math
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="needs the langgraph extra (the package imports it)")

from engine.integrations.langgraph import skeleton

PARENT: dict[str, Any] = {
    "v": 4,
    "id": "1f0-1",
    "ts": "2026-11-23T10:00:00+00:00",
    "channel_versions": {"log": 2, "branch:to:plan": 2},
    "versions_seen": {"plan": {"branch:to:plan": 1}},
    "updated_channels": ["log"],
}
CHILD: dict[str, Any] = {
    "v": 4,
    "id": "1f0-2",
    "ts": "2026-11-23T10:00:01+00:00",
    "channel_versions": {"log": 3, "branch:to:plan": 2, "plan": 3},
    "versions_seen": {"plan": {"branch:to:plan": 2}},
    "updated_channels": ["log", "plan"],
}


class TestEncode:
    def test_a_child_is_stored_as_what_changed(self) -> None:
        """Only the versions that changed are stored, and they rebuild the child exactly."""
        stored = skeleton.encode(CHILD, PARENT)
        assert stored is not None
        assert "delta" in stored
        assert stored["delta"]["channel_versions"] == {"log": 3, "plan": 3}
        assert skeleton.decode(stored, PARENT) == CHILD

    def test_a_removed_channel_makes_it_full(self) -> None:
        """A delta cannot say a key went away: such a skeleton is stored whole."""
        child = {**CHILD, "channel_versions": {"log": 3}}
        stored = skeleton.encode(child, PARENT)
        assert stored == {"full": child}
        assert skeleton.decode(stored, None) == child

    def test_without_a_parent_it_is_full(self) -> None:
        """The first checkpoint of a thread has nothing to be a delta of."""
        assert skeleton.encode(PARENT, None) == {"full": PARENT}

    @pytest.mark.parametrize(
        "value",
        [(1, 2), b"x", {1: "a"}, math.nan, math.inf, {"nested": {"s": {1, 2}}}],
        ids=["tuple", "bytes", "int-key", "nan", "inf", "set"],
    )
    def test_what_json_cannot_hold_exactly_is_left_to_serde(self, value: Any) -> None:
        """A skeleton holding a value JSON would change is not stored as JSON at all."""
        assert skeleton.encode({**PARENT, "extra": value}, None) is None

    def test_a_delta_needs_its_parent(self) -> None:
        """Decoding a delta without the parent's skeleton is an error, not a guess."""
        stored = skeleton.encode(CHILD, PARENT)
        assert stored is not None
        with pytest.raises(ValueError, match="parent"):
            skeleton.decode(stored, None)
