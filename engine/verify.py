"""`engine.verify`: check a run's hash chain, re-fold it through its stored table and every
projection.

The chain (engine/store/chain.py) is checked over the stored bytes, event by
event, before each is decoded: a payload edited in the database, an event
deleted, inserted or moved breaks a link, and the report names the version.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import BrokenExecutor, Future
from typing import Any
from uuid import UUID

import attrs
from eventsourcing.persistence import StoredEvent

from engine.errors import InvalidArgument, PipelineError
from engine.machine import replay
from engine.pipeline import Pipeline
from engine.store.chain import KEYED, PLAIN, Chain, StoredRow, holds_bytes, split
from engine.store.chain_workers import (
    MAX_WORKER_TIMEOUT,
    WORKER_TIMEOUT,
    ChainWorkers,
    Followed,
    RangeReading,
    check_range,
)
from engine.store.failures import is_database_error
from engine.store.mapper import EventMapper, not_bytes
from events import Event, EventFormatError, RunStarted, StagetrailError
from projections import Projection, ProjectionError


@attrs.frozen
class Problem:
    """One thing wrong with a stored run: where, which check, what."""

    version: int
    check: str
    message: str


@attrs.frozen
class VerifyReport:
    """The outcome of verifying one run."""

    run_id: UUID
    events: int
    problems: tuple[Problem, ...]
    chain: str = "unchained"
    """``intact`` (every link checked), ``unchained`` (written before chaining: no links),
    ``partial`` (links from `chained_from` on), ``unchecked`` (keyed links, no key to check
    them) or ``broken`` (see the problems whose check is ``chain``)."""
    head: str | None = None
    """The newest event's link as stored (mode letter and hex), None when it has none."""
    chained_from: int | None = None
    """The first version that carries a link."""

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems


def verify_events(
    run_id: UUID, events: Iterable[Event], projections: Sequence[Projection[Any]]
) -> VerifyReport:
    """Check every event against the run's own table and fold it into each projection."""
    problems: list[Problem] = []
    seen = _Seen(projections, problems)
    checked = seen.each(events)
    first = next(checked, None)
    if first is None:
        problems.append(Problem(0, "events", "the run has no events"))
    elif not isinstance(first, RunStarted):
        problems.append(Problem(first.version, "start", "the run does not begin with RunStarted"))
    else:
        _replay(first, checked, problems)
    for _ in checked:  # the projections see every event, even after a broken start
        pass
    return VerifyReport(run_id, seen.count, tuple(problems))


def verify_stored(
    run_id: UUID,
    pages: Iterable[Sequence[StoredRow]],
    mapper: EventMapper,
    projections: Sequence[Projection[Any]],
    *,
    must_link_from: int | None = None,
    key_problem: str | None = None,
    plain: bool = False,
) -> VerifyReport:
    """`verify_events` over a run's stored events (`StoredRow`s), a page at a time, each
    page's hash chain checked before its events are decoded (`ChainCheck.checked`).

    Args:
        must_link_from: the first version the store's recorded chain says carries a link
            (an event from there on without one was stripped of it); None: none must.
        key_problem: what is wrong with the chain key given (a wrong key), reported first.
        plain: the store's recorded chain is plain (no key): a keyed link from
            `must_link_from` on was forged.
    """
    links = ChainCheck(mapper.chain, run_id, must_link_from=must_link_from, plain=plain)
    report = verify_events(run_id, links.checked(pages, mapper), projections)
    return _with_chain(report, links, key_problem)


VARIABLE = "STAGETRAIL_VERIFY_WORKERS"
"""The environment variable giving how many worker processes the command line's
``verify --chain-only`` starts for a long run (unset: none). The library never
reads it: a worker is a spawned process that re-runs an unguarded script's top level, so
only a caller that asks (`Engine.verify(..., workers=N)`) gets one."""
PARALLEL_FROM = 200_000
"""The fewest events of a run whose chain workers check: starting one costs about what
checking 50,000 events does."""
MOST_WORKERS = 3
"""The most workers `spare_cores` gives: one process reading pages keeps about three busy."""
WORKERS_LIMIT = 64
"""The most workers anyone may ask for: each is a process."""


