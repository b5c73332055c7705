from __future__ import annotations

import io
import json
import math
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import attrs
import pytest

import events
from events import (
    DECIDED,
    EVENT_TYPES,
    BudgetSpent,
    Event,
    EventFormatError,
    InvalidEvent,
    InvalidPayload,
    NoteAdded,
    ProgressObserved,
    RunFinished,
    RunStarted,
    StageCompleted,
    StageFailed,
    StageStarted,
    decode,
    encode,
)

RUN = uuid.UUID("12345678-1234-5678-1234-567812345678")
WHEN = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)

EXAMPLES: dict[type[Event], dict[str, Any]] = {
    events.RunStarted: {
        "pipeline": "p",
        "table": {"name": "p"},
        "params": {"card": "C-1", "n": [1, 2.5]},
        "labels": {"team": "core"},
        "parent_run_id": uuid.UUID(int=7),
        "forked_from": (uuid.UUID(int=9), 17),
    },
    events.StageStarted: {"stage": "build", "attempt": 2},
    events.StageCompleted: {
        "stage": "build",
        "attempt": 1,
        "outcome": "needs_refactor",
        "result": {"files": ["a.py"], "ok": True, "none": None},
        "duration": 1.5,
    },
    events.StageFailed: {
        "stage": "build",
        "attempt": 3,
        "error": "boom",
        "error_type": "BuildException",
        "retryable": False,
        "duration": 2.0,
    },
    events.RetryScheduled: {
        "stage": "build",
        "attempt": 4,
        "delay": 2.5,
        "reason": "flaky",
        "policy": {"max_retries": 3},
    },
    events.CircuitOpened: {"stage": "build", "reason": "3 failures"},
    events.CircuitHalfOpened: {"stage": "build", "reason": "timeout passed"},
    events.CircuitClosed: {"stage": "build", "reason": "trial passed"},
    events.ProgressObserved: {
        "changed_files": ["a.py", "b.py"],
        "diagnostics_signature": "d1",
        "test_signature": "t1",
        "functional_ok": True,
    },
    events.StateRolledBack: {"steps": 2, "reason": "bad review"},
    events.TaskAdded: {"task_id": "task-7", "parent_id": "feature-3", "title": "Parse"},
    events.TaskStarted: {"task_id": "task-7"},
    events.TaskCompleted: {"task_id": "task-7", "result": {"lines": 10}},
    events.TaskFailed: {"task_id": "task-7", "error": "nope", "error_type": "ValueError"},
    events.BudgetSpent: {"amount": 0.12, "unit": "usd"},
    events.NoteAdded: {"key": "strategy", "value": ["refactor", {"depth": 2}]},
    events.RunFinished: {"status": "done_partial", "reason": {"loop": "same test failure"}},
    events.RunDeleted: {"rule": {"status": ["succeeded"]}, "reason": "retention"},
    events.CheckpointSaved: {
        "namespace": "child:1",
        "checkpoint_id": "1f0-a",
        "parent_id": "1f0-9",
        "checkpoint": ["msgpack", "gqF2BA=="],
        "metadata": ["msgpack", "gaRzdGVwAQ=="],
        "blobs": {"messages": ["00000000000000000000000000000002", "msgpack", "kA=="]},
        "invocation": "run-1",
    },
    events.WritesSaved: {
        "namespace": "",
        "checkpoint_id": "1f0-a",
        "task_id": "task-1",
        "task_path": "~__pregel_pull, agent",
        "writes": [[0, "messages", "msgpack", "kA=="], [-1, "__error__", "json", "e30="]],
    },
    events.CheckpointsRemoved: {"removed": [["", "1f0-9"]], "reason": "prune keep_latest"},
}


def make(kind: type[Event], **changes: Any) -> Event:
    fields = {**EXAMPLES[kind], **changes}
    return kind(run_id=RUN, version=3, timestamp=WHEN, **fields)


