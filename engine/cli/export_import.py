"""`stagetrail export` and `import`: runs as JSON Lines, one event per line, lossless.

A line is ``{"run_id": ..., "version": ..., "topic": ..., "state": {...}}``: the
event's topic and fields as the codec stores them (timestamp first, then the
payload in field order, then ``class_version`` when above 1), decrypted and
uncompressed, so a file moves between any two stores.

A run's last line also carries its chain head, ``"chain": "<64 hex>"``: SHA-256
chained over the run's lines as `export_line` writes them (without the head), so
`import` refuses a run whose lines were edited, dropped or reordered since the
export. It depends on the lines alone, not on a store's keys or settings, so an
export of an import is byte for byte the export.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, BinaryIO, cast
from uuid import UUID

import attrs

from engine.cli.common import Output, ProgressBar, json_line, listed, print_json, short, whole
from engine.cli.import_check import (
    BadImportLine,
    Chunk,
    ImportInterrupted,
    RunConflict,
    check_storable,
    read_chunks,
)
from events import Event, StagetrailError, encode

if TYPE_CHECKING:
    from engine.engine import Engine

_EVERY_RUN = 1_000_000_000


_ORDER: dict[type[Event], tuple[str, ...]] = {}


def export_line(event: Event) -> str:
    """One event as its export line, its fields in a fixed order."""
    topic, state = encode(event)
    order = _ORDER.get(type(event))
    if order is None:
        names = [field.name for field in attrs.fields(type(event))]
        order = _ORDER[type(event)] = (*names[2:], "class_version")  # run_id, version first
    fields = {name: state[name] for name in order if name in state}
    return json_line(
        {"run_id": str(event.run_id), "version": event.version, "topic": topic, "state": fields}
    )


def _every_run(engine: Engine) -> list[tuple[UUID, int]]:
    """Every run of the index, oldest first, but those a compaction erases (or has begun to)."""
    summaries = engine.runs(limit=_EVERY_RUN)
    return [(s.run_id, s.version) for s in reversed(summaries) if whole(engine, s.run_id)]


def export_runs(engine: Engine, run_ids: Sequence[UUID] | None) -> None:
    """Write the runs' events (every run, oldest first, when None) to stdout.

    Each run is read whole before any line of it is written (held in a temporary
    file past `_HELD_IN_MEMORY` bytes), so a run erased while it is read is never
    written in part, its last line carrying a chain head `import` would accept:
    a run named is refused (`RunErasedWhileRead`, or `RunBeingErased`), the runs
    before it written whole; with every run, one whose erase a compaction began
    after the listing is passed over.

    Raises:
        RunNotFound: a run named is not in the store.
        RunErased: a run named was erased, or began to be, while it was exported.
    """
    from engine.errors import RunErased

    if run_ids is None:
        chosen = _every_run(engine)
    else:
        chosen = [(rid, _last_version(engine, rid)) for rid in dict.fromkeys(run_ids)]
    progress = ProgressBar("export", sum(version for _, version in chosen))
    out = _utf8_stdout()
    generation = engine.store.generation()
    try:
        for run_id, version in chosen:
            try:
                lines, count, generation = _run_lines(engine, run_id, version, generation)
            except RunErased:
                if run_ids is not None:
                    raise
                progress.advance(version)
                generation = engine.store.generation()
                continue
            with lines:
                shutil.copyfileobj(lines, out)
            progress.advance(count)
        out.flush()
    finally:
        progress.close()


_HELD_IN_MEMORY = 4 << 20
"""Bytes of a run's export lines held in memory; a longer run's go to a temporary file."""


def _run_lines(
    engine: Engine, run_id: UUID, version: int, generation: int
) -> tuple[BinaryIO, int, int]:
    """The run's export lines, its last carrying its chain head, read whole (a file at its
    start), how many, and the store's erasure generation read after them; `version`: the
    run's newest when it was chosen (0: not stored); `generation`: one read before the run
    was (the one the run before it ended with: one read a run, not two).

    The generation only counts up, so one read earlier than the run's first page stands
    for it: an erase since makes the one read after differ, and the run's ends are read
    again (`_same_run`), as for an erase while it was read.

    Raises:
        RunNotFound: the run was not stored when chosen, nor is it now.
        RunBeingErased: a compaction has begun erasing it.
        RunErasedWhileRead: it was erased while it was read: fewer events than it had
            when chosen, or (an erasure meanwhile) its first or last no longer stored.
    """
    from engine.errors import RunErasedWhileRead, RunNotFound

    # Given back open (the caller copies it out): closed here only on a failure.
    spool = tempfile.SpooledTemporaryFile(max_size=_HELD_IN_MEMORY)  # noqa: SIM115
    try:
        head, first, last = Head(run_id), "", ""
        for event in engine.store.stream(run_id):
            line = head.add(export_line(event))
            if last:
                spool.write((last + "\n").encode())
            first, last = first or line, line
        if not last and version == 0:
            raise RunNotFound(run_id, engine.url)
        if head.version < version:  # events gone between two pages
            raise RunErasedWhileRead(run_id, head.version + 1)
        after = engine.store.generation()
        if after != generation:
            _same_run(engine, run_id, (first, last), head.version)
        spool.write((head.on(last) + "\n").encode())
        spool.seek(0)
    except BaseException:
        spool.close()
        raise
    return cast(BinaryIO, spool), head.version, after


def _same_run(engine: Engine, run_id: UUID, ends: tuple[str, str], count: int) -> None:
    """Refuse a run whose first or last exported event (`ends`, their lines) the store no
    longer holds as read: runs were erased while it was read, perhaps it, its id reused.

    Raises:
        RunBeingErased: a compaction has begun erasing it.
        RunErasedWhileRead: either event is gone or another.
    """
    from engine.errors import RunErasedWhileRead

    for version, line in ((1, ends[0]), (count, ends[1])):
        stored = engine.store.read(run_id, gt=version - 1, lte=version)
        if [export_line(event) for event in stored] != [line]:
            raise RunErasedWhileRead(run_id, version)


class Head:
    """The chain head of one run's export lines: SHA-256 over each line and the head before."""

    def __init__(self, run_id: UUID) -> None:
        self.run_id, self.version, self.head = run_id, 0, b""
        self._run = run_id.bytes

    def add(self, line: str) -> str:
        """Chain one export line (the run's next version) in; give it back."""
        self.version += 1
        version = self.version.to_bytes(8, "big")
        self.head = hashlib.sha256(self.head + self._run + version + line.encode()).digest()
        return line

    def on(self, line: str) -> str:
        """`line` (a JSON object, the run's last) carrying the head."""
        return f'{line[:-1]},"chain":"{self.head.hex()}"}}'