def chain_workers(events: int, workers: int | None = None) -> int:
    """How many worker processes check the chain of a run of `events` events: `workers`
    (None: none); none for a run under `PARALLEL_FROM`.

    Raises:
        InvalidArgument: `workers` is not a whole number from 0 to `WORKERS_LIMIT`.
    """
    if workers is None:
        return 0
    if type(workers) is not int or not 0 <= workers <= WORKERS_LIMIT:
        raise InvalidArgument(
            "workers", f"must be a whole number from 0 to {WORKERS_LIMIT}, got {workers!r}"
        )
    return workers if events >= PARALLEL_FROM else 0


def worker_seconds(timeout: float | None) -> float:
    """`timeout` as the seconds a chain worker may take to answer (None: `WORKER_TIMEOUT`).

    Raises:
        InvalidArgument: `timeout` is not a number of seconds above 0, or is more than
            `MAX_WORKER_TIMEOUT` (the longest wait a thread can make).
    """
    if timeout is None:
        return WORKER_TIMEOUT
    if type(timeout) not in (int, float) or not 0 < timeout <= MAX_WORKER_TIMEOUT:
        raise InvalidArgument(
            "worker_timeout",
            f"must be a number of seconds above 0 and at most {MAX_WORKER_TIMEOUT:.0f}, "
            f"got {timeout!r}",
        )
    return float(timeout)


def workers_setting() -> int | None:
    """``$STAGETRAIL_VERIFY_WORKERS`` as a number of workers (None: unset or blank).

    Raises:
        InvalidArgument: the variable is not a whole number from 0 to `WORKERS_LIMIT`.
    """
    setting = os.environ.get(VARIABLE, "").strip()
    if not setting:
        return None
    if not (setting.isascii() and setting.isdigit()) or int(setting) > WORKERS_LIMIT:
        raise InvalidArgument(
            VARIABLE, f"must be a whole number from 0 to {WORKERS_LIMIT}, got {setting!r}"
        )
    return int(setting)


def spare_cores() -> int:
    """One less than the cores this process may run on, at most `MOST_WORKERS`: the workers
    `benchmarks.chain` tries beside a check without."""
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere, every core
    cores = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    return max(0, min(cores - 1, MOST_WORKERS))


def verify_chain(
    run_id: UUID,
    pages: Iterable[Sequence[StoredRow]],
    mapper: EventMapper,
    *,
    must_link_from: int | None = None,
    key_problem: str | None = None,
    workers: int = 0,
    ranges: RunRanges | None = None,
    plain: bool = False,
    worker_timeout: float = WORKER_TIMEOUT,
) -> VerifyReport:
    """Check a run's hash chain alone, a page of stored events (`StoredRow`s) at a time,
    decoding none.

    The report's `events` counts the stored events read; its problems are the chain's
    (and ``format`` for an event that cannot be decrypted): the table's rules and the
    projections are `verify_stored`'s. With `workers`, that many worker processes check
    pages beside this one (`ChainCheck.pages`): the same report, sooner. With `ranges`,
    the run is read by ranges of versions, each streamed and checked on its own (`_Ranges`).
    A worker that neither answers nor dies within `worker_timeout` seconds once waited for
    is taken as hung: every worker is stopped and what they held is checked here (the same
    report; a warning is logged). `must_link_from`, `key_problem` and `plain` are
    `verify_stored`'s.
    """
    links = ChainCheck(mapper.chain, run_id, must_link_from=must_link_from, plain=plain)
    count = links.pages(
        pages, mapper, workers=workers, ranges=ranges, worker_timeout=worker_timeout
    )
    return _with_chain(VerifyReport(run_id, count, ()), links, key_problem)


def _with_chain(report: VerifyReport, links: ChainCheck, key_problem: str | None) -> VerifyReport:
    """`report` with the chain's verdict and problems (sorted by version) added."""
    problems = sorted((*links.problems, *report.problems), key=_place)
    if key_problem is not None:
        problems.insert(0, Problem(0, "chain key", key_problem))
    return attrs.evolve(
        report,
        problems=tuple(problems),
        chain=links.status,
        head=links.head,
        chained_from=links.chained_from,
    )


def _place(problem: Problem) -> float:
    """Where `problem` sorts: by its version, one edited to text or bytes after all."""
    version: object = problem.version
    return version if isinstance(version, (int, float)) else math.inf


