"""LangGraph's own conformance suite against `StagetrailSaver` on every stagetrail backend."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

pytest.importorskip("langgraph.checkpoint.conformance", reason="needs the langgraph extra")

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    BASE_CAPABILITIES,
    EXTENDED_CAPABILITIES,
)

from engine import Engine
from engine.integrations.langgraph import StagetrailSaver


class TestConformance:
    def test_every_capability_passes(self, store_url: str) -> None:
        """Every base and extended capability of LangGraph's suite passes on this backend."""

        @checkpointer_test(name=f"StagetrailSaver[{store_url.split(':')[0]}]")
        async def saver() -> AsyncIterator[StagetrailSaver]:
            with Engine(store_url) as engine:
                yield StagetrailSaver(engine)

        report = asyncio.run(validate(saver))
        results = report.results
        failures = {name: result.failures for name, result in results.items() if not result.passed}
        assert failures == {}
        assert set(results) == {c.value for c in BASE_CAPABILITIES | EXTENDED_CAPABILITIES}
        assert all(result.detected and result.tests_failed == 0 for result in results.values())
