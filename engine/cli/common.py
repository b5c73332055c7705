"""Plumbing shared by the `stagetrail` commands: stores, run ids, times, output.

Kept light on purpose: `stagetrail runs` must start fast, so `rich` is imported
only when stdout is a terminal.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from engine.errors import AmbiguousRunId as AmbiguousRunId
from engine.errors import RunNotFound as RunNotFound
from events import StagetrailError

if TYPE_CHECKING:
    from rich.console import Console

    from engine.engine import Engine


class BadOption(StagetrailError, ValueError):
    """A command-line value cannot be used.

    Attributes:
        option: the option or argument, e.g. ``--at``.
        value: the value given.
        reason: what is wrong with it.
    """

    def __init__(self, option: str, value: object, reason: str) -> None:
        self.option = option
        self.value = value
        self.reason = reason
        super().__init__(f"{option} {value!r}: {reason}")


@contextmanager
def open_engine(
    url: str | None, *, create: bool = False, read_only: bool = False
) -> Iterator[Engine]:
    """An engine over the store `url` (default store if None); never creates one unless asked.

    Commands that only read pass `read_only`: they never change a file that is not
    a store, nor any event. Where the store may be written they save the progress
    of the persistent projections they catch up (the run index), so the next
    command does not fold the same events again; elsewhere (a read-only file, a
    read replica, a role that may only read) they open it read-only and fold in memory.
    A ``shards:`` URL opens every shard as one (`engine.sharded.ShardedEngine`), which
    offers the commands the same reads.
    """
    from engine.sharded import open_engine as open_any

    opened: Engine = open_any(url, create=create, read_only=read_only)
    with opened as engine:
        reason = engine.store.upgrade_available
        if reason:
            print(upgrade_notice(reason), file=sys.stderr)
        yield engine


def upgrade_notice(reason: str) -> str:
    """The one line telling the user a one-time upgrade of the store is available."""
    return (
        f"note: this store {reason}; `stagetrail upgrade --to NEW.db` (or --in-place) "
        "rewrites it compact"
    )


def resolve_run(engine: Engine, text: str) -> UUID:
    """The run a full id or a unique id prefix names (`engine.run_ids.resolve_run`).

    Raises:
        RunNotFound: nothing matches.
        AmbiguousRunId: several runs match.
    """
    from engine import run_ids

    return run_ids.resolve_run(engine, text)


_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def whole(engine: Engine, run_id: UUID) -> bool:
    """Whether the run is stored and no compaction has begun erasing it (what `--all` of a
    command that reads every run passes over otherwise)."""
    from engine.errors import RunBeingErased

    try:
        return engine.store.last(run_id) is not None
    except RunBeingErased:
        return False


def parse_time(option: str, text: str) -> datetime:
    """An ISO 8601 time (UTC when it names no zone) or a span ago such as ``90m``, ``2d``.

    Raises:
        BadOption: neither.
    """
    ago = _AGO.fullmatch(text.strip())
    if ago:
        return _ago(option, text, float(ago.group(1)) * _UNITS[ago.group(2)])
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise BadOption(
            option, text, "not a time: give ISO 8601 (2026-11-20T09:00:00Z) or a span ago (90m, 2d)"
        ) from None
    moment = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except (OverflowError, ValueError):
        raise BadOption(option, text, "is outside the years 1 to 9999 in UTC") from None


def _ago(option: str, text: str, seconds_ago: float) -> datetime:
    """The time `seconds_ago` before now."""
    try:
        return datetime.now(UTC) - timedelta(seconds=seconds_ago)
    except (OverflowError, ValueError):
        raise BadOption(option, text, "reaches back before the year 1") from None


def parse_at(text: str) -> int | datetime:
    """A ``--at`` value: a version (int >= 0) or a time.

    Raises:
        BadOption: a negative number, or neither a version nor a time.
    """
    stripped = text.strip()
    if re.fullmatch(r"[+-]?\d+", stripped):
        version = int(stripped)
        if version < 0:
            raise BadOption("--at", text, "a version is an int >= 0")
        return version
    try:
        return parse_time("--at", stripped)
    except BadOption as error:
        if not error.reason.startswith("not a time"):
            raise  # a time, but out of range: say so
        raise BadOption(
            "--at", text, "not a version (17) or a time (2026-11-20T09:00:00Z, 90m)"
        ) from None


def count_or_all(option: str, text: str) -> int | None:
    """A ``N|all`` option's value: a whole number >= 1, or None for ``all``.

    Raises:
        BadOption: neither.
    """
    if text.strip().lower() == "all":
        return None
    try:
        count = int(text) if text.isascii() else 0
    except ValueError:  # not a number, or more digits than int() takes
        count = 0
    if count < 1:
        raise BadOption(option, text, "give a whole number >= 1, or all")
    return count


def window_end(start: int, end: int, limit: int | None) -> int:
    """The last event a window of at most `limit` events from `start` shows (up to `end`)."""
    return end if limit is None else min(end, start + limit - 1)


def left_out(shown_end: int, end: int) -> str | None:
    """The line saying events after `shown_end` up to `end` were left out, or None if none."""
    count = end - shown_end
    if count <= 0:
        return None
    events = f"event {end:,}" if count == 1 else f"events {shown_end + 1:,} to {end:,}"
    return (
        f"… {count:,} more event{'' if count == 1 else 's'} ({events}) not shown:"
        f" --from {shown_end + 1} goes on, --limit all shows every one"
    )


def say_left_out(out: Output | None, shown_end: int, end: int) -> None:
    """Print `left_out`'s line, if any: on `out`, or on stderr (beside JSON on stdout)."""
    line = left_out(shown_end, end)
    if line is None:
        return
    if out is None:
        sys.stderr.write(f"stagetrail: {line}\n")
    else:
        out.line(line, "dim")


