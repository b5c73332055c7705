"""LangGraph checkpoints kept as stagetrail events (the ``langgraph`` extra).

``from engine.integrations.langgraph import StagetrailSaver``; nothing else in
stagetrail imports LangGraph. The names are loaded on first use, so that the
value reader (`engine.integrations.langgraph.values`, which needs no LangGraph)
loads without LangGraph's own start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.integrations.langgraph.saver import THREAD_LABEL, StagetrailSaver, thread_run_ids
    from engine.integrations.langgraph.table import HUB, thread_pipeline

__all__ = ["HUB", "StagetrailSaver", "THREAD_LABEL", "thread_pipeline", "thread_run_ids"]

_HOMES = {
    "HUB": "table",
    "StagetrailSaver": "saver",
    "THREAD_LABEL": "saver",
    "thread_pipeline": "table",
    "thread_run_ids": "saver",
}


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
