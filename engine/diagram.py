"""Diagrams of a transition table, drawn by `transitions`' diagram support.

It draws from a table's `machine_spec` (what `Pipeline.machine_spec()` gives),
so it needs no pipeline object and `engine.pipeline` alone depends on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal


class _Sketch:
    """A throwaway model the diagram machine draws; never a run object."""

    state: str


def _graph(
    title: str,
    spec: Mapping[str, Any],
    engine: Literal["mermaid", "graphviz"],
    current: str | None,
    highlight: bool = True,
) -> Any:
    from transitions.extensions import GraphMachine

    sketch = _Sketch()
    machine = GraphMachine(
        model=sketch,
        auto_transitions=False,
        graph_engine=engine,
        title=title,
        show_state_attributes=False,
        **spec,
    )
    if current is not None:  # highlighted, while the [*] arrow still points at the initial state
        machine.set_state(current, model=sketch)
    graph = sketch.get_graph(force_new=True)  # type: ignore[attr-defined]
    if highlight:
        return graph
    machine.model_graphs[id(sketch)].reset_styling()  # a viewer highlights states itself
    return sketch.get_graph()  # type: ignore[attr-defined]


def mermaid(title: str, spec: Mapping[str, Any], current: str | None) -> str:
    """Mermaid source; `current` (default: the initial state) is highlighted."""
    source: str = _graph(title, spec, "mermaid", current).draw(None)
    return source


def dot(title: str, spec: Mapping[str, Any], current: str | None, *, highlight: bool = True) -> str:
    """Graphviz DOT source; `current` (default: the initial state) is highlighted.

    Args:
        highlight: False draws every state alike (for a viewer that highlights them itself).
    """
    source: str = _graph(title, spec, "graphviz", current, highlight).source
    return source


GRAPH_PARAM = "graph"
"""The key of a run's params that holds the shape of a framework's graph it records
(a LangGraph thread's nodes and edges): ``{"edges": [[source, dest], [source, dest,
"if"], ...]}``, ``"if"`` marking a conditional edge; it starts at ``__start__`` and
ends at ``__end__``."""


def drawn_table(
    table: Mapping[str, Any], params: Any, observed: Mapping[str, Any] | None = None
) -> Mapping[str, Any]:
    """The table to draw for a run: its framework graph's shape if its params hold one,
    else the `observed` one (`engine.payloads.observed_graph`), else `table`.

    A LangGraph thread's own table routes every node through a hub (any order is
    valid there); its picture is the user's graph instead, each edge an arrow
    (``then``, or ``if <node>`` for a conditional one).
    """
    graph = params.get(GRAPH_PARAM) if isinstance(params, Mapping) else None
    graph = graph if isinstance(graph, Mapping) else observed
    edges = graph.get("edges") if isinstance(graph, Mapping) else None
    if not isinstance(edges, list) or not edges:
        return table
    rows: list[list[str]] = []
    taken: set[tuple[str, str]] = set()
    for edge in edges:
        if not isinstance(edge, list) or len(edge) < 2:
            return table
        source, dest = str(edge[0]), str(edge[1])
        label = f"if {dest}" if edge[2:] == ["if"] else "then"
        if (source, label) in taken:  # a second plain edge (a fan-out): named by its end
            label = f"and {dest}"
        taken.add((source, label))
        rows.append([source, label, dest])
    finals = sorted({row[2] for row in rows} - {row[0] for row in rows})
    name = str(table.get("name", "graph"))
    return {"name": name, "initial": "__start__", "final": finals, "transitions": rows}
