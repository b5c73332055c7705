"""A page of a run's events decodes in one call, exactly as event by event, or falls back."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import attrs
import pytest
from eventsourcing.persistence import StoredEvent

from engine import Engine
from engine.store.mapper import EventMapper, FastJSONTranscoder
from events import Event, EventFormatError, RunStarted, StageCompleted
from events.base import EVENT_TYPES
from events.codec import decode, decode_many, encode, read_each
from tests._helpers import REVIEW


def recorded(engine: Engine) -> list[StoredEvent]:
    """A run with results holding big ints, floats and odd text, as stored."""
    run = engine.start_run(REVIEW, params={"n": 2**70})
    run.stage_completed("project_analysis", {"big": 2**64 + 1, "tiny": 1.5e-9, "s": "é\u2028"})
    run.stage_completed("code_review", {"digits": "1234567890123456789012"}, duration=1.0)
    run.stage_failed("developer", "no", error_type="X")
    return list(engine.store.recorder.select_events(run.id))


class TestToDomainEvents:
    def test_a_page_reads_as_each_event_alone(self, tmp_path: Path) -> None:
        """The page's events equal `to_domain_event`'s, big ints and all."""
        with Engine(f"sqlite:///{tmp_path / 's.db'}") as engine:
            stored = recorded(engine)
            mapper = engine.store.mapper
            assert isinstance(mapper, EventMapper)
            page = mapper.to_domain_events(stored)
            assert page == [mapper.to_domain_event(s) for s in stored]
            assert isinstance(page[0], RunStarted)
            assert page[0].params == {"n": 2**70}
            assert isinstance(page[1], StageCompleted)
            assert page[1].result == {"big": 2**64 + 1, "tiny": 1.5e-9, "s": "é\u2028"}

    def test_a_chained_page_takes_the_page_path(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Stored events carrying chain links decode as one page, never event by event."""
        with Engine(f"sqlite:///{tmp_path / 's.db'}") as engine:
            run = engine.start_run(REVIEW)
            run.stage_completed("project_analysis", {"n": 1})
            run.stage_completed("code_review", {"n": 2})
            stored = list(engine.store.recorder.select_events(run.id))
            assert all(b'"_c":' in s.state for s in stored)  # each event carries its link
            mapper = engine.store.mapper
            alone = [mapper.to_domain_event(s) for s in stored]

            def refused(stored_event: StoredEvent) -> None:
                raise AssertionError("decoded event by event")

            monkeypatch.setattr(mapper, "to_domain_event", refused)
            assert mapper.to_domain_events(stored) == alone

    def test_a_page_without_long_digits_takes_one_decode(self, tmp_path: Path) -> None:
        """Plain pages are read in one `decode_many` call; a long digit run sends it one by one."""
        transcoder = FastJSONTranscoder()
        assert transcoder.decode_many([b'{"a":1}', b"[2]"]) == [{"a": 1}, [2]]
        assert transcoder.decode_many([b'{"a":12345678901234567890}', b"1"]) is None
        assert transcoder.decode_many([b"1,2", b"3"]) is None
        assert transcoder.decode_many([b"{", b"}"]) is None

    def test_an_unreadable_event_is_named(self, tmp_path: Path) -> None:
        """A page holding bytes that are not JSON raises naming that event's run and version."""
        with Engine(f"sqlite:///{tmp_path / 's.db'}") as engine:
            stored = recorded(engine)
            broken = dataclasses.replace(stored[2], state=b"{not json")
            with pytest.raises(EventFormatError, match=r"version 3"):
                engine.store.mapper.to_domain_events([*stored[:2], broken, stored[3]])

    def test_a_field_missing_is_named(self, tmp_path: Path) -> None:
        """A stored state with a field renamed names the missing and the unknown field."""
        with Engine(f"sqlite:///{tmp_path / 's.db'}") as engine:
            stored = recorded(engine)
            renamed = dataclasses.replace(
                stored[2], state=stored[2].state.replace(b'"stage"', b'"stag"')
            )
            with pytest.raises(EventFormatError, match=r"missing \['stage'\], unknown \['stag'\]"):
                engine.store.mapper.to_domain_events([*stored[:2], renamed])


