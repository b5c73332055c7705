"""Random sequences of outcomes against an independent model of the review table."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Engine, StagetrailError
from events import Event
from tests._helpers import EXPECTED, REVIEW

FINAL = {"done", "aborted"}

actions = st.lists(
    st.one_of(
        st.tuples(st.just("outcome"), st.sampled_from(["completed", "failed", "aborted", "oops"])),
        st.tuples(st.just("start"), st.just("")),
        st.tuples(st.just("rollback"), st.sampled_from(["1", "2", "3"])),
        st.tuples(st.just("finish"), st.just("")),
    ),
    max_size=25,
)


class Model:
    """The rules restated naively: a list stack, a flag for the open attempt."""

    def __init__(self) -> None:
        self.state = REVIEW.initial
        self.stack: list[str] = []
        self.open = False
        self.finished = False

    def accepts(self, kind: str, arg: str) -> bool:
        if self.finished:
            return False
        if kind == "outcome":
            return (self.state, arg) in EXPECTED
        if kind == "start":
            return not self.open and self.state not in FINAL
        if kind == "rollback":
            return not self.open and int(arg) <= len(self.stack)
        return True

    def apply(self, kind: str, arg: str) -> None:
        if kind == "outcome":
            self.stack.append(self.state)
            self.state, self.open = EXPECTED[(self.state, arg)], False
        elif kind == "start":
            self.open = True
        elif kind == "rollback":
            for _ in range(int(arg)):
                self.state = self.stack.pop()
        else:
            self.finished = True


def act(run: object, kind: str, arg: str) -> Event:
    state = run.state  # type: ignore[attr-defined]
    if kind == "outcome" and arg == "failed":
        return run.stage_failed(state, "x")  # type: ignore[attr-defined,no-any-return]
    if kind == "outcome":
        return run.stage_completed(state, outcome=arg)  # type: ignore[attr-defined,no-any-return]
    if kind == "start":
        return run.stage_started(state)  # type: ignore[attr-defined,no-any-return]
    if kind == "rollback":
        return run.rollback(int(arg))  # type: ignore[attr-defined,no-any-return]
    return run.finish("failed")  # type: ignore[attr-defined,no-any-return]


class TestRandomHistories:
    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(steps=actions)
    def test_store_holds_exactly_the_legal_events(
        self, engine: Engine, steps: list[tuple[str, str]]
    ) -> None:
        """Legal steps are stored in order, illegal ones refused; load rebuilds the same state."""
        run = engine.start_run(REVIEW)
        model, accepted = Model(), [engine.events(run.id)[0]]
        for kind, arg in steps:
            legal = model.accepts(kind, arg)
            if legal:
                accepted.append(act(run, kind, arg))
                model.apply(kind, arg)
            else:
                with pytest.raises(StagetrailError):
                    act(run, kind, arg)
            assert run.state == model.state
        assert engine.events(run.id) == accepted
        loaded = engine.load(run.id)
        assert (loaded.state, loaded.machine.depth, loaded.machine) == (
            model.state,
            len(model.stack),
            run.machine,
        )
