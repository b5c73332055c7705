"""Seeded random histories recorded through every write path, and the stored JSON they leave.

`tests/store/test_appended_bytes.py` compares what this code writes now with
`tests/data/appended_bytes.json`, written by this module under an earlier release's code (main at
98bda1e): the write path may get faster, the bytes it stores may not change. The module
imports only the installed packages (no `tests.*`), so another checkout's interpreter can
run it to write the fixture from that checkout's code, from the repository root::

    python tests/store/appended_bytes.py [postgresql://...]

Each scenario records the same histories (frozen clock, fixed run ids) in a fresh store:
single appends and batches of one run, a deferred start, several runs in one
`Store.append`, a group commit of concurrent runs, a fork, a handle loaded from the
store, a run erased and started again under its id, and (SQLite) events appended after
those of a store the first release wrote (no links, old class versions). A row is kept
as the SHA-256 of its run's position, version, topic and stored JSON (decrypted and
decompressed: a cipher's nonce and a zlib build's choices are not the chain's format).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any
from uuid import UUID

from freezegun import freeze_time

from engine import Engine
from engine.cli.demo.code_review import REVIEW
from engine.errors import InvalidTransition, RuleViolation
from events import StageCompleted

FIXTURE = Path(__file__).resolve().parent.parent / "data" / "appended_bytes.json"
V1_STORE = Path(__file__).resolve().parent.parent / "data" / "v1_store.db"
CIPHER_KEY = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
"""32 fixed bytes, base64: an AES-256 key."""
AT_REST: dict[str, dict[str, Any]] = {
    "plain": {},
    "keyed": {"chain_key": "the writers' secret"},
    "zlib": {"compress": True},
    "cipher-zlib": {"compress": True, "cipher_key": CIPHER_KEY},
}
"""How each scenario's store keeps its bytes."""
RUNS = [UUID(int=index, version=4) for index in range(1, 10)]
"""The fixed ids of a scenario's runs."""
_STRINGS = ["", "100%", "%b%s", 'quo"te', "back\\slash", "é ünï 😀", "\x7f", "x" * 40]


def _value(rng: random.Random, depth: int = 0) -> Any:
    """A random strict JSON value: nested, with ints beyond 64 bits (the slow encoder's)."""
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return rng.choice(_STRINGS) + str(rng.randrange(1000))
    if kind == 1:
        return rng.choice([0, -1, 2**63 - 1, 2**64 + 7, -(2**70), rng.randrange(10**6)])
    if kind == 2:
        return rng.choice([0.5, -1e-7, 1e300, 3.141592653589793, rng.random()])
    if kind == 3:
        return rng.choice([True, False, None])
    if kind in (4, 5):
        return rng.choice(_STRINGS)
    if kind in (6, 7):
        return {
            rng.choice(_STRINGS) + str(i): _value(rng, depth + 1) for i in range(rng.randrange(4))
        }
    return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def _act(run: Any, rng: random.Random) -> None:
    """One random event a run at any point may record (an outcome its table allows, ...)."""
    if run.status != "running":
        return
    state, kind = run.state, rng.randrange(8)
    if kind == 0:
        run.note(rng.choice(_STRINGS) or "k", _value(rng))
    elif kind == 1:
        run.spend(rng.choice([0.25, 1.0, 3.5]), rng.choice(["usd", "tokens"]))
    elif kind == 2 and run.machine.depth:
        run.rollback(1, reason=rng.choice(_STRINGS))
    elif kind == 3:
        run.stage_failed(state, rng.choice(_STRINGS), duration=1.5, details=_value(rng))
    elif kind == 4:
        task = f"t{rng.randrange(3)}"
        if task in run.tasks:
            run.task_completed(task, _value(rng))
        else:
            run.add_task(task, title=rng.choice(_STRINGS))
    else:
        outcome = rng.choice(REVIEW.allowed(state) or ("completed",))
        if outcome in ("failed",):
            run.stage_failed(state, "boom", outcome=outcome, duration=0.5)
        else:
            run.stage_completed(state, _value(rng), outcome=outcome, duration=2.0)


def _acts(run: Any, rng: random.Random, count: int) -> None:
    for _ in range(count):
        # A move the rules refuse: the history goes on.
        with contextlib.suppress(InvalidTransition, RuleViolation):
            _act(run, rng)


async def _grouped(runs: list[Any], rng: random.Random) -> None:
    """Concurrent ``async with`` batches of `runs`: the loop's group committer writes them."""

    async def one(run: Any, rng: random.Random) -> None:
        for _ in range(3):
            async with run.batch():
                _acts(run, rng, 3)
            await asyncio.sleep(0)

    # Each its own generator: which coroutine runs first depends on the writes' timing.
    seeds = [rng.randrange(2**32) for _ in runs]
    drives = [one(run, random.Random(seed)) for run, seed in zip(runs, seeds, strict=True)]
    await asyncio.gather(*drives)


