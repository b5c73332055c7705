"""`stagetrail upgrade`: rewrite an older SQLite store compact, into a copy or in place."""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager

from engine import Engine
from engine.cli.common import Output, open_engine
from engine.cli.verify import verify_all
from engine.store import StoreError, Upgraded, parse, upgrade_copy, upgrade_in_place


def upgrade_store(url: str, target: str | None, *, in_place: bool, as_json: bool) -> bool:
    """Upgrade the store `url` into `target` or in place, then verify every run of the
    result; print what was done; return whether verification found no problem.

    An in-place upgrade whose last step, packing the file, failed is still an upgrade:
    one line on stderr says so, and the store is verified as after any other, opened
    read-only (another process held its write lock: verifying must not wait for it).

    Raises:
        StoreError: not a SQLite store, compact already, `target` exists, or locked.
    """
    parsed = parse(url)
    if parsed.scheme != "sqlite":
        raise StoreError(parsed.masked, "only a SQLite store has an upgrade (to compact events)")
    done = upgrade_in_place(parsed.path) if in_place else upgrade_copy(parsed.path, str(target))
    upgraded = f"sqlite:///{done.path}"
    if not as_json:
        _print(done)
    if done.not_packed:
        print(not_packed_notice(done), file=sys.stderr)
        opened: AbstractContextManager[Engine] = Engine(upgraded, read_only=True)
    else:
        opened = open_engine(upgraded, read_only=True)
    with opened as engine:
        return verify_all(engine, as_json=as_json)


def _print(done: Upgraded) -> None:
    change = done.bytes_after / done.bytes_before - 1 if done.bytes_before else 0.0
    # A small store can grow by the topics table's pages: say so rather than "-29% smaller".
    size = f"{abs(change):.0%} {'smaller' if change <= 0 else 'larger'}"
    Output().line(
        f"upgraded to compact events: {done.path} ({done.events:,} events, "
        f"{done.bytes_before:,} -> {done.bytes_after:,} bytes, {size}); verifying"
    )
    sys.stdout.flush()


def not_packed_notice(done: Upgraded) -> str:
    """The line saying the store was upgraded but its freed pages were not given back."""
    return (
        f"note: upgraded; packing the file failed: {done.not_packed} (the store is compact "
        f"and usable; run VACUUM on {done.path} later to give back the freed space)"
    )
