"""`StagetrailSaver` at its edges: hostile thread ids, unstorable ids and metadata, compaction."""

from __future__ import annotations

import asyncio
import gc
import marshal
import math
import random
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="needs the langgraph extra")

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Interrupt

from benchmarks import langgraph as bench
from benchmarks._common import CountedWrites
from engine import Engine
from engine.errors import InvalidArgument, InvalidPayload, StoreError
from engine.integrations.langgraph import THREAD_LABEL, StagetrailSaver, thread_run_ids
from engine.integrations.langgraph import saver as saver_module
from engine.integrations.langgraph.saver import GENERATION_LABEL, legacy_run_id
from engine.integrations.langgraph.thread import AS_JSON, REFERENCE
from engine.sharded import ShardedEngine
from events import CheckpointSaved, StagetrailError
from tests.audit.tampering import Rows
from tests.integrations.test_langgraph import flaky_graph, invoke_until_done
from tests.test_sharded import layout_file

DONE = {"log": ["plan", "build", "ship"]}


def config(thread_id: str) -> RunnableConfig:
    """The config of a thread's newest checkpoint."""
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


def put_input(saver: StagetrailSaver, thread_id: str, step: int = -1) -> RunnableConfig:
    """Save an empty checkpoint (metadata step `step`) in the thread; the config naming it."""
    return saver.put(config(thread_id), empty_checkpoint(), {"source": "input", "step": step}, {})


class TestThreadIds:
    def test_a_thread_id_with_a_nul_never_reaches_a_reused_threads_run(
        self, shared_url: str
    ) -> None:
        """After thread "a" is deleted and used again, "a\\x001" neither reads, writes nor
        deletes it: it is refused, naming thread_id, and thread "a" is as it was."""
        with Engine(shared_url) as engine:
            saver = StagetrailSaver(engine)
            put_input(saver, "a", step=-1)
            saver.delete_thread("a")
            put_input(saver, "a", step=7)  # thread "a"'s second run
            hostile = "a\x001"
            calls: list[Callable[[], object]] = [
                lambda: saver.get_tuple(config(hostile)),
                lambda: list(saver.list(config(hostile))),
                lambda: put_input(saver, hostile, step=99),
                lambda: saver.delete_thread(hostile),
            ]
            for call in calls:
                with pytest.raises(InvalidArgument) as refused:
                    call()
                assert refused.value.argument == "thread_id"
                assert "NUL" in str(refused.value)
            found = saver.get_tuple(config("a"))
            assert found is not None
            assert found.metadata["step"] == 7
            assert [s.labels[THREAD_LABEL] for s in engine.runs(status="running")] == ["a"]
            assert len(engine.runs()) == 2

    @pytest.mark.parametrize(
        ("thread_id", "problem"),
        [
            ("a\x001", "NUL"),
            ("\x00", "NUL"),
            ("\u00e9\x00", "NUL"),
            ("\udce9", "surrogate"),
            ("\u00e9\ud800", "surrogate"),
            ("\u00e9", None),
            ("a\x7f", None),
        ],
        ids=[
            "ascii-nul",
            "only-nul",
            "non-ascii-nul",
            "surrogate",
            "non-ascii-surrogate",
            "non-ascii",
            "ascii-del",
        ],
    )
    def test_an_id_is_refused_or_taken_whether_ascii_or_not(
        self, sqlite_url: str, thread_id: str, problem: str | None
    ) -> None:
        """A thread id with a NUL or a lone surrogate, ASCII otherwise or not, is one
        InvalidArgument naming thread_id and the problem, nothing written; any other is kept."""
        with Engine(sqlite_url) as engine:
            saver = StagetrailSaver(engine)
            if problem is None:
                put_input(saver, thread_id)
                assert saver.get_tuple(config(thread_id)) is not None
                assert [s.labels[THREAD_LABEL] for s in engine.runs()] == [thread_id]
                return
            with pytest.raises(InvalidArgument, match=problem) as refused:
                put_input(saver, thread_id)
            assert refused.value.argument == "thread_id"
            assert engine.runs() == []

    def test_run_ids_differ_for_every_thread_and_generation(self) -> None:
        """The ids of the first runs of many lookalike thread ids never repeat."""
        threads = ["a", "a\x001", "a\x002", "a\x00", '["a", 1]', '["a",1]', "a1", ""]
        seen: dict[uuid.UUID, tuple[str, int]] = {}
        for thread in threads:
            for generation, run_id in zip(range(4), thread_run_ids(thread), strict=False):
                assert run_id not in seen, (thread, generation, seen.get(run_id))
                seen[run_id] = (thread, generation)

    def test_a_store_written_by_the_first_releases_still_reads(self, shared_url: str) -> None:
        """A thread's second run under the first releases' NUL-joined id is still found, and
        only by its own thread (its label says whose it is)."""
        with Engine(shared_url) as engine:
            saver = StagetrailSaver(engine)
            put_input(saver, "a", step=-1)
            saver.delete_thread("a")
            engine.start_run(
                saver.pipeline,
                params={"thread_id": "a"},
                labels={THREAD_LABEL: "a"},
                run_id=legacy_run_id("a", 1),
            )
            fresh = StagetrailSaver(engine)
            put_input(fresh, "a", step=5)  # lands in the legacy run: it is thread a's
            assert len(engine.events(legacy_run_id("a", 1))) == 2
            assert fresh.get_tuple(config("a")).metadata["step"] == 5  # type: ignore[union-attr]
            fresh.delete_thread("a")
            put_input(fresh, "a", step=6)  # the third run: a new id, not a legacy one
            third = StagetrailSaver(engine).get_tuple(config("a"))
            assert third is not None
            assert third.metadata["step"] == 6
            assert {s.status for s in engine.runs()} == {"deleted", "running"}
            (running,) = engine.runs(status="running")
            assert running.run_id == list(zip(range(3), thread_run_ids("a"), strict=False))[2][1]

    def test_a_legacy_id_labelled_for_another_thread_is_not_read(self, shared_url: str) -> None:
        """A run under a thread's legacy id whose label names another thread is passed over."""
        with Engine(shared_url) as engine:
            saver = StagetrailSaver(engine)
            put_input(saver, "b", step=-1)
            saver.delete_thread("b")
            engine.start_run(
                saver.pipeline,
                params={"thread_id": "other"},
                labels={THREAD_LABEL: "other"},
                run_id=legacy_run_id("b", 1),
            )
            assert StagetrailSaver(engine).get_tuple(config("b")) is None
            put_input(saver, "b", step=3)
            assert len(engine.events(legacy_run_id("b", 1))) == 1
            assert StagetrailSaver(engine).get_tuple(config("b")).metadata["step"] == 3  # type: ignore[union-attr]

    @pytest.mark.parametrize("method", ["put", "get_tuple", "list", "delete_thread"])
    def test_a_thread_id_that_cannot_be_stored_is_refused(
        self, store_url: str, method: str
    ) -> None:
        """A lone surrogate in a thread id is one InvalidArgument naming thread_id; nothing
        is written."""
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine)
            bad = "t\udce9"
            with pytest.raises(InvalidArgument) as refused:
                if method == "put":
                    put_input(saver, bad)
                elif method == "get_tuple":
                    saver.get_tuple(config(bad))
                elif method == "list":
                    list(saver.list(config(bad)))
                else:
                    saver.delete_thread(bad)
            assert refused.value.argument == "thread_id"
            assert "surrogate" in str(refused.value)
            assert engine.runs() == []

    def test_a_checkpoint_id_that_cannot_be_stored_is_refused(self, store_url: str) -> None:
        """A lone surrogate in a checkpoint id is refused naming checkpoint_id; nothing written."""
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine)
            written = put_input(saver, "t")
            (run,) = engine.runs()
            checkpoint: Any = {**empty_checkpoint(), "id": "1f0\udce9"}
            with pytest.raises(InvalidArgument) as refused:
                saver.put(written, checkpoint, {"step": 0}, {})
            assert refused.value.argument == "checkpoint_id"
            bad: RunnableConfig = {"configurable": {**written["configurable"]}}
            bad["configurable"]["checkpoint_id"] = "1f0\udce9"
            with pytest.raises(InvalidArgument):
                saver.put_writes(bad, [("log", 1)], "task-1")
            assert len(engine.events(run.run_id)) == 2

    def test_metadata_nested_too_deep_is_refused(self, store_url: str) -> None:
        """Metadata nested 5,000 deep is one InvalidPayload naming metadata; nothing written."""
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine)
            written = put_input(saver, "t")
            (run,) = engine.runs()
            deep: Any = "bottom"
            for _ in range(5000):
                deep = {"down": deep}
            metadata: Any = {"step": 0, "deep": deep}
            with pytest.raises(InvalidPayload) as refused:
                saver.put(written, empty_checkpoint(), metadata, {})
            assert refused.value.field == "metadata"
            assert isinstance(refused.value, StagetrailError)
            assert len(engine.events(run.run_id)) == 2
            put_input(saver, "t", step=0)
            assert len(engine.events(run.run_id)) == 3


