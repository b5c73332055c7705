"""Every example, recorded into one store: what `stagetrail demo` runs."""

from __future__ import annotations

from engine import Engine, Run
from engine.cli.demo import agent_loop, code_review, coordinator, supervised_review, tool_calls


def record_all(engine: Engine, url: str | None = None) -> list[Run]:
    """Record every example's runs (`url` lets the coordinator be killed in a child process)."""
    return [
        *code_review.record_all(engine),
        *supervised_review.record_all(engine),
        *agent_loop.record_all(engine),
        *coordinator.record_all(engine, url),
        *tool_calls.record_all(engine),
    ]
