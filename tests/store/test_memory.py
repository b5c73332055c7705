"""The in-memory backend's recorder: direct lookups that agree with eventsourcing's scan."""

from __future__ import annotations

import uuid

from eventsourcing.persistence import ApplicationRecorder, StoredEvent
from eventsourcing.popo import POPOApplicationRecorder
from hypothesis import given
from hypothesis import strategies as st

from engine.store.memory import MemoryRecorder

bounds = st.one_of(st.none(), st.integers(min_value=-2, max_value=25))


def filled(recorder: ApplicationRecorder, run_id: uuid.UUID, count: int) -> None:
    """Store `count` events of one run, versions 1..count."""
    events = [StoredEvent(run_id, v, "topic", b"{}") for v in range(1, count + 1)]
    if events:
        recorder.insert_events(events)


class TestMemoryRecorder:
    @given(
        st.integers(min_value=0, max_value=20),
        bounds,
        bounds,
        st.one_of(st.none(), st.integers(min_value=1, max_value=25)),
    )
    def test_selects_what_the_general_scan_selects(
        self, count: int, gt: int | None, lte: int | None, limit: int | None
    ) -> None:
        """For any gt, lte and limit, the direct lookup returns the scan's events in order."""
        run_id = uuid.uuid4()
        fast, scan = MemoryRecorder(), POPOApplicationRecorder()
        filled(fast, run_id, count)
        filled(scan, run_id, count)
        expected = scan.select_events(run_id, gt=gt, lte=lte, limit=limit)
        found = fast.select_events(run_id, gt=gt, lte=lte, limit=limit)
        assert [e.originator_version for e in found] == [e.originator_version for e in expected]

    def test_descending_reads_use_the_scan(self) -> None:
        """A newest-first read gives the newest versions first, as eventsourcing's does."""
        run_id = uuid.uuid4()
        recorder = MemoryRecorder()
        filled(recorder, run_id, 5)
        found = recorder.select_events(run_id, desc=True, limit=2)
        assert [e.originator_version for e in found] == [5, 4]