class TestCompaction:
    def test_a_thread_read_while_another_is_deleted_and_compacted(self, shared_url: str) -> None:
        """Readers of a thread get a consistent answer or a stagetrail error, never a raw one,
        while other threads are deleted and compacted under them (a bounded number of times)."""
        builder = flaky_graph(failures=0)
        with Engine(shared_url) as reader_engine, Engine(shared_url) as writer_engine:
            reader = StagetrailSaver(reader_engine, builder)
            writer = StagetrailSaver(writer_engine, builder)
            graph = builder.compile(checkpointer=writer)
            invoke_until_done(graph, config("keep"), tries=1)
            raw: list[BaseException] = []
            answers: list[int] = []
            stop = threading.Event()

            def read() -> None:
                while not stop.is_set():
                    try:
                        history = list(reader.list(config("keep")))
                        answers.append(len(history))
                        for thread in ("doomed", "keep", "doomed"):
                            reader.get_tuple(config(thread))
                            list(reader.list(config("doomed")))
                    except StagetrailError:
                        continue
                    except Exception as error:  # the defect: a raw error escapes
                        raw.append(error)

            reading = threading.Thread(target=read)
            reading.start()
            try:
                for _ in range(12):
                    invoke_until_done(graph, config("doomed"), tries=1)
                    writer.delete_thread("doomed")
                    writer_engine.compact()
            finally:
                stop.set()
                reading.join()
            assert raw == []
            assert answers
            assert set(answers) == {5}
            assert reader.get_tuple(config("doomed")) is None

    def test_a_thread_whose_first_generation_was_compacted_away_is_found(
        self, shared_url: str
    ) -> None:
        """Deleted and used again, then compacted: the thread's live run is served and appended
        to, not hidden behind its erased first run (a new run never takes that id)."""
        with Engine(shared_url) as engine:
            saver = StagetrailSaver(engine, ["a"])
            put_input(saver, "t", step=0)
            saver.delete_thread("t")
            live = put_input(saver, "t", step=7)
            (first,) = engine.compact().runs
            assert first == next(thread_run_ids("t"))
            for reader in (saver, StagetrailSaver(engine, ["a"])):
                served = reader.get_tuple(config("t"))
                assert served is not None
                assert served.config == live
                assert served.metadata["step"] == 7
            put_input(StagetrailSaver(engine, ["a"]), "t", step=8)
            (run,) = engine.runs()
            assert run.run_id != first
            assert run.labels[THREAD_LABEL] == "t"
            assert len(engine.events(run.run_id)) == 3  # RunStarted, steps 7 and 8

    def test_a_deleted_thread_whose_erase_has_begun_starts_afresh(self, shared_url: str) -> None:
        """A deleted thread's run that a compaction has begun erasing (its newest events
        before its deletion gone) reads as deleted: no checkpoint, and the next put starts
        the thread's next run; the next compaction finishes the erase."""
        with Engine(shared_url) as engine:
            saver = StagetrailSaver(engine, ["a"])
            for step in range(5):
                put_input(saver, "t", step=step)
            saver.delete_thread("t")
            (doomed,) = engine.runs()
            rows = Rows(shared_url)
            for version in range(doomed.version - 3, doomed.version):
                rows.delete(doomed.run_id, version)
            for reader in (saver, StagetrailSaver(engine, ["a"])):
                assert reader.get_tuple(config("t")) is None
            put_input(StagetrailSaver(engine, ["a"]), "t", step=9)
            assert engine.compact().runs == (doomed.run_id,)
            (live,) = engine.runs()
            assert live.run_id != doomed.run_id
            served = StagetrailSaver(engine, ["a"]).get_tuple(config("t"))
            assert served is not None
            assert served.metadata["step"] == 9

    def test_a_stale_later_generation_is_never_resumed(self, shared_url: str) -> None:
        """Two generations compacted away under a live third: a fresh saver serves the third,
        and after the third's deletion the thread starts a run of its own, never an old one."""
        with Engine(shared_url) as engine:
            saver = StagetrailSaver(engine, ["a"])
            for step in (0, 1):
                put_input(saver, "t", step=step)
                saver.delete_thread("t")
            put_input(saver, "t", step=2)
            assert len(engine.compact().runs) == 2
            fresh = StagetrailSaver(engine, ["a"])
            served = fresh.get_tuple(config("t"))
            assert served is not None
            assert served.metadata["step"] == 2
            (third,) = engine.runs()
            fresh.delete_thread("t")
            assert fresh.get_tuple(config("t")) is None
            assert StagetrailSaver(engine, ["a"]).get_tuple(config("t")) is None
            put_input(StagetrailSaver(engine, ["a"]), "t", step=3)
            live = [s for s in engine.runs() if s.status != "deleted"]
            assert [s.run_id for s in live] != [third.run_id]
            (fourth,) = live
            assert len(engine.events(fourth.run_id)) == 2  # a new run: RunStarted, step 3
            served = StagetrailSaver(engine, ["a"]).get_tuple(config("t"))
            assert served is not None
            assert served.metadata["step"] == 3

    def test_many_erased_generations_and_a_labelled_fork_are_looked_up_directly(
        self, shared_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A thread deleted and used again 30 times, compacted, with a fork of its live run
        carrying its labels: every saver serves the live run, found by its generation label
        in the run index, not by walking generations (the walk is limited to 5 here)."""
        monkeypatch.setattr(saver_module, "_GAP_SCAN", 5)
        walked: list[int] = []
        run_ids = saver_module._run_ids

        def counted(thread_id: str, generation: int) -> tuple[uuid.UUID, ...]:
            walked.append(generation)
            return run_ids(thread_id, generation)

        monkeypatch.setattr(saver_module, "_run_ids", counted)
        with Engine(shared_url) as engine:
            saver = StagetrailSaver(engine, ["a"])
            for step in range(30):
                put_input(saver, "t", step=step)
                saver.delete_thread("t")
            live = put_input(saver, "t", step=30)
            assert len(engine.compact().runs) == 30
            (run,) = engine.runs()
            assert run.labels[GENERATION_LABEL] == "30"
            engine.fork(run.run_id, at=run.version).finish("succeeded")
            for reader in (saver, StagetrailSaver(engine, ["a"])):
                served = reader.get_tuple(config("t"))
                assert served is not None
                assert served.config == live
                assert served.metadata["step"] == 30
            put_input(StagetrailSaver(engine, ["a"]), "t", step=31)
            assert len(engine.events(run.run_id)) == run.version + 1
            assert walked == []


class TestTransactions:
    def test_a_new_threads_first_checkpoint_is_one_transaction(self, store_url: str) -> None:
        """A thread's run starts in the transaction of its first checkpoint, as many commits
        as LangGraph's own savers make."""
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine, ["a"])
            with CountedWrites(engine.store) as counted:
                put_input(saver, "t", step=-1)
                put_input(saver, "t", step=0)
            kinds = [[stored.topic.split(":")[-1] for stored in batch] for batch in counted.batches]
            assert kinds == [["RunStarted", "CheckpointSaved"], ["CheckpointSaved"]]
            (run,) = engine.runs()
            assert engine.verify(run.run_id).ok

    def test_a_refused_first_checkpoint_writes_no_run(self, store_url: str) -> None:
        """A new thread's first put refused (its blob over max_event_bytes) leaves no run
        behind, not an empty one; the next put starts the run in its own transaction."""
        with Engine(store_url, max_event_bytes=4096) as engine:
            saver = StagetrailSaver(engine)
            big: Any = {**empty_checkpoint(), "channel_values": {"big": "x" * 10_000}}
            with pytest.raises(InvalidPayload, match="'blobs'"):
                saver.put(config("t"), big, {"source": "input", "step": -1}, {"big": "1"})
            assert engine.runs() == []
            with CountedWrites(engine.store) as counted:
                put_input(saver, "t")
            kinds = [[stored.topic.split(":")[-1] for stored in batch] for batch in counted.batches]
            assert kinds == [["RunStarted", "CheckpointSaved"]]


