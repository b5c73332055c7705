"""The hash chain of a run: every stored event carries the link that ties it to the one before.

A link is SHA-256 (or, keyed, HMAC-SHA256) over the previous event's link, the
event's run id, version and topic, and its stored JSON: the very bytes the
mapper writes, before compression and encryption, so upcasting (which acts on
read) and a change of cipher key leave it intact. It is written into those
bytes as the last member of the JSON object, ``"_c":"<mode><link>"`` (the
link's 16 bytes in unpadded URL-safe base64, 22 characters: 31 bytes per event),
so eventsourcing's recorders and their tables stay as they are, and a store
written before chaining (no member) still reads. Mode ``s`` is plain SHA-256,
``k`` keyed: a chain whose key is not known can be recomputed by anyone with
write access, a keyed one only by whoever holds the key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import operator
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeAlias
from uuid import UUID

FIELD = "_c"
"""The member of an event's stored JSON object that holds its link."""
PLAIN, KEYED = "s", "k"
"""The first character of a link's text: plain SHA-256, or HMAC-SHA256 with the chain key."""
_OPEN = b',"' + FIELD.encode() + b'":"'
_CLOSE = b'"}'
LINK_BYTES = 16
"""A link is the first 128 bits of the SHA-256 or HMAC-SHA256: forging one is a second
preimage (2**128 tries), or without the key a MAC guess; 128-bit HMAC-SHA256 tags are
standard (RFC 4868)."""
_LINK_TEXT = 22
"""Characters of a link in unpadded URL-safe base64."""
_SUFFIX = len(_OPEN) + 1 + _LINK_TEXT + len(_CLOSE)
StoredRow: TypeAlias = tuple[int, str, bytes]
"""One stored event of a run as a plain row: its version, topic and stored bytes (or JSON)."""
_CONTEXT = b"stagetrail chain: keyed links of a run's events"
_CHECK_LABEL = b"stagetrail chain key check"
"""What the store's meta table keeps an HMAC of, to tell the chain key from another."""
"""Derives the chain key from the key given, so it never equals a cipher or digest key."""


