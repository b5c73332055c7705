"""Hash-chained runs: every stored event linked to the one before, checked by `verify`."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import random
import shutil
import string
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest

from engine import ConcurrencyConflict, Engine, Run
from engine.store.chain import Chain, StoredRow, split
from engine.store.event_store import PAGE
from engine.verify import ChainCheck
from events import StageCompleted
from tests._helpers import REVIEW
from tests.audit.tampering import Rows

DATA = Path(__file__).resolve().parent.parent / "data"
KEY = "the writers' secret"


def recorded(engine: Engine) -> UUID:
    """A finished run of eight events, its project type "python" in version 2."""
    run = engine.start_run(REVIEW, labels={"team": "core"})
    run.stage_completed("project_analysis", result={"project_type": "python"})
    run.stage_completed("code_review", result={"comments": 3})
    run.stage_failed("developer", error="boom")
    run.stage_completed("developer", result={"patch": "p"})
    run.stage_failed("testing", error="red")
    run.stage_completed("developer", result={"patch": "q"})
    run.finish("failed", reason="given up")
    return run.id


def noted(engine: Engine, count: int) -> Run:
    """A run of `count` notes after its start, recorded in one batch (still running)."""
    run = engine.start_run(REVIEW)
    with run.batch():
        for index in range(count):
            run.note("step", f"s{index}")
    return run


def chain_problems(engine: Engine, run_id: UUID) -> list[tuple[int, str]]:
    report = engine.verify(run_id)
    return [(p.version, p.message) for p in report.problems if p.check == "chain"]


class TestRecordedRuns:
    def test_a_recorded_run_is_intact(self, engine: Engine) -> None:
        """Every event a run records carries a link, and verify finds the chain intact."""
        run_id = recorded(engine)
        report = engine.verify(run_id)
        assert report.ok
        assert (report.chain, report.chained_from, report.events) == ("intact", 1, 8)
        assert str(report.head).startswith("s")

    def test_each_link_covers_the_one_before(self, engine: Engine) -> None:
        """A link is SHA-256 over the previous link, the run, version, topic and stored JSON."""
        run_id = recorded(engine)
        previous = b""
        for stored in engine.store.stored_stream(run_id):
            parts = split(engine.store.mapper.json_of(stored))
            assert parts is not None
            body, mode, link = parts
            expected = Chain().link(previous, run_id, stored.originator_version, stored.topic, body)
            assert (mode, link) == ("s", expected)
            previous = link

    def test_events_read_back_without_their_link(self, engine: Engine) -> None:
        """The link is the store's: the events a run reads back are the ones recorded."""
        run_id = recorded(engine)
        assert engine.events(run_id)[1].result == {"project_type": "python"}  # type: ignore[attr-defined]

    def test_batches_grouped_and_taken_back_keep_the_chain(self, engine: Engine) -> None:
        """A batch that raises is taken back with its links; what follows chains to the store."""
        run = engine.start_run(REVIEW)
        with pytest.raises(RuntimeError), run.batch():
            run.stage_completed("project_analysis", result={"x": 1})
            raise RuntimeError("undo")
        with run.batch():
            run.stage_completed("project_analysis", result={"x": 2})
            run.stage_completed("code_review")
        assert engine.verify(run.id).chain == "intact"

    def test_a_writer_that_lost_a_race_chains_after_the_winner(self, engine: Engine) -> None:
        """After a ConcurrencyConflict and refresh, the loser links to the winner's event."""
        run = engine.start_run(REVIEW)
        other = engine.load(run.id)
        other.stage_completed("project_analysis", result={"by": "other"})
        with pytest.raises(ConcurrencyConflict):
            run.stage_completed("project_analysis", result={"by": "run"})
        run.refresh().stage_completed("code_review")
        assert engine.verify(run.id).chain == "intact"

    def test_a_loaded_run_chains_to_its_stored_head(self, engine: Engine) -> None:
        """A handle loaded from the store reads its newest link once and chains to it."""
        run_id = recorded(engine)
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis")
        engine.load(run.id).stage_completed("code_review")
        assert engine.verify(run.id).chain == "intact"
        assert engine.verify(run_id).chain == "intact"

    def test_a_fork_has_its_own_intact_chain(self, engine: Engine) -> None:
        """A fork's copies are linked afresh in the new run, and it goes on chained."""
        run_id = recorded(engine)
        fork = engine.fork(run_id, at=4)
        fork.stage_completed("developer")
        report = engine.verify(fork.id)
        assert (report.chain, report.events) == ("intact", 5)


