"""The pipeline's SVG: Graphviz's drawing of the recorded table, names kept as text."""

from __future__ import annotations

from xml.etree import ElementTree

import pytest

from engine import Pipeline
from engine.cli.ui import is_loopback
from engine.ui.diagram import drawn_states, pipeline_svg
from tests._helpers import REVIEW
from tests.ui._helpers import HOSTILE, HOSTILE_STAGE

SVG = "{http://www.w3.org/2000/svg}"


def nodes(svg: str, states: list[str]) -> dict[str, ElementTree.Element]:
    """The state groups of a drawing, by the state they are drawn for (`data-node` indexes)."""
    root = ElementTree.fromstring(svg)
    groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "node"]
    return {states[int(group.get("data-node") or -1)]: group for group in groups}


def shown(group: ElementTree.Element) -> str:
    """The text a node's drawing shows (its label's lines, joined)."""
    return "".join(text.text or "" for text in group.iter(f"{SVG}text"))


NAMES_THAT_BROKE_IT = [
    "ends in a backslash\\",
    "escape \x1b[31m red",
    "bell\x07",
    "<&x;>",
    "<b>bold</b>",
    "&amp;",
    "a\\N and \\l",
    "tab\tand\nnewline",
    'quote " here',
    "del\x7f c1\x85",
]
"""State and pipeline names that made the run page a 500 and `report` a traceback."""


def _hostile_table(name: str) -> Pipeline:
    return Pipeline(
        name,
        initial=name,
        transitions=[
            (name, name, "done"),
            (name, "completed", name + "2"),
            (name + "2", "completed", "done"),
        ],
        final=["done"],
    )


class TestPipelineSvg:
    def test_one_node_per_state_of_the_recorded_table(self) -> None:
        """Every state of the table is a node the page can find by its name."""
        table = REVIEW.to_dict()
        drawn = nodes(pipeline_svg(table), drawn_states(table))
        assert set(drawn) == set(REVIEW.states)
        for state, group in drawn.items():  # the node found for a name shows that name
            assert group.findtext(f"{SVG}title") == state
            assert shown(group) == state

    def test_no_state_is_highlighted_by_the_drawing(self) -> None:
        """All states are drawn alike: the page highlights the one at the slider's version."""
        svg = pipeline_svg(REVIEW.to_dict())
        assert "darksalmon" not in svg
        assert 'class="pipeline"' in svg

    def test_hostile_names_stay_text(self) -> None:
        """Markup in a state or pipeline name is text in the SVG: no element, no handler."""
        svg = pipeline_svg(HOSTILE.to_dict())
        root = ElementTree.fromstring(svg)
        tags = {element.tag.removeprefix(SVG) for element in root.iter()}
        assert tags <= {"svg", "g", "title", "path", "polygon", "polyline", "ellipse", "text"}
        attributes = {name for element in root.iter() for name in element.attrib}
        assert not [name for name in attributes if name.lower().startswith("on")]
        assert shown(nodes(svg, drawn_states(HOSTILE.to_dict()))[HOSTILE_STAGE]) == HOSTILE_STAGE

    @pytest.mark.parametrize("name", NAMES_THAT_BROKE_IT)
    def test_any_name_is_drawn_as_written(self, name: str) -> None:
        """A name with a backslash, a control character or entity-like text is drawn, readable."""
        table = _hostile_table(name).to_dict()
        svg = pipeline_svg(table)
        drawn = nodes(svg, drawn_states(table))  # well-formed XML, every state found
        assert set(drawn) == {name, name + "2", "done"}
        expected = label_shown(name)
        assert shown(drawn[name]) == expected
        edges = [
            "".join(t.text or "" for t in group.iter(f"{SVG}text"))
            for group in ElementTree.fromstring(svg).iter(f"{SVG}g")
            if group.get("class") == "edge"
        ]
        assert expected in edges  # the outcome of the same name, on its edge

    def test_the_pipeline_name_is_no_edge_label(self) -> None:
        """The drawing has no title under its bottom edge: the page's heading names the pipeline."""
        svg = pipeline_svg(_hostile_table("unique-name").to_dict())
        root = ElementTree.fromstring(svg)
        graph = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "graph")
        assert [t.text for t in graph.findall(f"{SVG}text")] == []

    def test_a_small_table_keeps_its_natural_size(self) -> None:
        """A 3-state drawing keeps its size in points, so the page never blows its fonts up."""
        root = ElementTree.fromstring(pipeline_svg(_hostile_table("small").to_dict()))
        assert root.get("width", "").endswith("pt")
        assert root.get("height", "").endswith("pt")
        assert float(root.get("width", "0")[:-2]) < 600


def label_shown(name: str) -> str:
    """What a drawn name reads as: itself, control characters as their pictures, one line."""
    pictures = {code: chr(0x2400 + code) for code in range(0x20)} | {0x7F: "\u2421"}
    text = "".join(pictures.get(ord(c), c) for c in name)
    return text.replace("\x85", "U+0085")


class TestLoopback:
    @pytest.mark.parametrize(
        ("host", "loopback"),
        [
            ("127.0.0.1", True),
            ("127.1.2.3", True),
            ("localhost", True),
            ("::1", True),
            ("[::1]", True),
            ("0.0.0.0", False),
            ("192.168.1.10", False),
            ("example.com", False),
        ],
    )
    def test_only_this_machine_is_loopback(self, host: str, loopback: bool) -> None:
        """A host that is not loopback makes the viewer warn and answer any Host header."""
        assert is_loopback(host) is loopback