class TestVocabulary:
    def test_every_event_of_the_design_exists(self) -> None:
        """The registry holds exactly the documented event types."""
        assert {cls.__name__ for cls in EVENT_TYPES.values()} == {cls.__name__ for cls in EXAMPLES}

    @pytest.mark.parametrize("kind", list(EXAMPLES), ids=lambda k: k.__name__)
    def test_events_are_frozen(self, kind: type[Event]) -> None:
        """No field of a recorded event can be reassigned."""
        event = make(kind)
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            event.version = 4  # type: ignore[misc]

    @pytest.mark.parametrize("kind", list(EXAMPLES), ids=lambda k: k.__name__)
    def test_round_trip_through_json(self, kind: type[Event]) -> None:
        """encode, JSON text, decode gives an equal event of the same class."""
        topic, state = encode(make(kind))
        decoded = decode(topic, json.loads(json.dumps(state)), RUN, 3)
        assert decoded == make(kind)
        assert type(decoded) is kind

    def test_topics_do_not_depend_on_module_paths(self) -> None:
        """Stored topics are stable names, not import paths."""
        assert StageCompleted.topic == "stagetrail:StageCompleted"

    def test_eventsourcing_protocol_aliases(self) -> None:
        """originator_id and originator_version alias run_id and version."""
        event = make(StageStarted)
        assert (event.originator_id, event.originator_version) == (RUN, 3)

    def test_payload_excludes_identity_fields(self) -> None:
        """payload() is only the event's own fields."""
        assert make(StageStarted).payload() == {
            "stage": "build",
            "attempt": 2,
            "committed_with": None,
            "timeout": None,
        }


class _Key(str):
    """A str subclass used as a dict key: strict JSON holds its plain str."""


class TestStrictJSON:
    @pytest.mark.parametrize(
        ("value", "path", "words"),
        [
            (b"bytes", "result", "bytes"),
            ({1, 2}, "result", "set"),
            (math.nan, "result", "nan"),
            (math.inf, "result", "inf"),
            (-math.inf, "result", "-inf"),
            ({"files": [1, b"x"]}, "result['files'][1]", "bytes"),
            ({1: "int key"}, "result", "int key 1"),
            ({"a": {2: "x"}}, "result['a']", "int key 2"),
            ([1, {"ok": 2}, ({"deep": [0.5, math.nan]},)], "result[2][0]['deep'][1]", "nan"),
            ({"a": [[1], [2, [3, b"z"]]]}, "result['a'][1][1][1]", "bytes"),
            ((1, 2.5, {"s": {3}}), "result[2]['s']", "set"),
            (object(), "result", "object"),
            (datetime(2026, 1, 1, tzinfo=UTC), "result", "datetime"),
            ({_Key("k"): 1, "a": math.nan, 2: "x"}, "result['a']", "nan"),
            ({"a": 1, _Key("k"): [b"x"], 2: "x"}, "result['k'][0]", "bytes"),
            ({"a": 1, _Key("k"): 2, 3: "x"}, "result", "int key 3"),
        ],
    )
    def test_non_json_values_are_refused_naming_the_field(
        self, value: object, path: str, words: str
    ) -> None:
        """A value that is not strict JSON raises a TypeError naming field and path."""
        with pytest.raises(InvalidPayload) as caught:
            make(StageCompleted, result=value)
        assert isinstance(caught.value, TypeError)
        assert caught.value.field == "result"
        assert caught.value.path == path
        assert words in str(caught.value)

    def test_a_bad_value_deep_in_nested_lists_is_found_at_once(self) -> None:
        """Sixty lists deep, a NaN is named by its full path (one walk, not one per level)."""
        value: object = math.nan
        for _ in range(60):
            value = [value]
        with pytest.raises(InvalidPayload) as caught:
            make(StageCompleted, result=value)
        assert caught.value.path == "result" + "[0]" * 60

    def test_open_file_is_refused(self) -> None:
        """An open file is named as such in the error."""
        with io.StringIO("x") as handle, pytest.raises(InvalidPayload, match="StringIO"):
            make(NoteAdded, value={"log": handle})

    def test_tuples_become_lists_and_values_are_copied(self) -> None:
        """The event owns a private JSON copy: tuples are lists, later mutation is not seen."""
        result = {"pair": (1, 2)}
        event = make(StageCompleted, result=result)
        result["pair"] = (3, 4)
        assert event.result == {"pair": [1, 2]}  # type: ignore[attr-defined]

    def test_nested_containers_are_copied_at_every_depth(self) -> None:
        """A dict in a list in a dict is the event's own: changing the caller's is not seen."""
        inner = {"b": 1}
        result = {"a": [inner], "n": 2, _Key("k"): (3,)}
        event = make(StageCompleted, result=result)
        inner["b"] = 9
        result["n"] = 0
        assert event.result == {"a": [{"b": 1}], "n": 2, "k": [3]}  # type: ignore[attr-defined]
        assert [type(key) for key in event.result] == [str, str, str]  # type: ignore[attr-defined]

    @pytest.mark.parametrize("value", [None, True, 0, -3, 2.5, "", "x", [], {}, {"a": [None]}])
    def test_json_values_are_accepted(self, value: object) -> None:
        """Every kind of strict JSON value is accepted unchanged."""
        assert make(NoteAdded, value=value).value == value  # type: ignore[attr-defined]

    def test_nan_duration_is_refused(self) -> None:
        """Number fields refuse NaN as not JSON."""
        with pytest.raises(InvalidPayload, match="'duration'"):
            make(StageCompleted, duration=math.nan)

    def test_labels_must_map_str_to_str(self) -> None:
        """A non-str label value names the label."""
        with pytest.raises(InvalidPayload, match=r"labels\['n'\]"):
            make(RunStarted, labels={"n": 1})