class TestLinkFormat:
    """Links are pinned to their documented bytes: stores written by earlier releases verify."""

    RUN = UUID(bytes=b"%b" + b"%" * 14)  # %-format's own character in the run's bytes
    BODY = b'{"stage":"x","result":"100%"}'

    def message(self, previous: bytes, version: int) -> bytes:
        return previous + self.RUN.bytes + version.to_bytes(8, "big") + b"t:X\x00" + self.BODY

    def test_a_plain_link_is_sha256_of_its_message(self) -> None:
        """A plain link is the first 16 bytes of SHA-256 over the previous link, the run's
        16 bytes, the version's 8, the topic, a NUL and the stored JSON."""
        previous = b"p" * 16
        expected = hashlib.sha256(self.message(previous, 7)).digest()[:16]
        assert Chain().link(previous, self.RUN, 7, "t:X", self.BODY) == expected

    def test_a_keyed_link_is_hmac_sha256_of_its_message(self) -> None:
        """A keyed link is HMAC-SHA256 of the same message under a key derived from the
        writers' secret, truncated to 16 bytes, for every event of a run in turn."""
        secret = KEY.encode()
        derived = hmac.digest(secret, b"stagetrail chain: keyed links of a run's events", "sha256")
        chain, previous = Chain(secret), b""
        for version in (1, 2, 3):
            expected = hmac.digest(derived, self.message(previous, version), "sha256")[:16]
            assert chain.link(previous, self.RUN, version, "t:X", self.BODY) == expected
            previous = expected

    @pytest.mark.parametrize("secret", [None, KEY.encode()], ids=["plain", "keyed"])
    def test_sealed_rows_check_along_a_page(self, secret: bytes | None) -> None:
        """`sealed` writes the link `seal` writes, and `run_along` accepts the rows it wrote
        and stops at the first one edited."""
        chain, previous, rows = Chain(secret), b"", []
        for version in range(1, 6):
            data, link = chain.sealed(previous, self.RUN, version, "t:X", self.BODY)
            assert data == chain.seal(
                self.BODY, chain.link(previous, self.RUN, version, "t:X", self.BODY)
            )
            rows.append((version, "t:X", data))
            previous = link
        assert Chain(secret).run_along(b"", 1, self.RUN, rows) == (5, previous)
        rows[3] = (4, "t:X", rows[3][2].replace(b"100%", b"101%"))
        assert Chain(secret).run_along(b"", 1, self.RUN, rows)[0] == 3

    @pytest.mark.parametrize("secret", [None, KEY.encode()], ids=["plain", "keyed"])
    def test_sealing_two_runs_in_turn_links_each_in_its_own_run(self, secret: bytes | None) -> None:
        """Events of two runs sealed alternately carry the links `link` gives each run (the
        chain's per-run message format is switched, never reused for the other run)."""
        chain, other = Chain(secret), UUID(int=7)
        previous = {self.RUN: b"", other: b""}
        for version in range(1, 4):
            for run_id in (self.RUN, other, other, self.RUN):
                data, link = chain.sealed(previous[run_id], run_id, version, "t:X", self.BODY)
                expected = Chain(secret).link(previous[run_id], run_id, version, "t:X", self.BODY)
                assert (data, link) == (chain.seal(self.BODY, expected), expected)
            previous = {
                run_id: Chain(secret).link(previous[run_id], run_id, version, "t:X", self.BODY)
                for run_id in previous
            }


