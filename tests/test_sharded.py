"""Several stores as one: each run in exactly one shard, every shard read as one store."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import attrs
import pytest

from engine import Engine, arguments
from engine.cli.demo import supervised_review
from engine.cli.demo.code_review import REVIEW, record_abandoned, record_review
from engine.errors import ConcurrencyConflict, RunAlreadyExists, StoreError
from engine.sharded import ShardedEngine, open_engine
from engine.store.shards import shard_index
from engine.store.views import RunQuery
from events import INTERRUPTED, Event, RunStarted, StageCompleted, StageFailed
from projections import Projection, RunIndex, StateStack, on
from tests._helpers import POSTGRES_URL, require_postgres
from tests.cli._helpers import invoke, ok

LAYOUTS = ["sqlite-files", "postgres-schemas", "postgres-databases"]


def layout_file(tmp_path: Path, stores: list[str], extra: str = "") -> str:
    """A ``shards:`` URL for a layout of `stores` (named a, b, ...) plus `extra` lines."""
    lines = [f'{chr(ord("a") + i)} = "{url}"' for i, url in enumerate(stores)]
    path = tmp_path / "shards.toml"
    path.write_text(extra + "\n[shards]\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return f"shards://{path}"


@pytest.fixture
def second_database() -> Iterator[str]:
    """A PostgreSQL store URL in a database of its own, dropped after the test."""
    require_postgres()
    import psycopg
    from psycopg import sql

    name = f"t_shard_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        conn.execute(drop)


@pytest.fixture(params=LAYOUTS)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    """Two shard stores: two SQLite files, two schemas, or two PostgreSQL databases."""
    if request.param == "sqlite-files":
        return [f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"]
    first = str(request.getfixturevalue("postgres_url"))
    if request.param == "postgres-schemas":
        return [first, f"{POSTGRES_URL}?schema=t_{uuid.uuid4().hex[:16]}"]
    return [first, str(request.getfixturevalue("second_database"))]


@pytest.fixture
def sharded_url(tmp_path: Path, stores: list[str]) -> Iterator[str]:
    """A ``shards:`` URL over the two stores, routing pipeline ``code-review`` to shard b."""
    url = layout_file(tmp_path, stores, 'by = "pipeline"\n[routes]\ncode-review = "b"\n')
    yield url
    if "schema=t_" in stores[1] and stores[1].startswith("postgresql"):
        _drop_schema(stores[1].rsplit("schema=", 1)[1])


def _drop_schema(schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def sharded(sharded_url: str) -> Iterator[ShardedEngine]:
    """A sharded engine over the two stores."""
    with ShardedEngine(sharded_url) as opened:
        yield opened


def id_in(shard: int, count: int = 2) -> UUID:
    """A random run id whose hash puts it in `shard`."""
    while True:
        drawn = uuid.uuid4()
        if shard_index(drawn, count) == shard:
            return drawn


def key_in(sharded: ShardedEngine, parent: UUID, shard: int) -> str:
    """A child key whose derived run id lives in `shard`."""
    keys = (f"k{n}" for n in range(1000))
    return next(k for k in keys if sharded.layout.index_of(uuid.uuid5(parent, k)) == shard)


class TestPlacement:
    def test_each_run_is_written_to_exactly_one_shard(
        self, sharded: ShardedEngine, stores: list[str]
    ) -> None:
        """Opened one by one, each store holds exactly the runs whose id hashes to it."""
        ids = [sharded.start_run(REVIEW, run_id=id_in(n % 2)).id for n in range(6)]
        sharded.close()
        for index, url in enumerate(stores):
            with Engine(url, create=False) as shard:
                held = {i for i in ids if shard.store.last(i) is not None}
            assert held == {i for i in ids if shard_index(i, 2) == index}

    def test_a_routed_pipeline_goes_to_its_shard(self, sharded: ShardedEngine) -> None:
        """``code-review`` is routed to shard b; every new run of it is there."""
        runs = [record_review(sharded, f"C-{n}") for n in range(4)]  # type: ignore[arg-type]
        assert {sharded.layout.index_of(run.id) for run in runs} == {1}

    def test_a_run_id_taken_in_its_shard_is_refused(self, sharded: ShardedEngine) -> None:
        """A chosen id goes to its hash's shard, whose unique key refuses it twice."""
        chosen = id_in(0)
        sharded.start_run(REVIEW, run_id=chosen)
        with pytest.raises(RunAlreadyExists):
            sharded.start_run(REVIEW, run_id=chosen)

    def test_two_writers_of_one_run_conflict_as_in_one_store(
        self, sharded: ShardedEngine, sharded_url: str
    ) -> None:
        """Per-run optimistic concurrency holds: the second writer of a version is refused."""
        run = sharded.start_run(REVIEW)
        with ShardedEngine(sharded_url) as other:
            theirs = other.load(run.id)
            run.stage_completed("project_analysis")
            with pytest.raises(ConcurrencyConflict):
                theirs.stage_completed("project_analysis")
        assert len(sharded.events(run.id)) == 2


