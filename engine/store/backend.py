"""What opening a store gives: eventsourcing's recorder, the mapper, the views.

Each backend module (`memory`, `sqlite`, `postgres`) opens its kind of store and
returns a `Backend`. Each checks (or creates) the meta table before the events
table, so a half-created store is still recognised as stagetrail's on the next open.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

import attrs
from eventsourcing.persistence import ApplicationRecorder

from engine.store.codec import Codec
from engine.store.mapper import EventMapper
from engine.store.meta import ChainRecord
from engine.store.views import Views

if TYPE_CHECKING:  # the workers' module (a process pool) is loaded only by a check by ranges
    from engine.store.chain_workers import RangeReader
    from engine.store.sqlite.joined import JoinedPage


class RowReader(Protocol):
    """Reads a run's page as plain (version, topic, state) rows, with `select_events`' query."""

    def __call__(
        self,
        run_id: UUID,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> list[tuple[int, str, bytes]]:
        """The rows with `gt < version <= lte`, oldest first (newest with `desc`), `limit` many."""


def row_reader(recorder: Any) -> RowReader:
    """`recorder.select_rows`, looked up at each read: the recorder's own method, as
    `select_events` is (a subclass's, or one observed), reads every page."""

    def read(
        run_id: UUID,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> list[tuple[int, str, bytes]]:
        # Keywords named, not `**query`: no dict of them made per read.
        rows: list[tuple[int, str, bytes]] = recorder.select_rows(
            run_id, gt=gt, lte=lte, desc=desc, limit=limit
        )
        return rows

    return read


class JoinedReader(Protocol):
    """Reads a run's page as one `JoinedPage` (None: a page to read as rows instead)."""

    def __call__(
        self,
        run_id: UUID,
        topics: Collection[str] | None,
        *,
        gt: int | None = None,
        lte: int | None = None,
        limit: int | None = None,
    ) -> JoinedPage | None:
        """The page with `gt < version <= lte`, oldest first, `limit` rows, the states of
        `topics`' rows joined (None: every topic)."""


def joined_reader(recorder: Any) -> JoinedReader:
    """`recorder.select_rows` with ``joined``, looked up at each read (as `row_reader`)."""

    def read(run_id: UUID, topics: Collection[str] | None, **query: Any) -> JoinedPage | None:
        page: JoinedPage | None = recorder.select_rows(
            run_id, joined=True if topics is None else topics, **query
        )
        return page

    return read


@attrs.frozen
class Backend:
    """An open recorder, the mapper for its bytes, and how to close them."""

    recorder: ApplicationRecorder
    mapper: EventMapper
    close: Callable[[], None]
    views: Views | None = None
    views_problem: str = ""
    erase: Callable[[Sequence[UUID]], int] | None = None
    """Physically removes runs' events and snapshots in one transaction; the events removed."""
    read_only: bool = False
    """Opened for reading only: `views` (the stored ones, or None) must never be written."""
    codec: Codec = attrs.field(kw_only=True)
    """Seals what the views store, with the mapper's compressor and cipher."""
    generation: Callable[[], int] = attrs.field(kw_only=True)
    """How many times `erase` removed runs from the store (see `Store.generation`)."""
    chain: ChainRecord | None = attrs.field(default=None, kw_only=True)
    """The store's hash chain as its meta table records it (None: not recorded)."""
    stored_after: Callable[[UUID, int], int | None] | None = attrs.field(default=None, kw_only=True)
    """The first version of a run stored after a notification position (None: none is)."""
    stored_rows: RowReader | None = attrs.field(default=None, kw_only=True)
    """A run's page as plain (version, topic, state) rows, `select_events`' arguments (None:
    the recorder reads `StoredEvent`s only)."""
    joined_rows: JoinedReader | None = attrs.field(default=None, kw_only=True)
    """A run's page as one `JoinedPage`, its states joined into one JSON array by the
    database (None: the backend reads rows only)."""
    range_reader: Callable[[], RangeReader] | None = attrs.field(default=None, kw_only=True)
    """A new reader of a run's ranges of versions over a connection of its own (None: the
    backend reads pages through its recorder only)."""
    upgrade: str = attrs.field(default="", kw_only=True)
    """What a one-time `stagetrail upgrade` would improve in this store ("": nothing)."""


def prepare_views(make: Callable[[], Any], codec: Codec) -> tuple[Any, str]:
    """The store's projection views, sealing with `codec`, or None and why they cannot be kept."""
    try:
        views = make()
        views.codec = codec
        views.create_table()
    except Exception as error:  # any database refusal leaves the events readable
        return None, f"{type(error).__name__}: {' '.join(str(error).split())}"
    return views, ""
