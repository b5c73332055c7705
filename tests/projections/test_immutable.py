from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from projections.immutable import RUN_CELLS, Deferred, PList, PMap

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


class TestDeferredCells:
    @given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 2_500)), max_size=6))
    def test_a_list_of_runs_holds_their_items_and_gives_them_back(
        self, runs: list[tuple[str, int]]
    ) -> None:
        """`of_runs` holds the items its runs stand for; `runs` gives them back, merged."""
        items = [item for item, count in runs for _ in range(count)]
        plist = PList.of_runs(runs)
        assert len(plist) == len(items)
        assert [item for item, count in plist.runs() for _ in range(count)] == items
        assert plist.to_tuple() == tuple(items)
        merged = PList.of(items).runs()
        assert all(a[0] != b[0] for a, b in itertools.pairwise(merged))

    def test_cells_are_made_a_page_at_a_time_when_first_walked(self) -> None:
        """Reading the newest item makes one page of cells; a push and runs() make none."""
        made: list[int] = []

        def load() -> Any:
            made.append(1)
            return PList.of(["x"] * 3)._cells

        plist: PList[str] = PList.deferred(Deferred(load, 3, about=[("x", 3)])).push("y")
        assert plist.runs() == [("x", 3), ("y", 1)]
        assert made == []
        assert plist.pop().last == "x"
        assert made == [1]
        big = PList.of_runs([("a", 3 * RUN_CELLS)])
        assert big.pop(RUN_CELLS + 1).nth_newest(0) == "a"
        assert len(big.pop(RUN_CELLS + 1)) == 2 * RUN_CELLS - 1
