"""The store's transcoder: orjson's bytes where they are exact, the standard library's otherwise."""

from __future__ import annotations

import enum
import json
import math
import random
import struct
import tracemalloc
from typing import Any

import pytest
from eventsourcing.persistence import JSONTranscoder
from freezegun import freeze_time
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Engine
from engine.errors import InvalidPayload
from engine.store import mapper
from engine.store.chain import Chain
from engine.store.mapper import FastJSONTranscoder
from events.codec import encode
from tests._helpers import REVIEW


class Colour(enum.StrEnum):
    """A str subclass: orjson would write it on its own terms."""

    RED = "red"


PLAIN: list[Any] = [
    None,
    True,
    0,
    -(2**63),
    2**64 - 1,
    2.5,
    -0.0,
    1e22,
    "",
    'é \u2028 \x00 \x1f \\ " /',
    [],
    {},
    {"score": 0.87, "issues": [{"file": "a.py", "line": 3}], "ok": [True, None]},
]


class TestFastJSONTranscoder:
    @pytest.mark.parametrize("value", PLAIN)
    def test_plain_json_reads_back_as_the_standard_encoder_wrote_it(self, value: Any) -> None:
        """Plain JSON encodes to bytes that decode to what eventsourcing's transcoder gives."""
        transcoder = FastJSONTranscoder()
        data = transcoder.encode(value)
        assert transcoder.decode(data) == value
        assert data == transcoder.encode_stdlib(value) == JSONTranscoder().encode(value)

    def test_encoded_bytes_take_the_memory_of_their_length(self) -> None:
        """50,000 encoded states kept take about their length in memory, not a buffer each."""
        transcoder = FastJSONTranscoder()
        state = {"stage": "work", "result": {"changed_files": 3}, "duration": 1.0}
        tracemalloc.start()
        try:
            kept = [transcoder.encode(state) for _ in range(50_000)]
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert held < 50_000 * (len(kept[0]) + 200)  # an object header and list slot each

    def test_a_small_float_may_be_spelled_differently_but_is_the_same_number(self) -> None:
        """orjson writes 1e-7 where the standard library writes 1e-07: equal when read."""
        transcoder = FastJSONTranscoder()
        assert transcoder.encode(1e-7) == b"1e-7"
        assert json.loads(transcoder.encode(1e-7)) == json.loads(transcoder.encode_stdlib(1e-7))

    @pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 10**40])
    def test_an_int_beyond_64_bits_is_written_exactly(self, value: int) -> None:
        """An int orjson cannot write goes to the standard library, digits intact."""
        transcoder = FastJSONTranscoder()
        assert transcoder.encode({"n": value}) == f'{{"n":{value}}}'.encode()
        assert transcoder.decode(transcoder.encode({"n": value})) == {"n": value}

    @pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 10**40, 2**63 - 1, -(2**63)])
    def test_an_int_of_any_size_reads_back_as_that_int(self, value: int) -> None:
        """Decoding keeps every digit of an int (orjson alone would give a float past 64 bits)."""
        decoded = FastJSONTranscoder().decode(f'{{"n":[{value}]}}'.encode())
        assert type(decoded["n"][0]) is int
        assert decoded["n"][0] == value

    @pytest.mark.parametrize("shift", range(8))
    @pytest.mark.parametrize("value", [10**18, 2**64, -(2**63) - 1, 10**40])
    def test_a_long_int_at_any_offset_reads_back_as_that_int(self, shift: int, value: int) -> None:
        """A long int among floats of sixteen digits and timestamps, at any byte offset (the
        long-digit check samples every fourth byte first), decodes exactly, alone or in a page."""
        transcoder = FastJSONTranscoder()
        filler = {"t": "2026-11-28T04:24:19.180479+00:00", "d": 7.1409999691240955e-6}
        state = {"p": "x" * shift, **filler, "n": value, "e": [filler, 0.1234567890123456]}
        data = transcoder.encode(state)
        for decoded in (transcoder.decode(data), *(transcoder.decode_many([data, data]) or [])):
            assert decoded == state
            assert type(decoded["n"]) is int

    def test_floats_read_back_bit_for_bit(self) -> None:
        """Random doubles written by either encoder decode to the very same bits."""
        transcoder, rng = FastJSONTranscoder(), random.Random(23)
        doubles = [struct.unpack("<d", rng.randbytes(8))[0] for _ in range(5000)]
        finite = [d for d in doubles if math.isfinite(d)]
        for data in (transcoder.encode(finite), transcoder.encode_stdlib(finite)):
            decoded = transcoder.decode(data)
            assert [struct.pack("<d", d) for d in decoded] == [struct.pack("<d", d) for d in finite]

    @pytest.mark.parametrize(
        ("data", "value"),
        [(b'["\\ud800"]', ["\ud800"]), (b"[1e400]", [math.inf]), (b'{"a":1,"a":2}', {"a": 2})],
    )
    def test_json_orjson_refuses_reads_as_the_standard_library_reads_it(
        self, data: bytes, value: Any
    ) -> None:
        """A lone surrogate or a float too large, stored by older code, still decodes."""
        assert FastJSONTranscoder().decode(data) == value == json.loads(data)

    def test_bytes_that_are_not_json_raise_the_standard_librarys_error(self) -> None:
        """A torn state raises json's error naming the position, as before."""
        with pytest.raises(json.JSONDecodeError, match="char 3"):
            FastJSONTranscoder().decode(b"[1,")

    def test_a_subclass_is_written_as_the_standard_library_writes_it(self) -> None:
        """A str enum member is its value, as json.dumps writes it, not orjson's choice."""
        transcoder = FastJSONTranscoder()
        assert transcoder.encode({"c": Colour.RED}) == transcoder.encode_stdlib({"c": Colour.RED})

    def test_a_lone_surrogate_is_refused_as_before(self) -> None:
        """What neither encoder can write as UTF-8 raises the standard library's error."""
        with pytest.raises(UnicodeEncodeError):
            FastJSONTranscoder().encode({"s": "\ud800"})

    def test_a_non_finite_float_never_reaches_the_transcoder(self) -> None:
        """NaN is refused by the event's converter (orjson would write null), as by the stdlib."""
        transcoder = FastJSONTranscoder()
        with pytest.raises(ValueError, match="not JSON compliant"):
            transcoder.encode_stdlib({"x": math.nan})
        with pytest.raises(InvalidPayload, match="nan"), Engine("memory://") as engine:
            engine.start_run(REVIEW).note("x", math.nan)

    @pytest.mark.parametrize("value", [1, 2**70])  # 2**70: the standard library writes it
    def test_the_timestamp_is_written_as_isoformat_by_either_encoder(self, value: int) -> None:
        """A stored timestamp is the event's isoformat, from orjson and from the fallback."""
        with Engine("memory://") as engine:
            run = engine.start_run(REVIEW)
            with freeze_time("2026-03-04 05:06:07"):  # no microseconds: isoformat omits them
                plain = run.note("n", value)
            odd = run.note("n", value)
            for event in (plain, odd):
                written = json.loads(engine.store.serialize(event).state)
                assert written["timestamp"] == event.timestamp.isoformat()
            assert [e.timestamp for e in engine.events(run.id)[1:]] == [
                plain.timestamp,
                odd.timestamp,
            ]

    def test_every_event_of_a_run_reads_back_equal(self) -> None:
        """Each event a supervised run records decodes from orjson's bytes to its own state."""
        with Engine("memory://") as engine:
            sup = engine.supervisor(sleep=lambda seconds: None)
            stages = {s: (lambda context: {"at": context.stage, "x": [1.5e-9]}) for s in
                      ("project_analysis", "code_review", "developer", "testing")}  # fmt: skip
            run = sup.drive(engine.start_run(REVIEW, labels={"k": "v"}), stages)
            transcoder = engine.store.mapper.transcoder
            for event in engine.events(run.id):
                state = encode(event)[1]
                assert transcoder.decode(transcoder.encode(state)) == state


