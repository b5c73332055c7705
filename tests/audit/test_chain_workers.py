"""A long run's chain checked by worker processes: the report the check without them gives."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Iterator
from uuid import UUID

import pytest

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

    def test_the_environment_gives_the_default(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Unset, no worker; else the number the variable gives."""
        monkeypatch.delenv(VARIABLE, raising=False)
        assert chain_workers(PARALLEL_FROM) == 0
        monkeypatch.setenv(VARIABLE, "2")
        assert chain_workers(PARALLEL_FROM) == 2

    def test_the_command_line_uses_the_spare_cores(self) -> None:
        """One less than the cores this process may use, at least none, at most three."""
        assert spare_cores() == max(0, min(len(os.sched_getaffinity(0)) - 1, MOST_WORKERS))

    @pytest.mark.parametrize("bad", [-1, 1.5, True])
    def test_a_bad_number_is_refused(self, bad: object) -> None:
        """Workers that are not a whole number >= 0 are one error naming the argument."""
        with pytest.raises(InvalidArgument) as raised:
            chain_workers(PARALLEL_FROM, bad)  # type: ignore[arg-type]
        assert raised.value.argument == "workers"

    def test_a_bad_variable_is_refused(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A variable that is not a whole number is one error naming it."""
        monkeypatch.setenv(VARIABLE, "two")
        with pytest.raises(InvalidArgument) as raised:
            chain_workers(PARALLEL_FROM)
        assert raised.value.argument == VARIABLE
