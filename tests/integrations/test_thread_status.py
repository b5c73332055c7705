"""A LangGraph thread reads as it is: idle at its end, waiting on an interrupt, failed but
resumable, with one attempt per node run; subgraphs recorded too."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph", reason="needs the langgraph extra")

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from engine import Engine
from engine.diagram import drawn_table
from engine.integrations.langgraph import HUB, StagetrailSaver
from events import StageCompleted, WritesSaved
from tests.integrations.test_langgraph import flaky_graph, stagetrail


class Log(TypedDict):
    log: Annotated[list[str], operator.add]


def asking_graph() -> StateGraph[Any]:
    """fetch -> ask (interrupts with a question) -> answer."""

    def ask(state: Log) -> dict[str, list[str]]:
        return {"log": [interrupt({"question": "ship it?"})]}

    builder = StateGraph(Log)
    builder.add_node("fetch", lambda state: {"log": ["fetch"]})
    builder.add_node("ask", ask)
    builder.add_node("answer", lambda state: {"log": ["answer"]})
    builder.add_edge(START, "fetch")
    builder.add_edge("fetch", "ask")
    builder.add_edge("ask", "answer")
    builder.add_edge("answer", END)
    return builder


class TestStatus:
    def test_a_thread_at_its_end_is_idle_and_counts_one_attempt_per_node(
        self, store_url: str
    ) -> None:
        """plan, build, ship ran once each: three attempts (no route counted), idle, resumable."""
        with Engine(store_url) as engine:
            graph = flaky_graph(0).compile(checkpointer=StagetrailSaver(engine))
            config: RunnableConfig = {"configurable": {"thread_id": "done"}}
            graph.invoke({"log": []}, config, durability="sync")
            (summary,) = engine.runs(status="idle")
            assert (summary.status, summary.attempts, summary.failures) == ("idle", 3, 0)
            graph.invoke({"log": []}, config, durability="sync")  # resumed: a new input
            (again,) = engine.runs()
            assert (again.status, again.attempts) == ("idle", 6)
            assert engine.verify(summary.run_id).ok

    def test_an_interrupt_waits_with_its_value_then_resumes(self, store_url: str) -> None:
        """interrupt() leaves the thread waiting, the question as its reason; resume ends idle."""
        with Engine(store_url) as engine:
            graph = asking_graph().compile(checkpointer=StagetrailSaver(engine))
            config: RunnableConfig = {"configurable": {"thread_id": "ask"}}
            graph.invoke({"log": []}, config, durability="sync")
            (waiting,) = engine.runs(status="waiting")
            assert waiting.reason == {"question": "ship it?"}
            result = graph.invoke(Command(resume="yes"), config, durability="sync")
            assert result == {"log": ["fetch", "yes", "answer"]}
            (done,) = engine.runs()
            assert (done.status, done.reason, done.attempts) == ("idle", None, 3)
            kinds = [type(e).__name__ for e in engine.events(done.run_id)]
            assert "WritesSaved" in kinds  # the interrupt and the resume value
            assert engine.verify(done.run_id).ok

    def test_a_failed_node_leaves_the_thread_failed_resumable(self, store_url: str) -> None:
        """A node's failure: failed_resumable; the resumed invoke that gets through: idle."""
        with Engine(store_url) as engine:
            graph = flaky_graph(1).compile(checkpointer=StagetrailSaver(engine))
            config: RunnableConfig = {"configurable": {"thread_id": "f"}}
            with pytest.raises(RuntimeError):
                graph.invoke({"log": []}, config, durability="sync")
            (failed,) = engine.runs(status="failed_resumable")
            assert (failed.attempts, failed.failures) == (2, 1)
            graph.invoke(None, config, durability="sync")
            (done,) = engine.runs()
            assert (done.status, done.attempts, done.failures) == ("idle", 4, 1)


