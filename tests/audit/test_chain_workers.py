"""A long run's chain checked by worker processes: the report the check without them gives."""

from __future__ import annotations

import contextlib
import hmac
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Engine
from engine.errors import InvalidArgument
from engine.store.chain import Chain, split
from engine.store.chain_workers import ChainWorkers
from engine.store.event_store import PAGE
from engine.verify import (
    MOST_WORKERS,
    PARALLEL_FROM,
    VARIABLE,
    VerifyReport,
    chain_workers,
    spare_cores,
    verify_chain,
    workers_setting,
)
from tests._helpers import REVIEW
from tests.audit.tampering import Rows

KEY = "the writers' secret"
EVENTS = 6 * PAGE + 50


@pytest.fixture(params=[None, KEY], ids=["plain", "keyed"])
def long_run(request: pytest.FixtureRequest, shared_url: str) -> Iterator[tuple[Engine, UUID]]:
    """A run of six pages and a bit in SQLite or PostgreSQL, plain or keyed links."""
    with Engine(shared_url, chain_key=request.param) as engine:
        run = engine.start_run(REVIEW)
        for start in range(0, EVENTS - 1, 500):
            with run.batch():
                for index in range(start, min(start + 500, EVENTS - 1)):
                    run.note("step", f"s{index}")
        yield engine, run.id


def checked(engine: Engine, run_id: UUID, workers: int, *, old: bool = False) -> VerifyReport:
    """The chain of `run_id` checked alone with `workers` worker processes (as a store
    written before chaining was recorded, with `old`)."""
    store = engine.store
    return verify_chain(
        run_id,
        store.stored_rows(run_id),
        store.mapper,
        must_link_from=None if old else store.must_link_from(run_id),
        workers=workers,
    )


def edit(rows: Rows, run_id: UUID, version: int) -> None:
    topic, state = rows.get(run_id, version)
    rows.put(run_id, version, topic, state.replace(b'"s', b'"S', 1))


def edit_both(rows: Rows, run_id: UUID, first: int, second: int) -> None:
    edit(rows, run_id, first)
    edit(rows, run_id, second)


TAMPERING: dict[str, tuple[Callable[[Rows, UUID], None], list[int]]] = {
    "an edit in the third page": (lambda rows, run: edit(rows, run, 2 * PAGE + 7), [2 * PAGE + 7]),
    "a deleted first event of a page": (lambda rows, run: rows.delete(run, PAGE + 1), [PAGE + 1]),
    "events swapped across pages": (
        lambda rows, run: rows.swap(run, 3 * PAGE, 3 * PAGE + 1),
        [3 * PAGE, 3 * PAGE + 1, 3 * PAGE + 2],
    ),
    "an event inserted after the last": (
        lambda rows, run: rows.insert(run, EVENTS + 1, *rows.get(run, EVENTS)),
        [EVENTS + 1],
    ),
    "edits in the second and the last page": (
        lambda rows, run: edit_both(rows, run, PAGE + 500, EVENTS - 1),
        [PAGE + 500, EVENTS - 1],
    ),
}


