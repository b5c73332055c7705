"""A page of a run's events as one row: its states joined by SQLite into one JSON array.

A stream reads a long run a page at a time. Read as rows, each row costs the
`sqlite3` module a step that hands the GIL back and takes it again, and an int,
a str and a bytes object, and the page's states are then copied again into one
array for the JSON decoder. Here one ``SELECT`` aggregates the page instead:
how many rows it holds and its first and last versions (the stream's hole check
and its next page), and, of the rows of the topics asked for, their versions,
their topics and their states joined by commas (each state one JSON document,
so with brackets around it one JSON array) in one BLOB, a NULL state as a NUL
byte (``group_concat`` would skip it, and JSON holds no raw NUL: the decoder
refuses the page); and, of a compact store, the newest topic id its topics
table holds (one read in the statement's own snapshot, not one per row).

The rows are aggregated in the order the inner ``SELECT`` gives them (by
version), which the versions read back are checked for: a page whose versions do
not ascend, whose topics do not add up, whose JSON the decoder refuses, or that
knows a topic id newer than those its narrowing was given (a compact store's
topic added by another process between the two reads) is `None`, and the caller
reads it as rows instead.
Only for a store whose states are the JSON itself (no cipher, no compression):
anything else is read as rows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import orjson


@attrs.frozen
class JoinedPage:
    """A page of a run's events, the wanted ones' states joined into one JSON array."""

    count: int
    """Rows in the page, of every topic (fewer than asked: the run's last page)."""
    first: int | None
    """The page's oldest version (None: no row)."""
    last: int | None
    """The page's newest version (None: no row)."""
    rows: list[tuple[int, str]]
    """The (version, topic) of each row of the topics asked for, oldest first."""
    joined: bytes
    """Their states as one JSON array, in the order of `rows` (``[]``: none)."""


MASKED = 63
"""Topic ids below this (a compact store's) narrow a page by one bit test per row
(``:mask >> topic & 1``): an ``IN`` list costs SQLite a lookup per row, ~4 times as much."""


def masked(keys: Sequence[Any]) -> bool:
    """Whether a page narrowed to `keys` is narrowed by a mask (`parameters`' ``mask``): all
    of them topic ids below `MASKED` (none negative)."""
    return all(type(key) is int and 0 <= key < MASKED for key in keys)


def statement(
    table: str,
    gt: bool,
    lte: bool,
    topics: int | None,
    topics_table: str | None = None,
    mask: bool = False,
) -> str:
    """The aggregating SELECT of one page (named parameters: key, gt, lte, limit, t0… or mask).

    Args:
        topics: how many topic keys (what the topic column holds) the rows are narrowed
            to (None: every topic).
        topics_table: a compact store's topic ids (the newest it holds read with the page).
        mask: the rows narrowed by the bits of ``:mask`` (the keys `masked` allows), not by
            an ``IN`` list of ``:t0…``.
    """
    return _statement(table, gt, lte, topics, topics_table, mask)


_STATE = "ifnull(s, x'00')"
"""A state as joined: a NULL one, which ``group_concat`` skips (with its comma: two JSON values
glued into one state elsewhere in the page would hide it from a count of values), as a NUL
byte, which no JSON holds raw (the page is then read as rows, which name it)."""


@functools.cache
def _statement(
    table: str, gt: bool, lte: bool, topics: int | None, topics_table: str | None, mask: bool
) -> str:
    names = ",".join(f":t{index}" for index in range(topics or 0))
    wanted = "(:mask >> topic) & 1" if mask else f"topic IN ({names})"
    newest = "NULL" if topics_table is None else f"(SELECT max(id) FROM {topics_table})"
    inner = (
        "SELECT originator_version AS v, topic AS t, state AS s"
        + ("" if topics is None else f", {wanted} AS w")
        + f" FROM {table}"
        " WHERE originator_id=:key"
        + (" AND originator_version>:gt" if gt else "")
        + (" AND originator_version<=:lte" if lte else "")
        + " ORDER BY originator_version ASC LIMIT :limit"
    )
    if topics is None:  # every row wanted: its first and last versions are those read
        return (
            "SELECT count(*), NULL, NULL, group_concat(v), group_concat(t),"
            f" CAST(group_concat({_STATE}, ',') AS BLOB), NULL FROM ({inner})"
        )
    return (
        "SELECT count(*), min(v), max(v), group_concat(v) FILTER (WHERE w),"
        f" group_concat(t) FILTER (WHERE w), CAST(group_concat({_STATE}, ',') FILTER (WHERE w)"
        f" AS BLOB), {newest} FROM ({inner})"
    )


def parameters(
    key: str | bytes | bytearray,
    gt: int | None,
    lte: int | None,
    limit: int,
    topics: Sequence[Any],
    mask: bool = False,
) -> dict[str, Any]:
    """The named parameters of `statement` (`topics`: the topic keys the rows are narrowed to,
    as bits of one ``mask`` if `mask`)."""
    params: dict[str, Any] = {"key": key, "limit": limit}
    if gt is not None:
        params["gt"] = gt
    if lte is not None:
        params["lte"] = lte
    if mask:
        params["mask"] = sum(1 << topic for topic in set(topics))
        return params
    for index, topic in enumerate(topics):
        params[f"t{index}"] = topic
    return params


def page_of(
    row: Sequence[Any], names: Callable[[list[Any]], list[str]] | None, newest: Any = None
) -> JoinedPage | None:
    """The page the aggregating SELECT's one row describes, None where it does not add up.

    Args:
        names: turns the topic ids read into topics (None: they are topics already).
        newest: the newest topic key the narrowing knew of (None: nothing to check).
    """
    count, first, last, versions, topics, joined, top = row
    if not count:
        return JoinedPage(0, None, None, [], b"[]")
    if newest is not None and top is not None and top > newest:  # a topic added meanwhile
        return None
    if versions is None:  # no row of the topics asked for
        return JoinedPage(count, first, last, [], b"[]")
    try:
        wanted = orjson.loads(f"[{versions}]")
        ascending = wanted == sorted(wanted)
    except (orjson.JSONDecodeError, TypeError):  # a version not an integer (edited by hand)
        return None
    if not ascending:  # rows not aggregated in version order
        return None
    if first is None:  # every row wanted
        first, last = wanted[0], wanted[-1]
    held = topics.split(",") if names is None else names(orjson.loads(f"[{topics}]"))
    if len(held) != len(wanted):  # a comma in a topic
        return None
    if joined is None:  # every state NULL
        return None
    return JoinedPage(count, first, last, list(zip(wanted, held, strict=True)), b"[%b]" % joined)