class TestRunAlongAgainstFollows:
    """`run_along`'s page loop and `follows` (one event, the slow path) agree on random pages."""

    RUN = TestLinkFormat.RUN

    def page(self, chain: Chain, draw: random.Random) -> list[tuple[int, str, bytes]]:
        """Ten to forty sealed rows with random bodies and topics, tampered at random: a byte
        edited, a row cut short or dropped, two rows swapped, a link in the other mode."""
        previous, rows = b"", []
        for version in range(1, draw.randint(10, 40)):
            text = "".join(draw.choice('ab%"\\}{,') for _ in range(draw.randint(0, 60)))
            body = b'{"v":"' + text.encode() + b'"}'
            topic = draw.choice(["t:X", "t:Y", "%s"])
            data, previous = chain.sealed(previous, self.RUN, version, topic, body)
            rows.append((version, topic, data))
        for _ in range(draw.randint(0, 2)):
            index = draw.randrange(len(rows))
            version, topic, data = rows[index]
            tampering = draw.choice(["edit", "cut", "drop", "swap", "mode"])
            if tampering == "edit":
                at = draw.randrange(len(data))
                rows[index] = (version, topic, data[:at] + b"#" + data[at + 1 :])
            elif tampering == "cut":
                rows[index] = (version, topic, data[: draw.randrange(len(data))])
            elif tampering == "drop":
                del rows[index]
            elif tampering == "swap" and index:
                rows[index - 1], rows[index] = rows[index], rows[index - 1]
            elif tampering == "mode":
                rows[index] = (version, topic, data.replace(b'"_c":"s', b'"_c":"k'))
        return rows

    @staticmethod
    def followed(chain: Chain, rows: list[tuple[int, str, bytes]]) -> tuple[int, bytes]:
        """How many rows follow on one by one through `follows`, and the last link."""
        previous, count = b"", 0
        for version, topic, data in rows:
            link = chain.follows(previous, TestRunAlongAgainstFollows.RUN, version, topic, data)
            if version != count + 1 or not link:
                break
            previous, count = link, count + 1
        return count, previous

    @pytest.mark.parametrize("secret", [None, KEY.encode()], ids=["plain", "keyed"])
    def test_random_pages_follow_as_far_one_event_at_a_time(self, secret: bytes | None) -> None:
        """On 300 random pages (tampered or not), `run_along` from the first row follows as
        many rows as `follows` does one by one, ending on the same link."""
        chain, draw = Chain(secret), random.Random(29)
        for _ in range(300):
            rows = self.page(chain, draw)
            assert chain.run_along(b"", 1, self.RUN, rows) == self.followed(chain, rows)

    @pytest.mark.parametrize("secret", [None, KEY.encode()], ids=["plain", "keyed"])
    @pytest.mark.parametrize("at", [0, 1, 2, 7, 8, 9, 10, 71, 72, 73, 74, 583, 584, 585, 699])
    def test_a_long_page_breaks_where_one_event_at_a_time_does(
        self, secret: bytes | None, at: int
    ) -> None:
        """On a page of 700 rows (`run_along` compares them a chunk at a time, chunks of 1,
        8, 64, 512), a row's body, link text, mark or closing byte edited, at the edges of
        chunks too, stops it where `follows` one by one stops, on the same link."""
        chain, previous, rows = Chain(secret), b"", []
        for version in range(1, 701):
            body = b'{"v":%d}' % version
            data, previous = chain.sealed(previous, self.RUN, version, "t:X", body)
            rows.append((version, "t:X", data))
        assert chain.run_along(b"", 1, self.RUN, rows) == (700, previous)
        version, topic, data = rows[at]
        for place in (2, -10, -25, -26, -2, -1):  # body, link text (3), mark's mode, close
            edited = data[:place] + b"#" + data[place:][1:]
            tampered = [*rows[:at], (version, topic, edited), *rows[at + 1 :]]
            found = chain.run_along(b"", 1, self.RUN, tampered)
            assert found == self.followed(chain, tampered), place
            assert found[0] == at, place


def one_by_one(
    chain: Chain, previous: bytes, version: int, run_id: UUID, rows: list[StoredRow], start: int
) -> tuple[int, bytes]:
    """How many `rows` from `start` follow on through `follows`, one row at a time (versions
    from `version`, links from `previous`), and the last link: what `run_along` must give."""
    count = 0
    for row_version, topic, data in rows[start:]:
        link = chain.follows(previous, run_id, row_version, topic, data)
        if row_version != version + count or not link:
            break
        previous, count = link, count + 1
    return count, previous


