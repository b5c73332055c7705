from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time

from engine import CircuitBreaker, CircuitOpen, Engine, Outcome, RetryPolicy, StageGaveUp
from engine.supervise import Circuit, CircuitStates
from events import CircuitClosed, CircuitHalfOpened, CircuitOpened, StageCompleted, StageFailed
from tests.supervise._helpers import POLL, FakeTime, failing, kinds, of_type

RUN = "00000000-0000-4000-8000-000000000001"
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def frozen() -> Iterator[Any]:
    """Event timestamps and the supervisor's clock, frozen together."""
    with freeze_time(T0, ignore=["psycopg", "psycopg_pool", "eventsourcing"]) as clock:
        yield clock


def supervise(engine: Engine, frozen: Any, **breaker: Any) -> Any:
    settings = {"fail_max": 3, "reset_timeout": 300, **breaker}
    return engine.supervisor(
        retry=RetryPolicy(max_retries=10, delay=1),
        breaker=CircuitBreaker(**settings),
        sleep=frozen.tick,
    )


def trip(engine: Engine, sup: Any, run: Any) -> CircuitOpen:
    with pytest.raises(CircuitOpen) as raised:
        sup.execute(run, "step", failing(99, ConnectionError("refused")))
    return raised.value


class TestCircuitStates:
    def _fold(self, *events: Any) -> Any:
        return CircuitStates().fold(events)

    def _event(self, kind: type, version: int, **payload: Any) -> Any:
        from uuid import UUID

        stamp = T0 + timedelta(seconds=version)
        return kind(run_id=UUID(RUN), version=version, timestamp=stamp, stage="step", **payload)

    def test_outcomes_count_streaks_and_the_window(self) -> None:
        """Failures grow the streak, a completion resets it; the window keeps both, newest last."""
        state = self._fold(
            self._event(StageFailed, 2, attempt=1),
            self._event(StageFailed, 3, attempt=2),
            self._event(StageCompleted, 4, attempt=3),
            self._event(StageFailed, 5, attempt=4),
        )
        circuit = state["step"]
        assert (circuit.status, circuit.consecutive) == ("closed", 1)
        assert circuit.recent == (True, True, False, True)
        assert circuit.failure_rate(4) == 0.75
        assert circuit.failure_rate(5) is None

    def test_decisions_move_the_status(self) -> None:
        """Opened → half-open → closed, with the opening time and reason kept while open."""
        opened = self._fold(self._event(CircuitOpened, 2, reason="3 failures"))["step"]
        assert (opened.status, opened.opened_at, opened.reason) == (
            "open", T0 + timedelta(seconds=2), "3 failures",
        )  # fmt: skip
        half = self._fold(self._event(CircuitOpened, 2), self._event(CircuitHalfOpened, 3))
        assert half["step"].status == "half_open"
        closed = self._fold(
            self._event(StageFailed, 2, attempt=1),
            self._event(CircuitOpened, 3),
            self._event(CircuitClosed, 4),
        )
        assert closed["step"] == Circuit()

    def test_encode_decode_round_trip(self) -> None:
        """A circuit survives its JSON form (persistent and snapshot use)."""
        projection = CircuitStates()
        state = self._fold(self._event(StageFailed, 2, attempt=1), self._event(CircuitOpened, 3))
        assert projection.decode(projection.encode(state)) == state

    def test_the_window_is_bounded(self) -> None:
        """A circuit remembers at most 100 recent attempts."""
        circuit = Circuit()
        for _ in range(150):
            circuit = circuit.outcome(True)
        assert len(circuit.recent) == 100
        assert circuit.consecutive == 150


class TestCircuitBreaker:
    @pytest.mark.parametrize(
        ("field", "value"),
        [("fail_max", 0), ("failure_rate", 1.5), ("failure_rate", 0), ("window", 0),
         ("window", 101), ("reset_timeout", -1), ("scope", "global")],
    )  # fmt: skip
    def test_bad_settings_are_refused_by_name(self, field: str, value: object) -> None:
        """Each bad setting raises one ValueError naming it."""
        with pytest.raises(ValueError, match=field):
            CircuitBreaker(**{field: value})  # type: ignore[arg-type]

    def test_waits_counts_down_from_the_opening(self) -> None:
        """An open circuit waits reset_timeout from its CircuitOpened; a closed one not at all."""
        breaker = CircuitBreaker(reset_timeout=60)
        circuit = Circuit(status="open", opened_at=T0)
        assert breaker.waits(circuit, T0 + timedelta(seconds=45)) == 15
        assert breaker.waits(circuit, T0 + timedelta(seconds=90)) == 0
        assert breaker.waits(Circuit(), T0) == 0

    def test_trips_on_fail_max_rate_or_a_failed_trial(self) -> None:
        """fail_max, the failure rate over the window, and a failed half-open trial each trip it."""
        breaker = CircuitBreaker(fail_max=3, failure_rate=0.5, window=4)
        assert breaker.trips(Circuit(consecutive=2, recent=(False, True, False, True))) == (
            "50% of the last 4 attempts failed (failure_rate=0.5)"
        )
        assert breaker.trips(Circuit(consecutive=3)) == "3 consecutive failures (fail_max=3)"
        assert breaker.trips(Circuit(status="half_open")) == "the trial attempt failed"
        assert breaker.trips(Circuit(consecutive=2, recent=(False, False, False, True))) is None


