"""Writes `langgraph_delta_store.db`: LangGraph threads as `StagetrailSaver` stored them
before checkpoint skeletons were patches.

Each checkpoint after a thread's first is a ``{"delta": ...}``: every top-level key
of the skeleton again, and the nodes' seen versions whole for each node that ran.
Thread ``"flaky"`` ran plan → build → ship with build failing once (two invokes);
thread ``"done"`` ran through in one. The file was written once by that code
(commit 6e98855) and is checked in: a later release must still read these threads
and go on with them. Do not regenerate it with newer code; this script documents
how it was made::

    PYTHONPATH=<a checkout of 6e98855> python tests/data/make_langgraph_delta_store.py
"""

from __future__ import annotations

import contextlib
import operator
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

TARGET = Path(__file__).with_name("langgraph_delta_store.db")


class Flaky(TypedDict):
    log: Annotated[list[str], operator.add]


def graph(failures: int) -> Any:
    """plan -> build -> ship, where build raises `failures` times before it succeeds."""
    from langgraph.graph import END, START, StateGraph

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


def main() -> None:
    """Write the store next to this script (refusing to overwrite it)."""
    from engine import Engine
    from engine.integrations.langgraph import StagetrailSaver

    if TARGET.exists():
        raise SystemExit(f"{TARGET} exists: it is checked in, never regenerated")
    with Engine(f"sqlite:///{TARGET}") as engine:
        flaky = graph(1).compile(checkpointer=StagetrailSaver(engine))
        config: Any = {"configurable": {"thread_id": "flaky"}}
        with contextlib.suppress(RuntimeError):
            flaky.invoke({"log": []}, config, durability="sync")
        flaky.invoke(None, config, durability="sync")
        done = graph(0).compile(checkpointer=StagetrailSaver(engine))
        done.invoke({"log": []}, {"configurable": {"thread_id": "done"}}, durability="sync")
    print(f"wrote {TARGET}", file=sys.stderr)


if __name__ == "__main__":
    main()