class TestChainedEvents:
    """`EventMapper.to_chained`: the bytes an append writes, sealed without a second copy."""

    @staticmethod
    def _held(to_chained: Any, count: int) -> tuple[int, int]:
        tracemalloc.start()
        try:
            kept = [to_chained(version) for version in range(1, count + 1)]
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        return held, len(kept[-1][0].state)

    def test_chained_events_take_the_memory_of_their_length(self) -> None:
        """20,000 chained events kept take about their length in memory, not orjson's buffer
        each (the seal's own bytes are kept, the encoder's dropped)."""
        with Engine("memory://") as engine:
            run = engine.start_run(REVIEW)
            event = run.stage_completed("project_analysis", result={"files": 3})
            mapper = engine.store.mapper

            def chained(version: int) -> Any:
                return mapper.to_chained(event, b"p" * 16)

            held, length = self._held(chained, 20_000)
        assert held < 20_000 * (length + 400)  # a StoredEvent, its bytes and a list slot each

    def test_a_chain_that_writes_no_link_still_keeps_a_copy_of_its_length(self) -> None:
        """A chain that hands the JSON back as it is (a benchmark's baseline) gets the copy
        `encode` makes: no event keeps orjson's whole buffer."""

        class Unlinked(Chain):
            def sealed(self, previous: bytes, *args: Any) -> tuple[bytes, bytes]:
                return args[-1], b""

        with Engine("memory://") as engine:
            run = engine.start_run(REVIEW)
            event = run.stage_completed("project_analysis", result={"files": 3})
            mapper = engine.store.mapper
            mapper.chain = Unlinked()

            def chained(version: int) -> Any:
                return mapper.to_chained(event, b"")

            held, length = self._held(chained, 20_000)
            assert mapper.to_chained(event, b"")[0].state == mapper.to_stored_event(event).state
        assert held < 20_000 * (length + 400)

    def test_chained_bytes_are_the_json_with_its_link_sealed_in(self) -> None:
        """`to_chained` writes the serialised JSON with `Chain.link` sealed in (`Chain.seal`)."""
        with Engine("memory://") as engine:
            run = engine.start_run(REVIEW)
            event = run.stage_completed("project_analysis", result={"files": [1, 2.5]})
            mapper = engine.store.mapper
            body = mapper.to_stored_event(event).state
            stored, link = mapper.to_chained(event, b"q" * 16)
            chain = mapper.chain
            expected = chain.link(b"q" * 16, run.id, event.version, stored.topic, body)
            assert link == expected
            assert stored.state == chain.seal(body, expected)


