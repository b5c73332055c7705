"""The transition table of a LangGraph thread's run: a hub that routes to each node.

LangGraph decides at run time which node runs next, and parallel nodes of one
super-step finish in any order, so no fixed row can say which node follows
another. The table therefore has a hub state, ``__graph__``, the graph
choosing its next node: ``(__graph__, node, node)`` routes to a node, and the
node's own outcome, ``completed`` or ``failed``, returns to the hub. The table
declares ``__graph__`` its hub (`Pipeline`'s ``hub``), so a node's outcome
recorded in the hub takes that route implicitly: one event per node run. (Threads
recorded before hubs were declared hold each route as an event of its own, a
decided `StageCompleted` of stage ``__graph__`` whose outcome is the node's name;
their stored table declares no hub, so they read, and go on, as they were written.)
Every rule of `engine.machine` then holds for any order LangGraph runs nodes in:
an outcome names the current state or a node the hub routes to, and each state
has its rows.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.pipeline import Pipeline

HUB = "__graph__"
"""The state between two node outcomes: the graph choosing what runs next."""
END = "__end__"
"""The final state (LangGraph's own name for it); a thread stays open, so it is rarely entered."""
PIPELINE_PREFIX = "langgraph"
"""Every thread's pipeline name starts with this (``langgraph`` or ``langgraph:<graph name>``)."""


def thread_pipeline(nodes: Iterable[str], graph_name: str | None = None) -> Pipeline:
    """The pipeline of a thread of a graph whose nodes are `nodes` (LangGraph's own nodes left out).

    Args:
        nodes: the graph's node names; names starting with ``__`` are LangGraph's own.
        graph_name: shown in `stagetrail runs` as ``langgraph:<graph_name>``.
    """
    names = sorted({n for n in nodes if not n.startswith("__")})
    rows: list[tuple[str, str, str]] = [(HUB, END, END)]
    for node in names:
        rows += [(HUB, node, node), (node, "completed", HUB), (node, "failed", HUB)]
    name = PIPELINE_PREFIX if not graph_name else f"{PIPELINE_PREFIX}:{graph_name}"
    return Pipeline(name, initial=HUB, transitions=rows, final=[END], hub=HUB)
