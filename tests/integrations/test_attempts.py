"""Every attempt with the plain one-argument swap, LangGraph's own `RetryPolicy` included."""

from __future__ import annotations

import asyncio
import json
import logging
import operator
import os
import subprocess
import sys
import threading
import time
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph", reason="needs the langgraph extra")

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, RetryPolicy, interrupt

from engine import Engine
from engine.integrations.langgraph import HUB, StagetrailSaver
from engine.integrations.langgraph import saver as saver_module
from engine.integrations.langgraph.attempts import RETRY_LOGGER
from events import CheckpointSaved, RetryScheduled, StageCompleted, StageFailed, WritesSaved
from projections import FailurePatterns, RetryCounts
from tests.integrations.test_langgraph import (
    flaky_graph,
    invoke_until_done,
    read_both_ways,
    routes_recorded,
)


class Log(TypedDict):
    log: Annotated[list[str], operator.add]


def retried_graph(failures: int) -> StateGraph[Any]:
    """plan -> fetch, where fetch raises ConnectionError `failures` times under a RetryPolicy."""
    calls = {"fetch": 0}

    def fetch(state: Log) -> dict[str, list[str]]:
        calls["fetch"] += 1
        if calls["fetch"] <= failures:
            raise ConnectionError(f"timeout {calls['fetch']}")
        return {"log": ["fetch"]}

    builder = StateGraph(Log)
    builder.add_node("plan", lambda state: {"log": ["plan"]})
    policy = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)
    builder.add_node("fetch", fetch, retry_policy=policy)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "fetch")
    builder.add_edge("fetch", END)
    return builder


def node_events(engine: Engine) -> list[tuple[str, str, int]]:
    """The one thread's node outcomes and retries: (event, stage, attempt), routes left out."""
    (summary,) = engine.runs()
    return [
        (type(e).__name__, e.stage, e.attempt)
        for e in engine.events(summary.run_id)
        if isinstance(e, StageCompleted | StageFailed | RetryScheduled) and e.stage != HUB
    ]


RETRIED_TWICE = [
    ("StageCompleted", "plan", 1),
    ("StageFailed", "fetch", 1),
    ("RetryScheduled", "fetch", 2),
    ("StageFailed", "fetch", 2),
    ("RetryScheduled", "fetch", 3),
    ("StageCompleted", "fetch", 3),
]


class TestPlainSwap:
    def test_failed_invokes_are_stage_failures_without_the_builder(self, store_url: str) -> None:
        """StagetrailSaver(engine) alone records each node outcome, failures included."""
        builder = flaky_graph(failures=2)
        with Engine(store_url) as engine:
            graph = builder.compile(checkpointer=StagetrailSaver(engine))
            invoke_until_done(graph, {"configurable": {"thread_id": "t"}}, tries=3)
            assert node_events(engine) == [
                ("StageCompleted", "plan", 1),
                ("StageFailed", "build", 1),
                ("StageFailed", "build", 2),
                ("StageCompleted", "build", 3),
                ("StageCompleted", "ship", 1),
            ]
            (summary,) = engine.runs()
            assert summary.failures == 2
            counts = engine.project(summary.run_id, RetryCounts)
            assert (counts.total_attempts, counts.attempts(HUB)) == (5, 0)  # node runs only
            assert engine.verify(summary.run_id).ok

    def test_a_parallel_step_with_one_failing_branch(self, store_url: str) -> None:
        """Both branches of a super-step are recorded: the one that failed and the other."""
        calls = {"slow": 0}

        def slow(state: Log) -> dict[str, list[str]]:
            calls["slow"] += 1
            if calls["slow"] == 1:
                raise RuntimeError("slow broke")
            return {"log": ["slow"]}

        builder = StateGraph(Log)
        builder.add_node("fast", lambda state: {"log": ["fast"]})
        builder.add_node("slow", slow)
        builder.add_edge(START, "fast")
        builder.add_edge(START, "slow")
        with Engine(store_url) as engine:
            graph = builder.compile(checkpointer=StagetrailSaver(engine))
            config: RunnableConfig = {"configurable": {"thread_id": "fan"}}
            with pytest.raises(RuntimeError, match="slow broke"):
                graph.invoke({"log": []}, config, durability="sync")
            graph.invoke(None, config, durability="sync")
            assert sorted(node_events(engine)) == [
                ("StageCompleted", "fast", 1),
                ("StageCompleted", "slow", 2),
                ("StageFailed", "slow", 1),
            ]