class Chain:
    """Computes and reads the links of a store's events.

    Args:
        key: the secret the writers hold (keyed links), or None (plain SHA-256).
    """

    __slots__ = (
        "_blank", "_inner", "_key", "_mark", "_mark_length", "_outer", "_run", "_suffix",
        "mode",
    )  # fmt: skip

    def __init__(self, key: bytes | None = None) -> None:
        self._keyed(None if key is None else hmac.digest(key, _CONTEXT, "sha256"))

    def _keyed(self, derived: bytes | None) -> None:
        """Set up the chain for the derived key `derived` (None: plain SHA-256)."""
        self._key = derived
        self._inner, self._outer = _pads(derived)
        """SHA-256 fed the key's inner and outer pad, copied for each link: `hmac.digest` takes
        the key in again for every message, 3-4 times the cost of the message's own hash, and
        `hmac.HMAC.copy` is Python code, a third of a keyed check of a long run."""
        self.mode = PLAIN if derived is None else KEYED
        self._suffix = b'%.*b,"' + FIELD.encode() + b'":"' + self.mode.encode() + b'%.22b"}'
        self._mark = _OPEN + self.mode.encode()
        self._mark_length = len(self._mark)
        self._blank = self._mark + bytes(_LINK_TEXT) + _CLOSE
        """An event's last bytes, its link's text left blank (`_held` writes them in)."""
        self._run: tuple[UUID | None, bytes, bytes] = (None, b"", b"")
        """The last run's id, its message format and its 16 bytes: a run's events are linked
        one after another."""

    def __reduce__(self) -> tuple[Callable[[bytes | None], Chain], tuple[bytes | None]]:
        """Pickled as its derived key (what a worker process checking pages needs), never
        the writers' secret it was derived from."""
        return _derived_chain, (self._key,)

    @property
    def keyed(self) -> bool:
        """Whether links are HMACs with the chain key (else plain SHA-256)."""
        return self._key is not None

    def check(self) -> str:
        """The HMAC (hex) of a fixed label under the chain key: tells it from another ("" plain)."""
        if self._key is None:
            return ""
        return hmac.digest(self._key, _CHECK_LABEL, "sha256").hex()

    def link(self, previous: bytes, run_id: UUID, version: int, topic: str, body: bytes) -> bytes:
        """The link of one event: over `previous` (b"" for the first) and its stored JSON `body`."""
        message = self._format(run_id) % (
            previous,
            _VERSION(version),
            _TOPICS.get(topic) or _topic(topic),
            body,
        )
        return self._digest(message)

    def sealed(
        self, previous: bytes, run_id: UUID, version: int, topic: str, body: bytes
    ) -> tuple[bytes, bytes]:
        """`body` (a JSON object) with its link to `previous` written in (`seal`), and the link:
        what an append writes, in one call over the serializer's bytes.

        `link` and `seal` in one frame: every recorded event comes through here, so it
        binds nothing per call it can read once (the run's 16 bytes, the topic's).
        """
        run, _, run_bytes = self._run
        if run is not run_id:
            self._format(run_id)
            run_bytes = self._run[2]
        # one join of the message's parts (the run's 16 bytes, and the topic with the NUL
        # after it, made once): a %-format of them costs a fifth more
        parts = (previous, run_bytes, _VERSION(version), _HEADS.get(topic) or _head(topic), body)
        if self._inner is None:
            link = _sha256(_join(parts)).digest()[:LINK_BYTES]
        else:
            link = self._digest(_join(parts))
        # %.22b drops the base64's padding and newline
        return self._suffix % (len(body) - 1, body, _b2a(link).translate(_URLSAFE)), link

    def _digest(self, message: bytes) -> bytes:
        """The link of `message`: the first `LINK_BYTES` of its SHA-256, or of its HMAC."""
        if self._inner is None:
            return _sha256(message).digest()[:LINK_BYTES]
        hashed = self._inner.copy()
        hashed.update(message)
        tagged = self._outer.copy()
        tagged.update(hashed.digest())
        link: bytes = tagged.digest()[:LINK_BYTES]
        return link

    def _format(self, run_id: UUID) -> bytes:
        """The %-format of the messages of `run_id`'s links (its 16 bytes written in)."""
        run, message, _ = self._run
        if run is not run_id:
            message = _message_format(run_id)
            self._run = (run_id, message, run_id.bytes)
        return message

    def follows(
        self, previous: bytes, run_id: UUID, version: int, topic: str, data: bytes
    ) -> bytes:
        """The link of the stored JSON `data` when it holds a link in this chain's mode that
        follows `previous`, else b"" (see `split` and `recompute` for why not).

        The fast path of checking a chain: the link is recomputed and compared as text,
        so nothing is decoded unless it differs.
        """
        start = len(data) - _SUFFIX
        if start <= 0 or data[start : start + self._mark_length] != self._mark:
            return b""
        topic_bytes = _TOPICS.get(topic) or _topic(topic)
        body = data[:start] + b"}"
        link = self._digest(self._format(run_id) % (previous, _VERSION(version), topic_bytes, body))
        text = binascii.b2a_base64(link, newline=False).translate(_URLSAFE)[:_LINK_TEXT]
        return link if data[start + self._mark_length :] == text + _CLOSE else b""

    def run_along(
        self,
        previous: bytes,
        version: int,
        run_id: UUID,
        rows: Sequence[StoredRow],
        start: int = 0,
    ) -> tuple[int, bytes]:
        """How many of `rows` from index `start` (one run's, in version order, from
        `version` on, each holding its stored JSON) carry their right link in this
        chain's mode, one after another, and the last of those links.

        `follows` over a page: checking a long run's chain spends its time here, so an
        event costs only its message and its hash in Python; the links are compared with
        the stored ones a chunk of rows at a time (`_held`). Chunks grow eightfold from
        `_FIRST_CHUNK`, so a break costs at most a chunk's hashes more than event by event.
        """
        count = _consecutive(rows, start, version)
        links = self._links_plain if self._inner is None else self._links_keyed
        done, size = 0, _FIRST_CHUNK
        while done < count:
            chunk = rows[start + done : start + min(done + size, count)]
            try:
                computed = links(previous, version + done, run_id, chunk)
                held = self._held(chunk, computed)
            except TypeError:  # a stored state that is no bytes (edited): followed up to it
                stored = _stored(chunk)
                if stored == len(chunk):
                    raise
                count = done + stored
                continue
            if held:
                done, previous = done + held, computed[held - 1]
            if held < len(chunk):
                break
            size *= 8
        return done, previous

    def _held(self, rows: Sequence[StoredRow], links: list[bytes]) -> int:
        """How many of `rows`, from the first, end with their link of `links` (one a row, up
        to the first row too short to hold one) in this mode, as `seal` writes it.

        The whole chunk in a few calls: every link encoded at once (each padded to 18
        bytes, six base64 groups: its 22 characters then "AA"), their texts placed in the
        rows' expected last bytes, compared with the rows' last bytes joined.
        """
        count = len(links)
        if count <= 1:  # a chunk's first row alone: placing 22 texts would cost more
            return count and int(rows[0][2].endswith(self._tail(links[0])))
        texts = _b2a(_PAD.join(links) + _PAD, newline=False).translate(_URLSAFE)
        expected = bytearray(self._blank * count)
        for place in range(_LINK_TEXT):
            expected[self._mark_length + place :: _SUFFIX] = texts[place::_PADDED_TEXT]
        stored = _join(map(_LAST, map(_DATA, rows[:count])))
        if stored == expected:
            return count
        for index in range(0, count * _SUFFIX, _SUFFIX):  # a break: its row
            if stored[index : index + _SUFFIX] != expected[index : index + _SUFFIX]:
                return index // _SUFFIX
        return count  # unreachable: equal rows make equal joins

    def _tail(self, link: bytes) -> bytes:
        """An event's last bytes holding `link` in this mode, as `seal` writes them."""
        return self._mark + _b2a(link, newline=False).translate(_URLSAFE)[:_LINK_TEXT] + _CLOSE

    def _links_plain(
        self, previous: bytes, version: int, run_id: UUID, rows: Iterable[StoredRow]
    ) -> list[bytes]:
        """The links `rows` must hold to follow `previous` from `version` on (plain SHA-256),
        up to the first row too short to hold one or not of the version expected."""
        links: list[bytes] = []
        suffix, size, add = _SUFFIX, LINK_BYTES, links.append
        message, pack, sha256 = _cut_format(run_id), _VERSION, _sha256
        # a run's rows mostly share a topic: a str compare where a driver gives a new str
        # a row costs less than looking its bytes up each time
        named, topic_bytes = "", b""
        for stored, topic, data in rows:
            if topic != named:
                named, topic_bytes = topic, _TOPICS.get(topic) or _topic(topic)
            cut = len(data) - suffix
            if cut <= 0 or stored != version:  # a version edited to a number not whole: a break
                break
            text = message % (previous, pack(version), topic_bytes, cut, data)
            previous = sha256(text).digest()[:size]
            add(previous)
            version += 1
        return links

    def _links_keyed(
        self, previous: bytes, version: int, run_id: UUID, rows: Iterable[StoredRow]
    ) -> list[bytes]:
        """`_links_plain` of keyed links: HMAC-SHA256 as `_digest` computes it (RFC 2104)."""
        links: list[bytes] = []
        suffix, size, add = _SUFFIX, LINK_BYTES, links.append
        inner, outer = self._inner.copy, self._outer.copy
        message, pack = _cut_format(run_id), _VERSION
        named, topic_bytes = "", b""  # as `_links_plain`
        for stored, topic, data in rows:
            if topic != named:
                named, topic_bytes = topic, _TOPICS.get(topic) or _topic(topic)
            cut = len(data) - suffix
            if cut <= 0 or stored != version:
                break
            hashed = inner()
            hashed.update(message % (previous, pack(version), topic_bytes, cut, data))
            tagged = outer()
            tagged.update(hashed.digest())
            previous = tagged.digest()[:size]
            add(previous)
            version += 1
        return links

    def recompute(self, mode: str, *args: object) -> bytes | None:
        """`link` for a link written in `mode`, or None when this chain cannot (a keyed link
        and no key)."""
        if mode == self.mode:
            return self.link(*args)  # type: ignore[arg-type]
        if mode == PLAIN:
            return Chain(None).link(*args)  # type: ignore[arg-type]
        return None

    def seal(self, body: bytes, link: bytes) -> bytes:
        """`body` (a JSON object) with `link` written in as its last member."""
        text = _b2a(link).translate(_URLSAFE)  # %.22b drops the padding and newline
        return self._suffix % (len(body) - 1, body, text)