class TestDecodeMany:
    def test_events_of_later_class_versions_and_upcasts_decode_as_alone(self) -> None:
        """Current versions decode inline; an older version is upcast; a newer one is refused."""
        with Engine("memory://") as engine:
            run = engine.start_run(REVIEW)
            run.stage_completed("project_analysis", {})
            run.stage_completed("code_review", {})
            run.stage_failed("developer", "no", error_type="X")
            events = engine.events(run.id)
        rows = [(*encode(event), event.version) for event in events]
        assert decode_many([(t, dict(s), v) for t, s, v in rows], run.id) == events
        topic, state, version = rows[-1]
        assert state["class_version"] > 1  # StageFailed is past its first version
        older = {k: v for k, v in state.items() if k not in ("class_version", "details")}
        assert decode_many([(topic, dict(older), version)], run.id) == [
            decode(topic, dict(older), run.id, version)
        ]
        newer = {**state, "class_version": state["class_version"] + 1}
        with pytest.raises(EventFormatError, match="newer than this stagetrail"):
            decode_many([(topic, newer, version)], run.id)

    @pytest.mark.parametrize(
        "change",
        [
            {"extra": 1},  # a key beside the fields
            {None: 1},  # a key beside the fields that is None (which no store's key is)
            {"run_id": "x"},  # a key the event sets itself
            {"class_version": 2.0},  # the current version, not as an int
            {"class_version": True},
            {"timestamp": 5},
            {"duration": None, "stage": None},
        ],
    )
    def test_odd_states_fail_or_decode_as_alone(self, change: dict[str, object]) -> None:
        """A state the readers do not build (a key more, one gone, an odd version or value)
        decodes, or fails with the same message, as `decode` of it alone."""
        with Engine("memory://") as engine:
            run = engine.start_run(REVIEW)
            run.stage_completed("project_analysis", {"n": 1})
            run.stage_completed("code_review", {})
            run.stage_failed("developer", "no", error_type="X")
            events = engine.events(run.id)
        for topic, state, version in [(*encode(event), event.version) for event in events[1:]]:
            odd = {**state, **change}
            for dropped in [None, *state]:
                trial = {k: v for k, v in odd.items() if k != dropped}
                try:
                    alone: object = decode(topic, dict(trial), run.id, version)
                except EventFormatError as error:
                    alone = str(error)
                try:
                    paged: object = decode_many([(topic, dict(trial), version)], run.id)[0]
                except EventFormatError as error:
                    paged = str(error)
                assert paged == alone, (topic, trial)

    def test_a_topic_given_another_class_is_read_by_it(self) -> None:
        """A page decoded after its topic's class changed builds the new class's events."""
        with Engine("memory://") as engine:
            run = engine.start_run(REVIEW)
            run.note("k", [1])
            events = engine.events(run.id)
        rows = [(*encode(event), event.version) for event in events]
        assert decode_many([(t, dict(s), v) for t, s, v in rows], run.id) == events
        topic = rows[-1][0]
        original = EVENT_TYPES.pop(topic)
        try:

            @attrs.frozen(kw_only=True)
            class Note(Event):
                topic = "stagetrail:NoteAdded"
                key: str = ""
                value: object = None

            decoded = decode_many([(t, dict(s), v) for t, s, v in rows], run.id)[-1]
            assert type(decoded) is Note
            assert (decoded.key, decoded.value) == ("k", [1])
        finally:
            EVENT_TYPES[topic] = original


class TestFromRows:
    def test_rows_read_as_their_stored_events(self, tmp_path: Path) -> None:
        """A recorder's plain rows decode to the events its StoredEvents decode to, one row too."""
        with Engine(f"sqlite:///{tmp_path / 's.db'}") as engine:
            stored = recorded(engine)
            mapper = engine.store.mapper
            run_id = uuid.UUID(str(stored[0].originator_id))
            rows = [(s.originator_version, s.topic, s.state) for s in stored]
            assert mapper.from_rows(run_id, rows) == mapper.to_domain_events(stored)
            assert mapper.from_rows(run_id, rows[1:2]) == [mapper.to_domain_event(stored[1])]
            assert mapper.from_rows(run_id, []) == []

    def test_a_bad_row_is_named(self, tmp_path: Path) -> None:
        """A row holding bytes that are not JSON raises naming its run and version."""
        with Engine(f"sqlite:///{tmp_path / 's.db'}") as engine:
            stored = recorded(engine)
            rows = [(s.originator_version, s.topic, s.state) for s in stored]
            rows[2] = (rows[2][0], rows[2][1], b"{not json")
            with pytest.raises(EventFormatError, match=r"version 3"):
                engine.store.mapper.from_rows(uuid.UUID(str(stored[0].originator_id)), rows)

    def test_a_run_started_with_lineage_decodes_as_alone(self) -> None:
        """A RunStarted's parent and fork point (field decoders) decode in a page as alone."""
        with Engine("memory://") as engine:
            parent = engine.start_run(REVIEW)
            parent.stage_completed("project_analysis", {})
            child = engine.fork(parent.id, at=2)
            events = engine.events(child.id)
        assert isinstance(events[0], RunStarted)
        assert events[0].forked_from == (parent.id, 2)
        rows = [(*encode(event), event.version) for event in events]
        assert decode_many([(t, dict(s), v) for t, s, v in rows], child.id) == events
        assert decode_many([(t, dict(s), v) for t, s, v in rows[:1]], child.id) == [
            decode(rows[0][0], dict(rows[0][1]), child.id, 1)
        ]
        broken = {**rows[0][1], "forked_from": ["not a uuid", 2]}
        with pytest.raises(EventFormatError, match="bad field value"):
            decode_many([(rows[0][0], broken, 1)], child.id)


