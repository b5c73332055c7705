"""What every store can hold: a size limit per event, and text every backend keeps.

PostgreSQL text and JSON cannot hold NUL (``\\x00``), and UTF-8 cannot encode a
lone surrogate (``\\ud800``), so neither may reach any backend: an event holding
one is refused, naming the field, before anything is written. The checks run
on the bytes the transcoder produced, so the common case costs one length
comparison and one substring search per event; the field at fault is only
looked for once an event is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from json import dumps
from typing import Any

from events.base import Event
from events.errors import InvalidPayload, PayloadTooLarge

DEFAULT_MAX_EVENT_BYTES = 1 << 20
"""The default limit on one event's serialised size: 1 MiB."""

_NUL_IN_JSON = b"\\u0000"


def check_stored(event: Event, data: bytes, limit: int) -> None:
    """Refuse `event` if its serialised `data` is over `limit` or holds a NUL.

    Raises:
        PayloadTooLarge: naming the largest field and the sizes.
        InvalidPayload: naming the field that holds a NUL.
    """
    if len(data) > limit:
        raise _too_large(event, len(data), limit)
    # JSON writes NUL as \u0000; a literal backslash-u-0000 in a str also matches,
    # so a hit is confirmed on the values themselves.
    if _NUL_IN_JSON in data:
        refused = unstorable_field(event)
        if refused is not None:
            raise refused


def unstorable_field(event: Event) -> InvalidPayload | None:
    """The first payload str (value or key) no backend can keep, as an error naming it."""
    for name, value in event.payload().items():
        for path, text in _strings(name, value):
            reason = unstorable_text(text)
            if reason is not None:
                return InvalidPayload(name, path, reason)
    return None


def unstorable_text(text: str) -> str | None:
    """Why `text` cannot be stored (a NUL, a lone surrogate), or None when it can."""
    if "\x00" in text:
        return (
            f"contains a NUL character at index {text.index(chr(0))}, which cannot be "
            "stored (PostgreSQL text and JSON hold no NUL; no store accepts one)"
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            return (
                f"contains a lone surrogate {text[error.start]!r} at index {error.start}, "
                "which cannot be stored as JSON (UTF-8 cannot encode it)"
            )
    return None


def _strings(path: str, value: Any) -> Iterator[tuple[str, str]]:
    """Every str in a JSON-like value (keys included), with where it is."""
    stack = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            yield where, item
        elif isinstance(item, dict):
            for key, inner in reversed(list(item.items())):
                if isinstance(key, str):
                    yield f"{where} key {key!r}", key
                stack.append((f"{where}[{key!r}]", inner))
        elif isinstance(item, list | tuple):
            stack.extend(
                (f"{where}[{index}]", inner) for index, inner in reversed(list(enumerate(item)))
            )


def _too_large(event: Event, size: int, limit: int) -> PayloadTooLarge:
    sizes = {
        name: len(dumps(value, ensure_ascii=False, default=str).encode("utf-8", "replace"))
        for name, value in event.payload().items()
    }
    largest = max(sizes, key=sizes.__getitem__, default="?")
    return PayloadTooLarge(largest, sizes.get(largest, size), size, limit)
