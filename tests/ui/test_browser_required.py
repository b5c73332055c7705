"""Browser tests skip with a reason when Debian's Chromium is absent, as PostgreSQL's tests do."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._helpers import browser_problem, require_browser


class TestRequireBrowser:
    def test_a_missing_chromium_skips_with_the_apt_line(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without Chromium a browser test is skipped, naming the path and how to install it."""
        monkeypatch.delenv("STAGETRAIL_REQUIRE_BROWSER", raising=False)
        missing = tmp_path / "chromium"
        with pytest.raises(pytest.skip.Exception, match="apt-get install chromium") as skipped:
            require_browser(missing)
        assert str(missing) in str(skipped.value)

    def test_required_browser_turns_the_skip_into_a_failure(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Under STAGETRAIL_REQUIRE_BROWSER=1 (as .ci/run sets) a missing Chromium fails."""
        monkeypatch.setenv("STAGETRAIL_REQUIRE_BROWSER", "1")
        with pytest.raises(pytest.fail.Exception, match="STAGETRAIL_REQUIRE_BROWSER=1 but"):
            require_browser(tmp_path / "chromium")

    def test_ci_requires_the_browser(self) -> None:
        """.ci/run installs Chromium and sets STAGETRAIL_REQUIRE_BROWSER=1, so CI never skips."""
        script = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
        assert "export STAGETRAIL_REQUIRE_BROWSER=1" in script
        assert "apt-get install -y -qq chromium" in script

    def test_an_installed_chromium_is_no_problem(self, tmp_path: Path) -> None:
        """An executable at the path (and Playwright installed) leaves the tests to run."""
        present = tmp_path / "chromium"
        present.write_text("")
        assert browser_problem(present) is None