_TOPICS: dict[str, bytes] = {}
_HEADS: dict[str, bytes] = {}
"""Each topic's bytes and the NUL after them in a link's message."""
_join = b"".join
_URLSAFE = bytes.maketrans(b"+/", b"-_")
_sha256 = hashlib.sha256
_b2a = binascii.b2a_base64
_FIRST_CHUNK = 1
"""Rows `Chain.run_along` checks first, before chunks eight times larger each: one, as a
run read in the other mode (keyed links without the key, plain ones with it) breaks at
every event, and `ChainCheck.page` calls it from each: a chunk's hashes an event there."""
_DATA = operator.itemgetter(2)
_LAST = operator.itemgetter(slice(-_SUFFIX, None))
"""A row's stored JSON, and its last bytes: where its link is."""
_PAD = b"\0\0"
_PADDED_TEXT = _LINK_TEXT + 2
"""Two zero bytes after a link make 18 bytes, six base64 groups: its 22 characters (the
22nd holds no bit of the padding), then "AA"."""
_VERSION = struct.Struct(">Q").pack
"""A version as the 8 big-endian bytes a link's message holds."""


def _pads(derived: bytes | None) -> tuple[Any, Any]:
    """SHA-256 fed the inner and outer pad of HMAC key `derived` (RFC 2104), (None, None) for
    none: a keyed link is SHA-256 of the outer pad and SHA-256 of the inner pad and message."""
    if derived is None:
        return None, None
    if len(derived) > _BLOCK:  # RFC 2104: a key longer than a block is hashed first
        derived = _sha256(derived).digest()
    block = derived.ljust(_BLOCK, b"\0")
    return (
        _sha256(block.translate(_INNER_PAD)),
        _sha256(block.translate(_OUTER_PAD)),
    )


