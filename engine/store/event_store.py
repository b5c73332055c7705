"""The event store: eventsourcing's recorders behind one small, typed interface."""

from __future__ import annotations

import functools
import itertools
import operator
import sqlite3
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from eventsourcing.persistence import (
    IntegrityError,
    Mapper,
    PersistenceError,
    StoredEvent,
)

from engine.store import meta, urls
from engine.store.backend import Backend
from engine.store.chain import Chain, StoredRow, chain_key, split
from engine.store.codec import Codec
from engine.store.errors import (
    AppendOutcomeUnknown,
    ConcurrencyConflict,
    HeadMissing,
    OutcomeUnknown,
    RunBeingErased,
    RunErased,
    StoreError,
)
from engine.store.failures import classify, is_database_error
from engine.store.mapper import EventMapper, NotJoined
from engine.store.sqlite import open_sqlite
from engine.store.sqlite import writable as sqlite_writable
from engine.store.sqlite.recorder import UPGRADED
from engine.store.stream import Stream
from events import Event, EventFormatError, InvalidPayload, RunDeleted, RunFinished
from events.storable import unstorable_field

if TYPE_CHECKING:  # the workers' module (a process pool) is loaded only by a check by ranges
    from engine.store.chain_workers import RangeReading
    from engine.store.sqlite.joined import JoinedPage

PAGE = 1000
"""Events read per query when streaming a run."""
JOINED_FROM = 250
"""The fewest events a stream reads as pages joined by the database (`Backend.joined_rows`):
its query and topics cost a page ~30 µs more, each event read ~0.3 µs less than a row."""
_Row = TypeVar("_Row")
_UPGRADED = f"{UPGRADED}; nothing of this append was written"


