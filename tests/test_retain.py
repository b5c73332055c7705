"""Retention: rules choose finished runs, deletions record the rule, compaction runs online."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from freezegun import freeze_time

from engine import Engine, RetentionRule, RunNotFound
from engine.cli.demo.code_review import REVIEW
from engine.errors import InvalidArgument, RunAlreadyFinished
from engine.retention import parse_rule
from events import RunDeleted
from projections import StateStack
from tests._helpers import FailureCount


def finished_run(engine: Engine, status: str, *, card: str = "C", **labels: str) -> str:
    """A run with one failed developer attempt, finished with `status`."""
    run = engine.start_run(REVIEW, params={"card": card}, labels=labels)
    run.stage_completed("project_analysis")
    run.stage_completed("code_review")
    run.stage_failed("developer", error=RuntimeError(f"broke on {card}"))
    run.finish(status)
    return str(run.id)


def stored_states(engine: Engine) -> dict[str, Any]:
    """Every registered persistent projection's stored states, by name."""
    return {name: engine.projections.states(name) for name in engine.projections.names}


def rebuilt_states(engine: Engine) -> dict[str, Any]:
    """The same after folding every projection again from the first event."""
    for name in engine.projections.names:
        engine.projections.rebuild(name)
    return stored_states(engine)


class TestRules:
    def test_parse_combines_status_pipeline_label_and_age(self) -> None:
        """A rule's text names several statuses, a pipeline, labels and an age."""
        rule = parse_rule("status=succeeded|failed,pipeline=code-review,label=team:core,age=30d")
        assert rule == RetentionRule(
            status={"succeeded", "failed"},
            pipeline="code-review",
            labels={"team": "core"},
            older_than=timedelta(days=30),
        )
        assert str(rule) == "status=failed|succeeded,pipeline=code-review,label=team:core,age=30d"

    @pytest.mark.parametrize(
        ("text", "argument"),
        [("status=deleted", "status"), ("age=3 days", "age"), ("colour=red", "rule"), ("", "rule")],
    )
    def test_bad_rules_are_refused_by_name(self, text: str, argument: str) -> None:
        """An unknown status, an unreadable age, an unknown key or an empty rule is refused."""
        with pytest.raises(InvalidArgument) as raised:
            parse_rule(text)
        assert raised.value.argument == argument


class TestRetain:
    def test_dry_run_chooses_by_age_and_status_and_writes_nothing(self, engine: Engine) -> None:
        """Only runs finished long enough ago with a named status are chosen; none is deleted."""
        with freeze_time("2026-01-01T00:00:00Z"):
            old_ok = finished_run(engine, "succeeded")
            old_failed = finished_run(engine, "failed")
        with freeze_time("2026-03-01T00:00:00Z"):
            finished_run(engine, "succeeded")
            running = engine.start_run(REVIEW, params={"card": "R"})
            rules = [
                RetentionRule(status={"succeeded"}, older_than=timedelta(days=30)),
                RetentionRule(status={"failed"}, older_than=timedelta(days=365)),
            ]
            plan = engine.retain(rules)
        assert [str(d.run_id) for d in plan.runs] == [old_ok]
        assert not plan.applied
        assert plan.compacted is None
        assert engine.runs(status="deleted") == []
        assert len(engine.events(old_failed)) == 5
        assert engine.load(running.id).status == "running"

    def test_apply_records_the_rule_then_erases(self, engine: Engine) -> None:
        """Each chosen run gets a RunDeleted with its rule, then its events leave the store."""
        kept = finished_run(engine, "succeeded", team="core")
        doomed = finished_run(engine, "succeeded", team="lab")
        engine.projections.register(FailureCount)
        rule = RetentionRule(labels={"team": "lab"})
        plan = engine.retain(rule, apply=True, compact=False)
        assert [str(d.run_id) for d in plan.runs] == [doomed]
        deletion = engine.events(doomed)[-1]
        assert isinstance(deletion, RunDeleted)
        assert deletion.rule == rule.to_json()
        assert [s.status for s in engine.runs(status="deleted")] == ["deleted"]
        assert engine.projections.get("failure_count") == {"developer": 1}  # forgot at once
        with pytest.raises(RunAlreadyFinished):
            engine.load(doomed).record(RunDeleted)
        done = engine.compact()
        assert [str(r) for r in done.runs] == [doomed]
        with pytest.raises(RunNotFound):
            engine.events(doomed)
        assert [str(s.run_id) for s in engine.runs()] == [kept]
        assert engine.projections.get("failure_count") == {"developer": 1}
        assert "failure_count" not in done.rebuilt
        assert "run_index" not in done.rebuilt

    def test_retain_apply_deletes_and_compacts(self, engine: Engine) -> None:
        """`apply=True` deletes every chosen run and compacts in the same call."""
        kept = finished_run(engine, "failed")
        doomed = [finished_run(engine, "cancelled") for _ in range(3)]
        done = engine.retain(RetentionRule(status={"cancelled"}), apply=True)
        assert done.applied
        assert done.compacted is not None
        assert sorted(str(r) for r in done.compacted.runs) == sorted(doomed)
        assert [str(s.run_id) for s in engine.runs(limit=10)] == [kept]

    def test_children_of_kept_runs_stay_and_forks_of_erased_runs_stay_readable(
        self, engine: Engine
    ) -> None:
        """A chosen child whose parent stays is kept; a fork of an erased run reads on."""
        parent = engine.start_run(REVIEW, params={"card": "P"})
        child = engine.start_run(REVIEW, params={"card": "K"}, parent=parent.id)
        child.finish("cancelled")
        origin = finished_run(engine, "cancelled", card="O")
        fork = engine.fork(origin, at=3)
        fork.finish("succeeded")
        done = engine.retain(RetentionRule(status={"cancelled"}), apply=True)
        assert [str(d.run_id) for d in done.runs] == [origin]
        assert engine.tree(parent.id) == [parent.id, child.id]
        assert engine.project(fork.id, StateStack, at=3).depth == 2
        assert engine.verify(fork.id).ok
        with pytest.raises(RunNotFound):
            engine.verify(origin)

    def test_time_travel_of_kept_runs_survives(self, engine: Engine) -> None:
        """A kept run's history and states at every version are as before the compaction."""
        kept = finished_run(engine, "failed")
        before = [engine.project(kept, StateStack, at=v).depth for v in range(1, 6)]
        finished_run(engine, "succeeded")
        engine.retain(RetentionRule(status={"succeeded"}), apply=True)
        assert [engine.project(kept, StateStack, at=v).depth for v in range(1, 6)] == before
        assert engine.verify(kept).ok


