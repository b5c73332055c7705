"""The hash chain's cost: appends with links against appends without, and verify's speed.

Run: ``python -m benchmarks.chain`` (``--quick`` for a smoke run). The rows:

- batched appends (100 per transaction, SQLite, WAL, synchronous=FULL) with each
  event's link against the same code with a chain that writes none (`NoLinks`
  on the store's mapper): what the links cost an append, interleaved rounds;
- serialising one event: `to_chained` against `to_stored_event` (no link);
- checking the chain of one long run (SQLite): stored events read in pages,
  each decrypted/decompressed and its link recomputed (`ChainCheck`), events/s;
  and the whole `engine.verify` (chain, table, projections) for comparison.
"""

from __future__ import annotations

import statistics
import time
from uuid import UUID, uuid4

from benchmarks._common import RESULT, WORK, arguments, median_rates, report, scratch
from engine import Engine
from engine.store.chain import Chain
from engine.store.meta import AtRest
from engine.verify import ChainCheck
from events import StageCompleted


class NoLinks(Chain):
    """A chain that links nothing: the baseline of what an append cost before links."""

    def link(self, previous: bytes, run_id: UUID, version: int, topic: str, body: bytes) -> bytes:
        """No link."""
        return b""

    def seal(self, body: bytes, link: bytes) -> bytes:
        """The body as it is."""
        return body


def appended(count: int, linked: bool) -> int:
    """Append `count` outcomes in batches of 100 to a new SQLite store; how many."""
    with Engine(f"sqlite:///{scratch('chain.db')}") as engine:
        if not linked:
            engine.store.mapper.chain = NoLinks()
        run = engine.start_run(WORK)
        for _ in range(count // 100):
            with run.batch():
                for _ in range(100):
                    run.stage_completed("work", RESULT, duration=1.0)
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


def long_run(count: int) -> tuple[str, UUID]:
    """A SQLite store holding one run of `count` + 1 events."""
    url = f"sqlite:///{scratch('long.db')}"
    with Engine(url) as engine:
        run = engine.start_run(WORK)
        for _ in range(count // 1000):
            with run.batch():
                for _ in range(1000):
                    run.stage_completed("work", RESULT, duration=1.0)
        return url, run.id


def chain_rate(url: str, run_id: UUID) -> float:
    """Events/s of checking the run's chain alone, from its stored events."""
    with Engine(url) as engine:
        links = ChainCheck(engine.store.mapper.chain)
        start = time.perf_counter()
        count = links.pages(engine.store.stored_pages(run_id), engine.store.mapper)
        seconds = time.perf_counter() - start
        assert links.status == "intact"
        assert not links.problems
    return count / seconds


def verify_rate(url: str, run_id: UUID) -> float:
    """Events/s of the whole `engine.verify` of the run."""
    with Engine(url) as engine:
        start = time.perf_counter()
        report_ = engine.verify(run_id)
        seconds = time.perf_counter() - start
        assert report_.ok
        assert report_.chain == "intact"
    return report_.events / seconds


def main() -> None:
    """Measure and print the chain's figures."""
    args = arguments(__doc__ or "")
    batched, repeats, long_events = (2000, 1, 5000) if args.quick else (20_000, 5, 100_000)
    rates = median_rates(
        {"links": lambda: appended(batched, True), "none": lambda: appended(batched, False)},
        repeats,
    )
    plain, chained = serialise_rates(3 if args.quick else 7, 2000 if args.quick else 20_000)
    url, run_id = long_run(long_events)
    checks = [chain_rate(url, run_id) for _ in range(1 if args.quick else 3)]
    report(
        "hash chain (events/s)",
        [
            {
                "case": "batched append, 100/transaction, SQLite",
                "with_links": rates["links"],
                "without": rates["none"],
                "ratio": rates["links"] / rates["none"],
                "target": 0.95,
            },
            {
                "case": "serialise one event",
                "with_link": chained,
                "without": plain,
                "microseconds_added": 1e6 / chained - 1e6 / plain,
            },
            {
                "case": f"check the chain of a {long_events + 1:,}-event run",
                "events_s": statistics.median(checks),
                "target": 500_000,
                "whole_verify_events_s": verify_rate(url, run_id),
            },
        ],
        args.json,
    )


if __name__ == "__main__":
    main()