class TestNulCheck:
    """`EventMapper`'s NUL check (a backslash looked for first): exact for every placement."""

    @pytest.mark.parametrize(
        ("text", "refused"),
        [
            ("\x00", True),  # its escape is the first backslash
            ("\\\x00", True),  # after an escaped backslash
            ("\\\\\x00", True),
            ("a\\b\x00", True),  # a backslash well before it
            ('"\x00', True),
            ("\\u0000", False),  # the six characters, written after an escaped backslash
            ("\\\\u0000", False),
            ("\\", False),
            ("plain", False),
        ],
    )
    def test_a_nul_anywhere_is_refused_and_its_spelling_kept(
        self, text: str, refused: bool
    ) -> None:
        """A NUL in a result is refused (nothing appended) wherever it stands after
        backslashes; the text backslash-u-0000 (no NUL) is stored and reads back."""
        with Engine("memory://") as engine:
            run = engine.start_run(REVIEW)
            before = len(engine.events(run.id))
            if refused:
                with pytest.raises(InvalidPayload, match=r"result\['t'\]"):
                    run.stage_completed("project_analysis", {"t": text})
                assert len(engine.events(run.id)) == before
            else:
                run.stage_completed("project_analysis", {"t": text})
                assert engine.events(run.id)[-1].result == {"t": text}  # type: ignore[attr-defined]


