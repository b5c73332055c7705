"""Adapters to other frameworks, each behind its own optional extra (none yet)."""

from __future__ import annotations

__all__: list[str] = []
