"""Reading an export file back: every line parsed, every event checked, run by run."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID

import attrs

from engine.verify import verify_events
from events import Event, EventFormatError, InvalidEvent, InvalidPayload, StagetrailError, decode

_KEYS = ("run_id", "version", "topic", "state")
_HEADED = sorted((*_KEYS, "chain"))
"""The keys of a run's last line, which carries the run's chain head."""
_CHECK_FIELDS = {"start": "topic", "table": "state.table", "time": "state.timestamp"}


class BadImportLine(StagetrailError, ValueError):
    """A line of an import file is not a valid event, or breaks its run's rules.

    Attributes:
        line: the line number (from 1).
        field: the field at fault, e.g. ``state.result`` (``-`` for the whole line).
        reason: what is wrong.
    """

    def __init__(self, line: int, field: str, reason: str) -> None:
        self.line = line
        self.field = field
        self.reason = reason
        super().__init__(f"line {line}, field {field}: {reason}; nothing was imported")


class RunConflict(StagetrailError, ValueError):
    """The store already holds the run, with other events than the file's.

    Attributes:
        run_id: the run.
        version: the first version that differs.
        line: the line of the file where it differs.
    """

    def __init__(self, run_id: UUID, version: int, line: int, detail: str = "") -> None:
        self.run_id = run_id
        self.version = version
        self.line = line
        detail = detail or f"with other events (they differ from version {version})"
        super().__init__(
            f"line {line}: run {run_id} is already in the store {detail}; nothing was imported"
        )

    @classmethod
    def file_is_shorter(cls, chunk: Chunk, stored: int) -> RunConflict:
        """The file holds only the first events of a run the store holds more of."""
        held = len(chunk.events)
        return cls(
            chunk.run_id,
            held + 1,
            chunk.lines[-1],
            f"with {stored} events, but the file holds only its first {held} "
            f"(lines {chunk.lines[0]}-{chunk.lines[-1]}): the file is truncated, "
            "or a copy taken earlier; export the run again",
        )

    @classmethod
    def store_is_shorter(cls, chunk: Chunk, stored: int) -> RunConflict:
        """The store holds only the first events of a run the file holds more of."""
        return cls(
            chunk.run_id,
            stored + 1,
            chunk.lines[stored],
            f"with only its first {stored} events, but the file goes on to version "
            f"{len(chunk.events)}: an import never adds events to a run already stored",
        )


@attrs.frozen
class Chunk:
    """One run's events from the file, checked, and the line its first event is on."""

    run_id: UUID
    events: list[Event]
    lines: list[int]
    """The line of the file each event is on (blank lines are skipped)."""
    head: str | None = None
    """The chain head exported on the run's last line (hex), when the file has one."""
    head_line: int = 0

    @property
    def first_line(self) -> int:
        """The line of the run's first event."""
        return self.lines[0]


def parse_line(number: int, text: str) -> Event:
    """The event on line `number`, built through its class's checks.

    Raises:
        BadImportLine: naming the field at fault.
    """
    return parse_headed(number, text)[0]


def parse_headed(number: int, text: str) -> tuple[Event, str | None]:
    """`parse_line`, and the chain head the line carries (a run's last line), if any.

    Raises:
        BadImportLine: naming the field at fault.
    """
    try:
        data = json.loads(text)
    except ValueError as error:
        raise BadImportLine(number, "-", f"not JSON ({error})") from None
    except RecursionError:
        raise BadImportLine(number, "-", "JSON nested too deeply to read") from None
    if not isinstance(data, dict) or sorted(data) not in (sorted(_KEYS), _HEADED):
        raise BadImportLine(number, "-", f"expected an object with the keys {', '.join(_KEYS)}")
    head = data.get("chain")
    if head is not None and not (isinstance(head, str) and _HEX64.fullmatch(head)):
        raise BadImportLine(number, "chain", "must be a chain head: 64 hexadecimal digits")
    run_id = _run_id(number, data["run_id"])
    version = data["version"]
    if type(version) is not int or version < 1:
        raise BadImportLine(number, "version", f"must be an int >= 1, got {version!r}")
    if not isinstance(data["topic"], str):
        raise BadImportLine(number, "topic", "must be a string")
    if not isinstance(data["state"], dict):
        raise BadImportLine(number, "state", "must be an object")
    return _event(number, data, run_id, version), head


