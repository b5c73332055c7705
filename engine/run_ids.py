"""Run ids as users type them: a full UUID, or a unique prefix of one.

Shared by the command line and the viewer, so ``stagetrail show b61e`` and
``/runs/b61e`` name the same run or fail the same way.
"""

from __future__ import annotations

import re
from typing import Any, Protocol
from uuid import UUID

from engine.errors import AmbiguousRunId, RunNotFound

_HEX = re.compile(r"[0-9a-f]{1,32}")


class Finder(Protocol):
    """What resolving needs of an engine: its store's newest event and the run index's ids."""

    @property
    def url(self) -> str:
        """The store's URL (passwords masked)."""

    @property
    def store(self) -> Any:
        """The event store."""

    @property
    def projections(self) -> Any:
        """The persistent projections (the run index's ids)."""


def resolve_run(engine: Finder, text: str) -> UUID:
    """The run a full id or a unique id prefix names.

    Raises:
        RunNotFound: nothing matches.
        AmbiguousRunId: several runs match.
    """
    cleaned = text.strip().lower()
    digits = cleaned.replace("-", "")
    if not _HEX.fullmatch(digits):
        raise RunNotFound(text, engine.url)
    if len(digits) == 32:
        run_id = UUID(digits)
        if engine.store.last(run_id) is None:
            raise RunNotFound(run_id, engine.url)
        return run_id
    matches: list[UUID] = engine.projections.run_ids(_hyphenated(digits), limit=4)
    if not matches:
        raise RunNotFound(text, engine.url)
    if len(matches) > 1:
        raise AmbiguousRunId(text, matches)
    return matches[0]


def _hyphenated(digits: str) -> str:
    """A prefix of hex digits written as the same prefix of a hyphenated UUID."""
    parts, start = [], 0
    for end in (8, 12, 16, 20, 32):
        if len(digits) > start:
            parts.append(digits[start:end])
        start = end
    return "-".join(parts)
