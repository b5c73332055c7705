"""The failures a retry budget counts: by stage, by kind, and undone by rollbacks.

A failure is of one of four kinds: it was `Interrupted` (recorded by `resume`
for an attempt a crash cut short) or not, and the table routed it to another
state or not. A `RetryPolicy` says which kinds its budget counts, whether a
failure a rollback took off the stack still counts, and whether the budget is
the stage's (failures since its last completion) or the run's. `RetryStreaks`
folds the counts for every combination at once, one event at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import attrs

from engine.pipeline import Pipeline
from events import INTERRUPTED, StageCompleted, StageFailed, StateRolledBack
from projections import Projection, on
from projections.immutable import PList

Kind = tuple[bool, bool]
"""A failure's kind: (interrupted, routed)."""

Counts = tuple[int, int, int, int]
"""Failures by kind, indexed by `_index(kind)`."""

KINDS: tuple[Kind, ...] = ((False, False), (False, True), (True, False), (True, True))
"""Every kind, in the order `Counts` holds them."""

_ZERO: Counts = (0, 0, 0, 0)

Reset = tuple["Counts | None", "Counts | None"]
"""A stage's (live, rolled-back) counts a completion reset: None where there were none."""

Entry = tuple[str, "Kind | None", Reset, int]
"""An outcome on the stack: its stage, a failure's kind (None: a completion), what a
completion reset, and its version."""

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


@attrs.frozen
class Streaks:
    """Per stage and for the run: live and rolled-back failures by kind, and the outcome stack.

    A stage's live failures are those since its last completion still on the
    stack; a rollback moves the failures it pops to the rolled-back counts and
    brings back the counts a popped completion had reset.
    """

    live: Mapping[str, Counts] = attrs.field(factory=dict)
    rolled_back: Mapping[str, Counts] = attrs.field(factory=dict)
    run_live: Counts = _ZERO
    run_rolled_back: Counts = _ZERO
    stack: PList[Entry] = attrs.field(factory=PList)

    def count(self, stage: str, rules: BudgetRules) -> int:
        """The failures the budget of `rules` counts for the next attempt of `stage`."""
        if rules.budget == "run":
            live, rolled_back = self.run_live, self.run_rolled_back
        else:
            live = self.live.get(stage, _ZERO)
            rolled_back = self.rolled_back.get(stage, _ZERO)
        if live is _ZERO and rolled_back is _ZERO:
            return 0  # the common case: no failure since the stage's last completion
        total = sum(n for kind, n in zip(KINDS, live, strict=True) if counts(kind, rules))
        if not rules.forget_rolled_back:
            total += sum(
                n for kind, n in zip(KINDS, rolled_back, strict=True) if counts(kind, rules)
            )
        return total

    def completed(self, stage: str, version: int) -> Streaks:
        """The streaks after a completion of `stage`: its counts start again."""
        live, rolled_back = self.live, self.rolled_back
        reset = (live.get(stage), rolled_back.get(stage))
        if reset != _NOTHING:
            live = _without(live, stage)
            rolled_back = _without(rolled_back, stage)
        entry: Entry = (stage, None, _NOTHING if reset == _NOTHING else reset, version)
        return Streaks(
            live, rolled_back, self.run_live, self.run_rolled_back, self.stack.push(entry)
        )

    def passed(self, version: int) -> Streaks:
        """The streaks after an outcome that counts nothing (a routed verdict), on the stack."""
        entry: Entry = ("", None, _NOTHING, version)
        return attrs.evolve(self, stack=self.stack.push(entry))

    def failed(self, stage: str, kind: Kind, version: int) -> Streaks:
        """The streaks after a failure of `stage` of `kind` (recorded at `version`)."""
        index = _index(kind)
        live = {**self.live, stage: _add(self.live.get(stage, _ZERO), index, 1)}
        entry: Entry = (stage, kind, _NOTHING, version)
        return Streaks(
            live,
            self.rolled_back,
            _add(self.run_live, index, 1),
            self.run_rolled_back,
            self.stack.push(entry),
        )

    def rolled(self, steps: int) -> Streaks:
        """The streaks after a rollback of `steps` outcomes."""
        state = self
        for _ in range(min(steps, len(self.stack))):
            entry = state.stack.last
            assert entry is not None
            state = attrs.evolve(state, stack=state.stack.pop())._undo(*entry)
        return state

    def _undo(self, stage: str, kind: Kind | None, reset: Reset, version: int) -> Streaks:
        if not stage:  # an outcome that counted nothing
            return self
        if kind is None:  # a completion: the stage's counts before it are back
            live, rolled_back = reset
            # Failures after the completion were undone first: they join the ones before it.
            later = self.rolled_back.get(stage, _ZERO)
            joined = _sum(rolled_back or _ZERO, later)
            return attrs.evolve(
                self,
                live={**self.live, stage: live or _ZERO},
                rolled_back={**self.rolled_back, stage: joined},
            )
        index = _index(kind)
        return attrs.evolve(
            self,
            live={**self.live, stage: _add(self.live.get(stage, _ZERO), index, -1)},
            rolled_back={
                **self.rolled_back,
                stage: _add(self.rolled_back.get(stage, _ZERO), index, 1),
            },
            run_live=_add(self.run_live, index, -1),
            run_rolled_back=_add(self.run_rolled_back, index, 1),
        )


class RetryStreaks(Projection[Streaks]):
    """The failures retry budgets count in one run (the table says which were routed)."""

    scope = "run"

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def initial(self) -> Streaks:
        """No failures, nothing on the stack."""
        return Streaks()

    @on(StageCompleted)
    def completed(self, state: Streaks, event: StageCompleted) -> Streaks:
        """A completion resets its stage's counts (kept on the stack for a rollback).

        A routed verdict (attempt 0) resets nothing, but takes its place on the stack.
        """
        if not event.attempt:
            return state.passed(event.version)
        return state.completed(event.stage, event.version)

    @on(StageFailed)
    def failed(self, state: Streaks, event: StageFailed) -> Streaks:
        """Count the failure by its kind."""
        return state.failed(event.stage, self.kind(event), event.version)

    @on(StateRolledBack)
    def rolled_back(self, state: Streaks, event: StateRolledBack) -> Streaks:
        """Undo the popped outcomes: their failures move to the rolled-back counts."""
        return state.rolled(event.steps)

    def kind(self, event: StageFailed) -> Kind:
        """A recorded failure's kind."""
        routed = routes_elsewhere(self.pipeline, event.stage, event.outcome)
        return event.error_type == INTERRUPTED, routed


def _index(kind: Kind) -> int:
    interrupted, routed = kind
    return 2 * interrupted + routed


def _add(counted: Counts, index: int, amount: int) -> Counts:
    values = list(counted)
    values[index] += amount
    return (values[0], values[1], values[2], values[3])


def _sum(first: Counts, second: Counts) -> Counts:
    return (first[0] + second[0], first[1] + second[1], first[2] + second[2], first[3] + second[3])


def _without(counted: Mapping[str, Counts], stage: str) -> Mapping[str, Counts]:
    return {key: value for key, value in counted.items() if key != stage}
