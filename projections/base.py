"""The projection protocol: an initial state and handlers per event type, folded purely.

A projection class declares `initial()` and methods marked with `@on(EventType)`.
`apply(state, event)` calls the handler for the event's type (others pass over),
so the same code serves on-demand folds, time travel and persistent use.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from functools import cache
from types import CodeType
from typing import Any, ClassVar, Generic, TypeVar

from events import JSON, Event, InvalidPayload, strict_json
from projections._fast import collector_paused
from projections.errors import ProjectionError, ProjectionStateError

S = TypeVar("S")
F = TypeVar("F", bound=Callable[..., Any])

SCOPES = ("all", "run", "pipeline")
"""How a persistent projection partitions its state: one, per run, per pipeline."""

_HANDLES = "__stagetrail_handles__"


def on(*event_types: type[Event]) -> Callable[[F], F]:
    """Mark a method `(self, state, event) -> state` as the handler of `event_types`.

    Raises:
        TypeError: no event type given, or one that is not an `Event` subclass.
    """
    if not event_types:
        raise TypeError("@on needs at least one event type")
    for event_type in event_types:
        if not (isinstance(event_type, type) and issubclass(event_type, Event)):
            raise TypeError(f"@on takes Event subclasses, got {event_type!r}")

    def mark(method: F) -> F:
        setattr(method, _HANDLES, (*getattr(method, _HANDLES, ()), *event_types))
        return method

    return mark


class Projection(Generic[S]):
    """A pure fold over events: subclass it, define `initial`, mark handlers with `@on`.

    Class attributes:
        name: the registered name (default: the class name in snake_case).
        version: bump it to discard stored snapshots and persistent state.
        scope: how persistent state is partitioned: "all", "run" or "pipeline".
        every_event: True when `apply` must see events without a handler too (the
            default for a class that overrides `apply`).
    """

    name: ClassVar[str] = ""
    version: ClassVar[int] = 1
    scope: ClassVar[str] = "all"
    every_event: ClassVar[bool] = False
    handlers: ClassVar[dict[type[Event], Callable[[Any, Any, Any], Any]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = _snake(cls.__name__)
        if cls.scope not in SCOPES:
            raise TypeError(f"{cls.__name__}.scope must be one of {SCOPES}, got {cls.scope!r}")
        if type(cls.version) is not int or cls.version < 1:
            raise TypeError(f"{cls.__name__}.version must be an int >= 1")
        cls.handlers = _collect_handlers(cls)
        if "apply" in cls.__dict__ and "every_event" not in cls.__dict__:
            cls.every_event = True  # an `apply` of its own may react to any event

    def initial(self) -> S:
        """The state before any event."""
        raise NotImplementedError(f"{type(self).__name__} must define initial()")

    def apply(self, state: S, event: Event) -> S:
        """The state after `event`; events without a handler leave it unchanged.

        Raises:
            ProjectionError: the handler raised (names projection, event and version).
        """
        handler = self.handlers.get(type(event))
        if handler is None:
            return state
        try:
            return handler(self, state, event)  # type: ignore[no-any-return]
        except Exception as error:
            raise ProjectionError(self.name, event, error) from error

    def fold(self, events: Iterable[Event], state: S | None = None) -> S:
        """Apply `events` in order, from `state` (default: the initial state)."""
        current = self.initial() if state is None else state
        with collector_paused() as tick:
            if type(self).apply is not Projection.apply or self.every_event:
                apply = self.apply
                for event in events:
                    current = apply(current, event)
                    tick()
                return current
            return self._fold_handled(events, current, tick)

    def _fold_handled(self, events: Iterable[Event], current: S, tick: Callable[[], None]) -> S:
        # `apply` inlined: folds of long runs spend a third of their time in the call.
        handlers = self.handlers
        for event in events:
            handler = handlers.get(type(event))
            if handler is not None:
                try:  # free in Python 3.11 until something raises
                    current = handler(self, current, event)
                except Exception as error:
                    raise ProjectionError(self.name, event, error) from error
            tick()
        return current

    def relevant(self, event: Event) -> bool:
        """Whether `event` may change this projection's state."""
        return self.every_event or type(event) in self.handlers

    def encode(self, state: S) -> JSON:
        """The state as strict JSON, for snapshots and persistent use.

        Override together with `decode` when the state is not plain JSON.

        Raises:
            ProjectionStateError: the state is not JSON and no codec is defined.
        """
        try:
            return strict_json("state", state)
        except InvalidPayload as error:
            raise ProjectionStateError(
                self.name, f"its state is not JSON ({error}); define encode() and decode()"
            ) from None

    def decode(self, data: JSON) -> S:
        """The state `encode` turned into `data`."""
        return data  # type: ignore[no-any-return]

    def settled(self, state: S) -> bool:
        """Whether no later event can change `state` (persistent use stops caching it)."""
        return False

    def key(self, event: Event, pipeline: str | None) -> str:
        """The partition `event` belongs to in persistent use (see `scope`)."""
        if self.scope == "run":
            return str(event.run_id)
        if self.scope == "pipeline":
            return pipeline or ""
        return ""

    @classmethod
    def fingerprint(cls) -> str:
        """A digest of the name, version, scope, constants and code of the class.

        Stored states and snapshots of another fingerprint are stale. Code outside the
        class (a helper function it calls) is not covered: bump `version` for that.
        """
        return _fingerprint(cls)  # type: ignore[arg-type]

    def identity(self) -> str:
        """The fingerprint, plus this instance's own settings when it has any."""
        settings = vars(self)
        if not settings:
            return self.fingerprint()
        digest = hashlib.sha256(f"{self.fingerprint()}:{sorted(settings.items())!r}".encode())
        return digest.hexdigest()[:16]

    def __repr__(self) -> str:
        return f"<projection {self.name!r}>"


