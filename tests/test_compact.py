"""Engine.compact: deleted runs leave the store physically; projections forget them."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from starlette.testclient import TestClient

from engine import Engine, Pipeline, RunNotFound
from engine.cli import export_import
from engine.cli.demo.code_review import REVIEW
from engine.errors import ProjectionError, RunBeingErased, RunErased, RunErasedWhileRead
from engine.run import Run
from engine.store.event_store import PAGE, Store
from engine.store.postgres import open as postgres_open
from engine.ui import create_app
from events import Event, RunFinished
from projections import Projection, StateStack, TaskTable
from tests._helpers import compact_killed_after_first_erase, erased_after_its_first_page
from tests.audit.tampering import Rows
from tests.cli._helpers import invoke


def failed_run(engine: Engine, card: str, status: str) -> str:
    """A run with one failed attempt of the developer stage, finished with `status`."""
    run = engine.start_run(REVIEW, params={"card": card})
    run.stage_completed("project_analysis")
    run.stage_completed("code_review")
    run.stage_failed("developer", error=RuntimeError(f"broke on {card}"))
    run.finish(status)
    return str(run.id)


class TestCompact:
    def test_deleted_runs_are_erased_and_the_others_stay(self, engine: Engine) -> None:
        """Only runs finished as deleted lose their events; the report names them."""
        kept = failed_run(engine, "C-1", "failed")
        doomed = failed_run(engine, "C-2", "deleted")
        assert len(engine.events(doomed)) == 5
        done = engine.compact()
        assert [str(r) for r in done.runs] == [doomed]
        assert done.events == 5
        assert done.rebuilt == ()  # every projection forgot it as it folded the deletion
        with pytest.raises(RunNotFound):
            engine.events(doomed)
        assert len(engine.events(kept)) == 5
        assert [str(s.run_id) for s in engine.runs()] == [kept]

    def test_cross_run_projections_forget_the_erased_runs(self, engine: Engine) -> None:
        """FailurePatterns across runs stops counting a deleted run's failures at its deletion."""
        failed_run(engine, "C-1", "failed")
        failed_run(engine, "C-2", "deleted")
        forgotten = engine.projections.get("failure_patterns", REVIEW.name)
        assert forgotten.by_stage == {"developer": 1}  # as it folded the deletion
        engine.compact()
        after = engine.projections.get("failure_patterns", REVIEW.name)
        assert after.by_stage == {"developer": 1}

    def test_runs_recorded_after_compaction_are_indexed(self, engine: Engine) -> None:
        """Events appended after the newest events were erased still reach the projections."""
        failed_run(engine, "C-1", "failed")
        failed_run(engine, "C-2", "deleted")
        engine.compact()
        later = failed_run(engine, "C-3", "failed")
        assert str(engine.runs()[0].run_id) == later
        assert engine.projections.get("failure_patterns", REVIEW.name).by_stage == {"developer": 2}

    def test_nothing_to_compact(self, engine: Engine) -> None:
        """A store without deleted runs is left as it is."""
        kept = failed_run(engine, "C-1", "succeeded")
        done = engine.compact()
        assert (done.runs, done.events, done.rebuilt) == ((), 0, ())
        assert len(engine.events(kept)) == 5


def erased_behind(engine: Engine, other: Engine) -> Run:
    """A handle of a running run, read by `engine`, that `other` deletes and erases."""
    stale = engine.start_run(REVIEW, params={"card": "C-9"})
    stale.stage_completed("project_analysis")
    deleter = other.load(stale.id)
    deleter.finish("deleted")
    assert [str(r) for r in other.compact().runs] == [str(stale.id)]
    return stale


LOOP = Pipeline(
    "loop",
    initial="a",
    transitions=[
        ("a", "failed", "a"),
        ("a", "completed", "b"),
        ("b", "failed", "b"),
        ("b", "completed", "a"),
        ("*", "aborted", "done"),
    ],
    final=["done"],
)


