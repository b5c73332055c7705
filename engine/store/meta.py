"""The store's meta table: schema version and at-rest settings, decided at creation."""

from __future__ import annotations

import base64
import hmac
from collections.abc import Mapping
from typing import Any

import attrs
from eventsourcing.compressor import ZlibCompressor
from eventsourcing.persistence import Cipher, Compressor
from eventsourcing.utils import Environment

from engine.store.chain import Chain
from engine.store.codec import Codec
from engine.store.errors import ChainKeyMismatch, StoreError
from engine.store.mapper import EventMapper, FastJSONTranscoder

SCHEMA_VERSION = 1
COMPACT_SCHEMA = 2
"""The schema of a SQLite store with compact events (`COMPACT`): a release before it
refuses such a store ("written by a newer stagetrail") rather than misread it."""
LAYOUT = "events_layout"
"""The meta row naming how a SQLite store keeps its events: `COMPACT`, or (no row) `TEXT`."""
TEXT, COMPACT = "text", "compact"
"""Run ids as hex text and topics in full in every row (every store before issue 26); or
run ids as 16-byte BLOBs and topics as small integers of a topics table."""
META_TABLE = "stagetrail_meta"
EVENTS_TABLE = "stagetrail_events"
_CHECK_PLAINTEXT = b"stagetrail cipher check"
GENERATION = "generation"
"""The meta row counting erasures: every cache and snapshot of run data is keyed by it."""
RESETS = "projection_resets"
"""The meta row counting resets of persistent projections: a page read before one is refused."""


@attrs.frozen
class AtRest:
    """How event bytes are kept: compression and encryption."""

    compressor: str = "none"
    cipher_key: str | None = None
    chain_secret: bytes | None = None
    """The secret of keyed chain links (see `chain.chain_key`), None for plain links."""
    layout: str = TEXT
    """How a SQLite store keeps its events' ids and topics: `TEXT` or `COMPACT`."""

    def mapper(self) -> EventMapper:
        """An eventsourcing mapper with this compression and encryption."""
        mapper = EventMapper(
            transcoder=FastJSONTranscoder(), compressor=self._compressor(), cipher=self.cipher()
        )
        mapper.chain = Chain(self.chain_secret)
        return mapper

    def codec(self, mapper: EventMapper) -> Codec:
        """The views' serializer: `mapper`'s transcoder, compressor and cipher; keyed digests."""
        return Codec(mapper, self.cipher_key)

    def _compressor(self) -> Compressor | None:
        return ZlibCompressor() if self.compressor == "zlib" else None

    def cipher(self) -> Cipher | None:
        """eventsourcing's AES cipher for the key, or None when not encrypted."""
        if self.cipher_key is None:
            return None
        try:
            from eventsourcing.cryptography import AESCipher
        except ImportError:
            raise StoreError(
                "-", "encryption needs the 'cryptography' package: pip install 'stagetrail[crypto]'"
            ) from None
        try:
            return AESCipher(Environment(env={"CIPHER_KEY": self.cipher_key}))
        except (ValueError, OSError) as error:
            raise StoreError(
                "-", f"STAGETRAIL_CIPHER_KEY is not a valid AES key: {error}"
            ) from None


def wanted(
    options: Mapping[str, str],
    cipher_key: str | None,
    url: str,
    chain_secret: bytes | None = None,
) -> AtRest:
    """The at-rest settings a new store would get from its URL and keys."""
    compressor = options.get("compress", "none")
    if compressor not in ("none", "zlib"):
        raise StoreError(url, f"compress={compressor!r} is not supported; use compress=zlib")
    settings = AtRest(
        compressor=compressor, cipher_key=cipher_key or None, chain_secret=chain_secret
    )
    try:
        settings.cipher()  # a malformed key is named with the store it was given for
    except StoreError as error:
        raise StoreError(url, error.problem) from None
    return settings


def new_meta(settings: AtRest) -> dict[str, str]:
    """The meta rows a store created with `settings` starts with."""
    meta = {"schema_version": str(SCHEMA_VERSION), "compressor": settings.compressor}
    if settings.layout == COMPACT:
        meta |= {"schema_version": str(COMPACT_SCHEMA), LAYOUT: COMPACT}
    cipher = settings.cipher()
    meta["cipher"] = "aes" if cipher else "none"
    if cipher is not None:
        meta["cipher_check"] = base64.b64encode(cipher.encrypt(_CHECK_PLAINTEXT)).decode()
    return meta | chain_rows(settings, 0)


def settle(
    meta: Mapping[str, str], settings: AtRest, url: str, *, newest: int = SCHEMA_VERSION
) -> AtRest:
    """Check an existing store's meta against this program and key; return its settings.

    `newest` is the highest schema version this backend reads (PostgreSQL's is higher).

    Raises:
        StoreError: newer schema, missing or wrong cipher key, or a key for a plain store.
    """
    text = meta.get("schema_version", "")
    if not text.isdigit():
        raise StoreError(url, f"not a stagetrail store: schema version {text!r} in its meta table")
    version = int(text)
    if version > newest:
        raise StoreError(
            url,
            f"written by a newer stagetrail (store schema {version}, this one reads up to "
            f"{newest}); upgrade stagetrail",
        )
    stored = AtRest(
        compressor=meta.get("compressor", "none"),
        cipher_key=settings.cipher_key,
        chain_secret=settings.chain_secret,
        layout=meta.get(LAYOUT, TEXT),
    )
    if stored.layout not in (TEXT, COMPACT):
        raise StoreError(url, f"written by a newer stagetrail (events layout {stored.layout!r})")
    _check_cipher(meta, stored, url)
    return stored


