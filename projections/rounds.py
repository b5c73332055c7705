"""Every round of a run, rolled back or not: the audit trail `StateStack` forgets.

In a loop driven by a rounds table (a tool-calling conversation, a review cycle)
each stage outcome is a round. `StateRolledBack(steps=k)` pops the `k` newest
outcomes off the `StateStack`, which then forgets them; `RoundsTable` keeps them
and marks each one with the version and reason of the rollback that undid it.

Rounds live in persistent lists (every round as recorded, the live ones overall and
per stage), rollbacks' marks in a hash-trie map by round number: recording a round
costs the same at any length, and a rollback of `k` steps costs O(k). An outcome
that took its table's hub's implicit route (`events.table.implicit_route`) is two
rounds, as it is two frames of the stack: the route's (a decided outcome of the hub,
attempt 0) and its own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime
from sys import intern
from typing import Any

import attrs

from events import (
    DECIDED,
    JSON,
    Event,
    RunStarted,
    StageCompleted,
    StageFailed,
    StateRolledBack,
)
from events.table import Lookup, as_rows, from_rows, hub_of, implicit_route, initial_state, lookup
from events.values import build, evolve, maker
from projections.base import Projection, folds_with, on
from projections.immutable import ROWS_PER_BLOCK, PList, PMap, RowList
from projections.interning import interned
from projections.stretches import folded_in_stretches


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class Rollback:
    """The `StateRolledBack` that undid a round: its version and reason."""

    version: int
    reason: str


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class Round:
    """One stage outcome, numbered in recording order, and the rollback that undid it."""

    number: int
    stage: str
    attempt: int
    outcome: str
    result: JSON
    error: str | None
    error_type: str | None
    version: int
    timestamp: datetime
    rolled_back: Rollback | None = None

    @property
    def failed(self) -> bool:
        """Whether the round was a `StageFailed`."""
        return self.error_type is not None


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class HubTable:
    """A table's hub, and what says where a run is: the table as a lookup, its initial state."""

    name: str
    moves: Lookup = attrs.field(factory=dict, repr=False)
    initial: str | None = None


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class Rounds:
    """Every round of a run, oldest first, with the live ones (not rolled back) indexed.

    Rounds are kept as recorded (`history`, `rolled_back` None), each rollback's mark in
    `marks` by round number: a round is recorded with a push onto three lists, not an
    update of a map as long as the run.
    """

    history: PList[Round] = attrs.field(factory=PList)
    marks: PMap[int, Rollback] = attrs.field(factory=PMap)
    """The rollback that undid each rolled-back round, by its number."""
    live_rounds: PList[Round] = attrs.field(factory=PList)
    live_by_stage: PMap[str, PList[Round]] = attrs.field(factory=PMap)
    hub: HubTable | None = None
    """The run's table, if it declares a hub (its implicit routes are rounds too)."""

    @property
    def rounds(self) -> tuple[Round, ...]:
        """Every round, oldest first, rolled back or not."""
        marks = self.marks
        if not marks:
            return self.history.to_tuple()
        return tuple(
            round_ if (mark := marks.get(round_.number)) is None else _marked(round_, mark)
            for round_ in self.history
        )

    @property
    def table(self) -> PMap[int, Round]:
        """Every round by its number (a map made when asked for)."""
        return PMap((round_.number, round_) for round_ in self.rounds)

    @property
    def live(self) -> tuple[Round, ...]:
        """The rounds not rolled back, oldest first (the outcomes `StateStack` holds)."""
        return self.live_rounds.to_tuple()

    @property
    def live_numbers(self) -> PList[int]:
        """The numbers of the live rounds, oldest first."""
        return PList.of([round_.number for round_ in self.live_rounds])

    @property
    def rolled_back(self) -> tuple[Round, ...]:
        """The rounds a rollback undid, oldest first."""
        return tuple(round_ for round_ in self.rounds if round_.rolled_back is not None)

    def latest(self, stage: str) -> Round | None:
        """The newest round of `stage` not rolled back, or None."""
        rounds = self.live_by_stage.get(stage)
        return None if rounds is None else rounds.last

    def __len__(self) -> int:
        return len(self.history)

    def current(self, hub: HubTable) -> str | None:
        """The state the newest live round led to by `hub`'s table (its initial state first)."""
        newest = self.live_rounds.last
        if newest is None:
            return hub.initial
        return hub.moves.get((newest.stage, newest.outcome))


