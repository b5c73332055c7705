"""The store's errors: a write another writer won, a store that cannot be used."""

from __future__ import annotations

from uuid import UUID

from events.errors import StagetrailError


class ConcurrencyConflict(StagetrailError, RuntimeError):
    """Another writer appended to the run first; call `run.refresh()` and retry.

    Attributes:
        run_id: the run both writers appended to.
        version: the version this writer tried to write.
    """

    def __init__(self, run_id: UUID, version: int) -> None:
        self.run_id = run_id
        self.version = version
        super().__init__(
            f"run {run_id} already has an event at version {version}: another writer "
            "appended first; nothing of this append was written. "
            "Call run.refresh() and try again."
        )


class StoreError(StagetrailError, OSError):
    """The store cannot be opened, read or written; the URL is shown masked.

    Attributes:
        url: the store URL with any password replaced by ``***``.
    """

    def __init__(self, url: str, problem: str) -> None:
        self.url = url
        self.problem = problem
        super().__init__(f"store {url}: {problem}")
