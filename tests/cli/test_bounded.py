"""Output bounded whatever the size of the run: state, show, replay and diff of a deep run."""

from __future__ import annotations

import json
from pathlib import Path
from uuid import UUID, uuid4

import pytest

from engine import Engine, Pipeline
from engine.cli import common
from events import Event, RunStarted, StageCompleted, StageStarted
from tests.cli._helpers import as_json, fails, invoke, ok

LOOP = Pipeline(
    "loop",
    initial="work",
    transitions=[("work", "completed", "work"), ("work", "done", "end")],
    final=["end"],
)
"""One stage that loops: every outcome pushes a frame, so the stack grows with the run."""

DEPTH = 1_200
"""Frames on the deep run's stack (2,401 events: snapshots are taken and restored)."""


def deep_run(url: str, depth: int = DEPTH) -> UUID:
    """A run of `depth` completed attempts, written in one batch."""
    run_id = uuid4()
    events: list[Event] = [
        RunStarted(run_id=run_id, version=1, pipeline=LOOP.name, table=LOOP.to_dict())
    ]
    for attempt in range(1, depth + 1):
        version = 2 * attempt
        events.append(StageStarted(run_id=run_id, version=version, stage="work", attempt=attempt))
        events.append(
            StageCompleted(
                run_id=run_id,
                version=version + 1,
                stage="work",
                attempt=attempt,
                result={"attempt": attempt},
                duration=1.0,
            )
        )
    with Engine(url) as engine:
        engine.store.append(events)
    return run_id


@pytest.fixture(params=["sqlite_url", "postgres_url"])
def deep(request: pytest.FixtureRequest) -> tuple[str, str]:
    """A store (SQLite file, PostgreSQL schema) holding one run with a deep stack, and its id."""
    url = request.getfixturevalue(request.param)
    return url, str(deep_run(url))


