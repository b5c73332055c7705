"""Worker processes checking pages of one run's hash chain while the caller reads on.

Every stored event holds its own link, so a page of a run can be checked on its
own from the link stored in the event before it: `Chain.run_along` in another
process, on a copy of the page's rows. A long run's check is then bounded by
reading it rather than by hashing it, on as many cores as there are workers.
The workers only say how far a page follows on; the caller decides what a page
that does not means (`engine.verify.ChainCheck`), exactly as without workers.

Where the store can read a run by ranges of versions over connections of their own
(`RangeReading`: PostgreSQL, SQLite), a worker reads its range itself (`check_range`), so
neither the reading nor the hashing is left to one process.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import threading
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, wait
from typing import Any, Protocol, TypeVar
from uuid import UUID

import attrs
from eventsourcing.persistence import Cipher, Compressor

from engine.store.chain import Chain, StoredRow, split
from engine.store.mapper import opened

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


WORKER_TIMEOUT = 60.0
"""Seconds a worker may take to answer for a page or range once the caller waits for it
(a range of `engine.verify.RANGE` events takes well under one): one that neither answers
nor dies by then is taken as hung (a read waiting on a lock, a stopped process)."""

MAX_WORKER_TIMEOUT = threading.TIMEOUT_MAX
"""The most seconds a worker may be given: a longer wait cannot be made (OverflowError)."""


class ChainWorkers:
    """Worker processes checking pages of run `run_id`'s chain in `chain`'s mode.

    Args:
        chain: the chain to check with (a keyed one's derived key goes to the workers).
        run_id: the run whose pages are checked.
        workers: how many processes (started fresh: no connection or thread is inherited).
        timeout: seconds `wait` waits for an answer before it stops every worker.
    """

    def __init__(
        self,
        chain: Chain,
        run_id: UUID,
        workers: int,
        reading: RangeReading | None = None,
        *,
        timeout: float = WORKER_TIMEOUT,
    ) -> None:
        self._pool = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_begin,
            initargs=(chain, run_id, reading),
        )
        self.workers = workers
        self.run_id = run_id
        self.timeout = timeout
        self._submitted: list[Future[Any]] = []
        self._started: list[multiprocessing.process.BaseProcess] = []
        """The workers, as the pool starts them (on a submit): known before they run any
        code of theirs, so one that hangs while it starts is stopped too."""
        self.stopped = False
        """Whether the workers were stopped (one did not answer in time): no more waits."""

    def wait(self, future: Future[Any]) -> bool:
        """Wait for `future` up to `timeout` seconds: whether it is done. When not, its worker
        is taken as hung and every worker is stopped (`stop`): its pages and all those not
        answered yet fail, for the caller to check itself, and no later wait waits."""
        if not self.stopped and not wait([future], timeout=self.timeout).done:
            self.stop()
        return future.done()

    def stop(self) -> None:
        """Kill every worker (a hung one answers no request to end): the pool breaks, so its
        pages not answered fail, and nothing more is sent to it."""
        if self.stopped:
            return
        self.stopped = True
        _log.warning(
            "verify: a chain worker checking run %s did not answer within %s s: its %d "
            "worker(s) were stopped and the pages they held are checked here",
            self.run_id, self.timeout, self.workers,
        )  # fmt: skip
        for worker in self._started:
            worker.kill()  # SIGKILL: a stopped process ends too (Windows: terminated)

    def submit(self, previous: bytes, version: int, rows: Sequence[StoredRow]) -> Future[int]:
        """Check `rows` (from `version` on, following the link `previous`) in a worker: how
        many of them follow on (`Chain.run_along`)."""
        return self._kept(lambda: self._pool.submit(_along, previous, version, rows))

    def submit_range(self, first: int, last: int) -> Future[Followed]:
        """Read and check versions `first` to `last` in a worker (`check_range`); needs the
        `reading` the pool was started with."""
        return self._kept(lambda: self._pool.submit(_range, first, last))

    def _kept(self, submit: Callable[[], Future[_T]]) -> Future[_T]:
        """`submit`'s future, among those `close` waits for while they run; a worker the
        pool starts for it (it starts them as work comes) among those `stop` kills."""
        with _SPAWNING:  # no other pool of this process starts one meanwhile
            before = set(multiprocessing.active_children())
            future = submit()
            self._started += set(multiprocessing.active_children()) - before
        self._submitted = [f for f in self._submitted if not f.done()]
        self._submitted.append(future)
        return future

    def close(self) -> None:
        """Stop the workers, dropping pages not begun; a page still checked is waited for up
        to `timeout` seconds (then every worker is stopped: `stop`), so closing never hangs."""
        running = [f for f in self._submitted if not (f.cancel() or f.done())]
        if running and not self.stopped and wait(running, timeout=self.timeout).not_done:
            self.stop()
        self._pool.shutdown(wait=not self.stopped, cancel_futures=True)


_SPAWNING = threading.Lock()
"""Held while a pool is given work (when it may start a worker), so the children that
appear meanwhile are that pool's (`ChainWorkers._kept`)."""

_checking: tuple[Chain, UUID, RangeReading | None] | None = None
"""A worker's chain, run and reading (set when it starts)."""


def _begin(chain: Chain, run_id: UUID, reading: RangeReading | None) -> None:
    global _checking
    _checking = (chain, run_id, reading)


def _along(previous: bytes, version: int, rows: Sequence[StoredRow]) -> int:
    assert _checking is not None  # set by the pool's initializer
    chain, run_id, _ = _checking
    return chain.run_along(previous, version, run_id, rows)[0]


def _range(first: int, last: int) -> Followed:
    assert _checking is not None  # set by the pool's initializer
    chain, run_id, reading = _checking
    assert reading is not None  # a pool that checks ranges was given how to read them
    try:
        return check_range(chain, run_id, reading, first, last)
    except Exception:  # any failure (a read, a lost server): the caller reads it, which says why
        return Followed(None, 0, b"")


class RangeReader(Protocol):
    """Streams a run's rows by range of versions over a connection of its own; picklable."""

    def pages(
        self, run_id: UUID, first: int, last: int, size: int
    ) -> Generator[list[StoredRow], None, None]:
        """The rows with `first <= version <= last`, in version order, `size` a page."""

    def close(self) -> None:
        """Close its connection."""


@attrs.frozen
class RangeReading:
    """How a process reads a run's ranges itself: the reader and the stored bytes' decoders
    (the mapper's cipher and compressor: a worker decodes what it reads, as `verify` does)."""

    reader: RangeReader
    cipher: Cipher | None = None
    compressor: Compressor | None = None

    def decoded(self, rows: Sequence[StoredRow]) -> Sequence[StoredRow]:
        """`rows` with each stored JSON decrypted and decompressed (`opened`, as `verify`
        reads them), up to the first that cannot be (the caller then checks the range
        itself, and reports it)."""
        cipher, compressor = self.cipher, self.compressor
        if cipher is None and compressor is None:
            return rows
        decoded = []
        for version, topic, data in rows:
            try:
                decoded.append((version, topic, opened(cipher, compressor, data)))
            except Exception:  # the cipher and codecs raise assorted types: not followed
                break
        return decoded


@attrs.frozen
class Followed:
    """What checking a range of versions found: the link stored in the event before it
    (None: missing, or without a link), how many of its events follow on from that
    link, one after another, and the last of their links."""

    before: bytes | None
    count: int
    last: bytes


RANGE_PAGE = 1000
"""Rows a range is read and checked by at a time: what one process holds of it."""


def check_range(
    chain: Chain, run_id: UUID, reading: RangeReading, first: int, last: int
) -> Followed:
    """Read the run's versions `first` - 1 to `last` and follow their links from the one
    stored in `first` - 1 (`Chain.run_along`): how far they follow on. Reads stop at the
    first event that does not.

    Raises:
        StoreError, sqlite3.Error, psycopg.Error: the read failed (the caller checks the
            range itself).
    """
    pages = reading.reader.pages(run_id, first - 1, last, RANGE_PAGE)
    before: bytes | None = None
    previous, version = b"", first
    try:
        for page in pages:
            rows, start = reading.decoded(page), 0
            if before is None:
                parts = split(rows[0][2]) if rows and rows[0][0] == first - 1 else None
                if parts is None:
                    return Followed(None, 0, b"")
                before = previous = parts[2]
                start = 1
            done, previous = chain.run_along(previous, version, run_id, rows, start)
            version += done
            if done < len(page) - start:
                break
    finally:
        if version <= last:  # stopped inside the query: its connection goes with the rows left
            reading.reader.close()
            with contextlib.suppress(Exception):
                pages.close()
    return Followed(before, version - first, previous)