class TestChainWorkers:
    def test_an_intact_run_gets_the_same_report(self, long_run: tuple[Engine, UUID]) -> None:
        """With a worker, an intact run is intact, with the same head and count of events."""
        engine, run_id = long_run
        alone, helped = checked(engine, run_id, 0), checked(engine, run_id, 1)
        assert (helped.ok, helped.chain, helped.events) == (True, "intact", EVENTS)
        assert helped == alone

    @pytest.mark.parametrize("tampering", list(TAMPERING), ids=list(TAMPERING))
    def test_tampering_is_named_at_the_same_versions(
        self, long_run: tuple[Engine, UUID], shared_url: str, tampering: str
    ) -> None:
        """Rows edited, deleted, swapped or inserted by SQL are named at the versions the
        check without workers names, the first of them the first tampered."""
        engine, run_id = long_run
        tamper, expected = TAMPERING[tampering]
        tamper(Rows(shared_url), run_id)
        alone, helped = checked(engine, run_id, 0), checked(engine, run_id, 1)
        assert [p.version for p in alone.problems] == expected
        assert helped == alone
        assert helped.chain == "broken"

    def test_a_run_stripped_of_its_first_links_gets_the_same_report(self, sqlite_url: str) -> None:
        """Events without links before linked ones are followed as without workers: read as a
        store that recorded no chain, the first linked event does not follow nothing; as
        this store (which links every event), every stripped event is broken."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(REVIEW)
            with run.batch():
                for index in range(4 * PAGE):
                    run.note("step", f"s{index}")
            rows = Rows(sqlite_url)
            rows.strip(run.id, range(1, PAGE + 200))
            edit(rows, run.id, 3 * PAGE + 3)
            alone = checked(engine, run.id, 0, old=True)
            helped = checked(engine, run.id, 1, old=True)
            assert [p.version for p in helped.problems] == [PAGE + 200, 3 * PAGE + 3]
            assert (helped.chain, helped.chained_from) == ("broken", PAGE + 200)
            assert helped == alone
            alone, helped = checked(engine, run.id, 0), checked(engine, run.id, 1)
            assert len(helped.problems) == PAGE + 199 + 2
            assert helped == alone

    def test_a_worker_checks_a_page_as_run_along_does(self, long_run: tuple[Engine, UUID]) -> None:
        """A worker follows a page from the link stored before it, and stops where an event
        does not follow on."""
        engine, run_id = long_run
        chain = engine.store.mapper.chain
        first, second = list(engine.store.stored_rows(run_id))[:2]
        before = split(first[-1][2])
        assert before is not None
        edited = list(second)
        version, topic, data = edited[10]
        edited[10] = (version, topic, data.replace(b'"s', b'"S', 1))
        workers = ChainWorkers(chain, run_id, 1)
        try:
            assert workers.submit(before[2], PAGE + 1, second).result() == PAGE
            assert workers.submit(before[2], PAGE + 1, edited).result() == 10
            assert workers.submit(b"x" * 16, PAGE + 1, second).result() == 0
        finally:
            workers.close()
        assert chain.run_along(before[2], PAGE + 1, run_id, edited)[0] == 10


class TestHungWorker:
    def test_a_worker_that_stops_answering_is_killed_after_the_timeout(
        self, long_run: tuple[Engine, UUID]
    ) -> None:
        """A worker that answered once, then is stopped (SIGSTOP: alive, answering nothing),
        is waited for `timeout` seconds only: the page is reported not done, the worker is
        killed, and closing the pool returns (before, a wait on it never ended)."""
        engine, run_id = long_run
        chain = engine.store.mapper.chain
        first, second = list(engine.store.stored_rows(run_id))[:2]
        before = split(first[-1][2])
        assert before is not None
        others = {child.pid for child in multiprocessing.active_children()}
        workers = ChainWorkers(chain, run_id, 1, timeout=2)
        try:
            assert workers.submit(before[2], PAGE + 1, second).result() == PAGE  # it started
            [worker] = [c for c in multiprocessing.active_children() if c.pid not in others]
            assert worker.pid is not None
            os.kill(worker.pid, signal.SIGSTOP)
            page = workers.submit(before[2], PAGE + 1, second)
            assert workers.wait(page) is False
            assert workers.stopped
            worker.join(60)  # killed: a stopped process ends on SIGKILL
            for _ in range(600):
                if worker.exitcode is not None:
                    break
                # the pool's own thread may be reaping it this instant: the status is then
                # set on the process by that thread, and this join's wait found no child
                worker.join(0.1)
            assert worker.exitcode == -signal.SIGKILL
        finally:
            workers.close()


_HUNG_AT_STARTUP = """
import sys
import threading
import uuid

if __name__ != "__main__":  # a worker importing this file (no main guard): hangs at startup
    threading.Event().wait()

from engine.store.chain import Chain
from engine.store.chain_workers import ChainWorkers

