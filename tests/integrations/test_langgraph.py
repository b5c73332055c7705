"""A real LangGraph graph checkpointed by `StagetrailSaver`, read back through stagetrail."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.util
import json
import operator
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, NamedTuple, TypedDict

import pytest
from freezegun import freeze_time

pytest.importorskip("langgraph", reason="needs the langgraph extra")

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph

import events
from engine import Engine, RunNotFound
from engine.errors import InvalidPayload, PayloadTooLarge
from engine.integrations.langgraph import HUB, StagetrailSaver, thread_pipeline, thread_run_ids
from engine.integrations.langgraph import THREAD_LABEL as THREAD
from engine.integrations.langgraph import saver as saver_module
from engine.pipeline import Pipeline
from engine.readside import TimeTravel
from engine.store.chain import split
from engine.ui.timeline import timeline
from events import DECIDED, CheckpointSaved, Event, StageCompleted, StageFailed
from projections import BUILT_INS, FailurePatterns, RetryCounts, RunIndex, StateStack


class Flaky(TypedDict):
    log: Annotated[list[str], operator.add]


def flaky_graph(failures: int) -> StateGraph[Any]:
    """plan -> build -> ship, where build raises `failures` times before it succeeds."""
    calls = {"build": 0}

    def build(state: Flaky) -> dict[str, list[str]]:
        calls["build"] += 1
        if calls["build"] <= failures:
            raise RuntimeError(f"build broke ({calls['build']})")
        return {"log": ["build"]}

    builder = StateGraph(Flaky)
    builder.add_node("plan", lambda state: {"log": ["plan"]})
    builder.add_node("build", build)
    builder.add_node("ship", lambda state: {"log": ["ship"]})
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "build")
    builder.add_edge("build", "ship")
    builder.add_edge("ship", END)
    return builder


def invoke_until_done(
    graph: Any, config: RunnableConfig, tries: int, durability: str = "sync"
) -> list[str]:
    """Invoke the thread, then resume it after each failure; the errors seen, in order."""
    errors = []
    for attempt in range(tries):
        try:
            first: Flaky | None = {"log": []} if attempt == 0 else None
            result = graph.invoke(first, config, durability=durability)
        except RuntimeError as error:
            errors.append(str(error))
            continue
        assert result == {"log": ["plan", "build", "ship"]}
        return errors
    raise AssertionError(f"still failing after {tries} invokes: {errors}")


def recorded_before_hubs(nodes: Iterable[str], graph_name: str | None = None) -> Pipeline:
    """A thread's table as the saver stored it before hubs were declared: each route an event."""
    table = thread_pipeline(nodes, graph_name).to_dict()
    del table["hub"]
    return Pipeline.from_dict(table)


@pytest.fixture(params=["implicit", "explicit"])
def routes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """How new threads record the hub's routes: taken implicitly by each node's outcome (this
    release), or each as an event of its own (threads recorded before, `recorded_before_hubs`)."""
    if request.param == "explicit":
        monkeypatch.setattr(saver_module, "thread_pipeline", recorded_before_hubs)
    saver_module._pipeline_of.cache_clear()
    yield request.param
    saver_module._pipeline_of.cache_clear()


