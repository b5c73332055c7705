"""Checkpoint skeletons stored as JSON: deltas from the parent only where they rebuild exactly."""

from __future__ import annotations

import importlib.util
import math
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="needs the langgraph extra (the package imports it)")

from engine import Engine
from engine.integrations.langgraph import StagetrailSaver, skeleton
from events import CheckpointSaved

DATA = Path(__file__).resolve().parents[1] / "data"
OLD_STORE = DATA / "langgraph_delta_store.db"
"""Threads the saver wrote with skeletons as deltas (see `make_langgraph_delta_store.py`)."""

PARENT: dict[str, Any] = {
    "v": 4,
    "id": "1f0-1",
    "ts": "2026-11-23T10:00:00+00:00",
    "channel_versions": {"log": 2, "branch:to:plan": 2},
    "versions_seen": {"plan": {"branch:to:plan": 1}},
    "updated_channels": ["log"],
}
GRANDCHILD: dict[str, Any] = {
    "v": 4,
    "ts": "2026-11-23T10:00:02+00:00",
    "channel_versions": {"log": 4, "branch:to:plan": 2, "plan": 3, "ship": 4},
    "versions_seen": {"plan": {"branch:to:plan": 2}, "ship": {"plan": 3, "log": 3}},
    "updated_channels": ["log", "plan"],
}
CHILD: dict[str, Any] = {
    "v": 4,
    "id": "1f0-2",
    "ts": "2026-11-23T10:00:01+00:00",
    "channel_versions": {"log": 3, "branch:to:plan": 2, "plan": 3},
    "versions_seen": {"plan": {"branch:to:plan": 2}},
    "updated_channels": ["log", "plan"],
}


class _Key(str):
    """A str subclass: equal to the plain str, but not what JSON gives back."""


class TestIsPlain:
    @pytest.mark.parametrize(
        "value",
        [
            {"text": "reply", "step": 2, "ok": True, "none": None},
            ["a", 1, False, None],
            {"n": 1.5, "inner": {"x": [1, "y"]}},
            [[], {}, [0.25]],
        ],
        ids=["flat-dict", "flat-list", "nested-dict", "nested-list"],
    )
    def test_what_json_holds_exactly_is_plain(self, value: Any) -> None:
        """Flat and nested containers of str, int, bool, None and finite floats are plain."""
        assert skeleton.is_plain(value)

    @pytest.mark.parametrize(
        "value",
        [
            {"a": 1, 2: "b"},
            {_Key("a"): 1},
            {"a": _Key("b")},
            ["a", (1,)],
            [1, math.nan],
            {"a": math.inf},
            ["a", b"b"],
            {"a": {"b": (1,)}},
        ],
        ids=["int-key", "str-subclass-key", "str-subclass", "tuple", "nan", "inf", "bytes", "deep"],
    )
    def test_a_flat_container_with_one_odd_item_is_not(self, value: Any) -> None:
        """One key or item JSON would change, flat or nested, makes the container not plain."""
        assert not skeleton.is_plain(value)


