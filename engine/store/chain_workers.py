"""Worker processes checking pages of one run's hash chain while the caller reads on.

Every stored event holds its own link, so a page of a run can be checked on its
own from the link stored in the event before it: `Chain.run_along` in another
process, on a copy of the page's rows. A long run's check is then bounded by
reading it rather than by hashing it, on as many cores as there are workers.
The workers only say how far a page follows on; the caller decides what a page
that does not means (`engine.verify.ChainCheck`), exactly as without workers.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from uuid import UUID

from engine.store.chain import Chain, StoredRow


class ChainWorkers:
    """Worker processes checking pages of run `run_id`'s chain in `chain`'s mode.

    Args:
        chain: the chain to check with (a keyed one's derived key goes to the workers).
        run_id: the run whose pages are checked.
        workers: how many processes (started fresh: no connection or thread is inherited).
    """

    def __init__(self, chain: Chain, run_id: UUID, workers: int) -> None:
        self._pool = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_begin,
            initargs=(chain, run_id),
        )
        self.workers = workers

    def submit(self, previous: bytes, version: int, rows: Sequence[StoredRow]) -> Future[int]:
        """Check `rows` (from `version` on, following the link `previous`) in a worker: how
        many of them follow on (`Chain.run_along`)."""
        return self._pool.submit(_along, previous, version, rows)

    def close(self) -> None:
        """Stop the workers, dropping pages not begun."""
        self._pool.shutdown(wait=True, cancel_futures=True)


_checking: tuple[Chain, UUID] | None = None
"""A worker's chain and run (set when it starts)."""


def _begin(chain: Chain, run_id: UUID) -> None:
    global _checking
    _checking = (chain, run_id)


def _along(previous: bytes, version: int, rows: Sequence[StoredRow]) -> int:
    assert _checking is not None  # set by the pool's initializer
    chain, run_id = _checking
    return chain.run_along(previous, version, run_id, rows)[0]
