"""The savers alone: LangGraph's calls to a checkpointer, captured once and replayed on each.

`benchmarks.langgraph` times a whole graph, LangGraph's own work included (most
of a super-step's CPU). Here the RetryPolicy graph of that benchmark runs once
on `StagetrailSaver`, a recording wrapper noting each call LangGraph makes to
it (``get_tuple``, ``put``, ``put_writes``, ``list``, with their arguments,
copied) and each retry LangGraph logs (which the saver records as the node's
failed attempts); the sequence is then replayed, without LangGraph's loop, on
`StagetrailSaver` and on LangGraph's `SqliteSaver`, each on its own SQLite
file, a fresh thread id per replay, the savers interleaved. Figures: process
CPU µs per super-step of each saver and their ratio.

The replay is what LangGraph asks, in the order the saver took it: a
``get_tuple`` is called from a frame whose ``self`` is a compiled graph on the
saver, as LangGraph's own ``stream`` calls it (so the plain
``StagetrailSaver(engine)`` learns the graph's nodes), and configs keep what a
checkpointer reads of them (``configurable``'s values, the loop's marker, the
metadata), not LangGraph's runtime objects.

For callgrind, ``--saver NAME`` replays one saver only, and the replays are
bracketed by ``os.getppid()`` and ``os.getpgrp()``: run it under
``valgrind --tool=callgrind --zero-before=os_getppid --dump-before=os_getpgrp``
and the first dump holds the replays' instructions alone (divide by
``--replays`` times the super-steps per thread, printed); with ``--graph``, the
marks hold the graph itself run on that saver (LangGraph's work too). ``--calls FILE``
saves the captured calls (pickle) on first use and replays that file after,
and ``--events FILE`` replays under a frozen clock and writes every row the
store holds, so two versions of the saver can be compared byte for byte.

Run: ``python -m benchmarks.saver_calls`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import copy
import functools
import logging
import os
import pickle
import sqlite3
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver

from benchmarks import langgraph as graph_bench
from benchmarks._common import report, scratch
from engine import Engine
from engine.integrations.langgraph import StagetrailSaver
from engine.integrations.langgraph.attempts import RETRY_LOGGER

STEPS = len(graph_bench.NODES) + graph_bench.FAILURES
"""Super-steps per thread, as `benchmarks.langgraph` counts them (node attempts)."""
RECORDED = ("get_tuple", "put", "put_writes", "list")
"""The checkpointer methods LangGraph's loop calls that are captured."""
_LOOP_MARK = "__pregel_runtime"
"""A key LangGraph's loop puts in the configs it hands a checkpointer (its value is not read)."""
_CAPTURED_THREAD = "captured"

Call = tuple[str, tuple[Any, ...]]
"""A captured call: the method (or ``"log"``, a retry LangGraph logged) and its arguments."""


def _config(config: dict[str, Any]) -> dict[str, Any]:
    """What a checkpointer reads of a config, as plain values (the loop's runtime a marker)."""
    conf = {
        key: "replayed" if key == _LOOP_MARK else copy.deepcopy(value)
        for key, value in config.get("configurable", {}).items()
        if key == _LOOP_MARK or not key.startswith("__") or isinstance(value, str)
    }
    return {"configurable": conf, "metadata": copy.deepcopy(dict(config.get("metadata", {})))}