class TestReadsPerAppend:
    def test_a_put_after_this_savers_own_write_reads_no_erasure_generation(
        self, store_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Once the saver wrote a thread's newest event, its next puts read no erasure
        generation (the store's check of that event's bytes refuses a stale append)."""
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine, ["a"])
            put_input(saver, "t", step=0)
            reads: list[int] = []
            generation = engine.store.generation

            def counted() -> int:
                reads.append(1)
                return generation()

            monkeypatch.setattr(engine.store, "generation", counted)
            for step in range(1, 4):
                put_input(saver, "t", step=step)
            assert reads == []
            served = saver.get_tuple(config("t"))
            assert served is not None
            assert served.metadata["step"] == 3

    def test_a_read_of_a_cached_thread_looks_at_the_erasure_generation_once(
        self, store_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`get_tuple` and `list` on a thread the saver holds read the store's erasure
        generation once each, after reading (not once before and once after)."""
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine, ["a"])
            put_input(saver, "t", step=0)
            assert saver.get_tuple(config("t")) is not None
            reads: list[int] = []
            generation = engine.store.generation

            def counted() -> int:
                reads.append(1)
                return generation()

            monkeypatch.setattr(engine.store, "generation", counted)
            served = saver.get_tuple(config("t"))
            assert served is not None
            assert served.metadata["step"] == 0
            assert len(reads) == 1
            assert len(list(saver.list(config("t")))) == 1
            assert len(reads) == 2


class TestNewestCheckpoint:
    def test_the_newest_checkpoint_is_found_again_after_the_newest_is_removed(
        self, store_url: str
    ) -> None:
        """With the newest checkpoint removed (`delete_for_runs`), the thread's newest is the
        one before it, and a checkpoint put after that is the newest again."""
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine, ["a"])
            ids = []
            for step in range(3):
                metadata: Any = {"source": "input", "step": step, "run_id": f"run-{step}"}
                saved = saver.put(config("t"), empty_checkpoint(), metadata, {})
                ids.append(saved["configurable"]["checkpoint_id"])
            newest = saver.get_tuple(config("t"))
            assert newest is not None
            assert newest.checkpoint["id"] == ids[2]
            saver.delete_for_runs(["run-2"])
            newest = saver.get_tuple(config("t"))
            assert newest is not None
            assert newest.checkpoint["id"] == ids[1]
            later = put_input(saver, "t", step=3)["configurable"]["checkpoint_id"]
            newest = saver.get_tuple(config("t"))
            assert newest is not None
            assert newest.checkpoint["id"] == later
            fresh = StagetrailSaver(engine, ["a"]).get_tuple(config("t"))
            assert fresh is not None
            assert fresh.checkpoint["id"] == later


