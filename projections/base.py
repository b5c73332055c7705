"""The projection protocol: an initial state and handlers per event type, folded purely.

A projection class declares `initial()` and methods marked with `@on(EventType)`.
`apply(state, event)` calls the handler for the event's type (others pass over),
so the same code serves on-demand folds, time travel and persistent use.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import linecache
import re
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from operator import is_
from types import CodeType
from typing import Any, ClassVar, Generic, TypeVar
from uuid import UUID

from events import JSON, Event, InvalidPayload, strict_json
from projections import collector
from projections.collector import FEW, collector_paused, no_tick
from projections.errors import ProjectionError, ProjectionStateError

S = TypeVar("S")
F = TypeVar("F", bound=Callable[..., Any])

SCOPES = ("all", "run", "pipeline")
"""How a persistent projection partitions its state: one, per run, per pipeline."""

_HANDLES = "__stagetrail_handles__"

EventSource = Callable[[int, int], Iterable[Event]]
"""Reads one run's events with `gt < version <= lte`, oldest first (`Projection.restore`)."""


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
        kept_every: (optional, not defined here so that it is no part of any other
            projection's fingerprint) events between two of its states a reader keeps in
            memory while folding a run (absent or 0: the engine's snapshot interval; else
            an int dividing it, or reading it is an `InvalidArgument`): a projection read
            at many versions (the
            viewer's) keeps them closer, and goes on past each stored snapshot from its
            own state (`engine.readside.TimeTravel`).
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
        if type(events) is list and len(events) <= FEW:
            return self._fold(events, current, no_tick)
        events = narrowed(self, events)
        with collector_paused() as tick:
            return self._fold(events, current, tick)

    def _fold(self, events: Iterable[Event], current: S, tick: Callable[[], None]) -> S:
        if type(self).apply is not Projection.apply or self.every_event:
            apply = self.apply
            left = every = collector.COLLECT_EVERY
            for event in events:
                current = apply(current, event)
                left -= 1
                if not left:
                    tick()
                    left = every
            return current
        return self._fold_handled(events, current, tick)

    def _fold_handled(self, events: Iterable[Event], current: S, tick: Callable[[], None]) -> S:
        # `apply` inlined: folds of long runs spend a third of their time in the call;
        # `tick` counted down here, not called per event, for the same reason.
        handlers = self.handlers
        left = every = collector.COLLECT_EVERY
        for event in events:
            handler = handlers.get(type(event))
            if handler is not None:
                try:  # free in Python 3.11 until something raises
                    current = handler(self, current, event)
                except Exception as error:
                    raise ProjectionError(self.name, event, error) from error
            left -= 1
            if not left:
                tick()
                left = every
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

    delivers: ClassVar[bool] = False
    """True for a projection that acts on what it folds (`deliver`); most only fold."""

    def deliver(self, folded: Sequence[tuple[S, Event]]) -> None:
        """Act on a page of events folded in persistent use: each with the state before it.

        Called (for a class with `delivers`) before the page's states are committed with
        its tracking record: what it does happens at least once per event, and again
        with the same pairs if the commit does not happen (a crash, another follower
        first). For exports whose receiver keeps one copy per id (OpenTelemetry spans).

        Raises:
            Exception: the page is not committed and is folded and delivered again later.
        """

    def snapshot(self, state: S) -> JSON:
        """The state as a time-travel snapshot stores it (default: `encode`).

        A projection whose state grows with the run overrides it with `restore`
        to store less than the whole state (what the run's events already hold).
        """
        return self.encode(state)

    def restore(self, data: JSON, events: EventSource) -> S:
        """The state `snapshot` turned into `data` (default: `decode`).

        Args:
            events: reads the run's events `(gt, lte)`, oldest first, for a state
                that makes its older part from them only when it is first needed.
        """
        return self.decode(data)

    def forget(self, state: S, gone: S) -> S:
        """`state` without what a deleted run contributed: `gone`, its events folded alone.

        Persistent use calls it when it folds a run's deletion (`RunDeleted`, or
        `RunFinished` with status ``deleted``), for each partition the run's events
        reached, so a state spanning runs forgets the run before `Engine.compact`
        erases it, without folding everything again. Define it (subtract counts, drop
        entries) where the run's part can be taken out exactly; a projection scoped
        ``"run"`` does not need it (its partition is dropped), and one that neither
        is scoped by run nor defines it is folded again from the first event by
        `Engine.compact`.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define forget()")

    def forget_run(self, state: S, run_id: UUID, events: Sequence[Event]) -> S:
        """`state` without the deleted run `run_id`, whose `events` reached its partition.

        By default `forget` with the events folded alone; define this instead where
        taking the run out needs to know which run it was (its entries in the state).
        """
        return self.forget(state, self.fold(events))

    @property
    def forgets(self) -> bool:
        """Whether the class defines `forget` or `forget_run` (see there)."""
        cls = type(self)
        return cls.forget is not Projection.forget or cls.forget_run is not Projection.forget_run

    def exact(self, state: S) -> bool:
        """Whether `state` is what folding only the kept events gives (default: yes).

        A projection whose `forget` keeps a bounded window answers no once a deleted
        run reached further back than the window; `Engine.compact` then folds it again.
        """
        return True

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
        """A digest of what decides the results: name, version, scope, event types, code.

        It covers the name, version, scope, handled event types, class constants and the
        methods (the class's own and its bases'). Methods are read from the source as a
        syntax tree without docstrings, so docstrings, comments, formatting and the
        Python version do not count. Stored states and snapshots of another fingerprint
        are stale. Code outside the class (a helper function it calls) is not covered:
        bump `version` for that.
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


def as_projection(projection: Projection[S] | type[Projection[S]]) -> Projection[S]:
    """An instance of `projection` (classes are instantiated without arguments).

    Raises:
        TypeError: not a `Projection` class or instance.
    """
    if isinstance(projection, type) and issubclass(projection, Projection):
        return projection()
    if isinstance(projection, Projection):
        return projection
    raise TypeError(f"expected a Projection class or instance, got {projection!r}")


def handled_topics(projection: Projection[Any]) -> frozenset[str] | None:
    """The topics of the events that may change `projection`'s state, or None when any may
    (it folds every event): a fold needs no other event read and decoded.

    A function, not a method: a method of `Projection` would change every projection's
    fingerprint, and with it every stored snapshot and persistent state.
    """
    cls = type(projection)
    if (
        projection.every_event
        or cls.apply is not Projection.apply
        or "handlers" in vars(projection)
    ):
        return None
    topics = _TOPICS.get(cls)
    if topics is None:
        topics = _TOPICS[cls] = frozenset([event_type.topic for event_type in cls.handlers])
    return topics


_TOPICS: dict[type, frozenset[str]] = {}
"""`handled_topics` of each projection class asked about."""


@functools.singledispatch
def folding(projection: Projection[Any], state: Any = None) -> Folding[Any]:
    """A fold of `projection` from `state` (default: its initial state), fed events in parts.

    A writer feeds it each commit's events and asks for the state now and then
    (`engine.readside.keeper`); the state after each part is the `fold` of all. A
    function, not a method, as `narrowed` is: a projection's fingerprint covers its
    methods, and a faster way to fold it (`folding.register`) changes no result.
    """
    return Folding(projection, projection.initial() if state is None else state)


class Folding(Generic[S]):
    """A fold fed its events in parts (`folding`): `feed` each, `state` when asked."""

    def __init__(self, projection: Projection[S], state: S) -> None:
        self.projection, self._state = projection, state

    def feed(self, events: Sequence[Event]) -> None:
        """Fold `events`, the next ones (raises as `Projection.fold` does; a folding that
        raised may have taken part of them: it is done with, as the writer's is)."""
        self._state = self.projection.fold(events, self._state)

    def state(self) -> S:
        """The state after every event fed."""
        return self._state


def narrowed(projection: Projection[Any], events: Iterable[Event]) -> Iterable[Event]:
    """`events` with only those `projection` handles, where the source can leave the others
    undecoded (a store's stream: its ``narrowed(topics)``); else `events` as they are.

    A function, not a method, as `handled_topics` is.
    """
    narrow = getattr(events, "narrowed", None)
    if narrow is None:
        return events
    topics = handled_topics(projection)
    return events if topics is None else narrow(topics)


def folds_with(projection: Projection[Any], owner: type[Projection[Any]], *kinds: type) -> bool:
    """Whether `projection` takes events of `kinds` with `owner`'s handlers of them, through
    `owner`'s `apply` (`Projection.apply`, or one of `owner`'s own, as `RunIndex`'s): what a
    fold of `owner`'s taking them its own way (in one loop, not by handler) needs, to give
    what `apply` event by event gives a subclass too.

    A function, not a method, as `handled_topics` is.
    """
    own = "handlers" in vars(projection)
    if type(projection) is owner and not own:  # `owner` itself (every fold of a short run)
        return True
    if type(projection).apply is not owner.apply or own:
        return False
    handlers, owned = projection.handlers, owner.handlers
    # maps, not a generator: asked by every fold, no frame of ours per kind
    return all(map(is_, map(handlers.get, kinds), map(owned.get, kinds)))


def folded_by(
    projection: Projection[S],
    loop: Callable[[Iterable[Event], S, Callable[[], None]], S],
    events: Iterable[Event],
    state: S | None,
) -> S:
    """`loop(events, state, tick)` as `Projection.fold` runs its own: from the initial state
    when `state` is None, a long or streamed fold narrowed to the topics handled and with
    the collector paused (`tick` counted down by `loop`), a short list's not.

    A function, not a method, as `handled_topics` is.
    """
    current = projection.initial() if state is None else state
    if type(events) is list and len(events) <= FEW:
        return loop(events, current, no_tick)
    with collector_paused() as tick:
        return loop(narrowed(projection, events), current, tick)


def folds_faster(projection: Projection[Any]) -> bool:
    """Whether `projection` folds events together faster than its `apply` one by one: its
    class has a fold of its own (a stretch fold, `projections.stretches`).

    A function, not a method, as `handled_topics` is.
    """
    return type(projection)._fold is not Projection._fold


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
    handles = sorted(
        (event_type.__qualname__, getattr(handler, "__name__", ""))
        for event_type, handler in cls.handlers.items()
    )
    digest.update(f"handles={handles!r}".encode())
    for klass in cls.__mro__:
        if _outside(klass):
            continue
        for attribute_name, attribute in sorted(vars(klass).items()):
            if attribute_name.startswith("__"):
                continue
            for function in _functions(attribute):
                digest.update(attribute_name.encode())
                digest.update(_code_text(function).encode())
            if isinstance(attribute, _CONSTANTS):
                digest.update(f"{attribute_name}={attribute!r}".encode())
    return digest.hexdigest()[:16]


def _outside(klass: type) -> bool:
    """Whether `klass` is Python's (`object`, `Generic`) rather than the projection's code.

    Their attributes differ between Python versions (`Generic._is_protocol`).
    """
    return klass.__module__ in ("builtins", "typing")


def _functions(attribute: object) -> list[Any]:
    """The functions behind a method, static/class method or property."""
    if isinstance(attribute, staticmethod | classmethod):
        attribute = attribute.__func__
    if isinstance(attribute, property):
        return [f for g in (attribute.fget, attribute.fset) for f in _functions(g)]
    return [attribute] if isinstance(getattr(attribute, "__code__", None), CodeType) else []


def _code_text(function: Any) -> str:
    """What `function` does, as text that only changes when its code does.

    From its source: the syntax tree without docstrings (decorators included, so the
    event types of `@on`), in a form that is the same on Python 3.11 to 3.13 —
    comments, blank lines and formatting do not count. Without a source (a class
    defined in a REPL or by `exec` of a string; a lambda in the middle of a line),
    from the code object: bytecode, names and constants without the docstring — the
    only record of the logic left, so such a class changes fingerprint with Python.
    """
    code = function.__code__
    parsed = _definition(function)
    if parsed is not None:
        return f"ast:{_tree_text([parsed])}"
    try:
        source = inspect.getsource(function)  # of the function it wraps, if any
        code = inspect.unwrap(function).__code__
        if source[:1].isspace():  # a method: parsed in a block, whatever its strings' margins
            statements = ast.parse(f"if 1:\n{source}").body[0].body  # type: ignore[attr-defined]
        else:
            statements = ast.parse(source).body
    except Exception:  # no source file, or a lambda's line that is no statement alone
        return f"code:{_code_data(code)}"
    if code.co_name != "<lambda>" and not (
        len(statements) == 1
        and isinstance(statements[0], ast.FunctionDef | ast.AsyncFunctionDef)
        and statements[0].name == code.co_name
    ):  # the file changed since the import: its text is not this code
        return f"code:{_code_data(code)}"
    for statement in statements:
        _strip_docstrings(statement)
    return f"ast:{_tree_text(statements)}"


_MODULE_TREES: dict[str, tuple[list[str], dict[tuple[int, str], ast.AST]]] = {}
"""Each source file's definitions, parsed once, docstrings removed: by (first line, name)."""


def _definition(function: Any) -> ast.AST | None:
    """The syntax tree of `function` (of the function it wraps, if any) without docstrings,
    from its module's source parsed once; None where that is not found (no source file,
    a lambda, a file changed since the import): `_code_text` reads it as it always did.

    The same tree `inspect.getsource` and a parse of the function alone give, without
    tokenizing each method's lines again: fingerprints stay as they were.
    """
    try:
        unwrapped = inspect.unwrap(function)  # as `inspect.getsource` reads it
        code = unwrapped.__code__
        file = inspect.getsourcefile(unwrapped)
        if file is None or code.co_name == "<lambda>":
            return None
        module = inspect.getmodule(unwrapped, file)
        linecache.checkcache(file)  # a file changed since it was read: as `getsource` does
        lines = linecache.getlines(file, None if module is None else module.__dict__)
        return _definitions(file, lines).get((code.co_firstlineno, code.co_name))
    except Exception:  # no source, or source that no longer parses: the general path
        return None


def _definitions(file: str, lines: list[str]) -> dict[tuple[int, str], ast.AST]:
    """Every function of `file` (as `lines`) by its first line (its first decorator's) and
    name, docstrings removed."""
    kept = _MODULE_TREES.get(file)
    if kept is not None and kept[0] is lines:
        return kept[1]
    found: dict[tuple[int, str], ast.AST] = {}
    for node in _statements(ast.parse("".join(lines)).body):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            _strip_docstring(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            found[(first, node.name)] = node
    _MODULE_TREES[file] = (lines, found)
    return found


_BLOCKS = (ast.stmt, ast.excepthandler, ast.match_case)


def _statements(body: list[Any]) -> Iterable[Any]:
    """Every statement of `body` and of the blocks nested in it (not their expressions:
    definitions and docstrings are statements)."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                yield from _statements([child for child in inner if isinstance(child, _BLOCKS)])


def _strip_docstrings(tree: Any) -> None:
    """Remove the docstring of each class and function in `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            _strip_docstring(node)


def _strip_docstring(node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    """Remove the docstring of the class or function `node`, if it has one."""
    if (
        node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
        and isinstance(node.body[0].value.value, str)
    ):
        node.body = node.body[1:]


def _tree_text(node: object) -> str:
    """`node` as text, like `ast.dump` but without the fields newer Pythons add or drop.

    `ast.dump` shows empty lists on 3.11 and 3.12, not on 3.13, and `type_params=[]`
    since 3.12: here fields that are None or empty are left out on every version, as
    are positions, string prefixes (`kind`) and type comments.
    """
    if isinstance(node, ast.JoinedStr):  # f-string parts joined: 3.12 adds empty ones
        parts: list[str] = []
        text = ""
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                text += part.value
                continue
            parts += [f"Constant(value={text!r})"] if text else []
            parts.append(_tree_text(part))
            text = ""
        parts += [f"Constant(value={text!r})"] if text else []
        return f"JoinedStr(values=[{','.join(parts)}])" if parts else "JoinedStr()"
    if isinstance(node, ast.AST):
        fields = (
            f"{name}={_tree_text(value)}"
            for name in node._fields
            if name not in ("kind", "type_comment")
            and (value := getattr(node, name, None)) is not None
            and not (isinstance(value, list) and not value)
        )
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return f"[{','.join(_tree_text(item) for item in node)}]"
    return repr(node)


def _code_data(code: CodeType) -> str:
    """Bytecode, names and constants of `code` and the code nested in it, docstrings left out."""
    constants = code.co_consts
    has_docstring = getattr(inspect, "CO_HAS_DOCSTRING", None)  # Python 3.14
    if has_docstring is not None:
        documented = bool(code.co_flags & has_docstring)
    else:  # up to 3.13 a function's first constant is its docstring, or None
        documented = (
            bool(code.co_flags & inspect.CO_OPTIMIZED)
            and not code.co_name.startswith("<")
            and bool(constants)
            and isinstance(constants[0], str)
        )
    parts = [code.co_code.hex(), repr(code.co_names)]
    for constant in constants[1:] if documented else constants:
        parts.append(_code_data(constant) if isinstance(constant, CodeType) else repr(constant))
    return "|".join(parts)
