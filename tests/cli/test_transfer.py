"""export and import: lossless round trips between stores, and refusals that write nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import Engine
from tests.cli._helpers import Filled, as_json, fails, fill, invoke, ok


def count_events(url: str) -> int:
    with Engine(url, create=False) as engine:
        return engine.projections.head()


def export_all(url: str) -> str:
    return ok("export", "--all", "--store", url)


def lines_of(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


class TestRoundTrip:
    def test_sqlite_to_sqlite_gives_identical_bytes(self, sqlite_url: str, tmp_path: Path) -> None:
        """export → import into a new file → export again: the same bytes."""
        filled = fill(sqlite_url)
        first = export_all(filled.url)
        path = tmp_path / "runs.jsonl"
        path.write_text(first)
        copy = f"sqlite:///{tmp_path / 'copy.db'}"
        assert "imported 5 run(s)" in ok("import", str(path), "--store", copy)
        assert export_all(copy) == first

    def test_sqlite_to_postgres_to_sqlite(
        self, sqlite_url: str, postgres_url: str, tmp_path: Path
    ) -> None:
        """SQLite → PostgreSQL → SQLite keeps every byte of the export."""
        first = export_all(fill(sqlite_url).url)
        (tmp_path / "a.jsonl").write_text(first)
        ok("import", str(tmp_path / "a.jsonl"), "--store", postgres_url)
        second = export_all(postgres_url)
        assert second == first
        (tmp_path / "b.jsonl").write_text(second)
        back = f"sqlite:///{tmp_path / 'back.db'}"
        ok("import", str(tmp_path / "b.jsonl"), "--store", back)
        assert export_all(back) == first

    def test_export_named_runs_in_order(self, sqlite_url: str) -> None:
        """Named runs (prefixes too) are written in the order given, each run's events in order."""
        filled = fill(sqlite_url)
        rows = lines_of(
            ok("export", str(filled.abandoned)[:8], str(filled.clean), "--store", filled.url)
        )
        assert [row["run_id"] for row in rows] == [str(filled.abandoned)] * 8 + [
            str(filled.clean)
        ] * 9
        assert [row["version"] for row in rows[:8]] == list(range(1, 9))
        assert rows[0]["topic"] == "stagetrail:RunStarted"

    def test_reimport_is_a_no_op(self, sqlite_url: str, tmp_path: Path) -> None:
        """Importing runs the store already holds, identical, writes nothing and says so."""
        filled = fill(sqlite_url)
        path = tmp_path / "runs.jsonl"
        path.write_text(export_all(filled.url))
        before = count_events(filled.url)
        report = as_json("import", str(path), "--store", filled.url)
        assert report["imported"] == []
        assert len(report["identical"]) == 5
        assert count_events(filled.url) == before

    def test_import_from_stdin(self, sqlite_url: str, tmp_path: Path) -> None:
        """'-' reads the file from stdin."""
        text = export_all(fill(sqlite_url).url)
        copy = f"sqlite:///{tmp_path / 'copy.db'}"
        result = invoke("import", "-", "--store", copy, input=text)
        assert result.exit_code == 0, result.stderr
        assert export_all(copy) == text

    def test_export_needs_runs(self, sqlite_url: str) -> None:
        """export with neither runs nor --all is a usage error."""
        fill(sqlite_url)
        result = invoke("export", "--store", sqlite_url)
        assert result.exit_code == 2
        assert "--all" in result.stderr


@pytest.fixture
def exported(sqlite_url: str, tmp_path: Path) -> tuple[Filled, list[str]]:
    """A filled store and its export, line by line."""
    filled = fill(sqlite_url)
    return filled, export_all(filled.url).splitlines()


def refused(lines: list[str], tmp_path: Path) -> tuple[str, str]:
    """Import `lines` into a new store; return the error and the URL (which must stay empty)."""
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    url = f"sqlite:///{tmp_path / 'target.db'}"
    error = fails("import", str(path), "--store", url)
    assert count_events(url) == 0
    return error, url


def edit(line: str, **changes: object) -> str:
    data = json.loads(line)
    state = changes.pop("state", None)
    data.update(changes)
    if isinstance(state, dict):
        data["state"].update(state)
    return json.dumps(data)