def _arguments(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A call's arguments as plain copies, positional (``list`` keeps only its config)."""
    config = None if args[0] is None else _config(args[0])
    if name == "put_writes":
        writes, task_id, *rest = (*args[1:], *kwargs.values())
        return (config, [tuple(copy.deepcopy(w)) for w in writes], task_id, *rest)
    return (config, *copy.deepcopy(args[1:]))


def _retry_record(record: logging.LogRecord) -> tuple[Any, ...]:
    """What a retry's log record carries that the saver reads: its message and exception."""
    error = record.exc_info[1] if record.exc_info else None
    kept = copy.copy(error)  # its notes kept, LangGraph's traceback not
    return (record.levelno, record.getMessage(), kept)


def capture() -> list[Call]:
    """LangGraph's calls to `StagetrailSaver` while the RetryPolicy graph runs one thread."""
    graph_bench.MODE["retry"] = True
    side = graph_bench.Side("capture", graph_bench.stagetrail_saver)
    saver, calls, lock = side.graph.checkpointer, [], threading.Lock()
    for name in RECORDED:
        method = getattr(saver, name)

        @functools.wraps(method)  # its signature: LangGraph passes `task_path` to those taking it
        def recorded(*args: Any, _name: str = name, _method: Any = method, **kw: Any) -> Any:
            found = _method(*args, **kw)
            if _name == "list":
                found = list(found)
            with lock:  # noted once done: the order the saver took the calls in
                calls.append((_name, _arguments(_name, args, kw)))
            return iter(found) if _name == "list" else found

        setattr(saver, name, recorded)
    logger = logging.getLogger(RETRY_LOGGER)
    handle = logger.handle

    def heard(record: logging.LogRecord) -> None:
        with lock:
            calls.append(("log", _retry_record(record)))
        handle(record)

    logger.handle = heard  # type: ignore[method-assign]
    try:
        graph_bench.run_thread(side.graph, _CAPTURED_THREAD)
    finally:
        del logger.handle
    return [(name, _on_thread(args, _CAPTURED_THREAD)) for name, args in calls]


def _on_thread(args: tuple[Any, ...], thread_id: str) -> tuple[Any, ...]:
    """The arguments with every config naming the captured thread naming `thread_id`."""
    found = []
    for arg in args:
        if isinstance(arg, dict) and "configurable" in arg:
            arg = copy.deepcopy(arg)
            for part in (arg["configurable"], arg["metadata"]):
                if "thread_id" in part:
                    part["thread_id"] = thread_id
        found.append(arg)
    return tuple(found)


def _read_as_graph(self: Any, saver: BaseCheckpointSaver[Any], config: Any) -> Any:
    """``saver.get_tuple(config)`` from a frame whose ``self`` is the graph (as LangGraph's)."""
    return saver.get_tuple(config)


class Replayer:
    """One saver on its own SQLite file, and the graph its `get_tuple` is called from."""

    def __init__(self, name: str, saver: BaseCheckpointSaver[Any]) -> None:
        self.name, self.saver, self.threads = name, saver, 0
        graph_bench.MODE["retry"] = True
        self.graph = graph_bench.builder({}, graph_bench.REPLY).compile(checkpointer=saver)
        self.logger = logging.getLogger(RETRY_LOGGER)

    def prepared(self, calls: list[Call], count: int) -> list[list[Call]]:
        """`count` copies of `calls`, each on a fresh thread of this saver."""
        ready = []
        for _ in range(count):
            thread_id = f"{self.name}-{self.threads}"
            self.threads += 1
            ready.append([(name, _on_thread(args, thread_id)) for name, args in calls])
        return ready

    def replay(self, calls: list[Call]) -> None:
        """Make the calls on the saver, in order."""
        saver = self.saver
        for name, args in calls:
            if name == "get_tuple":
                _read_as_graph(self.graph, saver, *args)
            elif name == "put":
                saver.put(*args)
            elif name == "put_writes":
                saver.put_writes(*args)
            elif name == "list":
                list(saver.list(*args))
            else:
                self._retry_logged(*args)

    def _retry_logged(self, level: int, message: str, error: BaseException) -> None:
        """Log the retry again, now, as LangGraph's retry loop did."""
        exc_info = (type(error), error, None)
        record = self.logger.makeRecord(RETRY_LOGGER, level, __file__, 0, message, (), exc_info)
        self.logger.handle(record)


def stagetrail(path: Path) -> Replayer:
    return Replayer("stagetrail", StagetrailSaver(Engine(f"sqlite:///{path}")))


def sqlite(path: Path) -> Replayer:
    connection = sqlite3.connect(path, check_same_thread=False)
    return Replayer("sqlite", SqliteSaver(connection))


SAVERS: dict[str, Callable[[Path], Replayer]] = {
    "StagetrailSaver": stagetrail,
    "SqliteSaver": sqlite,
}


def cpu_per_step(replayer: Replayer, calls: list[Call], threads: int) -> float:
    """Process CPU µs per super-step of `threads` replays (their copies made beforehand)."""
    ready = replayer.prepared(calls, threads)
    began = time.process_time()
    for one in ready:
        replayer.replay(one)
    return (time.process_time() - began) * 1e6 / (threads * STEPS)


def measure(calls: list[Call], threads: int, repeats: int) -> list[dict[str, object]]:
    """Each saver's median CPU µs per super-step over `repeats` interleaved rounds."""
    replayers = {name: make(scratch(f"{name}.db")) for name, make in SAVERS.items()}
    for replayer in replayers.values():  # warm: tables made, modules imported, caches filled
        cpu_per_step(replayer, calls, 2)
    times: dict[str, list[float]] = {name: [] for name in replayers}
    for _ in range(repeats):
        for name, replayer in replayers.items():
            times[name].append(cpu_per_step(replayer, calls, threads))
    base, ours = (statistics.median(times[n]) for n in ("SqliteSaver", "StagetrailSaver"))
    return [
        {
            "case": "saver CPU per super-step (µs), RetryPolicy calls replayed",
            "SqliteSaver": base,
            "StagetrailSaver": ours,
            "ratio": ours / base,
            "calls per thread": len([c for c in calls if c[0] != "log"]),
            "super-steps per thread": STEPS,
        }
    ]


def marked(replayer: Replayer, calls: list[Call], replays: int) -> None:
    """Replay between the callgrind marks (``os.getppid``: counts zeroed; ``os.getpgrp``:
    dumped), after two replays to warm up."""
    cpu_per_step(replayer, calls, 2)
    ready = replayer.prepared(calls, replays)
    os.getppid()
    for one in ready:
        replayer.replay(one)
    os.getpgrp()
    print(f"{replayer.name}: {replays} replays x {STEPS} super-steps between the marks")


def graph_marked(name: str, threads: int) -> None:
    """The RetryPolicy graph of `benchmarks.langgraph` itself on one saver, `threads` threads
    between the callgrind marks (LangGraph's own work included), after two to warm up."""
    graph_bench.MODE["retry"] = True
    make = graph_bench.stagetrail_saver if name == "StagetrailSaver" else graph_bench.sqlite_saver
    side = graph_bench.Side(f"graph-{name}", make)
    side.runs(2)
    os.getppid()
    side.runs(threads)
    os.getpgrp()
    print(f"{name}: {threads} threads x {STEPS} super-steps of the graph between the marks")


def stored_rows(path: Path) -> Iterator[str]:
    """Every row of every table of a SQLite file, as text (bytes in hex), sorted, table by table."""
    connection = sqlite3.connect(path)
    try:
        tables = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        for (table,) in sorted(tables.fetchall()):
            rows = connection.execute(f'SELECT * FROM "{table}"')
            yield from sorted(f"{table}: " + " | ".join(map(_text, row)) for row in rows)
    finally:
        connection.close()


def _text(value: object) -> str:
    return value.hex() if isinstance(value, bytes) else repr(value)


def write_events(calls: list[Call], threads: int, out: Path) -> None:
    """Replay `threads` threads on `StagetrailSaver` under a frozen clock; write its rows."""
    from freezegun import freeze_time  # the dev extra's: only this mode needs it

    path = scratch("events.db")
    with freeze_time("2026-01-02 03:04:05"):
        replayer = stagetrail(path)
        for one in replayer.prepared(calls, threads):
            replayer.replay(one)
        del replayer
    out.write_text("\n".join(stored_rows(path)) + "\n")


def the_calls(saved: Path | None) -> list[Call]:
    """The captured calls: read from `saved` if it exists, else captured (and saved there)."""
    if saved is not None and saved.exists():
        calls: list[Call] = pickle.loads(saved.read_bytes())
        return calls
    calls = capture()
    if saved is not None:
        saved.write_bytes(pickle.dumps(calls))
    return calls


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--saver", choices=sorted(SAVERS), help="replay one saver, for callgrind")
    parser.add_argument("--replays", type=int, default=20, help="threads replayed with --saver")
    parser.add_argument("--graph", action="store_true", help="with --saver: run the graph itself")
    parser.add_argument("--calls", type=Path, help="a pickle of the calls: read, or written")
    parser.add_argument(
        "--events", type=Path, help="write the store's rows after replays to this new file"
    )
    return parser.parse_args()


def main() -> None:
    args = parse()
    if args.events is not None and args.events.exists():  # never another's file overwritten
        raise SystemExit(f"--events: {args.events} exists; name a new file")
    calls = the_calls(args.calls)
    if args.events is not None:
        write_events(calls, 3, args.events)
        return
    if args.saver is not None and args.graph:
        graph_marked(args.saver, args.replays)
        return
    if args.saver is not None:
        marked(SAVERS[args.saver](scratch(f"{args.saver}.db")), calls, args.replays)
        return
    threads, repeats = (3, 3) if args.quick else (100, 7)
    rows = measure(calls, threads, repeats)
    title = f"LangGraph's calls to a saver replayed ({threads} threads x {repeats} rounds)"
    report(title, rows, args.json)


if __name__ == "__main__":
    main()