_OLD_TABLE = bytes(48 if byte in b"0123456789" else 32 for byte in range(256))


def _old_long_digits(data: bytes) -> bool:
    """The long-digit check as it was before the sampled one: every byte translated."""
    return data.translate(_OLD_TABLE).find(b"0" * 19) != -1


_BYTES = st.sampled_from(
    [b"0", b"7", b"9", b"-", b".", b"e", b'"', b",", b"[", b"]", b":", b" ", b"\xc3\xa9", b"T"]
)


class TestLongDigits:
    """The sampled long-digit check (every fourth byte first) finds what the full one found."""

    @settings(max_examples=3000, deadline=None)
    @given(st.lists(_BYTES | st.integers(1, 40).map(lambda n: b"5" * n), max_size=40))
    def test_sampled_check_agrees_with_the_full_check(self, parts: list[bytes]) -> None:
        """On bytes of digit runs of any length among JSON's other bytes, both checks agree."""
        data = b"".join(parts)
        assert mapper._long_digits(data) == _old_long_digits(data)

    def test_every_run_length_at_every_offset_beside_decoys(self) -> None:
        """A run of 17 to 23 digits at each offset, with or without decoy runs of up to 18
        digits before and after it (sampled digits side by side that are no long run), is
        found exactly when it is 19 digits or more."""
        for run in range(17, 24):
            for offset in range(9):
                for before, after in [(0, 0), (16, 0), (0, 16), (18, 18), (15, 7)]:
                    decoy_a = (b"1" * before + b",") if before else b""
                    decoy_b = (b"," + b"2" * after) if after else b""
                    data = b"x" * offset + decoy_a + b"-" + b"3" * run + decoy_b + b"]"
                    assert mapper._long_digits(data) == (run >= 19), (run, offset, before, after)

    def test_every_placement_of_digits_in_short_bytes(self) -> None:
        """Every pattern of digits and other bytes up to 21 bytes long (and at its end, after
        every 3-byte prefix): the sampled check is the full one."""
        for length in range(19, 22):
            for bits in range(1 << length):
                if bits.bit_count() < 19:
                    continue
                data = bytes(48 if bits >> i & 1 else 32 for i in range(length))
                for prefix in (b"", b"x", b"xx", b"xxx"):
                    assert mapper._long_digits(prefix + data) == _old_long_digits(prefix + data)

    @pytest.mark.parametrize("value", [10**18, 10**19 - 1, 2**64, -(2**64), 10**19, -(10**25)])
    @pytest.mark.parametrize("where", ["first", "last", "key", "string", "join"])
    def test_a_long_int_anywhere_decodes_exactly(self, value: int, where: str) -> None:
        """A long int first, last, beside a key of its digits, in a string, or right where two
        documents of a page are joined, reads back exactly, alone and in a page."""
        transcoder = FastJSONTranscoder()
        pad = {"t": "2026-11-28T04:24:19.180479+00:00", "d": 7.1409999691240955e-6}
        cases: dict[str, list[Any]] = {
            "first": [[value, pad], [pad]],
            "last": [[pad], [pad, value]],
            "key": [{str(value): value, **pad}, pad],
            "string": [{"s": f"id{value}x", **pad}, pad],
            "join": [[pad, value], [value, pad]],
        }
        states = cases[where]
        documents = [transcoder.encode(state) for state in states]
        for document, state in zip(documents, states, strict=True):
            decoded = transcoder.decode(document)
            assert decoded == state
            assert repr(decoded) == repr(state)  # an int, not a float equal to it
        page = transcoder.decode_many(documents)
        assert page is None or repr(page) == repr(states)