class ChainCheck:
    """Follows one run's stored events in version order and checks each one's link.

    A break is reported at its version and the check goes on from the stored link
    (so two edits far apart are two problems); a run written before chaining has
    no links and is ``unchained``, not broken, but an event stored after the store's
    recorded chain began (`must_link_from`) without a link is broken.
    """

    def __init__(
        self, chain: Chain, run_id: UUID, *, must_link_from: int | None = None, plain: bool = False
    ) -> None:
        self.chain = chain
        self.run_id = run_id
        self.must_link_from = must_link_from
        """The first version that must carry a link, whatever comes before (None: none)."""
        self.plain = plain
        """Whether the store's recorded chain is plain: no writer links with a key from
        `must_link_from` on (a keyed link there would go unchecked without a key)."""
        self.problems: list[Problem] = []
        self.previous = b""
        self.expected = 1
        self.chained_from: int | None = None
        self.unchecked = False
        self.keyed = False
        self._head: tuple[str, bytes] | None = None

    @property
    def head(self) -> str | None:
        """The newest link seen, as its mode and hex (None: no link yet)."""
        return None if self._head is None else self._head[0] + self._head[1].hex()

    @property
    def status(self) -> str:
        """The chain's verdict (see `VerifyReport.chain`)."""
        if any(p.check == "chain" for p in self.problems):
            return "broken"
        if self.chained_from is None:
            return "unchained"
        if self.unchecked:
            return "unchecked"
        return "intact" if self.chained_from == 1 else "partial"

    def pages(
        self,
        pages: Iterable[Sequence[StoredRow]],
        mapper: EventMapper,
        *,
        workers: int = 0,
        ranges: RunRanges | None = None,
        worker_timeout: float = WORKER_TIMEOUT,
    ) -> int:
        """Check the links of a run's stored events, page by page; how many were checked.

        The check of the chain alone, a streaming pass that never decodes an event:
        each page's stored JSON (its stored bytes themselves when the store neither
        encrypts nor compresses) goes through `page`. An event that cannot be
        decrypted or decompressed is a ``format`` problem. With `workers`, pages that
        follow on go to that many worker processes (`_Ahead`; with `ranges`, ranges of
        versions each worker reads itself: `_Ranges`), which cannot start processes falls
        back to checking here, as does a worker that does not answer within `worker_timeout`
        seconds (`ChainWorkers.wait`).
        """
        if ranges is not None:
            return _Ranges(self, ranges, worker_timeout).pages(pages, mapper, workers)
        if workers > 0:
            try:
                pool = ChainWorkers(self.chain, self.run_id, workers, timeout=worker_timeout)
            except OSError:
                pool = None
            if pool is not None:
                try:
                    return _Ahead(self, pool).pages(pages, mapper)
                finally:
                    pool.close()
        count = 0
        for page in pages:
            self.page(self.readable(page, mapper))
            count += len(page)
        return count

    def following(self, rows: Sequence[StoredRow]) -> bool:
        """Whether `rows` would be checked by `Chain.run_along` from their first: the run is
        chained in this chain's mode up to them, they begin at the version expected and
        no problem was found yet (after one, pages are checked here, one after another)."""
        return bool(rows) and self.on_course and rows[0][0] == self.expected

    @property
    def on_course(self) -> bool:
        """Whether the run is chained in this chain's mode up to the event `expected` and no
        problem was found yet: the next events can be followed elsewhere (`moved`)."""
        head = self._head
        return (
            not self.problems
            and self.chained_from is not None
            and head is not None
            and head[0] == self.chain.mode
        )

    def state(self) -> tuple[Any, ...]:
        """What checking a page changes, to go back to (`restore`)."""
        return (self.previous, self.expected, self.chained_from, self.unchecked, self.keyed,
                self._head, len(self.problems))  # fmt: skip

    def restore(self, state: tuple[Any, ...]) -> None:
        """Go back to a `state`: its problems, and where the chain was. Events found
        unreadable since stay problems: their pages were read once (`readable`), and
        checking them again does not find them again."""
        (self.previous, self.expected, self.chained_from, self.unchecked, self.keyed,
         self._head, problems) = state  # fmt: skip
        self.problems[problems:] = [p for p in self.problems[problems:] if p.check == "format"]

    def assume(self, rows: Sequence[StoredRow]) -> bool:
        """Move past `rows` as `page` would if each follows on (a worker checks that): their
        last stored link is the chain's; False if the last holds no link."""
        parts = split(rows[-1][2])
        if parts is None:
            return False
        self.expected += len(rows)
        self.previous = parts[2]
        self._head = (self.chain.mode, parts[2])
        return True

    def moved(self, count: int, link: bytes) -> None:
        """Move past `count` events that follow on in this chain's mode, the last one's
        link `link` (a range checked elsewhere: `_Ranges`)."""
        self.expected += count
        self.previous = link
        self._head = (self.chain.mode, link)

    def checked(self, pages: Iterable[Sequence[StoredRow]], mapper: EventMapper) -> Iterator[Event]:
        """Each page's links checked (`page`), then its events decoded, one after another.

        What `verify` folds: the chain is checked a page ahead of the table's rules, over
        the JSON each event is decoded from, so every event is read and decrypted once.
        """
        for page in pages:
            rows = self.readable(page, mapper)
            self.page(rows)
            for version, topic, data in rows:
                try:
                    yield mapper.from_json(StoredEvent(self.run_id, version, topic, data), data)
                except EventFormatError as error:
                    if holds_bytes(data):  # a state that is not: `page` reported it
                        self._unreadable(version, error)

    def readable(self, page: Sequence[StoredRow], mapper: EventMapper) -> Sequence[StoredRow]:
        """The page's events that can be decrypted and decompressed, each with its JSON."""
        if mapper.cipher is None and mapper.compressor is None:
            return page
        rows = []
        for version, topic, state in page:
            if not holds_bytes(state):  # edited in the database: `check` reports it
                rows.append((version, topic, state))
                continue
            try:
                data = mapper.json_of(StoredEvent(self.run_id, version, topic, state))
            except EventFormatError as error:
                self._unreadable(version, error)
                continue
            rows.append((version, topic, data))
        return rows

    def page(self, rows: Sequence[StoredRow]) -> None:
        """Check the links of one page of the run's events in version order, each row holding
        its stored JSON: links that follow on go through `Chain.run_along`, the rest
        (the first, a break, an event without a link) through `check`."""
        index = 0
        while index < len(rows):
            if self.chained_from is not None:
                done, link = self.chain.run_along(
                    self.previous, self.expected, self.run_id, rows, index
                )
                if done:
                    index += done
                    self.expected += done
                    self.previous = link
                    self._head = (self.chain.mode, link)
                    continue
            self.check(*rows[index])
            index += 1

    def check(self, version: int, topic: str, data: bytes) -> None:
        """Check the link of one stored event whose JSON (decrypted, decompressed) is `data`."""
        if not holds_bytes(data):
            self._not_bytes(version, data)
            return
        if version == self.expected and self.chained_from is not None:
            link = self.chain.follows(self.previous, self.run_id, version, topic, data)
            if link:  # the common case: the link is there and right
                self.expected, self.previous = version + 1, link
                self._head = (self.chain.mode, link)
                return
        self._check(version, topic, data)

    def _not_bytes(self, version: int, data: object) -> None:
        """A row whose stored state is not bytes (NULL, text: edited in the database): it
        cannot be read, and its link is unknown, so the chain is broken there (the next
        event's link is then compared with none, and breaks too)."""
        what = not_bytes(data)
        if type(version) is int and version != self.expected:  # events missing before it
            self._broken(self.expected, _missing(self.expected, version))
        self.problems.append(Problem(version, "format", f"{what} (edited in the database)"))
        if self.chained_from is not None or self._must_link(version):
            self._broken(version, f"{what}: its link cannot be read; it was edited")
        if type(version) is int:
            self.expected, self.previous = version + 1, b""

    def _check(self, version: int, topic: str, data: bytes) -> None:
        if type(version) is not int:
            self._misnumbered(version, topic, data)
            return
        gap = version != self.expected
        if gap:  # its link cannot match either: one problem, at the first missing version
            self._broken(self.expected, _missing(self.expected, version))
        self.expected = version + 1
        parts = split(data)
        if parts is None:
            if self.chained_from is not None:
                self._broken(version, "the event has no link, but the run is chained before it")
            elif self._must_link(version):
                self._broken(version, _STRIPPED)
            self.previous = b""
            return
        body, mode, link = parts
        self._head = (mode, link)
        if self.chained_from is None:
            self.chained_from = version
        if not gap:
            self._link(version, topic, body, mode, link)
        self.previous = link

    def _misnumbered(self, version: object, topic: str, data: bytes) -> None:
        """A row whose version is not a whole number (SQLite keeps 3.5 as it is): the chain
        breaks at the version expected there, and the row's stored link stands for that
        version's (as after a missing event), so the events after it are checked on."""
        expected = self.expected
        self._broken(expected, f"the event after version {expected - 1} has version "
                     f"{version!r}, not a whole number: its row was edited")  # fmt: skip
        parts = split(data)
        self.expected = expected + 1
        if parts is None:
            self.previous = b""
            return
        _, mode, link = parts
        self._head = (mode, link)
        self.chained_from = expected if self.chained_from is None else self.chained_from
        self.previous = link

    def _link(self, version: int, topic: str, body: bytes, mode: str, link: bytes) -> None:
        if mode not in (PLAIN, KEYED):
            self._broken(version, f"the link's mode {mode!r} is unknown")
            return
        if self.chain.keyed and mode == PLAIN:
            self._broken(version, "linked without the chain key (written before it was set, "
                         "or forged)")  # fmt: skip
            return
        if self.plain and mode == KEYED and self._must_link(version):
            self._broken(version, _KEYED_IN_PLAIN)
            return
        self.keyed = self.keyed or mode == KEYED
        computed = self.chain.recompute(mode, self.previous, self.run_id, version, topic, body)
        if computed is None:
            self.unchecked = True
        elif computed != link:
            self._broken(version, _WHY)

    def _must_link(self, version: int) -> bool:
        """Whether the store's recorded chain says event `version` carries a link."""
        return self.must_link_from is not None and version >= self.must_link_from

    def _unreadable(self, version: int, error: EventFormatError) -> None:
        self.problems.append(Problem(version, "format", error.reason))

    def _broken(self, version: int, message: str) -> None:
        self.problems.append(Problem(version, "chain", message))


