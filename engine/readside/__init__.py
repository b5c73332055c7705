"""The read side's runtime: projections kept in the store, snapshots, read-only overlays.

`persistent` runs registered projections over every run's events with
eventsourcing's tracking records (exactly once, resumable, rebuildable);
`snapshots` keeps time-travel snapshots of one run's projection states, and
`keeper` has a run's writer store them as the run grows;
`overlay` serves a store opened read-only, folding newer events in memory.
The tables these write are each backend's own (`engine.store`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from engine.readside.overlay import ReadOnlyViews
from engine.readside.persistent import Projections, ProjectionStatus, deletes
from engine.readside.snapshots import SNAPSHOT_INTERVAL, TimeTravel

__all__ = [
    "KEEP_INTERVAL",
    "deletes",
    "kept_projections",
    "Projections",
    "ProjectionStatus",
    "ReadOnlyViews",
    "SNAPSHOT_INTERVAL",
    "SnapshotKeeper",
    "TimeTravel",
]

if TYPE_CHECKING:
    from engine.readside.keeper import KEEP_INTERVAL, SnapshotKeeper, kept_projections

_KEEPER = frozenset({"KEEP_INTERVAL", "SnapshotKeeper", "kept_projections"})
"""The writer's names, imported on first use: a reader starts without the run machine."""


def __getattr__(name: str) -> Any:
    """A name of `keeper`, imported on first use (then kept here)."""
    if name not in _KEEPER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("engine.readside.keeper"), name)
    globals()[name] = value
    return value