class TestRetryPolicy:
    def test_each_retried_attempt_is_a_failure_then_a_retry(self, store_url: str) -> None:
        """A node failing twice inside one invoke: two StageFailed, each followed by its retry."""
        with Engine(store_url) as engine:
            graph = retried_graph(failures=2).compile(checkpointer=StagetrailSaver(engine))
            config: RunnableConfig = {"configurable": {"thread_id": "r"}}
            result = graph.invoke({"log": []}, config, durability="sync")
            assert result == {"log": ["plan", "fetch"]}
            assert node_events(engine) == RETRIED_TWICE
            (summary,) = engine.runs()
            failed = [e for e in engine.events(summary.run_id) if isinstance(e, StageFailed)]
            assert [(e.error, e.error_type) for e in failed] == [
                ("timeout 1", "ConnectionError"),
                ("timeout 2", "ConnectionError"),
            ]
            retries = [e for e in engine.events(summary.run_id) if isinstance(e, RetryScheduled)]
            assert [e.delay for e in retries] == [0.01, 0.02]  # as LangGraph logs them
            counts = engine.project(summary.run_id, RetryCounts)
            assert counts.retries("fetch") == 2
            # plan once, fetch three times: LangGraph's routing is no attempt
            assert (counts.total_attempts, counts.attempts(HUB)) == (4, 0)
            assert summary.attempts == 4
            patterns = engine.project(summary.run_id, FailurePatterns)
            assert patterns.by_error_type == {"ConnectionError": 2}
            assert engine.verify(summary.run_id).ok

    def test_retried_attempts_read_alike_with_implicit_and_recorded_routes(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Under a RetryPolicy, one event per attempt (no route) reads as routes recorded did."""

        def record(engine: Engine) -> None:
            graph = retried_graph(failures=2).compile(checkpointer=StagetrailSaver(engine))
            graph.invoke({"log": []}, {"configurable": {"thread_id": "r"}}, durability="sync")

        seen = read_both_ways(monkeypatch, record)
        assert seen["implicit"][0] == seen["explicit"][0]
        assert seen["implicit"][0]["retries"] == {"plan": (1, 0), "fetch": (3, 2)}
        bars = [kind for stage, _, kind in seen["implicit"][0]["bars"] if stage == "fetch"]
        assert bars == ["retried", "retried", "completed"]
        routes = [routes_recorded(history) for _, history in seen.values()]
        assert routes == [4, 0]  # explicit: one per attempt

    def test_the_async_api_records_the_same_attempts(self, store_url: str) -> None:
        """ainvoke under a RetryPolicy records what invoke records."""
        with Engine(store_url) as engine:
            graph = retried_graph(failures=2).compile(checkpointer=StagetrailSaver(engine))
            config: RunnableConfig = {"configurable": {"thread_id": "async"}}
            result = asyncio.run(graph.ainvoke({"log": []}, config, durability="sync"))
            assert result == {"log": ["plan", "fetch"]}
            assert node_events(engine) == RETRIED_TWICE

    def test_attempts_that_exhaust_the_policy_end_in_the_last_failure(self) -> None:
        """Three failures under max_attempts=3: two retries, then the failure LangGraph raises."""
        engine = Engine("memory://")
        graph = retried_graph(failures=5).compile(checkpointer=StagetrailSaver(engine))
        with pytest.raises(ConnectionError, match="timeout 3"):
            graph.invoke({"log": []}, {"configurable": {"thread_id": "x"}}, durability="sync")
        assert node_events(engine) == [
            *RETRIED_TWICE[:-1],
            ("StageFailed", "fetch", 3),
        ]

    def test_listening_shows_no_handler_more_than_before(self) -> None:
        """The retry log is heard without a WARNING-level root handler printing it."""
        seen: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = seen.append  # type: ignore[method-assign,assignment]
        root = logging.getLogger()
        root.addHandler(handler)
        try:
            engine = Engine("memory://")
            graph = retried_graph(failures=1).compile(checkpointer=StagetrailSaver(engine))
            graph.invoke({"log": []}, {"configurable": {"thread_id": "quiet"}}, durability="sync")
        finally:
            root.removeHandler(handler)
        assert [r for r in seen if r.name == RETRY_LOGGER] == []
        assert node_events(engine)[1:3] == [
            ("StageFailed", "fetch", 1),
            ("RetryScheduled", "fetch", 2),
        ]


FRESH_PROCESS = """
import json, logging, logging.config, operator
from typing import Annotated, TypedDict

shown = []


class Keep(logging.Handler):
    def emit(self, record):
        shown.append(record.name)


APP_LOGGING = {{
    "version": 1,
    "handlers": {{"keep": {{"()": Keep, "level": "DEBUG"}}}},
    "root": {{"level": "INFO", "handlers": ["keep"]}},
}}
{before}
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, RetryPolicy, interrupt

from engine import Engine
from engine.integrations.langgraph import StagetrailSaver
from events import RetryScheduled, StageFailed


class Log(TypedDict):
    log: Annotated[list[str], operator.add]


calls = []


def fetch(state):
    calls.append(1)
    if len(calls) <= 2:
        raise ConnectionError(f"timeout {{len(calls)}}")
    return {{"log": ["fetch"]}}


builder = StateGraph(Log)
builder.add_node("fetch", fetch, retry_policy=RetryPolicy(initial_interval=0.01, jitter=False))
builder.add_edge(START, "fetch")
builder.add_edge("fetch", END)
engine = Engine("memory://")
saver = StagetrailSaver(engine)
{after}
graph = builder.compile(checkpointer=saver)
graph.invoke({{"log": []}}, {{"configurable": {{"thread_id": "t"}}}}, durability="sync")
(run,) = engine.runs()
kinds = (StageFailed, RetryScheduled)
recorded = [type(e).__name__ for e in engine.events(run.run_id) if isinstance(e, kinds)]
print(json.dumps({{"recorded": recorded, "shown": shown}}))
"""
"""A process that configures logging `before` importing LangGraph and stagetrail or `after`
building the saver, then runs a node that fails twice under a RetryPolicy."""

RETRIES_RECORDED = ["StageFailed", "RetryScheduled", "StageFailed", "RetryScheduled"]


def in_fresh_process(before: str = "", after: str = "") -> dict[str, list[str]]:
    """What `FRESH_PROCESS` recorded of the retries, and the loggers its handler showed."""
    code = FRESH_PROCESS.format(before=before, after=after)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, list[str]] = json.loads(done.stdout.splitlines()[-1])
    return found


class TestLoggingConfiguredByTheApplication:
    def test_dict_config_after_langgraph_is_imported(self) -> None:
        """dictConfig after `import langgraph` disables its retry logger; retries are still
        recorded, and a logger it disabled still shows nothing."""
        before = "import langgraph.pregel\nlogging.config.dictConfig(APP_LOGGING)"
        found = in_fresh_process(before=before)
        assert found["recorded"] == RETRIES_RECORDED
        assert RETRY_LOGGER not in found["shown"]

    def test_dict_config_after_the_saver_is_built(self) -> None:
        """dictConfig between building the saver and invoking: retries still recorded."""
        found = in_fresh_process(after="logging.config.dictConfig(APP_LOGGING)")
        assert found["recorded"] == RETRIES_RECORDED
        assert RETRY_LOGGER not in found["shown"]

    def test_langgraph_quietened_after_the_saver_is_built(self) -> None:
        """Configuring the `langgraph` logger at WARNING resets its retry logger's level;
        retries are still recorded and the INFO root handler still shows none."""
        quiet = {
            "version": 1,
            "disable_existing_loggers": False,
            "loggers": {"langgraph": {"level": "WARNING"}},
        }
        after = f"logging.config.dictConfig(APP_LOGGING)\nlogging.config.dictConfig({quiet!r})"
        found = in_fresh_process(after=after)
        assert found["recorded"] == RETRIES_RECORDED
        assert RETRY_LOGGER not in found["shown"]

    def test_retry_logger_set_to_warning_before_the_saver(self) -> None:
        """The retry logger's own WARNING level hides its INFO retries from an INFO root
        handler, as it did before the saver listened."""
        before = (
            "logging.config.dictConfig(APP_LOGGING)\n"
            f"logging.getLogger({RETRY_LOGGER!r}).setLevel(logging.WARNING)"
        )
        found = in_fresh_process(before=before)
        assert found["recorded"] == RETRIES_RECORDED
        assert RETRY_LOGGER not in found["shown"]

    def test_an_info_root_handler_still_shows_the_retries(self) -> None:
        """Where the application's INFO handler saw the retries before, it still does."""
        found = in_fresh_process(before="logging.config.dictConfig(APP_LOGGING)")
        assert found["recorded"] == RETRIES_RECORDED
        assert found["shown"].count(RETRY_LOGGER) == 2


def history(engine: Engine, thread_id: str) -> list[tuple[str, str]]:
    """A thread's events in order, each as (kind, what it is about): comparable across runs."""
    (summary,) = engine.runs(label=f"langgraph.thread={thread_id}")
    shown = []
    for event in engine.events(summary.run_id)[1:]:
        if isinstance(event, CheckpointSaved):
            shown.append(("CheckpointSaved", str(event.metadata["json"]["step"])))
        elif isinstance(event, WritesSaved):
            shown.append(("WritesSaved", event.task_path))
        else:
            shown.append((type(event).__name__, getattr(event, "stage", "")))
    return shown


IN_ORDER = [
    ("CheckpointSaved", "-1"),
    ("WritesSaved", "~__pregel_pull, __start__"),
    ("CheckpointSaved", "0"),
    ("StageCompleted", "plan"),
    ("CheckpointSaved", "1"),
    ("StageCompleted", "fetch"),
    ("CheckpointSaved", "2"),
    ("NoteAdded", ""),
]
"""`invoked_history` in execution order: what either durability must record."""


def invoked_history(durability: str) -> list[tuple[str, str]]:
    """The history of one invoke of `retried_graph` (no failure) under `durability`."""
    with Engine("memory://") as engine:
        graph = retried_graph(0).compile(checkpointer=StagetrailSaver(engine))
        config: RunnableConfig = {"configurable": {"thread_id": "late"}}
        mode: dict[str, Any] = {"durability": durability}
        graph.invoke({"log": []}, config, **mode)
        return history(engine, "late")


class TestOrder:
    @pytest.mark.parametrize("failures", [0, 2])
    def test_async_durability_records_in_execution_order(
        self, store_url: str, failures: int
    ) -> None:
        """With background saves (LangGraph's default), the history reads as with sync saves."""
        recorded = {}
        for durability in ("sync", "async", "default"):
            with Engine(store_url if durability != "sync" else "memory://") as engine:
                builder = retried_graph(failures)
                graph = builder.compile(checkpointer=StagetrailSaver(engine))
                config: RunnableConfig = {"configurable": {"thread_id": f"o-{durability}"}}
                mode: dict[str, Any] = {} if durability == "default" else {"durability": durability}
                for _ in range(3):
                    graph.invoke({"log": []}, config, **mode)
                recorded[durability] = history(engine, f"o-{durability}")
                assert all(engine.verify(run.run_id).ok for run in engine.runs())
        assert recorded["async"] == recorded["sync"]
        assert recorded["default"] == recorded["sync"]  # LangGraph's default is async

    @pytest.mark.skipif(not hasattr(os, "sched_yield"), reason="no sched_yield on this OS")
    def test_a_checkpoint_yields_to_pool_threads_without_sleeping(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A loop's checkpoint lets pool threads starting writes go first by ``sched_yield``,
        never ``time.sleep(0)`` (which waits out the kernel's timer slack each time)."""
        yields: list[bool] = []
        sleeps: list[float] = []
        real_sleep = time.sleep

        def yielding() -> None:
            yields.append(True)
            os.sched_yield()

        def sleeping(seconds: float) -> None:
            sleeps.append(seconds)
            real_sleep(seconds)

        monkeypatch.setattr(saver_module, "_YIELD", yielding)
        monkeypatch.setattr(time, "sleep", sleeping)
        assert invoked_history("sync") == IN_ORDER
        assert yields, "no checkpoint yielded to the pool"
        assert 0 not in sleeps

    @pytest.mark.parametrize("durability", ["sync", "async"])
    def test_writes_scheduled_late_still_precede_the_next_checkpoint(
        self, monkeypatch: pytest.MonkeyPatch, durability: str
    ) -> None:
        """LangGraph saves a task's writes from its thread pool under every durability mode
        (sync waits only for checkpoints): writes whose pool thread starts after the next
        checkpoint's save has begun are still recorded before that checkpoint."""
        # The checkpoint's wait for the writes of the nodes that ran is bounded; raised here
        # so that the order below depends on the events, not on the host's load.
        monkeypatch.setattr(saver_module, "_ORDER_WAIT", 30.0)
        next_checkpoint = threading.Event()
        put, put_writes = StagetrailSaver.put, StagetrailSaver.put_writes

        def late_put(self: StagetrailSaver, config: Any, checkpoint: Any, *rest: Any) -> Any:
            if checkpoint["versions_seen"].get("__start__"):
                next_checkpoint.set()  # the checkpoint the input's writes must precede
            return put(self, config, checkpoint, *rest)

        def late_writes(
            self: StagetrailSaver, config: Any, writes: Any, task_id: str, task_path: str = ""
        ) -> None:
            if task_path.endswith("__start__"):
                assert next_checkpoint.wait(30), "the next checkpoint was never saved"
            put_writes(self, config, writes, task_id, task_path)

        monkeypatch.setattr(StagetrailSaver, "put", late_put)
        monkeypatch.setattr(StagetrailSaver, "put_writes", late_writes)
        assert invoked_history(durability)[:4] == IN_ORDER[:4]

    @pytest.mark.parametrize("durability", ["sync", "async"])
    def test_writes_whose_pool_thread_is_300_ms_late_still_read_in_order(
        self, monkeypatch: pytest.MonkeyPatch, durability: str
    ) -> None:
        """Every task's writes reaching the saver 300 ms after LangGraph handed them to its
        pool (the saver's bounds as shipped) still come before the next checkpoint."""
        put_writes = StagetrailSaver.put_writes

        def late_writes(
            self: StagetrailSaver, config: Any, writes: Any, task_id: str, task_path: str = ""
        ) -> None:
            time.sleep(0.3)  # the pool thread is slow to start: not a timing assertion
            put_writes(self, config, writes, task_id, task_path)

        monkeypatch.setattr(StagetrailSaver, "put_writes", late_writes)
        assert invoked_history(durability) == IN_ORDER

    @pytest.mark.parametrize("durability", ["sync", "async"])
    def test_resumed_writes_need_not_wait_when_other_threads_push_theirs_out(
        self, monkeypatch: pytest.MonkeyPatch, durability: str
    ) -> None:
        """A resumed node's writes against the checkpoint its invocation loaded (a saver
        started since) do not wait for a save of it that never comes, though the node kept
        the saver busy with more threads than it caches meanwhile."""
        # The wait, if taken, would last all of this: the invocation then never returns.
        monkeypatch.setattr(saver_module, "_ORDER_WAIT", 30.0)
        monkeypatch.setattr(saver_module, "_CACHED_THREADS", 2)
        with Engine("memory://") as engine:
            others = ["other-1", "other-2", "other-3"]
            first = StagetrailSaver(engine)
            side = retried_graph(0).compile(checkpointer=first)
            for other in others:
                side.invoke({"log": []}, {"configurable": {"thread_id": other}})
            saver = StagetrailSaver(engine)  # the process restarted: it saved nothing yet

            def ask(state: Log) -> dict[str, list[str]]:
                answer = interrupt("go on?")
                for other in others:  # other threads served by the saver meanwhile
                    saver.get_tuple({"configurable": {"thread_id": other}})
                return {"log": [str(answer)]}

            builder = StateGraph(Log)
            builder.add_node("ask", ask)
            builder.add_edge(START, "ask")
            builder.add_edge("ask", END)
            config: RunnableConfig = {"configurable": {"thread_id": "asked"}}
            builder.compile(checkpointer=first).invoke({"log": []}, config)
            graph = builder.compile(checkpointer=saver)
            mode: dict[str, Any] = {"durability": durability}
            resumed = threading.Thread(
                target=graph.invoke, args=(Command(resume="yes"), config), kwargs=mode
            )
            resumed.start()
            resumed.join(10)  # far below the 30 s the wait would take: not a timing assertion
            assert not resumed.is_alive(), "the resumed node's writes waited for a save"
            assert graph.get_state(config).values == {"log": ["yes"]}

    @pytest.mark.parametrize("durability", ["sync", "async"])
    def test_a_command_starting_a_new_thread_does_not_wait_for_a_checkpoint(
        self, monkeypatch: pytest.MonkeyPatch, durability: str
    ) -> None:
        """A `Command` that starts a thread at a node writes against the empty checkpoint
        LangGraph makes up for a thread without one: no save of it comes, nothing waits."""
        monkeypatch.setattr(saver_module, "_ORDER_WAIT", 30.0)  # a wait would take it all
        builder = StateGraph(Log)
        builder.add_node("plan", lambda state: {"log": ["plan"]})
        builder.add_node("fetch", lambda state: {"log": ["fetch"]})
        builder.add_edge(START, "plan")
        builder.add_edge("plan", "fetch")
        builder.add_edge("fetch", END)
        with Engine("memory://") as engine:
            graph = builder.compile(checkpointer=StagetrailSaver(engine))
            config: RunnableConfig = {"configurable": {"thread_id": "started"}}
            mode: dict[str, Any] = {"durability": durability}
            start = Command(update={"log": ["given"]}, goto="fetch")
            started = threading.Thread(target=graph.invoke, args=(start, config), kwargs=mode)
            started.start()
            started.join(10)  # far below the 30 s the wait would take: not a timing assertion
            assert not started.is_alive(), "the command's writes waited for a save"
            assert "fetch" in graph.get_state(config).values["log"]