class TestOwnFold:
    def test_what_the_saver_folds_of_its_own_writes_is_what_the_store_gives_back(
        self, store_url: str
    ) -> None:
        """The thread as the writing saver keeps it (values taken as the serde wrote them, not
        decoded from its events) equals the thread a fresh saver folds from the store."""
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine)
            graph = bench.builder({}, 300).compile(checkpointer=saver)
            bench.run_thread(graph, "t")
            mine = saver._threads["t"]
            fresh = StagetrailSaver(engine)._live("t")
            assert fresh is not None
            assert any(kind == REFERENCE for *_, kind, _ in _blobs(engine))
            for part in ("checkpoints", "blobs", "writes", "known", "values"):
                assert getattr(mine, part) == getattr(fresh, part), part
            for key in fresh.frozen:
                assert mine.skeleton(*key) == fresh.skeleton(*key), key
            assert {k: marshal.loads(v) for k, v in mine.frozen.items()} == {
                k: marshal.loads(v) for k, v in fresh.frozen.items()
            }
            assert mine.machine == fresh.machine

    def test_a_cached_thread_keeps_a_few_objects_per_checkpoint_for_the_collector(
        self, store_url: str
    ) -> None:
        """A cached thread keeps no events, only light records: the objects the garbage
        collector walks in it (its table aside) stay a few per checkpoint, not a dozen."""
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine)
            graph = bench.builder({}, 300).compile(checkpointer=saver)
            bench.run_thread(graph, "t")
            thread = saver._threads["t"]
            gc.collect()  # tuples and dicts of plain values are untracked by a collection
            walked: set[int] = set()
            pending: list[Any] = [thread]
            while pending:
                item = pending.pop()
                if id(item) in walked or item is thread.pipeline or not gc.is_tracked(item):
                    continue
                walked.add(id(item))
                assert not isinstance(item, CheckpointSaved)
                pending += [r for r in gc.get_referents(item) if not isinstance(r, type)]
            checkpoints = sum(len(saved) for saved in thread.checkpoints.values())
            assert checkpoints >= 7
            assert len(walked) <= 5 * checkpoints + 15

    def test_every_value_form_folds_as_a_fresh_saver_reads_it(self, store_url: str) -> None:
        """Channel values, writes (with an interrupt and an error), metadata of every form (JSON,
        NaN, bytes, int keys, tuples, nested, large, a datetime), in the root namespace and a
        subgraph's: what the writing saver serves equals what a fresh one folds from the store."""
        forms: list[Any] = [
            {"text": "x" * 300, "n": 1, "f": 0.5, "ok": True, "none": None},
            {"text": "x" * 300, "nan": math.nan},
            {"text": "x" * 300, "raw": b"\x00\x01"},
            {"text": "x" * 300, 1: "an int key"},
            ["x" * 300, (1, (2, 3)), {"nested": [[["y"]]]}],
            {"text": "x" * 300, "when": datetime(2026, 1, 1, tzinfo=UTC)},
            {"text": "\u00e9\U0001f600" * 100, "neg0": -0.0},
            "x" * 100_000,
            b"x" * 300,
            7,
        ]
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine)
            for ns in ("", "sub:1"):
                parent: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ns}}
                for step, value in enumerate(forms):
                    checkpoint: Any = {**empty_checkpoint(), "channel_values": {"v": value}}
                    checkpoint["channel_versions"] = {"v": step + 1}
                    checkpoint["versions_seen"] = {"node": {"v": step}}
                    metadata: Any = {"source": "loop", "step": step, "m": value}
                    parent = saver.put(parent, checkpoint, metadata, {"v": step + 1})
                    writes = [("v", value), ("w", forms[step - 1])]
                    if step % 3 == 0:
                        writes.append(("__interrupt__", [Interrupt(value=value, id="i")]))
                    saver.put_writes(parent, writes, f"task{step}", "")
                    saver.put_writes(parent, [("__error__", ValueError("boom"))], f"err{step}", "")
            fresh = StagetrailSaver(engine)
            for ns in ("", "sub:1"):
                where: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ns}}
                mine = [_served(found) for found in saver.list(where)]
                assert len(mine) == len(forms)
                assert mine == [_served(found) for found in fresh.list(where)]


class TestRacingSaves:
    def test_puts_and_writes_racing_from_threads_and_the_event_loop_fold_as_stored(
        self, store_url: str
    ) -> None:
        """Chains of puts and writes from pool threads and from `aput` on one thread id (some
        sharing a namespace, so a save's parent changes while it is encoded): each checkpoint
        is stored once, after its parent, and the writer serves what a fresh saver folds."""
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine)

            def chain(ns: str, tag: str) -> None:
                parent: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ns}}
                for step in range(12):
                    parent = put_step(saver.put, parent, tag, step)
                    saver.put_writes(parent, [("v", f"{tag}{step}" * 40)], f"{tag}{step}", "")

            async def achain(ns: str, tag: str) -> None:
                parent: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ns}}
                for step in range(12):
                    parent = await put_step(saver.aput, parent, tag, step)
                    await saver.aput_writes(parent, [("v", f"{tag}{step}" * 40)], f"{tag}", "")

            async def both() -> None:
                threads = [
                    threading.Thread(target=chain, args=(ns, f"t{n}"))
                    for n, ns in enumerate(["", "", "sub:1"])
                ]
                for thread in threads:
                    thread.start()
                await asyncio.gather(achain("", "a0"), achain("sub:1", "a1"))
                for thread in threads:
                    thread.join()

            asyncio.run(both())
            fresh = StagetrailSaver(engine)
            for ns, chains in (("", 3), ("sub:1", 2)):
                where: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ns}}
                listed = list(fresh.list(where))
                assert len({found.checkpoint["id"] for found in listed}) == 12 * chains
                position = {found.checkpoint["id"]: n for n, found in enumerate(listed)}
                for found in listed:  # newest first: a parent comes after its child
                    if found.parent_config is not None:
                        parent_id = found.parent_config["configurable"]["checkpoint_id"]
                        assert position[parent_id] > position[found.checkpoint["id"]]
                assert [_served(found) for found in saver.list(where)] == [
                    _served(found) for found in listed
                ]


def put_step(put: Any, parent: Any, tag: str, step: int) -> Any:
    """Call `put` (or `aput`) with a checkpoint of chain `tag`'s `step` on `parent`."""
    versions = {"v": step + 1, tag: step + 1}
    checkpoint: Any = {**empty_checkpoint(), "channel_versions": versions}
    checkpoint["channel_values"] = {"v": f"{tag}-{step}" * 40, tag: [tag, step]}
    checkpoint["versions_seen"] = {tag: {"v": step}}
    return put(parent, checkpoint, {"source": "loop", "step": step}, versions)