class TestRefusals:
    def test_bad_json_names_the_line(
        self, exported: tuple[Filled, list[str]], tmp_path: Path
    ) -> None:
        """A line that is not JSON: its number, nothing written (not even the runs before it)."""
        _, lines = exported
        lines[20] = "{oops"
        error, _ = refused(lines, tmp_path)
        assert error.startswith("stagetrail: error: line 21, field -: not JSON")

    def test_bad_field_names_line_and_field(
        self, exported: tuple[Filled, list[str]], tmp_path: Path
    ) -> None:
        """A NaN result is refused, naming the line and state.result."""
        _, lines = exported
        lines[2] = edit(lines[2], state={"result": float("nan")})
        error, _ = refused(lines, tmp_path)
        assert "line 3, field state.result:" in error

    def test_unknown_topic_and_bad_run_id(
        self, exported: tuple[Filled, list[str]], tmp_path: Path
    ) -> None:
        """An unknown event type names the topic; a bad run id names run_id."""
        _, lines = exported
        error, _ = refused([*lines[:4], edit(lines[4], topic="stagetrail:Nope")], tmp_path)
        assert "line 5, field topic: unknown event type" in error
        error, _ = refused([edit(lines[0], run_id="not-a-uuid")], tmp_path)
        assert "line 1, field run_id:" in error

    def test_gap_in_versions(self, exported: tuple[Filled, list[str]], tmp_path: Path) -> None:
        """A missing event leaves a gap in the versions: refused at the line after it."""
        _, lines = exported
        error, _ = refused(lines[:3] + lines[4:], tmp_path)
        assert "line 4, field version: expected 4" in error

    def test_illegal_transition_is_refused(
        self, exported: tuple[Filled, list[str]], tmp_path: Path
    ) -> None:
        """An outcome the stored table does not allow is refused before anything is written."""
        _, lines = exported
        lines[3] = edit(lines[3], state={"stage": "testing"})  # the run is in code_review
        error, _ = refused(lines, tmp_path)
        assert "line 4, field state:" in error
        assert "not the current state 'code_review'" in error

    def test_a_run_split_in_two(self, exported: tuple[Filled, list[str]], tmp_path: Path) -> None:
        """A run's lines must follow each other."""
        _, lines = exported
        error, _ = refused([*lines[:3], *lines[9:12], *lines[3:9]], tmp_path)
        assert "line 7, field run_id:" in error
        assert "appeared earlier" in error

    def test_a_run_that_exists_with_other_events(
        self, exported: tuple[Filled, list[str]], tmp_path: Path
    ) -> None:
        """Importing a changed copy of a stored run is refused; the other runs are not written."""
        filled, lines = exported
        target = f"sqlite:///{tmp_path / 'target.db'}"
        first_run = lines[:9]
        (tmp_path / "one.jsonl").write_text("\n".join(first_run) + "\n")
        ok("import", str(tmp_path / "one.jsonl"), "--store", target)
        changed = [
            *first_run[:3],
            edit(first_run[3], state={"result": {"critical": 99}}),
            *first_run[4:],
        ]
        (tmp_path / "two.jsonl").write_text("\n".join([*changed, *lines[9:]]) + "\n")
        error = fails("import", str(tmp_path / "two.jsonl"), "--store", target)
        assert f"line 4: run {filled.clean} is already in the store with other events" in error
        assert count_events(target) == 9


KEY = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="  # 32 bytes, base64


class TestRefusedOnlyByTheStore:
    """Values the event checks let through but no store keeps: found before any write."""

    @pytest.mark.parametrize(
        ("labels", "why"),
        [({"team": "\ud800"}, "lone surrogate"), ({"team": "a\x00"}, "NUL character")],
    )
    def test_a_late_run_with_unstorable_text_writes_no_earlier_run(
        self,
        exported: tuple[Filled, list[str]],
        tmp_path: Path,
        labels: dict[str, str],
        why: str,
    ) -> None:
        """The file's last run holds a NUL or lone surrogate: the runs before it are not written."""
        _, lines = exported
        last = max(i for i, line in enumerate(lines) if json.loads(line)["version"] == 1)
        lines[last] = edit(lines[last], state={"labels": labels})
        error, _ = refused(lines, tmp_path)
        assert f"line {last + 1}, field state.labels:" in error
        assert why in error
        assert "nothing was imported" in error

    def test_an_event_over_the_target_limit_writes_nothing(
        self, exported: tuple[Filled, list[str]], tmp_path: Path
    ) -> None:
        """An event over the target store's max_event_bytes is refused before any run is written."""
        _, lines = exported
        lines[-1] = edit(lines[-1], state={"reason": "x" * (1 << 20)})
        error, url = refused(lines, tmp_path)
        assert f"line {len(lines)}, field state.reason:" in error
        assert "max_event_bytes" in error
        path = tmp_path / "bad.jsonl"
        bigger = url + "?max_event_bytes=2000000"
        assert "does not match" in fails("import", str(path), "--store", bigger)  # its chain head
        # A file without heads (none on any run: a head on some runs but not one is a
        # file cut short) is refused, and imported unchecked when asked (--unchained).
        lines = [edit(line, chain=None) if '"chain"' in line else line for line in lines]
        path.write_text("\n".join(lines) + "\n")
        assert "has no chain head" in fails("import", str(path), "--store", bigger)
        ok("import", str(path), "--unchained", "--store", bigger)
        assert count_events(url) == len(lines)

    @pytest.mark.parametrize("where", ["line", "result"])
    def test_deeply_nested_json_is_one_error_naming_the_line(
        self, exported: tuple[Filled, list[str]], tmp_path: Path, where: str
    ) -> None:
        """JSON nested 100,000 deep (the line) or 5,000 deep (a result) is one clean error."""
        _, lines = exported
        depth = 100_000 if where == "line" else 5_000
        nested = "[" * depth + "]" * depth
        if where == "line":
            lines[4] = lines[4][:-1] + ', "x": ' + nested + "}"
        else:
            lines[2] = lines[2].replace('"result":', '"result":' + nested + ', "was":', 1)
        error, _ = refused(lines, tmp_path)
        assert error.startswith(f"stagetrail: error: line {5 if where == 'line' else 3}, field")
        assert "nested too deeply" in error


