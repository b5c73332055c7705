"""LangGraph's msgpack values read for people, without importing or building their classes.

LangGraph's `JsonPlusSerializer` writes a value msgpack cannot hold natively (a
pydantic model, a dataclass, a datetime, a message) as a msgpack extension
holding ``(module, name, arguments)``. Rebuilding it would import that module
and call its constructor: a viewer must not run code a stored value names. This
reader reads the same bytes into plain JSON-like values instead: an extension
becomes ``{"__type__": "module.name", ...its fields}``. Registered as the
``msgpack`` reader of `engine.payloads` (entry point group
``stagetrail.value_readers``), so ``stagetrail show``, the viewer and the report
use it.
"""

from __future__ import annotations

import math
from typing import Any

import ormsgpack

_SINGLE_ARG, _POS_ARGS, _KW_ARGS, _METHOD, _PYDANTIC_V1, _PYDANTIC_V2, _NUMPY, _DELTA = range(8)
"""LangGraph's msgpack extension codes (`langgraph.checkpoint.serde.jsonplus`)."""


def read_msgpack(data: bytes) -> Any:
    """A msgpack value LangGraph's serde wrote, as JSON-like values and typed summaries."""
    return _plain(ormsgpack.unpackb(data, ext_hook=_extension, option=ormsgpack.OPT_NON_STR_KEYS))


def _extension(code: int, data: bytes) -> Any:
    """One extension as a typed summary: its type's name and its fields or arguments."""
    inner = ormsgpack.unpackb(data, ext_hook=_extension, option=ormsgpack.OPT_NON_STR_KEYS)
    if code == _DELTA:
        return inner
    if code == _NUMPY:
        return {"__type__": "numpy.ndarray"}
    if not isinstance(inner, list | tuple) or len(inner) < 3:
        return {"__type__": f"msgpack extension {code}"}
    name = f"{inner[0]}.{inner[1]}"
    arguments = inner[2]
    if code in (_KW_ARGS, _PYDANTIC_V1, _PYDANTIC_V2) and isinstance(arguments, dict):
        return {"__type__": name, **{str(k): v for k, v in arguments.items()}}
    if code == _POS_ARGS:
        return {"__type__": name, "args": arguments}
    return {"__type__": name, "value": arguments}


def _plain(value: Any) -> Any:
    """`value` with what JSON cannot hold summarised: bytes, non-str keys, NaN."""
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, bytes | bytearray):
        return f"<bytes, {len(value)} bytes>"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