class Store:
    """Appends events atomically and reads each run's events back, in pages.

    Args:
        url: ``memory://``, ``sqlite:///file.db``, ``postgresql://...`` or
            ``eventsourcing://TOPIC?SETTING=value`` (any eventsourcing persistence module).
        create: whether a missing store may be created (read-only tools say no).
        cipher_key: AES key (base64) for encryption at rest.
        max_event_bytes: the largest event (serialised JSON) `append` writes; default
            the URL's ``max_event_bytes`` option, else 1 MiB.
        read_only: open the store for reading only: nothing is ever written to it
            (a SQLite file is opened ``mode=ro``; projections fold new events in
            memory), so a read replica, a read-only role or file serves every read.
        settings: more settings for an ``eventsourcing://`` persistence module
            (e.g. its password, kept out of the URL).
        chain_key: the secret of keyed links (HMAC) in each run's hash chain; default
            derived from `cipher_key`; neither: plain SHA-256 links.

    Raises:
        ChainKeyMismatch: a writable open with a chain key other than the one the
            store's chain was recorded with (or none for a keyed chain, or one for a plain).
        StoreError: the URL is bad, the store unreachable, foreign or too new, or
            `max_event_bytes` is not an int >= 1.
    """

    def __init__(
        self,
        url: str,
        *,
        create: bool = True,
        cipher_key: str | None = None,
        max_event_bytes: int | None = None,
        read_only: bool = False,
        settings: Mapping[str, str] | None = None,
        chain_key: str | None = None,
    ) -> None:
        parsed = urls.parse(url)
        self.url = parsed.masked
        self.read_only = read_only
        limit = parsed.max_event_bytes if max_event_bytes is None else max_event_bytes
        if type(limit) is not int or limit < 1:
            raise StoreError(self.url, f"max_event_bytes must be an int >= 1, got {limit!r}")
        secret = _chain_key(cipher_key, chain_key)
        self._backend: Backend = open_backend(
            parsed,
            create=create and not read_only,
            cipher_key=cipher_key,
            read_only=read_only,
            module_settings=settings,
            chain_secret=secret,
        )
        self.recorder = self._backend.recorder
        self._mapper = self._backend.mapper
        self._mapper.max_event_bytes = limit
        self._mapper.chain = Chain(secret)
        self._secret = secret
        self.chain_record = self._backend.chain
        """The store's hash chain as its meta table records it (None: not recorded)."""
        self.views = self._backend.views
        self.views_problem = self._backend.views_problem
        self.views_read_only = self._backend.read_only
        """Whether `views` (the stored ones, or None) were opened read-only: never to be written."""

    @property
    def upgrade_available(self) -> str:
        """What a one-time ``stagetrail upgrade`` would improve in this store ("": nothing)."""
        return self._backend.upgrade

    @property
    def max_event_bytes(self) -> int:
        """The largest event (serialised JSON, in bytes) `append` writes."""
        return self._mapper.max_event_bytes

    @property
    def mapper(self) -> EventMapper:
        """eventsourcing's mapper for this store's events (JSON, compression, cipher)."""
        return self._mapper

    @property
    def codec(self) -> Codec:
        """The serializer of everything else stored: the mapper's JSON, compression and cipher."""
        return self._backend.codec

    def generation(self) -> int:
        """How many times runs were erased from this store, by any process (0: never).

        `erase` counts one more in the transaction that removes the runs, so a
        cache of run data (states, snapshots, a thread's checkpoints) kept with
        the generation it was read in is stale once this answers another number:
        an erased run's id may since name a new run. One small read per call.

        Raises:
            StoreError: the database failed.
        """
        try:
            return self._backend.generation()
        except Exception as error:
            if not is_database_error(error):
                raise
            raise classify(self.url, error, "reading the erasure generation failed") from error

    def append(self, events: Sequence[Event]) -> list[int]:
        """Serialise and write `events` in one transaction; return their notification ids.

        Raises:
            InvalidPayload: an event holds a value JSON cannot store, a NUL or a lone
                surrogate, or is over `max_event_bytes`; nothing written.
            ConcurrencyConflict: another writer holds one of the versions.
            StoreError: the database failed; nothing was written.
        """
        return self.write(self.seal(events)[0])

    def seal(self, events: Sequence[Event]) -> tuple[list[StoredEvent], dict[UUID, bytes]]:
        """`events` serialized, each chained to its run's event before it; each run's last link.

        Raises:
            InvalidPayload: as `serialize`.
        """
        links: dict[UUID, bytes] = {}
        stored = []
        for event in events:
            serialized, links[event.run_id] = self.chained(event, links.get(event.run_id))
            stored.append(serialized)
        return stored, links

    def serialize(self, event: Event, previous: bytes | None = None) -> StoredEvent:
        """The stored form of `event` (eventsourcing's mapper: JSON, link, compression, cipher).

        Args:
            previous: the link of the run's event before it (b"" for a run's first);
                default: read from the store.

        Raises:
            InvalidPayload: naming the field the transcoder cannot store (a lone
                surrogate in a str, a NUL, an int too long to print, ...) or the
                largest field of an event over `max_event_bytes`.
        """
        return self.chained(event, previous)[0]

    def chained(self, event: Event, previous: bytes | None = None) -> tuple[StoredEvent, bytes]:
        """`serialize`, and the event's link (what the run's next event chains to).

        Raises:
            InvalidPayload: as `serialize`.
        """
        if previous is None:
            previous = self.link_at(event.run_id, event.version - 1)
        try:
            return self._mapper.to_chained(event, previous)
        except InvalidPayload:
            raise
        except (UnicodeError, ValueError, TypeError) as error:
            raise _unstorable(self._mapper, event, error) from None

    def link_at(self, run_id: UUID, version: int) -> bytes:
        """The link stored in the run's event `version` (b"" for none: version 0, a run not
        stored, an event written before chaining). One read.

        Raises:
            StoreError: the database failed, or the event cannot be read.
        """
        if version < 1:
            return b""
        found = self.stored_events(run_id, gt=version - 1, lte=version)
        if not found:
            return b""
        try:
            parts = split(self._mapper.json_of(found[0]))
        except EventFormatError as error:
            raise StoreError(self.url, str(error)) from error
        return b"" if parts is None else parts[2]

    def stored_at(self, run_id: UUID, version: int) -> bytes | None:
        """The stored bytes of the run's event `version` (None: not stored). One read.

        Raises:
            StoreError: the database failed.
        """
        found = self.stored_events(run_id, gt=version - 1, lte=version, limit=1)
        return found[0].state if found else None

    def chain_key_problem(self) -> str | None:
        """What is wrong with the chain key given for the store's recorded chain (None: right,
        none given, or no chain recorded); a writable open refuses it, a read-only one says it."""
        record = self.chain_record
        if record is None or self._secret is None:
            return None
        return record.mismatch(self._secret)

    def must_link_from(self, run_id: UUID) -> int | None:
        """The run's first version the recorded chain says must carry a link (None: none).

        Every event of a store created chained; of an older store, those stored after it
        was first opened by a release that records the chain. One read at most.

        Raises:
            StoreError: the database failed.
        """
        record = self.chain_record
        if record is None:
            return None
        if record.chained_from == 0:
            return 1
        if self._backend.stored_after is None:
            return None
        try:
            return self._backend.stored_after(run_id, record.chained_from)
        except Exception as error:
            if not is_database_error(error):
                raise
            raise classify(self.url, error, "reading the chain's start failed") from error

    def stored_stream(self, run_id: UUID) -> Iterator[StoredEvent]:
        """The run's events as stored, one after another (for `verify`).

        Raises:
            StoreError: the database failed.
        """
        for page in self.stored_pages(run_id):
            yield from page

    def stored_pages(self, run_id: UUID) -> Iterator[list[StoredEvent]]:
        """The run's events as stored, a page (`PAGE` events) at a time.

        Raises:
            StoreError: the database failed.
        """
        read = functools.partial(self.stored_events, run_id)
        return _paged(lambda gt: read(gt=gt), lambda page: page[-1].originator_version)

    def stored_rows(self, run_id: UUID, gt: int = 0) -> Iterator[list[StoredRow]]:
        """The run's events as stored after version `gt`, a page (`PAGE` events) at a time,
        each a plain (version, topic, state) row: the lean read of `verify`, which needs no
        `StoredEvent` per event where the recorder reads rows (SQLite).

        Raises:
            StoreError: the database failed.
        """
        read = functools.partial(self._rows_after, run_id)
        return _paged(read, lambda page: page[-1][0], gt)

    def range_reading(self) -> RangeReading | None:
        """How another connection (or process) reads this store's runs by ranges of versions,
        decoding them as this store does; None where the backend cannot (memory)."""
        reader = self._backend.range_reader
        if reader is None:
            return None
        from engine.store.chain_workers import RangeReading  # a process pool: verify's alone

        mapper = self._mapper
        return RangeReading(reader(), mapper.cipher, mapper.compressor)

    def _rows_after(self, run_id: UUID, gt: int) -> list[StoredRow]:
        """A page of the run's rows after version `gt` (see `stored_rows`)."""
        read = self._backend.stored_rows
        if read is None:
            page = self.stored_events(run_id, gt=gt)
            return [(stored.originator_version, stored.topic, stored.state) for stored in page]
        try:
            return read(run_id, gt=gt, limit=PAGE)
        except (PersistenceError, sqlite3.Error) as error:
            raise classify(self.url, error, "read failed") from error

    def stored_events(
        self, run_id: UUID, *, gt: int | None = None, lte: int | None = None, limit: int = PAGE
    ) -> list[StoredEvent]:
        """The run's events as stored (`gt < version <= lte`, at most `limit`): for `verify`.

        Raises:
            StoreError: the database failed.
        """
        try:
            return list(self.recorder.select_events(run_id, gt=gt, lte=lte, limit=limit))
        except (PersistenceError, sqlite3.Error) as error:
            raise classify(self.url, error, "read failed") from error

    def write(
        self, stored: Sequence[StoredEvent], *, known: Mapping[UUID, bytes] | None = None
    ) -> list[int]:
        """Write serialised events in one transaction; return their notification ids.

        A lost connection is retried; an append found stored after it is a success,
        never a conflict with itself. Each run's event before the batch must be stored,
        be the run's newest (a later one above a free version is a run being erased,
        whose hole no append fills), and be the very bytes `known` gives for the run,
        where it gives them (a run erased since its writer read it may have a new run
        under its id by now, as long).

        Args:
            known: by run, the stored bytes of its event before the batch, as the writer
                holds them (a run not in it: that event must only be stored).

        Raises:
            ConcurrencyConflict: another writer holds one of the versions.
            RunErased: a run's event before the batch is gone, or is not the one `known`
                gives, or the versions after it are a hole of the run's erase: the run was
                erased (`Engine.compact`), or its erase began, after the writer read it.
            StoreError: the store was upgraded in place since it was opened (or see below).
            OutcomeUnknown: the store stayed unreachable while the append was
                committing; `run.refresh()` later tells whether it was stored.
            StoreReadOnly: the store may not be written (read-only file, role, replica).
            StoreFull: the disk or database is full.
            StoreError: the database failed otherwise; nothing was written.
        """
        heads = run_heads(stored)
        extra: dict[str, Any] = {}
        if known and heads:
            expected = [known.get(run_id) for run_id, _ in heads]
            if any(head is not None for head in expected):
                extra["head_states"] = expected
        try:
            notification_ids = self.recorder.insert_events(stored, heads=heads, **extra)
        except HeadMissing:
            raise self._erased(heads, extra.get("head_states")) from None
        except IntegrityError as error:
            if "CHECK constraint failed" in str(error):  # a compact table, written as text
                raise StoreError(self.url, _UPGRADED) from error
            first = stored[0]
            raise ConcurrencyConflict(
                _as_uuid(first.originator_id), first.originator_version
            ) from None
        except AppendOutcomeUnknown as error:
            first = stored[0]
            raise OutcomeUnknown(
                self.url, _as_uuid(first.originator_id), first.originator_version, str(error)
            ) from error
        except (PersistenceError, sqlite3.Error) as error:
            raise classify(self.url, error, "append failed, nothing written") from error
        return list(notification_ids or ())

    def _erased(
        self, heads: Sequence[tuple[UUID, int]], states: Sequence[bytes | None] | None
    ) -> RunErased | ConcurrencyConflict:
        """Why a head check refused an append: the first run of `heads` whose event the store
        no longer holds (or holds as other bytes than `states` gives); else another writer
        took a run's next version (a head is checked to be its run's newest event too); else
        a run's next version is a hole of a run being erased."""
        found = [
            self.stored_events(run_id, gt=version - 1, lte=version + 1, limit=2)
            for run_id, version in heads
        ]
        for index, (run_id, version) in enumerate(heads):
            held = found[index][0] if found[index] else None
            known = states[index] if states is not None else None
            if held is None or held.originator_version != version:
                return RunErased(run_id, version + 1)
            if known is not None and held.state != known:
                return RunErased(run_id, version + 1)
        for index, (run_id, version) in enumerate(heads):
            if len(found[index]) > 1:
                return ConcurrencyConflict(run_id, version + 1)
        run_id, version = heads[0]  # a hole above a head, or written back meanwhile
        return RunErased(run_id, version + 1)

    def read(
        self,
        run_id: UUID,
        *,
        gt: int | None = None,
        lte: int | None = None,
        limit: int | None = None,
        topics: Collection[str] | None = None,
    ) -> list[Event]:
        """The run's events with `gt < version <= lte`, oldest first, at most `limit`.

        Args:
            topics: only the events of these topics (None: all): the others are read
                (`limit` counts them) but never decoded, so a fold that needs few
                kinds of event pays for those only (`projections.handled_topics`).

        Raises:
            RunBeingErased: the read found versions missing where the run's erasure has
                begun (see `erasure_begun`).
        """
        # `_get`'s lean read of a UUID inline: a point-in-time read of a short run is a few
        # dozen calls, one of them this.
        given: object = run_id
        if self._backend.stored_rows is None or not isinstance(given, UUID):
            return self._get(run_id, topics, gt, lte, limit)
        try:
            found = self._rows(run_id, gt, lte, limit)
            if topics is not None:
                found = [row for row in found if row[1] in topics]
            return self._mapper.from_rows(run_id, found)
        except EventFormatError as error:
            raise StoreError(self.url, str(error)) from error
        except (PersistenceError, sqlite3.Error) as error:
            raise classify(self.url, error, "read failed") from error

    def _get(
        self,
        run_id: UUID,
        topics: Collection[str] | None = None,
        gt: int | None = None,
        lte: int | None = None,
        limit: int | None = None,
        desc: bool = False,
    ) -> list[Event]:
        # The query's bounds passed as they are, not as a dict of keywords: a point-in-time
        # read of a short run is a few dozen calls, a dict of arguments each a cost of note.
        given: object = run_id
        if not isinstance(given, UUID):  # an id given as text, as the recorders accept it
            run_id = UUID(str(given))
        try:
            mapper = self._mapper
            if self._backend.stored_rows is not None:  # the lean read: no `StoredEvent` each
                found = self._rows(run_id, gt, lte, limit, desc)
                if topics is not None:
                    found = [row for row in found if row[1] in topics]
                return mapper.from_rows(run_id, found)
            stored = self.recorder.select_events(run_id, gt=gt, lte=lte, desc=desc, limit=limit)
            ends = [event.originator_version for event in (*stored[:1], *stored[-1:])]
            self._check_whole(run_id, ends, len(stored), gt, lte, limit, desc)
            if topics is not None:
                stored = [event for event in stored if event.topic in topics]
            return mapper.to_domain_events(stored)
        except EventFormatError as error:
            raise StoreError(self.url, str(error)) from error
        except (PersistenceError, sqlite3.Error) as error:
            raise classify(self.url, error, "read failed") from error

    def _check_whole(
        self,
        run_id: UUID,
        ends: Sequence[int],
        count: int,
        gt: int | None,
        lte: int | None,
        limit: int | None,
        desc: bool = False,
    ) -> None:
        """Refuse a run being erased where an ascending read (`count` versions, the first and
        last of them `ends`, empty: none) shows a hole: versions not consecutive from `gt` + 1,
        or fewer than asked up to `lte`. No read otherwise; a hole of a run not being erased
        (edited by hand) is `verify`'s to report.

        Raises:
            RunBeingErased: the run's erasure has begun.
        """
        if desc or not (count or lte is not None):
            return
        span = (ends[0], ends[-1]) if ends else None
        start = (gt or 0) + 1
        whole = span is None or (span[0] == start and span[1] - start == count - 1)
        short = lte is not None and (start - 1 if span is None else span[1]) < lte
        if whole and not (short and (limit is None or count < limit)):
            return
        newest = self._get(run_id, desc=True, limit=1)
        if newest:
            self._refuse_erasing(run_id, newest[0])

    def erasure_begun(self, run_id: UUID, newest: Event) -> int | None:
        """A version the run lost to an erase that has begun (None: not being erased).

        An erase (`Engine.compact`) removes only deleted runs, and removes a long run's
        events on PostgreSQL over several transactions: newest first, keeping its
        `RunStarted` and its deletion (`newest`) to the last. So a run is being erased
        when its newest event is its deletion and the event before it, or its second
        (an erase of an older release went oldest first), is gone. At most two reads,
        only for a deleted run.

        Raises:
            StoreError: the database failed.
        """
        deleted = type(newest) is RunDeleted or (
            type(newest) is RunFinished and newest.status == "deleted"
        )
        if not deleted or newest.version < 3:
            return None
        for version in (newest.version - 1, 2):
            if not self.stored_events(run_id, gt=version - 1, lte=version, limit=1):
                return version
        return None

    def _refuse_erasing(self, run_id: UUID, newest: Event) -> None:
        """Raise `RunBeingErased` if the run's erasure has begun (`newest`: its newest event)."""
        missing = self.erasure_begun(run_id, newest)
        if missing is not None:
            raise RunBeingErased(run_id, missing)

    def stream(self, run_id: UUID, *, gt: int = 0, lte: int | None = None) -> Stream:
        """The run's events after `gt`, page by page, so memory stays flat.

        On SQLite and PostgreSQL each page is read as plain rows, opened and read as
        JSON in one pass by the mapper (cipher, compression, one JSON call a page), and
        its events built one at a time as they are taken (`EventMapper.decoded`). A
        fold narrows the stream to the topics it handles (`Stream.narrowed`).

        Raises:
            RunBeingErased: a page found versions missing where the run's erasure has begun.
            StoreError: the database failed, or an event cannot be read (named).
        """
        given: object = run_id
        if not isinstance(given, UUID):  # an id given as text, as the recorders accept it
            run_id = UUID(str(given))
        return Stream(functools.partial(self._stream, run_id, gt, lte))

    def _stream(
        self, run_id: UUID, gt: int, lte: int | None, topics: frozenset[str] | None
    ) -> Iterator[Event]:
        """The events of `stream` (only those of `topics`, None: all)."""
        if self._backend.stored_rows is None:  # no lean read: a page of events at a time
            return self._event_pages(run_id, gt, lte, topics)
        # Each page's events straight from its iterator: no generator of ours per event.
        return itertools.chain.from_iterable(self._decoded_pages(run_id, gt, lte, topics))

    def _decoded_pages(
        self, run_id: UUID, gt: int, lte: int | None, topics: frozenset[str] | None
    ) -> Iterator[Iterator[Event]]:
        """Each page of the run's rows, as an iterator building its events when taken."""
        decoded = self._mapper.decoded
        one_row = self._backend.joined_rows is not None and self._mapper.reads_joined
        if lte is not None and lte - gt < JOINED_FROM:  # a short read: its rows cost less
            one_row = False
        while True:
            page = self._joined(run_id, gt, lte, topics) if one_row else None
            if page is not None:
                try:
                    events = decoded(run_id, page.rows, self._again, page.joined)
                except NotJoined:  # read as rows below
                    pass
                else:
                    yield events
                    if page.count < PAGE:
                        return
                    gt = page.last  # type: ignore[assignment]  # a whole page has one
                    continue
            rows = self._rows(run_id, gt=gt, lte=lte, limit=PAGE)
            wanted = rows if topics is None else _of_topics(rows, topics)
            try:
                yield decoded(run_id, wanted, self._alone)
            except EventFormatError as error:
                raise StoreError(self.url, str(error)) from error
            if len(rows) < PAGE:
                return
            gt = rows[-1][0]

    def _joined(
        self, run_id: UUID, gt: int, lte: int | None, topics: frozenset[str] | None
    ) -> JoinedPage | None:
        """A page of the run read as one row (`Backend.joined_rows`), refused if it shows a
        hole of the run's erasure; None: a page to read as rows."""
        read = self._backend.joined_rows
        assert read is not None  # asked only of a backend that reads joined pages
        try:
            page = read(run_id, topics, gt=gt, lte=lte, limit=PAGE)
            if page is not None:
                ends = [] if page.first is None else [page.first, page.last]
                self._check_whole(run_id, ends, page.count, gt, lte, PAGE)  # type: ignore[arg-type]
        except (PersistenceError, sqlite3.Error) as error:
            raise classify(self.url, error, "read failed") from error
        return page

    def _again(self, run_id: UUID, row: tuple[int, str]) -> Event:
        """The event of a joined page's `row` (version, topic) its state could not be built
        for: read again as its stored row and decoded alone (`_alone`), naming it if unreadable.

        Raises:
            StoreError: the event cannot be read (naming its run and version).
        """
        version = row[0]
        found = self._rows(run_id, gt=version - 1, lte=version, limit=1)
        if not found:  # gone since the page was read (erased)
            raise StoreError(self.url, f"run {run_id} version {version}: no longer stored")
        return self._alone(run_id, found[0])

    def _alone(self, run_id: UUID, row: StoredRow) -> Event:
        """A row decoded from its stored bytes alone (`EventMapper.alone`), an unreadable one
        refused as `read` refuses it.

        Raises:
            StoreError: the event cannot be read (naming its run and version).
        """
        try:
            return self._mapper.alone(run_id, row)
        except EventFormatError as error:
            raise StoreError(self.url, str(error)) from error

    def _event_pages(
        self, run_id: UUID, gt: int, lte: int | None, topics: frozenset[str] | None
    ) -> Iterator[Event]:
        """`_stream` where the recorder reads no plain rows: a page of events at a time."""
        while True:
            page = self.read(run_id, gt=gt, lte=lte, limit=PAGE)
            yield from page if topics is None else _of(page, topics)
            if len(page) < PAGE:
                return
            gt = page[-1].version

    def _rows(
        self,
        run_id: UUID,
        gt: int | None = None,
        lte: int | None = None,
        limit: int | None = None,
        desc: bool = False,
    ) -> list[StoredRow]:
        """A page of the run's plain rows (the lean read of `read` and `stream`), refused if it
        shows a hole of the run's erasure."""
        read = self._backend.stored_rows
        assert read is not None  # asked only of a backend that reads rows
        try:
            found = read(run_id, gt=gt, lte=lte, desc=desc, limit=limit)
            # `_check_whole`'s common case inline (versions gt + 1 up to lte, all there):
            # no call of it per read.
            start = (gt or 0) + 1
            if not (
                found
                and found[0][0] == start
                and found[-1][0] == lte == start + len(found) - 1
                and not desc
            ):
                ends = (found[0][0], found[-1][0]) if found else ()
                self._check_whole(run_id, ends, len(found), gt, lte, limit, desc)
        except EventFormatError as error:
            raise StoreError(self.url, str(error)) from error
        except (PersistenceError, sqlite3.Error) as error:
            raise classify(self.url, error, "read failed") from error
        return found

    def last(self, run_id: UUID) -> Event | None:
        """The run's newest event, or None if the run is not in the store.

        Raises:
            RunBeingErased: the run is deleted and its erasure has begun.
        """
        found = self.newest(run_id)
        return None if found is None else found[0]

    def newest(self, run_id: UUID) -> tuple[Event, bytes] | None:
        """The run's newest event and its stored bytes (None: the run is not stored): `last`,
        and what a writer's next append requires the store to hold before it. One read.

        Raises:
            RunBeingErased: the run is deleted and its erasure has begun.
        """
        given: object = run_id
        if not isinstance(given, UUID):  # an id given as text, as the recorders accept it
            run_id = UUID(str(given))
        try:
            rows = self._backend.stored_rows
            if rows is not None:
                found = rows(run_id, desc=True, limit=1)
                if not found:
                    return None
                event, state = self._mapper.from_rows(run_id, found)[0], bytes(found[0][2])
            else:
                stored = list(self.recorder.select_events(run_id, desc=True, limit=1))
                if not stored:
                    return None
                event, state = self._mapper.to_domain_events(stored)[0], stored[0].state
        except EventFormatError as error:
            raise StoreError(self.url, str(error)) from error
        except (PersistenceError, sqlite3.Error) as error:
            raise classify(self.url, error, "read failed") from error
        self._refuse_erasing(run_id, event)
        return event, state

    def erase(self, run_ids: Sequence[UUID]) -> int:
        """Physically remove runs' events and snapshots; the events removed.

        The only way anything leaves the store (`Engine.compact` uses it for deleted runs).
        In one transaction (on PostgreSQL, one per `ERASE_EVENTS` events: a failure may
        leave earlier ones done, which a later call finishes, and meanwhile every reader
        refuses a run partly erased, see `erasure_begun`); each counts one more erasure
        `generation`, which every cache of run data checks. Their notification
        ids are not given out again where the database keeps a sequence; persistent
        projections must be rebuilt afterwards.

        Raises:
            StoreError: the database failed; its transaction removed nothing.
        """
        if self._backend.erase is None or not run_ids:
            return 0
        try:
            return self._backend.erase(run_ids)
        except (PersistenceError, sqlite3.Error) as error:  # a read-only server says so
            doing = "erase failed, its transaction removed nothing"
            raise classify(self.url, error, doing) from error

    def close(self) -> None:
        """Release the store's connections."""
        self._backend.close()

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def run_heads(stored: Sequence[StoredEvent]) -> list[tuple[UUID, int]]:
    """Each run's event the batch continues, (run, version): the version before its first
    in the batch, for a run not started by it. The store must hold each when it appends, or
    the run was erased since its writer read it (its versions are free again)."""
    firsts: dict[UUID, int] = {}
    last: object = None
    for event in stored:
        originator = event.originator_id
        if originator is last:  # a batch is mostly one run's: one id object, seen
            continue
        last, run_id = originator, _as_uuid(originator)
        if run_id not in firsts:
            firsts[run_id] = event.originator_version
    return [(run_id, first - 1) for run_id, first in firsts.items() if first > 1]