class _Ahead:
    """`ChainCheck.pages` with worker processes: each page that follows on goes to a worker,
    and the check moves past it as if it were right (`ChainCheck.assume`), so the next page
    can be read at once; while every worker has `_DEPTH` pages, this process checks the next
    itself. Pages are settled in order: a page a worker finds not to follow on all the way
    (a break, a link in another mode, anything) sends the check back to where it stood
    before that page (`ChainCheck.restore`), and that page and every later one held are
    checked here, one after another, as without workers, as is the rest of the run. So the
    report is the one the check without workers gives, event for event.
    """

    def __init__(self, check: ChainCheck, pool: ChainWorkers) -> None:
        self.check = check
        self.pool = pool
        self.held: deque[tuple[Future[int] | None, Sequence[StoredRow], tuple[Any, ...]]]
        self.held = deque()
        self.ahead = True
        """Whether pages still go to the workers (not after a page was sent back)."""

    def pages(self, pages: Iterable[Sequence[StoredRow]], mapper: EventMapper) -> int:
        """Check every page (see the class); how many events were read."""
        count = 0
        for page in pages:
            count += len(page)
            self.one(self.check.readable(page, mapper))
            self.settle(wait=True, keep=self.pool.workers * _DEPTH * 2)
        self.settle(wait=True)
        return count

    def one(self, rows: Sequence[StoredRow]) -> None:
        """Hand `rows` to a worker, check them here, or (when not following on) settle the
        pages held, then check them here."""
        check = self.check
        if not (self.ahead and check.following(rows)):
            self.settle(wait=True)
            check.page(rows)
            return
        state = check.state()
        if sum(future is not None for future, _, _ in self.held) >= self.pool.workers * _DEPTH:
            check.page(rows)
            self.held.append((None, rows, state))
            return
        future = None
        if check.assume(rows):
            try:
                future = self.pool.submit(state[0], state[1], rows)
            except (BrokenExecutor, OSError):  # no worker could start: checked here
                check.restore(state)
                self.ahead = False
        if future is None:
            check.page(rows)
        self.held.append((future, rows, state))

    def settle(self, *, wait: bool, keep: int = 0) -> None:
        """Take the results of the pages held, oldest first: those done, and with `wait` the
        others too until at most `keep` are held (pages held are memory: a slow or stalled
        worker must not let the reading run ahead); a page not right all the way is checked
        again here, with all after it."""
        held = self.held
        while held:
            future, rows, state = held[0]
            if future is not None and not future.done() and not (wait and len(held) > keep):
                return
            held.popleft()
            if future is None or _followed(future, self.pool) == len(rows):
                continue
            self.ahead = False
            self.check.restore(state)
            self.check.page(rows)
            while held:
                self.check.page(held.popleft()[1])


