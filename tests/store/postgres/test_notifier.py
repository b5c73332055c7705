"""The NOTIFY after appends: at most one per interval, one after every append."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from engine import Engine
from engine.store.postgres.notifier import Notifier
from tests._helpers import POSTGRES_URL, REVIEW

WAIT = 30.0
"""Bound on a wait that only a lost NOTIFY would reach."""


class Sends:
    """What a notifier sent: the connection of each NOTIFY, and how many appends preceded it."""

    def __init__(self) -> None:
        self.appends = 0
        self.sent: list[tuple[Any, int]] = []
        self.event = threading.Event()

    def __call__(self, conn: Any) -> None:
        self.sent.append((conn, self.appends))
        self.event.set()


class TestNotifier:
    def test_the_first_append_notifies_at_once_on_its_connection(self) -> None:
        """No NOTIFY sent yet: the append's own connection sends it, no timer."""
        sends = Sends()
        notifier = Notifier(sends, interval=3600)
        sends.appends += 1
        notifier.appended("conn")
        assert sends.sent == [("conn", 1)]

    def test_a_burst_is_followed_by_one_notify_after_its_last_append(self) -> None:
        """Appends within the interval leave one NOTIFY to the timer, sent after all of them."""
        sends = Sends()
        notifier = Notifier(sends, interval=0.05)
        for _ in range(5):
            sends.appends += 1
            notifier.appended("conn")
        assert sends.sent == [("conn", 1)]
        sends.event.clear()
        assert sends.event.wait(WAIT)
        assert sends.sent == [("conn", 1), (None, 5)]

    def test_close_sends_the_notify_still_due_and_no_timer_fires(self) -> None:
        """An engine closed within the interval wakes its followers before its pool closes."""
        sends = Sends()
        notifier = Notifier(sends, interval=3600)
        notifier.appended("conn")
        notifier.appended("conn")
        notifier.close()
        assert sends.sent == [("conn", 0), (None, 0)]
        notifier.close()
        assert len(sends.sent) == 2

    def test_a_failed_notify_fails_no_append(self, caplog: pytest.LogCaptureFixture) -> None:
        """The append is committed: a NOTIFY that fails is logged, the follower times out."""

        def failing(conn: Any) -> None:
            raise OSError("connection reset")

        Notifier(failing).appended("conn")
        assert "NOTIFY after an append failed: connection reset" in caplog.text

    def test_no_sender_thread_to_be_had_sends_at_once_and_fails_no_append(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A sender that cannot start (at interpreter shutdown from 3.12 on, no threads left)
        fails no committed append: its NOTIFY goes at once, and close joins no unstarted one."""
        sends = Sends()
        notifier = Notifier(sends, interval=3600)
        notifier.appended("conn")

        def refused(thread: threading.Thread) -> None:
            raise RuntimeError("can't create new thread at interpreter shutdown")

        monkeypatch.setattr(threading.Thread, "start", refused)
        sends.appends += 1
        notifier.appended("conn")  # within the interval: a sender was due
        assert sends.sent == [("conn", 0), ("conn", 1)]
        assert not notifier.due
        monkeypatch.undo()
        sends.appends += 1
        notifier.appended("conn")  # threads again: the next NOTIFY left to a sender
        assert len(sends.sent) == 2
        notifier.close()
        assert sends.sent == [("conn", 0), ("conn", 1), (None, 2)]


class TestFollowersAreWoken:
    def test_a_burst_sends_one_notify_and_closing_sends_the_one_due(
        self, postgres_url: str
    ) -> None:
        """Twenty appends in an interval: one NOTIFY at once, the due one when the engine closes."""
        import psycopg

        with psycopg.connect(POSTGRES_URL, autocommit=True) as listener:
            with Engine(postgres_url) as engine:
                recorder: Any = engine.store.recorder
                recorder.notifier.interval = 3600  # the timer never fires in this test
                listener.execute(f"LISTEN {recorder.channel_name}")
                run = engine.start_run(REVIEW)
                for i in range(20):
                    run.note("n", i)
                listener.execute("SELECT 1")  # every NOTIFY sent so far is received by now
                before = list(listener.notifies(timeout=0))
            after = list(listener.notifies(timeout=WAIT, stop_after=1))
        assert len(before) == 1
        assert len(after) == 1

    def test_a_follower_drains_the_notifies_received_before_it_reads(
        self, postgres_url: str
    ) -> None:
        """Five NOTIFYs waiting wake one read, not five: the next wait times out."""
        import psycopg

        with Engine(postgres_url) as engine:
            views: Any = engine.store.views
            stop = threading.Event()
            assert views.wait_for_events(0.01, stop)  # starts listening
            with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
                for i in range(5):
                    conn.execute(f"NOTIFY {engine.store.recorder.channel_name}, '{i}'")  # type: ignore[attr-defined]
            views._listener.execute("SELECT 1")  # every NOTIFY received by now
            assert views.wait_for_events(WAIT, stop)
            assert not views.wait_for_events(0.05, stop)


class TestProcessExit:
    def test_a_process_exiting_without_close_still_sends_the_notify_due(self) -> None:
        """The timer's NOTIFY after a burst is not dropped when the process ends unclosed."""
        import subprocess
        import sys

        script = (
            "from engine.store.postgres.notifier import Notifier\n"
            "notifier = Notifier(lambda conn: print('sent', conn, flush=True), interval=0.5)\n"
            "notifier.appended('conn')\n"
            "notifier.appended('conn')\n"  # left to the timer; the script ends, never closing
        )
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=WAIT
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["sent conn", "sent None"]


class TestCloseDuringTheTimersNotify:
    def test_close_waits_for_the_timers_notify_in_flight(self) -> None:
        """A NOTIFY the timer is sending when the engine closes finishes before the pool closes."""
        entered, gate = threading.Event(), threading.Event()
        sends = Sends()

        def send(conn: Any) -> None:
            if conn is None:
                entered.set()
                assert gate.wait(WAIT)
            sends(conn)

        notifier = Notifier(send, interval=0.01)
        notifier.appended("conn")
        notifier.appended("conn")  # the timer's, sent 10 ms later
        assert entered.wait(WAIT)
        closer = threading.Thread(target=notifier.close)
        closer.start()
        closer.join(0.2)
        still_closing = closer.is_alive()  # the pool must not close under the NOTIFY
        gate.set()
        closer.join(WAIT)
        assert still_closing
        assert [conn for conn, _ in sends.sent] == ["conn", None]


class TestRecoveredAppends:
    def test_an_append_found_stored_after_a_lost_connection_notifies(
        self, postgres_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An append committed before its connection was lost, and found stored on retry,
        still wakes the followers (its own NOTIFY may have been lost with the connection)."""
        from eventsourcing.persistence import OperationalError

        with Engine(postgres_url) as engine:
            recorder: Any = engine.store.recorder
            run = engine.start_run(REVIEW)
            insert_once = recorder._insert_once

            def committed_then_lost(events: Any, heads: Any) -> Any:
                insert_once(events, heads)
                monkeypatch.setattr(recorder, "_insert_once", insert_once)
                raise OperationalError("server closed the connection unexpectedly")

            recorder.notifier.interval = 0.0  # every append notifies at once
            monkeypatch.setattr(recorder, "_insert_once", committed_then_lost)
            sent = recorder.notifier.sent
            run.note("n", 1)
            assert recorder.recovered["stored"] == 1
            # one by the append that committed (here its NOTIFY did reach the server), and
            # one by the recovery, which cannot know that
            assert recorder.notifier.sent == sent + 2
            assert [e.version for e in engine.events(run.id)] == [1, 2]


def forked(child: Any) -> int:
    """Run `child()` in a forked process; its exit code (1: it raised; killed: hung for WAIT)."""
    import os
    import signal
    import time

    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code = 1
        try:
            code = 0 if child() else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -signal.SIGKILL


class TestFork:
    def test_a_forked_child_inherits_no_timer_lock_or_notify_due(self, postgres_url: str) -> None:
        """A child forked while a parent's thread holds the notifier's lock and a NOTIFY is due
        appends and closes without waiting for either; the parent still sends its own."""
        with Engine(postgres_url) as engine:
            notifier = engine.store.recorder.notifier  # type: ignore[attr-defined]
            notifier.interval = 3600
            run = engine.start_run(REVIEW)
            run.note("k", 1)  # the timer's NOTIFY due, an hour from now
            assert notifier.due
            held, release = threading.Event(), threading.Event()

            def hold() -> None:
                with notifier._lock:
                    held.set()
                    release.wait(WAIT)

            holder = threading.Thread(target=hold)
            holder.start()
            assert held.wait(WAIT)
            sent_before = notifier.sent

            def child() -> bool:
                sends = Sends()  # the parent's pooled connections are not the child's to use
                notifier._send = sends
                notifier.appended("conn")  # the first of the child's: at once
                notifier.close()  # nothing due of the child's; none of the parent's sent
                return sends.sent == [("conn", 0)]

            try:
                code = forked(child)
            finally:
                release.set()
                holder.join(WAIT)
            assert code == 0
            assert notifier.due  # the parent's NOTIFY still due, by its sender
        assert notifier.sent == sent_before + 1  # sent by the parent's close