class TestRunAlongTampered:
    """`run_along` against `follows` one row at a time over random tamperings of pages of
    every length (chunks' edges included), read from random offsets, in every mode."""

    RUN = TestLinkFormat.RUN
    KINDS = ("edit", "tail", "cut", "short", "drop", "insert", "swap", "mode", "gap",
             "not last", "other run", "other chain", "shift", "topic")  # fmt: skip

    def sealed(self, chain: Chain, draw: random.Random) -> tuple[bytes, int, list[StoredRow]]:
        """A page of 1 to 700 sealed rows with random bodies and topics, continuing a run
        from a random version and link: the link before it, its first version, its rows."""
        before, first = draw.choice([b"", draw.randbytes(16)]), draw.randint(1, 3000)
        count = draw.choice(
            [1, 2, draw.randint(1, 20), draw.randint(1, 80), draw.randint(500, 700)]
        )
        previous, rows = before, []
        for version in range(first, first + count):
            text = "".join(draw.choice('ab%"\\}{,') for _ in range(draw.randint(0, 40)))
            topic = draw.choice(["t:X", "t:Y", "%s"])
            data, previous = chain.sealed(
                previous, self.RUN, version, topic, b'{"v":"%b"}' % text.encode()
            )
            rows.append((version, topic, data))
        return before, first, rows

    def tamper(
        self, chain: Chain, others: list[Chain], rows: list[StoredRow], draw: random.Random
    ) -> None:
        """One tampering a database writer could do, at a random row; versions stay strictly
        increasing, as a store returns them (a deleted event leaves a gap)."""
        index = draw.randrange(len(rows))
        version, topic, data = rows[index]
        kind = draw.choice(self.KINDS)
        if kind == "edit":
            at = draw.randrange(max(1, len(data)))
            rows[index] = (
                version,
                topic,
                data[:at] + bytes([draw.randrange(256)]) + data[at + 1 :],
            )
        elif kind == "tail":  # a byte of the link's member, or just before it
            at = max(0, len(data) - draw.randint(1, 33))
            rows[index] = (version, topic, data[:at] + b"#" + data[at + 1 :])
        elif kind == "cut":
            rows[index] = (version, topic, data[: draw.randrange(max(1, len(data)))])
        elif kind == "short":  # too short to hold a link, its start or its end kept
            kept = draw.randint(0, 31)
            rows[index] = (
                version,
                topic,
                data[-kept:] if kept and draw.random() < 0.5 else data[:kept],
            )
        elif kind == "drop":
            del rows[index]
        elif kind == "gap":
            moved = draw.choice([1, 2, 1000])
            rows[index:] = [(v + moved, t, d) for v, t, d in rows[index:]]
        elif kind == "insert":  # an event linked on its own, the versions after it renumbered
            new = chain.sealed(b"", self.RUN, version, topic, b'{"n":1}')[0]
            rows[index:] = [(version, topic, new)] + [(v + 1, t, d) for v, t, d in rows[index:]]
        elif kind == "swap" and index:  # two events' contents exchanged, versions in place
            earlier, earlier_topic, earlier_data = rows[index - 1]
            rows[index - 1 : index + 1] = [
                (earlier, topic, data),
                (version, earlier_topic, earlier_data),
            ]
        elif kind == "mode":
            other = b"k" if chain.mode == "s" else b"s"
            rows[index] = (
                version,
                topic,
                data[:-31] + data[-31:].replace(b'"_c":"' + chain.mode.encode(), b'"_c":"' + other),
            )
        elif kind == "not last":
            rows[index] = (version, topic, data[:-1] + b',"z":1}')
        elif kind in ("other run", "other chain"):  # linked right, but in another run or chain
            writer, run_id = (
                (chain, UUID(int=7)) if kind == "other run" else (draw.choice(others), self.RUN)
            )
            rows[index] = (
                version,
                topic,
                writer.sealed(b"", run_id, version, topic, data[:-31] + b"}")[0],
            )
        elif kind == "shift" and index + 1 < len(rows):  # bytes moved from a row's end to the next
            moved, (after, after_topic, after_data) = draw.randint(1, 5), rows[index + 1]
            rows[index : index + 2] = [
                (version, topic, data[:-moved]),
                (after, after_topic, data[-moved:] + after_data),
            ]
        elif kind == "topic":
            rows[index] = (version, draw.choice(["t:X", "t:Y", "%s", "t:Z"]), data)

    @pytest.mark.parametrize("seed", range(4))
    def test_random_tamperings_follow_as_far_as_one_row_at_a_time(self, seed: int) -> None:
        """On 500 random pages (plain, keyed under two keys; none to three tamperings; from
        their first row or a random one, an empty rest included), `run_along` follows as
        many rows as `follows` one by one and returns the same last link."""
        draw = random.Random(seed)
        chains = [Chain(None), Chain(b"k1"), Chain(b"k2")]
        for _ in range(500):
            chain = draw.choice(chains)
            before, first, rows = self.sealed(chain, draw)
            for _ in range(draw.choice([0, 1, 1, 2, 3])):
                if rows:
                    self.tamper(chain, [c for c in chains if c is not chain], rows, draw)
            start = draw.randint(0, len(rows)) if draw.random() < 0.3 else 0
            previous, version = before, first
            if start:  # from where a caller stands: the link and version one by one reached
                previous, version = (
                    one_by_one(chain, before, first, self.RUN, rows[:start], 0)[1],
                    first + start,
                )
            expected = one_by_one(chain, previous, version, self.RUN, rows, start)
            assert chain.run_along(previous, version, self.RUN, rows, start) == expected