def _check_cipher(meta: Mapping[str, str], stored: AtRest, url: str) -> None:
    encrypted = meta.get("cipher", "none") == "aes"
    if encrypted and stored.cipher_key is None:
        raise StoreError(url, "the store is encrypted: set STAGETRAIL_CIPHER_KEY to its key")
    if not encrypted and stored.cipher_key is not None:
        raise StoreError(
            url, "the store is not encrypted but STAGETRAIL_CIPHER_KEY is set; unset it"
        )
    cipher = stored.cipher()
    if cipher is None:
        return
    try:
        ok = cipher.decrypt(base64.b64decode(meta["cipher_check"])) == _CHECK_PLAINTEXT
    except Exception:  # any failure to decrypt means the key is wrong
        ok = False
    if not ok:
        raise StoreError(url, "STAGETRAIL_CIPHER_KEY is not the key this store was encrypted with")


@attrs.frozen
class ChainRecord:
    """The store's hash chain as its meta table records it: mode, key check, chained from."""

    mode: str
    """``plain`` (SHA-256 links) or ``keyed`` (HMAC-SHA256 with the chain key)."""
    check: str
    """`Chain.check` of the chain key ("" for plain)."""
    chained_from: int
    """The notification position after which every stored event carries a link (0: all)."""

    def mismatch(self, secret: bytes | None) -> str | None:
        """What is wrong with the chain key `secret` for this store, or None when it is right."""
        if self.mode == "keyed" and secret is None:
            return "the store's hash chain is keyed: set STAGETRAIL_CHAIN_KEY (or its cipher key)"
        if self.mode == "plain" and secret is not None:
            return (
                "the store's hash chain is plain (no key) but a chain key is set "
                "(STAGETRAIL_CHAIN_KEY or a cipher key); unset it"
            )
        if secret is not None and not hmac.compare_digest(Chain(secret).check(), self.check):
            return "the chain key is not the one this store's hash chain was recorded with"
        return None


CHAIN_ROWS = ("chain", "chain_check", "chained_from")
"""The meta rows recording the chain (written at creation, or on an older store's first
writable open by this release)."""


def chain_rows(settings: AtRest, chained_from: int) -> dict[str, str]:
    """The meta rows recording a chain with `settings`' key, every event linked after
    notification `chained_from`."""
    chain = Chain(settings.chain_secret)
    mode = "keyed" if chain.keyed else "plain"
    return {"chain": mode, "chain_check": chain.check(), "chained_from": str(chained_from)}


def read_chain(meta: Mapping[str, str]) -> ChainRecord | None:
    """The chain the meta rows record, or None (a store no release since chaining wrote)."""
    if "chain" not in meta:
        return None
    text = meta.get("chained_from", "0")
    return ChainRecord(
        meta["chain"], meta.get("chain_check", ""), int(text) if text.isdigit() else 0
    )


def check_chain(record: ChainRecord, settings: AtRest, url: str) -> None:
    """Refuse a writer whose chain key is not the store's recorded one.

    Raises:
        ChainKeyMismatch: another key, none for a keyed chain, or one for a plain chain.
    """
    problem = record.mismatch(settings.chain_secret)
    if problem is not None:
        raise ChainKeyMismatch(url, problem, record.mode)


def read_generation(cursor: Any, table: str) -> int:
    """The store's erasure generation from its meta `table` (0 before the first erasure)."""
    return read_counter(cursor, table, GENERATION)


def read_counter(cursor: Any, table: str, key: str) -> int:
    """The counter `key` of the meta `table` (0 before it was first counted)."""
    result = cursor.execute(f"SELECT value FROM {table} WHERE key='{key}'")
    row = (cursor if result is None else result).fetchone()  # eventsourcing's returns None
    if row is None:
        return 0
    return int(row[0] if isinstance(row, tuple) else row["value"])  # plain or named rows


def read_layout(cursor: Any, table: str) -> str:
    """How the SQLite store keeps its events, from its meta `table`: `COMPACT` or `TEXT`."""
    row = cursor.execute(f"SELECT value FROM {table} WHERE key='{LAYOUT}'").fetchone()
    return TEXT if row is None else str(row[0])


def bump_generation(cursor: Any, table: str) -> None:
    """Count one more erasure, inside the transaction that erases (SQLite and PostgreSQL)."""
    bump_counter(cursor, table, GENERATION)


def bump_counter(cursor: Any, table: str, key: str) -> None:
    """Count the meta `table`'s counter `key` up by one, inside the caller's transaction."""
    add_counter(cursor, table, key)
    cursor.execute(
        f"UPDATE {table} SET value = CAST(CAST(value AS BIGINT) + 1 AS TEXT) WHERE key = '{key}'"
    )


def add_counter(cursor: Any, table: str, key: str) -> None:
    """Give the meta `table` its counter `key` (at 0) if it has none yet: a row to lock."""
    cursor.execute(
        f"INSERT INTO {table} (key, value) VALUES ('{key}', '0') ON CONFLICT (key) DO NOTHING"
    )
