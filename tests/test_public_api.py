from __future__ import annotations

import importlib

import pytest

PACKAGES = [
    "engine",
    "engine.cli",
    "engine.cli.demo",
    "engine.errors",
    "engine.integrations",
    "engine.integrations.langgraph",
    "engine.integrations.otel",
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
        import engine.errors

        error = getattr(engine.errors, name)
        assert issubclass(error, engine.errors.StagetrailError)
        builtins = (ValueError, TypeError, LookupError, OSError, RuntimeError)
        assert issubclass(error, builtins)


LAYERS = ("events", "projections", "engine")
"""The packages whose errors `engine.errors` exposes (the command line's and the viewer's
own usage errors stay with them: `engine.errors` may not import upwards)."""
ABOVE = ("engine.cli", "engine.ui", "engine.integrations")


def library_modules() -> list[str]:
    """Every module of the library layers (below the command line, viewer and adapters)."""
    import pkgutil

    found = []
    for name in LAYERS:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            if not module.name.startswith(ABOVE):
                found.append(module.name)
    return found


def subclasses(root: type) -> set[type]:
    """Every subclass of `root`, at any depth."""
    found: set[type] = set()
    child: type
    for child in root.__subclasses__():
        found |= {child, *subclasses(child)}
    return found


class TestSurface:
    def test_the_engine_package_exports_at_most_32_names(self) -> None:
        """`engine` keeps to the nouns and the contract's errors; the rest lives with its owner."""
        import engine

        assert len(engine.__all__) <= 32
        for moved in ("Store", "VerifyReport", "RunState", "Compacted", "InvalidFork"):
            assert moved not in engine.__all__

    def test_every_error_is_importable_from_engine_errors(self) -> None:
        """Each StagetrailError subclass of the library layers is exported by `engine.errors`,
        and its contract errors are the same classes there as in `engine`."""
        import engine
        import engine.errors
        from engine.errors import StagetrailError

        for name in library_modules():
            importlib.import_module(name)
        errors = {e for e in subclasses(StagetrailError) if not e.__module__.startswith(ABOVE)}
        assert len(errors) > 30
        missing = sorted(e.__name__ for e in errors if e.__name__ not in engine.errors.__all__)
        assert missing == []
        for error in errors:
            assert getattr(engine.errors, error.__name__) is error
        for name in engine.__all__:
            if name in engine.errors.__all__:
                assert getattr(engine, name) is getattr(engine.errors, name)


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

        from engine import errors

        run_id = uuid.uuid4()
        examples = [
            errors.InvalidTransition("testing", "oops", ["completed"]),
            errors.ConcurrencyConflict(run_id, 3),
            errors.RunAlreadyExists(run_id),
            errors.RunNotFound(run_id, "memory://"),
            errors.StoreError("sqlite:///x.db", "gone"),
            errors.PipelineError("p", "empty"),
            errors.InvalidPayload("result", "result[0]", "is a set"),
            errors.InvalidEvent("steps", "must be at least 1"),
            errors.RunAlreadyFinished(run_id, "succeeded"),
            errors.InvalidRollback(run_id, 3, 1, "too deep"),
            errors.AttemptError(run_id, "build", "open"),
            errors.TaskError(run_id, "t", "unknown"),
            errors.EventFormatError("stagetrail:X", "unknown"),
            errors.StageGaveUp(run_id, "developer", 4, "max_retries=3", "BuildException", "cc"),
            errors.CircuitOpen(run_id, "developer", 120.0, "3 consecutive failures"),
            errors.RunStopped(run_id, "aborted_stuck", {"rule": "no_progress", "detected": "x"}),
            errors.StageNotDriven(run_id, "testing", ["developer"]),
            errors.AttemptTimeout(5.0, 7.5),
        ]
        for error in examples:
            copy = pickle.loads(pickle.dumps(error))
            assert type(copy) is type(error)
            assert str(copy) == str(error)
            assert copy.__dict__ == error.__dict__