class TestRunAlongCost:
    """A break costs `run_along` no more links than checking event by event would."""

    RUN = TestLinkFormat.RUN

    @pytest.fixture
    def links_computed(self, monkeypatch: pytest.MonkeyPatch) -> list[int]:
        """Each call's count of links `run_along` computed (plain or keyed)."""
        counts: list[int] = []
        for name in ("_links_plain", "_links_keyed"):
            computing = getattr(Chain, name)

            def counted(self: Chain, *args: Any, computing: Any = computing) -> list[bytes]:
                links: list[bytes] = computing(self, *args)
                counts.append(len(links))
                return links

            monkeypatch.setattr(Chain, name, counted)
        return counts

    @pytest.mark.parametrize(
        ("writer", "reader", "edited"),
        [(KEY.encode(), None, False), (None, KEY.encode(), False), (None, None, True)],
        ids=["keyed-read-without-key", "plain-read-with-key", "every-event-edited"],
    )
    def test_a_run_broken_at_every_event_costs_a_link_an_event(
        self, writer: bytes | None, reader: bytes | None, edited: bool, links_computed: list[int]
    ) -> None:
        """A page whose every event fails to follow on (keyed links read without the key,
        plain ones read with it, every body edited) is checked computing at most one link
        an event in `run_along`, as one event at a time would, not a chunk's worth each."""
        chain, previous, rows = Chain(writer), b"", []
        for version in range(1, 201):
            data, previous = chain.sealed(previous, self.RUN, version, "t:X", b'{"v":1}')
            rows.append((version, "t:X", data.replace(b'{"v":1', b'{"v":2') if edited else data))
        check = ChainCheck(Chain(reader), self.RUN)
        check.page(rows)
        assert (check.unchecked, len(check.problems)) == (
            (True, 0) if reader is None and not edited else (False, 200)
        )
        assert sum(links_computed) <= len(rows), sum(links_computed)


class TestRunAlongTopics:
    @pytest.mark.parametrize("key", [None, b"k"], ids=["plain", "keyed"])
    def test_a_topic_changed_to_its_neighbours_breaks_there(self, key: bytes | None) -> None:
        """Rows whose topics alternate (each a new str, as a driver gives) follow on; a row
        given the topic of the row before it (the one `run_along` last read) stops there."""
        chain, run_id, previous, rows = Chain(key), uuid4(), b"", []
        for version in range(1, 9):
            topic = "t:A" if version % 3 else "t:B"
            data, previous = chain.sealed(previous, run_id, version, topic, b'{"v":1}')
            rows.append((version, "".join(topic), data))
        assert chain.run_along(b"", 1, run_id, rows)[0] == 8
        rows[3] = (4, "t:B", rows[3][2])  # version 4 was t:A; version 3 is t:B
        assert chain.run_along(b"", 1, run_id, rows)[0] == 3


class TestEveryByte:
    """No stored byte of an event can be changed without the chain check finding it."""

    RUN = TestLinkFormat.RUN
    OTHERS = b'ABMNgh09-_+/=#"} \x00\xff'
    """Replacement bytes: base64 letters of each quarter of the alphabet, the standard
    alphabet's two, padding, the JSON closing bytes and bytes outside ASCII."""

    @pytest.mark.parametrize("secret", [None, KEY.encode()], ids=["plain", "keyed"])
    def test_any_byte_of_an_event_edited_breaks_the_chain(self, secret: bytes | None) -> None:
        """Each byte of the middle of three sealed events, its link's text included, changed
        to each of `OTHERS` in turn, is a chain problem at that event's version."""
        chain, previous, rows = Chain(secret), b"", []
        for version in (1, 2, 3):
            data, previous = chain.sealed(previous, self.RUN, version, "t:X", b'{"v":"ab"}')
            rows.append((version, "t:X", data))
        data = rows[1][2]
        for at, other in itertools.product(range(len(data)), self.OTHERS):
            if data[at] != other:
                edited = [rows[0], (2, "t:X", data[:at] + bytes([other]) + data[at + 1 :]), rows[2]]
                check = ChainCheck(Chain(secret), self.RUN)
                check.page(edited)
                assert [p.version for p in check.problems][:1] == [2], (at, bytes([other]))