class TestBreakerInSupervisor:
    def test_opens_after_fail_max_and_stops_retrying(self, engine: Engine, frozen: Any) -> None:
        """fail_max failures in a row record CircuitOpened and raise CircuitOpen, retries or not."""
        run = engine.start_run(POLL)
        opened = trip(engine, supervise(engine, frozen), run)
        assert (opened.stage, opened.retry_after) == ("step", 300)
        assert "3 consecutive failures (fail_max=3)" in str(opened)
        assert kinds(engine, run).count("StageFailed") == 3
        assert kinds(engine, run)[-1] == "CircuitOpened"

    def test_an_open_breaker_fails_fast_and_records_the_refusal(
        self, engine: Engine, frozen: Any
    ) -> None:
        """A call before reset_timeout does not run the function; the refusal is a note."""
        run = engine.start_run(POLL)
        sup = supervise(engine, frozen)
        trip(engine, sup, run)
        frozen.tick(100)
        never = failing(0, ValueError())
        with pytest.raises(CircuitOpen) as raised:
            sup.execute(run, "step", never)
        assert never.calls["n"] == 0  # type: ignore[attr-defined]
        assert raised.value.retry_after == 200  # opened after the retries, 100 s ago
        note = of_type(engine, run, "NoteAdded")[-1]
        assert (note.key, note.value["stage"]) == ("circuit_rejected", "step")  # type: ignore[attr-defined]

    def test_half_opens_after_the_timeout_and_closes_on_success(
        self, engine: Engine, frozen: Any
    ) -> None:
        """After reset_timeout one trial goes through; its success records CircuitClosed."""
        run = engine.start_run(POLL)
        sup = supervise(engine, frozen)
        trip(engine, sup, run)
        frozen.tick(301)
        assert sup.execute(run, "step", lambda: "back") == "back"
        assert kinds(engine, run)[-4:] == [
            "CircuitHalfOpened", "StageStarted", "StageCompleted", "CircuitClosed",
        ]  # fmt: skip
        assert trip(engine, sup, run).reason == "3 consecutive failures (fail_max=3)"

    def test_a_failed_trial_opens_it_again(self, engine: Engine, frozen: Any) -> None:
        """A half-open trial that fails re-opens the breaker at once."""
        run = engine.start_run(POLL)
        sup = supervise(engine, frozen)
        trip(engine, sup, run)
        frozen.tick(301)
        assert trip(engine, sup, run).reason == "the trial attempt failed"
        assert kinds(engine, run)[-4:] == [
            "CircuitHalfOpened", "StageStarted", "StageFailed", "CircuitOpened",
        ]  # fmt: skip

    def test_successes_reset_the_streak(self, engine: Engine, frozen: Any) -> None:
        """Failures separated by a success do not add up to fail_max."""
        run = engine.start_run(POLL)
        sup = supervise(engine, frozen, fail_max=2)
        for _ in range(3):
            assert sup.execute(run, "step", failing(1, ValueError("x"))) == "ok"
        assert "CircuitOpened" not in kinds(engine, run)

    def test_the_failure_rate_trips_it(self, engine: Engine, frozen: Any) -> None:
        """Half of the last 4 attempts failing opens a breaker with a rate of 0.5."""
        run = engine.start_run(POLL)
        sup = supervise(engine, frozen, fail_max=None, failure_rate=0.5, window=4)
        sup.execute(run, "step", failing(1, ValueError("x")))
        sup.execute(run, "step", lambda: 1)
        with pytest.raises(CircuitOpen, match="50% of the last 4"):
            sup.execute(run, "step", failing(1, ValueError("y")))

    @pytest.mark.parametrize("backend", ["sqlite_url", "postgres_url"])
    def test_a_restarted_process_sees_the_open_breaker(
        self, backend: str, frozen: Any, request: pytest.FixtureRequest
    ) -> None:
        """The breaker's state comes from events: a new engine and supervisor still refuse."""
        store_url = request.getfixturevalue(backend)
        with Engine(store_url) as first:
            run = first.start_run(POLL)
            trip(first, supervise(first, frozen), run)
        with Engine(store_url) as second:
            again = second.load(run.id)
            with pytest.raises(CircuitOpen):
                supervise(second, frozen).execute(again, "step", lambda: None)

    def test_pipeline_scope_spans_runs_and_processes(self, store_url: str, frozen: Any) -> None:
        """With scope='pipeline', failures in one run open the breaker for every run of it."""
        with Engine(store_url) as engine:
            sup = engine.supervisor(
                retry=RetryPolicy(max_retries=0),
                breaker=CircuitBreaker(fail_max=3, reset_timeout=300, scope="pipeline"),
                sleep=frozen.tick,
            )
            outcomes = []
            for _ in range(3):  # one failure in each of three runs
                with pytest.raises((StageGaveUp, CircuitOpen)) as raised:
                    sup.execute(engine.start_run(POLL), "step", failing(1, OSError("refused")))
                outcomes.append(type(raised.value).__name__)
            assert outcomes == ["StageGaveUp", "StageGaveUp", "CircuitOpen"]
            other = engine.start_run(POLL)
            with pytest.raises(CircuitOpen, match="3 consecutive failures"):
                sup.execute(other, "step", lambda: None)
            assert kinds(engine, other)[-1] == "NoteAdded"
            if store_url != "memory://":
                with Engine(store_url) as restarted:
                    fresh = restarted.start_run(POLL)
                    with pytest.raises(CircuitOpen):
                        supervise(restarted, frozen, scope="pipeline").execute(
                            fresh, "step", lambda: None
                        )
            frozen.tick(301)
            assert sup.execute(other, "step", lambda: Outcome("finished")) is None
            assert kinds(engine, other)[-1] == "CircuitClosed"

    def test_one_trial_at_a_time_across_a_pipeline(self, engine: Engine, frozen: Any) -> None:
        """With scope='pipeline', other runs wait while a trial runs, or until it is stale."""
        sup = engine.supervisor(
            retry=RetryPolicy(max_retries=0),
            breaker=CircuitBreaker(fail_max=1, reset_timeout=300, scope="pipeline"),
        )
        with pytest.raises(CircuitOpen):
            sup.execute(engine.start_run(POLL), "step", failing(1, OSError("refused")))
        frozen.tick(301)
        trial_run, other = engine.start_run(POLL), engine.start_run(POLL)

        def trial() -> str:
            with pytest.raises(CircuitOpen, match="a trial is under way in another run"):
                sup.execute(other, "step", lambda: None)
            return "trial ok"

        assert sup.execute(trial_run, "step", trial) == "trial ok"
        assert kinds(engine, trial_run)[-1] == "CircuitClosed"
        assert sup.execute(other, "step", lambda: "closed again") == "closed again"

        crashed = engine.start_run(POLL)  # a trial whose process died: its half-open stays
        crashed.record(CircuitHalfOpened, stage="step", reason="trial, then a crash")
        late = engine.start_run(POLL)
        with pytest.raises(CircuitOpen):
            sup.execute(late, "step", lambda: None)
        frozen.tick(301)
        assert sup.execute(late, "step", lambda: "stale trial replaced") == "stale trial replaced"
        assert kinds(engine, late)[-4:] == [
            "CircuitHalfOpened", "StageStarted", "StageCompleted", "CircuitClosed",
        ]  # fmt: skip

    def test_a_trial_success_recorded_by_hand_closes_it(self, engine: Engine, frozen: Any) -> None:
        """A half-open circuit closes on the trial's success even when no CircuitClosed follows."""
        run = engine.start_run(POLL)
        sup = supervise(engine, frozen)
        trip(engine, sup, run)
        frozen.tick(301)
        run.record(CircuitHalfOpened, stage="step", reason="a trial by hand")
        run.stage_completed("step")
        assert engine.project(run.id, CircuitStates)["step"] == Circuit()
        assert sup.execute(run, "step", lambda: "closed") == "closed"
        assert "CircuitClosed" not in kinds(engine, run)

    def test_an_interrupted_trial_reopens_it(self, engine: Engine, frozen: Any) -> None:
        """A trial whose process died is recorded as failed by resume(), which re-opens it."""
        run = engine.start_run(POLL)
        sup = supervise(engine, frozen)
        trip(engine, sup, run)
        frozen.tick(301)
        run.record(CircuitHalfOpened, stage="step", reason="trial")
        run.stage_started("step")  # ...and the process died
        resumed = engine.resume(run.id)
        circuit = engine.project(run.id, CircuitStates)["step"]
        assert (circuit.status, circuit.reason) == ("open", "the trial attempt failed")
        with pytest.raises(CircuitOpen, match="the trial attempt failed"):
            supervise(engine, frozen).execute(resumed, "step", lambda: None)


