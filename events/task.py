"""Events about tasks: units of work inside a run, in a hierarchy."""

from __future__ import annotations

import attrs

from events import _fields
from events._json import JSON
from events.base import Event


@attrs.frozen(slots=False, kw_only=True)
class TaskAdded(Event):
    """A task was added, optionally under a parent task."""

    task_id: str = _fields.name()
    parent_id: str | None = _fields.optional_name()
    title: str = _fields.text(default="")


@attrs.frozen(slots=False, kw_only=True)
class TaskStarted(Event):
    """Work on a task began."""

    task_id: str = _fields.name()


@attrs.frozen(slots=False, kw_only=True)
class TaskCompleted(Event):
    """A task was done, with a result."""

    task_id: str = _fields.name()
    result: JSON = _fields.json_value()


@attrs.frozen(slots=False, kw_only=True)
class TaskFailed(Event):
    """A task failed; it may be started again."""

    task_id: str = _fields.name()
    error: str = _fields.text(default="")
    error_type: str = _fields.name(default="Error")
