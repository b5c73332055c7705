"""Adapters to other frameworks, each behind its own optional extra.

``engine.integrations.langgraph`` (the ``langgraph`` extra) is LangGraph's
checkpointer on stagetrail, `StagetrailSaver`; ``engine.integrations.otel`` (the
``otel`` extra) exports runs as OpenTelemetry traces. Nothing here is imported by the
rest of stagetrail, and this package imports none of them, so stagetrail works
without the extras.
"""

from __future__ import annotations

__all__: list[str] = []