class TestFieldChecks:
    @pytest.mark.parametrize(
        ("kind", "changes", "field", "error"),
        [
            (StageStarted, {"stage": ""}, "stage", InvalidEvent),
            (StageStarted, {"stage": 3}, "stage", InvalidPayload),
            (StageStarted, {"attempt": 0}, "attempt", InvalidEvent),
            (StageStarted, {"attempt": True}, "attempt", InvalidPayload),
            (StageCompleted, {"duration": -1}, "duration", InvalidEvent),
            (StageCompleted, {"duration": "1"}, "duration", InvalidPayload),
            (StageFailed, {"retryable": 1}, "retryable", InvalidPayload),
            (RunFinished, {"status": "done"}, "status", InvalidEvent),
            (BudgetSpent, {"amount": -0.5}, "amount", InvalidEvent),
            (BudgetSpent, {"unit": ""}, "unit", InvalidEvent),
            (ProgressObserved, {"changed_files": -1}, "changed_files", InvalidEvent),
            (ProgressObserved, {"changed_files": [1]}, "changed_files", InvalidPayload),
            (RunStarted, {"forked_from": (RUN, 0)}, "forked_from", InvalidEvent),
            (RunStarted, {"parent_run_id": "not-a-uuid"}, "parent_run_id", InvalidPayload),
        ],
    )
    def test_bad_field_values_name_the_field(
        self, kind: type[Event], changes: dict[str, Any], field: str, error: type[Exception]
    ) -> None:
        """Each out-of-range or mistyped value raises one error naming its field."""
        with pytest.raises(error) as caught:
            make(kind, **changes)
        assert caught.value.field == field  # type: ignore[attr-defined]

    def test_naive_timestamps_are_refused(self) -> None:
        """A timestamp without a time zone is ambiguous and refused."""
        with pytest.raises(InvalidEvent, match="timezone-aware"):
            StageStarted(
                run_id=RUN, version=1, timestamp=datetime(2026, 1, 1), stage="a", attempt=1
            )

    def test_timestamps_are_stored_in_utc(self) -> None:
        """An aware timestamp in another zone is converted to UTC."""
        paris = timezone(timedelta(hours=1))
        event = StageStarted(
            run_id=RUN,
            version=1,
            timestamp=datetime(2026, 1, 1, 13, tzinfo=paris),
            stage="a",
            attempt=1,
        )
        assert event.timestamp == datetime(2026, 1, 1, 12, tzinfo=UTC)
        assert event.timestamp.tzinfo is UTC

    def test_run_id_must_be_a_uuid(self) -> None:
        """A str run id is refused: ids are UUIDs."""
        with pytest.raises(InvalidPayload, match="run_id"):
            StageStarted(run_id=str(RUN), version=1, stage="a", attempt=1)  # type: ignore[arg-type]


