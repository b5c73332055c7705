"""Options that only apply with another option: given alone, one usage error naming both."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import Result

from tests.cli._helpers import Filled, fill, invoke


@pytest.fixture
def filled(sqlite_url: str) -> Filled:
    """A SQLite file holding the examples' runs."""
    return fill(sqlite_url)


def refused(result: Result, *options: str) -> None:
    """`result` is a usage error (exit code 2) whose error line names every one of `options`."""
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    for option in options:
        assert option in error, error
    assert result.stdout == ""


class TestOptionsThatNeedAnother:
    def test_full_limit_without_full_is_refused(self, filled: Filled, tmp_path: Path) -> None:
        """report --full-limit N without --full is one error naming both, and writes no file."""
        path = tmp_path / "report.html"
        args = ["report", str(filled.clean), "--html", str(path), "--store", filled.url]
        refused(invoke(*args, "--full-limit", "5"), "--full-limit", "--full")
        refused(invoke(*args, "--full-limit", "10000"), "--full-limit", "--full")
        assert not path.exists()
        assert invoke(*args, "--full", "--full-limit", "100").exit_code == 0
        assert path.exists()

    def test_export_of_named_runs_and_all_is_refused(self, filled: Filled) -> None:
        """export RUN --all is refused instead of silently exporting every run."""
        result = invoke("export", str(filled.clean), "--all", "--store", filled.url)
        refused(result, "--all")

    def test_otel_follow_with_since_is_refused(self, filled: Filled) -> None:
        """otel --follow --since TIME is refused: following exports what comes, not a window."""
        refused(invoke("otel", "--follow", "--since", "2d", "--store", filled.url), "--follow",
                "--since")  # fmt: skip

    def test_otel_json_with_an_endpoint_is_refused(self, filled: Filled) -> None:
        """otel --json --endpoint URL is refused: --json prints the spans and sends none."""
        result = invoke(
            "otel", str(filled.clean), "--json", "--endpoint", "http://127.0.0.1:9/v1/traces",
            "--store", filled.url,
        )  # fmt: skip
        refused(result, "--json", "--endpoint")

    @pytest.mark.parametrize(
        ("projection", "option", "other"),
        [("task_table", "--frames", "--items"), ("state_stack", "--items", "--frames")],
    )
    def test_a_limit_of_the_other_kind_of_state_is_refused(
        self, filled: Filled, projection: str, option: str, other: str
    ) -> None:
        """state --frames of a projection that is no stack (--items of a stack) names the one
        that applies."""
        result = invoke(
            "state", str(filled.busy), "--projection", projection, option, "5",
            "--store", filled.url,
        )  # fmt: skip
        assert result.exit_code == 2, (result.stdout, result.stderr)
        assert option in result.stderr
        assert other in result.stderr
        assert f"--projection {projection}" in result.stderr
        assert result.stdout == ""
        assert invoke("state", str(filled.busy), "--projection", projection, other, "5",
                      "--store", filled.url).exit_code == 0  # fmt: skip
