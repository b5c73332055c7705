"""Errors of the read side, in stagetrail's one error hierarchy."""

from __future__ import annotations

from uuid import UUID

from events import Event, StagetrailError


class ProjectionError(StagetrailError, RuntimeError):
    """A projection's handler raised; names the projection, the event and its version."""

    def __init__(self, projection: str, event: Event, cause: BaseException) -> None:
        self.projection = projection
        self.event_type = type(event).__name__
        self.run_id: UUID = event.run_id
        self.version = event.version
        self.cause = f"{type(cause).__name__}: {cause}"
        super().__init__(
            f"projection {projection!r} failed on {self.event_type} "
            f"(run {self.run_id}, version {self.version}): {self.cause}"
        )


class ProjectionStateError(StagetrailError, TypeError):
    """A projection state cannot be stored: it is not JSON and the projection has no codec."""

    def __init__(self, projection: str, problem: str) -> None:
        self.projection = projection
        self.problem = problem
        super().__init__(f"projection {projection!r}: {problem}")


class UnknownProjection(StagetrailError, LookupError):
    """No projection of that name is registered."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        listed = ", ".join(sorted(known)) or "none"
        super().__init__(f"no projection named {name!r} is registered (registered: {listed})")


class ProjectionNameTaken(StagetrailError, ValueError):
    """Another projection class is already registered under this name."""

    def __init__(self, name: str, registered: str) -> None:
        self.name = name
        self.registered = registered
        super().__init__(
            f"another projection is registered as {name!r}: {registered}; give yours another `name`"
        )


class PositionMoved(StagetrailError, RuntimeError):
    """Another process advanced a projection while this one folded a page; refold it."""

    def __init__(self, name: str, expected: int, found: int) -> None:
        self.name = name
        self.expected = expected
        self.found = found
        super().__init__(f"projection {name!r} moved from position {expected} to {found} meanwhile")


class ProjectionReplaced(StagetrailError, RuntimeError):
    """The store's state of a projection now belongs to other code registered elsewhere."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"projection {name!r} was re-registered in this store by other code (another "
            "version or changed handlers); this process runs stale code: restart it"
        )