class TestOnlineCompaction:
    def test_projections_equal_a_rebuild(self, engine: Engine) -> None:
        """After compaction every persistent projection holds what a rebuild gives."""
        engine.projections.register(FailureCount)
        for index in range(12):
            finished_run(engine, ["succeeded", "failed", "cancelled"][index % 3], card=str(index))
        engine.retain(RetentionRule(status={"cancelled", "succeeded"}), apply=True)
        after = stored_states(engine)
        assert after["failure_count"] == {"": {"developer": 4}}
        assert after == rebuilt_states(engine)

    @pytest.mark.timeout(60)
    def test_a_catch_up_aimed_past_what_a_compaction_erased_ends(self, sqlite_url: str) -> None:
        """A follower that read the store's head before a compaction erased the newest events
        ends at the new head instead of retrying for ever (SQLite gives erased ids out again,
        so no position may pass the newest event)."""
        with Engine(sqlite_url) as engine:
            kept = finished_run(engine, "failed")
            finished_run(engine, "cancelled")
            engine.retain(RetentionRule(status={"cancelled"}), apply=True, compact=False)
            stale_head = engine.projections.head()  # the doomed run's RunDeleted
            engine.compact()
            assert engine.projections.head() < stale_head
            names = list(engine.projections.names)
            # the catch-up a reader began before the compaction, with the head it read then
            folded = engine.projections._catch_up(names, stale_head, None)
            assert set(folded.values()) == {0}
            assert [str(s.run_id) for s in engine.runs()] == [kept]

    def test_writers_and_a_follower_go_on_while_it_compacts(self, shared_url: str) -> None:
        """Writers append and a follower folds during compaction: no event is lost or doubled."""
        with Engine(shared_url) as setup:
            setup.projections.register(FailureCount)
            for index in range(30):
                finished_run(setup, "succeeded" if index % 3 else "cancelled", card=str(index))
            setup.retain(RetentionRule(status={"cancelled"}))  # catch the index up
        stop, errors = threading.Event(), []

        def write() -> None:
            with Engine(shared_url) as writer:
                while not stop.is_set():
                    finished_run(writer, "failed", card="w")

        def follow() -> None:
            with Engine(shared_url) as follower:
                follower.projections.register(FailureCount)
                try:
                    follower.projections.follow(stop, timeout=0.05)
                except Exception as error:
                    errors.append(error)

        threads = [threading.Thread(target=write) for _ in range(2)]
        threads.append(threading.Thread(target=follow))
        for thread in threads:
            thread.start()
        try:
            with Engine(shared_url) as compactor:
                compactor.projections.register(FailureCount)
                done = compactor.retain(RetentionRule(status={"cancelled"}), apply=True)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        assert errors == []
        assert done.compacted is not None
        assert len(done.runs) == 10
        with Engine(shared_url) as check:
            check.projections.register(FailureCount)
            check.projections.catch_up()
            after = stored_states(check)
            failures = sum(s.failures for s in check.runs(limit=100_000))
            assert after["failure_count"] == {"": {"developer": failures}}
            rebuilt = rebuilt_states(check)
            for name in after:
                for key in set(after[name]) | set(rebuilt[name]):
                    assert after[name].get(key) == rebuilt[name].get(key), (name, key)
            assert all(check.verify(s.run_id).ok for s in check.runs(limit=5))