class TestValueForms:
    @pytest.mark.parametrize(
        ("value", "as_json"),
        [
            ({"text": "x" * 200, "n": 1, "f": 0.5, "none": None, "ok": True}, True),
            (["x" * 200, (1, 2), {"nested": ["y"]}], True),
            ({"text": "x" * 200, "n": math.nan}, False),
            ({"text": "x" * 200, "n": -math.inf}, False),
            ({"text": "x" * 200, "raw": b"\x00\x01"}, False),
            ({"text": "x" * 200, 1: "an int key"}, False),
            ({"text": "x" * 200, "when": datetime(2026, 1, 1, tzinfo=UTC)}, False),
        ],
        ids=["plain", "tuple", "nan", "inf", "bytes", "int-key", "datetime"],
    )
    def test_a_value_is_stored_as_json_only_when_json_holds_it_exactly(
        self, store_url: str, value: Any, as_json: bool
    ) -> None:
        """A channel value is stored as JSON when plain, else as the serde's bytes, and comes
        back as the serde's own round trip gives it either way."""
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine)
            checkpoint: Any = {**empty_checkpoint(), "channel_values": {"v": value}}
            checkpoint["channel_versions"] = {"v": 1}
            saver.put(config("t"), checkpoint, {"source": "input", "step": -1}, {"v": 1})
            (blob,) = _blobs(engine)
            assert (blob[-2] == AS_JSON) is as_json
            expected = saver.serde.loads_typed(saver.serde.dumps_typed(value))
            for reader in (saver, StagetrailSaver(engine)):
                served = reader.get_tuple(config("t"))
                assert served is not None
                assert repr(served.checkpoint["channel_values"]["v"]) == repr(expected)


def _served(found: Any) -> str:
    """A checkpoint tuple as text, types and NaNs told apart (NaN equals no NaN)."""
    return repr((found.checkpoint, found.metadata, found.parent_config, found.pending_writes))


def _blobs(engine: Engine) -> list[list[Any]]:
    """Every blob of every checkpoint of the store's runs."""
    return [
        blob
        for run in engine.runs()
        for event in engine.events(run.run_id)
        if isinstance(event, CheckpointSaved)
        for blob in event.blobs.values()
    ]


class TestShards:
    def test_a_sharded_engine_is_refused_naming_the_shards(self, tmp_path: Path) -> None:
        """Over a shards: layout the saver raises one StoreError saying it works per shard."""
        stores = [f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"]
        sharded = ShardedEngine(layout_file(tmp_path, stores))
        with sharded, pytest.raises(StoreError, match="saver works per shard") as refused:
            StagetrailSaver(sharded)  # type: ignore[arg-type]
        assert "a.db" in str(refused.value)
        assert refused.value.url == sharded.url


class TestErasedUnderACachedThread:
    def test_a_cached_thread_never_appends_to_the_next_run_under_its_id(
        self, shared_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A thread cached before its run was deleted, erased and its id taken by the
        thread's next run, as long (the erase falling just after the saver checked the
        erasure generation): the saver's put is refused by the store and built again on the
        next run, whose chain stays whole."""
        with Engine(shared_url) as engine, Engine(shared_url) as other:
            cached = StagetrailSaver(engine, ["a"])
            for step in range(2):
                put_input(cached, "t", step=step)
            (first,) = engine.runs()
            elsewhere = StagetrailSaver(other, ["a"])
            elsewhere.delete_thread("t")
            other.compact()
            for step in range(2):
                put_input(elsewhere, "t", step=10 + step)
            (again,) = other.runs()
            assert again.run_id == first.run_id  # the thread's next run took the id
            assert again.version == first.version  # and is as long: the next version is free
            # the erase happened after this put's generation check
            monkeypatch.setattr(cached, "_follow_generation", lambda: cached._generation)
            put_input(cached, "t", step=2)
            assert other.verify(again.run_id).ok
            served = StagetrailSaver(other, ["a"]).get_tuple(config("t"))
            assert served is not None
            assert served.metadata["step"] == 2

    @pytest.mark.parametrize("taken", [True, False], ids=["id-taken-again", "id-free"])
    def test_a_real_compaction_between_puts_leaves_nothing_of_the_erased_thread(
        self, shared_url: str, taken: bool
    ) -> None:
        """A saver that wrote a thread's newest event puts again, on the config its last put
        gave, after another process deleted and compacted the thread (and, maybe, its next run
        took the id): the put lands on the live run, and neither this saver nor a fresh one
        serves anything of the erased run."""
        with Engine(shared_url) as engine, Engine(shared_url) as other:
            cached = StagetrailSaver(engine, ["a"])
            parent = config("t")
            for step in range(3):
                parent = put_value(cached, parent, f"erased-{step}", step)
            (first,) = engine.runs()
            elsewhere = StagetrailSaver(other, ["a"])
            elsewhere.delete_thread("t")
            assert other.compact().runs == (first.run_id,)
            if taken:
                put_value(elsewhere, config("t"), "live", 20)
            put_value(cached, parent, "mine", 3)
            (run,) = other.runs()
            assert run.run_id == first.run_id  # the saver reuses the id by design
            assert other.verify(run.run_id).ok
            for reader in (cached, StagetrailSaver(other, ["a"])):
                listed = [t.checkpoint["channel_values"]["v"] for t in reader.list(config("t"))]
                assert listed == (["mine", "live"] if taken else ["mine"])
                served = reader.get_tuple(config("t"))
                assert served is not None
                assert served.metadata["step"] == 3

    def test_a_patch_made_before_the_lock_on_a_parent_erased_since_is_made_again(
        self, shared_url: str
    ) -> None:
        """A put's skeleton patch, made before the saver's lock on the parent it had cached,
        is made again on the parent the store holds once the put is refused: the thread was
        erased and its next run holds a checkpoint of the same id with other versions, so a
        patch on the old one would rebuild other versions for every reader."""
        with Engine(shared_url) as engine, Engine(shared_url) as other:
            cached = StagetrailSaver(engine, ["a"])
            parent = put_versions(cached, config("t"), "c1", {"v": 1, "u": 1})
            parent = put_versions(cached, parent, "c2", {"v": 2, "u": 1})
            elsewhere = StagetrailSaver(other, ["a"])
            elsewhere.delete_thread("t")
            other.compact()
            put_versions(elsewhere, config("t"), "c2", {"v": 2, "u": 7})
            put_versions(cached, parent, "c3", {"v": 3, "u": 1})
            for reader in (cached, StagetrailSaver(other, ["a"])):
                served = reader.get_tuple(config("t"))
                assert served is not None
                assert served.checkpoint["id"] == "c3"
                assert served.checkpoint["channel_versions"] == {"v": 3, "u": 1}


def put_value(saver: StagetrailSaver, parent: RunnableConfig, value: str, step: int) -> Any:
    """Save a checkpoint on `parent` whose channel ``v`` holds `value`; the config naming it."""
    checkpoint: Any = {**empty_checkpoint(), "channel_values": {"v": value}}
    checkpoint["channel_versions"] = {"v": step + 1}
    return saver.put(parent, checkpoint, {"source": "loop", "step": step}, {"v": step + 1})


def put_versions(
    saver: StagetrailSaver,
    parent: RunnableConfig,
    checkpoint_id: str,
    versions: dict[str, str | int | float],
) -> Any:
    """Save checkpoint `checkpoint_id` on `parent` with these channel versions; its config."""
    checkpoint: Any = {**empty_checkpoint(), "id": checkpoint_id, "channel_versions": versions}
    checkpoint["channel_values"] = {ch: f"{checkpoint_id}-{ch}" for ch in versions}
    return saver.put(parent, checkpoint, {"source": "loop", "step": 0}, versions)


class TestDeepValues:
    @pytest.mark.parametrize("kind", ["dict", "list"])
    def test_a_value_as_deep_as_the_serde_takes_is_saved_from_a_deep_call(
        self, sqlite_url: str, kind: str
    ) -> None:
        """A channel value and a write nested as deep as LangGraph's serde takes (250 levels),
        saved by a caller already 400 frames deep, are stored and served back, not refused
        with a RecursionError (the plain-JSON check walks them without the stack)."""
        value: Any = "x" * 300
        for _ in range(250):
            value = {"k": value} if kind == "dict" else [value]
        with Engine(sqlite_url) as engine:
            saver = StagetrailSaver(engine)
            checkpoint: Any = {**empty_checkpoint(), "channel_values": {"v": value}}
            checkpoint["channel_versions"] = {"v": 1}

            def save(depth: int) -> Any:
                if depth:
                    return save(depth - 1)
                metadata: Any = {"source": "input", "step": -1}
                saved = saver.put(config("t"), checkpoint, metadata, {"v": 1})
                saver.put_writes(saved, [("v", value)], "task", "")
                return saved

            saved = save(400)
            served = StagetrailSaver(engine).get_tuple(saved)
            assert served is not None
            assert served.checkpoint["channel_values"]["v"] == value
            assert served.pending_writes == [("task", "v", value)]


class _Odd:
    """A value only the serde's pickle fallback stores."""

    def __init__(self, x: int) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Odd) and other.x == self.x

    def __hash__(self) -> int:
        return self.x