def check_head(chunk: Chunk) -> None:
    """Refuse a run whose lines do not match the chain head exported with them.

    Raises:
        BadImportLine: at the run's last line, when the head does not match.
    """
    if chunk.head is None:
        return
    head = Head(chunk.run_id)
    for event in chunk.events:
        head.add(export_line(event))
    if head.head.hex() != chunk.head:
        raise BadImportLine(
            chunk.head_line,
            "chain",
            f"does not match run {chunk.run_id}'s lines: they were edited, dropped or "
            "reordered after the export",
        )


def _utf8_stdout() -> BinaryIO:
    """Stdout as bytes: an export is UTF-8 whatever the locale says."""
    sys.stdout.flush()
    return sys.stdout.buffer


def _last_version(engine: Engine, run_id: UUID) -> int:
    last = engine.store.last(run_id)
    return 0 if last is None else last.version


@attrs.frozen
class ImportReport:
    """What an import wrote and what it found already there."""

    imported: tuple[UUID, ...]
    identical: tuple[UUID, ...]
    events: int
    unchained: tuple[UUID, ...] = ()
    """The runs imported without a chain head to check their lines against (``--unchained``)."""

    def to_json(self) -> dict[str, Any]:
        """The report as JSON: counts of every run, the ids of the first of each kind."""
        return {
            **listed("imported", self.imported),
            **listed("identical", self.identical),
            **listed("unchained", self.unchained),
            "events": self.events,
        }


@contextmanager
def _seekable(path: str) -> Iterator[str]:
    """`path` itself, or for ``-`` a temporary copy of stdin (import reads it twice)."""
    if path != "-":
        yield path
        return
    handle, copy = tempfile.mkstemp(prefix="stagetrail-import-", suffix=".jsonl")
    try:
        with os.fdopen(handle, "wb") as out:
            shutil.copyfileobj(sys.stdin.buffer, out)
        yield copy
    finally:
        os.unlink(copy)


def import_runs(engine: Engine, path: str, *, as_json: bool, unchained: bool = False) -> None:
    """Check every run of the file, then write the new ones, each in one transaction; a new
    run without a chain head (an older release's export) only with `unchained`.

    Raises:
        BadImportLine: a line is invalid, a run's lines do not match its chain head, or
            (without `unchained`) a new run has none.
    """
    with _seekable(path) as source:
        report = _import(engine, source, unchained=unchained)
    if as_json:
        print_json(report.to_json())
        return
    out = Output()
    out.line(f"imported {len(report.imported)} run(s), {report.events} events, into {engine.url}")
    if report.unchained:
        out.line(
            f"{len(report.unchained)} of them with chain: none (exported before chaining), "
            f"their lines not checked against a head: {_first_five(report.unchained)}; "
            "linked anew here, so verify counts them intact from now on: keep this list",
            "yellow",
        )
    if report.identical:
        listed = _first_five(report.identical)
        out.line(f"{len(report.identical)} run(s) already there with identical events: {listed}")