def _run_id(number: int, value: Any) -> UUID:
    if not isinstance(value, str):
        raise BadImportLine(number, "run_id", f"{value!r} is not a UUID string")
    try:
        return UUID(value)
    except ValueError:
        raise BadImportLine(number, "run_id", f"{value!r} is not a UUID") from None


def _event(number: int, data: dict[str, Any], run_id: UUID, version: int) -> Event:
    try:
        loose = decode(data["topic"], dict(data["state"]), run_id, version)
    except EventFormatError as error:
        field = "topic" if "event type" in error.reason else "state"
        raise BadImportLine(number, field, error.reason) from None
    try:
        fields = attrs.asdict(loose, recurse=False)
        return type(loose)(**fields)  # the constructor's checks, which decode skips
    except (InvalidPayload, InvalidEvent) as error:
        raise BadImportLine(number, f"state.{error.field}", _reason(error)) from None
    except (TypeError, ValueError) as error:
        raise BadImportLine(number, "state", str(error)) from None


def check_storable(chunk: Chunk, serialize: Callable[[Event], object]) -> None:
    """Serialise each event of `chunk` as the store will, so no value is refused mid-import.

    Raises:
        BadImportLine: an event the store cannot keep (a NUL, a lone surrogate, over
            the store's `max_event_bytes`), by line and field.
    """
    for index, event in enumerate(chunk.events):
        try:
            serialize(event)
        except InvalidPayload as error:
            raise BadImportLine(
                chunk.lines[index], f"state.{error.field}", _reason(error)
            ) from None


def _reason(error: InvalidPayload | InvalidEvent) -> str:
    if isinstance(error, InvalidPayload):
        return f"{error.path} {error.reason}"
    return error.reason


def _lines(path: str, advance: Callable[[int], None]) -> Iterator[tuple[int, str]]:
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            advance(len(raw))
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise BadImportLine(number, "-", f"not UTF-8 ({error.reason})") from None
            if text.strip():
                yield number, text


def read_chunks(path: str, advance: Callable[[int], None]) -> Iterator[Chunk]:
    """Each run of the file, checked: consecutive lines, versions 1..n, legal by its table.

    Raises:
        BadImportLine: the first problem found, by line and field.
    """
    seen: set[UUID] = set()
    current: Chunk | None = None
    for number, text in _lines(path, advance):
        event, head = parse_headed(number, text)
        if current is not None and event.run_id == current.run_id:
            if current.head is not None:
                raise BadImportLine(current.head_line, "chain", _HEAD_NOT_LAST)
            _expect_version(number, event, len(current.events) + 1)
            current.events.append(event)
            current.lines.append(number)
            if head is not None:
                current = attrs.evolve(current, head=head, head_line=number)
            continue
        if current is not None:
            yield _checked(current)
        if event.run_id in seen:
            raise BadImportLine(
                number, "run_id", f"run {event.run_id} appeared earlier: a run's lines must follow"
            )
        seen.add(event.run_id)
        _expect_version(number, event, 1)
        current = Chunk(event.run_id, [event], [number], head, number if head else 0)
    if current is not None:
        yield _checked(current)


_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEAD_NOT_LAST = "a chain head belongs on its run's last line"


def _expect_version(number: int, event: Event, expected: int) -> None:
    if event.version != expected:
        raise BadImportLine(
            number,
            "version",
            f"expected {expected} (a run's versions go 1, 2, 3... ), got {event.version}",
        )


def _checked(chunk: Chunk) -> Chunk:
    """Fold the run through its own stored table, as `engine.verify` does."""
    report = verify_events(chunk.run_id, chunk.events, [])
    if report.problems:
        problem = report.problems[0]
        line = chunk.lines[min(max(problem.version, 1), len(chunk.lines)) - 1]
        field = _CHECK_FIELDS.get(problem.check, "state")
        raise BadImportLine(line, field, problem.message)
    return chunk


class ImportInterrupted(StagetrailError, RuntimeError):
    """Writing an import failed part-way; the runs written before stay, each one whole.

    Attributes:
        written: how many runs were written before the failure.
        cause: what failed.
    """

    def __init__(self, written: int, cause: Exception) -> None:
        self.written = written
        self.cause = f"{type(cause).__name__}: {cause}"
        super().__init__(
            f"import stopped after {written} new run(s), each written whole: {self.cause}; "
            "run the import again once that is fixed (runs already imported are skipped)"
        )