class TestUpcasting:
    def test_run_started_v1_gains_labels_and_lineage(self) -> None:
        """A version-1 RunStarted state decodes with empty labels and no fork."""
        state: dict[str, Any] = {
            "timestamp": WHEN.isoformat(),
            "pipeline": "p",
            "table": {},
            "params": {},
            "parent_run_id": None,
        }
        event = decode(RunStarted.topic, state, RUN, 1)
        assert isinstance(event, RunStarted)
        assert (event.labels, event.forked_from) == ({}, None)

    def test_version_1_progress_observed_reported_every_signal(self) -> None:
        """A version-1 ProgressObserved's missing signatures decode as reported empty ("")."""
        state: dict[str, Any] = {
            "timestamp": WHEN.isoformat(),
            "changed_files": 0,
            "diagnostics_signature": None,
            "test_signature": None,
            "functional_ok": None,
        }
        event = decode(ProgressObserved.topic, state, RUN, 4)
        assert isinstance(event, ProgressObserved)
        assert (event.changed_files, event.diagnostics_signature, event.test_signature) == (
            0,
            "",
            "",
        )

    def test_version_1_stage_failed_has_no_details(self) -> None:
        """A version-1 StageFailed state decodes with details None."""
        state: dict[str, Any] = {
            "timestamp": WHEN.isoformat(),
            "stage": "build",
            "attempt": 1,
            "outcome": "failed",
            "error": "boom",
            "error_type": "Error",
            "retryable": True,
            "duration": 0.5,
        }
        event = decode(StageFailed.topic, state, RUN, 2)
        assert isinstance(event, StageFailed)
        assert (event.error, event.details) == ("boom", None)

    def test_version_1_stage_started_was_committed_alone(self) -> None:
        """A version-1 StageStarted state decodes with committed_with None."""
        state = {"timestamp": WHEN.isoformat(), "stage": "build", "attempt": 3}
        event = decode(StageStarted.topic, state, RUN, 4)
        assert isinstance(event, StageStarted)
        assert (event.attempt, event.committed_with, event.timeout) == (3, None, None)

    def test_version_2_stage_started_had_no_timeout(self) -> None:
        """A version-2 StageStarted state decodes with timeout None (not said)."""
        state = {"timestamp": WHEN.isoformat(), "stage": "build", "attempt": 3,
                 "committed_with": 2, "class_version": 2}  # fmt: skip
        event = decode(StageStarted.topic, state, RUN, 4)
        assert isinstance(event, StageStarted)
        assert (event.committed_with, event.timeout) == (2, None)

    @pytest.mark.parametrize("bad", [-1.0, float("inf"), "30"])
    def test_a_timeout_is_seconds_or_none(self, bad: object) -> None:
        """StageStarted.timeout refuses a negative, infinite or non-number value, naming it."""
        with pytest.raises((InvalidEvent, InvalidPayload), match="timeout"):
            StageStarted(run_id=RUN, version=4, stage="build", attempt=1, timeout=bad)  # type: ignore[arg-type]

    def test_a_decided_outcome_has_attempt_0_and_a_failure_never(self) -> None:
        """StageCompleted takes attempt 0 (a routed verdict); StageFailed still needs 1 or more."""
        completed = StageCompleted(
            run_id=RUN, version=4, stage="verifier", attempt=0, outcome="stuck"
        )
        assert completed.attempt == DECIDED == 0
        with pytest.raises(InvalidEvent, match="attempt"):
            StageFailed(run_id=RUN, version=4, stage="verifier", attempt=0)

    @pytest.mark.parametrize(
        ("bad", "error"),
        [(0, InvalidEvent), (-1, InvalidEvent), (True, InvalidPayload), ("2", InvalidPayload),
         (1.5, InvalidPayload)],
    )  # fmt: skip
    def test_committed_with_is_a_version_or_none(self, bad: object, error: type) -> None:
        """committed_with refuses anything but a version (an int >= 1) or None, naming it."""
        with pytest.raises(error, match="committed_with"):
            StageStarted(run_id=RUN, version=4, stage="build", attempt=1, committed_with=bad)  # type: ignore[arg-type]

    def test_current_class_version_is_written(self) -> None:
        """Encoding a versioned class writes its class_version for later upcasting."""
        assert encode(make(RunStarted))[1]["class_version"] == RunStarted.class_version == 2

    def test_a_newer_class_version_is_refused(self) -> None:
        """A state written by a newer release raises a clear EventFormatError."""
        state = {**encode(make(StageStarted))[1], "class_version": 5}
        with pytest.raises(EventFormatError, match="newer than this stagetrail"):
            decode(StageStarted.topic, state, RUN, 3)

    def test_unknown_topic_is_refused(self) -> None:
        """An event type this release does not know raises EventFormatError."""
        with pytest.raises(EventFormatError, match="unknown event type"):
            decode("stagetrail:Teleported", {"timestamp": WHEN.isoformat()}, RUN, 1)

    def test_a_malformed_state_is_refused(self) -> None:
        """A state whose timestamp is not a time raises EventFormatError, not ValueError."""
        state = {"timestamp": "yesterday", "stage": "a", "attempt": 1}
        with pytest.raises(EventFormatError, match="bad field value"):
            decode(StageStarted.topic, state, RUN, 1)


