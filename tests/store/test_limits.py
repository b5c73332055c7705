"""The payload limit and the text every store keeps, on every backend."""

from __future__ import annotations

import pytest

from engine import Engine, StoreError
from engine.errors import InvalidArgument, InvalidPayload, PayloadTooLarge
from engine.store import Store
from events import DEFAULT_MAX_EVENT_BYTES
from tests._helpers import REVIEW


def _count(engine: Engine) -> int:
    return len(engine.runs(limit=1000))


class TestPayloadLimit:
    def test_the_default_is_one_mebibyte(self, engine: Engine) -> None:
        """A store refuses events over 1 MiB unless told otherwise."""
        assert engine.store.max_event_bytes == DEFAULT_MAX_EVENT_BYTES == 1_048_576

    def test_an_oversized_note_is_refused_naming_field_and_size(self, engine: Engine) -> None:
        """A note over the limit is refused naming the field and the sizes; nothing is written."""
        run = engine.start_run(REVIEW)
        with pytest.raises(PayloadTooLarge) as caught:
            run.note("blob", "x" * DEFAULT_MAX_EVENT_BYTES)
        assert caught.value.field == "value"
        assert caught.value.limit == DEFAULT_MAX_EVENT_BYTES
        assert caught.value.size > DEFAULT_MAX_EVENT_BYTES
        assert "1,048,576 bytes" in str(caught.value)
        assert isinstance(caught.value, InvalidPayload)
        assert [type(e).__name__ for e in engine.events(run.id)] == ["RunStarted"]

    def test_one_oversized_event_refuses_its_whole_batch(self, engine: Engine) -> None:
        """A batch holding one event over the limit writes none of its events."""
        run = engine.start_run(REVIEW)
        with pytest.raises(PayloadTooLarge), run.batch():
            run.note("small", 1)
            run.note("big", ["y" * 1000] * 1100)
        assert len(engine.events(run.id)) == 1

    def test_an_event_just_under_the_limit_is_written(self, store_url: str) -> None:
        """The limit is inclusive: an event of exactly max_event_bytes is kept."""
        with Engine(store_url, max_event_bytes=4000) as engine:
            run = engine.start_run(REVIEW)
            size = len(engine.store.mapper.transcoder.encode(_note_state(run, "")))
            run.note("k", "z" * (4000 - size))
            with pytest.raises(PayloadTooLarge):
                run.note("k", "z" * (4001 - size))
            assert run.version == 2

    def test_the_url_sets_the_limit(self, store_url: str) -> None:
        """``?max_event_bytes=`` on the store URL sets the limit; the argument wins over it."""
        joiner = "&" if "?" in store_url else "?"
        with Engine(f"{store_url}{joiner}max_event_bytes=5000000") as engine:
            assert engine.store.max_event_bytes == 5_000_000
            run = engine.start_run(REVIEW)
            run.note("blob", "x" * 2_000_000)
            assert run.version == 2
        with Engine(f"{store_url}{joiner}max_event_bytes=5000000", max_event_bytes=10) as engine:
            assert engine.store.max_event_bytes == 10

    @pytest.mark.parametrize("bad", ["0", "-1", "1e6", "lots", "9" * 30])
    def test_a_bad_url_limit_is_a_store_error(self, bad: str) -> None:
        """A limit in the URL that is not a positive number of bytes is refused by name."""
        with pytest.raises(StoreError, match="max_event_bytes"):
            Engine(f"memory://?max_event_bytes={bad}")

    @pytest.mark.parametrize("bad", [0, -5, 1.5, "1000", True])
    def test_a_bad_argument_limit_is_refused(self, bad: object) -> None:
        """A limit that is not an int >= 1: InvalidArgument from Engine, StoreError from Store."""
        with pytest.raises(InvalidArgument, match="'max_event_bytes': must be an int >= 1"):
            Engine("memory://", max_event_bytes=bad)  # type: ignore[arg-type]
        with pytest.raises(StoreError, match="max_event_bytes must be an int >= 1"):
            Store("memory://", max_event_bytes=bad)  # type: ignore[arg-type]