def _chain_key(cipher_key: str | None, given: str | None) -> bytes | None:
    try:
        return chain_key(cipher_key, given)
    except ValueError:  # a bad cipher key is the cipher's to report, when it opens
        return None


def _as_uuid(value: UUID | str) -> UUID:
    return value if isinstance(value, UUID) else UUID(value)


def _unstorable(mapper: Mapper[UUID], event: Event, error: Exception) -> InvalidPayload:
    """Find the payload field the transcoder refused, to name it in the error."""
    refused = unstorable_field(event)
    if refused is not None:
        return refused
    for name, value in event.payload().items():
        try:
            mapper.transcoder.encode({name: value})
        except (UnicodeError, ValueError, TypeError) as refused:
            return InvalidPayload(name, name, f"cannot be stored as JSON ({refused})")
    return InvalidPayload("?", type(event).__name__, f"cannot be stored as JSON ({error})")


def open_backend(
    url: urls.StoreURL,
    *,
    create: bool,
    cipher_key: str | None,
    read_only: bool = False,
    module_settings: Mapping[str, str] | None = None,
    chain_secret: bytes | None = None,
) -> Backend:
    """Open (or create, when allowed) the store `url` names, with the backend of its scheme.

    Raises:
        StoreError: unreachable, not a stagetrail store, newer schema, wrong key.
    """
    settings = meta.wanted(url.options, cipher_key, url.masked, chain_secret)
    if url.scheme == "sqlite":
        return open_sqlite(url, create, settings, read_only=read_only)
    if url.scheme == "memory":  # each backend imported when its store is opened
        from engine.store.memory import open_memory

        return open_memory(settings)
    if url.scheme == "eventsourcing":
        from engine.store.module import open_module

        return open_module(url, settings, module_settings or {}, read_only=read_only)
    try:  # psycopg is the optional `postgres` extra: imported only for PostgreSQL stores
        from engine.store.postgres import open_postgres
    except ImportError:
        raise StoreError(
            url.masked, "PostgreSQL support is not installed: pip install 'stagetrail[postgres]'"
        ) from None
    return open_postgres(url, create, settings, read_only=read_only)