class TestOneClock:
    def test_an_injected_clock_times_the_reset_window(self, engine: Engine) -> None:
        """On an injected clock, a breaker opened after 400 s of back-off still waits its 300 s."""
        fake = FakeTime(time.time())
        sup = engine.supervisor(
            retry=RetryPolicy(max_retries=5, delay=400, max_delay=400),
            breaker=CircuitBreaker(fail_max=2, reset_timeout=300),
            sleep=fake.sleep,
            clock=fake.clock,
        )
        run = engine.start_run(POLL)
        with pytest.raises(CircuitOpen) as first:
            sup.execute(run, "step", failing(99, ConnectionError("refused")))
        assert first.value.retry_after == 300
        with pytest.raises(CircuitOpen) as second:
            sup.execute(run, "step", lambda: "ok")
        assert second.value.retry_after == 300
        assert "CircuitHalfOpened" not in kinds(engine, run)

    def test_the_supervisors_events_carry_its_clock(self, engine: Engine) -> None:
        """Every event the supervisor records is stamped by its clock, sleeps included."""
        fake = FakeTime(float(int(time.time()) + 3600))
        policy = RetryPolicy(max_retries=2, delay=400, max_delay=400)
        sup = engine.supervisor(retry=policy, sleep=fake.sleep, clock=fake.clock)
        run = engine.start_run(POLL)
        start = fake.now
        sup.execute(run, "step", failing(1, ConnectionError("refused"), result="ok"))
        stamps = [e.timestamp.timestamp() for e in engine.events(run.id)[1:]]
        assert stamps == [start, start, start, start + 400, start + 400]


