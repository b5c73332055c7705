"""The one serializer of what the views store: the events' JSON, compression and cipher.

Projection states, the run index, snapshots and a projection's last error are
written as the events are (eventsourcing's transcoder, compressor and cipher
that the store's mapper holds), so a store with a cipher key holds no clear
text of a run anywhere. A column that must stay queryable (a pipeline name, a
label, a partition key) holds a keyed digest instead: equal texts give equal
digests, so equality filters keep working, and without the key nothing can be
read back from them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any
from uuid import UUID

from eventsourcing.persistence import Mapper

_DIGEST_CONTEXT = b"stagetrail views: keyed digests of queryable columns"
"""Derives the digest key from the cipher key, so the two never coincide."""


class Codec:
    """Seals the views' values and digests their queryable texts with the store's settings.

    Args:
        mapper: the store's event mapper; its transcoder, compressor and cipher are used.
        cipher_key: the store's AES key (base64), or None for a store kept in clear.
    """

    def __init__(self, mapper: Mapper[UUID], cipher_key: str | None) -> None:
        self._transcoder = mapper.transcoder
        self._compressor = mapper.compressor
        self._cipher = mapper.cipher
        self._digest_key = None if cipher_key is None else _digest_key(cipher_key)

    @property
    def encrypted(self) -> bool:
        """Whether sealed values and digests are unreadable without the cipher key."""
        return self._cipher is not None

    def seal(self, value: Any) -> bytes:
        """`value` (plain JSON) as stored bytes: JSON, compressed and encrypted as events are."""
        data = self._transcoder.encode(value)
        if self._compressor:
            data = self._compressor.compress(data)
        if self._cipher:
            data = self._cipher.encrypt(data)
        return data

    def unseal(self, data: bytes) -> Any:
        """The value `seal` turned into `data`."""
        data = bytes(data)  # a database driver may hand out a memoryview
        if self._cipher:
            data = self._cipher.decrypt(data)
        if self._compressor:
            data = self._compressor.decompress(data)
        return self._transcoder.decode(data)

    def digest(self, text: str) -> str:
        """What a queryable column holds for `text`: its keyed digest (hex), or itself in clear.

        A store without a cipher keeps its events in clear too, so there the text
        stays readable; only a NUL is written as ``\\0`` (PostgreSQL text has none),
        and a backslash as two, so that two different texts never give the same one.
        """
        if self._digest_key is None:
            if "\x00" not in text and "\\" not in text:
                return text
            return text.replace("\\", "\\\\").replace("\x00", "\\0")
        data = text.encode("utf8", "surrogatepass")
        return hmac.new(self._digest_key, data, hashlib.sha256).hexdigest()


def _digest_key(cipher_key: str) -> bytes:
    """A key for digests, derived from (never equal to) the cipher key."""
    secret = base64.b64decode(cipher_key)
    return hmac.new(secret, _DIGEST_CONTEXT, hashlib.sha256).digest()
