"""The standalone example in examples/ runs as a reader would run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class TestReviewLoop:
    def test_runs_from_the_repository_root(self, tmp_path: Path) -> None:
        """`python examples/review_loop.py URL` drives a run to done, its failed draft retried."""
        url = f"sqlite:///{tmp_path / 'runs.db'}"
        done = subprocess.run(
            [sys.executable, "examples/review_loop.py", url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        assert "ended succeeded in state done" in done.stdout
        assert "failures by stage: {'write': 1}" in done.stdout
        assert "after event 3 the stack's top was write failed" in done.stdout
