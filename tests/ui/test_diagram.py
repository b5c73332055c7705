"""The pipeline's SVG: Graphviz's drawing of the recorded table, names kept as text."""

from __future__ import annotations

from xml.etree import ElementTree

import pytest

from engine.cli.ui import is_loopback
from engine.ui.diagram import pipeline_svg
from tests._helpers import REVIEW
from tests.ui._helpers import HOSTILE, HOSTILE_STAGE

SVG = "{http://www.w3.org/2000/svg}"


def nodes(svg: str) -> dict[str, ElementTree.Element]:
    """The state groups of a drawing, by the state they are named for."""
    root = ElementTree.fromstring(svg)
    groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "node"]
    return {group.get("data-state") or "": group for group in groups}


class TestPipelineSvg:
    def test_one_node_per_state_of_the_recorded_table(self) -> None:
        """Every state of the table is a node the page can find by its name."""
        drawn = nodes(pipeline_svg(REVIEW.to_dict()))
        assert set(drawn) == set(REVIEW.states)
        for state, group in drawn.items():  # the name the group is given is the one it shows
            assert group.findtext(f"{SVG}title") == state

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
        assert HOSTILE_STAGE in nodes(svg)


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
