from __future__ import annotations

import importlib

import pytest

PACKAGES = [
    "engine",
    "engine.cli",
    "engine.cli.demo",
    "engine.integrations",
    "engine.integrations.langgraph",
    "engine.store",
    "engine.supervise",
    "engine.ui",
    "events",
    "projections",
]


class TestExports:
    @pytest.mark.parametrize("package", PACKAGES)
    def test_all_is_sorted_and_importable(self, package: str) -> None:
        """Every name in __all__ imports, and __all__ is sorted."""
        module = importlib.import_module(package)
        names = list(module.__all__)
        assert names == sorted(names)
        for name in names:
            assert getattr(module, name) is not None

    def test_the_design_contract_imports(self) -> None:
        """The documented imports of the recording core work."""
        from engine import (  # noqa: F401
            ConcurrencyConflict,
            Engine,
            InvalidTransition,
            Pipeline,
            RunNotFound,
            StagetrailError,
            StoreError,
        )

        assert issubclass(InvalidTransition, StagetrailError)
        assert issubclass(InvalidTransition, ValueError)

    def test_the_supervisor_contract_imports(self) -> None:
        """The supervisor's documented imports work, and engine.supervisor() builds one."""
        from engine import (
            CircuitBreaker,
            CircuitOpen,
            Engine,
            Outcome,
            ProgressPolicy,
            RetryPolicy,
            StageGaveUp,
            Supervisor,
        )

        with Engine("memory://") as engine:
            sup = engine.supervisor(
                retry=RetryPolicy(max_retries=3, delay=1.0, backoff=2.0, max_delay=60,
                                  jitter=0.1, timeout=600),
                breaker=CircuitBreaker(fail_max=3, reset_timeout=300),
                progress=ProgressPolicy.strict(max_steps=50),
            )  # fmt: skip
        assert isinstance(sup, Supervisor)
        assert Outcome("needs_refactor").outcome == "needs_refactor"
        assert issubclass(StageGaveUp, RuntimeError)
        assert issubclass(CircuitOpen, RuntimeError)

    @pytest.mark.parametrize(
        "name",
        [
            "InvalidTransition",
            "ConcurrencyConflict",
            "RunNotFound",
            "StoreError",
            "PipelineError",
            "InvalidPayload",
            "InvalidEvent",
            "RunAlreadyFinished",
            "RunAlreadyExists",
            "InvalidRollback",
            "AttemptError",
            "TaskError",
            "StageGaveUp",
            "CircuitOpen",
            "RunStopped",
            "StageNotDriven",
            "AttemptTimeout",
        ],
    )
    def test_errors_share_one_root_and_a_builtin(self, name: str) -> None:
        """Every error is a StagetrailError and also a builtin exception type."""
        import engine

        error = getattr(engine, name)
        assert issubclass(error, engine.StagetrailError)
        builtins = (ValueError, TypeError, LookupError, OSError, RuntimeError)
        assert issubclass(error, builtins)


class TestDocstrings:
    @pytest.mark.parametrize("package", PACKAGES)
    def test_every_public_object_has_a_docstring(self, package: str) -> None:
        """Each exported class and function carries a docstring."""
        module = importlib.import_module(package)
        for name in module.__all__:
            value = getattr(module, name)
            if callable(value) and not isinstance(value, str):
                assert (value.__doc__ or "").strip(), f"{package}.{name} has no docstring"


class TestErrorsCrossProcesses:
    def test_every_error_survives_pickling(self) -> None:
        """Errors keep their message, type and facts through pickle (worker processes)."""
        import pickle
        import uuid

        import engine
        from events import EventFormatError

        run_id = uuid.uuid4()
        examples = [
            engine.InvalidTransition("testing", "oops", ["completed"]),
            engine.ConcurrencyConflict(run_id, 3),
            engine.RunAlreadyExists(run_id),
            engine.RunNotFound(run_id, "memory://"),
            engine.StoreError("sqlite:///x.db", "gone"),
            engine.PipelineError("p", "empty"),
            engine.InvalidPayload("result", "result[0]", "is a set"),
            engine.InvalidEvent("steps", "must be at least 1"),
            engine.RunAlreadyFinished(run_id, "succeeded"),
            engine.InvalidRollback(run_id, 3, 1, "too deep"),
            engine.AttemptError(run_id, "build", "open"),
            engine.TaskError(run_id, "t", "unknown"),
            EventFormatError("stagetrail:X", "unknown"),
            engine.StageGaveUp(run_id, "developer", 4, "max_retries=3", "BuildException", "cc"),
            engine.CircuitOpen(run_id, "developer", 120.0, "3 consecutive failures"),
            engine.RunStopped(run_id, "aborted_stuck", {"rule": "no_progress", "detected": "x"}),
            engine.StageNotDriven(run_id, "testing", ["developer"]),
            engine.AttemptTimeout(5.0, 7.5),
        ]
        for error in examples:
            copy = pickle.loads(pickle.dumps(error))
            assert type(copy) is type(error)
            assert str(copy) == str(error)
            assert copy.__dict__ == error.__dict__
