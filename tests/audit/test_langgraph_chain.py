"""A LangGraph thread's run is chained like any run, its link kept between puts."""

from __future__ import annotations

import pytest

pytest.importorskip("langgraph")

from engine import Engine
from engine.integrations.langgraph import StagetrailSaver
from engine.store.event_store import Store
from tests.integrations.test_langgraph import NODE, first_checkpoint


class TestSaverChain:
    def test_a_threads_run_is_intact_and_its_link_read_once(
        self, store_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Puts of one thread chain each event to the one before, reading the newest link
        from the store at most once for the thread, not once per put."""
        reads: list[int] = []
        original = Store.link_at

        def counted(self: Store, run_id: object, version: int) -> bytes:
            reads.append(version)
            return original(self, run_id, version)  # type: ignore[arg-type]

        monkeypatch.setattr(Store, "link_at", counted)
        with Engine(store_url) as engine:
            saver = StagetrailSaver(engine, ["a"])
            config = first_checkpoint(saver, "t")
            for index in range(5):
                saver.put_writes(config, [("log", [f"w{index}"])], f"task-{index}", NODE)
            (summary,) = engine.runs()
            report = engine.verify(summary.run_id)
            assert (report.ok, report.chain) == (True, "intact")
            assert len([v for v in reads if v > 0]) <= 1
