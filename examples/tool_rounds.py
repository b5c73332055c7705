"""A tool-calling loop driven by an explicit rounds table, with rollback and a round limit.

Follows design 004 ("State Machine Pipeline Architecture"): each tool-calling
round is a state, round outcomes (``tool_call``, ``answered``,
``error_occurred``, ``max_rounds_reached``) are the events that drive the
transitions, and the table is declared, not buried in a loop. A tool error is
mapped to ``error_occurred`` by ``RetryPolicy(outcomes={ToolError:
"error_occurred"})`` and routed to a recovery state that switches to a
fallback tool; a round that read stale data is rolled back and done again; the
round limit ends the loop in synthesis. ``RoundsTable`` keeps every round,
the rolled-back one included, for the audit.

Run it from the repository root: ``python examples/tool_rounds.py [STORE_URL]``
(default ``sqlite:///stagetrail.db``, the store ``stagetrail show`` reads).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any
from uuid import UUID

from engine import Engine, Outcome, Pipeline, RetryPolicy, StageContext
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


class Conversation:
    """The round processors of one conversation, sharing the tools they call."""

    def __init__(self) -> None:
        self.api, self.forecasts = "weather-api", 0

    def query(self, context: StageContext) -> Outcome:
        """The initial query: this question needs tools."""
        return Outcome("tool_call", {"question": context.params["question"]})

    def round(self, context: StageContext) -> Outcome:
        """Call the next tool; stop at the round limit (rolled-back rounds do not count)."""
        number = 1 + sum(1 for f in context.stack.frames if f.stage == "round" and not f.failed)
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


def main(url: str = "sqlite:///stagetrail.db") -> list[UUID]:
    """Record one conversation and print its rounds table."""
    time = SimulatedTime()
    with Engine(url) as engine:
        sup = engine.supervisor(
            retry=RetryPolicy(outcomes={ToolError: "error_occurred"}),
            clock=time.clock,
            sleep=time.sleep,
        )
        chat, question = Conversation(), "Will it rain in Lyon tomorrow? Should I bike?"
        run = engine.start_run(ROUNDS, params={"question": question})
        for _ in range(3):  # one move at a time, to look at each round as it ends
            found = sup.step(run, chat.stages())
        if found.get("age_hours", 0) > 6:
            run.rollback(1, reason=f"round 2 read a forecast {found['age_hours']} h old")
        sup.drive(run, chat.stages())
        rounds = engine.project(run.id, RoundsTable)
        print(f"run {run.id} ended {run.status} in state {run.state}")
        for r in rounds.rounds:
            what = r.error if r.error else (r.result or {}).get("tool", "")
            undone = f"  rolled back: {r.rolled_back.reason}" if r.rolled_back else ""
            print(f"  {r.number}  {r.stage:9} {r.outcome:18} {what}{undone}".rstrip())
        return [run.id]


if __name__ == "__main__":
    main(*sys.argv[1:2])