@attrs.frozen
class RunRanges:
    """How to check a run by ranges of versions (`_Ranges`): the `reading` of a range, the
    run's newest version when the check began, and its rows after a version, a page at a
    time, read here (from a range that does not follow on, and past the newest)."""

    reading: RangeReading
    newest: int
    rows_after: Callable[[int], Iterable[Sequence[StoredRow]]]


RANGE = 20_000
"""Events a range holds: a query each, streamed; a worker holds a page of it at a time."""
_HELD = 16
"""Ranges checked and not yet settled, at most (each a `Followed`, a few bytes): enough
for this process to go on while a worker starts (a second or so), few enough that a range
that does not follow on wastes little checked after it."""


class _Ranges:
    """`ChainCheck.pages` by ranges of versions: after the run's first page (checked here,
    through `page`), each `RANGE` versions up to the newest are read and followed on their
    own (`check_range`), by worker processes and, while each has `_DEPTH` ranges, here (a
    run shorter than a whole range past its first page is read page by page: opening the
    ranges' connection would cost more than the queries they save). Ranges are settled in
    order: one that follows on all the way from the link the check stands at moves the
    check past it (`ChainCheck.moved`); at the first that does not (an edit, a hole, a
    link in another mode, an event that cannot be decoded, a failed read) the rest of the
    run is read and checked here, page by page, from that range's first version, as
    without ranges, as are the events stored past the newest. So the report is the one
    checking page by page gives, event for event.
    """

    def __init__(self, check: ChainCheck, ranges: RunRanges, timeout: float) -> None:
        self.check = check
        self.ranges = ranges
        self.timeout = timeout
        self.pool: ChainWorkers | None = None
        self.held: deque[tuple[Future[Followed] | Followed, int, int]] = deque()
        self.count = 0

    def pages(self, pages: Iterable[Sequence[StoredRow]], mapper: EventMapper, workers: int) -> int:
        """Check every event (see the class); how many were read."""
        check, rest = self.check, iter(pages)
        for page in rest:  # the first: where the chain begins, checked as always
            self.count += len(page)
            check.page(check.readable(page, mapper))
            break
        try:
            if not (self.count and check.on_course):
                return self._read(mapper, rest)  # unchained, broken: page by page
            if self.ranges.newest - check.expected + 1 < RANGE:  # its connection costs more
                return self._read(mapper, rest)
            return self._by_ranges(mapper, workers)
        finally:
            self.ranges.reading.reader.close()

    def _by_ranges(self, mapper: EventMapper, workers: int) -> int:
        pool = None
        if workers > 0:
            try:
                check, reading = self.check, self.ranges.reading
                pool = ChainWorkers(
                    check.chain, check.run_id, workers, reading, timeout=self.timeout
                )
            except OSError:
                pool = None
        self.pool = pool
        try:
            for first in range(self.check.expected, self.ranges.newest + 1, RANGE):
                self._one(pool, first, min(first + RANGE - 1, self.ranges.newest))
                if not self._settle(wait=True, keep=_HELD if pool else 0):
                    break
            else:
                self._settle(wait=True)
        finally:
            if pool is not None:
                pool.close()
            self.ranges.reading.reader.close()  # not held idle while the rest is read
        return self._read(mapper, self.ranges.rows_after(self.check.expected - 1))

    def _one(self, pool: ChainWorkers | None, first: int, last: int) -> None:
        """Send the range to a worker, or (all busy, or none) check it here."""
        if pool is not None and sum(isinstance(f, Future) for f, _, _ in self.held) < (
            pool.workers * _DEPTH
        ):
            try:
                self.held.append((pool.submit_range(first, last), first, last))
                return
            except (BrokenExecutor, OSError):  # checked here instead
                pass
        self.held.append((self._here(first, last), first, last))

    def _here(self, first: int, last: int) -> Followed:
        check = self.check
        try:
            return check_range(check.chain, check.run_id, self.ranges.reading, first, last)
        except Exception as error:  # a failed read: the range is read again page by page
            if not is_database_error(error) and not isinstance(error, StagetrailError):
                raise
            return Followed(None, 0, b"")

    def _settle(self, *, wait: bool, keep: int = 0) -> bool:
        """Take the ranges held, oldest first: those done, and with `wait` the others too
        until at most `keep` are held (a stalled worker must not let the check run on
        without bound); False at the first that does not follow on."""
        held, check = self.held, self.check
        while held:
            result, first, last = held[0]
            if isinstance(result, Future):
                if not result.done() and not (wait and len(held) > keep):
                    return True
                result = _ranged(result, self.pool)
            held.popleft()
            if result.before != check.previous or result.count != last - first + 1:
                for future, _, _ in held:
                    if isinstance(future, Future):
                        future.cancel()
                held.clear()
                return False
            check.moved(result.count, result.last)
            self.count += result.count
        return True

    def _read(self, mapper: EventMapper, pages: Iterable[Sequence[StoredRow]]) -> int:
        """Check `pages` here, one after another; the events read in all."""
        for page in pages:
            self.count += len(page)
            self.check.page(self.check.readable(page, mapper))
        return self.count