_LONG = "x" * 60
"""Long enough for a channel value equal to a write to be stored as a reference to it."""
_FORMS: list[Any] = [
    1,
    "s",
    None,
    b"bytes" * 10,
    {"a": [1, 2, {"b": _LONG}]},
    [_LONG, 1],
    datetime(2020, 1, 1, tzinfo=UTC),
    {1, 2},
    (1, 2),
    _Odd(3),
    _LONG,
    _LONG + "y",
    math.inf,
    {3: "int key"},
    b"",
    "",
]


def _answer(found: Any) -> Any:
    """A checkpoint tuple as plain parts, to compare (None stays None)."""
    if found is None:
        return None
    return (
        found.config,
        found.checkpoint,
        found.metadata,
        found.parent_config,
        found.pending_writes,
    )


def _by_config(found: Any) -> tuple[str, str, str]:
    conf = found[0]["configurable"]
    return conf["thread_id"], conf["checkpoint_ns"], conf["checkpoint_id"]


class _Fuzz:
    """Random puts, writes, deletions, prunes, copies and compactions by two savers (two
    engines, as two processes), for `check` to compare with what a fresh saver reads."""

    def __init__(self, url: str, seed: int) -> None:
        self.url = url
        self.random = random.Random(seed)
        self.serde = JsonPlusSerializer(pickle_fallback=True)
        self.threads = ["t1", "t2"]
        self.heads: dict[tuple[str, str], RunnableConfig] = {}
        self.ids: dict[tuple[str, str], list[RunnableConfig]] = {}

    def step(self, saver: StagetrailSaver, step: int) -> None:
        """One random operation of `saver` on a random thread and namespace."""
        rng = self.random
        thread, ns = rng.choice(self.threads), rng.choice(["", "", "sub:1"])
        op = rng.choice(["put"] * 5 + ["writes"] * 3 + ["get", "del", "runs", "prune", "copy"])
        if op == "put":
            self._put(saver, thread, ns, step)
        elif op == "writes" and (thread, ns) in self.heads:
            writes = [(rng.choice("abc"), rng.choice(_FORMS)) for _ in range(rng.randint(1, 3))]
            saver.put_writes(self.heads[(thread, ns)], writes, f"task-{step}")
        elif op == "get":
            saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ns}})
        elif op == "del":
            saver.delete_thread(thread)
            self.heads = {k: v for k, v in self.heads.items() if k[0] != thread}
            if rng.random() < 0.5:
                saver.engine.compact()
        elif op == "runs":
            saver.delete_for_runs([rng.choice(["r1", "r2", "r3"])])
        elif op == "prune":
            saver.prune([thread], strategy=rng.choice(["keep_latest", "keep_latest", "delete"]))
        elif op == "copy" and len(self.threads) < 5:
            saver.copy_thread(thread, f"c{step}")  # a new name each time
            self.threads.append(f"c{step}")

    def _put(self, saver: StagetrailSaver, thread: str, ns: str, step: int) -> None:
        rng = self.random
        parent = self.heads.get((thread, ns))
        if parent is not None and rng.random() < 0.2:  # a fork from an older checkpoint
            parent = rng.choice(self.ids[(thread, ns)])
        checkpoint = empty_checkpoint()
        before = saver.get_tuple(parent) if parent is not None else None
        if before is not None:
            for key in ("channel_versions", "channel_values", "versions_seen"):
                checkpoint[key] = marshal.loads(marshal.dumps(before.checkpoint[key]))
        new: dict[str, Any] = {}
        for channel in rng.sample("abc", rng.randint(0, 3)):
            version = int(checkpoint["channel_versions"].get(channel, 0)) + 1
            checkpoint["channel_versions"][channel] = new[channel] = version
            if rng.random() < 0.15:  # emptied
                checkpoint["channel_values"].pop(channel, None)
            else:
                checkpoint["channel_values"][channel] = rng.choice(_FORMS)
        checkpoint["versions_seen"].setdefault("node", {}).update(new)
        extra = rng.choice(_FORMS) if rng.random() < 0.3 else 1
        metadata: Any = {"source": "loop", "step": step, "run_id": rng.choice("123"), "w": extra}
        metadata["run_id"] = "r" + metadata["run_id"]
        conf = {**(parent or {}).get("configurable", {}), "thread_id": thread, "checkpoint_ns": ns}
        saved = saver.put({"configurable": conf}, checkpoint, metadata, new)
        self.heads[(thread, ns)] = saved
        self.ids.setdefault((thread, ns), []).append(saved)

    def check(self, savers: list[StagetrailSaver], step: int) -> None:
        """Each saver answers every read as a saver opened afresh on the store does."""
        with Engine(self.url) as engine:
            fresh = StagetrailSaver(engine, serde=self.serde)
            for saver in savers:
                for thread in self.threads:
                    for ns in ("", "sub:1"):
                        newest: RunnableConfig = {
                            "configurable": {"thread_id": thread, "checkpoint_ns": ns}
                        }
                        for asked in [newest, *self.ids.get((thread, ns), [])[-3:]]:
                            expected = _answer(fresh.get_tuple(asked))
                            assert _answer(saver.get_tuple(asked)) == expected, (step, asked)
                    listed = [_answer(t) for t in saver.list(config(thread))]
                    assert listed == [_answer(t) for t in fresh.list(config(thread))], step
                every = sorted(map(_answer, saver.list(None)), key=_by_config)
                assert every == sorted(map(_answer, fresh.list(None)), key=_by_config), step