workers = ChainWorkers(Chain(), uuid.uuid4(), 1, timeout=1)
page = workers.submit(b"", 1, [])
import multiprocessing
[worker] = multiprocessing.active_children()
print(worker.pid, flush=True)
answered = workers.wait(page)
workers.close()
print(answered, workers.stopped, flush=True)
"""


class TestHungAtStartup:
    def test_a_worker_that_hangs_before_it_starts_is_killed_and_the_script_ends(
        self, tmp_path: Path
    ) -> None:
        """A worker that hangs while it starts (a script without the main guard, which the
        worker imports, waiting for ever) is killed after the timeout like any hung worker,
        so the script ends and leaves no process behind (before, its pid was never known:
        nothing was killed and the script waited for it at exit for ever)."""
        script = tmp_path / "unguarded.py"
        script.write_text(_HUNG_AT_STARTUP)
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
        worker = 0
        with subprocess.Popen(
            [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env
        ) as process:
            try:
                worker = int(process.stdout.readline())  # type: ignore[union-attr]
                out, _ = process.communicate(timeout=120)  # a guard against a hang only
                left = _alive(worker)
            finally:
                for pid in (process.pid, worker) if worker > 0 else (process.pid,):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        assert (process.returncode, out.split(), left) == (0, ["False", "True"], False)


def _alive(pid: int) -> bool:
    """Whether process `pid` is still there (not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class TestChainPickled:
    def test_a_keyed_chain_travels_as_its_derived_key(self) -> None:
        """A keyed chain sent to a worker carries the derived key, never the writers' secret,
        and links as the original does."""
        chain = Chain(KEY.encode())
        sent = pickle.dumps(chain)
        assert KEY.encode() not in sent
        copy = pickle.loads(sent)
        run_id = UUID(int=7)
        assert copy.link(b"p" * 16, run_id, 2, "t:X", b"{}") == chain.link(
            b"p" * 16, run_id, 2, "t:X", b"{}"
        )
        assert (copy.mode, copy.check()) == (chain.mode, chain.check())


class TestHowMany:
    def test_a_short_run_gets_none(self) -> None:
        """Under `PARALLEL_FROM` events no worker starts, whatever was asked."""
        assert chain_workers(PARALLEL_FROM - 1, 3) == 0
        assert chain_workers(PARALLEL_FROM, 3) == 3

    def test_the_library_never_reads_the_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Not asked, the library starts no worker, whatever the variable says: a spawned
        worker re-runs an unguarded script's top level."""
        monkeypatch.setenv(VARIABLE, "2")
        assert chain_workers(PARALLEL_FROM) == 0

    def test_the_variable_gives_the_command_lines_number(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Unset or blank, no setting (the command line takes the spare cores); else its number."""
        monkeypatch.delenv(VARIABLE, raising=False)
        assert workers_setting() is None
        monkeypatch.setenv(VARIABLE, " ")
        assert workers_setting() is None
        monkeypatch.setenv(VARIABLE, "2")
        assert workers_setting() == 2

    def test_the_spare_cores_are_counted(self) -> None:
        """The benchmark's spare cores: one less than the cores this process may use, at
        least none, at most three."""
        assert spare_cores() == max(0, min(len(os.sched_getaffinity(0)) - 1, MOST_WORKERS))

    @pytest.mark.parametrize("bad", [-1, 1.5, True, 65])
    def test_a_bad_number_is_refused(self, bad: object) -> None:
        """Workers that are not a whole number >= 0 are one error naming the argument."""
        with pytest.raises(InvalidArgument) as raised:
            chain_workers(PARALLEL_FROM, bad)  # type: ignore[arg-type]
        assert raised.value.argument == "workers"

    def test_a_bad_variable_is_refused(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A variable that is not a whole number is one error naming it."""
        monkeypatch.setenv(VARIABLE, "two")
        with pytest.raises(InvalidArgument) as raised:
            workers_setting()
        assert raised.value.argument == VARIABLE


CIPHER_KEY = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="  # 32 bytes, base64


class TestChainWorkersReview:
    def test_an_undecryptable_event_after_a_page_sent_back_is_still_named(
        self, sqlite_url: str
    ) -> None:
        """An event that no longer decrypts, read while a page a worker finds broken is held,
        is the same ``format`` problem as without workers."""
        with Engine(sqlite_url, cipher_key=CIPHER_KEY) as engine:
            run = engine.start_run(REVIEW)
            with run.batch():
                for index in range(4 * PAGE):
                    run.note("step", f"s{index}")
            rows = Rows(sqlite_url)
            rows.delete(run.id, PAGE + 7)  # page 2: a link that breaks
            topic, state = rows.get(run.id, 2 * PAGE + 5)  # page 3: no longer decrypts
            rows.put(run.id, 2 * PAGE + 5, topic, state[:-1] + bytes([state[-1] ^ 1]))
            alone, helped = checked(engine, run.id, 0), checked(engine, run.id, 1)
            assert (2 * PAGE + 5, "format") in [(p.version, p.check) for p in alone.problems]
            assert helped == alone

    def test_pages_held_stay_bounded_while_a_worker_is_stalled(
        self, long_run: tuple[Engine, UUID]
    ) -> None:
        """While a worker does not answer, the check reads no more than a bounded number of
        pages ahead of it (pages held are memory)."""
        import multiprocessing
        import signal
        import threading

        engine, run_id = long_run
        rows = [row for page in engine.store.stored_rows(run_id) for row in page]
        small = [rows[i : i + 50] for i in range(0, len(rows), 50)]
        stalled: list[int] = []
        read_while_stalled = 0

        resumed: list[bool] = []

        def resume() -> None:
            resumed.append(True)
            for pid in stalled:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

        def pages() -> Iterator[list[tuple[int, str, bytes]]]:
            nonlocal read_while_stalled
            for index, page in enumerate(small):
                if index == 3 and not stalled:  # the pool has started: stall its worker
                    stalled.extend(p.pid for p in multiprocessing.active_children() if p.pid)
                    for pid in stalled:
                        os.kill(pid, signal.SIGSTOP)
                    threading.Timer(5, resume).start()  # unblocks a bounded check
                elif stalled and not resumed:
                    read_while_stalled += 1
                    if read_while_stalled > 40:
                        resume()  # unbounded: stop measuring
                yield page

        store = engine.store
        report = verify_chain(
            run_id, pages(), store.mapper, must_link_from=store.must_link_from(run_id), workers=1
        )
        assert report.ok
        assert stalled
        assert read_while_stalled <= 8


class TestChainHmac:
    @given(key=st.binary(max_size=200), body=st.binary(max_size=300), version=st.integers(1, 2**40))
    @settings(max_examples=300, deadline=None)
    def test_a_keyed_link_is_hmac_sha256_of_the_derived_key(
        self, key: bytes, body: bytes, version: int
    ) -> None:
        """A keyed link is the first 16 bytes of `hmac.digest` under the derived key (empty,
        short, block-long and longer secrets alike)."""
        chain = Chain(key)
        derived = chain.__reduce__()[1][0]
        assert derived is not None
        assert len(derived) == 32
        run_id = UUID(int=version)
        message = b"p" * 16 + run_id.bytes + version.to_bytes(8, "big") + b"t:X\x00" + body
        expected = hmac.digest(derived, message, "sha256")[:16]
        assert chain.link(b"p" * 16, run_id, version, "t:X", body) == expected

    @given(derived=st.one_of(st.binary(max_size=200), st.sampled_from([b"", b"k" * 64, b"k" * 65])))
    @settings(max_examples=300, deadline=None)
    def test_a_chain_unpickled_from_any_derived_key_links_as_hmac(self, derived: bytes) -> None:
        """A chain rebuilt from a derived key of any length (shorter than, equal to or longer
        than SHA-256's 64-byte block) links as `hmac.digest` under it."""
        rebuild = Chain(b"x").__reduce__()[0]
        chain = rebuild(derived)
        run_id = UUID(int=3)
        message = b"" + run_id.bytes + (2).to_bytes(8, "big") + b"t:X\x00" + b"{}"
        assert (
            chain.link(b"", run_id, 2, "t:X", b"{}") == hmac.digest(derived, message, "sha256")[:16]
        )


class TestHowManyReview:
    @pytest.mark.parametrize("setting", ["²", "1_0", "٣x", "65", "-1"])
    def test_an_odd_variable_is_one_error_naming_it_or_a_bounded_number(
        self, monkeypatch: pytest.MonkeyPatch, setting: str
    ) -> None:
        """A variable that is not plain ASCII digits is an `InvalidArgument` naming it, never
        a bare ValueError."""
        monkeypatch.setenv(VARIABLE, setting)
        with pytest.raises(InvalidArgument) as raised:
            workers_setting()
        assert raised.value.argument == VARIABLE

    def test_a_bad_number_is_refused_without_chain_only(self, sqlite_url: str) -> None:
        """`Engine.verify` refuses bad `workers` whether or not it checks the chain alone, as
        its docstring says."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(REVIEW)
            with pytest.raises(InvalidArgument) as raised:
                engine.verify(run.id, workers=-5)
        assert raised.value.argument == "workers"