def random_history(engine: Engine, seed: int, steps: int) -> int:
    """Interleaved runs that fail and complete stages, some deleted midway; the deletions."""
    rng = random.Random(seed)
    live: dict[Run, str] = {}
    deleted = 0
    for _ in range(steps):
        if len(live) < 4 or rng.random() < 0.05:
            live[engine.start_run(LOOP)] = "a"
        run = rng.choice(list(live))
        roll = rng.random()
        if roll < 0.06:
            deleted += roll < 0.04
            run.finish("deleted" if roll < 0.04 else "succeeded")
            del live[run]
        elif roll < 0.55:
            run.stage_failed(live[run], error=rng.choice(["x", "y"]))
        else:
            run.stage_completed(live[run])
            live[run] = "b" if live[run] == "a" else "a"
    return deleted


class TestCompactionForgetsExactly:
    @pytest.mark.parametrize("seed", [1, 2, 3])
    def test_failure_patterns_equal_a_fold_of_the_kept_events(
        self, shared_url: str, seed: int
    ) -> None:
        """After compaction the patterns equal a fold of what is left, without a refold."""
        with Engine(shared_url) as engine:
            engine.projections.catch_up()  # deletions are folded at their place in history
            deletions = random_history(engine, seed, steps=150)
            assert deletions
            done = engine.compact()
            assert len(done.runs) == deletions
            assert done.rebuilt == ()
            after = engine.projections.states("failure_patterns")
            engine.projections.rebuild("failure_patterns")
            assert engine.projections.states("failure_patterns") == after
            assert after[LOOP.name].exact

    def test_a_state_the_window_cannot_mend_is_folded_again(self, shared_url: str) -> None:
        """A deleted run owning every completion still kept makes compact refold, correctly."""
        with Engine(shared_url) as engine:
            old = engine.start_run(LOOP)
            old.stage_failed("a", error="x")
            doomed, other = engine.start_run(LOOP), engine.start_run(LOOP)
            for _ in range(10):  # another run's failure between each of its completions
                doomed.stage_completed("a")
                other.stage_failed("a", error="y")
                doomed.stage_completed("b")
            engine.projections.catch_up()
            doomed.finish("deleted")
            done = engine.compact()
            assert done.rebuilt == ("failure_patterns",)
            state = engine.projections.get("failure_patterns", LOOP.name)
            assert (state.consecutive("a"), state.exact) == (11, True)