def stagetrail(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the installed `stagetrail` command line."""
    command = shutil.which("stagetrail", path=str(Path(sys.executable).parent))
    assert command is not None, "the stagetrail console script is not installed"
    return subprocess.run([command, *args], capture_output=True, text=True, check=True)


@pytest.mark.usefixtures("routes")
class TestFlakyGraph:
    def test_two_failures_then_success_are_stage_events(self, store_url: str) -> None:
        """Each failed invoke is a StageFailed of the node; the third attempt completes it."""
        builder = flaky_graph(failures=2)
        with Engine(store_url) as engine:
            graph = builder.compile(checkpointer=StagetrailSaver(engine, builder))
            config: RunnableConfig = {"configurable": {"thread_id": "order-7"}}
            errors = invoke_until_done(graph, config, tries=3)
            assert errors == ["build broke (1)", "build broke (2)"]
            (summary,) = engine.runs()
            outcomes = [
                (type(e).__name__, e.stage, e.attempt, e.outcome)
                for e in engine.events(summary.run_id)
                if isinstance(e, StageCompleted | StageFailed) and e.stage != HUB
            ]
            assert outcomes == [
                ("StageCompleted", "plan", 1, "completed"),
                ("StageFailed", "build", 1, "failed"),
                ("StageFailed", "build", 2, "failed"),
                ("StageCompleted", "build", 3, "completed"),
                ("StageCompleted", "ship", 1, "completed"),
            ]
            assert engine.project(summary.run_id, RetryCounts).retries("build") == 2
            patterns = engine.project(summary.run_id, FailurePatterns)
            assert patterns.by_error_type == {"RuntimeError": 2}
            assert engine.verify(summary.run_id).ok

    def test_a_parallel_node_that_completed_is_not_run_again(self, store_url: str) -> None:
        """The writes a node's outcome carries are the pending writes a resumed step reuses."""
        calls = {"fast": 0, "slow": 0}

        def fast(state: Flaky) -> dict[str, list[str]]:
            calls["fast"] += 1
            return {"log": ["fast"]}

        def slow(state: Flaky) -> dict[str, list[str]]:
            calls["slow"] += 1
            if calls["slow"] == 1:
                raise RuntimeError("slow broke")
            return {"log": ["slow"]}

        builder = StateGraph(Flaky)
        builder.add_node("fast", fast)
        builder.add_node("slow", slow)
        builder.add_edge(START, "fast")
        builder.add_edge(START, "slow")
        with Engine(store_url) as engine:
            graph = builder.compile(checkpointer=StagetrailSaver(engine, builder))
            config: RunnableConfig = {"configurable": {"thread_id": "fan"}}
            with pytest.raises(RuntimeError, match="slow broke"):
                graph.invoke({"log": []}, config, durability="sync")
            pending = graph.get_state(config).tasks
            assert {task.name: task.error is not None for task in pending} == {
                "fast": False,
                "slow": True,
            }
            result = graph.invoke(None, config, durability="sync")
            assert sorted(result["log"]) == ["fast", "slow"]
            assert calls == {"fast": 1, "slow": 2}
            (summary,) = engine.runs()
            carried = [
                e.result if isinstance(e, StageCompleted) else e.details
                for e in engine.events(summary.run_id)
                if isinstance(e, StageCompleted | StageFailed) and e.stage != HUB
            ]
            assert [events.task_writes(value) is not None for value in carried] == [True] * 3

    def test_background_saves_keep_each_node_in_order(self, store_url: str) -> None:
        """With LangGraph's default async durability, each node's own attempts stay in order."""
        builder = flaky_graph(failures=2)
        with Engine(store_url) as engine:
            graph = builder.compile(checkpointer=StagetrailSaver(engine, builder))
            config: RunnableConfig = {"configurable": {"thread_id": "order-8"}}
            invoke_until_done(graph, config, tries=3, durability="async")
            (summary,) = engine.runs()
            outcomes: dict[str, list[tuple[int, str]]] = {}
            for e in engine.events(summary.run_id):
                if isinstance(e, StageCompleted | StageFailed) and e.stage != HUB:
                    outcomes.setdefault(e.stage, []).append((e.attempt, e.outcome))
            assert outcomes == {
                "plan": [(1, "completed")],
                "build": [(1, "failed"), (2, "failed"), (3, "completed")],
                "ship": [(1, "completed")],
            }
            assert engine.verify(summary.run_id).ok

    def test_state_history_comes_back_through_the_saver(self, store_url: str) -> None:
        """LangGraph's own get_state and get_state_history read what the saver stored."""
        builder = flaky_graph(failures=1)
        with Engine(store_url) as engine:
            graph = builder.compile(checkpointer=StagetrailSaver(engine, builder))
            config: RunnableConfig = {"configurable": {"thread_id": "t"}}
            invoke_until_done(graph, config, tries=2)
            assert graph.get_state(config).values == {"log": ["plan", "build", "ship"]}
            history = list(graph.get_state_history(config))
            assert [len(s.values.get("log", [])) for s in history] == [3, 2, 1, 0, 0]

    def test_show_lists_the_failed_attempts(self, tmp_path: Path) -> None:
        """`stagetrail show` prints the two failed attempts of the thread's run as StageFailed."""
        url = f"sqlite:///{tmp_path / 'graph.db'}"
        builder = flaky_graph(failures=2)
        with Engine(url) as engine:
            graph = builder.compile(checkpointer=StagetrailSaver(engine, builder))
            invoke_until_done(graph, {"configurable": {"thread_id": "order-7"}}, tries=3)
        (run,) = json.loads(stagetrail("runs", "--store", url, "--json").stdout)
        assert (run["pipeline"], run["failures"]) == ("langgraph", 2)
        shown = stagetrail("show", run["run_id"][:8], "--store", url).stdout
        lines = shown.splitlines()
        assert any("CheckpointSaved" in line and "step 0 (loop)" in line for line in lines)
        assert any("WritesSaved" in line and "__start__: " in line for line in lines)  # input
        completed = [line.split()[2:6] for line in lines if " StageCompleted " in line]
        assert ["StageCompleted", "build", "3", "completed"] in completed
        assert any(" build " in line and "wrote log" in line for line in lines)  # its writes
        failed = [line.split() for line in lines if " StageFailed " in line]
        assert [line[2:] for line in failed] == [
            ["StageFailed", "build", "1", "failed", "RuntimeError:", "build", "broke", "(1)"],
            ["StageFailed", "build", "2", "failed", "RuntimeError:", "build", "broke", "(2)"],
        ]


class TestThreadPipeline:
    def test_the_hub_routes_to_every_node_and_back(self) -> None:
        """Each node is reached from the hub by its name and returns there on either outcome."""
        pipeline = thread_pipeline(["plan", "build", "__start__"])
        assert pipeline.initial == HUB
        assert pipeline.allowed(HUB) == ("__end__", "build", "plan")
        for node in ("plan", "build"):
            assert pipeline.next_state(HUB, node) == node
            assert pipeline.allowed(node) == ("completed", "failed")
            assert pipeline.next_state(node, "failed") == HUB
        assert "__start__" not in pipeline.states


class TestDeletion:
    def test_a_deleted_thread_is_gone_then_compacted_away(self, store_url: str) -> None:
        """delete_thread records the deletion; readers see nothing; compact erases the events."""
        builder = flaky_graph(failures=0)
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine, builder)
            graph = builder.compile(checkpointer=saver)
            for thread in ("keep", "erase"):
                invoke_until_done(graph, {"configurable": {"thread_id": thread}}, tries=1)
            (doomed,) = [s.run_id for s in engine.runs() if s.labels[THREAD] == "erase"]
            saver.delete_thread("erase")
            erase: RunnableConfig = {"configurable": {"thread_id": "erase"}}
            assert saver.get_tuple(erase) is None
            assert list(saver.list(erase)) == []
            assert [s.labels[THREAD] for s in saver_threads(engine)] == ["keep"]
            assert engine.runs(status="deleted")[0].run_id == doomed
            done = engine.compact()
            assert done.runs == (doomed,)
            assert engine.runs(status="deleted") == []
            with pytest.raises(RunNotFound):
                engine.events(doomed)
            keep: RunnableConfig = {"configurable": {"thread_id": "keep"}}
            assert graph.get_state(keep).values == {"log": ["plan", "build", "ship"]}

    def test_a_deleted_thread_id_can_be_used_again(self, store_url: str) -> None:
        """After delete_thread the same thread id starts afresh, in a new run."""
        builder = flaky_graph(failures=0)
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine, builder)
            graph = builder.compile(checkpointer=saver)
            config: RunnableConfig = {"configurable": {"thread_id": "again"}}
            invoke_until_done(graph, config, tries=1)
            saver.delete_thread("again")
            invoke_until_done(graph, config, tries=1)
            assert graph.get_state(config).values == {"log": ["plan", "build", "ship"]}
            statuses = sorted(s.status for s in engine.runs())
            assert statuses == ["deleted", "idle"]  # at the graph's end: idle, resumable


