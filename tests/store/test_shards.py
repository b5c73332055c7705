"""The shard layout file and the rule that gives each run exactly one shard."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from engine import Engine
from engine.errors import StoreError
from engine.store.shards import Layout, is_sharded, load, shard_index

GOOD = """
by = "label:team"
[shards]
a = "sqlite:///a.db"
b = "postgresql://postgres:secret@127.0.0.1:5432/test?schema=b"
[routes]
payments = "b"
"""


def written(tmp_path: Path, text: str) -> str:
    """A ``shards:`` URL for a layout file holding `text`."""
    path = tmp_path / "shards.toml"
    path.write_text(text, encoding="utf-8")
    return f"shards://{path}"


class TestLoad:
    def test_reads_names_urls_rule_and_routes_in_order(self, tmp_path: Path) -> None:
        """The shards keep the file's order; the rule and routes are as written."""
        layout = load(written(tmp_path, GOOD))
        assert layout.names == ("a", "b")
        assert layout.urls[0] == "sqlite:///a.db"
        assert (layout.by, dict(layout.routes)) == ("label:team", {"payments": "b"})

    def test_a_relative_path_is_read_from_the_working_directory(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``shards:NAME.toml`` names a file relative to the working directory."""
        written(tmp_path, GOOD)
        monkeypatch.chdir(tmp_path)
        assert load("shards:shards.toml").names == ("a", "b")

    def test_the_default_rule_is_the_run_id(self, tmp_path: Path) -> None:
        """Without ``by`` every run goes where its id's hash puts it."""
        layout = load(written(tmp_path, '[shards]\na = "memory://"\n'))
        assert (layout.by, dict(layout.routes)) == ("run_id", {})

    @pytest.mark.parametrize(
        ("text", "named"),
        [
            ("[shards]\n", "lists no store"),
            ("by = 'team'\n[shards]\na = 'memory://'\n", "by = 'team'"),
            ("by = 'label:'\n[shards]\na = 'memory://'\n", "by = 'label:'"),
            ("[shards]\na = 'memory://'\n[routes]\nx = 'z'\n", "'z', which [shards] lacks"),
            ("[shards]\na = 'sqlite:///x.db'\nb = 'sqlite:///x.db'\n", "repeats the store"),
            ("[shards]\na = 'shards:///other.toml'\n", "itself a shards: URL"),
            ("[shards]\na = 3\n", "'a' must be a non-empty string"),
            ("shards = 'memory://'\n", "[shards] must be a table"),
            ("[shards]\na = 'memory://'\n[extra]\n", "unknown key 'extra'"),
            ("[shards\n", "not valid TOML"),
        ],
    )
    def test_a_wrong_layout_is_one_clear_error(self, tmp_path: Path, text: str, named: str) -> None:
        """Each mistake in the file is refused with a message naming it."""
        with pytest.raises(StoreError) as raised:
            load(written(tmp_path, text))
        assert named in str(raised.value)

    def test_a_missing_file_is_named(self, tmp_path: Path) -> None:
        """A layout file that does not exist is a StoreError, not a traceback."""
        with pytest.raises(StoreError, match="cannot read the shard layout"):
            load(f"shards://{tmp_path / 'absent.toml'}")

    def test_an_engine_points_a_shards_url_at_the_sharded_engine(self, tmp_path: Path) -> None:
        """`Engine` opens one store; given a layout it says which class opens several."""
        with pytest.raises(StoreError, match="ShardedEngine"):
            Engine(written(tmp_path, GOOD))

    def test_only_a_shards_prefix_is_sharded(self) -> None:
        """`is_sharded` tells a layout URL from a store URL."""
        assert is_sharded("shards:///x.toml")
        assert not is_sharded("sqlite:///shards.db")


class TestPlacement:
    def test_the_shard_of_an_id_is_fixed(self) -> None:
        """The index is SHA-256 of the id's bytes: the same on every host, for ever."""
        run_id = uuid.UUID("00000000-0000-0000-0000-000000000001")
        assert [shard_index(run_id, n) for n in (1, 2, 3, 7)] == [0, 1, 1, 6]

    def test_ids_spread_over_every_shard(self) -> None:
        """Random ids fill each of three shards with about a third of them."""
        counts = [0, 0, 0]
        for _ in range(3000):
            counts[shard_index(uuid.uuid4(), 3)] += 1
        assert all(800 < count < 1200 for count in counts), counts

    def test_a_routed_pipeline_always_lands_in_its_shard(self) -> None:
        """New ids for a routed pipeline are drawn until they hash to its shard."""
        layout = Layout("shards:x", ("a", "b", "c"), ("m1", "m2", "m3"), "pipeline", {"etl": "c"})
        assert {layout.index_of(layout.new_id("etl", None)) for _ in range(200)} == {2}

    def test_a_routed_label_lands_in_its_shard_and_others_spread(self) -> None:
        """The label's value picks the shard; a run without a route goes anywhere."""
        layout = Layout("shards:x", ("a", "b"), ("m1", "m2"), "label:team", {"search": "b"})
        routed = {layout.index_of(layout.new_id("p", {"team": "search"})) for _ in range(100)}
        spread = {layout.index_of(layout.new_id("p", {"team": "other"})) for _ in range(100)}
        assert (routed, spread) == ({1}, {0, 1})