class RoundsTable(Projection[Rounds]):
    """A round per stage outcome (and per hub's implicit route it took); rollbacks mark rounds
    as rolled back instead of dropping them."""

    scope = "run"

    def initial(self) -> Rounds:
        """No rounds yet."""
        return Rounds()

    @on(RunStarted)
    def started(self, state: Rounds, event: RunStarted) -> Rounds:
        """Keep the table's hub (and its lookup, for implicit routes) if it declares one."""
        hub = hub_of(event.table)
        if hub is None:
            return state
        table = HubTable(hub, lookup(event.table), initial_state(event.table))
        return evolve(state, hub=table)

    @on(StageCompleted)
    def completed(self, state: Rounds, event: StageCompleted) -> Rounds:
        """Record a round holding the stage's result."""
        return _record(state, event, result=event.result, error=None, error_type=None)

    @on(StageFailed)
    def failed(self, state: Rounds, event: StageFailed) -> Rounds:
        """Record a round holding the stage's error."""
        return _record(state, event, result=None, error=event.error, error_type=event.error_type)

    @on(StateRolledBack)
    def rolled_back(self, state: Rounds, event: StateRolledBack) -> Rounds:
        """Mark the newest `steps` live rounds as rolled back (rolled-back ones are skipped)."""
        mark = build(Rollback, {"version": event.version, "reason": event.reason})
        marks, live, by_stage = state.marks, state.live_rounds, state.live_by_stage
        for _ in range(min(event.steps, len(live))):
            round_ = live.last
            assert round_ is not None
            live = live.pop()
            marks = marks.set(round_.number, mark)
            # The newest live round overall is also the newest live round of its stage.
            stage_live = by_stage[round_.stage].pop()
            by_stage = (
                by_stage.set(round_.stage, stage_live)
                if len(stage_live)
                else by_stage.delete(round_.stage)
            )
        return evolve(state, marks=marks, live_rounds=live, live_by_stage=by_stage)

    def _fold(self, events: Iterable[Event], current: Rounds, tick: Callable[[], None]) -> Rounds:
        """`Projection._fold`, each stretch of outcomes of a run without a hub recorded into
        one `Rounds` at its end: its lists and its map of live rounds by stage are made once
        per stretch, not once per outcome (a long loop's every event); each round is made as
        `completed` and `failed` make it. The same state as `apply` event after event."""
        if not folds_with(self, RoundsTable, StageCompleted, StageFailed):
            return Projection._fold(self, events, current, tick)  # a subclass: its own way
        return folded_in_stretches(self.name, self.apply, _begun, events, current, tick)

    def encode(self, state: Rounds) -> JSON:
        """Every round as a JSON object, oldest first (timestamps in ISO 8601), and the hub."""
        return {
            "rounds": [encode_round(round_) for round_ in state.rounds],
            "hub": None if state.hub is None else state.hub.name,
            "moves": [] if state.hub is None else as_rows(state.hub.moves),
            "initial": None if state.hub is None else state.hub.initial,
        }

    def decode(self, data: JSON) -> Rounds:
        """The rounds `encode` turned into `data`."""
        rounds = [decode_round(row) for row in data["rounds"]]
        history = [evolve(round_, rolled_back=None) for round_ in rounds]
        live = [round_ for round_ in rounds if round_.rolled_back is None]
        by_stage: defaultdict[str, list[Round]] = defaultdict(list)
        for round_ in live:
            by_stage[round_.stage].append(round_)
        return Rounds(
            history=PList.of(history),
            marks=PMap(
                (round_.number, round_.rolled_back)
                for round_ in rounds
                if round_.rolled_back is not None
            ),
            live_rounds=PList.of(live),
            live_by_stage=PMap({stage: PList.of(found) for stage, found in by_stage.items()}),
            hub=_hub_table(data),
        )


def encode_round(round_: Round) -> dict[str, JSON]:
    """A round as a JSON object: its fields, the timestamp in ISO 8601."""
    data: dict[str, Any] = attrs.asdict(round_, recurse=False)
    data["timestamp"] = round_.timestamp.isoformat()
    mark = round_.rolled_back
    data["rolled_back"] = None if mark is None else {"version": mark.version, "reason": mark.reason}
    return data


def decode_round(data: dict[str, Any]) -> Round:
    """The round `encode_round` turned into `data`."""
    mark = data["rolled_back"]
    return build(
        Round,
        {
            **data,
            "timestamp": datetime.fromisoformat(data["timestamp"]),
            "rolled_back": None if mark is None else build(Rollback, dict(mark)),
        },
    )