class TestReadTopics:
    def test_only_the_topics_asked_are_read(self, engine: Engine) -> None:
        """`Store.read(topics=)` gives the events of those topics only, in version order."""
        run = engine.start_run(REVIEW)
        run.stage_started("project_analysis")
        run.stage_completed("project_analysis", {"n": 1})
        run.stage_completed("code_review", {"n": 2})
        run.stage_started("developer")
        run.stage_failed("developer", "no", error_type="X")
        wanted = {StageCompleted.topic, RunStarted.topic}
        events = engine.store.read(run.id, lte=5, topics=wanted)
        assert [(type(e), e.version) for e in events] == [
            (RunStarted, 1),
            (StageCompleted, 3),
            (StageCompleted, 4),
        ]
        assert engine.store.read(run.id, topics=set()) == []


class TestPageDecodeReview:
    def test_a_decoder_of_no_field_reads_the_same_in_a_page(self) -> None:
        """A class whose decoders name no field of it fails in a page as it fails alone."""

        @attrs.frozen(kw_only=True)
        class Stale(Event):
            topic = "review:Stale"
            decoders = {"renamed": int}
            value: str = ""

        try:
            run_id = uuid.uuid4()
            state = {"value": "a", "timestamp": "2024-01-01T00:00:00+00:00"}
            with pytest.raises(EventFormatError) as alone:
                decode("review:Stale", dict(state), run_id, 1)
            with pytest.raises(EventFormatError) as paged:
                decode_many([("review:Stale", dict(state), 1)], run_id)
            assert str(paged.value) == str(alone.value)
        finally:
            EVENT_TYPES.pop("review:Stale", None)

    @pytest.mark.parametrize(
        ("field", "value"), [("forked_from", []), ("parent_run_id", 5)], ids=["fork", "parent"]
    )
    def test_a_value_of_the_wrong_shape_is_named_not_a_bare_error(
        self, field: str, value: object
    ) -> None:
        """A stored RunStarted whose fork point is a too short list, or whose parent id is a
        number, fails as EventFormatError naming the field, in a page and alone (it was a
        bare IndexError or AttributeError)."""
        with Engine("memory://") as engine:
            run = engine.start_run(REVIEW)
            event = engine.events(run.id)[0]
        topic, state = encode(event)
        state[field] = value
        with pytest.raises(EventFormatError, match=f"bad field value of '{field}'"):
            decode_many([(topic, dict(state), 1), (topic, dict(state), 2)], run.id)
        with pytest.raises(EventFormatError, match=f"bad field value of '{field}'"):
            decode(topic, dict(state), run.id, 1)