def writable(url: str) -> bool:
    """Whether this process may write to the existing store `url` (its projections' progress too).

    A read command opens a store it may write normally, so the persistent
    projections it catches up are saved for the next command, and opens the
    others read-only (a read-only file or directory, a replica, a role that may
    only read), folding in memory. A store that cannot be reached or is not a
    stagetrail store answers False: the read-only open then says why.
    """
    try:
        parsed = urls.parse(url)
    except StoreError:
        return False
    if parsed.scheme == "memory":
        return True
    if parsed.scheme == "sqlite":
        return sqlite_writable(parsed)
    if parsed.scheme != "postgresql":
        return False
    try:
        from engine.store.postgres import writable as postgres_writable
    except ImportError:
        return False
    return postgres_writable(parsed)


def _paged(
    read: Callable[[int], list[_Row]], version: Callable[[list[_Row]], int], gt: int = 0
) -> Iterator[list[_Row]]:
    """A run's pages of `PAGE` rows after version `gt`: `read(gt)` reads the one after
    version `gt`, `version` tells a page's last."""
    while True:
        page = read(gt)
        if page:
            yield page
        if len(page) < PAGE:
            return
        gt = version(page)


def _of_topics(rows: list[StoredRow], topics: frozenset[str]) -> list[StoredRow]:
    """The rows of `topics` among `rows`: `rows` itself when all are (C's loops, no bytecode
    of ours per row, which a fold's stream reads by the million)."""
    if topics.issuperset(map(_ROW_TOPIC, rows)):
        return rows
    return list(itertools.compress(rows, map(topics.__contains__, map(_ROW_TOPIC, rows))))


_ROW_TOPIC = operator.itemgetter(1)


def _of(events: list[Event], topics: frozenset[str]) -> list[Event]:
    """The events of `topics` among `events`."""
    return [event for event in events if event.topic in topics]