class TwoSavers(NamedTuple):
    """Two savers of one graph, each on an engine of its own over one store."""

    first_engine: Engine
    second_engine: Engine
    first: StagetrailSaver
    second: StagetrailSaver
    builder: StateGraph[Any]


@pytest.fixture(params=["sqlite_url", "postgres_url"])
def two_savers(request: pytest.FixtureRequest) -> Iterator[TwoSavers]:
    """Two engines on one SQLite file or PostgreSQL schema, a saver of the same graph on each."""
    store_url = str(request.getfixturevalue(request.param))
    builder = flaky_graph(failures=0)
    with Engine(store_url) as first_engine, Engine(store_url) as second_engine:
        first = StagetrailSaver(first_engine, builder)
        second = StagetrailSaver(second_engine, builder)
        yield TwoSavers(first_engine, second_engine, first, second, builder)


class TestErasure:
    def test_a_saver_never_serves_an_erased_thread_whose_id_was_used_again(
        self, two_savers: TwoSavers
    ) -> None:
        """A saver that cached a thread serves the new run after the thread is erased and reused."""
        first, second, builder = two_savers.first, two_savers.second, two_savers.builder
        config: RunnableConfig = {"configurable": {"thread_id": "reused"}}
        invoke_until_done(builder.compile(checkpointer=first), config, tries=1)
        cached = first.get_tuple(config)  # first now caches the thread, all 4 steps
        assert cached is not None
        second.delete_thread("reused")
        erased = two_savers.second_engine.compact().runs
        assert [run.hex for run in erased] == [next(thread_run_ids("reused")).hex]
        # One checkpoint of a new run, under the erased run's id.
        second.put(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
        served = first.get_tuple(config)
        assert served is not None
        assert served.checkpoint["id"] != cached.checkpoint["id"]
        assert served.metadata["step"] == -1
        assert [t.checkpoint["id"] for t in first.list(config)] == [served.checkpoint["id"]]
        invoke_until_done(builder.compile(checkpointer=first), config, tries=1)
        (summary,) = two_savers.first_engine.runs()
        assert two_savers.first_engine.verify(summary.run_id).ok


def saver_threads(engine: Engine) -> list[Any]:
    """The runs of LangGraph threads that are not deleted (running, idle, waiting...)."""
    return [s for s in engine.runs() if THREAD in s.labels and s.status != "deleted"]


class TestWriters:
    def test_two_savers_on_one_thread_both_land(self, two_savers: TwoSavers) -> None:
        """A saver whose view of the thread is stale catches up and appends after the other."""
        first, second, builder = two_savers.first, two_savers.second, two_savers.builder
        config: RunnableConfig = {"configurable": {"thread_id": "shared"}}
        invoke_until_done(builder.compile(checkpointer=first), config, tries=1)
        assert second.get_tuple(config) is not None  # second now caches the thread
        latest = first.get_tuple(config)
        assert latest is not None
        first.put_writes(latest.config, [("log", ["by first"])], "task-a")
        second.put_writes(latest.config, [("log", ["by second"])], "task-b")
        writes = first.get_tuple(latest.config)
        assert writes is not None
        assert sorted(w[2][0] for w in writes.pending_writes or []) == [
            "by first",
            "by second",
        ]
        (summary,) = two_savers.first_engine.runs()
        assert two_savers.first_engine.verify(summary.run_id).ok


class TestAsync:
    def test_an_async_graph_runs_on_the_saver(self, store_url: str) -> None:
        """ainvoke, aget_state and the history go through the saver's async methods."""
        builder = flaky_graph(failures=1)
        with Engine(store_url) as engine:
            graph = builder.compile(checkpointer=StagetrailSaver(engine, builder))
            config: RunnableConfig = {"configurable": {"thread_id": "async"}}

            async def run() -> list[str]:
                with contextlib.suppress(RuntimeError):
                    await graph.ainvoke({"log": []}, config, durability="sync")
                await graph.ainvoke(None, config, durability="sync")
                state = await graph.aget_state(config)
                return list(state.values["log"])

            assert asyncio.run(run()) == ["plan", "build", "ship"]
            (summary,) = engine.runs()
            assert summary.failures == 1


class TestStoredForm:
    def test_checkpoints_stored_before_ids_and_versions_were_derived_still_read(self) -> None:
        """The first stored format (the id in the skeleton, versions in blobs) still reads."""
        engine = Engine("memory://")
        saver = StagetrailSaver(engine, flaky_graph(0))
        run = engine.start_run(
            saver.pipeline,
            params={"thread_id": "old"},
            labels={THREAD: "old"},
            run_id=next(thread_run_ids("old")),
        )
        skeleton = {"v": 4, "ts": "2026-11-23T10:00:00+00:00", "id": "1f0-1"}
        skeleton |= {"channel_versions": {"log": 2}, "versions_seen": {}, "updated_channels": []}
        run.record(
            CheckpointSaved,
            checkpoint_id="1f0-1",
            checkpoint={"full": skeleton},
            metadata={"json": {"source": "input", "step": -1}},
            blobs={"log": ["2", "msgpack", base64.b64encode(b"\x91\xa4plan").decode()]},
        )
        found = saver.get_tuple({"configurable": {"thread_id": "old"}})
        assert found is not None
        assert found.checkpoint["id"] == "1f0-1"
        assert found.checkpoint["channel_values"] == {"log": ["plan"]}

    def test_ids_and_versions_are_stored_once(self) -> None:
        """A checkpoint's id is only the event's; a blob's version only the skeleton's."""
        engine = Engine("memory://")
        builder = flaky_graph(0)
        graph = builder.compile(checkpointer=StagetrailSaver(engine, builder))
        config: RunnableConfig = {"configurable": {"thread_id": "t"}}
        invoke_until_done(graph, config, tries=1)
        (run,) = engine.runs()
        saved = [e for e in engine.events(run.run_id) if isinstance(e, CheckpointSaved)]
        assert len(saved) == 5
        for event in saved:
            stored = event.checkpoint.get("full") or event.checkpoint["patch"]
            assert "id" not in stored
            assert all(len(blob) == 2 for blob in event.blobs.values())
        newest = graph.get_state(config).config["configurable"]["checkpoint_id"]
        assert newest == saved[-1].checkpoint_id


class TestThreadCache:
    def test_threads_beyond_the_cache_are_read_again_from_the_store(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A saver keeps a bounded number of threads' folds; a forgotten one reads back whole."""
        monkeypatch.setattr(saver_module, "_CACHED_THREADS", 1)
        engine = Engine("memory://")
        builder = flaky_graph(1)
        saver = StagetrailSaver(engine, builder)
        graph = builder.compile(checkpointer=saver)
        configs: list[RunnableConfig] = [{"configurable": {"thread_id": t}} for t in "ab"]
        errors = [invoke_until_done(graph, config, tries=2) for config in configs]
        assert errors == [["build broke (1)"], []]  # the graph's build fails once in all
        assert list(saver._threads) == ["b"]
        assert graph.get_state(configs[0]).values == {"log": ["plan", "build", "ship"]}
        assert len(list(graph.get_state_history(configs[0]))) == 5
        assert list(saver._threads) == ["a"]


NODE = "~__pregel_pull, a"
"""The task path LangGraph gives node ``a``'s task."""


def first_checkpoint(saver: StagetrailSaver, thread_id: str) -> RunnableConfig:
    """Save an empty checkpoint in a new thread; the config naming it."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    return saver.put(config, empty_checkpoint(), {"source": "input", "step": -1}, {})


def stored(engine: Engine, run_id: Any) -> list[tuple[int, str, bytes]]:
    """The run's events as the store holds them: version, topic and stored bytes."""
    rows = engine.store.recorder.select_events(run_id)
    return [(row.originator_version, row.topic, row.state) for row in rows]


def unlinked(state: bytes) -> bytes:
    """An event's stored JSON without its chain link."""
    parts = split(state)
    assert parts is not None
    return parts[0]


class TestOneWayToRecord:
    def test_an_unstorable_checkpoint_is_refused_and_nothing_is_written(
        self, store_url: str
    ) -> None:
        """A lone surrogate in a checkpoint's metadata raises InvalidPayload naming the
        field; the thread's run is as it was, and the next checkpoint follows on."""
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine, ["a"])
            config = first_checkpoint(saver, "t")
            (summary,) = engine.runs()
            before = stored(engine, summary.run_id)
            metadata: Any = {"step": 0, "note": "bad \udce9"}
            with pytest.raises(InvalidPayload) as refused:
                saver.put(config, empty_checkpoint(), metadata, {})
            assert refused.value.field == "metadata"
            assert stored(engine, summary.run_id) == before
            saver.put(config, empty_checkpoint(), {"step": 0}, {})
            assert [v for v, _, _ in stored(engine, summary.run_id)] == [1, 2, 3]
            assert engine.verify(summary.run_id).ok

    def test_a_node_outcome_too_large_writes_none_of_its_events(
        self, store_url: str, routes: str
    ) -> None:
        """A node's outcome, with the hub's route when it is recorded, is one batch: refused
        together; the next goes on as one event (two with a recorded route)."""
        with Engine(store_url, max_event_bytes=4096) as engine:
            saver = StagetrailSaver(engine, ["a"])
            config = first_checkpoint(saver, "t")
            (summary,) = engine.runs()
            before = stored(engine, summary.run_id)
            with pytest.raises(PayloadTooLarge) as refused:
                saver.put_writes(config, [("log", "x" * 10_000)], "task-1", NODE)
            assert refused.value.field == "result"
            assert stored(engine, summary.run_id) == before
            saver.put_writes(config, [("log", "small")], "task-1", NODE)
            kinds = [type(e).__name__ for e in engine.events(summary.run_id)]
            routed = ["StageCompleted"] if routes == "explicit" else []
            assert kinds == ["RunStarted", "CheckpointSaved", *routed, "StageCompleted"]

    def test_a_node_error_is_described_as_run_stage_failed_describes_it(
        self, store_url: str
    ) -> None:
        """A lone surrogate in a node's error message is escaped, not refused (as by Run)."""
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine, ["a"])
            config = first_checkpoint(saver, "t")
            saver.put_writes(config, [("__error__", OSError("no file \udce9"))], "task-1", NODE)
            (summary,) = engine.runs()
            failed = engine.events(summary.run_id)[-1]
            assert isinstance(failed, StageFailed)
            assert (failed.error, failed.error_type) == ("no file \\udce9", "OSError")

    def test_saver_and_run_store_the_same_bytes(self, store_url: str, routes: str) -> None:
        """A node outcome the saver records is stored byte for byte as a Run records it."""
        with Engine(store_url) as engine, freeze_time("2026-11-20T09:00:00Z"):
            saver = StagetrailSaver(engine, ["a"])
            config = first_checkpoint(saver, "t")
            saver.put_writes(config, [("log", ["one"])], "task-1", NODE)
            (summary,) = engine.runs()
            by_saver = stored(engine, summary.run_id)[2:]
            outcome = engine.events(summary.run_id)[-1]
            assert isinstance(outcome, StageCompleted)
            run = engine.start_run(saver.pipeline)
            with run.batch():
                if routes == "explicit":
                    run.record(StageCompleted, stage=HUB, attempt=DECIDED, outcome="a")
                run.stage_completed("a", outcome.result, duration=outcome.duration)
            by_run = stored(engine, run.id)[1:]
            # Each event's link ties it to its own run, so the bytes compared are the rest.
            assert [(t, unlinked(s)) for _, t, s in by_saver] == [
                (t, unlinked(s)) for _, t, s in by_run
            ]
            routed = 2 if routes == "explicit" else 1
            assert [t for _, t, _ in by_run] == ["stagetrail:StageCompleted"] * routed