class TestReadEach:
    """`read_each`: a stream's page built one event at a time by per-class readers."""

    @staticmethod
    def page(engine: Engine) -> tuple[uuid.UUID, list[tuple[int, str, bytes]], list[Event]]:
        """A recorded run's rows (version, topic, state) and its events as read alone."""
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis", {"n": 1}, duration=0.5)
        run.stage_completed("code_review", {"n": 2})
        run.stage_failed("developer", "no", error_type="X")
        stored = list(engine.store.recorder.select_events(run.id))
        rows = [(s.originator_version, s.topic, s.state) for s in stored]
        return run.id, rows, engine.events(run.id)

    @staticmethod
    def refuse(run_id: uuid.UUID, row: tuple[object, ...]) -> Event:
        raise AssertionError(f"read alone: {row[:2]}")

    def test_with_or_without_the_stores_key_the_events_are_those_read_alone(self) -> None:
        """States with the store's extra key, or without it, build the events `decode` builds."""
        with Engine("memory://") as engine:
            run_id, rows, events = self.page(engine)
        states = [
            {**encode(event)[1], **({"_link": "x"} if event.version % 2 else {})}
            for event in events
        ]
        read = list(read_each(rows, states, run_id, "_link", self.refuse))
        assert read == events
        assert [type(e) for e in read] == [type(e) for e in events]

    def test_an_unknown_key_in_place_of_the_stores_goes_to_the_slow_path(self) -> None:
        """A state with one key too many that is not the store's is no event of the class:
        `decode` refuses it and `alone` gets its row."""
        with Engine("memory://") as engine:
            run_id, rows, events = self.page(engine)
        states = [encode(event)[1] for event in events]
        states[1]["surprise"] = 1
        seen: list[int] = []

        def alone(run_id: uuid.UUID, row: tuple[object, ...]) -> Event:
            seen.append(int(str(row[0])))
            return events[1]

        assert list(read_each(rows, states, run_id, "_link", alone)) == events
        assert seen == [rows[1][0]]

    def test_an_older_class_version_is_upcast(self) -> None:
        """A state of an older class version (no `class_version` key) is upcast by `decode`."""
        with Engine("memory://") as engine:
            run_id, rows, events = self.page(engine)
        states = [encode(event)[1] for event in events]
        failed = states[-1]
        assert failed.get("class_version") == 2  # StageFailed is at version 2
        del failed["class_version"], failed["details"]
        read = list(read_each(rows, states, run_id, "_link", self.refuse))
        assert read == events

    def test_an_unreadable_state_is_named_by_alone(self) -> None:
        """A state `decode` refuses (a list) goes to `alone`, which names it."""
        with Engine("memory://") as engine:
            run_id, rows, events = self.page(engine)
        states: list[object] = [encode(event)[1] for event in events]
        states[0] = [1, 2]

        def alone(run_id: uuid.UUID, row: tuple[object, ...]) -> Event:
            raise EventFormatError(str(row[1]), f"version {row[0]} unreadable")

        read = read_each(rows, states, run_id, "_link", alone)
        with pytest.raises(EventFormatError, match="version 1 unreadable"):
            next(read)

    def test_pages_read_side_by_side_keep_their_own_run_alone_and_key(self) -> None:
        """Two pages of different runs, read in turns, build each event with its own page's
        run id, skip only its own store key, and send a refused state to its own `alone`."""
        with Engine("memory://") as engine:
            first_id, rows, events = self.page(engine)
            second_id, other_rows, other_events = self.page(engine)
        first = [{**encode(event)[1], "_a": 1} for event in events]
        second = [{**encode(event)[1], "_b": 1} for event in other_events]
        seen: dict[str, list[object]] = {"first": [], "second": []}

        def alone_of(name: str, given: list[Event]) -> Any:
            def alone(run_id: uuid.UUID, row: tuple[object, ...]) -> Event:
                seen[name].append((run_id, row[0]))
                return given[int(str(row[0])) - 1]

            return alone

        pages = [
            read_each(rows, first, first_id, "_a", alone_of("first", events)),
            read_each(other_rows, second, second_id, "_a", alone_of("second", other_events)),
        ]
        read: list[list[Event]] = [[], []]
        for _ in rows:
            for index, page in enumerate(pages):
                read[index].append(next(page))
        assert read == [events, other_events]
        assert {event.run_id for event in read[1]} == {second_id}
        assert seen == {"first": [], "second": [(second_id, row[0]) for row in other_rows]}

    def test_rows_and_states_of_different_lengths_are_refused(self) -> None:
        """Fewer states than rows is a caller's error, said at once (not a short stream)."""
        with pytest.raises(ValueError, match="2 rows but 1 states"):
            read_each([(1, "t", b""), (2, "t", b"")], [{}], uuid.uuid4(), "_c", self.refuse)


class TestFrozenTime:
    def test_a_reader_made_while_time_is_frozen_reads_real_datetimes_after(self) -> None:
        """A class's page reader first made under freezegun goes on building real
        datetimes once time runs again, as `decode` does (it kept the fake class)."""
        from datetime import datetime

        from freezegun import freeze_time

        @attrs.frozen(kw_only=True)
        class Ticked(Event):
            topic = "review:Ticked"
            value: str = ""

        try:
            run_id = uuid.uuid4()
            state = {"value": "a", "timestamp": "2024-01-01T00:00:00+00:00"}
            with freeze_time("2030-01-01"):
                decode_many([("review:Ticked", dict(state), 1)], run_id)
            paged = decode_many([("review:Ticked", dict(state), 1)], run_id)[0]
            alone = decode("review:Ticked", dict(state), run_id, 1)
            assert type(paged.timestamp) is type(alone.timestamp) is datetime
        finally:
            EVENT_TYPES.pop("review:Ticked", None)