def record(engine: Engine, seed: int) -> None:
    """The scenario's histories, recorded in `engine`'s fresh store."""
    rng = random.Random(seed)
    first = engine.start_run(REVIEW, run_id=RUNS[0], labels={"k": "v%"}, params=_value(rng))
    _acts(first, rng, 25)  # single appends
    with first.batch():
        _acts(first, rng, 20)
    deferred = engine.start_run(REVIEW, run_id=RUNS[1], deferred=True)
    with deferred.batch():
        _acts(deferred, rng, 10)
    # Several runs in one Store.append, interleaved (run_heads, Store.seal's links per run).
    pair = [engine.start_run(REVIEW, run_id=run_id) for run_id in RUNS[2:4]]
    _acts(pair[0], rng, 3)
    events = []
    for step in range(6):
        for number, run in enumerate(pair):
            version = run.version + 1 + step
            events.append(
                StageCompleted(
                    run_id=run.id,
                    version=version,
                    stage="x",
                    attempt=1,
                    result=_value(rng),
                    outcome=f"o{number}",
                )
            )
    engine.store.append(events)
    asyncio.run(_grouped([engine.start_run(REVIEW, run_id=r) for r in RUNS[4:6]], rng))
    fork = engine.fork(RUNS[0], at=min(7, first.version), new_run_id=RUNS[6])
    _acts(fork, rng, 8)
    loaded = engine.load(RUNS[0])  # its link read back from the store
    _acts(loaded, rng, 5)
    engine.store.erase([RUNS[1]])
    again = engine.start_run(REVIEW, run_id=RUNS[1])
    _acts(again, rng, 6)


def rows(engine: Engine, skip: int = 0) -> list[str]:
    """Each stored event after the first `skip`, as a digest of what it holds (see module)."""
    store, order = engine.store, {run_id: index for index, run_id in enumerate(RUNS)}
    found = store.recorder.select_notifications(skip + 1, 10**6)
    digests = []
    for stored in found:
        run_id = UUID(str(stored.originator_id))
        data = store.mapper.json_of(stored)
        part = b"%d %d %s " % (
            order.get(run_id, -1),
            stored.originator_version,
            stored.topic.encode(),
        )
        digests.append(hashlib.sha256(part + data).hexdigest()[:24])
    return digests


def _url(backend: str, directory: Path, name: str, compress: bool, postgres: str | None) -> str:
    query = "?compress=zlib" if compress else ""
    if backend == "memory":
        return "memory://" + query
    if backend == "sqlite":
        return f"sqlite:///{directory / (name + '.db')}{query}"
    assert postgres is not None
    schema = f"appended_{os.getpid()}_{name.replace('-', '_')}"
    return f"{postgres}{'&' if '?' in postgres else '?'}schema={schema}{query.replace('?', '&')}"


def _drop(url: str) -> None:
    """Drop the PostgreSQL schema a scenario wrote."""
    import psycopg
    from psycopg import sql

    base, _, query = url.partition("?")
    schema = dict(part.split("=", 1) for part in query.split("&"))["schema"]
    with psycopg.connect(base, autocommit=True) as connection:
        connection.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


def scenarios(directory: Path, postgres: str | None = None) -> dict[str, list[str]]:
    """Every scenario's stored rows, by name (PostgreSQL ones when `postgres` is a URL)."""
    result: dict[str, list[str]] = {}
    backends = ["memory", "sqlite", *(["postgresql"] if postgres else [])]
    with freeze_time("2026-03-04 05:06:07.123456", real_asyncio=True):
        for backend in backends:
            for at_rest, options in AT_REST.items():
                name = f"{backend}-{at_rest}"
                options = dict(options)
                url = _url(backend, directory, name, options.pop("compress", False), postgres)
                try:
                    with Engine(url, **options) as engine:
                        record(engine, seed=len(result))
                        result[name] = rows(engine)
                finally:
                    if backend == "postgresql":
                        _drop(url)
        old = directory / "v1_store.db"
        shutil.copy(V1_STORE, old)
        with Engine(f"sqlite:///{old}") as engine:
            before = engine.store.recorder.max_notification_id() or 0
            open_run = engine.load("00000000-0000-4000-8000-00000000000c")
            _acts(open_run, random.Random(99), 12)
            fork = engine.fork("00000000-0000-4000-8000-00000000000a", at=5, new_run_id=RUNS[8])
            _acts(fork, random.Random(98), 6)
            result["sqlite-v1-store"] = rows(engine, skip=before)
    return result


def main() -> None:
    """Write `FIXTURE` from this checkout's code (PostgreSQL too when given a URL)."""
    with tempfile.TemporaryDirectory() as directory:
        found = scenarios(Path(directory), sys.argv[1] if len(sys.argv) > 1 else None)
    FIXTURE.write_text(json.dumps(found, indent=0, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