def thread_readings(engine: Engine, run_id: Any) -> dict[str, Any]:
    """What stagetrail reads of a thread's run, versions and times left out: its summary,
    machine, stack, attempts and retries, timeline, and whether it verifies."""
    events = engine.events(run_id)
    summary = engine.project(run_id, RunIndex)
    assert summary is not None
    machine = engine.load(run_id).machine
    stack = engine.project(run_id, StateStack)
    counts = engine.project(run_id, RetryCounts)
    line = timeline(events, table=events[0].table)  # type: ignore[attr-defined]
    return {
        "summary": (summary.status, summary.state, summary.attempts, summary.failures),
        "machine": (machine.state, machine.stack.to_tuple(), dict(machine.attempts)),
        "stack": [(f.state, f.stage, f.outcome, f.attempt, f.failed) for f in stack.frames],
        "retries": {s: (counts.attempts(s), counts.retries(s)) for s in counts.attempt_counts},
        "bars": [(bar.stage, bar.attempt, bar.kind) for bar in line.bars],
        "verified": engine.verify(run_id).ok,
    }


def read_both_ways(
    monkeypatch: pytest.MonkeyPatch, record: Callable[[Engine], None]
) -> dict[str, tuple[dict[str, Any], list[Event]]]:
    """`record` a thread with routes recorded (as before hubs) and implicit: each way's
    `thread_readings` and events."""
    seen = {}
    for way in ("explicit", "implicit"):
        with monkeypatch.context() as patched, Engine("memory://") as engine:
            if way == "explicit":
                patched.setattr(saver_module, "thread_pipeline", recorded_before_hubs)
            saver_module._pipeline_of.cache_clear()
            record(engine)
            (summary,) = engine.runs()
            seen[way] = (thread_readings(engine, summary.run_id), engine.events(summary.run_id))
        saver_module._pipeline_of.cache_clear()
    return seen


