"""The local viewer (`stagetrail ui`) and the offline HTML report (`stagetrail report`).

Its web dependencies are the optional ``ui`` extra: ``pip install 'stagetrail[ui]'``.
"""

from __future__ import annotations

from engine.ui.app import create_app
from engine.ui.report import Report, build_report, write_report

__all__ = ["Report", "build_report", "create_app", "write_report"]
