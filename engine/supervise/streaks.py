"""The failures a retry budget counts: by stage, by kind, and undone by rollbacks.

A failure is of one of four kinds: it was `Interrupted` (recorded by `resume`
for an attempt a crash cut short) or not, and the table routed it to another
state or not. A `RetryPolicy` says which kinds its budget counts, whether a
failure a rollback took off the stack still counts, and whether the budget is
the stage's (failures since its last completion) or the run's. `RetryStreaks`
keeps the counts for every combination at once, one event at a time.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from engine.pipeline import Pipeline
from events import INTERRUPTED, Event, StageCompleted, StageFailed, StateRolledBack

Kind = tuple[bool, bool]
"""A failure's kind: (interrupted, routed)."""

Reset = tuple["Counter[Kind] | None", "Counter[Kind] | None"]
"""A stage's (live, rolled-back) counts a completion reset: None where there were none."""

_NOTHING: Reset = (None, None)


class BudgetRules(Protocol):
    """What a retry budget counts (a `RetryPolicy` has these)."""

    @property
    def budget(self) -> str:
        """``"stage"`` or ``"run"``."""

    @property
    def count_routed(self) -> bool:
        """Whether a failure the table routed to another state counts."""

    @property
    def count_interrupted(self) -> bool:
        """Whether an attempt a crash cut short counts."""

    @property
    def forget_rolled_back(self) -> bool:
        """Whether a failure a rollback took off the stack stops counting."""


def routes_elsewhere(pipeline: Pipeline, stage: str, outcome: str) -> bool:
    """Whether the table sends a failure of `stage` with `outcome` to another state."""
    return pipeline.next_state(stage, outcome) != stage


def counts(kind: Kind, rules: BudgetRules) -> bool:
    """Whether a failure of `kind` spends the budget under `rules`."""
    interrupted, routed = kind
    return (rules.count_interrupted or not interrupted) and (rules.count_routed or not routed)


_NO_FAILURES: Counter[Kind] = Counter()
"""The counts of a stage that has none (never written to)."""


class RetryStreaks:
    """Per stage and for the run: live and rolled-back failures by kind.

    A stage's live failures are those since its last completion still on the
    stack; a rollback moves the failures it pops to the rolled-back counts and
    brings back the counts a popped completion had reset.
    """

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.live: dict[str, Counter[Kind]] = {}
        self.rolled_back: dict[str, Counter[Kind]] = {}
        self.run_live: Counter[Kind] = Counter()
        self.run_rolled_back: Counter[Kind] = Counter()
        # One entry per outcome on the stack: (stage, kind of a failure, or the counts a
        # completion reset, the outcome's version), so a rollback can undo exactly what
        # the outcome did.
        self.stack: list[tuple[str, Kind | None, Reset, int]] = []
        self.popped_failures: set[int] = set()
        """The versions of the failures rollbacks took off the stack."""

    def see(self, event: Event) -> None:
        """Fold one event of the run."""
        kind = type(event)  # every event of a supervised run passes here: no isinstance chain
        if kind is StageCompleted:
            stage = event.stage  # type: ignore[attr-defined]
            reset = (self.live.pop(stage, None), self.rolled_back.pop(stage, None))
            entry = (stage, None, _NOTHING if reset == _NOTHING else reset, event.version)
            self.stack.append(entry)
        elif kind is StageFailed:
            self.failed(event.stage, self.kind(event), event.version)  # type: ignore[attr-defined,arg-type]
        elif kind is StateRolledBack:
            for _ in range(min(event.steps, len(self.stack))):  # type: ignore[attr-defined]
                self._undo(*self.stack.pop())

    def kind(self, event: StageFailed) -> Kind:
        """A recorded failure's kind."""
        routed = routes_elsewhere(self.pipeline, event.stage, event.outcome)
        return event.error_type == INTERRUPTED, routed

    def failed(self, stage: str, kind: Kind, version: int) -> None:
        """Count a failure of `stage` (recorded at `version`)."""
        live = self.live.get(stage)
        if live is None:
            live = self.live[stage] = Counter()
        live[kind] += 1
        self.run_live[kind] += 1
        self.stack.append((stage, kind, _NOTHING, version))

    def count(self, stage: str, rules: BudgetRules) -> int:
        """The failures the budget of `rules` counts for the next attempt of `stage`."""
        if rules.budget == "run":
            live, rolled_back = self.run_live, self.run_rolled_back
        else:  # read only: the shared empty counter stands for a stage without failures
            live = self.live.get(stage, _NO_FAILURES)
            rolled_back = self.rolled_back.get(stage, _NO_FAILURES)
        total = sum(n for kind, n in live.items() if counts(kind, rules))
        if not rules.forget_rolled_back:
            total += sum(n for kind, n in rolled_back.items() if counts(kind, rules))
        return total

    def _undo(self, stage: str, kind: Kind | None, reset: Reset, version: int) -> None:
        if kind is None:  # a completion: the stage's counts before it are back
            live, rolled_back = reset
            self.live[stage] = live if live is not None else Counter()
            # Failures after the completion were undone first: they join the ones before it.
            later = self.rolled_back.get(stage, Counter())
            self.rolled_back[stage] = (rolled_back or Counter()) + later
            return
        self.popped_failures.add(version)
        self.live[stage][kind] -= 1
        self.rolled_back.setdefault(stage, Counter())[kind] += 1
        self.run_live[kind] -= 1
        self.run_rolled_back[kind] += 1
