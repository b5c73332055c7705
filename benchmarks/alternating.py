"""A long run whose states alternate (`a --completed--> b --completed--> a`) on SQLite.

Every outcome pushes a state, and the stack's runs of equal states are all of length 1:
what a writer's machine snapshots cost as the stack deepens (issue 26). Each step runs
in a fresh process (its peak RSS its own):

* record: N outcomes in transactions of 1,000 (seconds, peak RSS, file bytes);
* read: a fresh process's `engine.load`, `StateStack` and the machine at N/2 (ms), then a
  rollback of half the stack on the loaded handle (ms), peak RSS.

Run: ``PYTHONPATH=<tree> python -P benchmarks/alternating.py --sizes 100000,200000,400000``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BATCH = 1000
"""Events per transaction."""


def _pipeline() -> Any:
    from engine import Pipeline

    return Pipeline(
        "alternating",
        initial="a",
        transitions=[("a", "completed", "b"), ("b", "completed", "a"), ("a", "end", "done")],
        final=["done"],
    )


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _record(path: Path, events: int) -> dict[str, Any]:
    from engine import Engine

    began = time.perf_counter()
    with Engine(f"sqlite:///{path}") as engine:
        run = engine.start_run(_pipeline())
        outcomes = events - 1
        for start in range(0, outcomes, BATCH):
            with run.batch():
                for _ in range(start, min(outcomes, start + BATCH)):
                    run.stage_completed(run.machine.state, {"ok": 1}, duration=1.0)
    seconds = time.perf_counter() - began
    path.with_name("run_id").write_text(str(run.id))
    size = sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if p.exists())
    return {"seconds": round(seconds, 2), "rss_mb": round(_rss_mb()), "mb": round(size / 1e6, 1)}


def _read(path: Path, events: int) -> dict[str, Any]:
    from engine import Engine
    from engine.machine import MachineFold
    from projections import StateStack

    run_id = path.with_name("run_id").read_text()
    with Engine(f"sqlite:///{path}", create=False) as engine:
        load, run = _timed(lambda: engine.load(run_id))
        half, _ = _timed(lambda: engine.project(run_id, StateStack, at=events // 2))
        machine, _ = _timed(lambda: engine.project(run_id, MachineFold(), at=events // 2))
        rollback, _ = _timed(lambda: run.rollback(run.machine.depth // 2, reason="deep"))
    return {"load_ms": load, "half_ms": half, "machine_half_ms": machine,
            "rollback_ms": rollback, "rss_mb": round(_rss_mb())}  # fmt: skip


def _timed(work: Any) -> tuple[float, Any]:
    began = time.perf_counter()
    done = work()
    return round((time.perf_counter() - began) * 1000, 1), done


CHILDREN = {"record": _record, "read": _read}


def _child(name: str, path: Path, events: int) -> dict[str, Any]:
    # The file itself (-P: not its folder on the path), not `-m`: the engine then comes
    # from PYTHONPATH, not from the working directory.
    command = [sys.executable, "-P", __file__, "--child", name,
               "--path", str(path), "--events", str(events)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    """Record and read one alternating run per size, each step a fresh process."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100000,200000,400000")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--events", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(CHILDREN[args.child](Path(args.path), args.events)))
        return
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "alt.db"
            row = {"events": size, **_child("record", path, size)}
            row.update({f"read_{k}": v for k, v in _child("read", path, size).items()})
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
