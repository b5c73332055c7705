"""Random histories: the folds of stage outcomes (`StateStack`, `StageResults`, `RoundsTable`)
against plain lists, and through their snapshots and encodings and on."""

from __future__ import annotations

import gc
import json
import pickle
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import Event, RunStarted, StageCompleted, StageFailed, StateRolledBack
from events.table import lookup
from projections import Attempt, Frame, Round, RoundsTable, StageResults, StateStack
from projections.base import Projection
from projections.immutable import ROWS_PER_BLOCK
from projections.rounds import Rollback, encode_round
from projections.stack import encode_frame
from tests._helpers import hub_table
from tests.projections._own_way import applied

RID = uuid.UUID(int=26)
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
STAGES = ["hub", "a", "b", "b_done", "x"]
OUTCOMES = ["completed", "failed", "a", "b", "stop"]

STEPS = st.lists(
    st.tuples(
        st.sampled_from(["done", "done", "fail", "back"]),
        st.sampled_from(STAGES),
        st.sampled_from(OUTCOMES),
        st.integers(min_value=0, max_value=2),
        st.integers(min_value=1, max_value=4),
    ),
    max_size=40,
)


def history(table: str, steps: list[tuple[str, str, str, int, int]]) -> list[Event]:
    """A run's events: its start (a table with a hub, without, or no start) and `steps`."""
    events: list[Event] = []
    if table != "none":
        pipeline = hub_table(hub=table == "hub")
        events.append(
            RunStarted(
                run_id=RID, version=1, timestamp=T0, pipeline="hubbed", table=pipeline.to_dict()
            )
        )
    for kind, stage, outcome, attempt, count in steps:
        version = len(events) + 1
        common: dict[str, Any] = {
            "run_id": RID, "version": version, "timestamp": T0 + timedelta(seconds=version)
        }  # fmt: skip
        if kind == "done":
            result = {"n": version} if version % 3 else None
            events.append(
                StageCompleted(
                    **common,
                    stage=stage,
                    outcome=outcome,
                    attempt=attempt,
                    result=result,
                    duration=0.5 * attempt,
                )
            )
        elif kind == "fail":
            events.append(
                StageFailed(
                    **common,
                    stage=stage,
                    outcome=outcome,
                    attempt=attempt + 1,
                    error=f"e{count}",
                    error_type=f"T{attempt}",
                )
            )
        else:
            events.append(StateRolledBack(**common, steps=count, reason=f"r{count}"))
    return events


def modelled(events: list[Event]) -> tuple[list[Frame], dict[str, list[Attempt]], list[Round]]:
    """The frames, attempts and rounds of a run without a hub, kept in plain lists."""
    table: dict[Any, str] = {}
    frames: list[Frame] = []
    attempts: dict[str, list[Attempt]] = {}
    rounds: list[Round] = []
    live: list[int] = []  # indexes of the rounds not rolled back
    for event in events:
        if isinstance(event, RunStarted):
            table = dict(lookup(event.table))
        elif isinstance(event, StateRolledBack):
            for _ in range(min(event.steps, len(frames))):
                frames.pop()
                index = live.pop()
                mark = Rollback(version=event.version, reason=event.reason)
                rounds[index] = attrs.evolve(rounds[index], rolled_back=mark)
        elif isinstance(event, StageCompleted | StageFailed):
            failed = isinstance(event, StageFailed)
            shared: dict[str, Any] = {
                "attempt": event.attempt,
                "outcome": event.outcome,
                "result": None if isinstance(event, StageFailed) else event.result,
                "error": event.error if isinstance(event, StageFailed) else None,
                "error_type": event.error_type if isinstance(event, StageFailed) else None,
                "version": event.version,
            }
            state = table.get((event.stage, event.outcome), event.stage)
            timed: dict[str, Any] = {"duration": event.duration, "failed": failed}
            frames.append(Frame(state, event.stage, timestamp=event.timestamp, **timed, **shared))
            if failed or event.attempt:
                attempt = Attempt(**timed, **shared)
                attempts.setdefault(event.stage, []).append(attempt)
            live.append(len(rounds))
            rounds.append(
                Round(
                    number=len(rounds) + 1, stage=event.stage, timestamp=event.timestamp, **shared
                )
            )
    return frames, attempts, rounds


def strict(data: Any) -> Any:
    """`data` through strict JSON text and back."""
    return json.loads(json.dumps(data, allow_nan=False))


def onwards(projection: Projection[Any], events: list[Event], cut: int) -> list[Any]:
    """The state of `events[:cut]` through a snapshot (restored), and through its encoding
    (decoded), each then folding the rest of `events`."""

    def source(gt: int, lte: int) -> Any:
        return iter([event for event in events if gt < event.version <= lte])

    state = projection.fold(events[:cut])
    ways = [
        projection.restore(strict(projection.snapshot(state)), source),
        projection.decode(strict(projection.encode(state))),
    ]
    return [projection.fold(events[cut:], way) for way in ways]