_BLOCK = 64
"""SHA-256's block: the length of an HMAC key's pads."""
_INNER_PAD = bytes(byte ^ 0x36 for byte in range(256))
_OUTER_PAD = bytes(byte ^ 0x5C for byte in range(256))
"""Translation tables XOR-ing each byte of a key with RFC 2104's ipad and opad."""


def _derived_chain(derived: bytes | None) -> Chain:
    """A `Chain` of the derived key `derived` (see `Chain.__reduce__`)."""
    chain = Chain.__new__(Chain)
    chain._keyed(derived)
    return chain


def _message_format(run_id: UUID) -> bytes:
    """The %-format of a link's message in `run_id`: the previous link, the run's 16 bytes
    (written in, each % doubled), the version, the topic, a NUL and the stored JSON."""
    return b"%b" + run_id.bytes.replace(b"%", b"%%") + b"%b%b\x00%b"


def _cut_format(run_id: UUID) -> bytes:
    """`_message_format` of `run_id` taking the stored JSON's length before its link and the
    stored JSON itself, and closing the object: `run_along` formats each message without
    first copying the stored JSON cut short (``%.*b``; a length under 0 formats none)."""
    return _message_format(run_id)[:-2] + b"%.*b}"


def _consecutive(rows: Sequence[StoredRow], start: int, version: int) -> int:
    """How many of `rows` from `start` on have the versions `version`, `version` + 1, ...,
    as far as the first and last say (the links compare each row's: `_links_plain`).

    A store returns a run's events in version order, each version once, so the first
    and last decide for a whole page of whole numbers; but SQLite keeps a version edited
    to one that is not whole (3.5) as it is, between its neighbours, so `_links_plain`
    stops at a row whose version is not the one its link's message packs. Anything else
    is counted one by one.
    """
    count = len(rows) - start
    if count <= 0:
        return 0
    if rows[start][0] == version and rows[-1][0] == version + count - 1:
        return count
    done = 0
    while done < count and rows[start + done][0] == version + done:
        done += 1
    return done


def holds_bytes(data: object) -> bool:
    """Whether a row's stored state is bytes, as stagetrail writes it: not NULL, text or a
    number a database edit put there (a row's type says bytes; the database says what it
    holds)."""
    return isinstance(data, bytes)


def _stored(rows: Sequence[StoredRow]) -> int:
    """How many of `rows`, from the first, hold their stored JSON as bytes."""
    count = 0
    while count < len(rows) and holds_bytes(rows[count][2]):
        count += 1
    return count


def _head(topic: str) -> bytes:
    """The topic's bytes and the NUL after them, as a link's message holds them (made once)."""
    encoded = _HEADS.get(topic)
    if encoded is None:
        encoded = _HEADS[topic] = _topic(topic) + b"\0"
    return encoded


def _topic(topic: str) -> bytes:
    encoded = _TOPICS.get(topic)
    if encoded is None:
        encoded = _TOPICS[topic] = topic.encode()
    return encoded


def split(data: bytes) -> tuple[bytes, str, bytes] | None:
    """An event's stored JSON as (body, mode, link) when it holds a link, else None.

    The link is the object's last member: nothing a value holds can end the
    object with those bytes (a string's quotes are escaped, a nested object ends
    with another brace). A link's text must be the one its bytes encode to: base64
    decoding skips characters outside its alphabet and the last character's unused
    bits, so other texts decode to the same link, and an event edited there would pass.
    """
    if not holds_bytes(data) or len(data) <= _SUFFIX or not data.endswith(_CLOSE):
        return None  # no bytes: a state edited to NULL or text in the database
    start = len(data) - _SUFFIX
    if data[start : start + len(_OPEN)] != _OPEN:
        return None
    mode = data[start + len(_OPEN) : start + len(_OPEN) + 1].decode("ascii", "replace")
    text = data[start + len(_OPEN) + 1 : -len(_CLOSE)]
    try:
        link = base64.urlsafe_b64decode(text + b"==")
    except ValueError:
        return None
    if _b2a(link, newline=False).translate(_URLSAFE)[:_LINK_TEXT] != text:
        return None
    return data[:start] + b"}", mode, link


def chain_key(cipher_key: str | None, chain_secret: str | None) -> bytes | None:
    """The secret of a store's keyed links: the one given, else its cipher key's, else None."""
    if chain_secret:
        return chain_secret.encode("utf8", "surrogatepass")
    if cipher_key:
        return base64.b64decode(cipher_key)
    return None