class TestStaleHandleOfAnErasedRun:
    def test_an_append_is_refused_and_writes_nothing(self, engine: Engine) -> None:
        """A stale handle of a run erased by compact cannot append into the freed versions."""
        stale = erased_behind(engine, engine)
        with pytest.raises(RunErased) as refused:
            stale.stage_completed("code_review")
        assert isinstance(refused.value, LookupError)
        assert (refused.value.run_id, refused.value.version) == (stale.id, 3)
        assert str(stale.id) in str(refused.value)
        with pytest.raises(RunNotFound):
            engine.events(stale.id)
        assert engine.store.last(stale.id) is None

    def test_a_batch_is_refused_whole(self, engine: Engine) -> None:
        """A batch of a stale handle writes none of its events."""
        stale = erased_behind(engine, engine)
        with pytest.raises(RunErased), stale.batch():
            stale.stage_completed("code_review")
            stale.stage_completed("developer")
        assert engine.store.last(stale.id) is None

    def test_an_engine_of_another_process_is_refused(self, shared_url: str) -> None:
        """A handle read by one engine, its run erased by another on the same store: refused."""
        with Engine(shared_url) as engine, Engine(shared_url) as other:
            stale = erased_behind(engine, other)
            with pytest.raises(RunErased):
                stale.stage_completed("code_review")
            assert engine.store.last(stale.id) is None
            assert other.store.last(stale.id) is None

    def test_a_long_batch_is_refused_whole(self, engine: Engine) -> None:
        """A batch longer than one INSERT statement is checked too and writes nothing."""
        stale = erased_behind(engine, engine)
        with pytest.raises(RunErased), stale.batch():
            for index in range(250):
                stale.note(f"n{index}", index)
        assert engine.store.last(stale.id) is None

    @pytest.mark.parametrize("how", ["started", "loaded", "long batch", "async"])
    def test_a_new_run_under_the_same_id_is_never_appended_to(
        self, shared_url: str, how: str
    ) -> None:
        """A stale handle whose erased run's id names a new run, as long as it was: refused,
        the new run left as it is (the handle began the run, or loaded it; a batch longer
        than one INSERT; an async batch through the group committer)."""
        import asyncio

        with Engine(shared_url) as engine, Engine(shared_url) as other:
            stale = engine.start_run(REVIEW, params={"card": "C-9"})
            stale.stage_completed("project_analysis")
            if how == "loaded":
                stale = engine.load(stale.id)
            other.load(stale.id).finish("deleted")
            other.compact()
            again = other.start_run(REVIEW, params={"card": "new"}, run_id=stale.id)
            again.note("n", 1)
            assert again.version == stale.version  # the stale handle's next version is free
            before = [e.version for e in other.events(stale.id)]
            with pytest.raises(RunErased) as refused:
                if how == "long batch":
                    with stale.batch():
                        for index in range(250):
                            stale.note(f"n{index}", index)
                elif how == "async":

                    async def late() -> None:
                        async with stale.batch():
                            stale.stage_completed("code_review")

                    asyncio.run(late())
                else:
                    stale.stage_completed("code_review")
            assert refused.value.run_id == stale.id
            assert [e.version for e in other.events(stale.id)] == before
            with pytest.raises(RunErased):
                stale.refresh()  # nor does it fold the new run's events into its own
            again.note("n", 2)  # the new run goes on
            assert other.verify(stale.id).ok

    def test_a_memory_store_refuses_it_too(self) -> None:
        """The memory store checks the bytes of the event before a batch as well."""
        with Engine("memory://") as engine:
            stale = erased_behind(engine, engine)
            engine.start_run(REVIEW, params={"card": "new"}, run_id=stale.id).note("n", 1)
            with pytest.raises(RunErased):
                stale.stage_completed("code_review")
            assert [e.version for e in engine.events(stale.id)] == [1, 2]

    def test_live_runs_still_append(self, engine: Engine) -> None:
        """Handles of runs that were not erased go on appending after a compaction."""
        kept = engine.start_run(REVIEW, params={"card": "C-1"})
        erased_behind(engine, engine)
        kept.stage_completed("project_analysis")
        with kept.batch():
            for index in range(250):
                kept.note(f"n{index}", index)
        assert [event.version for event in engine.events(kept.id)][-1] == 252


class InOrder(Projection[int]):
    """A run's newest version, refusing an event but its deletion (which may end a run
    anywhere) that does not follow the one before (as a handler relying on the events before
    it would fail)."""

    scope = "run"

    def initial(self) -> int:
        return 0

    def apply(self, state: int, event: Event) -> int:
        closes = isinstance(event, RunFinished) and event.version > state
        if event.version != state + 1 and not closes:
            raise ProjectionError(self.name, event, ValueError(f"after {state}"))
        return event.version


HALF = 31
"""Events of the half-erased run: 29 notes between its RunStarted and its deletion."""
FIRST_ERASE = 7
"""Events the first erase transaction removes (PostgreSQL bounded to this in these tests)."""