class TestTampering:
    """Rows changed behind stagetrail's back, in SQLite and PostgreSQL: verify names the version."""

    @pytest.fixture
    def setup(self, shared_url: str) -> tuple[Engine, UUID, Rows]:
        engine = Engine(shared_url)
        return engine, recorded(engine), Rows(shared_url)

    def test_an_edited_payload_is_found_at_its_version(
        self, setup: tuple[Engine, UUID, Rows]
    ) -> None:
        """A result edited in the database breaks the chain at that event's version."""
        engine, run_id, rows = setup
        rows.edit(run_id, 2, b'"python"', b'"rustc_"')
        assert engine.events(run_id)[1].result == {"project_type": "rustc_"}  # type: ignore[attr-defined]
        report = engine.verify(run_id)
        assert (report.ok, report.chain) == (False, "broken")
        assert [v for v, _ in chain_problems(engine, run_id)] == [2]
        assert report.problems[0].version == 2
        engine.close()

    def test_a_deleted_event_is_found_at_its_version(
        self, setup: tuple[Engine, UUID, Rows]
    ) -> None:
        """A row deleted from the middle of a run is named as the missing version."""
        engine, run_id, rows = setup
        rows.delete(run_id, 5)
        ((version, message),) = chain_problems(engine, run_id)
        assert (version, "missing" in message) == (5, True)
        engine.close()

    def test_reordered_events_are_found_at_the_first_moved_version(
        self, setup: tuple[Engine, UUID, Rows]
    ) -> None:
        """Two events swapped (same versions, contents exchanged) break every link they touch:
        each of the two, and the one after them, which no longer follows its predecessor."""
        engine, run_id, rows = setup
        rows.swap(run_id, 3, 4)
        assert [v for v, _ in chain_problems(engine, run_id)] == [3, 4, 5]
        assert engine.verify(run_id).problems[0].version == 3
        engine.close()

    def test_an_inserted_event_is_found_at_its_version(
        self, setup: tuple[Engine, UUID, Rows]
    ) -> None:
        """An event added by SQL after the run's last (a copy of a real one) breaks the chain."""
        engine, run_id, rows = setup
        rows.delete(run_id, 8)
        rows.insert(run_id, 8, *rows.get(run_id, 7))
        assert [v for v, _ in chain_problems(engine, run_id)] == [8]
        engine.close()

    def test_an_edit_after_the_link_is_found_at_its_version(
        self, setup: tuple[Engine, UUID, Rows]
    ) -> None:
        """The bytes closing an event's link (its quote and the object's brace) are checked
        too: an event whose link's closing quote was edited breaks the chain at its version,
        checked alone or in the whole verify."""
        engine, run_id, rows = setup
        topic, state = rows.get(run_id, 2)
        rows.put(run_id, 2, topic, state[:-2] + b"#}")
        alone = engine.verify(run_id, chain_only=True)
        assert (alone.chain, alone.problems[0].version) == ("broken", 2)
        assert [v for v, _ in chain_problems(engine, run_id)][:1] == [2]
        engine.close()

    def test_a_link_text_decoding_to_the_same_link_is_found_at_its_version(
        self, setup: tuple[Engine, UUID, Rows]
    ) -> None:
        """A link's last character changed to one differing only in the bits base64 drops
        (its text no longer the one the link encodes to) breaks the chain at its version,
        checked alone or in the whole verify."""
        engine, run_id, rows = setup
        topic, state = rows.get(run_id, 2)
        alphabet = string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_"
        last = alphabet.index(chr(state[-3]))
        other = alphabet[last ^ 1].encode()
        rows.put(run_id, 2, topic, state[:-3] + other + state[-2:])
        alone = engine.verify(run_id, chain_only=True)
        assert (alone.chain, alone.problems[0].version) == ("broken", 2)
        assert [v for v, _ in chain_problems(engine, run_id)][:1] == [2]
        engine.close()

    def test_a_keyed_link_in_a_plain_store_is_found_at_its_version(
        self, setup: tuple[Engine, UUID, Rows]
    ) -> None:
        """An edited event whose link was marked keyed in a store whose recorded chain is plain
        (a link no key can check) breaks the chain at its version, alone or in the whole
        verify, instead of leaving the chain unchecked."""
        engine, run_id, rows = setup
        rows.edit(run_id, 2, b'"python"', b'"rustc_"')
        rows.edit(run_id, 2, b'"_c":"s', b'"_c":"k')
        alone = engine.verify(run_id, chain_only=True)
        assert (alone.chain, [p.version for p in alone.problems]) == ("broken", [2])
        assert "forged" in alone.problems[0].message
        assert [v for v, _ in chain_problems(engine, run_id)] == [2]
        engine.close()

    def test_checking_page_by_page_finds_the_same_breaks(
        self, setup: tuple[Engine, UUID, Rows]
    ) -> None:
        """The chain checked alone, a page at a time, names the versions verify names."""
        engine, run_id, rows = setup
        rows.swap(run_id, 3, 4)
        rows.delete(run_id, 7)
        links = ChainCheck(engine.store.mapper.chain, run_id)
        assert links.pages(engine.store.stored_rows(run_id), engine.store.mapper) == 7
        assert [p.version for p in links.problems] == [3, 4, 5, 7]
        assert [v for v, _ in chain_problems(engine, run_id)] == [3, 4, 5, 7]
        engine.close()

    def test_an_edit_with_its_link_recomputed_breaks_the_next_link(
        self, setup: tuple[Engine, UUID, Rows]
    ) -> None:
        """Re-linking the edited event alone is not enough: the next event no longer follows."""
        engine, run_id, rows = setup
        topic, state = rows.get(run_id, 2)
        body, _, _ = split(state) or pytest.fail("no link")
        body = body.replace(b'"python"', b'"rustc_"')
        previous = split(rows.get(run_id, 1)[1])
        assert previous is not None
        link = Chain().link(previous[2], run_id, 2, topic, body)
        rows.put(run_id, 2, topic, Chain().seal(body, link))
        assert [v for v, _ in chain_problems(engine, run_id)] == [3]
        engine.close()

    def test_a_chain_forged_without_the_key_is_found(self, shared_url: str) -> None:
        """With a chain key, an event re-linked by someone without it is a problem."""
        with Engine(shared_url, chain_key=KEY) as engine:
            run_id = recorded(engine)
            assert engine.verify(run_id).head.startswith("k")  # type: ignore[union-attr]
            rows = Rows(shared_url)
            topic, state = rows.get(run_id, 8)
            body, _, _ = split(state) or pytest.fail("no link")
            previous = split(rows.get(run_id, 7)[1])
            assert previous is not None
            forged = Chain().link(previous[2], run_id, 8, topic, body.replace(b"given", b"GIVEN"))
            rows.put(run_id, 8, topic, Chain().seal(body.replace(b"given", b"GIVEN"), forged))
            assert [v for v, _ in chain_problems(engine, run_id)] == [8]
            with Engine(shared_url, chain_key="a guess", read_only=True) as guessing:
                assert [v for v, _ in chain_problems(guessing, run_id)][:1] == [1]


