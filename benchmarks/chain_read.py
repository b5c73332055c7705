"""What reading a long run out of PostgreSQL costs, beside checking its chain: the floors of
issue 29's "verify of a 1M-event run's chain ≥ 500,000 events/s" on PostgreSQL.

Run: ``python -m benchmarks.chain_read --store 'postgresql://...?schema=S'`` (the newest run
of a store kept from a run before: writing 1,000,001 events takes minutes), or without
``--store`` a run of ``--events`` outcomes written into a new schema, dropped afterwards.
Each round, in turn:

- each way of reading the run's (version, topic, state) rows in version order through
  psycopg: the chunked rows `RangeReader` streams (libpq 17 and later), a server-side
  cursor fetched 20,000 rows at a time, ``COPY ... TO STDOUT (FORMAT BINARY)`` read as raw
  blocks and as typed rows, and the stream without the topic (what one column fewer
  saves), and the server's scan alone (a count). Rows/s of wall clock, of this process's
  CPU time and of the server backend's CPU time (read from /proc when the server runs on
  this host; else 0);
- the hash check alone (`Chain.run_along` over 20,000 rows held in memory);
- `engine.verify(run, chain_only=True)` (with ``--workers`` workers), the server's CPU
  time summed over its backends (the connections named ``chain_read``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from benchmarks._common import WORK, record_outcomes, report
from benchmarks.scale import postgres_store
from engine import Engine
from engine.store.chain import Chain, split
from engine.store.postgres.datastore import schema_of
from engine.store.urls import parse

NAME = "chain_read"
"""The application_name of every connection this benchmark opens (its backends are found by it)."""
_TICKS = os.sysconf("SC_CLK_TCK")
_RATES = ("wall", "cpu", "server")


def connected(url: str, name: str = NAME) -> Any:
    """An autocommit connection named `name` to the server of the store at `url` (not
    necessarily the benchmark's own PostgreSQL: ``--store`` may name another)."""
    import psycopg

    parsed = parse(url)
    return psycopg.connect(
        host=parsed.host, port=parsed.port, user=parsed.user, password=parsed.password,
        dbname=parsed.dbname, autocommit=True, application_name=name,
    )  # fmt: skip


def server_seconds(pid: int) -> float:
    """CPU seconds (user and system) of the server process `pid`, 0.0 when it cannot be read
    (the server runs elsewhere, or the process has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def query(schema: str, columns: str = "originator_version, topic, state") -> str:
    """The SELECT of a run's rows in version order (the run's id a parameter)."""
    return (
        f"SELECT {columns} FROM {schema}.stagetrail_events WHERE originator_id = %s "
        "ORDER BY originator_version"
    )


def copy_of(schema: str, run_id: UUID) -> str:
    """The COPY of the run's rows, binary (a COPY takes no parameters: the id written in)."""
    return f"COPY ({query(schema).replace('%s', repr(str(run_id)))}) TO STDOUT (FORMAT BINARY)"


def streamed(conn: Any, schema: str, run_id: UUID, columns: str | None = None) -> int:
    """Rows of the chunked stream `RangeReader` reads, a page of 1,000 at a time."""
    from psycopg.rows import tuple_row

    statement = query(schema, columns) if columns else query(schema)
    count = 0
    with conn.cursor(row_factory=tuple_row, binary=True) as cursor:
        rows = cursor.stream(statement, (run_id,), binary=True, size=1000)
        for page in iter(lambda: list(itertools.islice(rows, 1000)), []):
            count += len(page)
    return count


def named_cursor(conn: Any, schema: str, run_id: UUID) -> int:
    """Rows of a server-side cursor, binary, 20,000 a fetch."""
    from psycopg.rows import tuple_row

    count = 0
    with conn.transaction(), conn.cursor("chain_read", row_factory=tuple_row) as cursor:
        cursor.execute(query(schema), (run_id,), binary=True)
        while page := cursor.fetchmany(20_000):
            count += len(page)
    return count


def copy_blocks(conn: Any, schema: str, run_id: UUID) -> int:
    """Rows of a binary COPY read as raw blocks (one a row; the header rides on the first,
    the trailer is one more)."""
    count = 0
    with conn.cursor() as cursor, cursor.copy(copy_of(schema, run_id)) as copy:
        for _ in copy:
            count += 1
    return count - 1


def copy_rows(conn: Any, schema: str, run_id: UUID) -> int:
    """Rows of a binary COPY parsed by psycopg (`Copy.rows`)."""
    count = 0
    with conn.cursor() as cursor, cursor.copy(copy_of(schema, run_id)) as copy:
        copy.set_types(["int8", "text", "bytea"])
        for _ in copy.rows():
            count += 1
    return count


def scanned(conn: Any, schema: str, run_id: UUID) -> int:
    """Rows the server scans in version order, none sent (its floor)."""
    statement = f"SELECT count(length(state)) FROM ({query(schema)}) AS rows"
    return int(conn.execute(statement, (run_id,)).fetchone()[0])


READS: dict[str, Callable[[Any, str, UUID], int]] = {
    "chunked stream (RangeReader)": streamed,
    "chunked stream, no topic": lambda c, s, r: streamed(c, s, r, "originator_version, state"),
    "server-side cursor, 20,000 a fetch": named_cursor,
    "COPY binary, raw blocks": copy_blocks,
    "COPY binary, typed rows": copy_rows,
    "the server's scan alone (count)": scanned,
}


