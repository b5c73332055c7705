"""The attempts LangGraph's own `RetryPolicy` retried, as LangGraph reports them: in its log.

Between two attempts of a node under a `RetryPolicy`, LangGraph calls no
checkpointer method: the failed attempt's writes are cleared and only the
task's last attempt reaches `put_writes`. What it does do, in
``langgraph.pregel._retry`` (sync and async alike), is log each retry at INFO
level, ``Retrying task NODE after S seconds (attempt N) after TYPE MESSAGE``,
with the exception, on which it noted ``During task with name 'NODE' and id
'TASK_ID'``. `RetryLog` is a filter on that logger: it keeps, per task id,
each retried attempt's error, type, delay and time, until the saver records
the task's outcome and takes them. It only listens; what the logger's own
handlers show is what they showed before (see `RetryLog.filter`).

Logging is the application's to configure, at any time: ``logging.config.dictConfig``
(or ``fileConfig``) disables every logger it does not name, LangGraph's included
when LangGraph was imported first, and resets the level of those below a logger it
names. A disabled logger or one above INFO makes no record, and no filter hears it.
So the saver listens again as each invocation begins (`RetryLog.install`): the logger
is enabled and at INFO for the run, and what it had hidden stays hidden.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from datetime import UTC, datetime

import attrs

RETRY_LOGGER = "langgraph.pregel._retry"
"""The logger LangGraph's retry loop reports each retry to."""
_NOTE = re.compile(r"During task with name '(?P<node>.*)' and id '(?P<task>[^']*)'")
_DELAY = re.compile(r" after (?P<delay>[0-9.]+) seconds \(attempt (?P<attempt>[0-9]+)\)")
_KEPT_TASKS = 10_000
"""Tasks whose retries are kept waiting for their outcome (those of graphs on other
checkpointers never come): the oldest are dropped beyond this."""


@attrs.frozen
class Retried:
    """One attempt of a node that failed and that LangGraph's `RetryPolicy` tried again."""

    node: str
    error: str
    error_type: str
    delay: float
    """The seconds LangGraph waited before the next attempt."""
    at: datetime
    """When the attempt failed (the retry is logged after the wait)."""


class RetryLog(logging.Filter):
    """A filter on LangGraph's retry logger that keeps each retried attempt by task id."""

    def __init__(self) -> None:
        super().__init__(RETRY_LOGGER)
        self._tasks: OrderedDict[str, list[Retried]] = OrderedDict()
        self._lock = threading.Lock()
        self._own_level: int | None = None
        """The logger's own level before it was lowered to INFO here; None if not lowered."""
        self._hidden = False
        """Whether the logger was disabled (it showed nothing) before it was enabled here."""
        self._logger = logging.getLogger(RETRY_LOGGER)
        """The logger (`logging.getLogger` gives one object per name for the process's life)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep a retry's attempt; let the record on only where it would have gone before.

        The logger is enabled and its level lowered to INFO to hear retries; a record
        the logger would not have let through before, disabled or below its own level
        or what its parent loggers let through, goes no further, so no handler shows
        more than it did.
        """
        retried = _retried(record)
        if retried is not None:
            task_id, attempt = retried
            with self._lock:
                self._tasks.setdefault(task_id, []).append(attempt)
                self._tasks.move_to_end(task_id)
                while len(self._tasks) > _KEPT_TASKS:
                    self._tasks.popitem(last=False)
        return self._shown(record)

    def _shown(self, record: logging.LogRecord) -> bool:
        """Whether the logger, as it was before it was lowered here, would let `record` on."""
        if self._hidden:
            return False
        if self._own_level is None:
            return True
        if self._own_level != logging.NOTSET:
            return record.levelno >= self._own_level
        parent = logging.getLogger(RETRY_LOGGER).parent
        return parent is None or record.levelno >= parent.getEffectiveLevel()

    def take(self, task_id: str) -> list[Retried]:
        """The retried attempts of a task, oldest first, forgotten here once taken."""
        with self._lock:
            return self._tasks.pop(task_id, [])

    def install(self) -> None:
        """Listen on LangGraph's retry logger, again after logging was configured since.

        Each invocation calls this: when the filter is on the logger, the logger hears INFO
        and its level is as this filter last left or found it, nothing is to be done (a
        check without the lock or the logging module's own).
        """
        logger = self._logger
        if (
            self in logger.filters
            and logger.isEnabledFor(logging.INFO)
            and (self._own_level is None or logger.level == logging.INFO)
        ):
            return
        with self._lock:
            if self not in logger.filters:
                logger.addFilter(self)
            if logger.disabled:
                logger.disabled = False
                self._hidden = True
            if logger.getEffectiveLevel() > logging.INFO:
                self._own_level = logger.level
                logger.setLevel(logging.INFO)
            elif self._own_level is not None and logger.level != logging.INFO:
                self._own_level = None  # set since by the application, low enough


def _retried(record: logging.LogRecord) -> tuple[str, Retried] | None:
    """The task id and attempt a retry's record reports; None for any other record."""
    error = record.exc_info[1] if record.exc_info else None
    if error is None:
        return None
    notes = [_NOTE.search(note) for note in getattr(error, "__notes__", ())]
    found = [match for match in notes if match is not None]
    delay = _DELAY.search(record.getMessage())
    if not found or delay is None:
        return None
    seconds = float(delay["delay"])
    failed = datetime.fromtimestamp(record.created - seconds, tz=UTC)
    note = found[-1]
    attempt = Retried(note["node"], str(error), type(error).__name__, seconds, failed)
    return note["task"], attempt


RETRIES = RetryLog()
"""The process's one listener on LangGraph's retry log, installed by each saver and invocation."""
