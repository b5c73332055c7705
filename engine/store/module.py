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

Such a store has no stagetrail meta table and no projection tables: persistent
projections fold in memory in each process, and at-rest settings are not checked
when it is opened again (use the same ``compress`` and cipher key every time).
"""

from __future__ import annotations

from collections.abc import Mapping

from eventsourcing.persistence import InfrastructureFactory

from engine.store import meta
from engine.store.backend import Backend
from engine.store.errors import StoreError
from engine.store.failures import describe
from engine.store.memory import MemoryViews
from engine.store.urls import StoreURL

STAGETRAIL_OPTIONS = ("compress",)
"""URL options that are stagetrail's own, not passed to the module."""


def open_module(url: StoreURL, settings: meta.AtRest, extra: Mapping[str, str]) -> Backend:
    """Open the store of the persistence module `url` names, with its settings.

    Args:
        url: ``eventsourcing://TOPIC?SETTING=value``.
        settings: stagetrail's at-rest settings (compression, cipher).
        extra: more module settings (e.g. a password kept out of the URL).

    Raises:
        StoreError: the topic does not resolve, or the module cannot open its store.
    """
    env = {key: value for key, value in url.options.items() if key not in STAGETRAIL_OPTIONS}
    env.update(extra)
    env[InfrastructureFactory.PERSISTENCE_MODULE] = url.path
    try:
        factory = InfrastructureFactory.construct(env)
        recorder = factory.application_recorder()
    except Exception as error:  # any module's failure to start, in one line
        raise StoreError(
            url.masked, f"cannot open persistence module {url.path!r}: {describe(error)}"
        ) from None
    mapper = settings.mapper()
    codec = settings.codec(mapper)
    return Backend(
        recorder, mapper, factory.close, MemoryViews(codec), codec=codec, generation=_never_erased
    )


def _never_erased() -> int:
    """A module's store is never erased by stagetrail: its generation stays 0."""
    return 0