def _note_state(run: object, value: str) -> dict[str, object]:
    from events import NoteAdded, encode

    event = NoteAdded(run_id=run.id, version=2, key="k", value=value)  # type: ignore[attr-defined]
    return encode(event)[1]


class TestUnstorableText:
    @pytest.mark.parametrize(
        ("kwargs", "field", "what"),
        [
            ({"labels": {"team": "a\x00b"}}, "labels", "NUL"),
            ({"labels": {"t\x00": "b"}}, "labels", "NUL"),
            ({"params": {"card": "C\x00"}}, "params", "NUL"),
            ({"params": {"deep": [{"k\x00": 1}]}}, "params", "NUL"),
            ({"labels": {"team": "\ud800"}}, "labels", "lone surrogate"),
            ({"params": ["\udfff"]}, "params", "lone surrogate"),
        ],
    )
    def test_a_run_start_with_unstorable_text_is_refused(
        self, engine: Engine, kwargs: dict[str, object], field: str, what: str
    ) -> None:
        """NUL and lone surrogates anywhere in a run's start are refused by field; no run kept."""
        with pytest.raises(InvalidPayload, match=what) as caught:
            engine.start_run(REVIEW, **kwargs)  # type: ignore[arg-type]
        assert caught.value.field == field
        assert _count(engine) == 0

    @pytest.mark.parametrize(
        ("record", "field"),
        [
            (lambda run: run.note("k", "v\x00"), "value"),
            (lambda run: run.note("k\x00", "v"), "key"),
            (
                lambda run: run.stage_failed(
                    "project_analysis", "boom", outcome="aborted", error_type="E\x00"
                ),
                "error_type",
            ),
            (lambda run: run.finish("failed", reason={"why": "\x00"}), "reason"),
            (lambda run: run.add_task("t\x00"), "task_id"),
            (lambda run: run.spend(1.0, "usd\x00"), "unit"),
        ],
    )
    def test_recording_a_nul_is_refused_by_field(
        self, engine: Engine, record: object, field: str
    ) -> None:
        """A NUL in any recorded str is refused naming the field; the run keeps one event."""
        run = engine.start_run(REVIEW)
        with pytest.raises(InvalidPayload, match="NUL") as caught:
            record(run)  # type: ignore[operator]
        assert caught.value.field == field
        assert len(engine.events(run.id)) == 1

    def test_an_escaped_backslash_u0000_is_plain_text(self, engine: Engine) -> None:
        """The six characters \\u0000 are text, not a NUL: they are kept as written."""
        run = engine.start_run(REVIEW, labels={"raw": "\\u0000"})
        assert engine.events(run.id)[0].labels == {"raw": "\\u0000"}  # type: ignore[attr-defined]

    def test_the_run_index_keeps_working_after_a_refused_nul(self, engine: Engine) -> None:
        """After a NUL label is refused, runs() lists the store's runs (PostgreSQL broke here)."""
        with pytest.raises(InvalidPayload):
            engine.start_run(REVIEW, labels={"team": "\x00"})
        engine.start_run(REVIEW, labels={"team": "core"})
        assert [summary.labels for summary in engine.runs()] == [{"team": "core"}]


class TestStoresWrittenBeforeTheCheck:
    def test_a_nul_already_in_a_store_does_not_stop_the_run_index(self, engine: Engine) -> None:
        """A NUL label written by an older release does not stop runs() or the run index."""
        import uuid

        from eventsourcing.persistence import StoredEvent

        from events import RunStarted, encode

        old = RunStarted(
            run_id=uuid.uuid4(),
            version=1,
            pipeline=REVIEW.name,
            table=REVIEW.to_dict(),
            labels={"team": "co\x00re"},
        )
        topic, state = encode(old)
        data = engine.store.mapper.transcoder.encode(state)  # as written before the check
        engine.store.write([StoredEvent(old.run_id, 1, topic, data)])
        (summary,) = engine.runs()
        assert summary.labels == {"team": "co\x00re"}
        run_index = next(s for s in engine.projections.status() if s.name == "run_index")
        assert (run_index.lag, run_index.last_error) == (0, None)
