"""`stagetrail demo`: the example pipelines shipped in the package, and the command that
records them all (`record_all`) and prints what was recorded (`run_demo`).

Each example is a runnable module: ``python -m engine.cli.demo.code_review [STORE_URL]``.
"""

from __future__ import annotations

from engine.cli.demo.command import run_demo
from engine.cli.demo.record import record_all

__all__ = ["record_all", "run_demo"]
