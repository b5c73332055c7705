"""Events about tasks: units of work inside a run, in a hierarchy."""

from __future__ import annotations

import attrs

from events import _validation as fields
from events._strict_json import JSON
from events.base import Event


@attrs.frozen(kw_only=True)
class TaskAdded(Event):
    """A task was added, optionally under a parent task."""

    task_id: str = fields.name()
    parent_id: str | None = fields.optional_name()
    title: str = fields.text(default="")


@attrs.frozen(kw_only=True)
class TaskStarted(Event):
    """Work on a task began."""

    task_id: str = fields.name()


@attrs.frozen(kw_only=True)
class TaskCompleted(Event):
    """A task was done, with a result."""

    task_id: str = fields.name()
    result: JSON = fields.json_value()


@attrs.frozen(kw_only=True)
class TaskFailed(Event):
    """A task failed; it may be started again."""

    task_id: str = fields.name()
    error: str = fields.text(default="")
    error_type: str = fields.name(default="Error")
