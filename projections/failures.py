"""Failure patterns: failures by stage and error type, streaks, and repeated errors.

Persistent use keeps one state per pipeline, so the patterns span runs. Error
signatures live in hash-trie maps: a failure costs the same however many
distinct errors came before it.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from events import JSON, StageCompleted, StageFailed
from events.values import evolve
from projections.base import Projection, on
from projections.immutable import PMap

Signature = tuple[str, str, str]
"""A failure's identity: (stage, error_type, error)."""

RECENT = 5
"""How many of the newest failures `Failures.recent` keeps."""


@attrs.frozen
class Failures:
    """How often, where and how stages failed."""

    by_stage: Mapping[str, int] = attrs.field(factory=dict)
    by_error_type: Mapping[str, int] = attrs.field(factory=dict)
    streaks: Mapping[str, int] = attrs.field(factory=dict)
    signatures: PMap[Signature, int] = attrs.field(factory=PMap)
    repeats: PMap[Signature, int] = attrs.field(factory=PMap)
    total: int = 0
    recent: tuple[Signature, ...] = ()
    """The newest failures (at most `RECENT`), newest last."""

    def consecutive(self, stage: str) -> int:
        """The failures of `stage` since its last completion."""
        return self.streaks.get(stage, 0)

    @property
    def repeated_signatures(self) -> dict[Signature, int]:
        """Each (stage, error_type, error) seen more than once → how often it was seen."""
        return dict(self.repeats)

    def last(self, stage: str) -> tuple[str, str] | None:
        """The (error_type, error) of the newest failure of `stage` among the recent ones."""
        for failed_stage, error_type, error in reversed(self.recent):
            if failed_stage == stage:
                return error_type, error
        return None

    def count(self, stage: str, error_type: str, error: str) -> int:
        """How often this exact failure was seen."""
        return self.signatures.get((stage, error_type, error), 0)

    def failed(self, signature: Signature) -> Failures:
        """The patterns after one more failure with `signature`."""
        stage, error_type, _ = signature
        seen = self.signatures.get(signature, 0) + 1
        return Failures(
            by_stage=_bump(self.by_stage, stage),
            by_error_type=_bump(self.by_error_type, error_type),
            streaks=_bump(self.streaks, stage),
            signatures=self.signatures.set(signature, seen),
            repeats=self.repeats.set(signature, seen) if seen > 1 else self.repeats,
            total=self.total + 1,
            recent=(*self.recent[1 - RECENT :], signature),
        )


def _bump(counts: Mapping[str, int], key: str) -> dict[str, int]:
    return {**counts, key: counts.get(key, 0) + 1}


class FailurePatterns(Projection[Failures]):
    """Failures by stage and error type, streaks per stage, repeated signatures."""

    scope = "pipeline"

    def initial(self) -> Failures:
        """No failures yet."""
        return Failures()

    @on(StageFailed)
    def failed(self, state: Failures, event: StageFailed) -> Failures:
        """Count the failure everywhere it belongs."""
        return state.failed((event.stage, event.error_type, event.error))

    @on(StageCompleted)
    def completed(self, state: Failures, event: StageCompleted) -> Failures:
        """End the stage's streak of failures (a routed verdict does not: the stage did not run)."""
        if not event.attempt or not state.streaks.get(event.stage):
            return state
        return evolve(state, streaks={**state.streaks, event.stage: 0})

    def encode(self, state: Failures) -> JSON:
        """The counters as JSON; signatures as `[stage, error_type, error, count]` rows."""
        return {
            "by_stage": dict(state.by_stage),
            "by_error_type": dict(state.by_error_type),
            "streaks": dict(state.streaks),
            "signatures": [[*signature, seen] for signature, seen in state.signatures.items()],
            "total": state.total,
            "recent": [list(signature) for signature in state.recent],
        }

    def decode(self, data: JSON) -> Failures:
        """The patterns `encode` turned into `data`."""
        counts = {(stage, kind, error): seen for stage, kind, error, seen in data["signatures"]}
        return Failures(
            by_stage=data["by_stage"],
            by_error_type=data["by_error_type"],
            streaks=data["streaks"],
            signatures=PMap(counts),
            repeats=PMap({key: seen for key, seen in counts.items() if seen > 1}),
            total=data["total"],
            recent=tuple((stage, kind, error) for stage, kind, error in data.get("recent", ())),
        )