class TestJSONSubclasses:
    def test_subclasses_of_json_types_become_plain_values(self) -> None:
        """IntEnum and str/float subclasses are stored as plain int, str and float."""
        import enum

        class Level(enum.IntEnum):
            HIGH = 3

        class Name(str):
            pass

        class Score(float):
            pass

        event = make(NoteAdded, value={"level": Level.HIGH, "name": Name("x"), "score": Score(0.5)})
        value = event.value  # type: ignore[attr-defined]
        assert value == {"level": 3, "name": "x", "score": 0.5}
        assert [type(v) for v in value.values()] == [int, str, float]

    def test_str_enums_are_stored_by_value(self) -> None:
        """A (str, Enum) member is stored as its value, as json.dumps would write it."""
        import enum

        class Color(str, enum.Enum):  # noqa: UP042 (the case under test)
            RED = "red"

        event = make(NoteAdded, value={"color": Color.RED, Color.RED: 1})
        assert event.value == {"color": "red", "red": 1}  # type: ignore[attr-defined]

    def test_dict_and_list_subclasses_become_plain(self) -> None:
        """Counter, OrderedDict and named tuples are stored as plain dicts and lists."""
        from collections import Counter, OrderedDict, namedtuple

        pair = namedtuple("pair", "a b")
        value = {"c": Counter(a=2), "o": OrderedDict(x=1), "p": pair(1, 2)}
        stored = make(NoteAdded, value=value).value  # type: ignore[attr-defined]
        assert stored == {"c": {"a": 2}, "o": {"x": 1}, "p": [1, 2]}
        assert [type(v) for v in stored.values()] == [dict, dict, list]

    def test_self_containing_values_are_refused(self) -> None:
        """A list that contains itself is refused, not a RecursionError."""
        loop: list[object] = []
        loop.append(loop)
        with pytest.raises(InvalidPayload, match="nested too deeply"):
            make(NoteAdded, value=loop)

    def test_a_float_subclass_holding_nan_is_refused(self) -> None:
        """Conversion does not let NaN through."""

        class Score(float):
            pass

        with pytest.raises(InvalidPayload, match="nan"):
            make(NoteAdded, value=[Score("nan")])