class TestKeys:
    def test_keyed_links_are_unchecked_without_the_key(self, sqlite_url: str) -> None:
        """A keyed chain read without its key is reported unchecked, not broken."""
        with Engine(sqlite_url, chain_key=KEY) as engine:
            run_id = recorded(engine)
            assert engine.verify(run_id).chain == "intact"
        with Engine(sqlite_url, read_only=True) as engine:
            report = engine.verify(run_id)
            assert (report.ok, report.chain) == (True, "unchecked")

    def test_an_encrypted_store_is_keyed_by_its_cipher_key(self, sqlite_url: str) -> None:
        """With a cipher key and no chain key, links are HMACs with a key derived from it."""
        cipher_key = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="  # 32 bytes, base64
        with Engine(sqlite_url, cipher_key=cipher_key) as engine:
            run_id = recorded(engine)
            report = engine.verify(run_id)
            assert (report.chain, report.head[:1]) == ("intact", "k")  # type: ignore[index]

    def test_a_wrong_key_breaks_every_link(self, sqlite_url: str) -> None:
        """Read with another key, the key is named wrong and the chain breaks at version 1."""
        with Engine(sqlite_url, chain_key=KEY) as engine:
            run_id = recorded(engine)
        with Engine(sqlite_url, chain_key="another", read_only=True) as engine:
            report = engine.verify(run_id)
            assert (report.problems[0].version, report.problems[0].check) == (0, "chain key")
            assert "not the one this store's hash chain was recorded with" in (
                report.problems[0].message
            )
            assert chain_problems(engine, run_id)[0][0] == 1


class TestOldStores:
    @pytest.fixture
    def old(self, tmp_path: Path) -> str:
        copy = tmp_path / "v1.db"
        shutil.copy(DATA / "v1_store.db", copy)
        return f"sqlite:///{copy}"

    def test_a_store_written_before_chaining_is_unchained_not_tampered(self, old: str) -> None:
        """Every run of the first released schema verifies ok, its chain reported unchained."""
        with Engine(old) as engine:
            for summary in engine.runs():
                report = engine.verify(summary.run_id)
                assert (report.ok, report.chain, report.head) == (True, "unchained", None)

    def test_a_run_continued_today_is_chained_from_its_new_events(self, old: str) -> None:
        """Events appended to an old run are linked from there on: the chain is partial."""
        open_run = UUID("00000000-0000-4000-8000-00000000000c")
        with Engine(old) as engine:
            before = engine.load(open_run).version
            engine.resume(open_run).note("audit", "continued")  # resume records the interruption
            report = engine.verify(open_run)
            assert report.ok
            assert (report.chain, report.chained_from) == ("partial", before + 1)


