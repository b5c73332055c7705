"""Events that keep another framework's checkpoints in a run (LangGraph's, through its saver).

Values arrive already serialised by the framework's own serializer: each is a
``[type, base64]`` pair, so stagetrail stores exactly the bytes the framework
wrote and hands them back unchanged. No framework is imported here.
"""

from __future__ import annotations

from typing import Any

import attrs

from events import _validation as fields
from events._strict_json import JSON
from events.base import Event


@attrs.frozen(kw_only=True)
class CheckpointSaved(Event):
    """A checkpoint of one namespace of a thread: its skeleton, metadata and changed channels.

    `blobs` maps each channel whose version changed to ``[version, type, base64]``;
    the values of unchanged channels live in the earlier checkpoint that set them.
    """

    namespace: str = fields.text(default="")
    checkpoint_id: str = fields.name()
    parent_id: str | None = fields.optional_name()
    checkpoint: JSON = fields.json_value()
    metadata: JSON = fields.json_value()
    blobs: JSON = fields.json_value(default={})
    invocation: str | None = fields.optional_text()
    """The framework's own run id (LangGraph's ``metadata["run_id"]``), if any."""


@attrs.frozen(kw_only=True)
class WritesSaved(Event):
    """The pending writes one task made against a checkpoint: ``[index, channel, type, b64]``."""

    namespace: str = fields.text(default="")
    checkpoint_id: str = fields.name()
    task_id: str = fields.name()
    task_path: str = fields.text(default="")
    writes: JSON = fields.json_value(default=[])


TASK_WRITES_KEYS = frozenset({"checkpoint_id", "task_id", "task_path", "writes"})
"""The keys the writes a node's outcome carries may have (see `task_writes`)."""


def task_writes(value: JSON) -> dict[str, Any] | None:
    """The writes a node's outcome event carries, if `value` (its result or details) is them.

    A saver records the writes of a node of the graph, in the root namespace, in the
    node's own `StageCompleted` (as its `result`) or `StageFailed` (its `details`),
    not in a `WritesSaved` beside it: ``{"task_id", "writes"}`` as in `WritesSaved`,
    with ``checkpoint_id`` only when it is not the thread's newest checkpoint and
    ``task_path`` only when it is not the node's own.
    """
    if not isinstance(value, dict) or "writes" not in value or "task_id" not in value:
        return None
    return value if value.keys() <= TASK_WRITES_KEYS else None


@attrs.frozen(kw_only=True)
class CheckpointsRemoved(Event):
    """Checkpoints (and their writes) that readers must treat as gone: ``[namespace, id]`` pairs.

    The events that hold them stay until the run is deleted and compacted.
    """

    removed: JSON = fields.json_value(default=[])
    reason: str = fields.text(default="")
