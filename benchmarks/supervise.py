"""Supervision overhead: `Supervisor.execute` of a no-op stage vs recording the same by hand.

Both sides write the same events (StageStarted, StageCompleted) durably to a
SQLite file, one transaction each; the supervisor adds its checks and
decisions. Target: supervised <= 1.5 times the time of hand recording.

Run: ``python -m benchmarks.supervise`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks._common import RESULT, WORK, arguments, median_rates, report, scratch
from engine import CircuitBreaker, Engine, ProgressPolicy, RetryPolicy, Run

TARGET = 1.5


def noop() -> dict[str, object]:
    """The stage function: nothing to do."""
    return RESULT


def by_hand(engine: Engine, attempts: int) -> Callable[[], int]:
    """Record `attempts` attempts through `Run` directly."""

    def work() -> int:
        run = engine.start_run(WORK)
        for _ in range(attempts):
            run.stage_started("work")
            run.stage_completed("work", noop())
        return attempts

    return work


def supervised(engine: Engine, attempts: int, **settings: object) -> Callable[[], int]:
    """Run `attempts` attempts of a no-op function through `Supervisor.execute`."""

    def work() -> int:
        run: Run = engine.start_run(WORK)
        sup = engine.supervisor(**settings)
        for _ in range(attempts):
            sup.execute(run, "work", noop)
        return attempts

    return work


def compare(url: str, attempts: int, repeats: int) -> dict[str, float]:
    """Attempts/s by hand, supervised, and supervised with every policy on, in one store."""
    with Engine(url) as engine:
        decisions = {
            "retry": RetryPolicy(max_retries=3, timeout=None),
            "breaker": CircuitBreaker(fail_max=3),
            "progress": ProgressPolicy(max_steps=10**9),
        }
        cases = {
            "by_hand": by_hand(engine, attempts),
            "supervised": supervised(engine, attempts),
            "supervised_all_policies": supervised(engine, attempts, **decisions),
        }
        return median_rates(cases, repeats)


def main() -> None:
    args = arguments(__doc__ or "")
    attempts, repeats = (200, 3) if args.quick else (2_000, 7)
    rows: list[dict[str, object]] = []
    stores = {"SQLite file, durable": f"sqlite:///{scratch('supervise.db')}",
              "memory, no I/O: the pure CPU overhead": "memory://"}  # fmt: skip
    for store, url in stores.items():
        rates = compare(url, attempts, repeats)
        for case in ("supervised", "supervised_all_policies"):
            cost = rates["by_hand"] / rates[case]  # time per attempt, relative to by hand
            rows.append({
                "case": f"{case} no-op attempt vs Run by hand ({store})",
                "by_hand": rates["by_hand"], "supervised": rates[case], "cost": round(cost, 3),
                "target": f"<= {TARGET}x" if url != "memory://" else "(none)",
                "met": cost <= TARGET if url != "memory://" else None,
            })  # fmt: skip
    report("supervision overhead (attempts/s; cost = supervised time / hand time)", rows, args.json)


if __name__ == "__main__":
    main()
