"""The views' one serializer: sealed values, keyed digests, no clear text when encrypted."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from engine import Engine, Pipeline
from engine.cli import main
from engine.store.meta import AtRest
from events import StageFailed
from projections import BUILT_INS, Projection, ProjectionError, StageResults, on
from tests._helpers import require_postgres

KEY = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="  # 32 bytes, base64
OTHER_KEY = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA="

SECRETS = {
    "pipeline": "pipeline-okapi-7731",
    "state": "state-axolotl-5512",
    "param": "param-kinkajou-4407",
    "label key": "labelkey-tapir-8803",
    "label value": "labelvalue-margay-2290",
    "result": "result-pangolin-9912",
    "error": "error-quetzal-3381",
    "error type": "ErrorTypeCassowary",
    "rollback reason": "reason-dugong-1174",
    "finish reason": "reason-caracal-6021",
    "note key": "notekey-gharial-5150",
    "note": "note-serval-7290",
    "task title": "title-fossa-6620",
    "projection error": "lasterror-ocelot-3047",
}
STATE = SECRETS["state"]
SECRET = Pipeline(
    SECRETS["pipeline"],
    initial=STATE,
    transitions=[(STATE, "completed", STATE), (STATE, "failed", STATE), ("*", "aborted", "done")],
    final=["done"],
)
LOOPS = 600
"""Each loop records two events: the run is long enough for stored snapshots (every 500)."""


class SecretFailures(Projection[int]):
    """Fails on every failure, naming its error: a last error holding the run's data."""

    name = "secret_failures"

    def initial(self) -> int:
        return 0

    @on(StageFailed)
    def failed(self, state: int, event: StageFailed) -> int:
        raise RuntimeError(f"{SECRETS['projection error']} after {event.error}")


def record_secrets(engine: Engine) -> None:
    """A long run holding every secret, its projections caught up, snapshots stored."""
    run = engine.start_run(
        SECRET,
        params={"card": SECRETS["param"]},
        labels={SECRETS["label key"]: SECRETS["label value"]},
    )
    run.add_task("t1", title=SECRETS["task title"])
    run.note(SECRETS["note key"], SECRETS["note"])
    with run.batch():
        for attempt in range(LOOPS):
            run.stage_completed(STATE, result={"found": f"{SECRETS['result']} #{attempt}"})
            run.stage_failed(STATE, error=SECRETS["error"], error_type=SECRETS["error type"])
    run.rollback(steps=1, reason=SECRETS["rollback reason"])
    run.finish("failed", reason=SECRETS["finish reason"])
    engine.projections.register(StageResults)
    engine.projections.register(SecretFailures)
    with pytest.raises(ProjectionError, match="lasterror"):
        engine.projections.catch_up()
    errors = {status.name: status.last_error for status in engine.projections.status()}
    assert SECRETS["projection error"] in str(errors[SecretFailures.name])
    for projection in BUILT_INS:  # time travel stores snapshots (versions 500, 1000)
        engine.project(run.id, projection, at=1100)
        engine.project(run.id, projection)


def found_in(blobs: Iterator[bytes]) -> set[str]:
    """The names of the secrets whose UTF-8 bytes occur in any of `blobs`."""
    found: set[str] = set()
    for blob in blobs:
        found |= {name for name, text in SECRETS.items() if text.encode() in blob}
    return found


def sqlite_files(path: Path) -> Iterator[bytes]:
    """The bytes of a SQLite store: its file, write-ahead log and shared memory."""
    for part in sorted(path.parent.glob(path.name + "*")):
        yield part.read_bytes()


def postgres_values(url: str) -> Iterator[bytes]:
    """Every value of every column of every table in the store's schema, as bytes."""
    import psycopg
    from psycopg import sql

    base, schema = url.split("?schema=")
    with psycopg.connect(base) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,),
        ).fetchall()
        assert len(tables) >= 8
        for (table,) in tables:
            query = sql.SQL("SELECT * FROM {}").format(sql.Identifier(schema, table))
            for row in conn.execute(query):
                for value in row:
                    if isinstance(value, bytes | memoryview):
                        yield bytes(value)
                    elif value is not None:
                        yield str(value).encode()


