"""Exports carry each run's chain head on its last line; import refuses lines changed since."""

from __future__ import annotations

import gc
import json
import tracemalloc
from pathlib import Path

import pytest

from engine import Engine
from engine.cli.export_import import import_runs
from engine.cli.import_check import BadImportLine
from tests._helpers import REVIEW
from tests.audit.test_chain import recorded
from tests.cli._helpers import invoke, ok


def exported(tmp_path: Path) -> tuple[str, list[str]]:
    url = f"sqlite:///{tmp_path / 'source.db'}"
    with Engine(url) as engine:
        recorded(engine)
        recorded(engine)
    return url, ok("export", "--all", "--store", url).splitlines()


def import_lines(lines: list[str], tmp_path: Path) -> tuple[int, str, str]:
    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    target = f"sqlite:///{tmp_path / 'target.db'}"
    result = invoke("import", str(path), "--store", target)
    return result.exit_code, result.stderr, target


class TestExportHead:
    def test_each_runs_last_line_carries_its_head(self, tmp_path: Path) -> None:
        """Only the last line of each run has a `chain` key: 64 hex digits."""
        _, lines = exported(tmp_path)
        heads = [i for i, line in enumerate(lines) if "chain" in json.loads(line)]
        assert heads == [7, 15]
        assert len(json.loads(lines[7])["chain"]) == 64

    def test_an_unchanged_export_imports_and_exports_the_same(self, tmp_path: Path) -> None:
        """The head depends on the lines alone: import then export gives the same bytes."""
        _, lines = exported(tmp_path)
        code, _, target = import_lines(lines, tmp_path)
        assert code == 0
        assert ok("export", "--all", "--store", target).splitlines() == lines
        with Engine(target) as engine:
            assert {engine.verify(s.run_id).chain for s in engine.runs()} == {"intact"}

    def test_an_edited_line_is_refused_at_its_runs_head(self, tmp_path: Path) -> None:
        """A result changed in the file (still a legal event) fails the head: nothing imported."""
        _, lines = exported(tmp_path)
        lines[1] = lines[1].replace('"python"', '"rustc_"')
        code, error, target = import_lines(lines, tmp_path)
        assert code == 2
        assert "line 8, field chain: does not match run" in error
        with Engine(target) as engine:
            assert engine.runs() == []

    def test_swapped_lines_are_refused(self, tmp_path: Path) -> None:
        """Two developer outcomes' results swapped break the head, though the rules hold."""
        _, lines = exported(tmp_path)
        first, second = json.loads(lines[4]), json.loads(lines[6])
        assert (first["state"]["result"], second["state"]["result"]) == (
            {"patch": "p"},
            {"patch": "q"},
        )
        first["state"]["result"], second["state"]["result"] = {"patch": "q"}, {"patch": "p"}
        lines[4], lines[6] = json.dumps(first), json.dumps(second)
        code, error, _ = import_lines(lines, tmp_path)
        assert (code, "does not match" in error) == (2, True)

    def test_a_head_before_the_runs_end_is_refused(self, tmp_path: Path) -> None:
        """A head on a line that is not its run's last is an error naming that line."""
        _, lines = exported(tmp_path)
        head = json.loads(lines[7])["chain"]
        moved = json.loads(lines[3])
        moved["chain"] = head
        lines[3] = json.dumps(moved)
        error = import_lines(lines, tmp_path)[1]
        assert "line 4, field chain: a chain head belongs on its run's last line" in error

    def test_a_malformed_head_is_refused(self, tmp_path: Path) -> None:
        """A head that is not 64 hexadecimal digits names the line and field."""
        _, lines = exported(tmp_path)
        lines[7] = lines[7].replace('"chain":"', '"chain":"zz')
        error = import_lines(lines, tmp_path)[1]
        assert "line 8, field chain: must be a chain head" in error

    def test_a_file_cut_short_is_refused_at_its_last_run(self, tmp_path: Path) -> None:
        """A file whose last run lost its end (and so its head) is refused: nothing imported."""
        _, lines = exported(tmp_path)
        code, error, target = import_lines(lines[:12], tmp_path)
        assert code == 2
        assert "line 12, field chain: run" in error
        assert "has no chain head on its last line while other runs of the file do" in error
        with Engine(target) as engine:
            assert engine.runs() == []


def without_heads(lines: list[str]) -> list[str]:
    """`lines` as an older release exported them: no `chain` key on any line."""
    stripped = []
    for line in lines:
        data = json.loads(line)
        data.pop("chain", None)
        stripped.append(json.dumps(data))
    return stripped


