"""SIGKILL trials: a forked victim records runs until it is killed at a random moment.

One trial: fork a victim that opens the store and, chosen at random, records
batches of notes, supervises runs (attempts that fail and retry), runs tasks
that record their cost, or catches persistent projections up in small pages;
it reports each step on a pipe *before* (``open``) and *after* (``done``,
with the run's committed version) it commits. After a random delay the trial
kills it with SIGKILL, then checks the store:

- no acknowledged event is lost (each run holds at least its acknowledged version);
- one notification per (run, version), and each run's versions are 1..n;
- no half-written batch: note batches are whole, every supervised failure has
  its decision (retry or give-up) beside it, every recorded cost its completion;
- every run verifies; resuming a run records its interrupted attempt and
  tasks as ``Interrupted``, and the run then verifies and can be driven to its end.

After the last trial the projections are caught up and compared to a rebuild.
A fork costs milliseconds where a fresh interpreter costs a second, so one
process runs many trials: ``python -m tests.faults.trials URL --trials 60 --seed 1``
prints one JSON report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID

from benchmarks.fleet import RETRY, stages
from engine import Engine, Run, Spent, StageContext, StageGaveUp
from engine.cli.demo.code_review import REVIEW
from events import Event, NoteAdded, RetryScheduled, StageFailed
from projections import BUILT_INS
from tests._helpers import FailuresByType
from tests.supervise._helpers import LOOP

MAX_DELAY = 0.4
"""The longest wait, in seconds, between the victim being ready and its kill."""
KINDS = ("batch", "batch", "batch", "drive", "drive", "tasks", "tasks", "catch_up")
"""What a victim does next, drawn at random: batches most often, to die inside them."""


class Victim:
    """The forked child: records at random and reports each step on the pipe `out`."""

    def __init__(self, engine: Engine, out: int, rng: random.Random) -> None:
        self.engine = engine
        self.out = out
        self.rng = rng

    def say(self, *words: object) -> None:
        """One line on the pipe, unbuffered: it is there before the next step starts."""
        os.write(self.out, (" ".join(map(str, words)) + "\n").encode())

    @contextlib.contextmanager
    def step(self, kind: str, run: Run | None) -> Iterator[None]:
        """Report a step as open, then done with the version it committed."""
        self.say("open", kind)
        yield
        self.say("done", kind, run.id if run else "-", run.version if run else 0)

    def forever(self) -> None:
        """Record at random until killed."""
        while True:
            kind = self.rng.choice(KINDS)
            getattr(self, kind)()

    def batch(self) -> None:
        """A run whose notes come in whole batches of 10 to 300."""
        run = self.engine.start_run(LOOP, labels={"kind": "batch"})
        self.say("done", "start", run.id, 1)
        for number in range(self.rng.randint(1, 6)):
            size = self.rng.randint(10, 300)
            with self.step("batch", run), run.batch():
                for item in range(size):
                    note = {"batch": number, "item": item, "size": size, "pad": "x" * 40}
                    run.note("batch", note)
                self.say("commit")  # built: what follows is the batch's one transaction

    def drive(self) -> None:
        """A supervised review whose developer stage fails and retries."""
        run = self.engine.start_run(REVIEW, labels={"kind": "drive"})
        self.say("done", "start", run.id, 1)
        worker, number = self.rng.randrange(1000), self.rng.randrange(1000)
        self.say("params", run.id, worker, number)  # so a resumed run fails as planned
        sup = self.engine.supervisor(retry=RETRY, sleep=lambda seconds: None)
        with self.step("drive", run), contextlib.suppress(StageGaveUp):
            sup.drive(run, self._reported(run, stages(worker, number)))

    def _reported(self, run: Run, functions: dict[str, Any]) -> dict[str, Any]:
        def wrap(fn: Callable[[StageContext], Any]) -> Callable[[StageContext], Any]:
            def attempt(context: StageContext) -> Any:
                self.say("done", "attempt", run.id, run.version)  # StageStarted committed
                time.sleep(self.rng.uniform(0, 0.004))  # some work, so a kill can land here
                return fn(context)

            return attempt

        return {stage: wrap(fn) for stage, fn in functions.items()}

    def tasks(self) -> None:
        """Tasks that fail once in a while and record their cost with their completion."""
        run = self.engine.start_run(LOOP, labels={"kind": "tasks"})
        self.say("done", "start", run.id, 1)
        sup = self.engine.supervisor(retry=RETRY, sleep=lambda seconds: None)
        for number in range(self.rng.randint(3, 12)):
            flaky = self.rng.random() < 0.3
            with self.step("task", run):
                sup.task(run, f"t{number}", self._task(flaky), f"t{number}")

    def _task(self, flaky: bool) -> Callable[[str], Spent]:
        """A task function that does a little work, failing its first call if `flaky`."""
        calls = Counter[str]()

        def task(name: str) -> Spent:
            calls[name] += 1
            time.sleep(self.rng.uniform(0, 0.004))
            if flaky and calls[name] == 1:
                raise RuntimeError(f"{name} failed once")
            return Spent({"task": name}, 0.25, "usd")

        return task

    def catch_up(self) -> None:
        """Fold the projections in many small transactions."""
        with self.step("catch_up", None):
            self.engine.projections.catch_up()


def victim(url: str, out: int, seed: int) -> None:
    """The child's whole life: open the store, say ready, record until killed."""
    import engine.readside.persistent

    engine.readside.persistent.PAGE = 37  # many small transactions, many places to die
    opened = Engine(url)
    for projection in (*BUILT_INS, FailuresByType):
        opened.projections.register(projection)
    os.write(out, b"ready\n")
    Victim(opened, out, random.Random(seed)).forever()