def half_erased(url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[UUID, UUID]:
    """A kept run, and a deleted run whose erase stopped after its first transaction: on
    PostgreSQL a compaction killed between two; SQLite erases a run in one transaction, so
    the rows that first transaction removes are deleted by plain SQL, as a crash would
    leave them."""
    with Engine(url) as engine:
        kept = engine.start_run(LOOP)
        kept.stage_failed("a", error="x")
        doomed = engine.start_run(LOOP)
        with doomed.batch():
            for index in range(HALF - 2):
                doomed.note(f"n{index}", index)
        doomed.finish("deleted")
        engine.runs()  # the index folded the deletion, as compact has it first
        if url.startswith("sqlite"):
            rows = Rows(url)
            for version in range(HALF - FIRST_ERASE, HALF):
                rows.delete(doomed.id, version)
            return kept.id, doomed.id
        monkeypatch.setattr(postgres_open, "ERASE_EVENTS", FIRST_ERASE)
        compact_killed_after_first_erase(engine, monkeypatch)
        return kept.id, doomed.id


class TestHalfErasedRun:
    def test_every_reader_refuses_it_with_one_clear_error(
        self, shared_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Loading, reading, time travel, trees, forks and verify refuse a run being erased."""
        kept, doomed = half_erased(shared_url, monkeypatch)
        with Engine(shared_url) as engine:
            readers: list[Callable[[], object]] = [
                lambda: engine.load(doomed),
                lambda: engine.events(doomed),
                lambda: engine.events(doomed, upto=2),
                lambda: engine.project(doomed, StateStack),
                lambda: engine.project(doomed, StateStack, at=HALF - 1),  # erased already
                lambda: engine.tree(doomed),
                lambda: engine.fork(doomed, at=2),
                lambda: engine.verify(doomed),
                lambda: engine.verify(doomed, chain_only=True),
                lambda: list(engine.store.stream(doomed)),
                lambda: TaskTable().fold(engine.store.stream(doomed)),  # narrowed: no notes
                lambda: engine.store.last(doomed),
            ]
            for read in readers:
                with pytest.raises(RunBeingErased) as refused:
                    read()
                assert refused.value.run_id == doomed
                assert isinstance(refused.value, RunErased)
                assert "being erased" in str(refused.value)
            assert engine.verify(kept).ok
            assert len(engine.events(kept)) == 2
            # time travel to before the first erased event: its history to there is whole
            assert engine.project(doomed, StateStack, at=2).depth == 0

    def test_lists_show_it_deleted_and_every_run_commands_leave_it_out(
        self, shared_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The index lists it as deleted (folded again too); verify --all, export --all and
        otel --all pass over it; commands and the viewer naming it fail with one line."""
        kept, doomed = half_erased(shared_url, monkeypatch)
        with Engine(shared_url) as engine:
            engine.projections.rebuild("run_index")
            assert {s.run_id: s.status for s in engine.runs()} == {
                kept: "running",
                doomed: "deleted",
            }
        verified = invoke("verify", "--all", "--store", shared_url)
        assert verified.exit_code == 0, verified.output
        assert verified.output.startswith("1 runs, 2 events: no problems")
        exported = invoke("export", "--all", "--store", shared_url)
        assert exported.exit_code == 0, exported.output
        assert {line.split('"')[3] for line in exported.stdout.splitlines()} == {str(kept)}
        traced = invoke("otel", "--all", "--json", "--store", shared_url)
        assert traced.exit_code == 0, traced.output
        assert str(kept).replace("-", "") in traced.stdout.replace("-", "")
        assert str(doomed).replace("-", "") not in traced.stdout.replace("-", "")
        with TestClient(create_app(shared_url), base_url="http://127.0.0.1") as viewer:
            for path in (f"/api/runs/{doomed}/state?at=2", f"/api/runs/{doomed}/events"):
                answer = viewer.get(path)
                assert answer.status_code == 410, (path, answer.text)
                assert "being erased" in answer.json()["error"]
            assert viewer.get(f"/runs/{doomed}").status_code == 410
            assert viewer.get(f"/api/runs/{kept}/state?at=1").status_code == 200
        for command in ("export", "show", "verify", "state", "otel"):
            refused = invoke(command, str(doomed), "--store", shared_url)
            assert refused.exit_code != 0
            assert "being erased" in refused.output, (command, refused.output)

    def test_projections_folded_again_see_a_history_it_had_and_compact_finishes(
        self, shared_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A projection folded from the first event meanwhile sees the run's beginning, no
        hole, and forgets it; a later compaction erases the rest."""
        _, doomed = half_erased(shared_url, monkeypatch)
        with Engine(shared_url) as engine:
            engine.projections.register(InOrder)
            engine.projections.rebuild(InOrder.name)
            assert engine.projections.views.errors()[InOrder.name] is None
            assert engine.projections.get(InOrder.name, doomed) == HALF
            patterns = engine.projections.rebuild("failure_patterns")
            assert patterns > 0
            done = engine.compact()
            assert (done.runs, done.events) == ((doomed,), HALF - FIRST_ERASE)
            assert engine.runs(status="deleted") == []
            with pytest.raises(RunNotFound):
                engine.load(doomed)
            assert engine.projections.get(InOrder.name, doomed) == 0


def child_being_erased(url: str) -> tuple[UUID, UUID]:
    """A live parent run and its deleted child whose erase has begun (its newest events
    before its deletion gone, as a compaction killed between two transactions leaves it)."""
    with Engine(url) as engine:
        parent = engine.start_run(REVIEW, params={"card": "parent"})
        parent.stage_completed("project_analysis")
        child = engine.start_run(REVIEW, params={"card": "child"}, parent=parent)
        with child.batch():
            for index in range(HALF - 2):
                child.note(f"n{index}", index)
        child.finish("deleted")
        engine.runs()
    rows = Rows(url)
    for version in range(HALF - FIRST_ERASE, HALF):
        rows.delete(child.id, version)
    return parent.id, child.id


class TestChildBeingErased:
    def test_a_live_parents_tree_passes_over_it(self, shared_url: str) -> None:
        """A live run stays readable as a tree while a deleted child of it is being erased:
        the tree leaves the child out (as it will once erased), so tree projections,
        resuming the tree and the commands exporting it answer for the parent."""
        parent, child = child_being_erased(shared_url)
        with Engine(shared_url) as engine:
            with pytest.raises(RunBeingErased):
                engine.load(child)
            assert engine.tree(parent) == [parent]
            assert engine.project(parent, StateStack, tree=True).depth >= 0
            assert engine.resume(parent, tree=True).id == parent
        for command in (("otel", str(parent), "--json"), ("otel", "--all", "--json")):
            exported = invoke(*command, "--store", shared_url)
            assert exported.exit_code == 0, (command, exported.output)
            assert str(parent).replace("-", "") in exported.stdout.replace("-", "")
            assert str(child).replace("-", "") not in exported.stdout.replace("-", "")
        shown = invoke("state", str(parent), "--tree", "--store", shared_url)
        assert shown.exit_code == 0, shown.output


class TestEraseBeganDuringAnExport:
    @pytest.mark.parametrize("command", ["export", "otel"])
    def test_every_run_commands_pass_over_it(
        self, shared_url: str, monkeypatch: pytest.MonkeyPatch, command: str
    ) -> None:
        """A run whose erase begins after `--all` listed it whole (a compaction running
        meanwhile) is passed over when the command reaches it, as one erased already is,
        and the other runs are exported."""
        from engine.cli import export_import
        from engine.cli import otel as otel_command

        kept, doomed = half_erased(shared_url, monkeypatch)
        for module in (export_import, otel_command):  # listed before the erase began
            monkeypatch.setattr(module, "whole", lambda engine, run_id: True)
        arguments = ("--json",) if command == "otel" else ()
        exported = invoke(command, "--all", *arguments, "--store", shared_url)
        assert exported.exit_code == 0, exported.output
        assert str(kept).replace("-", "") in exported.stdout.replace("-", "")
        assert str(doomed).replace("-", "") not in exported.stdout.replace("-", "")
        named = invoke(command, str(doomed), *arguments, "--store", shared_url)
        assert named.exit_code != 0  # a run named is still refused
        assert "being erased" in named.output


def long_deleted_run(url: str) -> tuple[UUID, UUID]:
    """A kept run of two events, and a deleted run a page and a bit long, not erased yet."""
    with Engine(url) as engine:
        kept = engine.start_run(LOOP)
        kept.stage_failed("a", error="x")
        doomed = engine.start_run(LOOP)
        with doomed.batch():
            for index in range(PAGE + 10):
                doomed.note(f"n{index}", index)
        doomed.finish("deleted")
        return kept.id, doomed.id


class TestEraseDuringAnExport:
    def test_a_run_named_is_refused_and_none_of_it_written(
        self, shared_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """A run named to export that a compaction erases between two of its pages is refused,
        naming it, and no line of it is written (its first page, ending in a chain head,
        would import as the whole run); the run before it is written whole."""
        kept, doomed = long_deleted_run(shared_url)
        erased_after_its_first_page(shared_url, doomed, monkeypatch)
        exported = invoke("export", str(kept), str(doomed), "--store", shared_url)
        assert exported.exit_code != 0
        assert f"run {doomed} was deleted and erased" in exported.stderr
        assert "while it was read" in exported.stderr
        lines = exported.stdout.splitlines()
        assert [json.loads(line)["run_id"] for line in lines] == [str(kept)] * 2
        path = tmp_path / "export.jsonl"
        path.write_text(exported.stdout)
        with Engine(f"sqlite:///{tmp_path / 'copy.db'}") as copy:
            export_import.import_runs(copy, str(path), as_json=True)
            assert copy.store.last(doomed) is None

    def test_the_api_raises_run_erased_while_read(
        self, shared_url: str, monkeypatch: pytest.MonkeyPatch, capsysbinary: Any
    ) -> None:
        """`export_runs` raises `RunErasedWhileRead` (a `RunErased`, a `LookupError`) with the
        run and the first version it no longer found."""
        _, doomed = long_deleted_run(shared_url)
        erased_after_its_first_page(shared_url, doomed, monkeypatch)
        with Engine(shared_url) as engine, pytest.raises(RunErasedWhileRead) as refused:
            export_import.export_runs(engine, [doomed])
        assert (refused.value.run_id, refused.value.version) == (doomed, PAGE + 1)
        assert isinstance(refused.value, RunErased)
        assert isinstance(refused.value, LookupError)
        assert capsysbinary.readouterr().out == b""

    def test_a_run_whose_id_names_a_new_run_by_its_second_page_is_refused(
        self, shared_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A run erased between two pages of its export, and its id given to a new run as
        long before the next page is read, is refused: no export mixes the two runs."""
        _, doomed = long_deleted_run(shared_url)
        streamed = Store.stream

        def reused(store: Store, run_id: UUID, **pages: Any) -> Iterator[Event]:
            for event in streamed(store, run_id, **pages):
                yield event
                if event.version == PAGE:
                    with Engine(shared_url) as other:
                        assert other.compact().runs == (doomed,)
                        run = other.start_run(LOOP, run_id=doomed)
                        with run.batch():
                            for index in range(PAGE + 20):
                                run.note(f"new {index}", index)

        monkeypatch.setattr(Store, "stream", reused)
        exported = invoke("export", str(doomed), "--store", shared_url)
        assert exported.exit_code != 0
        assert f"run {doomed} was deleted and erased" in exported.stderr
        assert exported.stdout == ""

    def test_a_run_growing_while_another_is_erased_is_exported_whole(
        self, shared_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """A run exported while a compaction erases another run between two of its pages,
        and events are appended to it meanwhile, is not refused: it is written whole as
        read, and imports."""
        _, doomed = long_deleted_run(shared_url)
        with Engine(shared_url) as engine:
            grown = engine.start_run(LOOP)
            with grown.batch():
                for index in range(PAGE + 10):
                    grown.note(f"n{index}", index)
        streamed = Store.stream
        done: list[Event] = []

        def meanwhile(store: Store, run_id: UUID, **pages: Any) -> Iterator[Event]:
            for event in streamed(store, run_id, **pages):
                yield event
                if run_id == grown.id and event.version == PAGE and not done:
                    done.append(event)  # once: the other engine's reads stream it too
                    with Engine(shared_url) as other:
                        assert other.compact().runs == (doomed,)
                        other.resume(grown.id).note("later", 1)

        monkeypatch.setattr(Store, "stream", meanwhile)
        exported = invoke("export", str(grown.id), "--store", shared_url)
        assert exported.exit_code == 0, exported.output
        versions = [json.loads(line)["version"] for line in exported.stdout.splitlines()]
        assert len(versions) >= PAGE + 11
        assert versions == list(range(1, len(versions) + 1))
        path = tmp_path / "export.jsonl"
        path.write_text(exported.stdout)
        monkeypatch.undo()
        with Engine(f"sqlite:///{tmp_path / 'copy.db'}") as copy:
            export_import.import_runs(copy, str(path), as_json=True)
            assert len(copy.events(grown.id)) == len(versions)

    def test_every_run_passes_over_it(
        self, shared_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With --all, a run erased between two of its pages is passed over, none of it
        written, and the other runs are exported."""
        kept, doomed = long_deleted_run(shared_url)
        erased_after_its_first_page(shared_url, doomed, monkeypatch)
        exported = invoke("export", "--all", "--store", shared_url)
        assert exported.exit_code == 0, exported.output
        runs = {json.loads(line)["run_id"] for line in exported.stdout.splitlines()}
        assert runs == {str(kept)}


class TestExportReadsTheGenerationOnce:
    def test_every_run_reads_it_once_a_run(
        self, shared_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`export --all` reads the store's erasure generation once a run, not before and
        after each: the one read after a run stands for the next run's start (it only
        counts up), so twice as many runs cost one read a run more."""
        reads: list[int] = []
        generation = Store.generation

        def counted(store: Store) -> int:
            reads.append(1)
            return generation(store)

        def exported(runs: int) -> int:
            with Engine(shared_url) as engine:
                for index in range(runs - len(engine.runs())):
                    engine.start_run(LOOP).stage_failed("a", error=f"e{index}")
            reads.clear()
            monkeypatch.setattr(Store, "generation", counted)
            result = invoke("export", "--all", "--store", shared_url)
            monkeypatch.undo()
            assert result.exit_code == 0, result.output
            assert len({json.loads(line)["run_id"] for line in result.stdout.splitlines()}) == runs
            return len(reads)

        six = exported(6)
        assert exported(12) - six == 6


class TestStaleHandleAtTheEraseBoundary:
    def test_a_stale_handle_never_fills_the_hole_of_a_run_being_erased(
        self, shared_url: str
    ) -> None:
        """A handle of a run deleted and partly erased since, whose newest event is the last
        one kept below the erased ones, is refused: nothing is written into the hole (each
        append requires the event before it to be its run's newest)."""
        with Engine(shared_url) as engine, Engine(shared_url) as other:
            run = engine.start_run(LOOP)
            with run.batch():
                for index in range(HALF - FIRST_ERASE - 2):
                    run.note(f"n{index}", index)
            stale = engine.load(run.id)  # its newest event: HALF - FIRST_ERASE - 1
            writer = other.load(run.id)
            with writer.batch():
                for index in range(FIRST_ERASE):
                    writer.note(f"m{index}", index)
            writer.finish("deleted")
            rows = Rows(shared_url)
            for version in range(HALF - FIRST_ERASE, HALF):  # newest first, as PostgreSQL
                rows.delete(run.id, version)
            with pytest.raises(RunErased):
                stale.note("late", 1)
            with pytest.raises(RunBeingErased):
                other.events(run.id)
