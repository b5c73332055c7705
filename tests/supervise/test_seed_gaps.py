"""What the five seed designs needed a workaround for (issue 27), each pinned by a test.

Seed 002 (a progress controller and its stuck handler), seed 003 (a task
coordinator with child runs and a shared budget), seed 004 (tool-calling rounds
with rollback), and the smaller frictions the rebuilds met.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from engine import Engine, Outcome, Pipeline, ProgressPolicy, RetryPolicy, StageContext
from engine.errors import InvalidArgument, RunAlreadyExists, RunStopped, StageGaveUp
from events import RetryScheduled, RunFinished, StageCompleted, StageFailed, StageStarted
from projections import ProgressState, RetryCounts, StageResults, StateStack
from tests.supervise._helpers import FakeTime, kinds

AGENT = Pipeline(
    "coder-verifier",
    initial="coder",
    transitions=[
        ("coder", "completed", "verifier"),
        ("verifier", "checks_failing", "coder"),
        ("verifier", "checks_pass", "done"),
        ("*", "stuck", "stuck_handler"),
        ("*", "over_budget", "stuck_handler"),
        ("stuck_handler", "completed", "reported"),
    ],
    final=["done", "reported"],
)
"""Seed 002's agent: a coder and a verifier in a loop, and a handler for stops."""


class Agent:
    """The agent's nodes: a coder that changes files, a verifier that never passes."""

    def __init__(self, spend: float = 0.0) -> None:
        self.spend = spend
        self.handled: list[Any] = []

    def coder(self, context: StageContext) -> dict[str, Any]:
        """Change a file (and spend, when told to)."""
        if self.spend:
            context.run.spend(self.spend)
        context.run.observe_progress(["parser.py"])
        return {"step": context.attempt}

    def verifier(self, context: StageContext) -> Outcome:
        """Tests keep failing, each time differently: progress, but no end."""
        return Outcome("checks_failing", {"run": context.attempt})

    def handler(self, context: StageContext) -> dict[str, Any]:
        """The snitch: reads the verdict on the stack's top."""
        top = context.stack.top
        assert top is not None
        self.handled.append(top.result)
        return {"ticket": "AGENT-1"}

    def planner(self, context: StageContext) -> None:
        """A node of the agent that this pipeline does not use."""
        raise AssertionError("never called")

    def stages(self) -> dict[str, Any]:
        """Every node the agent offers, the planner included."""
        return {
            "coder": self.coder,
            "verifier": self.verifier,
            "stuck_handler": self.handler,
            "planner": self.planner,
        }


def finish(engine: Engine, run_id: Any) -> RunFinished:
    """The run's RunFinished."""
    last = engine.events(run_id)[-1]
    assert isinstance(last, RunFinished)
    return last


