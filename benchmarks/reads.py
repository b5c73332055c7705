"""A run's events read from a SQLite file: the lean read against eventsourcing's, one process.

`engine/store/sqlite/recorder.py` reads a run's events with one SELECT on a kept
connection, as plain rows (`select_rows`); eventsourcing's `select_events` (the
read before it) runs through its pool, inside BEGIN ... ROLLBACK, and makes a
`StoredEvent` per row (handed to the store as rows here). Both read the same
store, swapped on the same recorder and interleaved round by round, with raw
sqlite3 (`benchmarks.compare`'s floor, same workload) timed in the same rounds.
Cases: point-in-time state (`engine.project(at=4)`), a run's history
(`engine.events`), and recording supervised runs, whose supervisor re-reads each
run's new events after every stage.
The store is in the text layout (``?layout=text``): eventsourcing's own select
looks a run up by its hex id, which a compact store (16-byte ids) does not hold.

Run: ``python -m benchmarks.reads`` (about 20 seconds; ``--quick`` for a smoke run).
"""

from __future__ import annotations

import random
import statistics
import time
import types
from collections.abc import Callable
from typing import Any

from eventsourcing.sqlite import SQLiteApplicationRecorder

from benchmarks._common import arguments, report, scratch, timed
from benchmarks.peers.raw_sqlite import RawSqlite
from benchmarks.peers.stagetrail_runs import Stagetrail
from engine.store.sqlite.recorder import SQLiteRecorder

TARGET = 3.0
"""Point-in-time state and history: at most this many times raw sqlite3's time."""


def main() -> None:
    """Time both read paths and raw sqlite3, interleaved, and print the ratios."""
    args = arguments(__doc__ or "")
    runs, rounds, sample = (20, 2, 10) if args.quick else (300, 7, 50)
    raw = RawSqlite(scratch("raw.db"))
    ours = Stagetrail(scratch("stagetrail.db"), "Supervisor.drive", layout="text")
    recorder = ours.engine.store.recorder
    assert isinstance(recorder, SQLiteRecorder)
    paths: dict[str, Callable[..., Any]] = {
        "lean": recorder.select_rows,
        "eventsourcing": _eventsourcing_rows(recorder),
    }
    raw_ids, our_ids = raw.record(runs), ours.record(runs)
    times: dict[str, list[float]] = {}
    for round_ in range(rounds):
        picked = random.Random(round_)
        theirs, mine = picked.sample(raw_ids, sample), picked.sample(our_ids, sample)
        _add(times, "raw state", _median_us(lambda r: raw.state_at(r, 4), theirs))
        _add(times, "raw history", _median_us(raw.history, theirs))
        _add(times, "raw record", timed(lambda: len(raw.record(runs // 3)))[1])
        for name, select in paths.items():
            recorder.select_rows = select  # type: ignore[method-assign]
            _add(times, f"{name} state", _median_us(lambda r: ours.state_at(r, 4), mine))
            _add(times, f"{name} history", _median_us(ours.history, mine))
            _add(times, f"{name} record", timed(lambda: len(ours.record(runs // 3)))[1])
    raw.close()
    ours.close()
    report(f"Reading a run's events on SQLite ({runs} runs, {rounds} rounds)",
           _rows(times), args.json)  # fmt: skip


def _eventsourcing_rows(recorder: SQLiteRecorder) -> Callable[..., Any]:
    """eventsourcing's `select_events` on `recorder`, its `StoredEvent`s as the store's rows."""
    select = types.MethodType(SQLiteApplicationRecorder.select_events, recorder)

    def rows(run_id: Any, **query: Any) -> list[tuple[int, str, bytes]] | None:
        if query.pop("joined", False) is not False:
            return None  # eventsourcing has no joined page: the store reads this one as rows
        return [(e.originator_version, e.topic, e.state) for e in select(run_id, **query)]

    return rows


def _add(times: dict[str, list[float]], key: str, value: float) -> None:
    times.setdefault(key, []).append(value)


def _median_us(work: Callable[[Any], Any], items: list[Any]) -> float:
    spent = []
    for item in items:
        began = time.perf_counter()
        work(item)
        spent.append((time.perf_counter() - began) * 1e6)
    return statistics.median(spent)


def _ratio(times: dict[str, list[float]], key: str, base: str) -> float:
    """The median of the per-round ratios of `key`'s time to `base`'s."""
    return statistics.median(a / b for a, b in zip(times[key], times[base], strict=True))


def _rows(times: dict[str, list[float]]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for case, unit in (("state", "us"), ("history", "us")):
        lean = _ratio(times, f"lean {case}", f"raw {case}")
        rows.append({
            "case": f"{case} ({unit}, median)",
            "raw_sqlite3": statistics.median(times[f"raw {case}"]),
            "eventsourcing_read": statistics.median(times[f"eventsourcing {case}"]),
            "lean_read": statistics.median(times[f"lean {case}"]),
            "eventsourcing_vs_raw": _ratio(times, f"eventsourcing {case}", f"raw {case}"),
            "lean_vs_raw": lean, "target": f"<= {TARGET}x raw", "met": lean <= TARGET,
        })  # fmt: skip
    rows.append({
        "case": "supervised recording (lean read's speed-up; >1 is faster)",
        "speedup": _ratio(times, "eventsourcing record", "lean record"),
        "lean_vs_raw_slowdown": _ratio(times, "lean record", "raw record"),
        "eventsourcing_vs_raw_slowdown": _ratio(times, "eventsourcing record", "raw record"),
    })  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
