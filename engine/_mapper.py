"""eventsourcing's Mapper, taught stagetrail's attrs events.

The transcoder, compressor and cipher stay eventsourcing's; only the mapping
between event attributes and the stored state dict is stagetrail's own.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from eventsourcing.persistence import Mapper, StoredEvent

from events import Event, EventFormatError, decode, encode


class EventMapper(Mapper[UUID]):
    """Converts stagetrail events to eventsourcing `StoredEvent`s and back."""

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        """Serialise an event: payload and timestamp become its stored state."""
        topic, state = encode(domain_event)
        data = self.transcoder.encode(state)
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
        data = stored_event.state
        try:
            if self.cipher:
                data = self.cipher.decrypt(data)
            if self.compressor:
                data = self.compressor.decompress(data)
            state = self.transcoder.decode(data)
        except Exception as error:  # the cipher and codecs raise assorted types
            raise self._unreadable(stored_event, f"{type(error).__name__}: {error}") from error
        run_id = stored_event.originator_id
        try:
            return decode(
                stored_event.topic, state, _as_uuid(run_id), stored_event.originator_version
            )
        except EventFormatError as error:
            raise self._unreadable(stored_event, error.reason) from error

    @staticmethod
    def _unreadable(stored_event: StoredEvent, reason: str) -> EventFormatError:
        return EventFormatError(
            stored_event.topic,
            f"run {stored_event.originator_id} version {stored_event.originator_version}: {reason}",
        )


def _as_uuid(value: UUID | str) -> UUID:
    return value if isinstance(value, UUID) else UUID(value)
