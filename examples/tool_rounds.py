"""A tool-calling loop driven by an explicit rounds table, with rollback and a round limit.

Follows design 004 ("State Machine Pipeline Architecture"): each tool-calling
round is a state, round outcomes (``tool_call``, ``answered``,
``error_occurred``, ``max_rounds_reached``) are the events that drive the
transitions, and the table is declared, not buried in a loop. A tool error is
mapped to ``error_occurred`` by ``RetryPolicy(outcomes={ToolError:
"error_occurred"})`` and routed to a recovery state that switches to a
fallback tool. A round that finds an earlier round read stale data gives up,
and the supervisor's ``on_give_up`` hook answers ``Rollback(1, reason)``: the
misleading round is undone and ``drive`` does it again (the design's
orchestrator-level "attempt rollback"). The round limit ends the loop in
synthesis, and ``ProgressPolicy(max_steps=12)`` is the design's
``max_iterations`` safety valve. ``RoundsTable`` keeps every round, the
rolled-back one included, for the audit.

Run it from the repository root: ``python examples/tool_rounds.py [STORE_URL]``
(default ``sqlite:///stagetrail.db``, the store ``stagetrail show`` reads).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any
from uuid import UUID

from engine import (
    Engine,
    Outcome,
    Pipeline,
    ProgressPolicy,
    RetryPolicy,
    Rollback,
    StageContext,
    StageGaveUp,
)
from engine.cli.demo.simulated import SimulatedTime
from projections import RoundsTable

ROUNDS = Pipeline(
    "tool-rounds",
    initial="query",
    transitions=[
        ("query", "tool_call", "round"),
        ("query", "direct_response", "synthesis"),
        ("round", "tool_call", "round"),
        ("round", "answered", "synthesis"),
        ("round", "max_rounds_reached", "synthesis"),
        ("round", "error_occurred", "recover"),
        ("recover", "completed", "round"),
        ("synthesis", "completed", "done"),
    ],
    final=["done"],
)
MAX_ROUNDS = 4
PLAN = ["search", "forecast", "hourly", "radar", "air_quality"]  # the tools the model asks for


class ToolError(Exception):
    """A tool call failed."""


class StaleRound(Exception):
    """An earlier round read data too old to answer from."""


class Conversation:
    """The round processors of one conversation, sharing the tools they call."""

    def __init__(self) -> None:
        self.api, self.forecasts = "weather-api", 0

    def query(self, context: StageContext) -> Outcome:
        """The initial query: this question needs tools."""
        return Outcome("tool_call", {"question": context.params["question"]})

    def round(self, context: StageContext) -> Outcome:
        """Call the next tool; stop at the round limit (rolled-back rounds do not count)."""
        done = [f for f in context.stack.frames if f.stage == "round" and not f.failed]
        stale = [f.result for f in done if f.result and f.result.get("age_hours", 0) > 6]
        if stale:
            old = stale[0]
            raise StaleRound(f"round {old['round']} read a forecast {old['age_hours']} h old")
        number = 1 + len(done)
        tool = PLAN[number - 1]
        found = {"round": number, "tool": tool, "api": self.api}
        if tool == "forecast" and self.api == "weather-api":
            self.forecasts += 1
            if self.forecasts > 1:
                raise ToolError("weather-api returned HTTP 503")
            found["age_hours"] = 30  # a cached forecast
        if number == MAX_ROUNDS:
            return Outcome("max_rounds_reached", found)
        return Outcome("tool_call", found)

    def recover(self, context: StageContext) -> dict[str, Any]:
        """Switch to the fallback weather API after a tool error."""
        failed = context.stack.top
        self.api = "backup-weather"
        return {"switched_to": self.api, "after": failed.error if failed else None}

    def synthesis(self, context: StageContext) -> dict[str, Any]:
        """Answer from the rounds still on the stack."""
        tools = [f.result["tool"] for f in context.stack.frames if f.stage == "round" and f.result]
        return {"answer": "light rain after 16:00, bike in the morning", "tools": tools}

    def stages(self) -> dict[str, Callable[[StageContext], Any]]:
        """The processor of each state."""
        return {
            "query": self.query,
            "round": self.round,
            "recover": self.recover,
            "synthesis": self.synthesis,
        }


def undo_stale_round(context: StageContext, gave_up: StageGaveUp) -> Rollback | None:
    """The orchestrator's recovery: a stale round is rolled back and done again."""
    if gave_up.error_type == StaleRound.__name__:
        return Rollback(1, reason=gave_up.error)
    return None  # anything else: the run finishes failed


def main(url: str = "sqlite:///stagetrail.db") -> list[UUID]:
    """Record one conversation and print its rounds table."""
    time = SimulatedTime()
    with Engine(url) as engine:
        sup = engine.supervisor(
            retry=RetryPolicy(outcomes={ToolError: "error_occurred"}),
            progress=ProgressPolicy(max_steps=12),
            on_give_up=undo_stale_round,
            clock=time.clock,
            sleep=time.sleep,
        )
        question = "Will it rain in Lyon tomorrow? Should I bike?"
        run = engine.start_run(ROUNDS, params={"question": question})
        sup.drive(run, Conversation().stages())
        rounds = engine.project(run.id, RoundsTable)
        print(f"run {run.id} ended {run.status} in state {run.state}")
        print(f"  question: {run.params['question']}")
        for r in rounds.rounds:
            what = r.error if r.error else (r.result or {}).get("tool", "")
            undone = f"  rolled back: {r.rolled_back.reason}" if r.rolled_back else ""
            print(f"  {r.number}  {r.stage:9} {r.outcome:18} {what}{undone}".rstrip())
        return [run.id]


if __name__ == "__main__":
    main(*sys.argv[1:2])