def kill_one(url: str, seed: int, rng: random.Random) -> list[str]:
    """Fork a victim, kill it after a random delay; its report lines."""
    name = _victim_name()  # here: in the forked child os.getpid() is the child's
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the victim
        os.close(read)
        try:
            victim(_named(url, name), write, seed)
        finally:
            os._exit(1)
    os.close(write)
    with os.fdopen(read) as lines:
        assert lines.readline() == "ready\n", "the victim died before it was ready"
        assert _backends(url, name) != 0, "the victim's backends do not carry its name"
        time.sleep(rng.uniform(0, MAX_DELAY))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status), f"the victim ended on its own: {status}"
        _server_done(url, name)
        return lines.read().splitlines()


def _victim_name() -> str:
    """The PostgreSQL application name of this checker's victims."""
    return f"stagetrail-victim-{os.getpid()}"


def _named(url: str, name: str) -> str:
    """The victim's store URL: on PostgreSQL its connections carry `name`."""
    if not url.startswith("postgresql"):
        return url
    return f"{url}{'&' if '?' in url else '?'}application_name={name}"


def _backends(url: str, name: str) -> int | None:
    """How many PostgreSQL backends carry the application name `name` (None: SQLite)."""
    if not url.startswith("postgresql"):
        return None
    import psycopg

    query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
    with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
        return int(conn.execute(query, (name,)).fetchone()[0])  # type: ignore[index]


def _server_done(url: str, name: str) -> None:
    """Wait until the killed victim's PostgreSQL backends have ended.

    A COMMIT the victim sent just before its kill is still carried out by its
    backend: the event is recorded, a moment after the victim died. The checker
    looks at the store once no such backend is left, as any later process would.
    """
    deadline = time.monotonic() + 30
    while _backends(url, name):
        assert time.monotonic() < deadline, "the killed victim's backends did not end"
        time.sleep(0.01)


def where(lines: list[str]) -> str:
    """Where the kill landed: inside an unfinished step (batch, drive, task...), or between.

    A batch killed after it was built, while it committed, is ``batch_commit``.
    """
    place = "between"
    for line in lines:
        word, kind, *_ = [*line.split(), ""]
        if word == "open":
            place = kind
        elif word == "commit":
            place = f"{place}_commit"
        elif word == "done" and kind in {"batch", "drive", "task", "catch_up"}:
            place = "between"
    return place