def when(moment: datetime) -> str:
    """A time in UTC, to the second, as shown in tables."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def clock(moment: datetime) -> str:
    """The time of day in UTC, to the millisecond."""
    return moment.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3]


def seconds(value: float) -> str:
    """A duration for people: ``0.4s``, ``12.0s``, ``4m05s``, ``2h03m``."""
    if value < 60:
        return f"{value:.1f}s"
    minutes, secs = divmod(round(value), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def short(run_id: UUID | str) -> str:
    """The 8-character prefix a run is shown by."""
    return str(run_id)[:8]


def compact(value: Any, width: int = 60) -> str:
    """A JSON value on one line, cut to `width` characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


# What a terminal would act on rather than show: C0 controls (ESC starts CSI/OSC
# sequences: clear screen, window title, hyperlinks), DEL, C1 controls (0x9b is a
# one-byte CSI), and the bidirectional overrides that reorder what is shown.
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROLS = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")
_CONTROLS_IN_A_LINE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")
_RAW_IN_JSON = re.compile(f"[\x7f-\x9f{_BIDI}]")  # json.dumps escapes only C0 itself


def clean(text: str, *, one_line: bool = False) -> str:
    """`text` safe for a terminal: each control character shown as an escape (``\\x1b``).

    Recorded names, errors, results and reasons pass through here before any
    human output, so an escape sequence in them is shown, never obeyed. Newlines
    and tabs are kept unless `one_line` (a table cell, a timeline row).
    """
    pattern = _CONTROLS_IN_A_LINE if one_line else _CONTROLS
    if pattern.search(text) is None:
        return text
    return pattern.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _json_text(text: str) -> str:
    """JSON text with C1 and bidi controls escaped too: the same value, safe to print."""
    if text.isascii() or _RAW_IN_JSON.search(text) is None:
        return text
    return _RAW_IN_JSON.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def json_text(value: Any, *, indent: int | None = 2) -> str:
    """One JSON document as text (UTF-8 kept, every control character escaped)."""
    return _json_text(json.dumps(value, indent=indent, ensure_ascii=False))


LISTED_JSON = 1000
"""Ids a ``--json`` answer lists of any one kind (`listed`): the rest are counted."""


def listed(name: str, ids: Sequence[object], limit: int | None = None) -> dict[str, Any]:
    """The JSON fields of a bounded list of ids: `name` (the first `limit`, by default
    `LISTED_JSON`, as text), ``<name>_count`` (all of them) and ``<name>_left_out``."""
    most = LISTED_JSON if limit is None else limit
    shown = [str(value) for value in ids[:most]]
    return {name: shown, f"{name}_count": len(ids), f"{name}_left_out": len(ids) - len(shown)}


def print_json(value: Any) -> None:
    """Print one JSON document."""
    sys.stdout.write(json_text(value) + "\n")


