"""The hash chain's cost: appends with links against appends without, and verify's speed.

Run: ``python -m benchmarks.chain`` (``--quick`` for a smoke run). The rows:

- batched appends (100 per transaction, SQLite, WAL, synchronous=FULL) with each
  event's link against the same code with a chain that writes none (`NoLinks`
  on the store's mapper): what the links cost an append, interleaved rounds;
- serialising one event: `to_chained` against `to_stored_event` (no link);
- checking the chain of one long run (SQLite, 100,001 events; ``--events 1000000``
  for the 1,000,001-event run): `engine.verify(run, chain_only=True)`, the stored
  events read a page at a time through the store's recorder and each link
  recomputed, events/s of wall clock and of CPU time, beside the same check fed
  the recorder's `StoredEvent` pages (what a recorder without the lean row read
  gives, and what SQLite gave before it), and its floors in the same process:
  reading the pages alone (as rows, and as `StoredEvent`s), and SHA-256 of the
  stored bytes alone; then the whole `engine.verify` (chain, table, projections)
  of it, and the process's peak RSS (the checks read a page at a time: it must
  not grow with the run). Each check is also clocked with worker processes (as many
  as the command line's ``verify --chain-only`` starts: the spare cores, for a run
  of 200,000 events or more; their CPU time counted in). ``--store URL`` checks the
  newest run of a store already written instead (e.g. a 1,000,001-event file kept
  from a run before).
- checking the chain of that run copied into PostgreSQL: `engine.verify` (by ranges of
  versions, each one streamed query) beside the same check page by page (a query a
  page, as before ranges), alternating, with and without worker processes.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import multiprocessing
import resource
import statistics
import time
from collections.abc import Callable, Iterator, Sized
from concurrent.futures import ProcessPoolExecutor
from typing import NamedTuple
from uuid import UUID, uuid4

from benchmarks._common import RESULT, WORK, record_outcomes, report, scratch
from benchmarks.peers.stagetrail_runs import Stagetrail
from benchmarks.scale import postgres_reachable, postgres_store
from engine import Engine
from engine.store.chain import Chain
from engine.store.meta import AtRest
from engine.store.sqlite.recorder import SQLiteRecorder
from engine.verify import chain_workers, spare_cores, verify_chain
from events import StageCompleted


class NoLinks(Chain):
    """A chain that links nothing: the baseline of what an append cost before links."""

    def link(self, previous: bytes, run_id: UUID, version: int, topic: str, body: bytes) -> bytes:
        """No link."""
        return b""

    def seal(self, body: bytes, link: bytes) -> bytes:
        """The body as it is."""
        return body

    def sealed(
        self, previous: bytes, run_id: UUID, version: int, topic: str, body: bytes
    ) -> tuple[bytes, bytes]:
        """The body as it is, no link."""
        return body, b""


def appended(count: int, linked: bool) -> int:
    """Append `count` outcomes in batches of 100 to a new SQLite store; how many."""
    with Engine(f"sqlite:///{scratch('chain.db')}") as engine:
        if not linked:
            engine.store.mapper.chain = NoLinks()
        record_outcomes(engine.start_run(WORK), count, 100)
    return count


def serialise_rates(rounds: int, count: int) -> tuple[float, float]:
    """Events/s serialised without and with a link (best of `rounds`, interleaved)."""
    mapper, run_id = AtRest().mapper(), uuid4()
    event = StageCompleted(run_id=run_id, version=7, stage="work", attempt=1, result=RESULT)
    previous = bytes(32)
    plain, chained = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(count):
            mapper.to_stored_event(event)
        plain.append(count / (time.perf_counter() - start))
        start = time.perf_counter()
        for _ in range(count):
            mapper.to_chained(event, previous)
        chained.append(count / (time.perf_counter() - start))
    return max(plain), max(chained)


def long_run(count: int, key: str | None = None) -> tuple[str, UUID]:
    """A SQLite store holding one run of `count` + 1 events (keyed links with `key`)."""
    url = f"sqlite:///{scratch('long.db')}"
    with Engine(url, chain_key=key) as engine:
        run = engine.start_run(WORK)
        record_outcomes(run, count, 1000)
        return url, run.id


def durable(count: int, linked: bool) -> int:
    """Append `count` outcomes one transaction each (fsync'd) to a new SQLite store."""
    with Engine(f"sqlite:///{scratch('chain.db')}") as engine:
        if not linked:
            engine.store.mapper.chain = NoLinks()
        run = engine.start_run(WORK)
        for _ in range(count):
            run.stage_completed("work", RESULT, duration=1.0)
    return count


def compared(runs: int, variant: str, linked: bool) -> int:
    """`benchmarks.compare`'s stagetrail workload: `runs` review runs recorded, by hand
    (``Run``) or by ``Supervisor.drive``; how many events."""
    peer = Stagetrail(scratch("compare.db"), variant)
    if not linked:
        peer.engine.store.mapper.chain = NoLinks()
    try:
        peer.record(runs)
        return int(peer.engine.store.recorder.max_notification_id() or 0)
    finally:
        peer.engine.close()


def paired(work: Callable[[bool], int], rounds: int) -> dict[str, float]:
    """Median and spread of with-links / without, in wall clock and CPU time, over `rounds`
    rounds; which goes first alternates, so both see the same machine load."""
    wall: list[float] = []
    cpu: list[float] = []
    for round_ in range(rounds):
        order = (True, False) if round_ % 2 == 0 else (False, True)
        seconds = {linked: _clocked(functools.partial(work, linked)) for linked in order}
        wall.append(seconds[False][0] / seconds[True][0])
        cpu.append(seconds[False][1] / seconds[True][1])
    return {
        "ratio": statistics.median(wall),
        "ratio_min": min(wall),
        "ratio_max": max(wall),
        "cpu_ratio": statistics.median(cpu),
        "cpu_ratio_min": min(cpu),
        "cpu_ratio_max": max(cpu),
        "rounds": rounds,
        "target": 0.95,
    }


def _clocked(work: Callable[[], int]) -> tuple[float, float]:
    """Seconds of wall clock and of CPU time `work` took."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


class Rates(NamedTuple):
    """One `engine.verify` of a run: events/s of wall clock and of CPU time, and why they differ."""

    wall: float
    cpu: float
    events: int
    preempted: int
    """Involuntary context switches: the scheduler gave the core to another process."""
    waited: int
    """Voluntary context switches: the process waited (for I/O, a lock)."""


def verify_rates(
    url: str,
    run_id: UUID,
    chain_only: bool,
    key: str | None = None,
    mmap: bool = False,
    workers: int = 0,
) -> Rates:
    """`engine.verify` of the run (with the chain `key`; with `mmap`, SQLite's reads through
    a memory map of the file, 1 GiB at most; with `workers` worker processes, whose CPU time
    counts) clocked."""
    with Engine(url, chain_key=key) as engine:
        if mmap:
            _map_reads(engine)
        before = resource.getrusage(resource.RUSAGE_SELF)
        children = _cpu(resource.RUSAGE_CHILDREN)
        wall, cpu = time.perf_counter(), time.process_time()
        checked = engine.verify(run_id, chain_only=chain_only, workers=workers)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        cpu += _cpu(resource.RUSAGE_CHILDREN) - children  # the workers, ended by now
        after = resource.getrusage(resource.RUSAGE_SELF)
        assert checked.ok, checked.problems[:3]
        assert checked.chain == "intact"
    preempted, waited = after.ru_nivcsw - before.ru_nivcsw, after.ru_nvcsw - before.ru_nvcsw
    return Rates(checked.events / wall, checked.events / cpu, checked.events, preempted, waited)


def _cpu(who: int) -> float:
    """Seconds of CPU time (user and system) of this process or of its ended children."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _map_reads(engine: Engine) -> None:
    """Set ``PRAGMA mmap_size`` (1 GiB) on the reading connection `verify` will borrow."""
    recorder = engine.store.recorder
    assert isinstance(recorder, SQLiteRecorder)
    readers = recorder.readers
    connection = readers.borrow()
    connection.execute(f"PRAGMA mmap_size={1 << 30}")
    readers.give_back(connection)


def through_stored_events(url: str, run_id: UUID) -> float:
    """Events/s of CPU time of the chain check fed the recorder's `StoredEvent` pages, each
    made a row: the path of a recorder without the lean read (and SQLite's before it)."""
    with Engine(url) as engine:
        store = engine.store
        pages = (
            [(e.originator_version, e.topic, e.state) for e in page]
            for page in store.stored_pages(run_id)
        )
        cpu = time.process_time()
        linked_from = store.must_link_from(run_id)
        checked = verify_chain(run_id, pages, store.mapper, must_link_from=linked_from)
        cpu = time.process_time() - cpu
        assert checked.ok, checked.problems[:3]
        assert checked.chain == "intact"
    return checked.events / cpu


def floor_rates(url: str, run_id: UUID) -> tuple[float, float, float]:
    """Events/s of CPU time of the chain check's parts alone: reading the run's pages as
    rows (what it reads), as the recorder's `StoredEvent`s, and one SHA-256 of each
    stored event's bytes."""
    with Engine(url) as engine:
        store = engine.store
        rows = _read_rate(store.stored_rows(run_id))
        events = _read_rate(store.stored_pages(run_id))
        hashed, cpu, sha256 = 0, 0.0, hashlib.sha256
        for page in store.stored_rows(run_id):
            states = [state for _, _, state in page]
            start = time.process_time()
            for state in states:
                sha256(state).digest()
            hashed, cpu = hashed + len(states), cpu + time.process_time() - start
    return rows, events, hashed / cpu


def _read_rate(pages: Iterator[Sized]) -> float:
    """Events/s of CPU time of reading `pages` through."""
    count, cpu = 0, time.process_time()
    for page in pages:
        count += len(page)
    return count / (time.process_time() - cpu)


def parse() -> argparse.Namespace:
    """The benchmarks' --quick and --json, and --events: the long run's length."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--events", type=int, default=100_000, help="the long run's outcomes")
    parser.add_argument("--verify-only", action="store_true", help="only the long run's checks")
    parser.add_argument("--store", help="check the newest run of this store URL (none written)")
    return parser.parse_args()


def append_rows(quick: bool) -> list[dict[str, object]]:
    """The links' cost to appends (ratios) and to serialising one event."""
    batched, repeats = (2000, 1) if quick else (20_000, 7)
    single, runs = (50, 5) if quick else (300, 100)
    appends = {
        "batched append, 100/transaction, SQLite": paired(
            lambda linked: appended(batched, linked), repeats
        ),
        "durable single append, SQLite": paired(lambda linked: durable(single, linked), repeats),
        "compare's workload, Run": paired(lambda linked: compared(runs, "Run", linked), repeats),
        "compare's workload, Supervisor.drive": paired(
            lambda linked: compared(runs, "Supervisor.drive", linked), repeats
        ),
    }
    plain, chained = serialise_rates(3 if quick else 7, 2000 if quick else 20_000)
    return [
        *({"case": case, **ratios} for case, ratios in appends.items()),
        {
            "case": "serialise one event",
            "with_link": chained,
            "without": plain,
            "microseconds_added": 1e6 / chained - 1e6 / plain,
        },
    ]


def verify_rows(events: int, rounds: int, store: str | None = None) -> list[dict[str, object]]:
    """The chain alone (plain and keyed, SQLite and PostgreSQL) and the whole verify of one
    run of `events` + 1 events (or of the newest run of `store`)."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as writer:  # its memory not ours
        if store is None:
            url, run_id = writer.submit(long_run, events).result()
        else:
            url, run_id = store, newest_run(store)
        keyed_url, keyed_run = writer.submit(long_run, events, CHAIN_KEY).result()
    checks: dict[str, list[Rates]] = {
        "plain": [], "mmap": [], "keyed": [], "plain workers": [], "keyed workers": [],
    }  # fmt: skip
    before: list[float] = []
    workers = chain_workers(events + 1, spare_cores())
    # A memory-mapped read counts the pages it touched in the process's RSS: another one's.
    with ProcessPoolExecutor(1, mp_context=spawn) as mapped:
        for _ in range(rounds):  # alternating, so all see the same machine load
            checks["plain"].append(verify_rates(url, run_id, True))
            checks["plain workers"].append(verify_rates(url, run_id, True, workers=workers))
            checks["mmap"].append(
                mapped.submit(verify_rates, url, run_id, True, None, True).result()
            )
            checks["keyed"].append(verify_rates(keyed_url, keyed_run, True, CHAIN_KEY))
            checks["keyed workers"].append(
                verify_rates(keyed_url, keyed_run, True, CHAIN_KEY, workers=workers)
            )
            before.append(through_stored_events(url, run_id))
    read, read_events, hashed = floor_rates(url, run_id)
    chain_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    whole = verify_rates(url, run_id, False)
    count = checks["plain"][0].events
    rows = [
        {
            "case": f"check the chain of a {count:,}-event run, SQLite",
            **_summary(checks["plain"]),
            "target": 500_000,
            "through_stored_events_cpu_events_s": statistics.median(before),
            "read_alone_cpu_events_s": read,
            "read_stored_events_alone_cpu_events_s": read_events,
            "sha256_alone_cpu_events_s": hashed,
            "peak_rss_mb": chain_rss,
            **_with_workers(checks["plain workers"], workers),
        },
        {
            "case": "the same, reads memory-mapped (PRAGMA mmap_size, another process)",
            **_summary(checks["mmap"]),
        },
        {
            "case": "the same, keyed links (HMAC-SHA256)",
            **_summary(checks["keyed"]),
            **_with_workers(checks["keyed workers"], workers),
        },
        {
            "case": "the whole verify of that run",
            "events_s": whole.wall,
            "cpu_events_s": whole.cpu,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        },
    ]
    if postgres_reachable():
        rows.append(postgres_row(url, run_id, rounds))
    return rows


CHAIN_KEY = "the writers' secret"
"""The chain key of the keyed run."""


def _summary(checks: list[Rates]) -> dict[str, object]:
    """Median wall clock and CPU time rates (CPU spread), and the context switches per check."""
    return {
        "events_s": statistics.median(c.wall for c in checks),
        "cpu_events_s": statistics.median(c.cpu for c in checks),
        "cpu_events_s_min": min(c.cpu for c in checks),
        "cpu_events_s_max": max(c.cpu for c in checks),
        "preempted": statistics.median(c.preempted for c in checks),
        "waited": statistics.median(c.waited for c in checks),
    }


def _with_workers(checks: list[Rates], workers: int) -> dict[str, object]:
    """The median rates of the check with `workers` worker processes (CPU time: all of them)."""
    return {
        "workers": workers,
        "with_workers_events_s": statistics.median(c.wall for c in checks),
        "with_workers_cpu_events_s": statistics.median(c.cpu for c in checks),
    }


def postgres_row(url: str, run_id: UUID, rounds: int) -> dict[str, object]:
    """The chain check of the same run copied, byte for byte, into a new PostgreSQL schema:
    by ranges of versions (`engine.verify`), page by page (`select_rows`, a query a page:
    before ranges) and as `StoredEvent` pages, alternating."""
    with postgres_store() as target:
        with Engine(url) as source, Engine(target) as copy:
            for page in source.store.stored_pages(run_id):
                copy.store.recorder.insert_events(page)
        checks, helped, paged, paged_helped, before = [], [], [], [], []
        workers = chain_workers(newest_version(target, run_id), spare_cores())
        for _ in range(rounds):
            checks.append(verify_rates(target, run_id, True))
            paged.append(page_by_page(target, run_id))
            helped.append(verify_rates(target, run_id, True, workers=workers))
            paged_helped.append(page_by_page(target, run_id, workers))
            before.append(through_stored_events(target, run_id))
    return {
        "case": f"check the chain of that run, PostgreSQL ({checks[0].events:,} events)",
        **_summary(checks),
        "through_stored_events_cpu_events_s": statistics.median(before),
        **_with_workers(helped, workers),
        "page_by_page_events_s": statistics.median(c.wall for c in paged),
        "page_by_page_cpu_events_s": statistics.median(c.cpu for c in paged),
        "page_by_page_with_workers_events_s": statistics.median(c.wall for c in paged_helped),
        "page_by_page_with_workers_cpu_events_s": statistics.median(c.cpu for c in paged_helped),
    }


def page_by_page(url: str, run_id: UUID, workers: int = 0) -> Rates:
    """The chain check of the run read a page (a query) at a time through the store's
    recorder, as PostgreSQL's was before it read by ranges (with `workers` checking pages
    this process reads), clocked as `verify_rates` clocks."""
    with Engine(url) as engine:
        store = engine.store
        before = resource.getrusage(resource.RUSAGE_SELF)
        children = _cpu(resource.RUSAGE_CHILDREN)
        wall, cpu = time.perf_counter(), time.process_time()
        checked = verify_chain(
            run_id, store.stored_rows(run_id), store.mapper,
            must_link_from=store.must_link_from(run_id), workers=workers,
        )  # fmt: skip
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        cpu += _cpu(resource.RUSAGE_CHILDREN) - children
        after = resource.getrusage(resource.RUSAGE_SELF)
        assert checked.ok, checked.problems[:3]
        assert checked.chain == "intact"
    preempted, waited = after.ru_nivcsw - before.ru_nivcsw, after.ru_nvcsw - before.ru_nvcsw
    return Rates(checked.events / wall, checked.events / cpu, checked.events, preempted, waited)


def newest_version(url: str, run_id: UUID) -> int:
    """The version of the run's newest event in the store at `url`."""
    with Engine(url) as engine:
        newest = engine.store.last(run_id)
        assert newest is not None
        return newest.version


def newest_run(url: str) -> UUID:
    """The id of the newest run of the store at `url`."""
    with Engine(url) as engine:
        (summary,) = engine.runs(limit=1)
        return summary.run_id


def main() -> None:
    """Measure and print the chain's figures."""
    args = parse()
    rows = [] if args.verify_only else append_rows(args.quick)
    rows += verify_rows(5000 if args.quick else args.events, 1 if args.quick else 3, args.store)
    report("hash chain (events/s)", rows, args.json)


if __name__ == "__main__":
    main()