def routes_recorded(history: list[Event]) -> int:
    """How many of the hub's routes a thread's history holds as events."""
    return sum(isinstance(e, StageCompleted) and e.stage == HUB for e in history)


class TestImplicitRoute:
    def test_a_thread_reads_alike_with_implicit_and_recorded_routes(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A flaky graph's thread summarises, folds, stacks, counts, draws and verifies the same
        with one event per node run as with each route recorded before it."""

        def record(engine: Engine) -> None:
            graph = flaky_graph(failures=2).compile(checkpointer=StagetrailSaver(engine))
            invoke_until_done(graph, {"configurable": {"thread_id": "t"}}, tries=3)

        seen = read_both_ways(monkeypatch, record)
        assert seen["implicit"][0] == seen["explicit"][0]
        readings = seen["implicit"][0]
        assert readings["summary"] == ("idle", HUB, 5, 2)  # five node runs, two failed
        assert readings["retries"]["build"] == (3, 2)
        assert HUB not in readings["retries"]
        assert [stage for _, stage, *_ in readings["stack"]].count(HUB) == 5  # a route each
        assert (routes_recorded(seen["explicit"][1]), routes_recorded(seen["implicit"][1])) == (
            5,
            0,
        )
        assert len(seen["explicit"][1]) - len(seen["implicit"][1]) == 5

    def test_a_copied_thread_reads_as_its_source(self, store_url: str) -> None:
        """copy_thread forks a thread of implicit routes; the copy reads as the source does."""
        builder = flaky_graph(failures=1)
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine, builder)
            graph = builder.compile(checkpointer=saver)
            invoke_until_done(graph, {"configurable": {"thread_id": "src"}}, tries=2)
            saver.copy_thread("src", "copy")
            by_thread = {s.labels[THREAD]: s.run_id for s in engine.runs()}
            source = thread_readings(engine, by_thread["src"])
            assert thread_readings(engine, by_thread["copy"]) == source
            again = graph.invoke({"log": []}, {"configurable": {"thread_id": "copy"}})
            assert again["log"] == ["plan", "build", "ship"] * 2  # the copy goes on
            assert engine.verify(by_thread["copy"]).ok

    def test_every_way_to_read_a_thread_agrees(self, store_url: str) -> None:
        """Each built-in projection of a thread of implicit routes, at each version, is the fold
        of the events up to it: through time travel's snapshots (every 3 events), warm or cold."""
        builder = flaky_graph(failures=1)
        with Engine(store_url) as engine:
            graph = builder.compile(checkpointer=StagetrailSaver(engine, builder))
            invoke_until_done(graph, {"configurable": {"thread_id": "t"}}, tries=2)
            (summary,) = engine.runs()
            events = engine.events(summary.run_id)
            assert routes_recorded(events) == 0
            warm = TimeTravel(engine.store, engine.store.views, interval=3)
            for projection in (kind() for kind in BUILT_INS):
                for version in range(1, len(events) + 1):
                    expected = projection.fold(events[:version])
                    assert warm.project(summary.run_id, projection, version) == expected
                cold = TimeTravel(engine.store, engine.store.views, interval=3)
                whole = cold.project(summary.run_id, projection, len(events))
                assert whole == projection.fold(events)

    def test_replay_shows_the_route_an_outcome_took(self, tmp_path: Path) -> None:
        """`stagetrail replay` shows a node's outcome pushing the hub's route and itself."""
        url = f"sqlite:///{tmp_path / 'graph.db'}"
        builder = flaky_graph(failures=0)
        with Engine(url) as engine:
            graph = builder.compile(checkpointer=StagetrailSaver(engine, builder))
            invoke_until_done(graph, {"configurable": {"thread_id": "t"}}, tries=1)
            (summary,) = engine.runs()
        out = stagetrail("replay", str(summary.run_id), "--store", url).stdout
        assert (
            "stack   push plan (__graph__ plan #0); __graph__ (plan completed #1), depth 2" in out
        )

    def test_an_old_thread_goes_on_recording_its_routes(self, tmp_path: Path) -> None:
        """A thread stored before hubs (the checked-in store) still reads, and new node runs
        on it record the route as an event each, as its stored table wants."""
        copy = tmp_path / "threads.db"
        shutil.copyfile(OLD_STORE, copy)
        with Engine(f"sqlite:///{copy}") as engine:
            (run,) = [r for r in engine.runs() if r.labels.get(THREAD) == "flaky"]
            before = thread_readings(engine, run.run_id)
            assert before["summary"][2:] == (4, 1)  # plan, build twice (one failed), ship
            assert before["verified"]
            assert "hub" not in engine.events(run.run_id)[0].table  # type: ignore[attr-defined]
            graph = old_graph(engine)
            graph.invoke({"log": ["again"]}, {"configurable": {"thread_id": "flaky"}})
            after = thread_readings(engine, run.run_id)
            assert after["summary"][2:] == (7, 1)
            assert after["verified"]
            history = engine.events(run.run_id)
            assert routes_recorded(history) == 7


def old_graph(engine: Engine) -> Any:
    """The graph the checked-in store's threads ran (`make_langgraph_delta_store.py`), on it."""
    spec = importlib.util.spec_from_file_location("maker", DATA / "make_langgraph_delta_store.py")
    assert spec is not None
    assert spec.loader is not None
    maker = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = maker  # LangGraph reads the state's annotations from it
    spec.loader.exec_module(maker)
    return maker.graph(0).compile(checkpointer=StagetrailSaver(engine))


DATA = Path(__file__).resolve().parents[1] / "data"
OLD_STORE = DATA / "langgraph_delta_store.db"
"""Threads a saver of an older release stored, each route an event (see the maker script)."""
