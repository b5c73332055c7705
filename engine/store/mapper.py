"""eventsourcing's Mapper, taught stagetrail's attrs events.

The transcoder, compressor and cipher stay eventsourcing's; only the mapping
between event attributes and the stored state dict is stagetrail's own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import datetime
from operator import attrgetter, itemgetter
from typing import Any
from uuid import UUID

import orjson
from eventsourcing.persistence import Cipher, Compressor, JSONTranscoder, Mapper, StoredEvent

from engine.store.chain import FIELD, Chain, StoredRow
from events import Event, EventFormatError, decode, encode_timed
from events.codec import read_each
from events.storable import DEFAULT_MAX_EVENT_BYTES, check_stored

_NUL_IN_JSON = b"\\u0000"
"""How the transcoder writes a NUL character."""
_PLAIN_ONLY = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS
"""What orjson would convert on its own terms goes to `_not_plain` instead (a datetime
it writes as `datetime.isoformat` does)."""
_DIGITS_ONLY = bytes(48 if byte in b"0123456789" else 32 for byte in range(256))
"""A `bytes.translate` table writing each digit as 0 and every other byte as a blank."""
_LONG_DIGITS = b"0" * 19
"""Nineteen digits in a row (once translated): maybe an int beyond 64 bits, which orjson
would read as a float. Every int of at most eighteen digits fits; a run in a string or a
float only sends those bytes to the exact, slower standard library."""
_STRIDE = 4
"""`_long_digits` first reads every fourth byte: nineteen digits in a row put four of them
side by side there (the first at most three bytes into the run), where a timestamp's digits
never are (a float's sixteen or more may be)."""
_SAMPLED_RUN = b"0" * 4


def _long_digits(data: bytes) -> bool:
    """Whether `data` holds nineteen digits in a row (`_LONG_DIGITS`): exact, reading every
    fourth byte first (`_STRIDE`), then every byte only from the first place four of those
    are digits side by side to the last."""
    sample = data[::_STRIDE].translate(_DIGITS_ONLY)
    # `find`, not `in`: bytes' `in` first tries its operand as an int (a raised and cleared
    # TypeError).
    first = sample.find(_SAMPLED_RUN)
    if first == -1:
        return False
    # A run of nineteen holding sampled bytes at..at+3 starts at most three bytes before
    # the first of them and ends at most eighteen after it.
    start = first * _STRIDE - _STRIDE + 1
    end = sample.rfind(_SAMPLED_RUN) * _STRIDE + len(_LONG_DIGITS)
    near = data[start if start > 0 else 0 : end]
    return near.translate(_DIGITS_ONLY).find(_LONG_DIGITS) != -1


class NotJoined(Exception):  # not an error: a page read another way
    """A page whose states a database joined is to be read as rows (`EventMapper.decoded`)."""


def _not_plain(value: object) -> Any:
    raise TypeError(f"{type(value).__name__} is not plain JSON")


class FastJSONTranscoder(JSONTranscoder):
    """eventsourcing's JSON transcoder for plain JSON, encoding and decoding with orjson.

    It is given event states only, and an event's state is plain JSON by then:
    its class's converters made strict JSON copies (str keys, finite floats,
    subclasses turned into their base types) and encoded the other fields (a
    UUID as its hex). On such values orjson writes the bytes `JSONTranscoder`
    writes (compact, UTF-8), twelve times faster; only a float's exponent may
    be spelled differently (``1e-7`` for ``1e-07``), the same number when read.
    What orjson will not write exactly (an int beyond 64 bits, a subclass, a
    dataclass) goes to the standard library's encoder, which raises where
    `JSONTranscoder` does. Either writes a datetime (an event's timestamp) as
    `datetime.isoformat` does. Not for values the converters refuse:
    orjson writes a UUID or an Enum member its own way, and NaN as ``null``.
    It decodes with orjson too, except JSON that may hold an int beyond 64 bits
    (orjson reads one as a float) or that orjson refuses (a lone surrogate, a
    number too large for a float): the standard library reads those, exactly as
    before. Neither uses eventsourcing's ``{"_type_", "_data_"}`` hook:
    stagetrail's codec types the fields itself, and a user's dict with those two
    keys must come back as the dict it was.
    """

    def __init__(self) -> None:
        super().__init__()
        self._plain = json.JSONDecoder()
        self._strict = json.JSONEncoder(
            default=self._default, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )

    def encode(self, obj: Any) -> bytes:
        """Encode `obj` as compact UTF-8 JSON."""
        # A copy the size of the JSON: orjson's own bytes keep its whole output
        # buffer (~4 KB each, seen with orjson 3.13), and a batch holds its events.
        return bytes(memoryview(self.encode_passing(obj)))

    def encode_passing(self, obj: Any) -> bytes:
        """`encode` without its copy: bytes that may hold a larger buffer, for a caller that
        copies them into bytes of its own at once (a seal) and keeps only those."""
        try:
            return orjson.dumps(obj, default=_not_plain, option=_PLAIN_ONLY)
        except TypeError:  # not plain JSON to orjson: the standard library decides
            return self.encode_stdlib(obj)

    def encode_stdlib(self, obj: Any) -> bytes:
        """Encode `obj` with the standard library's encoder (as `JSONTranscoder` does)."""
        return self._strict.encode(obj).encode("utf8")

    def _default(self, value: Any) -> Any:
        """A datetime (an event's timestamp) as ISO 8601 text, as orjson writes it."""
        if isinstance(value, datetime):
            return value.isoformat()
        return self.encoder.default(value)

    def decode_many(self, documents: Sequence[bytes]) -> list[Any] | None:
        """Decode many UTF-8 JSON documents at once, or None when one needs `decode` alone.

        One check for long digits and one orjson call over a page of a run's events
        (documents joined into one array) cost a fraction of a call per document.
        None: a document may hold an int beyond 64 bits, or is not one JSON value
        orjson reads (`decode` then reads each one, or says which is wrong).
        """
        if not documents:
            return []
        return self.decode_parts(list(documents))

    def decode_parts(self, parts: list[bytes]) -> list[Any] | None:
        """`decode_many` of a list of at least one document that is the caller's to change
        (its first and last are replaced): no copy of it made."""
        count = len(parts)
        # One copy of the page: its brackets go on the first and last documents, which
        # are small, where `b"[" + joined + b"]"` copied the whole page twice more.
        try:
            parts[0] = b"[" + parts[0]
            parts[-1] = bytes(parts[-1]) + b"]"
            joined = b",".join(parts)
        except TypeError:  # a state NULL (None), edited by hand: `decode` alone names it
            return None
        return self.decode_array(joined, count)

    def decode_array(self, joined: bytes, count: int) -> list[Any] | None:
        """Decode a JSON array of `count` documents (`decode_many`'s, or one a database
        joined), or None when one needs `decode` alone (see `decode_many`)."""
        if _long_digits(joined):
            return None
        try:
            values = orjson.loads(joined)
        except orjson.JSONDecodeError:
            return None
        # Two documents glued into one value ("1,2" read as two) would shift the rest.
        return values if type(values) is list and len(values) == count else None

    def decode(self, data: bytes) -> Any:
        """Decode UTF-8 JSON bytes into plain Python values."""
        # translate and `find` are C loops: a sample of the bytes first (`_long_digits`).
        if not _long_digits(data):
            try:
                return orjson.loads(data)
            except orjson.JSONDecodeError:
                pass  # not JSON orjson reads: the standard library reads it or says where
        return self._plain.decode(data.decode("utf8"))


def opened(cipher: Cipher | None, compressor: Compressor | None, data: bytes) -> bytes:
    """A stored state decrypted by `cipher` and decompressed by `compressor` (either None:
    not applied): the JSON written, the one way back from what `EventMapper` stores
    (`json_of`; a worker process checking a range of the chain, `RangeReading`).

    Raises:
        Exception: whatever the cipher or compressor raise (they raise assorted types).
    """
    if cipher:
        data = cipher.decrypt(data)
    if compressor:
        data = compressor.decompress(data)
    return bytes(data)


def not_bytes(state: object) -> str:
    """What is wrong with a stored state that is not bytes (a row edited in the database):
    it is NULL, text, a number, another type."""
    if state is None:
        return "its stored state is NULL, not bytes"
    if isinstance(state, str):
        return "its stored state is text, not bytes"
    if isinstance(state, (int, float)):
        return f"its stored state is a number ({state!r}), not bytes"
    return f"its stored state is a {type(state).__name__}, not bytes"


def _why(state: object, error: Exception) -> str:
    """The reason a state cannot be read: not bytes, else what `error` says."""
    if isinstance(state, (bytes, bytearray, memoryview)):
        return f"{type(error).__name__}: {error}"
    return not_bytes(state)


class EventMapper(Mapper[UUID]):
    """Converts stagetrail events to eventsourcing `StoredEvent`s and back.

    Args:
        max_event_bytes: the largest serialised event (JSON, before compression
            and encryption) it writes.
    """

    def __init__(
        self,
        transcoder: FastJSONTranscoder,
        compressor: Compressor | None = None,
        cipher: Cipher | None = None,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        super().__init__(transcoder, compressor, cipher)
        self.max_event_bytes = max_event_bytes
        self.chain = Chain()
        """How links are computed: keyed when the store holds a chain key (see `Store`)."""

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        """Serialise an event without a link (eventsourcing's interface; stores use `to_chained`).

        Raises:
            InvalidPayload: the event is over `max_event_bytes` or holds a NUL.
        """
        topic, data = self._json(domain_event)
        return self._sealed(domain_event, topic, data)

    def to_chained(self, domain_event: Any, previous: bytes) -> tuple[StoredEvent, bytes]:
        """Serialise an event with its link to `previous` (b"" for a run's first): both.

        Raises:
            InvalidPayload: the event is over `max_event_bytes` or holds a NUL.
        """
        topic, body = self._json(domain_event, passing=True)  # the seal below copies it
        data, link = self.chain.sealed(
            previous, domain_event.run_id, domain_event.version, topic, body
        )
        if data is body:  # a chain that wrote no link: the copy `encode` makes
            data = bytes(memoryview(body))
        return self._sealed(domain_event, topic, data), link

    def _json(self, domain_event: Any, *, passing: bool = False) -> tuple[str, bytes]:
        topic, state = encode_timed(domain_event)  # the transcoder writes the timestamp
        transcoder = self.transcoder
        if passing and type(transcoder) is FastJSONTranscoder:
            data = transcoder.encode_passing(state)
        else:
            data = transcoder.encode(state)
        # `find`, not `in`: bytes' `in` first tries its operand as an int (a raised and
        # cleared TypeError, the cost of the search itself many times over). A NUL is
        # written escaped, so after a backslash: one byte is looked for first (memchr,
        # a tenth of the six bytes' search), most JSON holding none.
        escaped = data.find(b"\\")
        if len(data) > self.max_event_bytes or (
            escaped != -1 and data.find(_NUL_IN_JSON, escaped) != -1
        ):  # rare: inline
            check_stored(domain_event, data, self.max_event_bytes)
        return topic, data

    def _sealed(self, domain_event: Any, topic: str, data: bytes) -> StoredEvent:
        if self.compressor:
            data = self.compressor.compress(data)
        if self.cipher:
            data = self.cipher.encrypt(data)
        return StoredEvent(domain_event.run_id, domain_event.version, topic, data)

    def to_domain_event(self, stored_event: StoredEvent) -> Event:
        """Deserialise a stored event, upcasting older class versions.

        Raises:
            EventFormatError: naming the run and version that cannot be read.
        """
        return self.from_json(stored_event, self.json_of(stored_event))

    def json_of(self, stored_event: StoredEvent) -> bytes:
        """The stored event's JSON as written (its link in it): decrypted, decompressed.

        Raises:
            EventFormatError: naming the run and version that cannot be read.
        """
        try:
            return opened(self.cipher, self.compressor, stored_event.state)
        except Exception as error:  # the cipher and codecs raise assorted types
            raise self._unreadable(stored_event, _why(stored_event.state, error)) from error

    def from_json(self, stored_event: StoredEvent, data: bytes) -> Event:
        """The event whose stored JSON (`json_of`) is `data`, upcast.

        Raises:
            EventFormatError: naming the run and version that cannot be read.
        """
        try:
            state = self.transcoder.decode(data)
        except Exception as error:  # the codecs raise assorted types
            raise self._unreadable(stored_event, _why(data, error)) from error
        if type(state) is dict:
            state.pop(FIELD, None)  # the link is the store's, not the event's
        run_id = stored_event.originator_id
        try:
            return decode(
                stored_event.topic, state, _as_uuid(run_id), stored_event.originator_version
            )
        except EventFormatError as error:
            raise self._unreadable(stored_event, error.reason) from error

    def to_domain_events(self, stored_events: Sequence[StoredEvent]) -> list[Event]:
        """Deserialise a page of stored events, as `to_domain_event` does each one, faster.

        A page of one run is read as `from_rows` reads its rows; anything else goes
        through `to_domain_event` one by one.

        Raises:
            EventFormatError: naming the run and version that cannot be read.
        """
        if len(stored_events) < 2:
            return [self.to_domain_event(stored) for stored in stored_events]
        run_id = stored_events[0].originator_id
        # A recorder's page shares one id object: compared by identity in C, by value if not.
        if len(set(map(id, map(_originator, stored_events)))) > 1 and any(
            stored.originator_id != run_id for stored in stored_events
        ):
            return [self.to_domain_event(stored) for stored in stored_events]
        rows = list(
            zip(
                map(_version, stored_events),
                map(_topic, stored_events),
                map(_state, stored_events),
                strict=True,
            )
        )
        return self.from_rows(_as_uuid(run_id), rows)

    def from_rows(self, run_id: UUID, rows: Sequence[StoredRow]) -> list[Event]:
        """Deserialise a page of one run's rows (version, topic, state), oldest first.

        The lean read of a fold: no `StoredEvent` per row. Each state is decrypted
        and decompressed by the mapper's cipher and compressor, as `json_of` does;
        the page's JSON is then read in one call (`FastJSONTranscoder.decode_many`)
        and its events built by readers made once per class (`read_each`).
        Anything that path cannot read goes through `to_domain_event` one by one,
        which names the event that is wrong.

        Raises:
            EventFormatError: naming the run and version that cannot be read.
        """
        transcoder = self.transcoder
        if len(rows) < 2 or not isinstance(transcoder, FastJSONTranscoder):
            return self._one_by_one(run_id, rows)
        documents = list(map(_row_state, rows))
        if self.cipher or self.compressor:
            try:
                documents = list(map(self._opened, documents))
            except Exception:  # the cipher and codecs raise assorted types: one by one says which
                return self._one_by_one(run_id, rows)
        states = transcoder.decode_parts(documents)  # the list is its own: no copy of it
        if states is None:
            return self._one_by_one(run_id, rows)
        try:  # the link is the store's, not the event's: ignored as each is decoded
            return list(read_each(rows, states, run_id, FIELD, None))
        except EventFormatError:  # which one: decoded again alone, it names its version
            return self._one_by_one(run_id, rows)

    def decoded(
        self, run_id: UUID, rows: Sequence[Any], alone: Any = None, joined: bytes | None = None
    ) -> Iterator[Event]:
        """`from_rows`, each event built as it is taken: the lean read of a stream.

        The page is opened (cipher, compression) and its JSON read in one call as
        `from_rows` reads it; each event is then built when the stream reaches it, so a
        fold holds one event at a time, not a page of them. An event `read_each` cannot
        build is decoded alone (upcast, or its run and version named). An iterator, not
        a generator of its own: a stream's events pass through one generator less.

        Args:
            alone: decodes one row from its stored bytes when the page's state of it
                cannot be built (default `alone`: `to_domain_event`'s errors).
            joined: the page's states as one JSON array a database joined (in the order
                of `rows`, each (version, topic) then; `alone` reads a row's stored bytes
                again by its version).

        Raises:
            EventFormatError: naming the run and version that cannot be read (from
                `alone`, as the iterator reaches it).
            NotJoined: `joined` is to be read as rows instead (a state needing `decode`
                alone, a store not `reads_joined`).
        """
        transcoder = self.transcoder
        if joined is not None:
            if not self.reads_joined:
                raise NotJoined
            assert isinstance(transcoder, FastJSONTranscoder)
            found = transcoder.decode_array(joined, len(rows))
            if found is None:
                raise NotJoined
            return read_each(rows, found, run_id, FIELD, alone)
        if len(rows) < 2 or not isinstance(transcoder, FastJSONTranscoder):
            return iter(self._one_by_one(run_id, rows))
        documents = list(map(_row_state, rows))
        if self.cipher or self.compressor:
            try:
                documents = list(map(self._opened, documents))
            except Exception:  # the cipher and codecs raise assorted types: one by one says which
                return iter(self._one_by_one(run_id, rows))
        states = transcoder.decode_parts(documents)  # the list is its own: no copy of it
        if states is None:
            return iter(self._one_by_one(run_id, rows))
        return read_each(rows, states, run_id, FIELD, alone or self.alone)

    @property
    def reads_joined(self) -> bool:
        """Whether it reads a page's states joined into one JSON array (`decoded`'s
        ``joined``): its stored states are the JSON itself (no cipher, no compression)."""
        return not (self.cipher or self.compressor) and type(self.transcoder) is FastJSONTranscoder

    def alone(self, run_id: UUID, row: StoredRow) -> Event:
        """The event of `row` decoded from its stored bytes alone (names it if unreadable)."""
        return self.to_domain_event(StoredEvent(run_id, *row))

    def _opened(self, data: bytes) -> bytes:
        """A stored state decrypted and decompressed (`json_of` without its error naming)."""
        return opened(self.cipher, self.compressor, data)

    def _one_by_one(self, run_id: UUID, rows: Sequence[StoredRow]) -> list[Event]:
        return [
            self.to_domain_event(StoredEvent(run_id, version, topic, state))
            for version, topic, state in rows
        ]

    @staticmethod
    def _unreadable(stored_event: StoredEvent, reason: str) -> EventFormatError:
        return EventFormatError(
            stored_event.topic,
            f"run {stored_event.originator_id} version {stored_event.originator_version}: {reason}",
        )


_originator = attrgetter("originator_id")
_topic = attrgetter("topic")
_version = attrgetter("originator_version")
_state = attrgetter("state")
_row_state = itemgetter(2)


def _as_uuid(value: UUID | str) -> UUID:
    return value if isinstance(value, UUID) else UUID(value)