class TestSubgraphs:
    def test_a_subgraphs_tasks_are_kept_and_its_node_is_a_stage(self, store_url: str) -> None:
        """The parent's node running a subgraph is a stage; the subgraph's writes are kept."""
        inner = StateGraph(Log)
        inner.add_node("step", lambda state: {"log": ["inner"]})
        inner.add_edge(START, "step")
        inner.add_edge("step", END)
        outer = StateGraph(Log)
        outer.add_node("child", inner.compile())
        outer.add_node("after", lambda state: {"log": ["after"]})
        outer.add_edge(START, "child")
        outer.add_edge("child", "after")
        outer.add_edge("after", END)
        with Engine(store_url) as engine:
            graph = outer.compile(checkpointer=StagetrailSaver(engine))
            config: RunnableConfig = {"configurable": {"thread_id": "nested"}}
            result = graph.invoke({"log": []}, config, durability="sync")
            assert result == {"log": ["inner", "after"]}
            (summary,) = engine.runs()
            events = engine.events(summary.run_id)
            stages = [e.stage for e in events if isinstance(e, StageCompleted) and e.stage != HUB]
            assert stages == ["child", "after"]
            inside = [e for e in events if isinstance(e, WritesSaved) and e.namespace]
            assert inside  # the subgraph's own tasks, in its namespace
            assert (summary.status, summary.attempts) == ("idle", 2)
            assert engine.verify(summary.run_id).ok
            assert graph.get_state(config).values == result


class TestDiagram:
    @pytest.mark.parametrize("given", [False, True])
    def test_the_diagram_is_the_users_graph(self, tmp_path: Any, given: bool) -> None:
        """`stagetrail diagram` of a thread draws its graph: the builder's nodes and edges
        (conditional ones marked) when the saver was given it, else the edges taken."""
        builder = StateGraph(Log)
        builder.add_node("fetch", lambda state: {"log": ["fetch"]})
        builder.add_node("think", lambda state: {"log": ["think"]})
        builder.add_node("answer", lambda state: {"log": ["answer"]})
        builder.add_edge(START, "fetch")
        builder.add_edge("fetch", "think")
        route = ["answer", "fetch"]
        builder.add_conditional_edges("think", lambda s: route[len(s["log"]) < 3], route)
        builder.add_edge("answer", END)
        url = f"sqlite:///{tmp_path / 'g.db'}"
        with Engine(url) as engine:
            saver = StagetrailSaver(engine, builder) if given else StagetrailSaver(engine)
            graph = builder.compile(checkpointer=saver)
            graph.invoke({"log": []}, {"configurable": {"thread_id": "d"}}, durability="sync")
            (summary,) = engine.runs()
        drawn = stagetrail("diagram", str(summary.run_id), "--store", url).stdout
        if given:  # the builder's edges, conditional ones marked
            assert "think --> answer: if answer" in drawn
            assert "think --> fetch: if fetch" in drawn
        else:  # the transitions the thread took
            assert "think --> answer: " in drawn
            assert "think --> fetch: " in drawn
        assert "__start__ --> fetch: then" in drawn
        assert "answer --> __end__: then" in drawn
        assert "__graph__" not in drawn

    def test_a_fan_out_and_a_run_without_a_graph(self) -> None:
        """Two plain edges from one node are both drawn; a run without a graph keeps its table."""
        table = {"name": "langgraph", "initial": "__graph__", "transitions": []}
        edges = [["__start__", "a"], ["__start__", "b"], ["a", "__end__"], ["b", "__end__"]]
        drawn = drawn_table(table, {"graph": {"edges": edges}})
        assert drawn["transitions"] == [
            ["__start__", "then", "a"],
            ["__start__", "and b", "b"],
            ["a", "then", "__end__"],
            ["b", "then", "__end__"],
        ]
        assert drawn["final"] == ["__end__"]
        assert drawn_table(table, {"thread_id": "t"}) is table
        assert drawn_table(table, {"graph": {"edges": [["only"]]}}) is table
