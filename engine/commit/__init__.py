"""The write side's unit of work: a run's recorded events, pending until one writer commits them.

`unit` holds a run handle's state and pending events and commits them (at once,
at a grouping's end, or at a supervisor's commit point); `group` lets concurrent
runs in an event loop share their transactions, written in a worker thread.
"""

from __future__ import annotations

from engine.commit.group import Commit, GroupCommitter, shared
from engine.commit.unit import Follower, Mark, Observer, UnitOfWork

__all__ = ["Commit", "Follower", "GroupCommitter", "Mark", "Observer", "UnitOfWork", "shared"]
