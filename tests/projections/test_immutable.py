from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from projections.immutable import PMap

updates = st.lists(
    st.tuples(st.text(min_size=1, max_size=6), st.sampled_from(["pending", "active", "done"])),
    max_size=200,
)


class TestPMap:
    @given(updates)
    def test_behaves_like_a_dict(self, changes: list[tuple[str, str]]) -> None:
        """After any updates the map equals a dict given the same updates, in size and items."""
        statuses, expected = PMap[str, str](), {}
        for task_id, status in changes:
            statuses = statuses.set(task_id, status)
            expected[task_id] = status
        assert dict(statuses) == expected
        assert len(statuses) == len(expected)
        assert sorted(statuses) == sorted(expected)
        assert all(statuses.get(key) == value for key, value in expected.items())

    def test_updates_leave_earlier_maps_unchanged(self) -> None:
        """set() returns a new map; the old one still holds the old statuses."""
        before = PMap[str, str]().set("t1", "pending")
        after = before.set("t1", "completed").set("t2", "pending")
        assert dict(before) == {"t1": "pending"}
        assert dict(after) == {"t1": "completed", "t2": "pending"}

    def test_missing_tasks(self) -> None:
        """A task never set is absent: get() gives the default, `in` is False."""
        statuses = PMap[str, str]().set("t1", "pending")
        assert statuses.get("nope") is None
        assert "nope" not in statuses