class TestProgressController:
    def test_the_handler_runs_after_a_max_steps_verdict(self, engine: Engine) -> None:
        """A max_steps verdict routed to the handler runs it; the run ends with that verdict."""
        agent, time = Agent(), FakeTime()
        sup = engine.supervisor(progress=ProgressPolicy(max_steps=9), sleep=time.sleep)
        run = sup.drive(engine.start_run(AGENT), agent.stages())
        assert (run.status, run.state) == ("aborted_stuck", "reported")
        assert [verdict["rule"] for verdict in agent.handled] == ["max_steps"]
        reason = finish(engine, run.id).reason
        assert isinstance(reason, dict)
        assert (reason["rule"], reason["steps"], reason["final_state"]) == (
            "max_steps",
            9,
            "reported",
        )
        assert "then" not in reason

    def test_a_budget_stop_is_routed_to_the_handler(self, engine: Engine) -> None:
        """A spending limit's stop goes to the over_budget row's handler; the run ends failed."""
        from engine import SpendingLimit

        agent = Agent(spend=0.5)
        sup = engine.supervisor(budget=SpendingLimit(limit=1.0), sleep=FakeTime().sleep)
        run = sup.drive(engine.start_run(AGENT), agent.stages())
        assert (run.status, run.state) == ("failed", "reported")
        assert agent.handled[0]["rule"] == "budget"
        reason = finish(engine, run.id).reason
        assert isinstance(reason, dict)
        assert (reason["rule"], reason["final_state"]) == ("budget", "reported")

    def test_a_verdict_is_no_result_attempt_or_step_of_the_stage(self, engine: Engine) -> None:
        """The routed outcome has attempt 0: results, attempts and steps stay those that ran."""
        agent = Agent()
        sup = engine.supervisor(progress=ProgressPolicy(max_steps=9), sleep=FakeTime().sleep)
        run = sup.drive(engine.start_run(AGENT), agent.stages())
        routed = [
            e for e in engine.events(run.id) if isinstance(e, StageCompleted) and not e.attempt
        ]
        assert [(e.stage, e.outcome) for e in routed] == [("verifier", "stuck")]
        before = routed[0].version - 1  # the note that goes with it
        stack = engine.project(run.id, StateStack)
        assert stack.latest_result("verifier") == {"run": 4}  # the verifier's own, not the verdict
        progress = engine.project(run.id, ProgressState, at=before)
        assert progress.total_steps == agent.handled[0]["steps"] == 9
        assert engine.project(run.id, ProgressState).total_steps == 10  # the handler's outcome
        assert [a.attempt for a in engine.project(run.id, StageResults).attempts("verifier")] == [
            1,
            2,
            3,
            4,
        ]
        assert engine.project(run.id, RetryCounts).attempts("verifier") == 4
        (summary,) = engine.runs()
        assert summary.attempts == 10

    def test_a_rollback_undoes_a_routed_verdict(self, engine: Engine) -> None:
        """The decided outcome is on the stack: rolling it back returns to the verifier."""
        agent = Agent()
        sup = engine.supervisor(progress=ProgressPolicy(max_steps=9), sleep=FakeTime().sleep)
        run = engine.start_run(AGENT)
        with pytest.raises(RunStopped) as stopped:
            for _ in range(20):
                sup.execute(
                    run, run.state, getattr(agent, run.state), StageContext(engine, run, run.state)
                )
        assert stopped.value.routed_to == "stuck_handler" == run.state
        run.rollback(1, reason="look again")
        assert run.state == "verifier"
        assert engine.project(run.id, StateStack).current == "verifier"
        assert [s.state for s in engine.runs()] == ["verifier"]

    def test_drive_ignores_functions_the_table_does_not_use(self, engine: Engine) -> None:
        """An agent's extra nodes are accepted and never called; a misspelt stage is refused."""
        agent = Agent()
        sup = engine.supervisor(progress=ProgressPolicy(max_steps=4), sleep=FakeTime().sleep)
        run = sup.drive(engine.start_run(AGENT), agent.stages())
        assert run.status == "aborted_stuck"
        with pytest.raises(
            InvalidArgument, match=r"'verfier' is not a state .* did you mean 'verifier'"
        ):
            sup.drive(engine.start_run(AGENT), {"coder": agent.coder, "verfier": agent.verifier})


COORDINATOR = Pipeline(
    "coordinator",
    initial="plan",
    transitions=[
        ("plan", "completed", "build"),
        ("build", "completed", "done"),
        ("build", "failed", "build"),
    ],
    final=["done"],
)
FEATURE = Pipeline(
    "feature",
    initial="tasks",
    transitions=[("tasks", "completed", "integrated"), ("tasks", "failed", "tasks")],
    final=["integrated"],
)