def _record(
    state: Rounds,
    event: StageCompleted | StageFailed,
    *,
    result: JSON,
    error: str | None,
    error_type: str | None,
) -> Rounds:
    hub = state.hub
    if hub is not None and event.stage != hub.name and _took_route(state, hub, event.stage):
        state = _route(state, hub.name, event)
    # Names and error text interned (inline: this runs per outcome): a long run's rounds
    # repeat a few of them, and each event read brings its own copy of each.
    stage, outcome = event.stage, event.outcome
    stage = intern(stage) if stage.__class__ is str else stage
    outcome = intern(outcome) if outcome.__class__ is str else outcome
    if error is not None:
        error, error_type = interned(error), interned(error_type)
    row = (
        len(state.history) + 1, stage, event.attempt, outcome, result, error, error_type,
        event.version, event.timestamp, None,
    )  # fmt: skip
    return _added(state, row)


class _Stretch:
    """Outcomes recorded into `Rounds` without a hub (`RoundsTable._fold`), made when asked for:
    each round's row (as `_record` makes it) put in a buffer, and the buffer's rows pushed a
    block at a time in place onto the newest blocks of the lists the rounds go in
    (`RoundList`); no round, list or cell made per outcome."""

    __slots__ = (
        "first", "history", "live", "mixed", "names", "number", "rows", "seal", "stages", "start",
    )  # fmt: skip

    def __init__(self, start: Rounds) -> None:
        self.start, self.number = start, len(start.history)
        self.seal: list[Any] = [None, None]
        """The rows of the block a list of the stretch sealed last, and what it sealed."""
        self.history = _Growing(start.history, self.seal)
        self.live = _Growing(start.live_rounds, self.seal)
        self.stages: dict[str, _Growing] = {}
        """Each stage's live rounds grown, by stage."""
        self.rows: list[Any] = []
        """The rows not pushed yet, flat (at most a block of them)."""
        self.names: tuple[Any, Any] = (_NO_NAME, _NO_NAME)
        """The newest round's stage and outcome (interned): a loop's repeat them."""
        self.first: Any = _NO_NAME
        """The stage of the buffer's first row."""
        self.mixed = False
        """Whether the buffer holds rows of more than one stage."""

    def took(self, event: StageCompleted | StageFailed) -> bool:
        """Record the round of `event` as `_record` does (always taken)."""
        stage, outcome = event.stage, event.outcome
        names = self.names
        if stage == names[0] and outcome == names[1]:  # the newest round's: no interning
            stage, outcome = names
        else:
            stage = intern(stage) if stage.__class__ is str else stage
            outcome = intern(outcome) if outcome.__class__ is str else outcome
            self.names = (stage, outcome)
        if stage != self.first:
            if self.first is _NO_NAME:
                self.first = stage
            else:
                self.mixed = True
        if event.__class__ is StageFailed:
            result, error, error_type = None, event.error, event.error_type
            if error is not None:
                error, error_type = interned(error), interned(error_type)
        else:
            result, error, error_type = event.result, None, None  # type: ignore[union-attr]
        self.number = number = self.number + 1
        rows = self.rows
        rows += (
            number, stage, event.attempt, outcome, result, error, error_type, event.version,
            event.timestamp, None,
        )  # fmt: skip
        if len(rows) == _BLOCK:
            self._flush()
        return True

    def _flush(self) -> None:
        """Push the buffer's rows onto every list their rounds go in, and empty it."""
        rows = self.rows
        if not rows:
            return
        self.history.extend(rows)
        self.live.extend(rows)
        if self.mixed:
            parts: dict[Any, list[Any]] = {}
            for at in range(0, len(rows), _WIDTH):
                parts.setdefault(rows[at + 1], []).extend(rows[at : at + _WIDTH])
        else:
            parts = {self.first: rows}
        stages = self.stages
        for stage, part in parts.items():
            growing = stages.get(stage)
            if growing is None:
                live = self.start.live_by_stage.get(stage, _NONE_LIVE)
                growing = stages[stage] = _Growing(live, self.seal)
            growing.extend(part)
        self.rows, self.first, self.mixed = [], _NO_NAME, False

    def made(self) -> Rounds:
        """The rounds with the outcomes recorded."""
        self._flush()
        start = self.start
        by_stage = start.live_by_stage
        for stage, growing in self.stages.items():
            by_stage = by_stage.set(stage, growing.made())
        return _ROUNDS(self.history.made(), start.marks, self.live.made(), by_stage, start.hub)


