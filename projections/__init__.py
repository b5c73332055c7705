"""The read side of stagetrail: projections folded from runs' events.

The projection protocol and the built-in read models arrive with the
projections issue; this package exists now so the import direction
``engine -> projections -> events`` is fixed from the start.
"""

from __future__ import annotations

__all__: list[str] = []
