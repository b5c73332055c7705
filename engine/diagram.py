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