class _Growing:
    """A list of rounds a stretch pushes rows onto in place (`RowList.parts`), made back
    into a `RoundList` when asked for."""

    __slots__ = ("blocks", "cells", "seal", "size", "tip", "used")

    def __init__(self, rounds: PList[Round], seal: list[Any]) -> None:
        self.cells, self.size, self.tip, self.used, self.blocks = RoundList.on(rounds).parts()
        self.seal = seal  # the stretch's: its lists mostly seal the same rows (`sealed`)

    def extend(self, rows: list[Any]) -> None:
        """Push the rounds of `rows` (their fields, flat, at most a block of them), oldest
        first, as `RowList.push_row` pushes each."""
        tip, used, blocks = self.tip, self.used, self.blocks
        count = len(rows)
        room = _BLOCK - used
        if count > room:  # the newest block fills up: it goes below, a new one starts
            if room:
                tip = self._extended(tip, used, rows[:room])
            blocks, tip, used = self.sealed(tip[:_BLOCK], blocks), [], 0
            rows = rows[room:]
        self.tip = self._extended(tip, used, rows)
        self.used, self.blocks = used + len(rows), blocks
        self.size += count // _WIDTH

    def sealed(self, full: list[Any], blocks: Any) -> Any:
        """`blocks` with the block of rows `full` sealed on top (`RowList.sealed`): the
        stretch's lists push the same rows (all its rounds, the live ones, a loop's stage's),
        so a block another of them sealed from equal rows (the same events') is shared."""
        seal = self.seal
        if full == seal[0]:
            rows, _, packed = seal[1]
            return (rows, blocks, packed)
        seal[0], seal[1] = full, RoundList.sealed(full[:], blocks)
        return seal[1]

    @staticmethod
    def _extended(tip: list[Any], used: int, rows: list[Any]) -> list[Any]:
        """`tip` (`used` values of it this list's) with `rows` after them: appended in place
        while this list owns its end, else a copy."""
        tip.extend(rows)
        if len(tip) != used + len(rows):  # another list went on from it at the same moment
            tip = tip[:used] + rows
        return tip

    def made(self) -> PList[Round]:
        """The list with the rounds pushed."""
        return RoundList.of_parts(self.cells, self.size, self.tip, self.used, self.blocks)


def _begun(rounds: Rounds) -> _Stretch | None:
    """The stretch of outcomes from `rounds` (None: a hub's, whose handlers take each one)."""
    return _Stretch(rounds) if rounds.hub is None else None


def _took_route(state: Rounds, hub: HubTable, stage: str) -> bool:
    """Whether an outcome of `stage` now takes `hub`'s implicit route."""
    routed_to = hub.moves.get((hub.name, stage))
    return implicit_route(hub.name, state.current(hub) or "", stage, routed_to)


def _hub_table(data: Any) -> HubTable | None:
    """The `HubTable` `RoundsTable.encode` wrote into `data` (None: no hub, or none kept)."""
    name = data.get("hub")
    if name is None:
        return None
    return HubTable(name, from_rows(data.get("moves", ())), data.get("initial"))


def _route(state: Rounds, hub: str, event: StageCompleted | StageFailed) -> Rounds:
    """`state` with the round of `hub`'s implicit route that `event` took (a decided outcome)."""
    number, stage = len(state.history) + 1, interned(event.stage)
    row = (
        number, interned(hub), DECIDED, stage, None, None, None, event.version, event.timestamp,
        None,
    )  # fmt: skip
    return _added(state, row)


def _added(state: Rounds, row: tuple[Any, ...]) -> Rounds:
    """`state` with the round of `row` (its fields) recorded, the newest live round."""
    by_stage, stage = state.live_by_stage, row[1]
    return _ROUNDS(
        RoundList.on(state.history).push_row(row),
        state.marks,
        RoundList.on(state.live_rounds).push_row(row),
        by_stage.set(stage, RoundList.on(by_stage.get(stage, _NONE_LIVE)).push_row(row)),
        state.hub,
    )


def _marked(round_: Round, mark: Rollback) -> Round:
    """`round_` as a rollback marked it."""
    return evolve(round_, rolled_back=mark)


# Positional: a fold builds two per outcome (`maker`), in the fields' declared order.
_ROUND = maker(Round)
_ROUNDS = maker(Rounds)
_NONE_LIVE: PList[Round] = PList()
_FIELDS = tuple(field.name for field in attrs.fields(Round))
_WIDTH = len(_FIELDS)
_BLOCK = _WIDTH * ROWS_PER_BLOCK
"""The values of a full block of rows."""
_NO_NAME: Any = object()
"""A name no event gives: a stretch's newest stage and outcome before its first."""


class RoundList(RowList[Round]):
    """Rounds, the newest kept as rows of their fields (`RowList`): a fold pushes a row per
    outcome onto each list the round is in, and a round is made from it when read."""

    __slots__ = ()

    fields = _FIELDS
    version_at = _FIELDS.index("version")
    frozen_at = _FIELDS.index("result")
    make = staticmethod(_ROUND)
