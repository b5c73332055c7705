"""A multi-round tool-calling conversation, modelled as a transition table.

An initial query either answers directly or calls tools; each tool round may
call tools again until it has enough (or reaches the round limit), then the
answer is synthesised. A tool error ends the conversation in ``failed``; a
round whose tool answer turns out to be stale is rolled back and done again.

Run it with ``python -m engine.cli.demo.tool_calls [STORE_URL]``.
"""

from __future__ import annotations

import sys
from typing import Any

from engine import Engine, Outcome, Pipeline, Run, StageContext

CONVERSATION = Pipeline(
    "tool-calling",
    initial="query",
    transitions=[
        ("query", "tool_call", "tool_round"),
        ("query", "direct_response", "synthesis"),
        ("tool_round", "tool_call", "tool_round"),
        ("tool_round", "enough", "synthesis"),
        ("tool_round", "failed", "failed"),
        ("synthesis", "completed", "answered"),
        ("*", "aborted", "aborted"),
    ],
    final=["answered", "failed", "aborted"],
)

MAX_ROUNDS = 3
"""Tool rounds allowed before the answer must be synthesised from what is known."""


class ToolError(Exception):
    """A tool call failed."""


def query(context: StageContext) -> Outcome:
    """Decide whether the question needs tools."""
    question = context.params["question"]
    if "weather" in question or "stock" in question:
        return Outcome("tool_call", {"tools": ["search"], "question": question})
    return Outcome("direct_response", {"answer": "Paris"})


def tool_round(context: StageContext) -> Outcome:
    """Call a tool; after MAX_ROUNDS rounds, go on with what has been found."""
    round_ = context.attempt
    if context.params.get("broken_tool") and round_ == 2:
        raise ToolError("search API returned HTTP 503")
    found = {"round": round_, "snippets": round_ * 2}
    if round_ >= MAX_ROUNDS or context.params.get("rounds", MAX_ROUNDS) <= round_:
        return Outcome("enough", found)
    return Outcome("tool_call", found)


def synthesis(context: StageContext) -> dict[str, Any]:
    """Write the answer from the newest results still on the stack."""
    latest = context.stack.all_latest_results()
    return {"answer": "sunny, 21°C", "sources": sorted(latest)}


STAGES = {"query": query, "tool_round": tool_round, "synthesis": synthesis}


def converse(engine: Engine, question: str, **params: Any) -> Run:
    """One conversation driven to its end (the table ends it on a failed tool call)."""
    run = engine.start_run(
        CONVERSATION, params={"question": question, **params}, labels={"example": "tool-calls"}
    )
    return engine.supervisor().drive(run, STAGES)


def converse_with_rollback(engine: Engine) -> Run:
    """A conversation whose second tool round is found stale, rolled back and done again."""
    run = engine.start_run(
        CONVERSATION, params={"question": "weather in Lyon?"}, labels={"example": "tool-calls"}
    )
    sup = engine.supervisor()
    sup.execute(run, "query", query, StageContext(engine, run, "query"))
    sup.execute(run, "tool_round", lambda: Outcome("tool_call", {"round": 1, "index": "fresh"}))
    sup.execute(run, "tool_round", lambda: Outcome("tool_call", {"round": 2, "index": "stale"}))
    run.rollback(1, reason="round 2 read a stale search index")
    sup.execute(run, "tool_round", lambda: Outcome("enough", {"round": 2, "index": "fresh"}))
    return sup.drive(run, STAGES)


def record_all(engine: Engine) -> list[Run]:
    """A direct answer, a round-limited tool conversation, a failed tool, a rolled-back round."""
    return [
        converse(engine, "capital of France?"),
        converse(engine, "weather in Paris tomorrow?", rounds=5),
        converse(engine, "stock price of ACME?", broken_tool=True),
        converse_with_rollback(engine),
    ]


if __name__ == "__main__":
    with Engine(sys.argv[1] if len(sys.argv) > 1 else None) as main_engine:
        for recorded in record_all(main_engine):
            print(recorded)