class TestEncode:
    def test_a_child_is_stored_as_what_changed(self) -> None:
        """Only the versions that changed are stored, and they rebuild the child exactly."""
        stored = skeleton.encode(CHILD, PARENT)
        assert stored is not None
        assert "patch" in stored
        assert stored["patch"]["channel_versions"] == {"log": 3, "plan": 3}
        assert skeleton.decode(stored, PARENT) == CHILD

    def test_a_removed_channel_makes_it_full(self) -> None:
        """A delta cannot say a key went away: such a skeleton is stored whole."""
        child = {**CHILD, "channel_versions": {"log": 3}}
        stored = skeleton.encode(child, PARENT)
        assert stored == {"full": child}
        assert skeleton.decode(stored, None) == child

    def test_without_a_parent_it_is_full(self) -> None:
        """The first checkpoint of a thread has nothing to be a delta of."""
        assert skeleton.encode(PARENT, None) == {"full": PARENT}

    @pytest.mark.parametrize(
        "value",
        [(1, 2), b"x", {1: "a"}, math.nan, math.inf, {"nested": {"s": {1, 2}}}],
        ids=["tuple", "bytes", "int-key", "nan", "inf", "set"],
    )
    def test_what_json_cannot_hold_exactly_is_left_to_serde(self, value: Any) -> None:
        """A skeleton holding a value JSON would change is not stored as JSON at all."""
        assert skeleton.encode({**PARENT, "extra": value}, None) is None

    def test_a_delta_needs_its_parent(self) -> None:
        """Decoding a delta without the parent's skeleton is an error, not a guess."""
        stored = skeleton.encode(CHILD, PARENT)
        assert stored is not None
        with pytest.raises(ValueError, match="parent"):
            skeleton.decode(stored, None)

    def test_unchanged_keys_are_not_repeated(self) -> None:
        """A key whose value is the parent's (the format ``v``, updated channels) is left out."""
        stored = skeleton.encode(GRANDCHILD, CHILD)
        assert stored is not None
        assert stored["patch"].keys() == {"ts", "channel_versions", "versions_seen"}
        assert skeleton.decode(stored, CHILD) == GRANDCHILD

    def test_a_node_stores_only_the_versions_it_saw_anew(self) -> None:
        """A node that ran stores the channels it saw a new version of, not all it has seen."""
        after = {**GRANDCHILD, "versions_seen": {**GRANDCHILD["versions_seen"]}}
        after["versions_seen"]["ship"] = {"plan": 3, "log": 4}
        stored = skeleton.encode(after, GRANDCHILD)
        assert stored is not None
        assert stored["patch"]["versions_seen"] == {"ship": {"log": 4}}
        assert skeleton.decode(stored, GRANDCHILD) == after

    def test_a_channel_a_node_no_longer_saw_makes_it_full(self) -> None:
        """A patch cannot say a node forgot a channel: such a skeleton is stored whole."""
        after = {**GRANDCHILD, "versions_seen": {"plan": {}, "ship": {"plan": 3, "log": 3}}}
        assert skeleton.encode(after, GRANDCHILD) == {"full": after}

    def test_a_dropped_key_makes_it_full(self) -> None:
        """A patch cannot say a top-level key went away either."""
        after = {k: v for k, v in GRANDCHILD.items() if k != "updated_channels"}
        assert skeleton.encode(after, CHILD) == {"full": after}

    @pytest.mark.parametrize(("before", "after"), [(1, 1.0), (1, True), (0, False), ([1], [1.0])])
    def test_a_value_of_another_type_is_a_change(self, before: Any, after: Any) -> None:
        """A value equal to the parent's but of another type (``1 == 1.0 == True``) is stored,
        so it comes back with its own type, at the top level and among versions."""
        parent = {**CHILD, "x": before, "channel_versions": {**CHILD["channel_versions"]}}
        child = {**GRANDCHILD, "x": after, "channel_versions": {**GRANDCHILD["channel_versions"]}}
        parent["channel_versions"]["log"], child["channel_versions"]["log"] = before, after
        stored = skeleton.encode(child, parent)
        assert stored is not None
        decoded = skeleton.decode(stored, parent)
        assert repr(decoded["x"]) == repr(after)
        assert repr(decoded["channel_versions"]["log"]) == repr(after)

    @pytest.mark.parametrize(
        ("before", "after"), [(1, 1.0), (1, True), (0, False), ("1", "1"), (3, 3)]
    )
    def test_a_node_that_saw_nothing_new_stores_nothing(self, before: Any, after: Any) -> None:
        """A node's seen versions equal to its parent's, of the same types, are left out;
        equal but of another type (``1 == 1.0 == True``), they are stored and come back so."""
        parent = {**CHILD, "versions_seen": {"plan": {"branch:to:plan": before, "log": 2}}}
        child = {**GRANDCHILD, "versions_seen": {"plan": {"branch:to:plan": after, "log": 2}}}
        stored = skeleton.encode(child, parent)
        assert stored is not None
        same = type(before) is type(after)
        assert stored["patch"].get("versions_seen") == (
            None if same else {"plan": {"branch:to:plan": after}}
        )
        decoded = skeleton.decode(stored, parent)
        assert repr(decoded["versions_seen"]) == repr(child["versions_seen"])

    @pytest.mark.parametrize(
        "where", ["top", "channel_versions", "versions_seen", "seen by a node", "nested"]
    )
    def test_a_key_that_only_looks_like_the_parents_is_left_to_serde(self, where: str) -> None:
        """A str-subclass key equal to a key of the parent would come back a plain str: a
        child holding one anywhere, even where nothing changed, is not stored as JSON."""
        odd = _Key("log")
        parent = {**CHILD, "meta": {"log": 1}}
        child = {**GRANDCHILD, "meta": {"log": 1}}
        child["versions_seen"] = {**child["versions_seen"], "ship": {"plan": 3, "log": 3}}
        if where == "top":
            parent["log"], child = 1, {**child, odd: 1}
        elif where == "channel_versions":
            parent["channel_versions"] = {**parent["channel_versions"], "log": 4}
            child["channel_versions"] = {
                **{k: v for k, v in child["channel_versions"].items() if k != "log"},
                odd: 4,
            }
        elif where == "versions_seen":
            child["versions_seen"] = {"plan": {"branch:to:plan": 2}, _Key("ship"): {"plan": 3}}
        elif where == "seen by a node":
            parent["versions_seen"] = {"plan": {"branch:to:plan": 2, "log": 3}}
            child["versions_seen"] = {"plan": {"branch:to:plan": 2, odd: 3}}
        else:
            child["meta"] = {odd: 1}
        assert skeleton.encode(child, parent) is None

    def test_an_unstorable_change_on_a_parent_is_left_to_serde(self) -> None:
        """A changed value JSON cannot hold exactly (a tuple) leaves the child to serde."""
        assert skeleton.encode({**GRANDCHILD, "updated_channels": ("log",)}, CHILD) is None

    def test_the_parents_id_is_not_inherited(self) -> None:
        """The id is each checkpoint's own (its event's): a patch on a parent with one has none."""
        stored = skeleton.encode(GRANDCHILD, {**CHILD, "id": "1f0-2"})
        assert stored is not None
        assert "id" not in skeleton.decode(stored, {**CHILD, "id": "1f0-2"})

    def test_a_delta_written_before_patches_still_decodes(self) -> None:
        """The earlier form (every top-level key, seen versions whole per node) reads as it did."""
        delta = {"delta": {**CHILD, "channel_versions": {"log": 3, "plan": 3}}}
        assert skeleton.decode(delta, PARENT) == CHILD