def read_rates(conn: Any, schema: str, run_id: UUID, read: Callable[..., int]) -> dict[str, float]:
    """Rows/s of `read`: wall clock, this process's CPU time, the server backend's."""
    pid = conn.info.backend_pid
    server, wall, cpu = server_seconds(pid), time.perf_counter(), time.process_time()
    rows = read(conn, schema, run_id)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    server = server_seconds(pid) - server
    return {"wall": rows / wall, "cpu": rows / cpu, "server": rows / server if server else 0.0}


def check_alone(conn: Any, schema: str, run_id: UUID, rows: int = 20_000) -> float:
    """Events/s of CPU time of `Chain.run_along` over the run's first `rows` rows, in memory."""
    from psycopg.rows import tuple_row

    statement = query(schema).replace("ORDER BY", "AND originator_version <= %s ORDER BY")
    with conn.cursor(row_factory=tuple_row, binary=True) as cursor:
        page = cursor.execute(statement, (run_id, rows + 1), binary=True).fetchall()
    first = split(page[0][2])
    assert first is not None
    cpu = time.process_time()
    followed, _ = Chain().run_along(first[2], 2, run_id, page, 1)
    cpu = time.process_time() - cpu
    assert followed == len(page) - 1
    return followed / cpu


class Backends(threading.Thread):
    """Samples the CPU time of the server's backends named `NAME` while a check runs: the
    ranges' connections come and go, so each is read every 20 ms until the check ends."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self._conn = connected(url, f"{NAME} sampler")  # not one of the backends it samples
        self._done = threading.Event()
        self._start = self._now()
        self._seen: dict[int, float] = {}

    def _now(self) -> dict[int, float]:
        pids = self._conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (NAME,)
        )
        return {pid: server_seconds(pid) for (pid,) in pids}

    def run(self) -> None:
        """Sample until `seconds` is called."""
        while not self._done.wait(0.02):
            self._seen.update({p: s for p, s in self._now().items() if s})

    def seconds(self) -> float:
        """The backends' CPU seconds since the sampler started (at most 20 ms short each)."""
        self._done.set()
        self.join()
        self._conn.close()
        return sum(s - self._start.get(p, 0.0) for p, s in self._seen.items())


def verify_rates(url: str, run_id: UUID, workers: int) -> dict[str, float]:
    """Events/s of `engine.verify(run, chain_only=True)`: wall clock, CPU time (this process
    and its ended workers), the server's backends."""
    with Engine(_named(url), read_only=True) as engine:  # --store's store: nothing written
        backends = Backends(url)
        backends.start()
        children = _children()
        wall, cpu = time.perf_counter(), time.process_time()
        checked = engine.verify(run_id, chain_only=True, workers=workers)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        cpu += _children() - children
        server = backends.seconds()
        assert checked.ok, checked.problems[:3]
        assert checked.chain == "intact"
    events = checked.events
    return {"wall": events / wall, "cpu": events / cpu, "server": events / server if server else 0}


def _children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def long_run(store: str | None, events: int) -> Iterator[tuple[str, UUID]]:
    """The store's URL and its newest run, or a new schema holding a run of
    `events` outcomes (dropped afterwards)."""
    if store is not None:
        with Engine(store, read_only=True) as engine:
            (summary,) = engine.runs(limit=1)
        yield store, summary.run_id
        return
    with postgres_store() as url, Engine(url) as engine:
        run = engine.start_run(WORK)
        record_outcomes(run, events, 1000)
        yield url, run.id


def _named(url: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}application_name={NAME}"


def measure(url: str, run_id: UUID, rounds: int, workers: int) -> list[dict[str, object]]:
    """Every read, the check alone and `engine.verify`, `rounds` rounds in turn (medians)."""
    schema = schema_of(parse(url))
    rates: dict[str, list[dict[str, float]]] = {name: [] for name in (*READS, "verify")}
    loads: list[float] = []
    with connected(url) as conn:
        hashed = check_alone(conn, schema, run_id)
        for _ in range(rounds):
            loads.append(os.getloadavg()[0])
            for name, read in READS.items():
                rates[name].append(read_rates(conn, schema, run_id, read))
            rates["verify"].append(verify_rates(url, run_id, workers))
    rows: list[dict[str, object]] = [
        {
            "case": name,
            **{k: statistics.median(r[k] for r in got) for k in _RATES},
        }
        for name, got in rates.items()
    ]
    rows.append({"case": "the hash check alone (run_along, in memory)", "cpu": hashed})
    rows.append({"case": "load (1 min) at each round", "loads": loads, "workers": workers})
    return rows


def main() -> None:
    """Measure and print rows/s of each read and of the check."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", help="a PostgreSQL store URL (its newest run is read)")
    parser.add_argument("--events", type=int, default=100_000, help="the new run's outcomes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0, help="verify's worker processes")
    parser.add_argument("--quick", action="store_true", help="5,000 events, one round")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    args = parser.parse_args()
    if args.quick:
        args.events, args.rounds = 5000, 1
    with long_run(args.store, args.events) as (url, run_id):
        rows = measure(url, run_id, args.rounds, args.workers)
    report("reading a run out of PostgreSQL (rows/s)", rows, args.json)


if __name__ == "__main__":
    main()