def as_projection(projection: Projection[Any] | type[Projection[Any]]) -> Projection[Any]:
    """An instance of `projection` (classes are instantiated without arguments).

    Raises:
        TypeError: not a `Projection` class or instance.
    """
    if isinstance(projection, type) and issubclass(projection, Projection):
        return projection()
    if isinstance(projection, Projection):
        return projection
    raise TypeError(f"expected a Projection class or instance, got {projection!r}")


def _collect_handlers(cls: type) -> dict[type[Event], Callable[[Any, Any, Any], Any]]:
    handlers: dict[type[Event], Callable[[Any, Any, Any], Any]] = {}
    for klass in reversed(cls.__mro__):
        for attribute in vars(klass).values():
            for event_type in getattr(attribute, _HANDLES, ()):
                handlers[event_type] = attribute
    return handlers


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


_CONSTANTS = (str, int, float, bool, tuple, frozenset, type(None))


@cache
def _fingerprint(cls: type[Projection[Any]]) -> str:
    head = f"{cls.name}:{cls.version}:{cls.scope}:{cls.every_event}"
    digest = hashlib.sha256(head.encode())
    for klass in cls.__mro__:
        for attribute_name, attribute in sorted(vars(klass).items()):
            if attribute_name.startswith("__"):
                continue
            for code in _codes(attribute):
                digest.update(attribute_name.encode())
                _digest_code(digest, code)
            if isinstance(attribute, _CONSTANTS):
                digest.update(f"{attribute_name}={attribute!r}".encode())
    return digest.hexdigest()[:16]


def _codes(attribute: object) -> list[CodeType]:
    """The code objects behind a method, static/class method or property."""
    if isinstance(attribute, staticmethod | classmethod):
        attribute = attribute.__func__
    if isinstance(attribute, property):
        return [c for f in (attribute.fget, attribute.fset) for c in _codes(f)]
    code = getattr(attribute, "__code__", None)
    return [code] if isinstance(code, CodeType) else []


def _digest_code(digest: Any, code: CodeType) -> None:
    digest.update(code.co_code)
    digest.update(repr(code.co_names).encode())
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            _digest_code(digest, constant)
        else:
            digest.update(repr(constant).encode())
