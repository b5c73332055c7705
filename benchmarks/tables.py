"""Loading big tables: `Pipeline.from_dict` and `engine.load` against the table's size.

Doubling the states doubles a linear build's time and quadruples a quadratic
one's: ``doubling_ratio`` (time at 50,000 states / time at 25,000) is about 2
when linear (a little more: Python's cyclic GC scans the growing heap), about 4
when quadratic. Times are CPU time, so other load on the machine weighs less.

Run: ``python -m benchmarks.tables`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from benchmarks._common import arguments, report
from engine import Engine, Pipeline
from engine import pipeline as pipeline_module


def table(states: int) -> dict[str, Any]:
    """A chain of `states` stages, each with a retry row, and one ``*`` row: 2n rows."""
    names = [f"stage-{index}" for index in range(states)]
    rows = [[names[i], "completed", names[i + 1]] for i in range(states - 1)]
    rows += [[name, "failed", name] for name in names[:-1]]
    rows.append(["*", "aborted", "aborted"])
    return {
        "name": f"chain-{states}",
        "initial": names[0],
        "final": [names[-1], "aborted"],
        "states": [*names, "aborted"],
        "transitions": rows,
    }


def from_dict_seconds(states: int) -> float:
    """Seconds to rebuild a pipeline of `states` states from its stored table (cache cold)."""
    data = table(states)
    pipeline_module._from_json.cache_clear()
    gc.collect()
    start = time.process_time()
    Pipeline.from_dict(data)
    return time.process_time() - start


def load_seconds(states: int) -> float:
    """Seconds for `engine.load` of a run of that pipeline (in a memory store, cache cold)."""
    pipeline = Pipeline.from_dict(table(states))
    with Engine("memory://", max_event_bytes=1 << 30) as engine:
        run = engine.start_run(pipeline)
        for name in pipeline.states[:10]:
            run.stage_completed(name)
        pipeline_module._from_json.cache_clear()
        gc.collect()
        start = time.process_time()
        engine.load(run.id)
        return time.process_time() - start


def main() -> None:
    """Print each case's time at half the big size and at the big size, and their ratio."""
    args = arguments(__doc__ or "")
    big = 5_000 if args.quick else 50_000
    rows = []
    for case, measure in (("Pipeline.from_dict", from_dict_seconds), ("engine.load", load_seconds)):
        half = min(measure(big // 2) for _ in range(2))
        full = min(measure(big) for _ in range(2))
        rows.append(
            {
                "case": f"{case}, {big // 2:,} and {big:,} states",
                "seconds_half": half,
                "seconds_full": full,
                "us_per_state": full / big * 1e6,
                "doubling_ratio": full / half,
                "target_ratio": 2.5,
            }
        )
    report("big tables (doubling the states: ~2x when linear, ~4x when quadratic)", rows, args.json)


if __name__ == "__main__":
    main()
