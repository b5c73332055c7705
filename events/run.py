"""Events about a run as a whole: its start, finish, rollbacks, notes and budget."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar
from uuid import UUID

import attrs

from events import _validation as fields
from events._strict_json import JSON
from events.base import Event
from events.errors import InvalidEvent, InvalidPayload

RUN_STATUSES = frozenset(
    {"succeeded", "failed", "aborted_stuck", "done_partial", "cancelled", "deleted"}
)
"""The statuses a run may finish with (``deleted``: erased by its owner, gone once compacted)."""


def _labels(value: object, field: attrs.Attribute[Any]) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise InvalidPayload(field.name, field.name, f"is a {type(value).__name__}, not a dict")
    for key, label in value.items():
        if type(key) is not str or type(label) is not str:
            raise InvalidPayload(field.name, f"{field.name}[{key!r}]", "must map str to str")
    return dict(value)


def _fork_point(value: object, field: attrs.Attribute[Any]) -> tuple[UUID, int] | None:
    if value is None:
        return None
    if not (isinstance(value, tuple | list) and len(value) == 2):
        raise InvalidPayload(field.name, field.name, "must be a (run_id, version) pair")
    origin, version = value
    if not isinstance(origin, UUID) or type(version) is not int:
        raise InvalidPayload(field.name, field.name, "must be a (UUID, int) pair")
    if version < 1:
        raise InvalidEvent(field.name, f"fork version must be at least 1, got {version}")
    return (origin, version)


def _encode_fork(value: tuple[UUID, int] | None) -> list[Any] | None:
    return None if value is None else [str(value[0]), value[1]]


def _decode_fork(value: list[Any] | None) -> tuple[UUID, int] | None:
    return None if value is None else (UUID(value[0]), value[1])


def _encode_run_id(value: UUID | None) -> str | None:
    return None if value is None else str(value)


def _decode_run_id(value: str | None) -> UUID | None:
    return None if value is None else UUID(value)


@attrs.frozen(kw_only=True)
class RunStarted(Event):
    """A run of a pipeline began; it carries the whole table so it can be replayed."""

    pipeline: str = fields.name()
    table: JSON = fields.json_value()
    params: JSON = fields.json_value(default={})
    labels: dict[str, str] = fields.checked(_labels, factory=dict)
    parent_run_id: UUID | None = fields.optional_run_id()
    forked_from: tuple[UUID, int] | None = fields.checked(_fork_point, default=None)

    class_version: ClassVar[int] = 2
    encoders: ClassVar = {"parent_run_id": _encode_run_id, "forked_from": _encode_fork}
    decoders: ClassVar = {"parent_run_id": _decode_run_id, "forked_from": _decode_fork}

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> None:
        """Version 1 (pre-release stores) had no labels and no fork lineage."""
        state["labels"] = {}
        state["forked_from"] = None


@attrs.frozen(kw_only=True)
class RunFinished(Event):
    """The run ended; nothing may follow this event."""

    status: str = fields.one_of(RUN_STATUSES)
    reason: JSON = fields.json_value(default="")


@attrs.frozen(kw_only=True)
class RunDeleted(Event):
    """The run was deleted (by a retention `rule`, or by hand); it is erased at compaction.

    Unlike ``RunFinished(status="deleted")`` it may follow `RunFinished`, so a finished
    run can be deleted; nothing may follow it.
    """

    rule: JSON = fields.json_value(default=None)
    """The retention rule that chose the run (as data), None when deleted by hand."""
    reason: str = fields.text(default="")


@attrs.frozen(kw_only=True)
class StateRolledBack(Event):
    """The newest `steps` outcomes on the state stack were undone."""

    steps: int = fields.count(minimum=1)
    reason: str = fields.text(default="")


@attrs.frozen(kw_only=True)
class NoteAdded(Event):
    """A free note: a strategy tried, a pattern learned, anything worth keeping."""

    key: str = fields.name()
    value: JSON = fields.json_value()


@attrs.frozen(kw_only=True)
class BudgetSpent(Event):
    """Some budget (money, tokens, minutes) was spent."""

    amount: float = fields.seconds()
    unit: str = fields.name()