class TestRegistry:
    def test_a_second_class_cannot_take_a_topic(self) -> None:
        """Defining an event whose topic is taken raises instead of hijacking stored events."""
        with pytest.raises(TypeError, match="is taken by"):

            class NoteAdded(Event):  # the clash under test
                pass

    def test_a_version_bump_needs_its_upcasters(self) -> None:
        """A class at version 3 without upcast_v2_v3 fails when it is defined."""
        with pytest.raises(TypeError, match="upcast_v2_v3"):

            class Evolving(Event):
                class_version = 3

                @staticmethod
                def upcast_v1_v2(state: dict[str, Any]) -> None:
                    state["x"] = 1

    def test_a_stored_state_missing_a_field_is_refused(self) -> None:
        """Decoding a state without one of the class's fields names what is missing."""
        state = encode(make(StageCompleted))[1]
        del state["outcome"]
        with pytest.raises(EventFormatError, match=r"missing \['outcome'\]"):
            decode(StageCompleted.topic, state, RUN, 3)


class TestCorruptStates:
    @pytest.mark.parametrize(
        ("state", "words"),
        [
            ([], "not an object"),
            ({"timestamp": WHEN.isoformat(), "class_version": "2"}, "is not a version"),
            ({"timestamp": WHEN.isoformat(), "class_version": 0}, "is not a version"),
        ],
    )
    def test_corrupt_states_are_event_format_errors(self, state: Any, words: str) -> None:
        """A state that is not an object, or carries a bad class version, is refused clearly."""
        with pytest.raises(EventFormatError, match=words):
            decode(RunStarted.topic, state, RUN, 1)

    def test_an_upcaster_that_fails_is_named(self) -> None:
        """An upcaster raising on odd data becomes an EventFormatError naming it."""
        state = _NoSetitem(timestamp=WHEN.isoformat(), pipeline="p", table={}, params={})
        with pytest.raises(EventFormatError, match="upcast_v1_v2 failed: RuntimeError"):
            decode(RunStarted.topic, state, RUN, 1)

    def test_class_version_must_be_at_least_one(self) -> None:
        """class_version = 0 is refused when the class is defined."""
        with pytest.raises(TypeError, match="class_version must be an int >= 1"):

            class Broken(Event):
                class_version = 0


class _NoSetitem(dict):  # type: ignore[type-arg]
    """A state on which every write fails, to make an upcaster raise."""

    def __setitem__(self, key: object, value: object) -> None:
        raise RuntimeError("read-only state")


class TestStateWriter:
    @pytest.mark.parametrize("name", ["renamed", "run_id", "version"])
    def test_an_encoder_of_no_stored_field_fails_naming_it(self, name: str) -> None:
        """An encoder of a field the class lacks, or of run_id or version (not stored), is
        not dropped: encoding fails with the name."""

        @attrs.frozen(kw_only=True)
        class Misencoded(Event):
            topic = "review:Misencoded"
            encoders = {"value": str, name: str}
            value: int = 0

        try:
            event = Misencoded(run_id=RUN, version=1, timestamp=WHEN)
            with pytest.raises(KeyError, match=name):
                events.encode(event)
        finally:
            EVENT_TYPES.pop("review:Misencoded", None)


class TestTaskWrites:
    @pytest.mark.parametrize(
        "value",
        [
            {"task_id": "t", "writes": []},
            {"task_id": "t", "writes": [[0, "log", "msgpack", "kQ=="]], "checkpoint_id": "c"},
            {"task_id": "t", "writes": [], "checkpoint_id": "c", "task_path": "p"},
        ],
    )
    def test_a_node_outcome_carrying_writes_is_recognised(self, value: dict[str, Any]) -> None:
        """A task id and writes, with at most the checkpoint and task path besides, are writes."""
        assert events.task_writes(value) is value

    @pytest.mark.parametrize(
        "value",
        [
            None,
            "writes",
            [["task_id"], ["writes"]],
            {"writes": []},
            {"task_id": "t"},
            {"task_id": "t", "writes": [], "score": 1},  # a user's result that looks alike
        ],
    )
    def test_anything_else_is_not(self, value: Any) -> None:
        """Other results and details (a missing key, one key more) are not taken for writes."""
        assert events.task_writes(value) is None
