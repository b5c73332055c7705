"""Any eventsourcing persistence module as a store, chosen by topic plus its settings.

eventsourcing picks its infrastructure from ``PERSISTENCE_MODULE`` and the module's
own settings (``SQLITE_DBNAME``, ``POSTGRES_HOST``, ...): a store URL
``eventsourcing://TOPIC?SETTING=value`` passes exactly those, so a module
stagetrail does not ship (another database, another event store) serves as a store.

What stagetrail needs from the module's application recorder:

- ``insert_events`` appends a list of events atomically (all or none) and raises
  eventsourcing's ``IntegrityError`` when a (run, version) is already taken;
- ``select_events`` reads one run's events in version order (``gt``, ``lte``,
  ``desc``, ``limit``);
- ``select_notifications`` and ``max_notification_id`` give every event a place
  in one global order that only grows, which persistent projections follow.

Such a store has no projection tables: persistent projections fold in memory in
each process. Its meta rows (schema version, compression, cipher and the cipher
check: `engine.store.meta`, as a SQLite or PostgreSQL store keeps them) are one
stored record in a table of their own, made by the module's own
``aggregate_recorder(purpose="stagetrail_meta")``, so they are never in the
notification log that projections follow. Each open checks them exactly as
those stores do: a second key, no key for an encrypted store, or a key for a
plain one is refused before anything is written. A store written before it had
them gets them at its first writing open, once its first event has been read
back with the settings given.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping

from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    InfrastructureFactory,
    IntegrityError,
    StoredEvent,
)

from engine.store import meta
from engine.store.backend import Backend
from engine.store.errors import StoreError
from engine.store.failures import describe
from engine.store.memory import MemoryViews
from engine.store.urls import StoreURL

STAGETRAIL_OPTIONS = ("compress",)
"""URL options that are stagetrail's own, not passed to the module."""


META_PURPOSE = "stagetrail_meta"
"""The module's aggregate recorder for the meta rows (SQLite: table ``stored_stagetrail_meta``)."""
META_ID = uuid.uuid5(uuid.NAMESPACE_URL, "stagetrail:meta")
META_TOPIC = "stagetrail:meta"


def open_module(
    url: StoreURL, settings: meta.AtRest, extra: Mapping[str, str], *, read_only: bool = False
) -> Backend:
    """Open the store of the persistence module `url` names, with its settings.

    Args:
        url: ``eventsourcing://TOPIC?SETTING=value``.
        settings: stagetrail's at-rest settings (compression, cipher).
        extra: more module settings (e.g. a password kept out of the URL).
        read_only: never write the meta rows (a store without them is checked only).

    Raises:
        StoreError: the topic does not resolve, the module cannot open its store,
            or the store was written with another cipher key, none, or a newer schema.
    """
    env = {key: value for key, value in url.options.items() if key not in STAGETRAIL_OPTIONS}
    env.update(extra)
    env[InfrastructureFactory.PERSISTENCE_MODULE] = url.path
    try:
        factory = InfrastructureFactory.construct(env)
        recorder = factory.application_recorder()
        meta_recorder = factory.aggregate_recorder(purpose=META_PURPOSE)
    except Exception as error:  # any module's failure to start, in one line
        raise StoreError(
            url.masked, f"cannot open persistence module {url.path!r}: {describe(error)}"
        ) from None
    try:
        settings, chain = _settled(
            meta_recorder, recorder, url.masked, settings, read_only=read_only
        )
    except BaseException:
        factory.close()
        raise
    mapper = settings.mapper()
    codec = settings.codec(mapper)
    return Backend(
        recorder, mapper, factory.close, MemoryViews(codec), codec=codec, generation=_never_erased,
        chain=chain,
    )  # fmt: skip


def _never_erased() -> int:
    """A module's store is never erased by stagetrail: its generation stays 0."""
    return 0


def _settled(
    meta_recorder: AggregateRecorder,
    recorder: ApplicationRecorder,
    url: str,
    settings: meta.AtRest,
    *,
    read_only: bool,
) -> tuple[meta.AtRest, meta.ChainRecord | None]:
    """The store's settings, checked against `settings` by `meta.settle`, and its recorded
    chain (a writer's chain key checked against it); the meta rows written first when the
    store has none (unless `read_only`). A store whose meta rows predate the chain's keeps
    none recorded: the module's meta record is written once.

    Raises:
        StoreError: another key, no key, a key for a plain store, a newer schema, or
            (a store without meta rows) a first event these settings cannot read.
    """
    for _ in range(2):  # a second opener may write the rows between our read and our write
        stored = _read_meta(meta_recorder, url)
        if stored is not None:
            settled, chain = meta.settle(stored, settings, url), meta.read_chain(stored)
            if chain is not None and not read_only:
                meta.check_chain(chain, settings, url)
            return settled, chain
        _check_first_event(recorder, url, settings)
        new = meta.new_meta(settings)
        if read_only:
            return settings, None
        rows = json.dumps(new, sort_keys=True).encode()
        try:
            meta_recorder.insert_events([StoredEvent(META_ID, 1, META_TOPIC, rows)])
        except IntegrityError:
            continue
        except Exception as error:  # the module's driver error, in one line
            problem = f"cannot write the store's meta rows: {describe(error)}"
            raise StoreError(url, problem) from None
        return settings, meta.read_chain(new)
    raise StoreError(url, "the meta rows were written and then vanished; open the store again")


def _read_meta(meta_recorder: AggregateRecorder, url: str) -> dict[str, str] | None:
    """The meta rows the store keeps, or None when it has none."""
    try:
        found = meta_recorder.select_events(META_ID, limit=1)
    except Exception as error:  # the module's driver error, in one line
        raise StoreError(url, f"cannot read the store's meta rows: {describe(error)}") from None
    if not found:
        return None
    try:
        rows = json.loads(found[0].state)
    except ValueError:
        rows = None
    if not isinstance(rows, dict):
        raise StoreError(url, f"not a stagetrail store: unreadable {META_PURPOSE} record")
    return {str(key): str(value) for key, value in rows.items()}


def _check_first_event(recorder: ApplicationRecorder, url: str, settings: meta.AtRest) -> None:
    """A store without meta rows: its first event must read back with `settings`.

    Raises:
        StoreError: it does not (another key, none, or other compression).
    """
    try:
        first = recorder.select_notifications(start=1, limit=1)
    except Exception as error:  # the module's driver error, in one line
        raise StoreError(url, f"cannot read the store's first event: {describe(error)}") from None
    if not first:
        return
    try:
        settings.mapper().to_domain_event(first[0])
    except Exception as error:  # a wrong key, no key, or other compression
        raise StoreError(
            url,
            "its events were written with another STAGETRAIL_CIPHER_KEY (or none, or "
            f"with other compression) than this one: {type(error).__name__}: {describe(error)}",
        ) from None
