"""Retention rules: which finished runs a store may forget (`Engine.retain`).

A rule names finished runs by status, pipeline, labels and age (time since they
finished); every criterion given must hold. Several rules are alternatives: a
run goes when any rule chooses it, and its deletion records the first one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import attrs

from engine.errors import InvalidArgument
from events import JSON, RUN_STATUSES
from projections.run_index import RunSummary

RETAINABLE = frozenset(RUN_STATUSES - {"deleted"})
"""The statuses a rule may name: any a run finishes with, but ``deleted``."""

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE = re.compile(r"^(\d+)([smhdw])$")


def _statuses(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


def _labels(value: Mapping[str, str]) -> dict[str, str]:
    return dict(value)


@attrs.frozen
class RetentionRule:
    """Finished runs to delete: by `status`, `pipeline`, `labels`, finished `older_than` ago."""

    status: frozenset[str] = attrs.field(default=frozenset(), converter=_statuses)
    pipeline: str | None = None
    labels: Mapping[str, str] = attrs.field(factory=dict, converter=_labels)
    older_than: timedelta | None = None

    def __attrs_post_init__(self) -> None:
        unknown = sorted(self.status - RETAINABLE)
        if unknown:
            allowed = ", ".join(sorted(RETAINABLE))
            raise InvalidArgument("status", f"unknown status {unknown[0]!r}; one of {allowed}")
        if self.older_than is not None and self.older_than < timedelta(0):
            raise InvalidArgument("older_than", "the age must not be negative")
        if not (self.status or self.pipeline or self.labels or self.older_than is not None):
            raise InvalidArgument("rule", "a rule needs a status, pipeline, label or age")

    def matches(self, summary: RunSummary, now: datetime) -> bool:
        """Whether this rule chooses the run (only finished, not yet deleted runs qualify)."""
        if summary.finished is None or summary.status not in RETAINABLE:
            return False
        if self.status and summary.status not in self.status:
            return False
        if self.pipeline is not None and summary.pipeline != self.pipeline:
            return False
        if any(summary.labels.get(key) != value for key, value in self.labels.items()):
            return False
        return self.older_than is None or summary.finished <= now - self.older_than

    def to_json(self) -> JSON:
        """The rule as data: what a `RunDeleted` records and ``--json`` prints."""
        return {
            "status": sorted(self.status),
            "pipeline": self.pipeline,
            "labels": dict(sorted(self.labels.items())),
            "older_than": None if self.older_than is None else self.older_than.total_seconds(),
        }

    def __str__(self) -> str:
        parts = [f"status={'|'.join(sorted(self.status))}"] if self.status else []
        parts += [f"pipeline={self.pipeline}"] if self.pipeline is not None else []
        parts += [f"label={key}:{value}" for key, value in sorted(self.labels.items())]
        if self.older_than is not None:
            parts.append(f"age={_age_text(self.older_than)}")
        return ",".join(parts)


@attrs.frozen
class Doomed:
    """One run a retention plan deletes, and the rule that chose it."""

    summary: RunSummary
    rule: RetentionRule

    @property
    def run_id(self) -> UUID:
        """The run's id."""
        return self.summary.run_id


def parse_rule(text: str) -> RetentionRule:
    """A rule from ``status=succeeded|failed,pipeline=P,label=k:v,age=30d``.

    Raises:
        InvalidArgument: a part is not ``key=value`` with a known key and a valid value.
    """
    fields: dict[str, Any] = {"status": set(), "labels": {}}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not value:
            raise InvalidArgument("rule", f"{part!r} is not key=value")
        _parse_part(fields, key.strip(), value.strip())
    return RetentionRule(**fields)


def _parse_part(fields: dict[str, Any], key: str, value: str) -> None:
    if key == "status":
        fields["status"] |= set(value.split("|"))
    elif key == "pipeline":
        fields["pipeline"] = value
    elif key == "label":
        name, sep, label = value.partition(":")
        if not sep or not name:
            raise InvalidArgument("rule", f"label {value!r} is not key:value")
        fields["labels"][name] = label
    elif key == "age":
        fields["older_than"] = parse_age(value)
    else:
        raise InvalidArgument("rule", f"unknown key {key!r}; one of status, pipeline, label, age")


def parse_age(text: str) -> timedelta:
    """``90s``, ``30m``, ``12h``, ``30d``, ``2w`` as a duration.

    Raises:
        InvalidArgument: not a whole number followed by s, m, h, d or w.
    """
    found = _AGE.match(text)
    if found is None:
        raise InvalidArgument("age", f"{text!r} is not a number and a unit (s, m, h, d, w)")
    return timedelta(seconds=int(found.group(1)) * _UNITS[found.group(2)])


def _age_text(age: timedelta) -> str:
    seconds = int(age.total_seconds())
    for unit in ("w", "d", "h", "m"):
        if seconds and seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


def choose(
    rules: Iterable[RetentionRule],
    summaries: Iterable[RunSummary],
    now: datetime,
    stored: Callable[[UUID], bool],
) -> list[Doomed]:
    """The runs some rule chooses, oldest first; a child run only with its parent.

    A run whose parent stays (`stored` and not chosen) is kept, so the tree of a kept
    run stays whole.
    """
    rules = list(rules)
    chosen: dict[UUID, Doomed] = {}
    for summary in summaries:
        rule = next((r for r in rules if r.matches(summary, now)), None)
        if rule is not None:
            chosen.setdefault(summary.run_id, Doomed(summary, rule))
    changed = True
    while changed:  # drop children of kept runs, then their children...
        orphans = [
            run_id
            for run_id, doomed in chosen.items()
            if doomed.summary.parent_run_id is not None
            and doomed.summary.parent_run_id not in chosen
            and stored(doomed.summary.parent_run_id)
        ]
        for run_id in orphans:
            del chosen[run_id]
        changed = bool(orphans)
    return sorted(chosen.values(), key=lambda d: (d.summary.started, str(d.run_id)))
