"""Loading big tables: `Pipeline.from_dict` and `engine.load` against the table's size.

A linear build costs the same per state at 1,000 states as at 50,000; the ratio
of the two per-state costs (``growth``) is about 1 when linear, and about 50
when quadratic.

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
    start = time.perf_counter()
    Pipeline.from_dict(data)
    return time.perf_counter() - start


def load_seconds(states: int) -> float:
    """Seconds for `engine.load` of a run of that pipeline (in a memory store, cache cold)."""
    pipeline = Pipeline.from_dict(table(states))
    with Engine("memory://", max_event_bytes=1 << 30) as engine:
        run = engine.start_run(pipeline)
        for name in pipeline.states[:10]:
            run.stage_completed(name)
        pipeline_module._from_json.cache_clear()
        gc.collect()
        start = time.perf_counter()
        engine.load(run.id)
        return time.perf_counter() - start


def main() -> None:
    """Print per-state costs at a small and a big size, and their ratio."""
    args = arguments(__doc__ or "")
    small, big = (500, 5_000) if args.quick else (1_000, 50_000)
    rows = []
    for case, measure in (("Pipeline.from_dict", from_dict_seconds), ("engine.load", load_seconds)):
        per_small = min(measure(small) for _ in range(3)) / small
        per_big = min(measure(big) for _ in range(2)) / big
        rows.append(
            {
                "case": f"{case}, {small:,} vs {big:,} states",
                f"seconds_at_{big}": per_big * big,
                "us_per_state_small": per_small * 1e6,
                "us_per_state_big": per_big * 1e6,
                "growth": per_big / per_small,
                "target_growth": 2.0,
            }
        )
    report("big tables (per-state cost; growth ~1 is linear)", rows, args.json)


if __name__ == "__main__":
    main()
