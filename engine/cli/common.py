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

from engine.errors import RunNotFound
from events import StagetrailError

if TYPE_CHECKING:
    from rich.console import Console

    from engine.engine import Engine


class AmbiguousRunId(StagetrailError, LookupError):
    """A run id prefix matches more than one run.

    Attributes:
        prefix: the prefix given.
        matches: (some of) the run ids it matches.
    """

    def __init__(self, prefix: str, matches: Sequence[UUID]) -> None:
        self.prefix = prefix
        self.matches = tuple(matches)
        shown = ", ".join(str(match) for match in self.matches[:3])
        more = ", ..." if len(self.matches) > 3 else ""
        super().__init__(
            f"run id prefix {prefix!r} is ambiguous: it matches {shown}{more}; give more characters"
        )


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

    Commands that only read pass `read_only`: they never change the store (or a
    file that is not one), and work on a read replica or with a read-only role.
    """
    from engine.engine import Engine

    with Engine(url, create=create, read_only=read_only) as engine:
        yield engine


_HEX = re.compile(r"[0-9a-f]{1,32}")


def resolve_run(engine: Engine, text: str) -> UUID:
    """The run a full id or a unique id prefix names.

    Raises:
        RunNotFound: nothing matches.
        AmbiguousRunId: several runs match.
    """
    cleaned = text.strip().lower()
    digits = cleaned.replace("-", "")
    if not _HEX.fullmatch(digits):
        raise RunNotFound(text, engine.url)
    if len(digits) == 32:
        run_id = UUID(digits)
        if engine.store.last(run_id) is None:
            raise RunNotFound(run_id, engine.url)
        return run_id
    matches = engine.projections.run_ids(_hyphenated(digits), limit=4)
    if not matches:
        raise RunNotFound(text, engine.url)
    if len(matches) > 1:
        raise AmbiguousRunId(text, matches)
    return matches[0]


def _hyphenated(digits: str) -> str:
    """A prefix of hex digits written as the same prefix of a hyphenated UUID."""
    parts, start = [], 0
    for end in (8, 12, 16, 20, 32):
        if len(digits) > start:
            parts.append(digits[start:end])
        start = end
    return "-".join(parts)


_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(option: str, text: str) -> datetime:
    """An ISO 8601 time (UTC when it names no zone) or a span ago such as ``90m``, ``2d``.

    Raises:
        BadOption: neither.
    """
    ago = _AGO.fullmatch(text.strip())
    if ago:
        span = timedelta(seconds=float(ago.group(1)) * _UNITS[ago.group(2)])
        return datetime.now(UTC) - span
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise BadOption(
            option, text, "not a time: give ISO 8601 (2026-11-20T09:00:00Z) or a span ago (90m, 2d)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


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
    except BadOption:
        raise BadOption(
            "--at", text, "not a version (17) or a time (2026-11-20T09:00:00Z, 90m)"
        ) from None


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


def print_json(value: Any) -> None:
    """Print one JSON document."""
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def json_line(value: Any) -> str:
    """One line of JSON Lines (compact, no newline)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def write_lines(lines: Iterable[str]) -> None:
    """Write lines to stdout in batches of 1000 (fast, and memory stays flat)."""
    write, batch = sys.stdout.write, []
    for line in lines:
        batch.append(line)
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
        the others keep their width.
        """
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

        table = Table(
            title=title,
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
            table.add_row(*row, style=styles[index] if styles else None)
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
