"""Deltas between stored snapshots: a snapshot written as the change of the whole one before."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from engine.readside.snapshots import SHARED_TEXT, applied, delta

_TEXT = st.text("0123456789,+", min_size=SHARED_TEXT, max_size=SHARED_TEXT + 300)


def snapshot_like(stack: str, stages: list[str], note: Any = None) -> Any:
    """JSON shaped as a view's snapshot: a stack's ranges, each stage's ranges, small values."""
    return [
        {"run": "r", "note": note},
        {"initial": "a", "table": [["a", "x", "b"]], "ranges": stack, "last": len(stack)},
        [[f"stage{index}", text, None] for index, text in enumerate(stages)],
        {"counts": {"a": 1}},
    ]


class TestDelta:
    @given(_TEXT, st.lists(_TEXT, max_size=3), _TEXT, st.integers(0, 400), st.integers(0, 3))
    def test_applied_to_its_whole_snapshot_a_delta_gives_the_snapshot(
        self, stack: str, stages: list[str], more: str, cut: int, extra: int
    ) -> None:
        """Any snapshot written as a delta of any earlier one (texts cut back and grown, stages
        added) is made again exactly from that earlier one."""
        whole = snapshot_like(stack, stages)
        grown = [text[: max(len(text) - cut, 0)] + more for text in [stack, *stages]]
        later = snapshot_like(grown[0], grown[1:] + ["9" * SHARED_TEXT] * extra, note=cut)
        change = delta(later, whole)
        assert change is None or applied(change, whole) == later

    def test_a_long_text_is_stored_as_what_follows_its_shared_start(self) -> None:
        """A deep stack's ranges grown since the whole snapshot cost only the new part."""
        stack = ",".join(["3"] * 10_000)
        whole, later = snapshot_like(stack, []), snapshot_like(stack + ",2,2", [])
        change = delta(later, whole)
        assert change is not None
        assert change["edits"] == [[[1, "ranges"], len(stack), len(stack), ",2,2"]]
        assert change["data"][1]["ranges"] == ""
        assert applied(change, whole) == later

    def test_nothing_shared_makes_no_delta(self) -> None:
        """A snapshot sharing no long text with the whole one has no delta (it would be no
        smaller): short texts and texts starting differently are not edits."""
        whole = snapshot_like("1" * 1_000, ["short"])
        assert delta(snapshot_like("2" * 1_000, ["short"]), whole) is None

    def test_a_delta_on_another_whole_snapshot_is_refused(self) -> None:
        """Applied to a snapshot other than its own (a text of another length at an edit's
        path), a delta gives None, never a wrong state."""
        whole = snapshot_like("4," * 500, [])
        change = delta(snapshot_like("4," * 600, []), whole)
        assert change is not None
        assert applied(change, snapshot_like("4," * 501, [])) is None
        assert applied(change, [{}, {"ranges": None}, [], {}]) is None