class TestAcrossSettings:
    def test_encrypted_and_compressed_to_plain(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An export of an encrypted store imports into a plain one, byte for byte the same."""
        pytest.importorskip("cryptography")
        secret = f"sqlite:///{tmp_path / 'secret.db'}?compress=zlib"
        monkeypatch.setenv("STAGETRAIL_CIPHER_KEY", KEY)
        fill(secret)
        exported = export_all(secret)
        monkeypatch.delenv("STAGETRAIL_CIPHER_KEY")
        (tmp_path / "runs.jsonl").write_text(exported)
        plain = f"sqlite:///{tmp_path / 'plain.db'}"
        ok("import", str(tmp_path / "runs.jsonl"), "--store", plain)
        assert export_all(plain) == exported
        assert b"C-41" not in (tmp_path / "secret.db").read_bytes()

    def test_progress_bars_on_a_terminal(
        self, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With stderr a terminal, export and import draw progress; stdout is unchanged."""
        filled = fill(sqlite_url)
        plain = export_all(filled.url)
        monkeypatch.setattr("engine.cli.common.stderr_is_terminal", lambda: True)
        drawn = invoke("export", "--all", "--store", filled.url)
        assert drawn.exit_code == 0
        assert drawn.stdout == plain
        (tmp_path / "runs.jsonl").write_text(plain)
        copy = f"sqlite:///{tmp_path / 'copy.db'}"
        imported = invoke("import", str(tmp_path / "runs.jsonl"), "--store", copy)
        assert imported.exit_code == 0
        assert "imported 5 run(s)" in imported.stdout
        rebuilt = invoke("projections", "rebuild", "run_index", "--store", copy)
        assert rebuilt.stdout.startswith("rebuilt run_index: ")


class TestSystemErrors:
    def test_a_full_disk_is_one_line(self, sqlite_url: str) -> None:
        """export into a device that is full: one line on stderr, exit code 2, no traceback."""
        import subprocess
        import sys

        fill(sqlite_url)
        script = Path(sys.executable).parent / "stagetrail"
        with open("/dev/full", "w") as full:
            done = subprocess.run(
                [str(script), "export", "--all", "--store", sqlite_url],
                stdout=full, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
        assert done.returncode == 2
        assert done.stderr.startswith("stagetrail: error: system:")
        assert "No space left on device" in done.stderr
        assert "Traceback" not in done.stderr


class TestInterruptedImport:
    def test_a_write_failure_names_the_progress_and_a_rerun_finishes(
        self,
        exported: tuple[Filled, list[str]],
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """A run appearing between the check and the write stops the import, which re-runs."""
        filled, lines = exported
        path = tmp_path / "all.jsonl"
        path.write_text("\n".join(lines) + "\n")
        last = json.loads(lines[-1])["run_id"]  # the file's last run: as if started meanwhile
        kept = [line for line in lines if json.loads(line)["run_id"] == last]
        fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
        only_last = tmp_path / "last.jsonl"
        only_last.write_text("\n".join(kept) + "\n")
        ok("import", str(only_last), "--store", fresh)
        monkeypatch.setattr("engine.cli.export_import._already_there", lambda engine, chunk: False)
        error = fails("import", str(path), "--store", fresh)
        runs_in_file = len({json.loads(line)["run_id"] for line in lines})
        assert f"import stopped after {runs_in_file - 1} new run(s)" in error
        assert "run the import again" in error
        monkeypatch.undo()
        ok("import", str(path), "--store", fresh)
        assert export_all(fresh) == export_all(filled.url)