class TestChainAlone:
    """`engine.verify(run, chain_only=True)`: the chain a page at a time, nothing decoded."""

    def test_it_names_the_versions_the_whole_verify_names(self, shared_url: str) -> None:
        """Swapped and deleted rows are reported at the same versions, as chain problems only."""
        with Engine(shared_url) as engine:
            run_id = recorded(engine)
            rows = Rows(shared_url)
            rows.swap(run_id, 3, 4)
            rows.delete(run_id, 7)
            alone = engine.verify(run_id, chain_only=True)
            assert [(p.version, p.check) for p in alone.problems] == [
                (3, "chain"), (4, "chain"), (5, "chain"), (7, "chain"),
            ]  # fmt: skip
            assert (alone.chain, alone.events) == ("broken", 7)
            assert [v for v, _ in chain_problems(engine, run_id)] == [3, 4, 5, 7]

    def test_it_leaves_the_tables_rules_to_the_whole_verify(self, engine: Engine) -> None:
        """An outcome no row of the table allows, stored with its right link, passes the
        chain alone; the whole verify reports it."""
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis", result={})
        illegal = StageCompleted(
            run_id=run.id, version=3, stage="code_review", attempt=1, outcome="ship"
        )
        engine.store.append([illegal])
        alone = engine.verify(run.id, chain_only=True)
        assert (alone.ok, alone.chain, alone.events) == (True, "intact", 3)
        assert [p.check for p in engine.verify(run.id).problems] == ["transition"]

    def test_a_break_pages_into_a_long_run_is_found(self, sqlite_url: str) -> None:
        """In a run longer than a page, an edit and a deletion in later pages are named."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(REVIEW)
            with run.batch():
                for index in range(2 * PAGE + 100):
                    run.note("step", f"s{index}")
            rows = Rows(sqlite_url)
            rows.delete(run.id, PAGE + 1)  # the first event of the second page
            topic, state = rows.get(run.id, PAGE + 500)
            rows.put(run.id, PAGE + 500, topic, state.replace(b'"s', b'"S', 1))
            alone = engine.verify(run.id, chain_only=True)
            assert [p.version for p in alone.problems] == [PAGE + 1, PAGE + 500]
            assert alone.events == 2 * PAGE + 100
            assert [v for v, _ in chain_problems(engine, run.id)] == [PAGE + 1, PAGE + 500]

    @pytest.mark.parametrize(
        ("tampering", "expected"),
        [
            ("edited", [301]),
            ("deleted", [301]),
            ("inserted", [301, 302]),
            ("reordered", [301, 302, 303]),
        ],
    )
    def test_a_break_inside_a_pages_big_chunk_is_named(
        self, shared_url: str, tampering: str, expected: list[int]
    ) -> None:
        """A row in the middle of a page's 512-row chunk (versions 75 to 586 of the first
        page, whose links `Chain.run_along` compares at once) edited, deleted, replaced by a
        copy of the event before it, or swapped with the next is named at its versions (and
        the next row's, whose link no longer follows the stored one before it), alone and in
        the whole verify, in SQLite and PostgreSQL."""
        with Engine(shared_url) as engine:
            run = noted(engine, PAGE + 199)
            rows = Rows(shared_url)
            if tampering == "edited":
                topic, state = rows.get(run.id, 301)
                rows.put(run.id, 301, topic, state.replace(b'"s', b'"S', 1))
            elif tampering == "deleted":
                rows.delete(run.id, 301)
            elif tampering == "inserted":
                rows.delete(run.id, 301)
                rows.insert(run.id, 301, *rows.get(run.id, 300))
            else:
                rows.swap(run.id, 301, 302)
            alone = engine.verify(run.id, chain_only=True)
            assert sorted({p.version for p in alone.problems}) == expected
            assert alone.chain == "broken"
            assert sorted({v for v, _ in chain_problems(engine, run.id)}) == expected

    def test_an_encrypted_store_is_checked_through_its_cipher(self, sqlite_url: str) -> None:
        """Links are read after decryption; an event that no longer decrypts is a format
        problem at its version."""
        cipher_key = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="  # 32 bytes, base64
        with Engine(sqlite_url, cipher_key=cipher_key) as engine:
            run_id = recorded(engine)
            alone = engine.verify(run_id, chain_only=True)
            assert (alone.ok, alone.chain, alone.head[:1]) == (True, "intact", "k")  # type: ignore[index]
            rows = Rows(sqlite_url)
            topic, state = rows.get(run_id, 3)
            rows.put(run_id, 3, topic, state[:-1] + bytes([state[-1] ^ 1]))
            alone = engine.verify(run_id, chain_only=True)
            assert (alone.problems[0].version, alone.problems[0].check) == (3, "format")
            assert alone.chain == "broken"