class TestCodec:
    def test_sealed_values_come_back(self) -> None:
        """A value sealed with compression and a cipher unseals to itself."""
        settings = AtRest(compressor="zlib", cipher_key=KEY)
        codec = settings.codec(settings.mapper())
        value = {"text": "héllo " * 50, "n": 2**70, "items": [1.5, None, True]}
        sealed = codec.seal(value)
        assert b"llo" not in sealed
        assert codec.unseal(sealed) == value
        assert codec.encrypted

    def test_a_plain_store_seals_json(self) -> None:
        """Without a cipher or compression a sealed value is its JSON."""
        settings = AtRest()
        codec = settings.codec(settings.mapper())
        assert codec.seal({"a": [1, "b"]}) == b'{"a":[1,"b"]}'
        assert not codec.encrypted

    def test_digests_are_keyed_and_stable(self) -> None:
        """Equal texts give equal digests under one key, and other digests under another."""
        first = AtRest(cipher_key=KEY)
        second = AtRest(cipher_key=OTHER_KEY)
        codec = first.codec(first.mapper())
        digest = codec.digest("pipeline-okapi")
        assert digest == first.codec(first.mapper()).digest("pipeline-okapi")
        assert "okapi" not in digest
        assert len(digest) == 64
        assert digest != codec.digest("pipeline-okapj")
        assert digest != second.codec(second.mapper()).digest("pipeline-okapi")

    def test_digests_in_a_plain_store_are_the_text(self) -> None:
        """Without a key the column keeps the text, a NUL and a backslash escaped."""
        settings = AtRest()
        codec = settings.codec(settings.mapper())
        assert codec.digest("review") == "review"
        assert codec.digest("a\x00b") == "a\\0b"
        assert codec.digest("a\\b") == "a\\\\b"

    @pytest.mark.parametrize("key", [None, base64.b64encode(b"k" * 16).decode()])
    def test_different_texts_never_share_a_digest(self, key: str | None) -> None:
        """Texts an escape could confuse (a NUL, its escape, backslashes) stay apart."""
        settings = AtRest(cipher_key=key) if key else AtRest()
        codec = settings.codec(settings.mapper())
        texts = ["a\x00", "a\\0", "a\\\\0", "a\\", "a\\\\", "a0", "a\\x00", "a"]
        assert len({codec.digest(text) for text in texts}) == len(texts)


@pytest.fixture(params=["sqlite", "postgres"])
def url_and_bytes(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Any]:
    """A store URL and a function returning everything its database holds, as bytes."""
    if request.param == "sqlite":
        path = tmp_path / "runs.db"
        return f"sqlite:///{path}", lambda: sqlite_files(path)
    require_postgres()
    url = str(request.getfixturevalue("postgres_url"))
    return url, lambda: postgres_values(url)


class TestEncryptedStore:
    def test_no_secret_is_stored_in_clear(self, url_and_bytes: tuple[str, Any]) -> None:
        """With a cipher key no result, error, label, reason, name, note or title is in clear."""
        url, stored = url_and_bytes
        with Engine(url, cipher_key=KEY) as engine:
            record_secrets(engine)
            assert found_in(stored()) == set()  # the WAL too, while it holds the writes
        assert found_in(stored()) == set()

    def test_a_plain_store_keeps_them_readable(self, url_and_bytes: tuple[str, Any]) -> None:
        """The same run in a store without a key is found by the same scan."""
        url, stored = url_and_bytes
        with Engine(url) as engine:
            record_secrets(engine)
        assert found_in(stored()) == set(SECRETS)

    @pytest.mark.parametrize("key", [KEY, None], ids=["encrypted", "plain"])
    def test_run_filters_answer_on_digests(self, url_and_bytes: tuple[str, Any], key: Any) -> None:
        """engine.runs filters by pipeline and label as before, encrypted or not."""
        url, _ = url_and_bytes
        label = f"{SECRETS['label key']}={SECRETS['label value']}"
        with Engine(url, cipher_key=key) as engine:
            kept = engine.start_run(SECRET, labels={SECRETS["label key"]: SECRETS["label value"]})
            other = engine.start_run(SECRET, labels={SECRETS["label key"]: "other"})
            assert [s.run_id for s in engine.runs(pipeline=SECRET.name, label=label)] == [kept.id]
            assert [s.run_id for s in engine.runs(label=f"{SECRETS['label key']}=other")] == [
                other.id
            ]
            assert engine.runs(pipeline="pipeline-okapi") == []
            summary = engine.runs(limit=1)[0]
            assert summary.pipeline == SECRET.name
            assert summary.labels == {SECRETS["label key"]: "other"}

    def test_the_cli_lists_an_encrypted_store(self, url_and_bytes: tuple[str, Any]) -> None:
        """`stagetrail runs --pipeline --label` answers from the digests, with the key."""
        url, _ = url_and_bytes
        with Engine(url, cipher_key=KEY) as engine:
            run = engine.start_run(SECRET, labels={"team": "search"})
            engine.start_run(SECRET, labels={"team": "ads"})
        args = ["runs", "--store", url, "--pipeline", SECRET.name, "--label", "team=search"]
        result = CliRunner().invoke(main, [*args, "--json"], env={"STAGETRAIL_CIPHER_KEY": KEY})
        assert result.exit_code == 0, result.output
        rows = json.loads(result.stdout)
        assert [row["run_id"] for row in rows] == [str(run.id)]