class TestOutcomeFolds:
    @settings(max_examples=150, deadline=None)
    @given(
        table=st.sampled_from(["hub", "strict", "none"]),
        steps=STEPS,
        cut=st.integers(min_value=0, max_value=45),
    )
    def test_folds_match_plain_lists_and_survive_snapshots(
        self, table: str, steps: list[tuple[str, str, str, int, int]], cut: int
    ) -> None:
        """Without a hub, each fold is the plain lists' (values, answers and JSON) and the live
        rounds are the stack's frames; with a hub or not, a state restored from its snapshot,
        or decoded from its encoding, folds on to the state of the whole history."""
        events = history(table, steps)
        stack = StateStack().fold(events)
        results = StageResults().fold(events)
        rounds = RoundsTable().fold(events)
        if table != "hub":
            assert [(r.stage, r.outcome, r.attempt, r.version) for r in rounds.live] == [
                (f.stage, f.outcome, f.attempt, f.version) for f in stack.frames
            ]
            frames, attempts, every = modelled(events)
            assert stack.frames == tuple(frames)
            assert StateStack().encode(stack)["frames"] == strict(list(map(encode_frame, frames)))
            assert results.stages == tuple(attempts)
            for stage in STAGES:
                assert results.attempts(stage) == tuple(attempts.get(stage, ()))
                done = [a for a in attempts.get(stage, ()) if not a.failed]
                assert results.latest(stage) == (done[-1].result if done else None)
            assert StageResults().encode(results) == strict(
                {stage: [attrs.asdict(a) for a in found] for stage, found in attempts.items()}
            )
            assert rounds.rounds == tuple(every)
            assert RoundsTable().encode(rounds)["rounds"] == strict(list(map(encode_round, every)))
            live = [r for r in every if r.rolled_back is None]
            assert rounds.live == tuple(live)
            assert rounds.rolled_back == tuple(r for r in every if r.rolled_back is not None)
            assert dict(rounds.table) == {r.number: r for r in every}
            assert list(rounds.live_numbers) == [r.number for r in live]
            for stage in STAGES:
                newest = [r for r in live if r.stage == stage]
                assert rounds.latest(stage) == (newest[-1] if newest else None)
        cut = min(cut, len(events))
        folded: list[tuple[Projection[Any], Any]] = [
            (StateStack(), stack),
            (StageResults(), results),
            (RoundsTable(), rounds),
        ]
        for projection, whole in folded:
            for again in onwards(projection, events, cut):
                assert again == whole
                assert projection.encode(again) == projection.encode(whole)

    @pytest.mark.parametrize("seed", range(6))
    def test_long_folds_with_json_results_match_plain_lists_across_sealed_blocks(
        self, seed: int
    ) -> None:
        """Runs of several blocks of outcomes whose results are dicts and lists, rollbacks
        reaching into sealed blocks: each fold is `apply`'s and the plain lists', pickled too,
        and the rows of its sealed blocks are no container the collector tracks."""
        chance = random.Random(seed)
        steps = [
            (
                chance.choice(["done"] * 19 + ["fail"] * 5 + ["back"]),
                chance.choice(["a", "a", "a", "b"]),
                chance.choice(OUTCOMES),
                chance.randint(0, 2),
                chance.randint(1, ROWS_PER_BLOCK // 5),
            )
            for _ in range(8 * ROWS_PER_BLOCK)
        ]
        events = [
            attrs.evolve(event, result=[{"n": event.version, "s": ["x", 0.5]}, event.version])
            if isinstance(event, StageCompleted) and event.version % 2
            else event
            for event in history(chance.choice(["strict", "none"]), steps)
        ]
        frames, attempts, every = modelled(events)
        stack, results, rounds = StateStack(), StageResults(), RoundsTable()
        for projection in (stack, results, rounds):
            folded = projection.fold(events)
            assert folded == applied(projection, events)
            assert pickle.loads(pickle.dumps(folded)) == folded
        folded_stack = stack.fold(iter(events))
        assert folded_stack.frames == tuple(frames)
        folded_results = results.fold(iter(events))
        for stage, found in attempts.items():
            assert folded_results.attempts(stage) == tuple(found)
        folded_rounds = rounds.fold(iter(events))
        assert folded_rounds.rounds == tuple(every)
        assert RoundsTable().encode(folded_rounds)["rounds"] == strict(
            list(map(encode_round, every))
        )
        gc.collect()
        lists = [folded_stack.frame_list, folded_rounds.history, *folded_results.by_stage.values()]
        blocks = [lists_blocks for rows in lists for lists_blocks in sealed_rows(rows)]
        assert blocks
        assert not any(gc.is_tracked(rows) for rows in blocks)


def sealed_rows(rows: Any) -> list[Any]:
    """The rows of each sealed block of a `RowList`, newest first."""
    found, blocks = [], rows.blocks
    while blocks is not None:
        found.append(blocks[0])
        blocks = blocks[1]
    return found