def _ranged(future: Future[Followed], pool: ChainWorkers | None) -> Followed:
    """What a worker found of a range (none followed: the worker or its read failed, or it
    did not answer in time: `ChainWorkers.wait`)."""
    if pool is not None and not pool.wait(future):
        return Followed(None, 0, b"")
    try:
        return future.result()
    except Exception:  # any failure of it: the range is read again here, which says why
        return Followed(None, 0, b"")


_DEPTH = 2
"""Pages held per worker: one it checks, one waiting, so it never waits for this process."""


def _followed(future: Future[int], pool: ChainWorkers) -> int:
    """How many events of a page a worker found to follow on (0: the worker was lost, or
    did not answer in time: `ChainWorkers.wait`)."""
    if not pool.wait(future):
        return 0
    try:
        return future.result()
    except (BrokenExecutor, OSError):  # checked here instead
        return 0


def _missing(expected: int, found: int) -> str:
    if found == expected + 1:
        return f"event {expected} is missing (deleted, or moved)"
    return f"events {expected} to {found - 1} are missing (deleted, or moved)"


_STRIPPED = (
    "the event has no link, but the store links every event stored since its chain was "
    "recorded: its link was removed"
)
_KEYED_IN_PLAIN = (
    "linked with a key, but the store's recorded chain is plain (no writer holds a key): "
    "its link was forged"
)
_WHY = "the link does not match: this event was edited, moved or inserted, or the one before it was"