def frame_rows(out: str) -> list[list[str]]:
    """The rows of the frame table in `state`'s plain output (after its column header)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["#", "v"]) + 1
    return [line.split() for line in lines[start:] if line[:1] != "…"]


class TestStateFrames:
    def test_default_shows_the_newest_20_and_counts_the_rest(self, deep: tuple[str, str]) -> None:
        """By default the 20 newest frames (#1181 to #1200) and one line naming the 1,180 others."""
        url, run = deep
        out = ok("state", run, "--store", url)
        assert f"current state: work, depth {DEPTH}" in out
        rows = frame_rows(out)
        assert [row[0] for row in rows] == [str(depth) for depth in range(1181, 1201)]
        assert rows[-1][1] == str(2 * DEPTH + 1)  # the newest frame: the last event's
        assert out.splitlines()[-1] == (
            "… 1,180 older frames (#1 to #1,180) not shown: --frames N shows the newest N,"
            " --frames all every one"
        )

    def test_frames_n_and_all(self, deep: tuple[str, str]) -> None:
        """--frames 3 shows the 3 newest; --frames all every frame, with no line left out."""
        url, run = deep
        assert [
            row[0] for row in frame_rows(ok("state", run, "--frames", "3", "--store", url))
        ] == [
            "1198",
            "1199",
            "1200",
        ]
        everything = ok("state", run, "--frames", "all", "--store", url)
        assert len(frame_rows(everything)) == DEPTH
        assert "not shown" not in everything

    def test_a_past_point_is_bounded_too(self, deep: tuple[str, str]) -> None:
        """--at 101 (50 frames deep) shows frames #31 to #50 of that point."""
        url, run = deep
        out = ok("state", run, "--at", "101", "--store", url)
        assert [row[0] for row in frame_rows(out)] == [str(depth) for depth in range(31, 51)]
        assert "… 30 older frames (#1 to #30) not shown" in out

    def test_json_holds_the_newest_frames_and_says_how_deep(self, deep: tuple[str, str]) -> None:
        """--json: `state.frames` the newest N oldest first, `depth` and `frames_left_out`."""
        url, run = deep
        data = as_json("state", run, "--frames", "5", "--store", url)
        assert (data["depth"], data["frames_left_out"]) == (DEPTH, DEPTH - 5)
        assert [frame[3] for frame in data["state"]["frames"]] == list(range(DEPTH - 4, DEPTH + 1))
        full = as_json("state", run, "--frames", "all", "--store", url)
        assert (len(full["state"]["frames"]), full["frames_left_out"]) == (DEPTH, 0)

    def test_a_shallow_stack_is_shown_whole(self, sqlite_url: str) -> None:
        """A stack no deeper than the limit is shown whole, with nothing said to be left out."""
        run = str(deep_run(sqlite_url, depth=4))
        out = ok("state", run, "--store", sqlite_url)
        assert [row[0] for row in frame_rows(out)] == ["1", "2", "3", "4"]
        assert "not shown" not in out
        assert as_json("state", run, "--store", sqlite_url)["frames_left_out"] == 0

    @pytest.mark.parametrize("value", ["0", "-1", "ten", "1.5", "٣", "9" * 5000])
    def test_a_bad_frames_value_is_one_error(self, sqlite_url: str, value: str) -> None:
        """--frames takes a whole number >= 1 or `all`; anything else is one error naming it."""
        run = str(deep_run(sqlite_url, depth=2))
        assert "--frames" in fails("state", run, "--frames", value, "--store", sqlite_url)


class TestStateItems:
    def test_another_projection_shows_100_entries_of_each_list(self, deep: tuple[str, str]) -> None:
        """stage_results of 1,200 attempts lists 100 of them and counts the 1,100 others."""
        url, run = deep
        data = as_json("state", run, "--projection", "stage_results", "--store", url)
        assert [entry["attempt"] for entry in data["state"]["work"]] == list(range(1, 101))
        assert data["items_left_out"] == DEPTH - 100

    def test_items_n_all_and_the_plain_line(self, deep: tuple[str, str]) -> None:
        """--items 10 keeps ten entries and says so in plain output; --items all leaves none out."""
        url, run = deep
        out = ok("state", run, "--projection", "stage_results", "--items", "10", "--store", url)
        assert out.splitlines()[-1] == (
            f"… {DEPTH - 10:,} entries not shown: --items N shows N of each list or mapping,"
            " --items all every one"
        )
        data = as_json(
            "state", run, "--projection", "stage_results", "--items", "all", "--store", url
        )
        assert len(data["state"]["work"]) == DEPTH
        assert data["items_left_out"] == 0

    def test_run_index_shows_no_empty_stack(self, deep: tuple[str, str]) -> None:
        """The run index's packed stack is shown as packed (its count), never as an empty list."""
        url, run = deep
        state = as_json("state", run, "--projection", "run_index", "--store", url)["state"]
        assert "states" not in state
        assert state["state_count"] == DEPTH  # one state pushed per completed attempt


def version_column(out: str) -> list[int]:
    """The versions of the event rows in `show`'s or `replay`'s plain output."""
    return [int(v) for line in out.splitlines() if (v := line.lstrip("* ").split(" ")[0]).isdigit()]


class TestShowWindow:
    def test_default_shows_the_first_1000_events_and_the_runs_status(
        self, deep: tuple[str, str]
    ) -> None:
        """Of 2,401 events, 1 to 1,000 are shown, a line names the rest; the status is the run's."""
        url, run = deep
        out = ok("show", run, "--store", url)
        assert version_column(out) == list(range(1, 1001))
        assert (
            "… 1,401 more events (events 1,001 to 2,401) not shown: --from 1001 goes on,"
            " --limit all shows every one"
        ) in out
        assert f"status: running (state work, {2 * DEPTH + 1} events, {DEPTH} attempts" in out

    def test_from_and_limit_choose_the_window(self, deep: tuple[str, str]) -> None:
        """--from 2399 --limit 2 shows events 2,399 and 2,400, says what is before and after."""
        url, run = deep
        out = ok("show", run, "--from", "2399", "--limit", "2", "--store", url)
        assert version_column(out) == [2399, 2400]
        assert "(events 1 to 2,398 not shown: --from 1 shows them)" in out
        assert "… 1 more event (event 2,401) not shown: --from 2401 goes on" in out
        assert f"{2 * DEPTH + 1} events" in out.splitlines()[-1]

    def test_limit_all_shows_every_event(self, deep: tuple[str, str]) -> None:
        """--limit all shows the whole run and says nothing was left out."""
        url, run = deep
        out = ok("show", run, "--limit", "all", "--store", url)
        assert version_column(out) == list(range(1, 2 * DEPTH + 2))
        assert "not shown" not in out

    def test_json_lines_are_the_window_and_stderr_says_the_rest(
        self, deep: tuple[str, str]
    ) -> None:
        """--json prints the window's events only; the line about the rest goes to stderr."""
        url, run = deep
        result = invoke("show", run, "--limit", "10", "--json", "--store", url)
        assert result.exit_code == 0
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        assert [line["version"] for line in lines] == list(range(1, 11))
        assert "2,391 more events (events 11 to 2,401) not shown" in result.stderr

    def test_from_past_the_end_is_one_error(self, deep: tuple[str, str]) -> None:
        """--from after the last event is one error naming --from and the last event."""
        url, run = deep
        assert "--from 5000: after the run's last event (2401)" in fails(
            "show", run, "--from", "5000", "--store", url
        )


class TestLimitValues:
    @pytest.mark.parametrize("command", ["show", "replay"])
    @pytest.mark.parametrize("value", ["0", "-5", "many", "2.5", "9" * 5000])
    def test_a_bad_limit_is_one_error(self, sqlite_url: str, command: str, value: str) -> None:
        """--limit takes a whole number >= 1 or `all`; anything else is one error naming it."""
        run = str(deep_run(sqlite_url, depth=2))
        assert "--limit" in fails(command, run, "--limit", value, "--store", sqlite_url)

    @pytest.mark.parametrize("option", ["--frames", "--items"])
    def test_a_bad_state_count_is_one_error(self, sqlite_url: str, option: str) -> None:
        """--frames and --items take a whole number >= 1 or `all`; 0 is one error naming it."""
        run = str(deep_run(sqlite_url, depth=2))
        assert option in fails("state", run, option, "0", "--store", sqlite_url)

    @pytest.mark.parametrize("command", ["show", "replay"])
    def test_a_limit_past_any_run_shows_it_whole(self, sqlite_url: str, command: str) -> None:
        """--limit 10**30 shows every event of a 5-event run and nothing left out."""
        run = str(deep_run(sqlite_url, depth=2))
        out = ok(command, run, "--limit", str(10**30), "--store", sqlite_url)
        assert version_column(out) == [1, 2, 3, 4, 5]
        assert "not shown" not in out


class TestReplayWindow:
    def test_default_replays_1000_events(self, deep: tuple[str, str]) -> None:
        """Replay from --from stops after 1,000 events and names the rest."""
        url, run = deep
        out = ok("replay", run, "--from", "1001", "--store", url)
        assert version_column(out) == list(range(1001, 2001))
        assert "… 401 more events (events 2,001 to 2,401) not shown: --from 2001 goes on" in out

    def test_limit_cuts_an_explicit_to_and_all_lifts_it(self, deep: tuple[str, str]) -> None:
        """--to 2401 --limit 5 shows 5 events; --limit all replays up to --to."""
        url, run = deep
        out = ok("replay", run, "--from", "2390", "--to", "2401", "--limit", "5", "--store", url)
        assert version_column(out) == list(range(2390, 2395))
        out = ok("replay", run, "--from", "2390", "--limit", "all", "--store", url)
        assert version_column(out) == list(range(2390, 2402))
        assert "not shown" not in out

    def test_json_lines_are_the_window(self, deep: tuple[str, str]) -> None:
        """--json prints one line per event of the window; stderr names the rest."""
        url, run = deep
        result = invoke("replay", run, "--limit", "3", "--json", "--store", url)
        assert [json.loads(line)["version"] for line in result.stdout.splitlines()] == [1, 2, 3]
        assert "2,398 more events" in result.stderr


class TestDiffFrames:
    def test_json_lists_20_frames_a_side_and_counts_the_rest(self, deep: tuple[str, str]) -> None:
        """--from 1 --to 2401: 1,200 new frames on B, 20 listed, 1,180 counted as left out."""
        url, run = deep
        data = as_json("diff", run, "--from", "1", "--to", str(2 * DEPTH + 1), "--store", url)
        assert (len(data["frames_a"]), data["frames_a_left_out"]) == (0, 0)
        assert (len(data["frames_b"]), data["frames_b_left_out"]) == (20, DEPTH - 20)
        assert [frame["attempt"] for frame in data["frames_b"]] == list(range(1, 21))


class TestReplayRollback:
    def test_a_deep_rollback_lists_20_popped_frames_and_counts_the_rest(
        self, sqlite_url: str
    ) -> None:
        """Undoing 1,000 frames: the step lists the 20 newest popped and counts 980 more."""
        run = deep_run(sqlite_url, depth=1_000)
        with Engine(sqlite_url) as engine:
            engine.load(run).rollback(1_000, reason="start over")
        step = json.loads(ok("replay", str(run), "--from", "2002", "--json", "--store", sqlite_url))
        assert (step["depth"], len(step["popped"]), step["popped_left_out"]) == ([1000, 0], 20, 980)
        assert [frame["attempt"] for frame in step["popped"]] == list(range(1000, 980, -1))
        text = ok("replay", str(run), "--from", "2002", "--store", sqlite_url)
        assert "and 980 more, depth 0" in text
        assert text.count("work completed #") == 20


class TestVerifyProblems:
    def test_a_run_with_many_problems_lists_50_and_counts_the_rest(self, sqlite_url: str) -> None:
        """1,100 refused transitions: 50 rows and a count; --json the first 1,000 and the count."""
        run_id = uuid4()
        events: list[Event] = [
            RunStarted(run_id=run_id, version=1, pipeline=LOOP.name, table=LOOP.to_dict()),
            StageCompleted(run_id=run_id, version=2, stage="work", attempt=1, outcome="done"),
        ]
        events += [  # from the final state "end" no outcome leads anywhere: each is refused
            StageCompleted(run_id=run_id, version=v, stage="work", attempt=v - 1)
            for v in range(3, 1103)
        ]
        with Engine(sqlite_url) as engine:
            engine.store.append(events)
        result = invoke("verify", str(run_id), "--store", sqlite_url)
        assert result.exit_code == 1
        rows = [line for line in result.stdout.splitlines() if " transition " in line]
        assert len(rows) == 50
        assert result.stdout.splitlines()[-1] == (
            "and 1,050 more problem(s); --json lists the first 1,000"
        )
        data = json.loads(invoke("verify", str(run_id), "--json", "--store", sqlite_url).stdout)
        assert (len(data["problems"]), data["problem_count"]) == (1000, 1100)


class TestCompactList:
    def test_text_names_20_removed_runs_and_counts_the_rest(self, sqlite_url: str) -> None:
        """25 deleted runs: the text names 20 and counts 5 more."""
        with Engine(sqlite_url) as engine:
            for _ in range(25):
                engine.start_run(LOOP).finish("deleted")
        out = ok("compact", "--store", sqlite_url)
        removed = out.splitlines()[0]
        assert removed.startswith("removed 25 deleted run(s) (")
        assert removed.endswith(" and 5 more")
        assert removed.count(", ") == 19

    def test_json_lists_a_bounded_number_of_runs_and_counts_all(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """compact --json lists at most LISTED_JSON removed runs, counts them all and says how
        many it left out (the bound set to 3 here: 1,000 by default)."""
        assert common.LISTED_JSON == 1000
        monkeypatch.setattr(common, "LISTED_JSON", 3)
        with Engine(sqlite_url) as engine:
            deleted = [engine.start_run(LOOP) for _ in range(5)]
            for run in deleted:
                run.finish("deleted")
        data = as_json("compact", "--store", sqlite_url)
        assert (data["runs_count"], data["runs_left_out"], len(data["runs"])) == (5, 2, 3)
        assert set(data["runs"]) <= {str(run.id) for run in deleted}
        assert data["events"] == 10


class TestImportList:
    def test_json_lists_a_bounded_number_of_runs_and_counts_all(
        self, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """import --json lists at most LISTED_JSON imported and identical runs, counts each
        kind whole and says how many it left out."""
        monkeypatch.setattr(common, "LISTED_JSON", 3)
        with Engine(sqlite_url) as engine:
            started = [engine.start_run(LOOP).id for _ in range(5)]
        path = tmp_path / "runs.jsonl"
        path.write_text(ok("export", "--all", "--store", sqlite_url))
        copy = f"sqlite:///{tmp_path / 'copy.db'}"
        first = as_json("import", str(path), "--store", copy)
        assert (first["imported_count"], first["imported_left_out"]) == (5, 2)
        assert first["imported"] == [str(run_id) for run_id in started[:3]]
        assert (first["identical"], first["identical_count"], first["events"]) == ([], 0, 5)
        again = as_json("import", str(path), "--store", copy)
        assert (again["identical_count"], again["identical_left_out"]) == (5, 2)
        assert (len(again["identical"]), again["imported_count"], again["events"]) == (3, 0, 0)


class TestTreeRuns:
    def test_tree_json_lists_100_runs_and_counts_the_rest(self, sqlite_url: str) -> None:
        """A run with 120 child runs: --tree --json lists 100 of the 121 runs, counts 21 more."""
        with Engine(sqlite_url) as engine:
            parent = engine.start_run(LOOP)
            for index in range(120):
                engine.child_run(parent, LOOP, key=f"child-{index}")
        data = as_json("state", str(parent.id), "--tree", "--store", sqlite_url)
        assert (len(data["runs"]), data["runs_left_out"]) == (100, 21)
        assert data["runs"][0]["run_id"] == str(parent.id)
        out = ok("state", str(parent.id), "--tree", "--store", sqlite_url)
        assert "(121 runs)" in out.splitlines()[0]
