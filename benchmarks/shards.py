"""What the one read view over shards costs: the same runs in one PostgreSQL store and in 2 or 4.

The same number of runs (a few events each, one commit per run) is recorded, by
one process, into one store (a schema) and into layouts of 2 and 4 schemas on the same server, then
read the ways the commands and the viewer read, the cases interleaved round by
round: the first page of ``runs`` (50), a deep page (offset 1,000), a filtered
page (one label value, 1 run in 10), and ``load`` of a run by id, through the
layout and through the run's shard's own `Engine` (what the routing adds). Each figure
is the median time of one call; the ratio is against the single store.

Run: ``python -m benchmarks.shards`` (about a minute; ``--quick`` for a smoke run).
Needs PostgreSQL at ``$STAGETRAIL_TEST_POSTGRES`` (default 127.0.0.1, db ``test``).
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common import WORK, arguments, report
from engine.engine import Engine
from engine.sharded import ShardedEngine

POSTGRES = os.environ.get("STAGETRAIL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def main() -> None:
    """Record the runs into each layout, time the reads, print medians and ratios."""
    args = arguments(__doc__ or "")
    runs, rounds = (200, 3) if args.quick else (2000, 21)
    schemas: list[str] = []
    engines: dict[str, Any] = {}
    try:
        for count in (1, 2, 4):
            engines[f"{count} store(s)"] = _layout(count, schemas)
        recorded, seconds = {}, {}
        for name, engine in engines.items():
            start = time.perf_counter()
            recorded[name] = _record(engine, runs)
            seconds[name] = time.perf_counter() - start
        rows = [_recording(seconds, runs), *_measure(engines, recorded, rounds, runs)]
    finally:
        for engine in engines.values():
            engine.close()
        _drop(schemas)
    report(f"shards: {runs} runs, PostgreSQL schemas on one server", rows, args.json)


def _layout(count: int, schemas: list[str]) -> Any:
    """One store, or a sharded engine over `count` fresh schemas."""
    urls = []
    for _ in range(count):
        schemas.append(f"bench_{uuid.uuid4().hex[:12]}")
        urls.append(f"{POSTGRES}?schema={schemas[-1]}")
    if count == 1:
        return Engine(urls[0])
    lines = "\n".join(f's{i} = "{url}"' for i, url in enumerate(urls))
    path = Path(tempfile.mkdtemp(prefix="stagetrail-shards-")) / "shards.toml"
    path.write_text(f"[shards]\n{lines}\n", encoding="utf-8")
    return ShardedEngine(f"shards://{path}")


def _record(engine: Any, runs: int) -> list[uuid.UUID]:
    """`runs` finished runs of four events, one commit each; every tenth labelled team=blue."""
    ids = []
    for n in range(runs):
        run = engine.start_run(WORK, labels={"team": "blue" if n % 10 == 0 else "red"})
        with run.batch():
            run.stage_completed("work", {"n": n})
            run.stage_completed("work", {"n": n})
            run.finish("succeeded")
        ids.append(run.id)
    engine.runs(limit=1)  # the run index caught up before anything is timed
    return ids


def _recording(seconds: dict[str, float], runs: int) -> dict[str, object]:
    """Runs recorded per second by one process (one commit a run), each layout."""
    base = seconds["1 store(s)"]
    row: dict[str, object] = {"case": "record runs, one process (runs/s)", "1 store": runs / base}
    for name in list(seconds)[1:]:
        row[f"{name.split()[0]} shards"] = runs / seconds[name]
        row[f"{name.split()[0]} shards x"] = base / seconds[name]
    return row


def _measure(
    engines: dict[str, Any], recorded: dict[str, list[uuid.UUID]], rounds: int, runs: int
) -> list[dict[str, object]]:
    cases: dict[str, Callable[[Any, list[uuid.UUID]], object]] = {
        "runs(limit=50)": lambda e, ids: e.runs(limit=50),
        f"runs(limit=50, offset={min(1000, runs // 2)})": lambda e, ids: e.runs(
            limit=50, offset=min(1000, runs // 2)
        ),
        "runs(label=team=blue, limit=50)": lambda e, ids: e.runs(label="team=blue", limit=50),
        "load(run_id)": lambda e, ids: e.load(random.choice(ids)),
        "load(run_id) by its shard's own Engine": lambda e, ids: _own(e, random.choice(ids)),
    }
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for case, call in cases.items():
            for name, engine in engines.items():
                start = time.perf_counter()
                call(engine, recorded[name])
                times.setdefault((case, name), []).append(time.perf_counter() - start)
    rows: list[dict[str, object]] = []
    for case in cases:
        base = statistics.median(times[(case, "1 store(s)")])
        row: dict[str, object] = {"case": case, "1 store ms": base * 1000}
        for name in list(engines)[1:]:
            median = statistics.median(times[(case, name)])
            row[f"{name.split()[0]} shards ms"] = median * 1000
            row[f"{name.split()[0]} shards x"] = median / base
        rows.append(row)
    return rows


def _own(engine: Any, run_id: uuid.UUID) -> object:
    """`load` without the layout's routing: the run's shard's engine (or the one store)."""
    own = engine.shard_of(run_id) if isinstance(engine, ShardedEngine) else engine
    return own.load(run_id)


def _drop(schemas: list[str]) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        for schema in schemas:
            drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            conn.execute(drop)


if __name__ == "__main__":
    main()