class TestStoredBeforePatches:
    @pytest.fixture
    def engine(self, tmp_path: Path) -> Any:
        copy = tmp_path / "threads.db"
        shutil.copyfile(OLD_STORE, copy)
        with Engine(f"sqlite:///{copy}") as engine:
            yield engine

    def _graph(self, engine: Engine, failures: int) -> Any:
        spec = importlib.util.spec_from_file_location(
            "maker", DATA / "make_langgraph_delta_store.py"
        )
        assert spec is not None
        assert spec.loader is not None
        maker = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = maker  # LangGraph reads the state's annotations from it
        spec.loader.exec_module(maker)
        return maker.graph(failures).compile(checkpointer=StagetrailSaver(engine))

    def test_the_threads_read_back_whole(self, engine: Engine) -> None:
        """Every checkpoint of a thread written as deltas comes back with its state and versions."""
        graph = self._graph(engine, 0)
        config: Any = {"configurable": {"thread_id": "flaky"}}
        history = list(graph.get_state_history(config))
        logs = [state.values.get("log") for state in reversed(history)]
        assert logs == [[], [], ["plan"], ["plan", "build"], ["plan", "build", "ship"]]
        newest = history[0]
        seen = newest.config["configurable"]["checkpoint_id"]
        found = graph.checkpointer.get_tuple(newest.config)
        assert found.checkpoint["id"] == seen
        assert set(found.checkpoint["versions_seen"]) >= {"plan", "build", "ship"}
        assert not newest.next

    def test_a_thread_written_as_deltas_goes_on_in_patches(self, engine: Engine) -> None:
        """A new invoke on an old thread stores patches on the old deltas and reads back exactly."""
        graph = self._graph(engine, 0)
        config: Any = {"configurable": {"thread_id": "done"}}
        graph.invoke({"log": ["again"]}, config, durability="sync")
        assert graph.get_state(config).values["log"] == [
            *["plan", "build", "ship", "again"],
            *["plan", "build", "ship"],
        ]
        (run,) = [r for r in engine.runs() if r.labels.get("langgraph.thread") == "done"]
        forms = [
            next(iter(e.checkpoint))
            for e in engine.events(run.run_id)
            if isinstance(e, CheckpointSaved)
        ]
        assert forms[:5] == ["full", "delta", "delta", "delta", "delta"]
        assert set(forms[5:]) == {"patch"}
        fresh = self._graph(engine, 0)  # a new saver: the thread folded from the store alone
        assert fresh.get_state(config).values == graph.get_state(config).values