class TestTaskCoordinator:
    def test_a_budget_refusal_inside_a_stage_stops_the_parent(self, engine: Engine) -> None:
        """A tree budget refused inside the parent's stage: RunStopped, no failure, no retry."""
        from engine import SpendingLimit, Spent

        sup = engine.supervisor(
            budget=SpendingLimit(limit=1.0, scope="tree"), sleep=FakeTime().sleep
        )

        def tasks(context: StageContext) -> list[Any]:
            ids = ["t-1", "t-2", "t-3"]
            return [sup.task(context.run, t, Spent, t, 0.5) for t in ids]

        def build(context: StageContext) -> str:
            child = engine.start_run(FEATURE, parent=context.run)
            sup.drive(child, {"tasks": tasks})
            sup.task(context.run, "feature-a", lambda: "built")
            return "built"

        run = engine.start_run(COORDINATOR)
        stages = {"plan": lambda context: "planned", "build": build}
        assert sup.drive(run, stages) is run
        assert run.status == "failed"
        reason = finish(engine, run.id).reason
        assert isinstance(reason, dict)
        assert reason["rule"] == "budget"
        history = engine.events(run.id)
        assert not [e for e in history if isinstance(e, StageFailed | RetryScheduled)]
        again = engine.start_run(COORDINATOR)
        again.stage_completed("plan")
        with pytest.raises(RunStopped, match="stopped as failed"):
            sup.execute(again, "build", build, StageContext(engine, again, "build"))

    def test_a_child_run_is_got_or_created_by_its_key(self, engine: Engine) -> None:
        """engine.child_run starts the child once; asked again it is the same run, per key."""
        parent = engine.start_run(COORDINATOR)
        first = engine.child_run(parent, FEATURE, key="feature-rom", params={"n": 1})
        again = engine.child_run(parent.id, FEATURE, key="feature-rom")
        other = engine.child_run(parent, FEATURE, key="feature-cpu")
        assert again.id == first.id != other.id
        assert again.params == {"n": 1}
        found = engine.runs(parent=parent.id, label="key=feature-rom")
        assert [s.run_id for s in found] == [first.id]
        elsewhere = engine.start_run(COORDINATOR)
        assert engine.child_run(elsewhere, FEATURE, key="feature-rom").id != first.id
        with pytest.raises(RunAlreadyExists):
            engine.child_run(parent, COORDINATOR, key="feature-rom")  # another pipeline's run
        with pytest.raises(InvalidArgument, match="key"):
            engine.child_run(parent, FEATURE, key="")

    @pytest.mark.parametrize("key", ["\ud800", "a\x00b"], ids=["lone surrogate", "NUL"])
    def test_a_key_no_store_can_hold_is_refused(self, engine: Engine, key: str) -> None:
        """A child's key that cannot be stored is one InvalidArgument naming it; nothing written."""
        parent = engine.start_run(COORDINATOR)
        with pytest.raises(InvalidArgument, match=r"^argument 'key': "):
            engine.child_run(parent, FEATURE, key=key)
        assert engine.runs(parent=parent.id) == []

    def test_two_askers_at_once_get_the_same_child(self, store_url: str) -> None:
        """Two engines asking for one key at the same moment get one run: no duplicate child."""
        if store_url == "memory://":
            pytest.skip("two engines share a store only through a file or a server")
        with Engine(store_url) as first_engine, Engine(store_url) as second_engine:
            parent = first_engine.start_run(COORDINATOR)
            barrier, ids = threading.Barrier(2), []

            def ask(engine: Engine) -> None:
                barrier.wait()
                ids.append(engine.child_run(parent.id, FEATURE, key="feature-ppu").id)

            threads = [
                threading.Thread(target=ask, args=(e,)) for e in (first_engine, second_engine)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert len(ids) == 2
            assert ids[0] == ids[1]
            assert len(first_engine.runs(parent=parent.id)) == 1

    def test_an_interrupted_attempt_spends_no_retry_but_counts_for_the_breaker(
        self, engine: Engine
    ) -> None:
        """As docs/supervisor.md says: count_interrupted=False, and the breaker counts the call."""
        from engine import CircuitBreaker, CircuitStates

        run = engine.start_run(COORDINATOR)
        run.stage_completed("plan")
        for _ in range(2):
            run.stage_started("build")
            run = engine.resume(run.id)
        sup = engine.supervisor(
            retry=RetryPolicy(max_retries=0),
            breaker=CircuitBreaker(fail_max=5),
            sleep=FakeTime().sleep,
        )
        assert (
            sup.execute(run, "build", lambda: "built") == "built"
        )  # two interruptions, no retry spent
        circuits = engine.project(run.id, CircuitStates, at=run.version - 1)
        assert circuits["build"].consecutive == 2


ROUNDS = Pipeline(
    "tool-rounds",
    initial="query",
    transitions=[
        ("query", "tool_call", "round"),
        ("round", "tool_call", "round"),
        ("round", "answered", "synthesis"),
        ("round", "failed", "round"),
        ("synthesis", "completed", "done"),
    ],
    final=["done"],
)


class TestToolRounds:
    def test_a_give_up_hook_rolls_back_instead_of_finishing(self, engine: Engine) -> None:
        """on_give_up returning Rollback undoes the round before and drive goes on to succeed."""
        from engine import Rollback

        calls = {"round": 0}

        def round_(context: StageContext) -> Outcome:
            calls["round"] += 1
            if calls["round"] in (2, 3):  # round 2 breaks twice: the first round misled it
                raise ConnectionError("tool down")
            return Outcome("tool_call" if calls["round"] < 5 else "answered", calls["round"])

        def roll_back(context: StageContext, gave_up: StageGaveUp) -> Rollback | None:
            rolled = sum(
                1 for e in engine.events(context.run.id) if type(e).__name__ == "StateRolledBack"
            )
            undo = f"undo the round before and its failures: {gave_up.error}"
            return Rollback(3, undo) if rolled < 1 else None

        sup = engine.supervisor(
            retry=RetryPolicy(max_retries=1, delay=0), on_give_up=roll_back, sleep=FakeTime().sleep
        )
        stages = {
            "query": lambda c: Outcome("tool_call"),
            "round": round_,
            "synthesis": lambda c: "ok",
        }
        run = sup.drive(engine.start_run(ROUNDS), stages)
        assert (run.status, run.state) == ("succeeded", "done")
        history = kinds(engine, run)
        assert history.count("StateRolledBack") == 1
        assert "gave_up" in [getattr(e, "key", None) for e in engine.events(run.id)]

    def test_without_a_rollback_the_give_up_finishes_the_run(self, engine: Engine) -> None:
        """A hook answering None keeps the default: the run finishes failed, StageGaveUp raised."""
        seen: list[str] = []

        def note(context: StageContext, gave_up: StageGaveUp) -> None:
            seen.append(gave_up.cause)

        sup = engine.supervisor(
            retry=RetryPolicy(max_retries=0), on_give_up=note, sleep=FakeTime().sleep
        )
        run = engine.start_run(ROUNDS)
        with pytest.raises(StageGaveUp):
            sup.drive(run, {"query": lambda c: (_ for _ in ()).throw(KeyError("x"))})
        assert seen == ["no_failure_row"]
        assert run.status == "failed"

    def test_step_asks_the_hook_too(self, engine: Engine) -> None:
        """`step` answers a give-up with the hook's Rollback and returns None."""
        from engine import Rollback

        sup = engine.supervisor(
            retry=RetryPolicy(max_retries=0),
            on_give_up=lambda context, gave_up: Rollback(2, "ask the query again"),
            sleep=FakeTime().sleep,
        )
        run = engine.start_run(ROUNDS)
        stages = {"query": lambda c: Outcome("tool_call"), "round": lambda c: 1 / 0}
        sup.step(run, stages)
        assert sup.step(run, stages) is None
        assert (run.state, run.status) == ("query", "running")

    def test_drive_async_asks_the_hook_too(self, engine: Engine) -> None:
        """drive_async answers a give-up with the hook's Rollback, as drive does."""
        import asyncio

        from engine import Rollback

        calls = {"round": 0}

        async def query(context: StageContext) -> Outcome:
            return Outcome("tool_call")

        async def round_(context: StageContext) -> Outcome:
            calls["round"] += 1
            if calls["round"] == 1:
                raise ConnectionError("tool down")
            return Outcome("answered")

        async def synthesis(context: StageContext) -> str:
            return "ok"

        sup = engine.supervisor(
            retry=RetryPolicy(max_retries=0),
            on_give_up=lambda context, gave_up: Rollback(2, "from the query again"),
            sleep=FakeTime().sleep,
        )
        run = engine.start_run(ROUNDS)
        stages = {"query": query, "round": round_, "synthesis": synthesis}
        asyncio.run(sup.drive_async(run, stages))
        assert (run.status, run.state) == ("succeeded", "done")
        assert kinds(engine, run).count("StateRolledBack") == 1

    def test_a_hook_must_answer_a_rollback_or_none(self, engine: Engine) -> None:
        """Any other answer is a TypeError naming the hook."""
        sup = engine.supervisor(
            retry=RetryPolicy(max_retries=0),
            on_give_up=lambda c, g: "retry",
            sleep=FakeTime().sleep,
        )
        with pytest.raises(TypeError, match="not a Rollback or None"):
            sup.drive(engine.start_run(ROUNDS), {"query": lambda c: 1 / 0})

    def test_execute_leaves_a_final_state_to_its_caller_and_step_finishes_it(
        self, engine: Engine
    ) -> None:
        """As the docs say: execute moves the run to a final state unfinished; step finishes it."""
        from engine.supervise import FINISHED

        run = engine.start_run(ROUNDS)
        sup = engine.supervisor()
        sup.execute(run, "query", lambda: Outcome("tool_call"))
        sup.execute(run, "round", lambda: Outcome("answered"))
        sup.execute(run, "synthesis", lambda: "ok")
        assert (run.state, run.status) == ("done", "running")
        assert sup.step(run, {}) is FINISHED
        assert run.status == "succeeded"

    def test_a_run_has_its_params(self, engine: Engine) -> None:
        """run.params is the RunStarted's params, on a started, loaded or forked run."""
        run = engine.start_run(ROUNDS, params={"question": "rain?"})
        assert run.params == {"question": "rain?"}
        assert engine.load(run.id).params == {"question": "rain?"}
        run.stage_completed("query", outcome="tool_call")
        assert engine.fork(run.id, at=2, params={"question": "sun?"}).params == {"question": "sun?"}


class TestFrictions:
    def test_circuit_states_are_exported_and_projectable(self, engine: Engine) -> None:
        """`from engine import CircuitStates` folds a run's breakers like any projection."""
        from engine import CircuitStates

        run = engine.start_run(ROUNDS)
        run.stage_completed("query", outcome="tool_call")
        run.stage_failed("round", "down")
        assert engine.project(run.id, CircuitStates)["round"].consecutive == 1

    def test_a_stage_projects_its_own_run(self, engine: Engine) -> None:
        """context.project(P) folds any projection of the stage's run, with no engine captured."""
        seen: list[int] = []

        def query(context: StageContext) -> Outcome:
            seen.append(context.project(StateStack).depth)
            seen.append(context.project(RetryCounts).total_attempts)
            return Outcome("tool_call")

        run = engine.start_run(ROUNDS)
        engine.supervisor().step(run, {"query": query})
        assert seen == [0, 0]

    def test_a_running_run_says_running(self, engine: Engine) -> None:
        """run.status is "running" until it finishes, the word runs(status=...) uses."""
        run = engine.start_run(ROUNDS)
        assert run.status == "running"
        assert [s.run_id for s in engine.runs(status=run.status)] == [run.id]
        run.finish("cancelled")
        assert run.status == "cancelled" == engine.load(run.id).status

    def test_durations_on_an_epoch_clock_are_rounded_to_the_microsecond(
        self, engine: Engine
    ) -> None:
        """A 5.2 s attempt measured on an epoch clock records 5.2, not 5.200000047683716."""
        time = FakeTime(now=1_764_000_000.1)

        def slow() -> str:
            time.advance(5.2)
            return "done"

        run = engine.start_run(ROUNDS)
        engine.supervisor(clock=time.clock).execute(
            run, "query", lambda: (slow(), Outcome("tool_call"))[1]
        )
        completed = engine.events(run.id)[-1]
        assert isinstance(completed, StageCompleted)
        assert completed.duration == 5.2

    def test_the_timeout_of_each_attempt_is_recorded_at_its_start(self, engine: Engine) -> None:
        """A policy function's timeout for the next attempt is on that attempt's StageStarted."""
        timeouts = iter([30.0, 600.0])

        def longer(context: StageContext) -> RetryPolicy:
            return RetryPolicy(delay=0, timeout=next(timeouts))

        run = engine.start_run(ROUNDS)
        run.stage_completed("query", outcome="tool_call")
        outcomes = iter([ConnectionError("slow"), None])

        def tool() -> Outcome:
            error = next(outcomes)
            if error:
                raise error
            return Outcome("answered")

        engine.supervisor(policies={"round": longer}).execute(run, "round", tool)
        starts = [e for e in engine.events(run.id) if isinstance(e, StageStarted)]
        assert [s.timeout for s in starts] == [30.0, 600.0]
        retry = next(e for e in engine.events(run.id) if isinstance(e, RetryScheduled))
        assert retry.policy["timeout"] == 30.0  # the policy that decided: the failed attempt's
