"""The version of stagetrail, as `stagetrail --version` prints it.

A constant, so that printing it imports nothing (`importlib.metadata` costs more
than the rest of the command); tests/cli/test_startup.py checks that it is the
version pyproject.toml gives the distribution.
"""

from __future__ import annotations

VERSION = "0.1.0"
"""The distribution's version (``[project] version`` in pyproject.toml)."""