class TestReadView:
    def test_runs_lists_every_shard_newest_first(self, sharded: ShardedEngine) -> None:
        """The listing is the union of the shards, in the run index's order."""
        ids = [sharded.start_run(REVIEW, run_id=id_in(n % 2)).id for n in range(5)]
        listed = [summary.run_id for summary in sharded.runs()]
        assert listed == list(reversed(ids))

    def test_pages_cover_the_union_once(self, sharded: ShardedEngine) -> None:
        """Pages of 3 over 8 runs in two shards give each run once, in order."""
        for n in range(8):
            sharded.start_run(REVIEW, run_id=id_in(n % 3 % 2))
        whole = [s.run_id for s in sharded.runs()]
        paged = [s.run_id for o in range(0, 9, 3) for s in sharded.runs(limit=3, offset=o)]
        assert paged == whole
        assert len(whole) == 8

    def test_filters_apply_in_every_shard(self, sharded: ShardedEngine) -> None:
        """Status and label filters select across both shards."""
        done = record_review(sharded, "C-1").id  # type: ignore[arg-type]
        failed = record_abandoned(sharded, "C-2").id  # type: ignore[arg-type]
        other = sharded.start_run(REVIEW, labels={"team": "x"}, run_id=id_in(0)).id
        assert [s.run_id for s in sharded.runs(status="succeeded")] == [done]
        assert [s.run_id for s in sharded.runs(status="failed")] == [failed]
        assert [s.run_id for s in sharded.runs(label="team=x")] == [other]

    def test_the_generation_grows_when_any_shard_erases(self, sharded: ShardedEngine) -> None:
        """The store's erasure generation (keying caches) changes when either shard erases."""
        before = sharded.store.generation()
        for shard in (0, 1):
            run = sharded.start_run(REVIEW, run_id=id_in(shard))
            sharded.shards[shard].store.erase([run.id])
            after = sharded.store.generation()
            assert after > before
            before = after

    def test_a_run_is_read_from_its_shard(self, sharded: ShardedEngine) -> None:
        """load, events, project and verify find a run wherever it lives."""
        run = record_review(sharded, "C-9")  # type: ignore[arg-type]
        assert sharded.load(run.id).state == "done"
        assert len(sharded.events(str(run.id))) == run.version
        assert sharded.project(run.id, StateStack, at=3).current == "code_review"
        assert sharded.verify(run.id).problems == ()
        summary = sharded.projections.get(RunIndex.name, run.id)
        assert summary.status == "succeeded"