class TestUnchainedImport:
    @pytest.mark.parametrize("runs", [1, 2])
    def test_runs_without_heads_are_refused_unless_asked(
        self, tmp_path: Path, shared_url: str, runs: int
    ) -> None:
        """An export whose runs carry no chain head (one run, or every run: an older release's
        export, or heads removed) is refused, naming the first such run in verify's words for
        old stores, nothing imported; --unchained imports it and reports those runs."""
        _, lines = exported(tmp_path)
        lines = without_heads(lines[: 8 * runs])
        path = tmp_path / "old.jsonl"
        path.write_text("\n".join(lines) + "\n")
        refused = invoke("import", str(path), "--store", shared_url)
        assert refused.exit_code == 2
        run_id = json.loads(lines[0])["run_id"]
        assert f"line 8, field chain: run {run_id}" in refused.stderr
        assert "has no chain head on its last line: chain: none (exported before chaining" in (
            refused.stderr
        )
        assert "--unchained" in refused.stderr
        with Engine(shared_url) as engine:
            assert engine.runs() == []
        report = json.loads(ok("import", str(path), "--unchained", "--json", "--store", shared_url))
        ids = [json.loads(lines[8 * index])["run_id"] for index in range(runs)]
        assert (report["imported"], report["unchained"], report["events"]) == (ids, ids, 8 * runs)
        with Engine(shared_url) as engine:
            assert len(engine.runs()) == runs

    def test_the_text_report_names_the_unchained_runs(
        self, tmp_path: Path, shared_url: str
    ) -> None:
        """Imported with --unchained, the runs are named as having no chain: none checked."""
        _, lines = exported(tmp_path)
        path = tmp_path / "old.jsonl"
        path.write_text("\n".join(without_heads(lines[:8])) + "\n")
        out = ok("import", str(path), "--unchained", "--store", shared_url)
        assert "imported 1 run(s), 8 events" in out
        short = json.loads(lines[0])["run_id"][:8]
        assert "1 of them with chain: none (exported before chaining)" in out
        assert f"not checked against a head: {short}" in out
        # verify --all counts them intact afterwards (linked anew): the report says so
        assert "linked anew here, so verify counts them intact from now on" in out

    def test_a_headless_run_already_stored_is_no_reason_to_refuse(
        self, tmp_path: Path, shared_url: str
    ) -> None:
        """A headless run the store already holds, identical, is skipped, as before: only
        runs the import would write unchecked need --unchained."""
        _, lines = exported(tmp_path)
        path = tmp_path / "old.jsonl"
        path.write_text("\n".join(without_heads(lines)) + "\n")
        ok("import", str(path), "--unchained", "--store", shared_url)
        again = json.loads(ok("import", str(path), "--json", "--store", shared_url))
        assert (again["imported_count"], again["identical_count"], again["unchained"]) == (
            0, 2, [],
        )  # fmt: skip


def large_runs(tmp_path: Path, runs: int) -> list[list[str]]:
    """Export lines of `runs` runs of 200 notes of 5,000 characters each, run by run."""
    url = f"sqlite:///{tmp_path / 'large.db'}"
    with Engine(url) as engine:
        for _ in range(runs):
            run = engine.start_run(REVIEW)
            with run.batch():
                for index in range(200):
                    run.note("step", f"{index:05d}" + "x" * 5000)
    lines = ok("export", "--all", "--store", url).splitlines()
    return [lines[start : start + 201] for start in range(0, len(lines), 201)]


def held_at_refusal(engine: Engine, path: Path, lines: list[str]) -> int:
    """Bytes the check pass of importing `lines` into `engine` still holds when it refuses
    them: what its frame keeps (the error's traceback keeps it) once the file is read."""
    path.write_text("\n".join(lines) + "\n")
    tracemalloc.start()
    try:
        with pytest.raises(BadImportLine) as refusal:
            import_runs(engine, str(path), as_json=True)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        del refusal
        gc.collect()
        return held - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


class TestImportMemory:
    def test_a_refused_file_holds_one_run_at_a_time(self, tmp_path: Path) -> None:
        """Checking a file whose first headless run is already stored and a second is new
        holds one run at a time, not those two as well: only their ids are kept to refuse it."""
        stored, new, headed = large_runs(tmp_path, 3)
        target = f"sqlite:///{tmp_path / 'target.db'}"
        (tmp_path / "stored.jsonl").write_text("\n".join(without_heads(stored)) + "\n")
        ok("import", str(tmp_path / "stored.jsonl"), "--unchained", "--store", target)
        with Engine(target) as engine:
            one = held_at_refusal(engine, tmp_path / "two.jsonl", without_heads(new) + headed)
            both = held_at_refusal(
                engine, tmp_path / "three.jsonl", without_heads(stored + new) + headed
            )
        # it held the first headless run and the first new one besides the last run read:
        # two runs and the last (the first headless run is the new one) against three
        assert both < 1.2 * one, (both, one)
