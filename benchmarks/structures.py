"""Persistent maps: `immutables.Map` (a C HAMT) vs the home-made two-level hash trie.

Run: ``python -m benchmarks.structures`` (``--quick`` for a smoke run, ``--json``
for machine output). The baseline is `HomeMadePMap`, a frozen copy of the `PMap`
stagetrail used before, so this benchmark keeps working once that class is gone.

Each operation is measured at 1, 1,000, 100,000 and 1,000,000 keys (``--quick``:
1, 1,000 and 10,000), keys like ``"task-000123"`` and short string values:

1. build: an N-key map by successive persistent ``.set`` calls (ns per set);
2. one more ``.set`` on the N-key map, of a new key and of an existing key (the
   median of 1,000 individually timed sets, each on the same N-key map);
3. get: a lookup of an existing key (a batch of random lookups, divided);
4. iterate: every item of the N-key map (ns per item).

Times come from `time.perf_counter_ns`; the two structures are measured in turn in
each round and every figure is the median over the rounds. The cost of the timing
loop itself (an identical loop with an empty body) is subtracted from builds, sets
and lookups. The garbage collector stays on, as in stagetrail: it matters, since
every HAMT node is an object the collector tracks and traverses, while the home-made
buckets (dicts of strings) are untracked. The ratio is home-made / immutables:
above 1, `immutables.Map` is faster.
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import statistics
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple, Protocol, Self, TypeAlias, TypeVar

import immutables

K = TypeVar("K")
V = TypeVar("V")

TITLE = "persistent maps: home-made PMap vs immutables.Map (ns per operation)"

clock = time.perf_counter_ns

# --- The baseline: an exact copy of projections/_pmap.py's PMap (renamed). ---

_FANOUT = 32
_Buckets: TypeAlias = "tuple[tuple[dict[object, object], ...], ...]"
_EMPTY: _Buckets = tuple(tuple({} for _ in range(_FANOUT)) for _ in range(_FANOUT))


class HomeMadePMap(Mapping[K, V]):
    """The persistent map stagetrail used before, kept here as the baseline.

    A two-level hash trie: `set` copies one bucket and two 32-slot tuples.
    """

    __slots__ = ("_buckets", "_size")

    def __init__(self, buckets: _Buckets = _EMPTY, size: int = 0) -> None:
        self._buckets = buckets
        self._size = size

    @classmethod
    def of(cls, items: Mapping[K, V]) -> HomeMadePMap[K, V]:
        """A map holding `items`."""
        result: HomeMadePMap[K, V] = cls()
        for key, value in items.items():
            result = result.set(key, value)
        return result

    def set(self, key: K, value: V) -> Self:
        """A map like this one with `key` mapped to `value`."""
        outer, inner = _slot(key)
        row = self._buckets[outer]
        bucket = dict(row[inner])
        added = key not in bucket
        bucket[key] = value
        row = (*row[:inner], bucket, *row[inner + 1 :])
        buckets = (*self._buckets[:outer], row, *self._buckets[outer + 1 :])
        return type(self)(buckets, self._size + added)

    def __getitem__(self, key: K) -> V:
        outer, inner = _slot(key)
        return self._buckets[outer][inner][key]  # type: ignore[return-value]

    def __iter__(self) -> Iterator[K]:
        for row in self._buckets:
            for bucket in row:
                yield from bucket  # type: ignore[misc]

    def __len__(self) -> int:
        return self._size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"


def _slot(key: object) -> tuple[int, int]:
    code = hash(key)
    return (code >> 5) & (_FANOUT - 1), code & (_FANOUT - 1)


# --- The benchmark. ---


class StrMap(Protocol):
    """What the benchmark uses of a persistent map from task ids to strings."""

    def set(self, key: str, value: str, /) -> StrMap: ...
    def __getitem__(self, key: str, /) -> str: ...
    def items(self) -> Iterable[tuple[str, str]]: ...


class Sizes(NamedTuple):
    """How big each measurement is (full size, or --quick)."""

    keys: tuple[int, ...]
    rounds: int
    build_rounds_1m: int
    single_sets: int
    lookups: int
    batch: int


FULL = Sizes((1, 1_000, 100_000, 1_000_000), 5, 3, 1_000, 100_000, 100_000)
QUICK = Sizes((1, 1_000, 10_000), 3, 3, 200, 10_000, 10_000)

STATUSES = ("queued", "running", "done")
UPDATE = "failed"
"""The value of an update of an existing key: stored nowhere, so every set changes the map."""

STRUCTURES: dict[str, StrMap] = {
    "home_made": HomeMadePMap[str, str](),
    "immutables": immutables.Map[str, str](),
}


class Case(NamedTuple):
    """The inputs of every measurement at one size."""

    items: list[tuple[str, str]]
    new: list[tuple[str, str]]
    existing: list[tuple[str, str]]
    lookups: list[str]


def task_id(number: int) -> str:
    """A key as stagetrail stores them: ``task-000123``."""
    return f"task-{number:06d}"


def make_case(count: int, sizes: Sizes, rng: random.Random) -> Case:
    """The keys and values of an N-key map, plus the keys set and looked up on it."""
    items = [(task_id(n), STATUSES[n % len(STATUSES)]) for n in range(count)]
    new = [(task_id(count + n), STATUSES[n % len(STATUSES)]) for n in range(sizes.single_sets)]
    keys = [key for key, _ in items]
    existing = [(key, UPDATE) for key in rng.choices(keys, k=sizes.single_sets)]
    return Case(items, new, existing, rng.choices(keys, k=sizes.lookups))


def build(empty: StrMap, items: Sequence[tuple[str, str]], reps: int) -> tuple[float, StrMap]:
    """Ns per set to build the map of `items` `reps` times over, and the map built."""
    result = empty
    start = clock()
    for _ in range(reps):
        result = empty
        for key, value in items:
            result = result.set(key, value)
    elapsed = clock() - start
    start = clock()
    for _ in range(reps):
        for _key, _value in items:
            pass
    loop = clock() - start
    return (elapsed - loop) / (reps * len(items)), result


def single_sets(base: StrMap, items: Sequence[tuple[str, str]]) -> float:
    """The median ns of one `set` of each of `items` on `base`, each timed alone."""
    times: list[int] = []
    for key, value in items:
        start = clock()
        base.set(key, value)
        times.append(clock() - start)
    empty: list[int] = []
    for _key, _value in items:
        start = clock()
        empty.append(clock() - start)
    return statistics.median(times) - statistics.median(empty)


def lookups(mapping: StrMap, keys: Sequence[str]) -> float:
    """Ns per lookup of each of `keys` in `mapping`, timed as one batch."""
    start = clock()
    for key in keys:
        mapping[key]
    elapsed = clock() - start
    start = clock()
    for _key in keys:
        pass
    return (elapsed - (clock() - start)) / len(keys)


def iterate(mapping: StrMap, count: int, reps: int) -> float:
    """Ns per item to iterate the `count` items of `mapping` `reps` times over."""
    start = clock()
    for _ in range(reps):
        for _item in mapping.items():
            pass
    return (clock() - start) / (reps * count)


def measure(count: int, sizes: Sizes, rng: random.Random) -> list[dict[str, object]]:
    """The rows of every operation at `count` keys, the structures measured in turn."""
    case = make_case(count, sizes, rng)
    reps = max(1, sizes.batch // count)
    rounds = sizes.build_rounds_1m if count >= 1_000_000 else sizes.rounds
    names = list(STRUCTURES)
    figures: dict[str, dict[str, list[float]]] = {
        operation: {name: [] for name in names}
        for operation in ("build", "set_new", "set_existing", "get", "iterate")
    }
    maps: dict[str, StrMap] = {}
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else reversed(names):
            per_set, maps[name] = build(STRUCTURES[name], case.items, reps)
            figures["build"][name].append(per_set)
    for round_ in range(sizes.rounds):
        for name in names if round_ % 2 == 0 else reversed(names):
            base = maps[name]
            figures["set_new"][name].append(single_sets(base, case.new))
            figures["set_existing"][name].append(single_sets(base, case.existing))
            figures["get"][name].append(lookups(base, case.lookups))
            figures["iterate"][name].append(iterate(base, count, max(1, 1_000 // count)))
    labels = {
        "build": "build by successive set (ns/set)",
        "set_new": "set a new key on the map (ns)",
        "set_existing": "set an existing key on the map (ns)",
        "get": "get an existing key (ns)",
        "iterate": "iterate items (ns/item)",
    }
    return [row(labels[operation], count, figures[operation]) for operation in labels]


def row(case: str, count: int, figures: dict[str, list[float]]) -> dict[str, object]:
    """One result row: the median of each structure and their ratio."""
    home_made = statistics.median(figures["home_made"])
    rival = statistics.median(figures["immutables"])
    ratio = home_made / rival if rival > 0 else float("inf")
    return {
        "case": case,
        "keys": count,
        "home_made": home_made,
        "immutables": rival,
        "ratio": ratio,
        "faster": "immutables" if ratio > 1 else "home_made",
    }


def compatibility() -> dict[str, bool]:
    """Facts that matter when replacing PMap: subclassing, dict equality, pickling."""
    try:
        type("TaskStatuses", (immutables.Map,), {"__slots__": ()})
        subclassable = True
    except TypeError:
        subclassable = False
    sample = immutables.Map({"task-000001": "done"})
    return {
        "immutables.Map can be subclassed": subclassable,
        "immutables.Map(...) == equal dict": bool(sample == {"task-000001": "done"}),
        "immutables.Map pickles round-trip": pickle.loads(pickle.dumps(sample)) == sample,
        "HomeMadePMap(...) == equal dict": bool(
            HomeMadePMap[str, str]().set("task-000001", "done") == {"task-000001": "done"}
        ),
    }


def table(rows: list[dict[str, object]], facts: dict[str, bool]) -> str:
    """The rows as a plain-text table, then the compatibility facts."""
    header = ("operation", "keys", "home-made", "immutables", "ratio", "faster")
    cells = [
        (
            str(r["case"]),
            f"{r['keys']:,}",
            f"{r['home_made']:,.1f}",
            f"{r['immutables']:,.1f}",
            f"{r['ratio']:,.2f}",
            str(r["faster"]),
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [header, *cells]) for i in range(len(header))]
    lines = [TITLE, "ratio = home-made / immutables (> 1: immutables is faster)", ""]
    for number, line in enumerate([header, *cells]):
        padded = [cell.rjust(width) for cell, width in zip(line, widths, strict=True)]
        lines.append("  ".join([line[0].ljust(widths[0]), *padded[1:]]))
        if number == 0:
            lines.append("  ".join("-" * width for width in widths))
    lines.append("")
    lines.extend(f"{fact}: {value}" for fact, value in facts.items())
    return "\n".join(lines)


def arguments(description: str) -> argparse.Namespace:
    """Command-line options as in benchmarks._common (which imports the whole engine)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    return parser.parse_args()


def main() -> None:
    """Measure both maps at every size and print the table (or JSON)."""
    args = arguments(__doc__ or "")
    sizes = QUICK if args.quick else FULL
    rng = random.Random(20240601)
    rows: list[dict[str, object]] = []
    for count in sizes.keys:
        started = time.perf_counter()
        rows.extend(measure(count, sizes, rng))
        took = time.perf_counter() - started
        print(f"  {count:,} keys measured in {took:.1f} s", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"benchmark": TITLE, "results": rows}))
    else:
        print(table(rows, compatibility()))


if __name__ == "__main__":
    main()
