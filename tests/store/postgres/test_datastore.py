"""Which PostgreSQL errors are a lost connection, after which a read runs once more; read
transactions that keep the connection's prepared statements; the views' reads of one query
outside a transaction."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from eventsourcing.persistence import IntegrityError, InterfaceError, OperationalError
from psycopg import errors, pq
from psycopg_pool import PoolTimeout

from engine.store.errors import StoreError
from engine.store.postgres.datastore import Datastore, lost, make_datastore, read_retried
from engine.store.postgres.views import PostgresViews
from engine.store.urls import parse


def wrapped(kind: type[Exception], cause: Exception) -> Exception:
    """`cause` under eventsourcing's wrapping, as its datastore raises it."""
    try:
        raise kind(str(cause)) from cause
    except kind as error:
        return error


class TestLost:
    @pytest.mark.parametrize(
        "cause",
        [
            errors.AdminShutdown("terminating connection due to administrator command"),
            errors.IdleSessionTimeout("terminating connection due to idle-session timeout"),
            errors.ConnectionFailure("server closed the connection unexpectedly"),
            psycopg.OperationalError("consuming input failed"),
        ],
        ids=["terminated", "idle-session-timeout", "connection-failure", "no-sqlstate"],
    )
    def test_a_connection_lost_in_use_is_lost(self, cause: Exception) -> None:
        """A terminated backend, a broken socket, a failure without a state: lost."""
        assert lost(wrapped(OperationalError, cause))
        assert lost(wrapped(InterfaceError, psycopg.InterfaceError("the connection is closed")))

    @pytest.mark.parametrize(
        "error",
        [
            wrapped(OperationalError, errors.QueryCanceled("statement timeout")),
            wrapped(OperationalError, errors.LockNotAvailable("lock timeout")),
            wrapped(OperationalError, PoolTimeout("couldn't get a connection after 30 s")),
            wrapped(IntegrityError, errors.UniqueViolation("duplicate key")),
            None,
        ],
        ids=["statement-timeout", "lock-timeout", "pool-timeout", "integrity", "none"],
    )
    def test_a_refusal_on_a_live_connection_or_no_connection_is_not(
        self, error: Exception | None
    ) -> None:
        """A timeout on a live connection, an empty pool, a constraint: not lost, not retried."""
        assert not lost(error)


class TestReadRetried:
    def test_a_read_that_lost_its_connection_runs_once_more(self) -> None:
        """The first attempt lost its connection: the second answers."""
        calls: list[int] = []

        def read() -> int:
            calls.append(1)
            if len(calls) == 1:
                raise wrapped(OperationalError, errors.AdminShutdown("terminated"))
            return 7

        assert read_retried(read) == 7
        assert len(calls) == 2

    def test_only_once_and_never_after_a_refusal(self) -> None:
        """Lost twice, the second error is raised; a timeout is raised at once."""
        calls: list[int] = []

        def always_lost() -> int:
            calls.append(1)
            raise wrapped(OperationalError, errors.AdminShutdown("terminated"))

        with pytest.raises(OperationalError):
            read_retried(always_lost)
        assert len(calls) == 2

        def timed_out() -> int:
            calls.append(1)
            raise wrapped(OperationalError, errors.QueryCanceled("statement timeout"))

        with pytest.raises(OperationalError):
            read_retried(timed_out)
        assert len(calls) == 3


@pytest.fixture
def one_connection(postgres_url: str) -> Iterator[Datastore]:
    """A datastore whose pool holds one connection, so every transaction runs on it."""
    datastore = make_datastore(parse(postgres_url), pool_size=1, max_overflow=0)
    yield datastore
    datastore.close()


def prepared(datastore: Datastore) -> int:
    """How many statements the pool's one connection has prepared on the server."""
    with datastore.get_connection() as conn:
        return int(conn.execute("SELECT count(*) AS n FROM pg_prepared_statements").fetchone()["n"])


class TestReadTransaction:
    def test_a_read_keeps_the_statements_the_connection_prepared(
        self, one_connection: Datastore
    ) -> None:
        """A read transaction ends without making psycopg deallocate its prepared statements."""
        for _ in range(3):
            with one_connection.transaction(commit=False) as cursor:
                cursor.execute("SELECT 1 AS one", prepare=True)
        assert prepared(one_connection) == 1

    def test_a_read_can_write_nothing_and_leaves_the_connection_writable(
        self, one_connection: Datastore
    ) -> None:
        """A write in a read transaction fails; the next write transaction commits."""
        with (
            pytest.raises(Exception) as refused,
            one_connection.transaction(commit=False) as cursor,
        ):
            cursor.execute("CREATE TEMPORARY TABLE t (x int)")
        assert isinstance(refused.value.__cause__, errors.ReadOnlySqlTransaction)
        with one_connection.transaction(commit=True) as cursor:
            cursor.execute("CREATE TEMPORARY TABLE t (x int)")
            cursor.execute("INSERT INTO t VALUES (1)")
        with one_connection.transaction(commit=False) as cursor:
            assert cursor.execute("SELECT x FROM t").fetchall() == [{"x": 1}]


class TestViewsRead:
    def test_a_read_of_one_query_runs_outside_a_transaction(
        self, one_connection: Datastore
    ) -> None:
        """The views read one query with no BEGIN, and more in a transaction of their own."""
        views = PostgresViews(one_connection, "channel")
        with views._read() as cursor:
            assert cursor.execute("SELECT 1 AS one").fetchone() == {"one": 1}
            assert cursor.connection.info.transaction_status == pq.TransactionStatus.IDLE
        with views._read(statements=2) as cursor:
            cursor.execute("SELECT 1 AS one")
            assert cursor.connection.info.transaction_status == pq.TransactionStatus.INTRANS

    def test_a_refused_read_of_one_query_is_a_store_error(self, one_connection: Datastore) -> None:
        """A query the server refuses outside a transaction is a `StoreError`, as in one."""
        views = PostgresViews(one_connection, "channel", "postgresql://store")
        with pytest.raises(StoreError, match="projection storage failed"), views._read() as cursor:
            cursor.execute("SELECT * FROM no_such_table")
