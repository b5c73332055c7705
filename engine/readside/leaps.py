"""Leaps of the run index's catch-up over a long run, onto its writer's stored snapshot.

A run's writer stores `RunIndex` snapshots as the run grows (`engine.readside.keeper`).
When a page of notifications ends inside a long run whose stored snapshots lie
further on, the catch-up may take one as the run's summary and move its position to
that snapshot's event without reading the events in between, as long as no other
run's event lies in between. That is known without reading them: a run's events
take increasing notification ids, so the ``version - last.version`` events after the
page's last one fill every id up to the snapshot's event exactly when the two ids
differ by that count. Where other runs' events (or gaps in the ids: a rolled-back
transaction on PostgreSQL) lie between, the leap lands on the newest snapshot before
the first of them, found by a binary search over the run's versions; the next page
reads them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

import attrs

from engine.readside.snapshots import stored_snapshot
from engine.store.views import PageSave, Views
from events import JSON, Event
from projections.run_index import RunIndex

LEAP_MIN = 2000
"""Fewest events a leap passes over: a shorter stretch is read faster than a leap is checked."""

_log = logging.getLogger(__name__)


IdFinder = Callable[[UUID, int], int | None]
"""What a leap needs of the store's recorder: its `notification_id(run_id, version)`, the id
of a run's event (None: not stored)."""


@attrs.frozen
class Leap:
    """A stretch of the notification log one run fills alone, and its summary at its end."""

    run_id: UUID
    passed: int
    """The run's events the leap passes over."""
    target: int
    """The notification id of the snapshot's event: the position after the leap."""
    summary: JSON
    """The run's summary after that event, as `RunIndex.encode` writes it."""

    def saved(self, start: int, generation: int, resets: int) -> PageSave:
        """The run index's save of the leap from position `start`: the run's summary and the
        new position, in one transaction, refused as a page's is (`PageSave`)."""
        return PageSave(
            RunIndex.name,
            start,
            self.target,
            {str(self.run_id): self.summary},
            RunIndex().identity(),
            generation=generation,
            resets=resets,
        )


def find_leap(
    recorder: Any,
    views: Views,
    events: Sequence[Event],
    end: int,
    stop: int,
    generation: int,
) -> Leap | None:
    """The leap from a page of `events` folded up to notification `end`, to at most `stop`:
    over the run of its last event, onto that run's newest summary stored in `generation`.

    Where other runs' events (or gaps in the ids) lie between, it lands on the newest
    summary before the first of them. None where there is none worth taking: the
    recorder cannot find ids, the page's last run fills less than half of it, or no
    summary it may land on lies `LEAP_MIN` events or more further on.
    """
    finder: IdFinder | None = getattr(recorder, "notification_id", None)
    if finder is None or not events or end >= stop:
        return None
    last = events[-1]
    run_id = last.run_id
    if sum(event.run_id == run_id for event in events) * 2 < len(events):
        return None  # runs interleave here: a snapshot ahead would hardly ever fit
    shortest = last.version + LEAP_MIN
    if not _alone(finder, run_id, last.version, end, shortest):
        return None  # one query rules out a page where runs interleave
    # A snapshot up to this version is the newest whose event may lie at or before `stop`.
    upto = last.version + (stop - end)
    stored = _newest(views, run_id, generation, upto)
    if stored is None or stored[0] < shortest:
        return None
    alone = _alone_upto(finder, run_id, (shortest, last.version), end, stored[0])
    if alone < stored[0]:  # another run's events come first: the newest summary before them
        stored = _newest(views, run_id, generation, alone)
        if stored is None or stored[0] < shortest:
            return None
    version, summary = stored
    if not _describes(summary, run_id, version):
        return None
    passed = version - last.version
    return Leap(run_id, passed, end + passed, summary)


def _newest(views: Views, run_id: UUID, generation: int, upto: int) -> tuple[int, JSON] | None:
    """The run's newest summary stored in `generation` up to event `upto`; None if there is
    none, or it cannot be read (the pages then say the same, slower)."""
    try:
        return stored_snapshot(views, run_id, RunIndex(), generation, upto)
    except Exception as error:
        _log.debug("run %s's stored summary not used: %s", run_id, error)
        return None


def _alone(finder: IdFinder, run_id: UUID, last: int, end: int, version: int) -> bool:
    """Whether the run's events after version `last` (at id `end`) fill every id up to its
    event `version` (False if that event is not stored)."""
    found = finder(run_id, version)
    return found is not None and found - end == version - last


def _alone_upto(
    finder: IdFinder, run_id: UUID, versions: tuple[int, int], end: int, upto: int
) -> int:
    """The newest version up to `upto` whose events after the page's last version (at id
    `end`) fill every id up to its own, `versions` holding one known to (and that last
    one): a binary search, since the ids other runs' events (or gaps) take among them
    only grow in number with the version (`upto` itself is tried first)."""
    low, last = versions
    high, probe = upto, upto
    while low < high:
        if _alone(finder, run_id, last, end, probe):
            low = probe
        else:
            high = probe - 1
        probe = (low + high + 1) // 2
    return low


def _describes(summary: JSON, run_id: UUID, version: int) -> bool:
    """Whether `summary` is a run summary of `run_id` after event `version`."""
    return (
        isinstance(summary, dict)
        and summary.get("run_id") == str(run_id)
        and summary.get("version") == version
    )
