from __future__ import annotations

from typing import Any

import pytest

from engine import Pipeline
from engine.errors import PipelineError
from tests._helpers import REVIEW


def build(**changes: Any) -> Pipeline:
    spec: dict[str, Any] = {
        "initial": "a",
        "transitions": [("a", "completed", "b"), ("b", "completed", "done")],
        "final": ["done"],
    }
    spec.update(changes)
    return Pipeline("p", **spec)


class TestValidation:
    @pytest.mark.parametrize(
        ("changes", "message"),
        [
            ({"transitions": []}, "transition table is empty"),
            ({"transitions": [("a", "completed")]}, "not a (source, outcome, dest) triple"),
            ({"transitions": [("a", "", "b")]}, "outcome must be a non-empty str"),
            ({"transitions": [("a", "*", "done")]}, "'*' may only be a source"),
            ({"transitions": [("a", "go", "*")]}, "'*' may only be a source"),
            (
                {"transitions": [("a", "go", "done"), ("a", "go", "b"), ("b", "go", "done")]},
                "duplicate row for state 'a', outcome 'go'",
            ),
            (
                {"transitions": [("a", "go", "done"), ("done", "again", "a")]},
                "final state 'done' has an outgoing row",
            ),
            (
                {"transitions": [("a", "go", "done"), ("x", "go", "done")]},
                "unreachable from 'a': 'x'",
            ),
            ({"transitions": [("a", "go", "b"), ("a", "end", "done")]}, "no outgoing row: 'b'"),
            ({"final": []}, "no final state"),
            ({"initial": "done"}, "initial state 'done' is final"),
            ({"initial": ""}, "initial state must be a non-empty str"),
            ({"states": ["a", "done"]}, "names unknown state 'b'"),
            ({"states": ["b", "done"]}, "initial state 'a' is not a declared state"),
            ({"states": ["a", "b"]}, "final state 'done' is not a declared state"),
            ({"final": "done"}, "final must be a list of state names, got 'done'"),
            ({"final": None}, "final must be a list of state names"),
            ({"transitions": None}, "transitions must be a list of rows"),
            ({"transitions": "a,go,done"}, "transitions must be a list of rows"),
            ({"states": ["a", "b", "b", "done"]}, "states lists 'b' twice"),
            ({"final": ["done", "done"]}, "final lists 'done' twice"),
            ({"initial": "*"}, "initial state cannot be '*'"),
            ({"final": ["*"]}, "final state cannot be '*'"),
            (
                {"states": ["a", "b", "done", "island"]},
                "unreachable from 'a': 'island'",
            ),
            ({"hub": "x"}, "hub 'x' is not a declared state"),
            ({"hub": "done"}, "hub 'done' is a final state"),
            ({"hub": ""}, "hub must be a non-empty str"),
            ({"hub": "*"}, "hub cannot be '*'"),
        ],
    )
    def test_invalid_definitions_raise_one_clear_error(
        self, changes: dict[str, Any], message: str
    ) -> None:
        """Each kind of bad table raises a PipelineError (a ValueError) naming the problem."""
        with pytest.raises(PipelineError) as caught:
            build(**changes)
        assert message in str(caught.value)
        assert isinstance(caught.value, ValueError)
        assert caught.value.pipeline == "p"

    def test_name_must_be_a_non_empty_str(self) -> None:
        """A pipeline needs a name."""
        with pytest.raises(PipelineError, match="pipeline name"):
            Pipeline("", initial="a", transitions=[("a", "go", "done")], final=["done"])


class TestTable:
    def test_lookup_follows_rows(self) -> None:
        """next_state gives each row's dest and None where no row exists."""
        assert REVIEW.next_state("testing", "failed") == "developer"
        assert REVIEW.next_state("testing", "needs_refactor") is None
        assert REVIEW.next_state("nowhere", "completed") is None

    def test_wildcard_covers_every_non_final_state(self) -> None:
        """A '*' row applies to each non-final state and never to a final one."""
        for state in ("project_analysis", "code_review", "developer", "testing"):
            assert REVIEW.next_state(state, "aborted") == "aborted"
        assert REVIEW.next_state("done", "aborted") is None

    def test_an_explicit_row_overrides_the_wildcard(self) -> None:
        """A state's own row for an outcome wins over the '*' row."""
        pipeline = build(
            transitions=[
                ("a", "completed", "b"),
                ("b", "completed", "done"),
                ("b", "aborted", "a"),
                ("*", "aborted", "done"),
            ]
        )
        assert pipeline.next_state("b", "aborted") == "a"
        assert pipeline.next_state("a", "aborted") == "done"

    def test_allowed_outcomes_are_sorted(self) -> None:
        """allowed() lists a state's outcomes in order, none for a final state."""
        assert REVIEW.allowed("developer") == ("aborted", "completed", "failed")
        assert REVIEW.allowed("done") == ()

    def test_states_are_derived_in_order_of_mention(self) -> None:
        """Without `states`, states are listed as the definition first names them."""
        assert REVIEW.states == (
            "project_analysis",
            "code_review",
            "developer",
            "testing",
            "done",
            "aborted",
        )


class TestSerialisation:
    def test_round_trip_rebuilds_an_equal_pipeline(self) -> None:
        """from_dict(to_dict()) gives the same definition, '*' rows kept as written."""
        data = REVIEW.to_dict()
        assert ["*", "aborted", "aborted"] in data["transitions"]
        assert Pipeline.from_dict(data) == REVIEW

    def test_from_dict_rejects_malformed_data(self) -> None:
        """A stored table missing a key raises PipelineError, not KeyError."""
        with pytest.raises(PipelineError, match="malformed"):
            Pipeline.from_dict({"name": "x", "initial": "a"})

    def test_a_hub_is_stored_only_when_declared(self) -> None:
        """A table without a hub is stored as before hubs; one with a hub keeps it."""
        plain, hubbed = build(), build(hub="a")
        assert "hub" not in plain.to_dict()
        assert hubbed.to_dict()["hub"] == "a"
        assert Pipeline.from_dict(hubbed.to_dict()).hub == "a"
        assert Pipeline.from_dict(plain.to_dict()).hub is None
        assert plain != hubbed

    def test_a_table_stored_before_hubs_reads_unchanged(self) -> None:
        """A stored table with no hub key (every older record) loads with no hub."""
        old = {
            "name": "p",
            "initial": "a",
            "final": ["done"],
            "states": ["a", "b", "done"],
            "transitions": [["a", "completed", "b"], ["b", "completed", "done"]],
        }
        loaded = Pipeline.from_dict(old)
        assert loaded.hub is None
        assert loaded.to_dict() == old

    def test_from_dict_rejects_non_objects(self) -> None:
        """A stored table that is not an object raises PipelineError."""
        with pytest.raises(PipelineError, match="must be an object"):
            Pipeline.from_dict(["not", "a", "table"])  # type: ignore[arg-type]


class TestDiagrams:
    def test_mermaid_has_every_edge(self) -> None:
        """The Mermaid source holds one labelled edge per expanded row."""
        source = REVIEW.to_mermaid()
        assert "stateDiagram-v2" in source
        assert "testing --> developer: failed" in source
        assert "code_review --> aborted: aborted" in source
        assert "done --> " not in source

    def test_dot_highlights_the_current_state(self) -> None:
        """The DOT source marks the given current state and holds every edge."""
        source = REVIEW.to_dot(current="testing")
        assert source.startswith('digraph "code-review"')
        assert "testing -> done [label=completed]" in source
        highlighted = next(
            line for line in source.splitlines() if line.strip().startswith("testing [")
        )
        assert "color=red" in highlighted
