"""LangGraph checkpoints kept as stagetrail events (the ``langgraph`` extra).

``from engine.integrations.langgraph import StagetrailSaver``; nothing else in
stagetrail imports LangGraph.
"""

from __future__ import annotations

from engine.integrations.langgraph.saver import THREAD_LABEL, StagetrailSaver, thread_run_ids
from engine.integrations.langgraph.table import HUB, thread_pipeline

__all__ = ["HUB", "StagetrailSaver", "THREAD_LABEL", "thread_pipeline", "thread_run_ids"]