def _mixed_or_erased(answer: list[Any], floor: int) -> list[Any]:
    """What is wrong in one read's checkpoints of the racing runs: a run erased before the
    read (numbered `floor` or less), or values or runs of two runs mixed."""
    wrong: list[Any] = []
    runs = set()
    for found in filter(None, answer):
        run = found.metadata["epoch"]
        runs.add(run)
        values = [found.checkpoint["channel_values"].get("a", f"{run}-")]
        values += [value for _, _, value in found.pending_writes or []]
        if run <= floor or not all(value.startswith(f"{run}-") for value in values):
            wrong.append((floor, run, values))
    if len(runs) > 1:
        wrong.append(runs)
    return wrong


class TestAgainstAFreshSaver:
    @pytest.mark.parametrize("seed", [1, 2])
    def test_random_operations_are_answered_as_a_fresh_saver_answers(
        self, shared_url: str, seed: int
    ) -> None:
        """After each of random puts (every value form, forks, namespaces), writes, deletions,
        compactions, prunes, deletions by run and copies by two savers on two engines, both
        answer `get_tuple` and `list` exactly as a saver opened afresh on the store does."""
        fuzz = _Fuzz(shared_url, seed)
        with Engine(shared_url) as first, Engine(shared_url) as second:
            savers = [StagetrailSaver(e, serde=fuzz.serde) for e in (first, second)]
            for step in range(40):
                fuzz.step(fuzz.random.choice(savers), step)
                fuzz.check(savers, step)
            assert any(fuzz.ids.values())

    def test_a_cached_run_erased_and_its_id_taken_is_never_read_again(
        self, shared_url: str
    ) -> None:
        """A saver that cached a thread's run, erased by another engine and its id taken by the
        thread's next run, serves only that next run, to `get_tuple`, `list` and by id."""
        with Engine(shared_url) as reader_engine, Engine(shared_url) as writer_engine:
            reader, writer = StagetrailSaver(reader_engine), StagetrailSaver(writer_engine)
            run_ids = set()
            for run in range(3):
                parent = config("t")
                for step in range(3):
                    checkpoint = empty_checkpoint()
                    checkpoint["channel_values"] = {"a": f"{run}-{step}-{_LONG}"}
                    checkpoint["channel_versions"] = {"a": step + 1}
                    metadata: Any = {"source": "loop", "step": step}
                    metadata["epoch"] = run
                    parent = writer.put(parent, checkpoint, metadata, {"a": step + 1})
                    writer.put_writes(parent, [("a", f"{run}-w{step}")], f"task-{step}")
                newest = reader.get_tuple(config("t"))
                assert _mixed_or_erased([newest], run - 1) == []
                assert newest is not None
                assert _mixed_or_erased(list(reader.list(config("t"))), run - 1) == []
                assert reader.get_tuple(parent) == newest
                run_ids.add(reader._threads["t"].run_id)
                writer.delete_thread("t")
                writer_engine.compact()
            assert len(run_ids) == 1  # each next run took the erased run's id
            assert reader.get_tuple(config("t")) is None

    def test_reads_racing_erasures_serve_no_erased_run_nor_a_mix_of_runs(
        self, shared_url: str
    ) -> None:
        """While another engine fills a thread, deletes it and compacts it away again and again
        (its next run taking the erased run's id), every read of a caching saver serves one
        run's checkpoints whole, never one erased before the read began."""
        with Engine(shared_url) as reader_engine, Engine(shared_url) as writer_engine:
            reader, writer = StagetrailSaver(reader_engine), StagetrailSaver(writer_engine)
            erased = [-1]
            stop = threading.Event()
            wrong: list[Any] = []
            reads: list[int] = []

            def read() -> None:
                while not stop.is_set():
                    floor = erased[0]
                    try:
                        found = [reader.get_tuple(config("t"))], list(reader.list(config("t")))
                    except StagetrailError:
                        continue
                    except Exception as error:  # a raw error: a fold of a mix of runs
                        wrong.append(error)
                        continue
                    reads.append(1)
                    for answer in found:
                        wrong.extend(_mixed_or_erased(answer, floor))

            reading = threading.Thread(target=read)
            reading.start()
            try:
                for run in range(8):
                    parent = config("t")
                    for step in range(3):
                        checkpoint = empty_checkpoint()
                        checkpoint["channel_values"] = {"a": f"{run}-{step}-{_LONG}"}
                        checkpoint["channel_versions"] = {"a": step + 1}
                        metadata: Any = {"source": "loop", "step": step}
                        metadata["epoch"] = run
                        parent = writer.put(parent, checkpoint, metadata, {"a": step + 1})
                        writer.put_writes(parent, [("a", f"{run}-w{step}")], f"task-{step}")
                    # This reader caches the run, whose id its next run takes once erased.
                    wrong.extend(_mixed_or_erased([reader.get_tuple(config("t"))], run - 1))
                    writer.delete_thread("t")
                    writer_engine.compact()
                    erased[0] = run
            finally:
                stop.set()
                reading.join()
            assert wrong == []
            assert reads
            assert list(reader.list(config("t"))) == []


def loop_config(thread_id: str, checkpoint_id: str | None = None) -> RunnableConfig:
    """A config as LangGraph's loop hands it under ``durability="sync"`` (its saves ordered)."""
    configurable: dict[str, Any] = {
        "thread_id": thread_id,
        "checkpoint_ns": "",
        "__pregel_runtime": object(),
        "__pregel_durability": "sync",
    }
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def loop_checkpoint(checkpoint_id: str, step: int) -> Any:
    """A checkpoint the loop would save at `step`, channel ``v`` at version ``step + 2``."""
    checkpoint: Any = {**empty_checkpoint(), "id": checkpoint_id}
    checkpoint["channel_versions"] = {"v": step + 2}
    checkpoint["channel_values"] = {"v": f"v{step}"}
    return checkpoint


