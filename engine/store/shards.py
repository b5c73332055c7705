"""A layout of several stores (shards) and the rule that places each run in exactly one.

A ``shards:`` store URL names a TOML file::

    by = "label:team"          # "run_id" (the default), "pipeline" or "label:<key>"

    [shards]                   # name = store URL; the order is part of every run's address
    a = "postgresql://postgres@db1:5432/stagetrail"
    b = "postgresql://postgres@db2:5432/stagetrail?schema=b"

    [routes]                   # a pipeline's name (or the label's value) = the shard it goes to
    payments = "a"
    search = "b"

A run's shard is a function of its id alone: the first 8 bytes of SHA-256 of the
id's 16 bytes, modulo the number of shards. Every read of a run therefore asks one
shard, and a run can never be written in two. Routing by pipeline or label does
not break that: a new run's random id is drawn until it falls in the shard its
pipeline or label routes to. A chosen id (``run_id=``, a child run's derived id)
lives where its hash puts it, as do runs whose value has no route.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from uuid import UUID

import attrs

from engine.store.errors import StoreError
from engine.store.urls import mask

PREFIX = "shards:"
RULES = ("run_id", "pipeline", "label:<key>")
_MAX_DRAWS = 10_000
"""Draws of a random id for a routed shard before giving up (at n shards, expected n)."""


def is_sharded(url: str) -> bool:
    """Whether `url` is a ``shards:`` URL (a layout file) rather than one store."""
    return isinstance(url, str) and url.startswith(PREFIX)


def shard_index(run_id: UUID, count: int) -> int:
    """The shard (0-based, of `count`) that holds `run_id`: stable across processes and hosts."""
    digest = hashlib.sha256(run_id.bytes).digest()
    return int.from_bytes(digest[:8], "big") % count


@attrs.frozen
class Layout:
    """The shards' names and URLs, in order, and the rule that routes new runs."""

    url: str
    """The ``shards:`` URL it was read from."""
    names: tuple[str, ...]
    urls: tuple[str, ...]
    by: str = "run_id"
    routes: Mapping[str, str] = attrs.field(factory=dict)

    def index_of(self, run_id: UUID) -> int:
        """The index of the shard holding `run_id`."""
        return shard_index(run_id, len(self.urls))

    def new_id(self, pipeline: str, labels: Mapping[str, str] | None) -> UUID:
        """A new random run id in the shard the rule routes this run to."""
        value = pipeline if self.by == "pipeline" else _label(self.by, labels)
        target = self.routes.get(value) if value is not None else None
        if target is None:
            return uuid.uuid4()
        wanted = self.names.index(target)
        for _ in range(_MAX_DRAWS):
            drawn = uuid.uuid4()
            if self.index_of(drawn) == wanted:
                return drawn
        raise StoreError(self.url, f"no random id fell in shard {target!r}")  # pragma: no cover


def _label(by: str, labels: Mapping[str, str] | None) -> str | None:
    """The value of the label the rule routes by, if `by` is ``label:<key>`` and it is set."""
    if not by.startswith("label:") or not isinstance(labels, Mapping):
        return None
    value = labels.get(by.removeprefix("label:"))
    return value if isinstance(value, str) else None


def load(url: str) -> Layout:
    """The layout a ``shards:PATH`` URL names (``shards:///abs/path.toml`` or ``shards:rel.toml``).

    Raises:
        StoreError: the file is missing or unreadable, or names no shard, a shard twice,
            an unknown rule, or a route to an unknown shard.
    """
    path = url.removeprefix(PREFIX)
    path = path.removeprefix("//") if path.startswith("///") else path
    if not path:
        raise StoreError(url, "name the layout file: shards:///path/to/shards.toml")
    try:
        import tomllib  # here: a plain store's URL never needs it

        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise StoreError(url, f"cannot read the shard layout: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise StoreError(url, f"the shard layout is not valid TOML: {error}") from None
    return _layout(url, data)


def _layout(url: str, data: dict[str, Any]) -> Layout:
    unknown = sorted(set(data) - {"by", "shards", "routes"})
    if unknown:
        raise StoreError(url, f"unknown key {unknown[0]!r}; a layout has by, [shards], [routes]")
    shards = _strings(url, data.get("shards"), "shards")
    if not shards:
        raise StoreError(url, '[shards] lists no store: give name = "store URL" lines')
    stores = list(shards.values())
    for name, store in shards.items():
        if is_sharded(store):
            raise StoreError(url, f"shard {name!r} is itself a shards: URL")
        if stores.count(store) > 1:
            raise StoreError(url, f"shard {name!r} repeats the store {mask(store)}")
    by = data.get("by", "run_id")
    if by not in ("run_id", "pipeline") and not (
        isinstance(by, str) and by.startswith("label:") and len(by) > len("label:")
    ):
        raise StoreError(url, f"by = {by!r}: route by one of {', '.join(RULES)}")
    routes = _strings(url, data.get("routes", {}), "routes")
    for value, target in routes.items():
        if target not in shards:
            raise StoreError(url, f"route {value!r} goes to {target!r}, which [shards] lacks")
    return Layout(url, tuple(shards), tuple(stores), by, routes)


def _strings(url: str, table: object, name: str) -> dict[str, str]:
    """A TOML table of strings, checked."""
    if not isinstance(table, dict):
        raise StoreError(url, f'[{name}] must be a table of name = "text" lines')
    for key, value in table.items():
        if not isinstance(value, str) or not value:
            raise StoreError(url, f"[{name}] {key!r} must be a non-empty string")
    return dict(table)