def _first_five(run_ids: Sequence[UUID]) -> str:
    """The first five runs' short ids, and how many more."""
    listed = ", ".join(short(run_id) for run_id in run_ids[:5])
    more = len(run_ids) - 5
    return listed + (f" and {more} more" if more > 0 else "")


def _import(engine: Engine, path: str, *, unchained: bool) -> ImportReport:
    """Check the whole file first (rules, tables, chain heads, and that the store can keep
    every event), then write: nothing in the file can stop the import half-way.

    The file is read twice, one run at a time, so memory holds one run, not the file.
    """
    size = os.path.getsize(path)
    new: set[UUID] = set()
    identical: list[UUID] = []
    headless: tuple[UUID, int] | None = None
    """The file's first run without a head and its last line: all a refusal names (a run's
    events are not held past its check: memory holds one run)."""
    unchecked: list[UUID] = []
    """The new runs without a head: those the import would write unchecked."""
    first_unchecked: tuple[UUID, int] | None = None
    headed = False
    progress = ProgressBar("check", size)
    try:
        for chunk in read_chunks(path, progress.advance):
            headed = headed or chunk.head is not None
            if chunk.head is None and headless is None:
                headless = (chunk.run_id, chunk.lines[-1])
            if _already_there(engine, chunk):
                identical.append(chunk.run_id)
            else:
                check_storable(chunk, lambda event: engine.store.serialize(event, b""))
                check_head(chunk)
                new.add(chunk.run_id)
                if chunk.head is None:
                    unchecked.append(chunk.run_id)
                    first_unchecked = first_unchecked or (chunk.run_id, chunk.lines[-1])
    finally:
        progress.close()
    if headed and headless is not None:
        _cut_short(*headless)
    if first_unchecked is not None and not unchained:
        _unchained(*first_unchecked, len(unchecked))
    report = _write(engine, path, new, identical)
    return attrs.evolve(report, unchained=tuple(unchecked))


def _unchained(run_id: UUID, line: int, runs: int) -> None:
    """Refuse a file of runs without chain heads (`runs` new ones, `run_id` the first, ending on
    line `line`): their lines cannot be checked, and the target store would link them anew.

    Raises:
        BadImportLine: at the first such run's last line.
    """
    others = f" (and {runs - 1} other run(s) of the file)" if runs > 1 else ""
    raise BadImportLine(
        line,
        "chain",
        f"run {run_id}{others} has no chain head on its last line: chain: none "
        "(exported before chaining, or the file cut short or its head removed), so its "
        "lines cannot be checked; give --unchained to import such runs unchecked",
    )


def _cut_short(run_id: UUID, line: int) -> None:
    """Refuse a file whose runs carry chain heads but for run `run_id` (its last line `line`):
    its end was lost.

    An export ends each run's last line with its head, and writes lines in batches,
    so a file cut short (an interrupted `export > file`) ends on a whole line of a
    run whose head never came.

    Raises:
        BadImportLine: at the run's last line.
    """
    raise BadImportLine(
        line,
        "chain",
        f"run {run_id} has no chain head on its last line while other runs of the "
        "file do: the file was cut short (an interrupted export?) or its run edited",
    )


def _write(engine: Engine, path: str, new: set[UUID], identical: list[UUID]) -> ImportReport:
    written: list[UUID] = []
    events = 0
    progress = ProgressBar("import", os.path.getsize(path))
    try:
        for chunk in read_chunks(path, progress.advance):
            if chunk.run_id in new:
                _append(engine, chunk, len(written))
                written.append(chunk.run_id)
                events += len(chunk.events)
    finally:
        progress.close()
    return ImportReport(tuple(written), tuple(identical), events)


def _append(engine: Engine, chunk: Chunk, written: int) -> None:
    """Write one run in one transaction; a failure names how far the import got."""
    try:
        engine.store.append(chunk.events)
    except (StagetrailError, OSError) as error:  # e.g. the run was started meanwhile
        raise ImportInterrupted(written, error) from error


def _already_there(engine: Engine, chunk: Chunk) -> bool:
    """Whether the store holds exactly these events; False when it holds none of the run.

    Raises:
        RunConflict: the store holds the run with other events.
    """
    last = engine.store.last(chunk.run_id)
    if last is None:
        return False
    stored = engine.store.stream(chunk.run_id)
    for index, event in enumerate(chunk.events):
        kept = next(stored, None)
        if kept is None:
            raise RunConflict.store_is_shorter(chunk, index)
        if export_line(kept) != export_line(event):
            raise RunConflict(chunk.run_id, event.version, chunk.lines[index])
    if last.version > len(chunk.events):
        raise RunConflict.file_is_shorter(chunk, last.version)
    return True
