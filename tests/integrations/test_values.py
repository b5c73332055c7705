"""What a LangGraph thread's nodes wrote, readable in show, state, the viewer and the report."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph", reason="needs the langgraph extra")

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel

from engine import Engine
from engine.integrations.langgraph import StagetrailSaver
from engine.payloads import readable_payload, readable_result, readable_value, summary
from engine.ui import pages, snapshot
from events import CheckpointSaved, StageCompleted, WritesSaved
from tests.integrations.test_langgraph import stagetrail


class Note(BaseModel):
    """A pydantic value a node writes."""

    text: str
    score: float


@dataclasses.dataclass
class Source:
    """A dataclass value a node writes."""

    url: str


class Research(TypedDict):
    question: str
    notes: Annotated[list[Any], operator.add]
    raw: bytes


def research_graph() -> StateGraph[Any]:
    """fetch -> think: values JSON holds, and a model, a dataclass, bytes and a datetime."""
    builder = StateGraph(Research)
    when = datetime.datetime(2026, 11, 26, 9, 0, tzinfo=datetime.UTC)
    builder.add_node(
        "fetch", lambda state: {"notes": [Note(text="found", score=0.5), Source("https://x")]}
    )
    builder.add_node("think", lambda state: {"notes": [when], "raw": b"\x00\x01"})
    builder.add_edge(START, "fetch")
    builder.add_edge("fetch", "think")
    builder.add_edge("think", END)
    return builder


def serialised(value: Any) -> list[str]:
    """A value as the saver stores one the serde wrote as msgpack: ``[type, base64]``."""
    kind, data = JsonPlusSerializer().dumps_typed(value)
    return [kind, base64.b64encode(data).decode()]


def never_base64(text: str) -> None:
    """Fail if `text` holds a stored value's base64 (LangGraph's msgpack starts ``k`` or ``g``)."""
    assert '"msgpack"' not in text
    assert "kbVm" not in text


class TestReadableValue:
    def test_json_like_values_are_themselves(self) -> None:
        """A msgpack value JSON can hold decodes to that value."""
        assert readable_value(*serialised({"a": [1, 2.5, "x", None]})) == {"a": [1, 2.5, "x", None]}

    def test_a_model_and_a_dataclass_are_typed_summaries(self) -> None:
        """An object is its type's name and fields, built without importing its class."""
        assert readable_value(*serialised(Note(text="t", score=1.0))) == {
            "__type__": f"{__name__}.Note",
            "text": "t",
            "score": 1.0,
        }
        shown = readable_value(*serialised(Source("https://x")))
        assert shown == {"__type__": f"{__name__}.Source", "url": "https://x"}

    def test_bytes_and_unknown_types_say_what_they_are(self) -> None:
        """Bytes and a type no reader knows are summaries with their size, never base64."""
        assert readable_value("bytes", base64.b64encode(b"abc").decode()) == "<bytes, 3 bytes>"
        assert readable_value("pickle", base64.b64encode(b"1234").decode()) == "<pickle, 4 bytes>"
        assert readable_value("~msgpack", {"plain": True}) == {"plain": True}
        assert readable_value("msgpack", "%%%") == "<msgpack, unreadable>"


class TestEverywhere:
    @pytest.fixture
    def thread(self, tmp_path: Path) -> tuple[str, Any]:
        """A store holding one thread of the research graph; its URL and run id."""
        url = f"sqlite:///{tmp_path / 'graph.db'}"
        with Engine(url) as engine:
            graph = research_graph().compile(checkpointer=StagetrailSaver(engine))
            graph.invoke(
                {"question": "why?", "notes": [], "raw": b""},
                {"configurable": {"thread_id": "r"}},
                durability="sync",
            )
            (summary_row,) = engine.runs()
        return url, summary_row.run_id

    def test_every_event_payload_decodes(self, thread: tuple[str, Any]) -> None:
        """Checkpoints, writes and node outcomes: their payloads hold values, not blobs."""
        url, run_id = thread
        with Engine(url) as engine:
            events = engine.events(run_id)
        fetched = next(e for e in events if isinstance(e, StageCompleted) and e.stage == "fetch")
        assert readable_result(fetched.result)["notes"][0]["__type__"].endswith(".Note")
        assert summary(fetched) is not None
        assert summary(fetched).startswith("wrote notes=")  # type: ignore[union-attr]
        written = next(e for e in events if isinstance(e, WritesSaved))
        assert (
            summary(written)
            == '__start__: question="why?", notes=[], raw="<bytes, 0 bytes>", branch:to:fetch'
        )
        last = [e for e in events if isinstance(e, CheckpointSaved)][-1]
        payload = readable_payload(last)
        assert payload["metadata"]["step"] == 2
        assert payload["blobs"]["raw"] == "<bytes, 2 bytes>"
        for event in events:
            never_base64(json.dumps(readable_payload(event)))

    def test_the_viewer_rows_and_panels_read_as_the_cli(self, thread: tuple[str, Any]) -> None:
        """The event list's summaries are the CLI's, and the stack and results show values."""
        url, run_id = thread
        with Engine(url) as engine:
            data = pages.read_run(engine, run_id)
            rows = [pages.event_row(event, 0.0) for event in engine.events(run_id)]
            view = snapshot.at_version(engine, run_id, data.last_version, data.last_version)
        checkpoints = [row for row in rows if row.kind == "CheckpointSaved"]
        assert checkpoints[1].summary.endswith("step 0 (loop)")
        (writes,) = [row for row in rows if row.kind == "WritesSaved"]
        assert writes.summary.startswith("__start__: question=")
        for row in rows:
            never_base64(row.payload)
        frames = {frame["stage"]: frame for frame in view["stack"]["frames"]}
        assert frames["think"]["result"]["raw"] == "<bytes, 2 bytes>"
        latest = {row["stage"]: row["latest"] for row in view["results"]}
        assert latest["fetch"]["notes"][1] == {"__type__": f"{__name__}.Source", "url": "https://x"}
        never_base64(json.dumps(view))

    def test_show_state_and_replay_print_values(self, thread: tuple[str, Any]) -> None:
        """The command line prints what nodes wrote, decoded, in show, state and replay."""
        url, run_id = thread
        shown = stagetrail("show", str(run_id)[:8], "--store", url).stdout
        assert "WritesSaved" in shown
        assert '__start__: question="why?"' in shown
        assert any("think" in line and "wrote notes=" in line for line in shown.splitlines())
        state = stagetrail("state", str(run_id)[:8], "--store", url).stdout
        assert '"__type__": "datetime.datetime"' in state  # the stack's newest frame: think's
        replay = stagetrail("replay", str(run_id)[:8], "--store", url).stdout
        assert "wrote notes=" in replay
        for text in (shown, state, replay):
            never_base64(text)
