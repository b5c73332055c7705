"""The store's errors: a write another writer won, a store that cannot be used.

Users import them from `engine.errors`, which re-exports every error of every layer.
"""

from __future__ import annotations

from uuid import UUID

from eventsourcing.persistence import PersistenceError

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


class RunErased(StagetrailError, LookupError):
    """The run was deleted and erased (`Engine.compact`) after this handle read it.

    Its versions are free again, so an append of a stale handle would put events
    into the run id starting mid-way; the store refuses it instead.

    Attributes:
        run_id: the erased run.
        version: the version the append would have written after `version - 1`,
            which the store no longer holds (or holds as another run's event).
    """

    def __init__(self, run_id: UUID, version: int) -> None:
        self.run_id = run_id
        self.version = version
        super().__init__(
            f"run {run_id} was deleted and erased from the store (compact) after this handle "
            f"read it: it no longer holds the event {version - 1} this handle read (the id may "
            f"name a new run by now) to append event {version} after; "
            "nothing was written. Start a new run (or fork one that still exists)."
        )


class RunBeingErased(RunErased):
    """The run is deleted and a compaction has begun erasing it: part of its events are gone.

    On PostgreSQL a long run is erased over several transactions (and a killed
    compaction may stop between two). Until `Engine.compact` finishes it, every reader
    refuses the run with this error rather than show what is left of its history.

    Attributes:
        run_id: the run being erased.
        version: a version of the run the store no longer holds.
    """

    def __init__(self, run_id: UUID, version: int) -> None:
        self.run_id = run_id
        self.version = version
        LookupError.__init__(
            self,
            f"run {run_id} was deleted and is being erased from the store (compact): its "
            f"event {version} and others are already gone, so it can no longer be read. "
            "Run `stagetrail compact` to finish erasing it.",
        )


class RunErasedWhileRead(RunErased):
    """The run was erased (`Engine.compact`) while it was read: no export or state of it.

    A read of a long run takes several queries; one after the erase found its events
    gone (or another run under its id). Rather than give what was read before as the
    whole run (an export `import` would take as complete, a state of part of its
    history), the reader refuses it.

    Attributes:
        run_id: the erased run.
        version: the first version the read expected and no longer found.
    """

    def __init__(self, run_id: UUID, version: int) -> None:
        self.run_id = run_id
        self.version = version
        LookupError.__init__(
            self,
            f"run {run_id} was deleted and erased from the store (compact) while it was "
            f"read: its event {version} is gone (or the id names another run by now), so "
            "nothing of it is given. The run no longer exists; read another.",
        )


class HeadMissing(PersistenceError):
    """A recorder's append found a run's event before the batch missing; nothing written."""


class StoreError(StagetrailError, OSError):
    """The store cannot be opened, read or written; the URL is shown masked.

    Attributes:
        url: the store URL with any password replaced by ``***``.
    """

    def __init__(self, url: str, problem: str) -> None:
        self.url = url
        self.problem = problem
        super().__init__(f"store {url}: {problem}")


class ChainKeyMismatch(StoreError, PermissionError):
    """A writer's chain key is not the store's recorded one (or none, or one); nothing written."""

    def __init__(self, url: str, problem: str, recorded: str) -> None:
        self.recorded = recorded
        """The store's chain mode as recorded in its meta table: ``plain`` or ``keyed``."""
        super().__init__(url, problem)


class AppendOutcomeUnknown(PersistenceError):
    """A recorder lost its connection around a commit and could not learn the outcome."""


class OutcomeUnknown(StoreError):
    """The store became unreachable while an append was committing; it may or may not be stored.

    Call `run.refresh()` once the store answers again: if the run's newest events
    are the ones you recorded, the append was stored; otherwise record them again.

    Attributes:
        run_id: the run appended to.
        version: the first version of the append.
    """

    def __init__(self, url: str, run_id: UUID, version: int, problem: str) -> None:
        self.run_id = run_id
        self.version = version
        super().__init__(
            url,
            f"the connection was lost while appending to run {run_id} at version {version} "
            f"and the store stayed unreachable, so whether it was stored is unknown "
            f"({problem}); call run.refresh() when the store answers: if the run's "
            "newest events are yours it was stored, else record them again",
        )


class StoreReadOnly(StoreError, PermissionError):
    """The store can be read but not written (file permissions, read-only role, replica)."""


class StoreFull(StoreError):
    """The disk (or the database's size limit) is full; nothing of this write was stored."""