class Checker:
    """Checks the store after a kill; resumes and finishes what the victim left."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.counts: Counter[str] = Counter()

    def check(self, lines: list[str], since: int) -> None:
        """Everything the module docstring promises, for the runs touched since `since`."""
        acked: dict[UUID, int] = {}
        params: dict[UUID, tuple[int, int]] = {}
        for line in lines:
            words = line.split()
            if words[0] == "done" and words[2] != "-":
                run_id = UUID(words[2])
                acked[run_id] = max(acked.get(run_id, 0), int(words[3]))
            elif words[0] == "params":
                params[UUID(words[1])] = (int(words[2]), int(words[3]))
        touched = self._notifications(since)
        for run_id, version in acked.items():
            assert self.engine.store.last(run_id).version >= version, f"lost events of {run_id}"  # type: ignore[union-attr]
        self.counts["acknowledged_events"] += sum(acked.values())
        for run_id in touched:
            self._check_run(run_id, params.get(run_id))

    def _notifications(self, since: int) -> set[UUID]:
        notifications = self.engine.store.recorder.select_notifications(
            start=since, limit=1_000_000, inclusive_of_start=False
        )
        keys = [(UUID(str(n.originator_id)), n.originator_version) for n in notifications]
        assert len(keys) == len(set(keys)), "a (run, version) notified twice"
        self.counts["events"] += len(keys)
        return {run_id for run_id, _ in keys}

    def _check_run(self, run_id: UUID, plan: tuple[int, int] | None) -> None:
        events = self.engine.events(run_id)
        assert [e.version for e in events] == list(range(1, len(events) + 1))
        whole_batches(events)
        decided_failures(events)
        paid_tasks(events)
        assert self.engine.verify(run_id).ok, self.engine.verify(run_id).problems
        self.counts["runs"] += 1
        self._resume(run_id, plan, events)

    def _resume(self, run_id: UUID, plan: tuple[int, int] | None, events: list[Event]) -> None:
        loaded = self.engine.load(run_id)
        if loaded.machine.status is not None:
            return
        open_attempt, active = loaded.machine.open_attempt, loaded.tasks
        active_tasks = sorted(t for t, status in active.items() if status == "active")
        run = self.engine.resume(run_id)
        new = self.engine.events(run_id)[len(events) :]
        if open_attempt is not None and "failed" in loaded.pipeline.allowed(loaded.state):
            assert isinstance(new[0], StageFailed)
            assert (new[0].error_type, new[0].attempt) == ("Interrupted", open_attempt)
            self.counts["interrupted_attempts"] += 1
        interrupted = sorted(e.task_id for e in new if type(e).__name__ == "TaskFailed")  # type: ignore[attr-defined]
        assert interrupted == active_tasks
        self.counts["interrupted_tasks"] += len(interrupted)
        self._finish(run, plan)
        assert self.engine.verify(run_id).ok
        self.counts["resumed_runs"] += 1

    def _finish(self, run: Run, plan: tuple[int, int] | None) -> None:
        if run.pipeline.name == REVIEW.name:
            worker, number = plan or (0, 0)
            with contextlib.suppress(StageGaveUp):
                self.engine.supervisor(retry=RETRY, sleep=lambda s: None).drive(
                    run, stages(worker, number)
                )
            assert run.status in {"succeeded", "failed"}
        else:
            run.finish("cancelled")

    def projections_equal_a_rebuild(self) -> None:
        """Catch every projection up, then compare it with a rebuild from zero."""
        projections = self.engine.projections
        for projection in (*BUILT_INS, FailuresByType):
            projections.register(projection)
        projections.catch_up()
        resumed = {name: projections.states(name, catch_up=False) for name in projections.names}
        for name in projections.names:
            projections.rebuild(name)
        rebuilt = {name: projections.states(name, catch_up=False) for name in projections.names}
        assert resumed == rebuilt, "a killed catch-up folded an event twice or lost one"
        self.counts["projections_checked"] = len(resumed)


def whole_batches(events: list[Event]) -> None:
    """Every batch of notes is all there: items 0..size-1, in order."""
    batches: dict[int, list[int]] = {}
    sizes: dict[int, int] = {}
    for event in events:
        if isinstance(event, NoteAdded) and event.key == "batch":
            value: Any = event.value
            batches.setdefault(value["batch"], []).append(value["item"])
            sizes[value["batch"]] = value["size"]
    for number, items in batches.items():
        assert items == list(range(sizes[number])), f"batch {number} is half-written"


def decided_failures(events: list[Event]) -> None:
    """A supervised developer failure is followed by its decision, from the same transaction."""
    for index, event in enumerate(events):
        if isinstance(event, StageFailed) and event.stage == "developer":
            if event.error_type == "Interrupted":
                continue
            decision = events[index + 1] if index + 1 < len(events) else None
            gave_up = isinstance(decision, NoteAdded) and decision.key == "gave_up"
            assert isinstance(decision, RetryScheduled) or gave_up, f"v{event.version} undecided"


def paid_tasks(events: list[Event]) -> None:
    """Each cost is recorded with the completion that returned it, and vice versa."""
    kinds = [type(event).__name__ for event in events]
    for index, kind in enumerate(kinds):
        if kind == "BudgetSpent":
            assert kinds[index + 1 : index + 2] == ["TaskCompleted"]
        if kind == "TaskCompleted":
            assert kinds[index - 1] == "BudgetSpent"


def trials(url: str, count: int, seed: int) -> dict[str, Any]:
    """Run `count` kill trials on the store at `url`; the figures."""
    rng = random.Random(seed)
    places: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    began = time.time()
    for number in range(count):
        with Engine(url) as engine:
            since = engine.projections.head()
        lines = kill_one(url, seed * 100_000 + number, rng)  # no connection open across fork
        places[where(lines)] += 1
        with Engine(url) as engine:
            checker = Checker(engine)
            checker.check(lines, since)
            counts.update(checker.counts)
    with Engine(url) as engine:
        checker = Checker(engine)
        checker.projections_equal_a_rebuild()
        counts.update(checker.counts)
    return {"trials": count, "places": dict(places), "counts": dict(counts),
            "seconds": time.time() - began}  # fmt: skip


def main() -> None:
    """Run the trials named on the command line and print the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()
    print(json.dumps(trials(options.url, options.trials, options.seed)), flush=True)


if __name__ == "__main__":
    main()
