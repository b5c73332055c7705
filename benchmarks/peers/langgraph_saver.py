"""LangGraph: a `StateGraph` with one node per stage, checkpointed by `SqliteSaver`.

Two variants. ``retry``: each node has a `RetryPolicy`, so a failed attempt is
retried inside the node and leaves no trace. ``loop``: a node catches its error
and a conditional edge loops back to it, so every attempt is a checkpoint.
Both invoke with ``durability="sync"``: each step is on disk before the next.
"""

from __future__ import annotations

import itertools
import operator
import sqlite3
import uuid
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy

from benchmarks.peers.workload import STAGES, StageError, attempt


def merged(left: dict[str, Any], right: dict[str, Any]) -> dict[str, Any]:
    """Reducer: later keys win."""
    return {**left, **right}


class ReviewState(TypedDict, total=False):
    """The graph's state: results by stage, attempts by stage, errors seen, the last verdict."""

    results: Annotated[dict[str, Any], merged]
    attempts: Annotated[dict[str, int], merged]
    errors: Annotated[list[dict[str, Any]], operator.add]
    failed: bool


class LangGraphSaver:
    """LangGraph with its SQLite checkpointer, in the ``retry`` or ``loop`` variant."""

    def __init__(self, path: Path, variant: str) -> None:
        self.variant = variant
        self.name = f"LangGraph ({variant})"
        self.keeps_failures = variant == "loop"
        self.conn = sqlite3.connect(path, check_same_thread=False)
        self.saver = SqliteSaver(self.conn)
        self.saver.setup()
        self.graph = (self._loop_graph() if variant == "loop" else self._retry_graph()).compile(
            checkpointer=self.saver
        )
        self._tries: Counter[tuple[str, str]] = Counter()

    def _retry_graph(self) -> StateGraph[Any]:
        graph: StateGraph[Any] = StateGraph(ReviewState)
        policy = RetryPolicy(max_attempts=3, initial_interval=0.0, jitter=False,
                             retry_on=StageError)  # fmt: skip
        for stage in STAGES:
            graph.add_node(stage, self._retrying_node(stage), retry_policy=policy)
        self._chain(graph)
        return graph

    def _retrying_node(self, stage: str) -> Any:
        def node(state: ReviewState, config: RunnableConfig) -> ReviewState:
            key = (config["configurable"]["thread_id"], stage)
            self._tries[key] += 1  # the state cannot count attempts that leave no checkpoint
            return {"results": {stage: attempt(stage, self._tries[key])}}

        return node

    def _chain(self, graph: StateGraph[Any]) -> None:
        graph.add_edge(START, STAGES[0])
        for here, there in itertools.pairwise(STAGES):
            graph.add_edge(here, there)
        graph.add_edge(STAGES[-1], END)

    def _loop_graph(self) -> StateGraph[Any]:
        graph: StateGraph[Any] = StateGraph(ReviewState)
        for stage in STAGES:
            graph.add_node(stage, self._looping_node(stage))
        graph.add_edge(START, STAGES[0])
        for index, stage in enumerate(STAGES):
            after = STAGES[index + 1] if index + 1 < len(STAGES) else END
            graph.add_conditional_edges(stage, self._router(stage, after), [stage, after])
        return graph

    @staticmethod
    def _looping_node(stage: str) -> Any:
        def node(state: ReviewState) -> ReviewState:
            number = state.get("attempts", {}).get(stage, 0) + 1
            try:
                result = attempt(stage, number)
            except StageError as error:
                failure = {"stage": stage, "attempt": number, "error": str(error),
                           "error_type": type(error).__name__}  # fmt: skip
                return {"attempts": {stage: number}, "errors": [failure], "failed": True}
            return {"attempts": {stage: number}, "results": {stage: result}, "failed": False}

        return node

    @staticmethod
    def _router(stage: str, after: str) -> Any:
        return lambda state: stage if state.get("failed") else after

    def record(self, runs: int) -> list[Any]:
        """One thread per run, invoked with durability="sync"."""
        ids = []
        for _ in range(runs):
            thread = uuid.uuid4().hex
            config: RunnableConfig = {"configurable": {"thread_id": thread}, "recursion_limit": 50}
            start: ReviewState = {"results": {}, "attempts": {}, "errors": []}
            self.graph.invoke(start, config,
                              durability="sync")  # fmt: skip
            ids.append(thread)
        return ids

    def history(self, run_id: Any) -> list[Any]:
        """Every checkpoint of the thread, as `StateSnapshot`s."""
        return list(self.graph.get_state_history({"configurable": {"thread_id": run_id}}))

    def locate(self, run_id: Any, record: int) -> Any:
        """The config of the thread's `record`-th checkpoint (oldest first)."""
        oldest_first = list(self.saver.list({"configurable": {"thread_id": run_id}}))[::-1]
        return oldest_first[record - 1].config

    def state_at(self, run_id: Any, record: int) -> Any:
        """`get_state` of a checkpoint located beforehand (`locate`, not timed)."""
        return self.graph.get_state(run_id)

    def failures_visible(self, run_id: Any) -> bool:
        """Whether any checkpoint shows a failed attempt (an error write or the errors list)."""
        for snapshot in self.history(run_id):
            if snapshot.values.get("errors") or any(t.error for t in snapshot.tasks):
                return True
        return False

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()