def json_line(value: Any) -> str:
    """One line of JSON Lines (compact, no newline, every control character escaped)."""
    return _json_text(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def write_lines(lines: Iterable[str]) -> None:
    """Write lines to stdout in batches of 1000 (fast, and memory stays flat), each `clean`."""
    write, batch = sys.stdout.write, []
    for line in lines:
        batch.append(clean(line, one_line=True))
        if len(batch) == 1000:
            write("\n".join(batch) + "\n")
            batch.clear()
    if batch:
        write("\n".join(batch) + "\n")


def stdout_is_terminal() -> bool:
    """Whether human output goes to a terminal (rich tables and colour) or not (plain text)."""
    return sys.stdout.isatty()


def stderr_is_terminal() -> bool:
    """Whether progress bars may be drawn on stderr."""
    return sys.stderr.isatty()


Row = Sequence[str]


class Output:
    """Human output: rich tables and colour on a terminal, plain aligned text otherwise."""

    def __init__(self) -> None:
        self.terminal = stdout_is_terminal()
        self._console: Console | None = None

    @property
    def console(self) -> Console:
        """The rich console (created on first use)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(highlight=False)
        return self._console

    def line(self, text: str = "", style: str | None = None, *, crop: bool = False) -> None:
        """Print one line, in `style` on a terminal (cut at its width with `crop`, else wrapped)."""
        text = clean(text)
        if self.terminal:
            from rich.text import Text

            text_line = Text(text, style=style or "")
            if crop:
                self.console.print(text_line, no_wrap=True, overflow="ellipsis")
            else:
                self.console.print(text_line, overflow="fold")
        else:
            sys.stdout.write(text + "\n")

    def table(
        self,
        columns: Sequence[str],
        rows: Sequence[Row],
        *,
        title: str | None = None,
        styles: Sequence[str | None] | None = None,
        right: Sequence[int] = (),
        wrap: Sequence[int] | None = None,
    ) -> None:
        """Print a table; `styles` colours rows, `right` aligns columns to the right.

        On a narrow terminal only the `wrap` columns (default: the last) are wrapped;
        the others keep their width. Every cell and the title are `clean`ed.
        """
        rows = [[clean(cell, one_line=True) for cell in row] for row in rows]
        title = None if title is None else clean(title, one_line=True)
        if self.terminal:
            folding = (len(columns) - 1,) if wrap is None else wrap
            self._rich_table(columns, rows, title, styles, right, folding)
            return
        if title:
            sys.stdout.write(title + "\n")
        widths = _widths(columns, rows)
        for row in [list(columns), *rows]:
            cells = [
                cell.rjust(width) if index in right else cell.ljust(width)
                for index, (cell, width) in enumerate(zip(row, widths, strict=True))
            ]
            sys.stdout.write("  ".join(cells).rstrip() + "\n")

    def _rich_table(
        self,
        columns: Sequence[str],
        rows: Sequence[Row],
        title: str | None,
        styles: Sequence[str | None] | None,
        right: Sequence[int],
        wrap: Sequence[int],
    ) -> None:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        table = Table(
            title=None if title is None else Text(title),
            title_justify="left",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            collapse_padding=True,
        )
        for index, (column, width) in enumerate(zip(columns, _widths(columns, rows), strict=True)):
            fixed = index not in wrap
            words = [len(word) for row in rows for word in row[index].split()]
            table.add_column(
                column,
                justify="right" if index in right else "left",
                no_wrap=fixed,
                min_width=width if fixed else min(max([len(column), *words]), 8),
                overflow="fold",
            )
        for index, row in enumerate(rows):
            # Text, not str: rich would read "[link=...]" in a recorded name as markup.
            table.add_row(*map(Text, row), style=styles[index] if styles else None)
        self.console.print(table)


def _widths(columns: Sequence[str], rows: Sequence[Row]) -> list[int]:
    return [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]


class ProgressBar:
    """A rich progress bar on stderr when it is a terminal; silent otherwise."""

    def __init__(self, description: str, total: int) -> None:
        self._bar: Any = None
        if stderr_is_terminal() and total:
            from rich.console import Console
            from rich.progress import Progress

            self._bar = Progress(console=Console(stderr=True), transient=True)
            self._task = self._bar.add_task(description, total=total)
            self._bar.start()

    def advance(self, amount: int) -> None:
        """Move the bar `amount` steps on."""
        if self._bar is not None:
            self._bar.advance(self._task, amount)

    def close(self) -> None:
        """Take the bar off the terminal."""
        if self._bar is not None:
            self._bar.stop()


STATUS_STYLES = {
    "succeeded": "green",
    "running": "cyan",
    "failed": "red",
    "aborted_stuck": "red",
    "cancelled": "yellow",
    "done_partial": "yellow",
    "idle": "blue",
    "waiting": "magenta",
    "failed_resumable": "red",
}
"""The colour of each run status on a terminal."""


def import_object(option: str, spec: str) -> Any:
    """The object ``module:attr`` names (the current directory is importable, as with -m).

    Raises:
        BadOption: the module or the attribute cannot be found.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise BadOption(option, spec, "expected module:attr")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # an ImportError, or whatever the module raised on import
        problem = f"cannot import {module_name}: {type(error).__name__}: {error}"
        raise BadOption(option, spec, problem) from None
    value = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise BadOption(option, spec, f"{module_name} has no attribute {attr!r}")
        value = getattr(value, part)
    return value