class TestTurns:
    def test_writes_waiting_for_their_checkpoint_wake_once_it_is_recorded(
        self, store_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A task's writes that reach the saver before their checkpoint wait on the saver's
        condition, are woken by that checkpoint's save (not by the bound on the wait), and
        leave no save counted as waiting or writing."""
        monkeypatch.setattr(saver_module, "_ORDER_WAIT", 30.0)  # a missed wake-up takes it all
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine, ["a"])
            first = put_input(saver, "t")["configurable"]["checkpoint_id"]
            later = "1ef00000-0000-6000-8000-0000000000aa"
            waits = threading.Event()
            wait_for = saver._changed.wait_for

            def waiting(predicate: Callable[[], bool], timeout: float) -> bool:
                waits.set()  # called under the lock: the checkpoint's save comes after
                return wait_for(predicate, timeout)

            monkeypatch.setattr(saver._changed, "wait_for", waiting)
            writes = threading.Thread(
                target=saver.put_writes,
                args=(loop_config("t", later), [("v", "x")], "task", "~__pregel_pull, a"),
            )
            writes.start()
            assert waits.wait(10), "the writes did not wait for their checkpoint"
            saver.put(loop_config("t", first), loop_checkpoint(later, 0), {"source": "loop"}, {})
            writes.join(10)  # far below the 30 s a missed wake-up would take
            assert not writes.is_alive(), "the checkpoint's save did not wake the writes"
            assert saver._waiting == 0
            assert saver._writing == {}
            (run,) = engine.runs()
            kinds = [type(event).__name__ for event in engine.events(run.run_id)]
            # the checkpoint (at the graph's end: its idle note with it), then the node's outcome
            saved = ["RunStarted", "CheckpointSaved", "CheckpointSaved", "NoteAdded"]
            assert kinds == [*saved, "StageCompleted"]

    def test_a_wait_that_ends_unsatisfied_or_raises_leaves_nothing_counted(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Writes whose checkpoint never comes are recorded once the wait's bound passes, and
        a wait that raises ends the save: neither leaves a save counted as waiting or writing."""
        monkeypatch.setattr(saver_module, "_ORDER_WAIT", 0.01)
        with Engine("memory://") as engine:
            saver = StagetrailSaver(engine, ["a"])
            put_input(saver, "t")
            never = "1ef00000-0000-6000-8000-0000000000bb"
            saver.put_writes(loop_config("t", never), [("v", "x")], "late", "~__pregel_pull, a")
            assert (saver._waiting, saver._writing) == (0, {})
            asked: list[int] = []

            def failing(*_: Any) -> bool:
                asked.append(1)
                if len(asked) > 2:  # the checks before the wait pass, the one in it raises
                    raise KeyboardInterrupt
                return False

            monkeypatch.setattr(saver, "_recorded", failing)
            with pytest.raises(KeyboardInterrupt):
                saver.put_writes(loop_config("t", never), [("v", "y")], "gone", "")
            assert (saver._waiting, saver._writing) == (0, {})


class TestReusedRunHandle:
    def test_a_saver_appends_on_the_store_after_another_saver_appended(
        self, store_url: str
    ) -> None:
        """Two savers take turns on a thread: each one's put after the other's is built on
        what the store holds (not on the handle of its own last append), the chain whole."""
        with Engine(store_url) as engine:
            savers = [StagetrailSaver(engine, ["a"]), StagetrailSaver(engine, ["a"])]
            parent = config("t")
            for step, saver in enumerate([0, 0, 1, 0, 1, 1, 0]):
                parent = put_value(savers[saver], parent, f"v{step}", step)
            (run,) = engine.runs()
            assert engine.verify(run.run_id).ok
            for reader in (*savers, StagetrailSaver(engine, ["a"])):
                listed = [t.checkpoint["channel_values"]["v"] for t in reader.list(config("t"))]
                assert listed == [f"v{step}" for step in reversed(range(7))]

    @pytest.mark.parametrize("stored", [False, True], ids=["not-written", "written"])
    def test_a_put_after_a_write_that_failed_follows_what_the_store_holds(
        self, store_url: str, monkeypatch: pytest.MonkeyPatch, stored: bool
    ) -> None:
        """A put whose write fails (before the store took it, or after) raises; the next put
        on the same thread follows what the store holds, and the saver serves it all."""
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine, ["a"])
            parent = put_value(saver, config("t"), "v0", 0)
            parent = put_value(saver, parent, "v1", 1)
            write = engine.store.write

            def failing(*args: Any, **kwargs: Any) -> Any:
                monkeypatch.setattr(engine.store, "write", write)
                if stored:
                    write(*args, **kwargs)
                raise StoreError(store_url, "the connection dropped")

            monkeypatch.setattr(engine.store, "write", failing)
            with pytest.raises(StoreError, match="dropped"):
                put_value(saver, parent, "v2", 2)
            put_value(saver, parent, "v3", 3)
            expected = ["v3", "v2", "v1", "v0"] if stored else ["v3", "v1", "v0"]
            (run,) = engine.runs()
            assert engine.verify(run.run_id).ok
            for reader in (saver, StagetrailSaver(engine, ["a"])):
                listed = [t.checkpoint["channel_values"]["v"] for t in reader.list(config("t"))]
                assert listed == expected

    def test_an_append_that_raised_midway_leaves_nothing_for_the_next(
        self, store_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A graph's last checkpoint (recorded with its thread's idle note, in one batch)
        whose note raises stores nothing of it; the next put on the thread stores its own
        checkpoint alone, no leftover of the one that raised."""
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine, ["a"])
            parent = put_value(saver, config("t"), "v0", 0)

            def raising(status: str, reason: Any = None) -> Callable[[Any], Any]:
                def step(run: Any) -> Any:
                    raise RuntimeError(f"no {status} note")

                return step

            monkeypatch.setattr(saver_module, "_paused", raising)
            done: Any = {**empty_checkpoint(), "channel_versions": {"v": 2}}
            done["channel_values"] = {"v": "v1"}
            with pytest.raises(RuntimeError, match="no idle note"):
                saver.put(loop_config("t", parent["configurable"]["checkpoint_id"]), done, {}, {})
            monkeypatch.undo()
            put_value(saver, parent, "v2", 2)
            (run,) = engine.runs()
            kinds = [type(event).__name__ for event in engine.events(run.run_id)]
            assert kinds == ["RunStarted", "CheckpointSaved", "CheckpointSaved"]
            assert engine.verify(run.run_id).ok
            for reader in (saver, StagetrailSaver(engine, ["a"])):
                listed = [t.checkpoint["channel_values"]["v"] for t in reader.list(config("t"))]
                assert listed == ["v2", "v0"]
