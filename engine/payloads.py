"""Payloads for people: the values another framework serialised into events, made readable.

A LangGraph thread's events hold what its nodes wrote and the channels of each
checkpoint as the framework's serializer wrote them: ``[type, data]`` pairs
(plain JSON kept as JSON, the rest base64). `readable_value` turns one into a
value a person can read: JSON-like values as themselves, anything else as a
typed summary (``"<bytes, 12 bytes>"``, ``{"__type__": "pkg.Model", ...}``),
never base64. A type a framework defines is read by the reader its integration
registers under the ``stagetrail.value_readers`` entry point group (the name is
the type tag, the value a function of the bytes), so the command line, the
viewer and the report read it the same way without importing the integration.
`summary` is the one-line description of such an event; `readable_payload` the
event's fields with every stored value decoded. Pure but for loading readers.
"""

from __future__ import annotations

import base64
import binascii
import functools
import itertools
import json
from collections.abc import Callable, Iterable
from typing import Any

from events import CheckpointSaved, Event, StageCompleted, StageFailed, WritesSaved, encode
from events import task_writes as carried_writes

READERS_GROUP = "stagetrail.value_readers"
"""The entry point group of value readers: name = the serializer's type tag."""
AS_JSON = "~msgpack"
"""The tag of a value stored as its plain JSON (see the LangGraph saver)."""
REFERENCE = "="
"""The tag of a value stored as a reference to an identical one earlier in the run."""
NODE_TASK = "~__pregel_pull, "
"""The start of the task path LangGraph gives a node's task."""

ValueReader = Callable[[bytes], Any]
"""Reads a serialised value's bytes into a JSON-like value (or raises)."""


@functools.cache
def _reader(kind: str) -> ValueReader | None:
    """The registered reader of values tagged `kind`, if an installed package has one.

    `importlib.metadata` is imported here, not with the module: it costs more than
    `stagetrail show` itself, which needs it only for a run holding such values.
    """
    from importlib.metadata import entry_points

    for point in entry_points(group=READERS_GROUP, name=kind):
        try:
            reader: ValueReader = point.load()
        except ImportError:  # its package's extra is not installed
            continue
        return reader
    return None


def readable_value(kind: str, data: Any) -> Any:
    """A stored ``[type, data]`` value as a person reads it: the value, or a typed summary."""
    if kind == AS_JSON:
        return data
    if kind == REFERENCE:
        return f"<same value as stored at {data}>"
    if kind in ("empty", "null"):
        return None
    try:
        raw = base64.b64decode(data, validate=True) if isinstance(data, str) else b""
    except (binascii.Error, ValueError):
        return f"<{kind}, unreadable>"
    if kind == "json":
        try:
            return json.loads(raw)
        except ValueError:
            pass
    reader = _reader(kind)
    if reader is not None:
        try:
            return reader(raw)
        except Exception:  # a value its reader cannot read is summarised, not fatal
            pass
    return f"<{kind}, {len(raw)} bytes>"


def readable_writes(writes: Any) -> dict[str, Any]:
    """A task's stored writes (``[index, channel, type, data]``) as channel → value.

    A channel one task wrote more than once shows the list of its values, in order.
    """
    shown: dict[str, list[Any]] = {}
    for write in writes if isinstance(writes, list) else []:
        if isinstance(write, list) and len(write) == 4:
            _, channel, kind, data = write
            shown.setdefault(str(channel), []).append(readable_value(str(kind), data))
    return {channel: values[0] if len(values) == 1 else values for channel, values in shown.items()}


def readable_result(value: Any) -> Any:
    """A stage's result (or failure details) readable: a graph node's writes decoded."""
    carried = carried_writes(value)
    if carried is None:
        return value
    return readable_writes(carried["writes"])


def _blobs(blobs: Any) -> dict[str, Any]:
    """A checkpoint's changed channels as channel → value."""
    if not isinstance(blobs, dict):
        return {}
    return {
        str(channel): readable_value(str(blob[-2]), blob[-1])
        for channel, blob in blobs.items()
        if isinstance(blob, list) and len(blob) >= 2
    }


