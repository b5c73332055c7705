"""`stagetrail demo`: the example pipelines shipped in the package, and the command that
records them all (`record_all`) and prints what was recorded (`run_demo`).

Each example is a runnable module: ``python -m engine.cli.demo.code_review [STORE_URL]``.
The package imports none of them itself (its names are resolved on first use): a
module run with ``-m`` must not be imported by its package first, or Python warns
that it found it in ``sys.modules``, and would run a second copy of it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.cli.demo.command import run_demo
    from engine.cli.demo.record import record_all

__all__ = ["record_all", "run_demo"]

_HOMES = {"record_all": "engine.cli.demo.record", "run_demo": "engine.cli.demo.command"}


def __getattr__(name: str) -> Any:
    """`record_all` and `run_demo`, imported from their modules on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