class TestDeepPages:
    @pytest.mark.parametrize("routes", ["", 'by = "pipeline"\n[routes]\ncode-review = "b"\n'])
    def test_every_page_is_the_slice_of_the_whole_listing(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, routes: str
    ) -> None:
        """Deep pages equal the whole listing's slices, evenly spread or all in one shard."""
        stores = [f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"]
        with ShardedEngine(layout_file(tmp_path, stores, routes)) as sharded:
            for _ in range(150):
                sharded.start_run(REVIEW)
            whole = [s.run_id for s in sharded.runs(limit=200)]
            asked = _spy_limits(sharded, monkeypatch)
            for offset in range(0, 150, 7):
                page = [s.run_id for s in sharded.runs(limit=5, offset=offset)]
                assert page == whole[offset : offset + 5], offset
        first_rows = sum(2 * (offset + 5) for offset in range(0, 150, 7))
        # Evenly spread, the shards are read near the page; all in one shard, a row at a
        # time until each shard's share of the offset is known: neither from the top.
        assert sum(asked) < first_rows

    def test_a_deep_page_of_runs_all_in_one_shard_reads_few_rows(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With every run in shard b, a deep page reads O(sqrt(offset)) rows, not 2 x offset."""
        stores = [f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"]
        routes = 'by = "pipeline"\n[routes]\ncode-review = "b"\n'
        with ShardedEngine(layout_file(tmp_path, stores, routes)) as sharded:
            for _ in range(200):
                sharded.start_run(REVIEW)
            whole = [s.run_id for s in sharded.runs(limit=300)]
            asked = _spy_limits(sharded, monkeypatch)
            for offset in (190, 198, 200):
                asked.clear()
                page = [s.run_id for s in sharded.runs(limit=5, offset=offset)]
                assert page == whole[offset : offset + 5]
                # Per shard: the window tried first (8 sqrt(offset / 2) + 13 rows), about
                # 2 log2(offset) one-row asks, then a page of 5; the old read took offset + 5.
                window = 8 * math.isqrt(offset // 2) + 13
                assert sum(asked) <= 2 * (window + 2 * 8 + 5) < 2 * (offset + 5), offset

    def test_the_largest_offset_and_limit_give_a_page_not_an_overflow(
        self, sharded: ShardedEngine
    ) -> None:
        """offset and limit up to 2**63 - 1 (what `runs` takes) answer pages, never overflow."""
        ids = [sharded.start_run(REVIEW, run_id=id_in(n % 2)).id for n in range(3)]
        assert sharded.runs(offset=arguments.MAX_INT) == []
        assert sharded.runs(limit=arguments.MAX_INT, offset=arguments.MAX_INT) == []
        assert [s.run_id for s in sharded.runs(limit=arguments.MAX_INT, offset=1)] == [
            ids[1],
            ids[0],
        ]

    def test_a_page_past_the_end_is_empty(self, sharded: ShardedEngine) -> None:
        """An offset beyond every run gives an empty page."""
        sharded.start_run(REVIEW, run_id=id_in(0))
        assert sharded.runs(limit=5, offset=500) == []


def _spy_limits(sharded: ShardedEngine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many rows each shard's run index is asked for, call by call, from now on."""
    asked: list[int] = []
    for shard in sharded.shards:
        real = shard.projections.runs

        def spy(query: RunQuery, real: Any = real) -> Any:
            asked.append(query.limit)
            return real(query)

        monkeypatch.setattr(shard.projections, "runs", spy)
    return asked


class TestLineage:
    def test_a_child_in_another_shard_is_in_its_parents_tree(self, sharded: ShardedEngine) -> None:
        """A child hashed to the other shard is found, listed and folded with its parent."""
        parent = sharded.start_run(REVIEW, run_id=id_in(0))
        key = key_in(sharded, parent.id, 1)
        child = sharded.child_run(parent, REVIEW, key=key)
        child.stage_completed("project_analysis")
        assert sharded.layout.index_of(child.id) == 1
        assert sharded.child_run(parent.id, REVIEW, key=key).id == child.id  # found, not started
        assert sharded.tree(parent.id) == [parent.id, child.id]
        assert [s.run_id for s in sharded.runs(parent=parent.id)] == [child.id]
        assert sharded.project(parent.id, _Runs, tree=True) == (parent.id, child.id, child.id)

    def test_a_fork_into_another_shard_keeps_its_origin(self, sharded: ShardedEngine) -> None:
        """A fork written to the other shard copies the history and names the origin."""
        origin = record_abandoned(sharded, "C-5")  # type: ignore[arg-type]
        target = 1 - sharded.layout.index_of(origin.id)
        fork = sharded.fork(origin.id, at=3, new_run_id=id_in(target))
        first = sharded.events(fork.id, upto=1)[0]
        assert isinstance(first, RunStarted)
        assert first.forked_from == (origin.id, 3)
        assert [type(e) for e in sharded.events(fork.id)] == [
            type(e) for e in sharded.events(origin.id, upto=3)
        ]
        routed = sharded.fork(origin.id, at=2)  # a new id follows the pipeline's route
        assert sharded.layout.index_of(routed.id) == 1

    def test_resume_of_a_tree_reaches_a_child_in_another_shard(
        self, sharded: ShardedEngine
    ) -> None:
        """An interrupted child in the other shard is closed by resuming its parent's tree."""
        parent = sharded.start_run(REVIEW, run_id=id_in(0))
        child = sharded.child_run(parent, REVIEW, key=key_in(sharded, parent.id, 1))
        child.stage_completed("project_analysis")
        child.stage_completed("code_review")
        child.stage_started("developer")
        sharded.resume(parent.id, tree=True)
        last = sharded.events(child.id)[-1]
        assert isinstance(last, StageFailed)
        assert last.error_type == INTERRUPTED


class TestSupervisor:
    def test_supervised_runs_are_driven_in_their_shards(self, tmp_path: Path) -> None:
        """A supervisor of the sharded engine drives each run to its end in its own shard."""
        stores = [f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"]
        with ShardedEngine(layout_file(tmp_path, stores)) as sharded:
            driven = supervised_review.record_all(sharded)  # type: ignore[arg-type]
            assert [sharded.load(run.id).state for run in driven] == ["done"] * len(driven)
            assert {s.run_id for s in sharded.runs()} == {run.id for run in driven}


class _Runs(Projection[tuple[UUID, ...]]):
    """The run of every event folded, in order."""

    name = "runs_folded"

    def initial(self) -> tuple[UUID, ...]:
        return ()

    @on(RunStarted, StageCompleted)
    def any_event(self, state: tuple[UUID, ...], event: Event) -> tuple[UUID, ...]:
        return (*state, event.run_id)


class TestLayoutGuard:
    def test_a_reordered_layout_is_refused(self, tmp_path: Path) -> None:
        """Swapping the shards after runs were written is refused, naming a misplaced run."""
        stores = [f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"]
        with ShardedEngine(layout_file(tmp_path, stores)) as sharded:
            sharded.start_run(REVIEW, run_id=id_in(0))
        with pytest.raises(StoreError, match="must keep the order and number"):
            ShardedEngine(layout_file(tmp_path, list(reversed(stores))))

    def test_open_engine_picks_the_kind_of_engine(self, tmp_path: Path) -> None:
        """A store URL opens an Engine, a shards: URL a ShardedEngine."""
        stores = [f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"]
        with open_engine(layout_file(tmp_path, stores), create=True) as sharded:
            assert isinstance(sharded, ShardedEngine)
        with open_engine(stores[0], read_only=True) as single:
            assert isinstance(single, Engine)


class TestCommands:
    def test_runs_show_state_and_replay_read_every_shard(self, sharded: ShardedEngine) -> None:
        """The read commands over a shards: URL see runs of both shards, by id prefix."""
        parent = sharded.start_run(REVIEW, run_id=id_in(0))
        child = sharded.child_run(parent, REVIEW, key=key_in(sharded, parent.id, 1))
        child.stage_completed("project_analysis")
        url = sharded.url
        listed = ok("runs", "--store", url)
        assert str(parent.id)[:8] in listed
        assert str(child.id)[:8] in listed
        assert f"child of {str(parent.id)[:8]}" in ok("show", str(child.id)[:8], "--store", url)
        assert "after event 2 of 2" in ok("state", str(child.id)[:8], "--store", url)
        assert "events 1 to 2" in ok("replay", str(child.id), "--store", url)

    def test_verify_checks_a_run_in_its_shard(self, sharded: ShardedEngine) -> None:
        """``verify`` (``--chain-only``, ``--worker-timeout``, ``--all``) over a shards: URL
        checks the run in its shard."""
        run = record_review(sharded, "C-7")  # type: ignore[arg-type]
        timeout = ["--worker-timeout", "5"]
        for target in ([str(run.id)], ["--all"]):
            for extra in ([], ["--chain-only"], timeout, ["--chain-only", *timeout]):
                result = invoke("verify", *target, "--store", sharded.url, *extra)
                assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
        assert sharded.verify(run.id, chain_only=True, workers=0).chain == "intact"
        assert sharded.verify(run.id, chain_only=True, worker_timeout=5).chain == "intact"

    def test_export_and_import_move_runs_to_a_layout_of_more_shards(self, tmp_path: Path) -> None:
        """Runs exported from 2 shards and imported into 3 land where the new layout puts them."""
        two = [f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"]
        three = [f"sqlite:///{tmp_path / f'n{n}.db'}" for n in range(3)]
        (tmp_path / "new").mkdir()
        with ShardedEngine(layout_file(tmp_path, two)) as old:
            ids = [record_review(old, f"C-{n}").id for n in range(6)]  # type: ignore[arg-type]
            exported = ok("export", "--all", "--store", old.url)
            before = {i: old.events(i) for i in ids}
        (tmp_path / "runs.jsonl").write_text(exported, encoding="utf-8")
        new_url = layout_file(tmp_path / "new", three)
        ok("import", str(tmp_path / "runs.jsonl"), "--store", new_url)
        with ShardedEngine(new_url) as new:
            assert {i: new.events(i) for i in ids} == before
            for index, shard in enumerate(new.shards):
                held = {s.run_id for s in shard.runs()}
                assert held == {i for i in ids if shard_index(i, 3) == index}

    def test_an_older_shard_is_named_in_the_upgrade_notice(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A shard of the text layout makes commands note its upgrade, naming that shard."""
        stores = [f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"]
        url = layout_file(tmp_path, stores)
        monkeypatch.delenv("STAGETRAIL_SQLITE_LAYOUT", raising=False)
        with ShardedEngine(url) as sharded:
            assert sharded.store.upgrade_available == ""
        (tmp_path / "b.db").unlink()
        monkeypatch.setenv("STAGETRAIL_SQLITE_LAYOUT", "text")
        Engine(stores[1]).close()
        monkeypatch.delenv("STAGETRAIL_SQLITE_LAYOUT")
        result = invoke("runs", "--store", url)
        assert result.exit_code == 0, (result.stderr, result.exception)
        notes = [line for line in result.stderr.splitlines() if "stagetrail upgrade" in line]
        assert len(notes) == 1
        assert "shard 'b'" in notes[0]
        assert "b.db" in notes[0]
        assert "shard 'a'" not in notes[0]

    def test_one_append_never_spans_two_shards(self, sharded: ShardedEngine) -> None:
        """The store's append refuses events of runs in different shards, writing none."""
        first = sharded.start_run(REVIEW, run_id=id_in(0))
        second = sharded.start_run(REVIEW, run_id=id_in(1))
        events = [sharded.events(first.id)[0], sharded.events(second.id)[0]]
        moved = [attrs.evolve(e, version=2) for e in events]
        with pytest.raises(StoreError, match="must not span runs of different shards"):
            sharded.store.append(moved)
        assert [len(sharded.events(run.id)) for run in (first, second)] == [1, 1]

    def test_a_one_store_command_names_the_shards(self, sharded: ShardedEngine) -> None:
        """`projections status` works per store: over shards it says to run it per shard."""
        result = invoke("projections", "status", "--store", sharded.url)
        assert result.exit_code != 0
        assert "run it against each shard" in result.stderr
