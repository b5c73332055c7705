"""Diagrams of a pipeline's table, drawn by `transitions`' diagram support."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from engine.pipeline import Pipeline


class _Sketch:
    """A throwaway model the diagram machine draws; never a run object."""

    state: str


def _graph(pipeline: Pipeline, engine: Literal["mermaid", "graphviz"], current: str | None) -> Any:
    from transitions.extensions import GraphMachine

    sketch = _Sketch()
    machine = GraphMachine(
        model=sketch,
        auto_transitions=False,
        graph_engine=engine,
        title=pipeline.name,
        show_state_attributes=False,
        **pipeline.machine_spec(),
    )
    if current is not None:  # highlighted, while the [*] arrow still points at the initial state
        machine.set_state(current, model=sketch)
    return sketch.get_graph(force_new=True)  # type: ignore[attr-defined]


def mermaid(pipeline: Pipeline, current: str | None) -> str:
    """Mermaid source; `current` (default: the initial state) is highlighted."""
    source: str = _graph(pipeline, "mermaid", current).draw(None)
    return source


def dot(pipeline: Pipeline, current: str | None) -> str:
    """Graphviz DOT source; `current` (default: the initial state) is highlighted."""
    source: str = _graph(pipeline, "graphviz", current).source
    return source