def _replay(first: RunStarted, rest: Iterator[Event], problems: list[Problem]) -> None:
    """The run's machine replayed; a refused event is reported and passed over."""

    def refused(event: Event, error: StagetrailError) -> None:
        problems.append(Problem(event.version, "transition", str(error)))

    try:
        pipeline = Pipeline.from_dict(first.table)
    except (PipelineError, KeyError, TypeError) as error:
        problems.append(Problem(1, "table", f"the stored table is not valid: {error}"))
        return
    try:
        replay(first, rest, pipeline=pipeline, refused=refused)
    except StagetrailError as error:  # only the start can raise: later refusals are reported
        problems.append(Problem(1, "table", f"the stored table is not valid: {error}"))


class _Seen:
    """What verify checks of every event beside the machine: its time and each projection."""

    def __init__(self, projections: Sequence[Projection[Any]], problems: list[Problem]) -> None:
        self.projections = projections
        self.problems = problems
        self.states = {p.name: p.initial() for p in projections}
        self.count = 0

    def each(self, events: Iterable[Event]) -> Iterator[Event]:
        """`events`, each checked and folded before it is passed on."""
        before: Event | None = None
        for event in events:
            self.count += 1
            if before is not None and event.timestamp < before.timestamp:
                self.problems.append(
                    Problem(event.version, "time", "stamped before the event it follows")
                )
            before = event
            yield event
            self._fold(event)  # after the machine's check: its problems come first

    def _fold(self, event: Event) -> None:
        states = self.states
        for projection in self.projections:
            if projection.name not in states or not projection.relevant(event):
                continue
            try:
                states[projection.name] = projection.apply(states[projection.name], event)
            except ProjectionError as error:
                self.problems.append(
                    Problem(event.version, f"projection {projection.name}", str(error))
                )
                del states[projection.name]  # its later states would only repeat the error
