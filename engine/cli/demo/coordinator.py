"""A coordinator: features split into tasks, built under supervision, checked in child runs.

`plan` adds each feature and its tasks (feature → tasks) in one transaction;
`build` runs every task through the supervisor, recording each task's cost with
its completion; `integrate` starts one child run per feature (``parent_run_id``)
to verify it. Killed at any point, the run is continued by
``engine.resume(run_id)`` then ``sup.drive(run, stages)``: finished tasks and
child runs are not done again, and the budget counts each task once.

Run it with ``python -m engine.cli.demo.coordinator [--stop-at N]`` (the store is
``$STAGETRAIL_STORE``; a URL argument is still read, but a command line is visible to
every user, so keep passwords out of it): with
``--stop-at N`` the process prints ``stopped at N <point>`` at its N-th point
and waits on stdin, so that a test (or the demo) can SIGKILL it right there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any
from uuid import UUID

from engine import Engine, Pipeline, Run, Spent, StageContext, Supervisor

COORDINATOR = Pipeline(
    "coordinator",
    initial="plan",
    transitions=[
        ("plan", "completed", "build"),
        ("build", "completed", "integrate"),
        ("build", "failed", "build"),
        ("integrate", "completed", "done"),
        ("integrate", "failed", "integrate"),
    ],
    final=["done"],
)

FEATURE_CHECK = Pipeline(
    "feature-check",
    initial="verify",
    transitions=[("verify", "completed", "passed"), ("verify", "failed", "verify")],
    final=["passed"],
)

FEATURES = {
    "feature-auth": ["task-login", "task-logout"],
    "feature-search": ["task-index", "task-query"],
}
TASK_COST = 0.25
"""What each task costs, in usd."""

Hook = Callable[[str], None]


def _no_hook(point: str) -> None:
    """Points are only marked when someone wants to stop there."""


class Coordinator:
    """The coordinator's stage functions, sharing one supervisor."""

    def __init__(self, engine: Engine, sup: Supervisor, hook: Hook = _no_hook) -> None:
        self.engine = engine
        self.sup = sup
        self.hook = hook

    def stages(self) -> dict[str, Callable[[StageContext], Any]]:
        """The functions `drive` calls, by stage."""
        return {"plan": self.plan, "build": self.build, "integrate": self.integrate}

    def plan(self, context: StageContext) -> dict[str, Any]:
        """Add every feature and its tasks, all or nothing."""
        self.hook("plan")
        run = context.run
        if not run.tasks:
            with run.batch():
                for feature, tasks in FEATURES.items():
                    run.add_task(feature, title=feature.removeprefix("feature-"))
                    for task in tasks:
                        run.add_task(task, parent=feature, title=task.removeprefix("task-"))
        return {"features": len(FEATURES), "tasks": sum(map(len, FEATURES.values()))}

    def build(self, context: StageContext) -> dict[str, Any]:
        """Run each task (skipped when completed), then close each feature."""
        run = context.run
        for feature, tasks in FEATURES.items():
            for task in tasks:
                self.sup.task(run, task, self._build_task, task)
            self.sup.task(run, feature, lambda feature=feature: {"tasks": len(FEATURES[feature])})
        return {"built": sorted(task for tasks in FEATURES.values() for task in tasks)}

    def _build_task(self, task: str) -> Spent:
        self.hook(f"{task}:start")
        result = {"task": task, "files": 2}
        self.hook(f"{task}:done")
        return Spent(result, TASK_COST)

    def integrate(self, context: StageContext) -> dict[str, Any]:
        """Verify each feature in a child run of its own (found again after a restart)."""
        self.hook("integrate")
        checked = {}
        for feature in FEATURES:
            child = self._child(context.run, feature)
            self.sup.drive(child, {"verify": self._verifier(feature)})
            checked[feature] = str(child.id)
        return {"checked": checked}

    def _child(self, run: Run, feature: str) -> Run:
        found = self.engine.runs(parent=run.id, label=f"feature={feature}", limit=1)
        if found:
            return self.engine.resume(found[0].run_id)
        labels = {"example": "coordinator", "feature": feature}
        return self.engine.start_run(FEATURE_CHECK, parent=run, labels=labels)

    def _verifier(self, feature: str) -> Callable[[StageContext], dict[str, Any]]:
        def verify(context: StageContext) -> dict[str, Any]:
            self.hook(f"{feature}:verify")
            return {"feature": feature, "passed": True}

        return verify


def start(engine: Engine) -> Run:
    """A new coordinator run."""
    return engine.start_run(
        COORDINATOR, params={"release": "2.0"}, labels={"example": "coordinator"}
    )


def coordinate(engine: Engine, run: Run, hook: Hook = _no_hook) -> Run:
    """Drive `run` to its end (a fresh run, or one `engine.resume` returned)."""
    sup = engine.supervisor()
    return sup.drive(run, Coordinator(engine, sup, hook).stages())


def stop_at(n: int) -> Hook:
    """A hook that, at its `n`-th point, says where it is and waits to be killed."""
    seen = {"points": 0}

    def hook(point: str) -> None:
        seen["points"] += 1
        if seen["points"] == n:
            print(f"stopped at {n} {point}", flush=True)
            sys.stdin.readline()
            os.kill(os.getpid(), signal.SIGKILL)  # if nobody killed it, it dies here anyway

    return hook


def killed_then_resumed(engine: Engine, url: str, at: int = 6) -> Run:
    """Run the coordinator in a child process on `url`, SIGKILL it at point `at`, resume here.

    The URL (which may hold a password) goes to the child in ``$STAGETRAIL_STORE``,
    never on its command line: every user of the machine can read a command line,
    only its owner a process's environment.
    """
    with subprocess.Popen(
        [sys.executable, "-m", "engine.cli.demo.coordinator", "--stop-at", str(at)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "STAGETRAIL_STORE": url},
    ) as child:  # fmt: skip
        assert child.stdout is not None
        run_id = UUID(child.stdout.readline().split()[-1])
        child.stdout.readline()  # "stopped at ..."
        child.kill()
    return coordinate(engine, engine.resume(run_id))


def record_all(engine: Engine, url: str | None = None) -> list[Run]:
    """A coordinator killed half-way (in a child process on `url`) and resumed.

    Without a URL another process can open (none, or ``memory://``), one clean run.
    """
    if url is None or url.startswith("memory:"):
        return [coordinate(engine, start(engine))]
    return [killed_then_resumed(engine, url)]


def main(argv: list[str]) -> None:
    """``[STORE_URL] [--stop-at N]``: drive a new coordinator run."""
    url = argv[0] if argv and not argv[0].startswith("--") else None
    hook = stop_at(int(argv[argv.index("--stop-at") + 1])) if "--stop-at" in argv else _no_hook
    with Engine(url) as engine:
        run = start(engine)
        print(f"run {run.id}", flush=True)
        coordinate(engine, run, hook)
        print(run, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