class TestRolledBackFailures:
    def rolled_back(self, engine: Engine, failures: int) -> Any:
        """A run whose `step` failed `failures` times by hand, all then rolled back."""
        run = engine.start_run(POLL)
        for _ in range(failures):
            run.stage_failed("step", "refused")
        run.rollback(failures, "the endpoint was misconfigured")
        return run

    def test_by_default_they_still_count(self, engine: Engine, frozen: Any) -> None:
        """forget_rolled_back=False: two popped failures and one more trip fail_max=3."""
        run = self.rolled_back(engine, 2)
        with pytest.raises(CircuitOpen, match=r"3 consecutive failures \(fail_max=3\)"):
            supervise(engine, frozen).execute(run, "step", failing(1, ConnectionError("x")))

    def test_forget_rolled_back_leaves_them_out(self, engine: Engine, frozen: Any) -> None:
        """forget_rolled_back=True: the popped failures do not count, so one more does not trip."""
        run = self.rolled_back(engine, 2)
        sup = supervise(engine, frozen, forget_rolled_back=True)
        assert sup.execute(run, "step", failing(1, ConnectionError("x"))) == "ok"
        assert "CircuitOpened" not in kinds(engine, run)

    def test_failures_after_the_rollback_still_trip_it(self, engine: Engine, frozen: Any) -> None:
        """Only popped failures are forgotten; the reason records the choice."""
        run = self.rolled_back(engine, 2)
        opened = trip(engine, supervise(engine, frozen, forget_rolled_back=True), run)
        assert opened.reason == (
            "3 consecutive failures (fail_max=3; rolled-back failures not counted)"
        )
        assert kinds(engine, run).count("StageFailed") == 5

    def test_a_resumed_supervisor_forgets_them_too(self, engine: Engine, frozen: Any) -> None:
        """A new supervisor folds the stored run the same way: the choice survives a restart."""
        run = self.rolled_back(engine, 2)
        run.stage_failed("step", "refused")
        sup = supervise(engine, frozen, forget_rolled_back=True)
        assert sup.execute(run, "step", failing(1, ConnectionError("x"))) == "ok"

    def test_only_a_run_scoped_breaker_can_forget(self) -> None:
        """Across a pipeline a rollback cannot undo other runs' failures: the setting is refused."""
        with pytest.raises(ValueError, match="forget_rolled_back=True needs scope='run'"):
            CircuitBreaker(forget_rolled_back=True, scope="pipeline")
