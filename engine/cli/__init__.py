"""The `stagetrail` command line: `main` is the entry point, one module per command group."""

from __future__ import annotations

from engine.cli.main import main

__all__ = ["main"]