def _metadata(metadata: Any) -> Any:
    if isinstance(metadata, dict) and "json" in metadata:
        return metadata["json"]
    if isinstance(metadata, list) and len(metadata) == 2:
        return readable_value(str(metadata[0]), metadata[1])
    return metadata


def readable_payload(event: Event) -> dict[str, Any]:
    """The event's fields as JSON, with every value a framework serialised decoded."""
    _, state = encode(event)
    state.pop("class_version", None)
    if isinstance(event, CheckpointSaved):
        state["blobs"] = _blobs(event.blobs)
        state["metadata"] = _metadata(event.metadata)
    elif isinstance(event, WritesSaved):
        state["writes"] = readable_writes(event.writes)
    elif isinstance(event, StageCompleted):
        state["result"] = readable_result(event.result)
    elif isinstance(event, StageFailed):
        state["details"] = readable_result(event.details)
    return state


def summary(event: Event) -> str | None:
    """The one-line summary of a checkpoint, a task's writes or a node's outcome; else None.

    ``checkpoint 9a2bf51a34a1, step 1 (loop)``; ``__start__: question="why?",
    branch:to:fetch``; ``wrote notes=["a", "b"]`` for a graph node's outcome (a
    channel written with no value, LangGraph's routing, by its name alone).
    """
    if isinstance(event, CheckpointSaved):
        return _checkpoint(event)
    if isinstance(event, WritesSaved):
        task = event.task_path.removeprefix(NODE_TASK) or event.task_id
        return f"{task}: {writes_line(event.writes)}"
    result = event.result if isinstance(event, StageCompleted) else None
    details = event.details if isinstance(event, StageFailed) else None
    carried = carried_writes(result if result is not None else details)
    if carried is None:
        return None
    return f"wrote {writes_line(carried['writes'])}"


def writes_line(writes: Any) -> str:
    """A task's writes on one line: ``channel=value`` (JSON), a valueless channel by name."""
    parts = []
    for channel, value in readable_writes(writes).items():
        if value is None:
            parts.append(channel)
        else:
            parts.append(f"{channel}={json.dumps(value, ensure_ascii=False, default=str)}")
    return ", ".join(parts)


def _checkpoint(event: CheckpointSaved) -> str:
    """The checkpoint's step and source when its metadata is JSON, then its namespace."""
    metadata = event.metadata.get("json") if isinstance(event.metadata, dict) else None
    parts = [f"checkpoint {event.checkpoint_id[-12:]}"]
    if isinstance(metadata, dict) and "step" in metadata:
        parts.append(f"step {metadata['step']} ({metadata.get('source', '?')})")
    if event.namespace:
        parts.append(f"in {event.namespace}")
    return ", ".join(parts)


BRANCH = "branch:to:"
"""The start of the channel a LangGraph node writes to send the graph to the next node."""
OBSERVED_EVENTS = 10_000
"""The events a picture of the transitions observed is drawn from, at most (the first)."""


def observed_graph(events: Iterable[Event]) -> dict[str, Any] | None:
    """The edges a framework graph's run took, from what its tasks wrote: a node's writes to
    ``branch:to:<node>`` are an edge to that node; a node that sent to none ended the graph.

    In the form of `engine.diagram.GRAPH_PARAM`; None for a run with no such writes.
    """
    edges: dict[tuple[str, str], None] = {}
    for event in itertools.islice(events, OBSERVED_EVENTS):
        source, writes = _task_of(event)
        if source is None:
            continue
        targets = [
            str(write[1]).removeprefix(BRANCH)
            for write in writes
            if isinstance(write, list) and len(write) > 1 and str(write[1]).startswith(BRANCH)
        ]
        if not targets and isinstance(event, StageCompleted):
            targets = ["__end__"]
        for target in targets:
            edges[(source, target)] = None
    if not edges:
        return None
    return {"edges": [[source, target] for source, target in edges]}


def _task_of(event: Event) -> tuple[str | None, Any]:
    """The node whose writes `event` holds (the input's ``__start__`` too), and the writes."""
    if isinstance(event, WritesSaved) and event.task_path == NODE_TASK + "__start__":
        return "__start__", event.writes
    if isinstance(event, StageCompleted) and not event.stage.startswith("__"):
        carried = carried_writes(event.result)
        if carried is not None:
            return event.stage, carried["writes"]
    return None, []
