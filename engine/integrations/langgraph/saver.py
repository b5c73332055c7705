"""`StagetrailSaver`: a LangGraph checkpointer whose storage is a stagetrail store.

Each LangGraph thread is one stagetrail run (pipeline ``langgraph``). A
checkpoint is a `CheckpointSaved` event holding only the channels whose version
changed. A node's writes are its outcome, `StageCompleted` (the writes as its
result) or `StageFailed` (as its details), stage = the node's name, routed from
the ``__graph__`` hub (see `table`); other tasks' writes are `WritesSaved`
events. Values go through LangGraph's own serde, so what comes back is what
LangGraph gave.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import marshal
import os
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any, TypeVar
from uuid import UUID

import attrs
import ormsgpack
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT, TASKS
from langgraph.constants import START
from langgraph.pregel import Pregel

from engine.diagram import GRAPH_PARAM
from engine.engine import Engine
from engine.errors import ConcurrencyConflict, InvalidArgument, RunBeingErased, RunErased
from engine.integrations.langgraph import skeleton as skeleton_json
from engine.integrations.langgraph.attempts import RETRIES, Retried
from engine.integrations.langgraph.table import HUB, PIPELINE_PREFIX, thread_pipeline
from engine.integrations.langgraph.thread import (
    AS_JSON,
    NODE_TASK,
    REFERENCE,
    Known,
    Saved,
    Thread,
    Typed,
    serde_form,
)
from engine.machine import RunState
from engine.pipeline import Pipeline
from engine.run import Run, unit_of
from engine.sharded import ShardedEngine
from engine.store import PAGE, StoreError, urls
from events import (
    DECIDED,
    CheckpointSaved,
    CheckpointsRemoved,
    Event,
    InvalidPayload,
    RetryScheduled,
    RunStarted,
    StageCompleted,
    StagetrailError,
    WritesSaved,
    utc_now,
)
from projections import PAUSED_STATUSES, RUNNING, STATUS_NOTE, RunSummary

THREAD_LABEL = "langgraph.thread"
"""The label holding a run's LangGraph thread id."""
GENERATION_LABEL = "langgraph.generation"
"""The label holding a thread's run's generation: how many of the thread's runs were
deleted before it (0: the thread's first run)."""
_NAMESPACE = uuid.UUID("6f1d3c1e-8a4b-5d2e-9c7f-1b2a3c4d5e6f")
_GENERATIONS = uuid.UUID("b8a7f1d2-3c4e-5f60-8a9b-0c1d2e3f4a5b")
"""The namespace of a thread's later runs' ids: none equals a first run's id."""
_PULL = NODE_TASK
_RETRIES = 5
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DURABILITY = "__pregel_durability"
"""The key of LangGraph's durability mode in the configs it hands a checkpointer (when the
invocation names one; its default is ``"async"``)."""
_LOOP = "__pregel_runtime"
"""A key of the configs LangGraph's loop hands a checkpointer (absent from direct calls)."""
_ORDER_WAIT = 2.0
"""The longest a save from LangGraph's loop waits for the ones it must follow (see `_in_order`)."""
_NULL_TASK = "00000000-0000-0000-0000-000000000000"
"""The task id of the writes LangGraph makes of an invocation's input `Command`, against the
checkpoint it loaded (or, for a thread without one, an empty one it never saves)."""
_BRANCH = "branch:to:"
"""The start of the channel of a graph's edge into a node (the node's name follows)."""
_ORDERED = frozenset({"sync", "async"})
"""The durability modes under which LangGraph saves a task's writes from its thread pool
during the invocation (``"exit"`` saves once, at the end): their saves are ordered."""
_BUMPS = "__snapshot_bumps__"
"""The key of ``versions_seen`` where LangGraph marks the versions a snapshot bumped."""
_SEEN_ALSO = frozenset({INTERRUPT, _BUMPS})
"""Keys of a checkpoint's ``versions_seen`` that name no task (LangGraph's bookkeeping)."""
_BUMP_MARK = "|"
"""What joins a node and a channel in LangGraph's marks of versions a snapshot bumped."""
_SAVED = 4096
"""Checkpoints a saver remembers having recorded or read, for the writes that must follow them."""
_FRAMES = 8
"""How far up the calling frames the graph invoking a saver is looked for."""
_RETRY_POLICY = {"langgraph": "RetryPolicy"}
"""The policy a retry LangGraph decided is recorded with (its settings are not reported)."""
_EMPTY: Typed = ("empty", b"")
_JSON_FROM = 96
"""Below this many bytes, base64 costs less than the check whether a value is plain JSON."""
_ALL_THREADS = 1_000_000
_GAP_SCAN = 100_000
"""How many generations past an erased one the runs of older releases (without a
`GENERATION_LABEL`) are looked for."""
_CACHED_THREADS = 256
"""Threads whose fold a saver keeps between calls; others are read again from the store."""
_IN_ORDER_ALREADY = contextlib.nullcontext()
"""What a save that never waits for another is recorded in (see `StagetrailSaver._in_order`)."""
_ONE_EVENT = contextlib.nullcontext()
"""What a save of one event is recorded in: its record is its own transaction."""
_NOT_IN_SKELETON = frozenset({"channel_values", "id"})
"""A checkpoint's keys kept elsewhere: its values as blobs, its id as the event's."""
_YIELD: Callable[[], object] = getattr(os, "sched_yield", functools.partial(time.sleep, 0))
"""Give the GIL to a thread waiting for it: ``sched_yield`` costs a microsecond or two where
``time.sleep(0)`` waits out the kernel's timer slack (50 µs and more, each checkpoint)."""

_T = TypeVar("_T")

Step = Callable[[Run], Event]
"""One recording call on the thread's run, made inside the write's `batch()`."""
Steps = list[Step]
Tuples = list[CheckpointTuple]
Shape = list[list[str]]
"""A graph's edges: ``[source, dest]``, or ``[source, dest, "if"]`` for a conditional one."""

Summaries = list[RunSummary]
Threads = list[Thread]
Removed = list[list[str]]
Encoded = list[Any]
"""A serialised value in an event: ``[type, base64]``."""
Build = Callable[[Thread], Steps]
"""Makes the recording calls from the thread's current state (empty: nothing to do)."""


def thread_run_ids(thread_id: str) -> Iterator[UUID]:
    """The run ids a thread's runs take in turn: a deleted thread used again starts the next.

    The first is the uuid5 of the thread id itself (as it always was); the later ones
    are the uuid5, in a namespace of their own, of ``[thread_id, generation]`` as JSON.
    Two different thread ids therefore never share a run id, whatever characters they
    hold (the first releases joined the generation with a NUL, which ``"a\\x001"`` matched;
    those runs are still found, see `legacy_run_id`).
    """
    yield uuid.uuid5(_NAMESPACE, thread_id)
    generation = 1
    while True:
        yield generation_run_id(thread_id, generation)
        generation += 1


def generation_run_id(thread_id: str, generation: int) -> UUID:
    """The run id of a thread's run after `generation` deletions (0: its first run)."""
    if generation == 0:
        return uuid.uuid5(_NAMESPACE, thread_id)
    key = json.dumps([thread_id, generation], ensure_ascii=True)
    return uuid.uuid5(_GENERATIONS, key)


def _run_ids(thread_id: str, generation: int) -> tuple[UUID, ...]:
    """The ids a thread's run of `generation` may have: its own, and the first releases'."""
    own = generation_run_id(thread_id, generation)
    return (own,) if generation == 0 else (own, legacy_run_id(thread_id, generation))


def _labels(thread_id: str, generation: int) -> dict[str, str]:
    """The labels of a thread's run of `generation`: the thread, and the generation."""
    return {THREAD_LABEL: thread_id, GENERATION_LABEL: str(generation)}


def _generation_of(summary: RunSummary, thread_id: str) -> int | None:
    """The generation of the thread's run `summary` as its label says, if its id is that
    generation's (a fork keeps its origin's labels under an id of its own: None)."""
    text = summary.labels.get(GENERATION_LABEL, "")
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        return None
    generation = int(text)
    return generation if generation_run_id(thread_id, generation) == summary.run_id else None


def _scan_past_gap(thread_id: str, gap: int, unplaced: set[UUID]) -> int | None:
    """The newest generation after `gap` whose run is one of `unplaced` (runs of older
    releases, which carry no generation label), looking `_GAP_SCAN` generations on."""
    for generation in range(gap + 1):  # the chain's own, and any the index still lists
        unplaced.difference_update(_run_ids(thread_id, generation))
    newest = None
    for generation in range(gap + 1, gap + 1 + _GAP_SCAN):
        if not unplaced:
            break
        if not unplaced.isdisjoint(ids := _run_ids(thread_id, generation)):
            unplaced.difference_update(ids)
            newest = generation
    return newest


def legacy_run_id(thread_id: str, generation: int) -> UUID:
    """The run id the first releases gave a thread's run after `generation` deletions.

    Not injective (``"a"``'s second run and thread ``"a\\x001"``'s first share it): a run
    found under it is the thread's only when its thread label says so.
    """
    return uuid.uuid5(_NAMESPACE, f"{thread_id}\x00{generation}")


def _refuse_shards(engine: object) -> None:
    """Refuse a ``shards:`` layout: a thread's runs and erasures are read in one store."""
    if isinstance(engine, ShardedEngine):
        shards = ", ".join(urls.mask(url) for url in engine.layout.urls)
        raise StoreError(
            engine.url,
            "the LangGraph saver works per shard: give it Engine(url) of one shard "
            f"({shards}), not the shards: layout",
        )


class StagetrailSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer that records every checkpoint, write and node outcome as events.

    Args:
        engine: the stagetrail engine whose store keeps the threads (memory, SQLite, PostgreSQL).
        graph: the graph (a `StateGraph` or a compiled one) or its node names; its nodes
            become the stages of each thread's run. Without it, checkpoints are kept but
            node outcomes are not recorded as stages.
        serde: LangGraph's serializer (default: LangGraph's `JsonPlusSerializer`).

    Raises:
        StoreError: `engine` is a `ShardedEngine`: the saver keeps one store, so it
            is given the `Engine` of one shard (its own URL) instead.
    """

    def __init__(
        self,
        engine: Engine,
        graph: Any = None,
        *,
        serde: SerializerProtocol | None = None,
    ) -> None:
        _refuse_shards(engine)
        super().__init__(serde=serde)
        self.engine = engine
        nodes = getattr(graph, "nodes", graph) or ()
        self.pipeline = thread_pipeline(nodes, getattr(graph, "name", None))
        self._given = graph is not None
        self._shape = _shape_of(graph)
        """The given graph's edges (see `engine.diagram.GRAPH_PARAM`), if it has any."""
        """Whether the graph was given; if not, a thread takes the nodes of the graph calling it."""
        self._graphs: OrderedDict[str, Pipeline] = OrderedDict()
        """The table a thread's next run takes, learned from the graph that invoked it."""
        self._threads: OrderedDict[str, Thread] = OrderedDict()
        """The threads folded so far, least recently used first (at most `_CACHED_THREADS`)."""
        self._free: dict[str, tuple[UUID, int]] = {}
        """The run id a thread's next run takes, as last seen in the store."""
        self._read_at: dict[str, datetime] = {}
        """When each thread was last read: an invocation begins by reading its thread."""
        self._generation: int | None = None
        """The store's erasure generation the caches above were filled in."""
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        """Told of each checkpoint and write recorded while a background save waits on it."""
        self._last_run: Run | None = None
        """The run handle of the saver's last append, which the next one to that thread takes."""
        self._waiting = 0
        """Saves waiting on `_changed` for those they follow (changed under `_lock` only)."""
        self._saved: OrderedDict[tuple[str, str, str | None], None] = OrderedDict()
        """The checkpoints this saver recorded or read lately: a task's writes wait for theirs."""
        self._counting = threading.Lock()
        self._writing: dict[tuple[str, str | None], int] = {}
        """(thread, checkpoint id) → task writes against it being recorded right now."""
        self._heard: OrderedDict[tuple[str, str, str | None], set[str]] = OrderedDict()
        """The task paths whose output writes against a checkpoint came lately (the newest
        `_SAVED` checkpoints): the writes a checkpoint after it waits for."""
        RETRIES.install()

    # -- reading ---------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint `config` names (or the thread's newest), with its pending writes."""
        RETRIES.install()  # an invocation begins here: heard even if logging was configured since
        conf = config["configurable"]
        ns, thread_id = conf.get("checkpoint_ns", ""), _stored_id("thread_id", conf["thread_id"])
        self._learn_graph(thread_id, ns, sys._getframe(1))
        checkpoint_id = get_checkpoint_id(config)

        def read() -> CheckpointTuple | None:
            self._read_at[thread_id] = utc_now()
            return self._checkpoint(thread_id, ns, checkpoint_id)

        found = self._consistent(read)
        if found is not None:  # a checkpoint an invocation resumes from: no save of it comes
            self._saved_now(thread_id, ns, found.checkpoint["id"])
        return found

    def _learn_graph(self, thread_id: str, ns: str, caller: FrameType | None) -> None:
        """Note the nodes of the graph whose invocation is reading the thread, for its run.

        LangGraph hands a checkpointer no graph, but every invocation begins by reading
        its thread, called from the graph's own `stream`: the `Pregel` a few frames up
        whose checkpointer is this saver. Its nodes become the stages of the thread's
        next run, so the plain ``StagetrailSaver(engine)`` records node outcomes too.
        """
        if self._given or ns:
            return
        for _ in range(_FRAMES):
            if caller is None:
                return
            owner = caller.f_locals.get("self")
            if isinstance(owner, Pregel) and owner.checkpointer is self:
                with self._lock:
                    self._graphs[thread_id] = _pipeline_of(tuple(sorted(owner.nodes)))
                    self._graphs.move_to_end(thread_id)
                    while len(self._graphs) > _CACHED_THREADS:
                        self._graphs.popitem(last=False)
                return
            caller = caller.f_back

    def _checkpoint(
        self, thread_id: str, ns: str, checkpoint_id: str | None
    ) -> CheckpointTuple | None:
        """The named checkpoint of the thread (or its newest in `ns`), None if there is none."""
        thread = self._live(thread_id)
        if thread is None:
            return None
        if checkpoint_id:
            saved = thread.checkpoints.get(ns, {}).get(checkpoint_id)
        else:
            saved = thread.latest(ns)
        return None if saved is None else self._tuple(thread, saved)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, by thread, namespace, metadata `filter`, `before`, `limit`."""
        conf = config["configurable"] if config else {}
        thread_id = conf.get("thread_id")
        if thread_id is not None:
            thread_id = _stored_id("thread_id", thread_id)
        query = _Query(
            conf.get("checkpoint_ns"),
            get_checkpoint_id(config) if config else None,
            get_checkpoint_id(before) if before else None,
            filter,
            limit,
        )
        yield from self._consistent(functools.partial(self._listed, thread_id, query))

    def _listed(self, thread_id: Any, query: _Query) -> Tuples:
        """The checkpoints `query` selects of one thread (or of all), newest first."""
        found: Tuples = []
        for thread in self._threads_for(thread_id):
            for ns in thread.namespaces():
                if query.ns is not None and ns != query.ns:
                    continue
                for saved in thread.events_of(ns):
                    if query.limit is not None and len(found) >= query.limit:
                        break
                    if query.selects(saved, functools.partial(self._metadata, thread, saved)):
                        found.append(self._tuple(thread, saved))
        return found

    def _consistent(self, read: Callable[[], _T]) -> _T:
        """What `read()` gives under the saver's lock, made again until no erasure is under it.

        The caches are read as they stand and the store's erasure generation is looked at
        once, after: a read made on caches an erasure has outdated since they were filled,
        or torn by one while it ran, is dropped (none of it is served), every cache is
        forgotten and the read is made again. One look at the generation per read where a
        look before it and one after were taken.
        """
        with self._lock:
            generation = self._generation
            if generation is None:
                generation = self._follow_generation()
            while True:
                try:
                    found = read()
                except Exception as error:
                    self._torn(generation, error)
                    generation = self._follow_generation()
                    continue
                if self._still(generation):
                    return found
                generation = self._follow_generation()

    def _follow_generation(self) -> int:
        """Forget every cached thread once runs were erased from the store, by any process.

        An erased thread's run id is free again, and the thread's next run takes it:
        a fold cached before the erasure would serve the erased checkpoints for the
        new run, and build the next events on versions the new run does not have.
        """
        generation = self.engine.store.generation()
        if generation != self._generation:
            self._threads.clear()
            self._free.clear()
            self._read_at.clear()
            self._last_run = None
            self._generation = generation
        return generation

    def _still(self, generation: int) -> bool:
        """Whether no erasure happened since `generation` was read (else a read starts over)."""
        return self.engine.store.generation() == generation

    def _torn(self, generation: int, error: Exception) -> None:
        """Go on after a read that failed midway, if runs were erased under it; else raise.

        A thread compacted away while it is read leaves a half-read history (a stream
        that ends early, a checkpoint whose parent is gone): that read is dropped and
        the next starts over with every cache forgotten.

        Raises:
            StagetrailError: `error` itself when it is one, else a `StoreError` naming it,
                when no erasure explains it.
        """
        if not self._still(generation):
            return
        if isinstance(error, StagetrailError):
            raise error
        problem = f"a thread's history could not be read: {type(error).__name__}: {error}"
        raise StoreError(self.engine.store.url, problem) from error

    def _threads_for(self, thread_id: Any) -> Threads:
        if thread_id is not None:
            thread = self._live(str(thread_id))
            return [] if thread is None else [thread]
        threads = []
        for summary in self._open_runs():
            label = summary.labels.get(THREAD_LABEL)
            if summary.pipeline.startswith(PIPELINE_PREFIX) and label is not None:
                thread = self._live(label)
                if thread is not None and thread.run_id == summary.run_id:
                    threads.append(thread)
        return threads

    def _open_runs(self) -> Summaries:
        """The store's runs that are not finished: running, or paused (idle, waiting...)."""
        statuses = (RUNNING, *sorted(PAUSED_STATUSES))
        runs = self.engine.runs
        return [found for status in statuses for found in runs(status=status, limit=_ALL_THREADS)]

    def _tuple(self, thread: Thread, saved: Saved) -> CheckpointTuple:
        ns, tid = saved.namespace, thread.thread_id
        checkpoint, metadata = thread.copies(ns, saved.checkpoint_id)
        if saved.checkpoint is not None:  # stored by the serde, not as JSON
            checkpoint = self._load(saved.checkpoint)
            checkpoint.setdefault("id", saved.checkpoint_id)
        loads = self.serde.loads_typed
        values = thread.channel_values(ns, checkpoint["channel_versions"])
        checkpoint["channel_values"] = {ch: loads(v) for ch, v in values.items()}
        writes = thread.pending_writes(ns, saved.checkpoint_id)
        return CheckpointTuple(
            config=_config(tid, ns, saved.checkpoint_id),
            checkpoint=checkpoint,
            metadata=metadata if saved.metadata is None else self._load(saved.metadata),
            parent_config=_config(tid, ns, saved.parent_id) if saved.parent_id else None,
            pending_writes=[(task, ch, loads(v)) for task, ch, v, _ in writes],
        )

    # -- writing ---------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Record a checkpoint: its skeleton, metadata and the channels whose version changed."""
        conf = config["configurable"]
        thread_id, ns = _stored_id("thread_id", conf["thread_id"]), conf.get("checkpoint_ns", "")
        _stored_id("checkpoint_id", checkpoint["id"])
        # The id is the event's checkpoint_id, and a blob's version is most often the
        # skeleton's: neither is stored twice.
        skeleton = {k: v for k, v in checkpoint.items() if k not in _NOT_IN_SKELETON}
        values, dumps = checkpoint["channel_values"], self.serde.dumps_typed
        dumped = {
            ch: (str(version), dumps(values[ch]) if ch in values else _EMPTY)
            for ch, version in new_versions.items()
        }
        full_metadata = get_checkpoint_metadata(config, metadata)
        invocation = full_metadata.get("run_id")
        stored_metadata = self._stored_metadata(full_metadata)
        metadata_json = stored_metadata["json"] if isinstance(stored_metadata, dict) else None
        payload = {
            "namespace": ns,
            "checkpoint_id": checkpoint["id"],
            "parent_id": conf.get("checkpoint_id") or None,
            "metadata": stored_metadata,
            "invocation": None if invocation is None else str(invocation),
        }
        parent_key = (ns, payload["parent_id"] or "")
        # What needs no thread state is made before the lock, while another save may hold
        # it through a commit; the skeleton's patch on the parent the thread had then too,
        # made again below only if the parent changed meanwhile.
        seen = self._threads.get(thread_id)
        # A value the thread holds already (most often the write of the node that set the
        # channel) is stored as a reference to it: it is not encoded for nothing.
        encoded = [
            None if seen is not None and seen.reference(value) is not None else _encoded(value)
            for _, value in dumped.values()
        ]
        seen_parent = None if seen is None else seen.skeleton(*parent_key)
        ready = _skeleton_forms(skeleton, seen_parent, checkpoint["id"], metadata_json)

        def steps(thread: Thread) -> Steps:
            parent = thread.skeleton(*parent_key)
            plain, frozen = ready
            if parent is not seen_parent:
                plain, frozen = _skeleton_forms(skeleton, parent, checkpoint["id"], metadata_json)
            versions: dict[str, Any] = {} if plain is None else checkpoint["channel_versions"]
            blobs = {
                ch: [*_unless_known(version, versions.get(ch)), *_stored(thread, value, form)]
                for (ch, (version, value)), form in zip(dumped.items(), encoded, strict=True)
            }
            stored = plain or self._dump(skeleton)
            known = Known([value for _, value in dumped.values()], frozen)
            fields = {**payload, "checkpoint": stored, "blobs": blobs}
            saved = _Record(CheckpointSaved, fields, known)
            return [saved, _paused("idle")] if idle else [saved]

        durability = _durability(config)
        # At the graph's end (no node left to run) the thread reads idle until resumed (as
        # LangGraph's loop saves it: a checkpoint put by hand says nothing of what is next).
        idle = ns == "" and durability is not None and not _pending(checkpoint)

        parent_id = payload["parent_id"]
        # A save from LangGraph's loop after a step waits for the writes of the nodes that
        # ran in it (see `_in_order`).
        stepped = durability in _ORDERED and metadata.get("source") == "loop"
        ran = self._ran(thread_id, ns, parent_id, checkpoint) if stepped else frozenset()
        turn = self._in_order(durability, thread_id, ns, parent_id, writing=False, ran=ran)
        with turn, self._lock:
            self._append(thread_id, steps, create=True)
            self._saved_now(thread_id, ns, checkpoint["id"])  # in the same hold of the lock
        return _config(thread_id, ns, checkpoint["id"])

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Record a task's writes and, for a node of the graph, its outcome as a stage."""
        conf = config["configurable"]
        thread_id, ns = _stored_id("thread_id", conf["thread_id"]), conf.get("checkpoint_ns", "")
        checkpoint_id = _stored_id("checkpoint_id", conf["checkpoint_id"])
        indexed = [(WRITES_IDX_MAP.get(ch, i), ch, value) for i, (ch, value) in enumerate(writes)]
        interrupts = [value for ch, value in writes if ch == INTERRUPT]
        # The attempts LangGraph's RetryPolicy retried before this last one (taken once:
        # `steps` may be built again after a conflict).
        retried = RETRIES.take(task_id) if ns == "" and task_path.startswith(_PULL) else []

        # Serialised before the lock, while another save may hold it through a commit.
        dumps = self.serde.dumps_typed
        typed = [(index, ch, dumps(value)) for index, ch, value in indexed]
        encoded = [[index, ch, *_encoded(value)] for index, ch, value in typed]

        def steps(thread: Thread) -> Steps:
            fresh = [
                position
                for position, (index, _, _) in enumerate(typed)
                if index < 0 or not thread.has_write(ns, checkpoint_id, task_id, index)
            ]
            if not fresh:
                return []
            saved = {
                "checkpoint_id": checkpoint_id,
                "task_id": task_id,
                "task_path": task_path,
                "writes": [encoded[position] for position in fresh],
            }
            known = Known([typed[position][2] for position in fresh])
            outcome = self._outcome(thread, task_path, writes, saved, retried) if ns == "" else []
            if outcome:  # the node's outcome, last, carries the writes
                return [*outcome[:-1], _Knowing(outcome[-1], known)]
            asked = interrupts and ns == ""
            waiting = [_paused("waiting", _interrupt_value(interrupts))] if asked else []
            return [_Record(WritesSaved, {"namespace": ns, **saved}, known), *waiting]

        # Writes with output (or none at all), not only an error or interrupt, end the task.
        output = not writes or any(WRITES_IDX_MAP.get(ch, 0) >= 0 for ch, _ in writes)
        heard = task_path if output else None
        # An input `Command`'s writes: made on loading, against no checkpoint still to come.
        loaded = task_id == _NULL_TASK
        durability = _durability(config)
        with self._in_order(
            durability, thread_id, ns, checkpoint_id, writing=True, heard=heard, loaded=loaded
        ):
            self._append(thread_id, steps, create=True)

    def _outcome(
        self,
        thread: Thread,
        task_path: str,
        writes: Sequence[tuple[str, Any]],
        saved: dict[str, Any],
        retried: Sequence[Retried] = (),
    ) -> Steps:
        """The node's outcome carrying its writes (`saved`), the hub routing to it implicitly.

        Each attempt LangGraph's `RetryPolicy` `retried` comes first, as a supervised
        retry reads: its `StageFailed`, then the retry as a `RetryScheduled`. A thread
        whose table declares no hub (recorded before hubs were) records each route too.
        Empty when the task is not a node of the thread's table (or paused on an
        interrupt): its writes are then a `WritesSaved` of their own.
        """
        node = task_path[len(_PULL) :] if task_path.startswith(_PULL) else None
        channels = {ch for ch, _ in writes}
        if node is None or INTERRUPT in channels or thread.pipeline.next_state(HUB, node) is None:
            return []
        since = self._since(thread)
        route = _routes(thread, node)
        retries: Steps = []
        for attempt in retried:
            took = (attempt.at - since).total_seconds()
            retries += [*route, _failed_attempt(node, attempt, took), _retry(node, attempt)]
            since = attempt.at + timedelta(seconds=attempt.delay)
        duration = max(0.0, (utc_now() - since).total_seconds())
        carried = thread.node_carries(node, saved)
        errors = [value for ch, value in writes if ch == ERROR]

        def outcome(run: Run) -> Event:
            if not errors:
                return run.stage_completed(node, carried, duration=duration)
            error = errors[0] if isinstance(errors[0], BaseException) else repr(errors[0])
            return run.stage_failed(node, error, duration=duration, details=carried)

        return [*retries, *route, outcome]

    def _in_order(
        self,
        durability: str | None,
        thread_id: str,
        ns: str,
        checkpoint_id: str | None,
        *,
        writing: bool,
        ran: frozenset[str] = frozenset(),
        heard: str | None = None,
        loaded: bool = False,
    ) -> contextlib.AbstractContextManager[None]:
        """Record a save from LangGraph's loop in execution order (``durability`` sync or async).

        LangGraph hands a task's writes to a thread pool under both modes (``"sync"`` waits
        only for each checkpoint, ``"async"`` for neither; checkpoints are saved one after
        the other), so they can arrive before the checkpoint they were made against, or
        after the next one. Here a task's writes (`writing`) wait until their checkpoint
        is recorded (not an input `Command`'s, made against the checkpoint LangGraph
        `loaded`, or an empty one it never saves); a checkpoint after a step waits until
        the writes of the nodes that `ran` in it are in (every task that finishes sends
        writes, and LangGraph saves the next checkpoint only once all of the step's tasks
        finished), and the writes against its parent that are being recorded. A save
        waits only for what is missing, each at most `_ORDER_WAIT` seconds; one that finds
        it all in does not wait at all. Direct calls (no loop) and ``"exit"`` saves arrive
        in order: nothing is done for them. Once recorded, a save tells the others (the
        task path `heard` of writes with output, not only an error or interrupt).
        """
        if durability not in _ORDERED:
            return _IN_ORDER_ALREADY
        return _Turn(self, thread_id, ns, checkpoint_id, writing, ran, heard, loaded)

    def _wait_turn(self, turn: _Turn) -> None:
        """Count a task's writes as being recorded; wait until what the save follows is in.

        Most often all is in: the check holds at once, under the lock, and nothing waits
        (no condition, no partial). A save that must wait is counted in `_waiting`, so
        the others tell the condition only when someone waits on it.
        """
        thread_id, ns, checkpoint_id = turn.thread_id, turn.ns, turn.checkpoint_id
        if turn.writing:  # counted before waiting for the saver: a checkpoint after sees it
            key = (thread_id, checkpoint_id)
            with self._counting:
                self._writing[key] = self._writing.get(key, 0) + 1
            if turn.loaded:
                return
            with self._lock:
                if self._recorded(thread_id, ns, checkpoint_id):
                    return
            ready = functools.partial(self._recorded, thread_id, ns, checkpoint_id)
        else:
            _YIELD()  # let a pool thread that began a task's writes before this count them
            with self._lock:
                if self._followed(thread_id, ns, checkpoint_id, turn.ran):
                    return
            ready = functools.partial(self._followed, thread_id, ns, checkpoint_id, turn.ran)
        with self._lock:
            if ready():  # it may have come in between
                return
            self._waiting += 1
            try:
                self._changed.wait_for(ready, _ORDER_WAIT)
            finally:
                self._waiting -= 1

    def _end_turn(self, turn: _Turn) -> None:
        """A save is recorded (or failed): uncount its writes, note them heard, tell waiters."""
        thread_id, checkpoint_id = turn.thread_id, turn.checkpoint_id
        if turn.writing:
            key = (thread_id, checkpoint_id)
            with self._counting:
                left = self._writing[key] - 1
                if left:
                    self._writing[key] = left
                else:
                    del self._writing[key]
        with self._lock:
            if turn.heard is not None:
                self._heard_from(thread_id, turn.ns, checkpoint_id, turn.heard)
            if self._waiting:
                self._changed.notify_all()

    def _followed(
        self, thread_id: str, ns: str, checkpoint_id: str | None, ran: frozenset[str]
    ) -> bool:
        """Whether a checkpoint after `checkpoint_id` may be recorded: no task's writes
        against its parent are being recorded, and those of every node that `ran` are in."""
        with self._counting:
            if self._writing.get((thread_id, checkpoint_id)):
                return False
        return self._written(thread_id, ns, checkpoint_id, ran)

    def _heard_from(self, thread_id: str, ns: str, checkpoint_id: str | None, path: str) -> None:
        """Note that a task's output writes against the checkpoint came (under `_changed`)."""
        key = (thread_id, ns, checkpoint_id)
        heard = self._heard.get(key)
        if heard is None:
            heard = self._heard[key] = set()
            while len(self._heard) > _SAVED:
                self._heard.popitem(last=False)
        heard.add(path)

    def _written(
        self, thread_id: str, ns: str, checkpoint_id: str | None, nodes: frozenset[str]
    ) -> bool:
        """Whether every one of `nodes` has output writes (not only an error or interrupt:
        a task retried or resumed sends them again) recorded against the checkpoint."""
        if not nodes or checkpoint_id is None:
            return True
        heard = self._heard.get((thread_id, ns, checkpoint_id), ())
        missing = [node for node in nodes if _PULL + node not in heard]
        thread = self._threads.get(thread_id)
        if not missing or thread is None:
            return True
        stored = thread.writes.get((ns, checkpoint_id), {})
        done = {write[3] for (_, index), write in stored.items() if index >= 0}
        return all(_PULL + node in done for node in missing)

    def _ran(
        self, thread_id: str, ns: str, parent_id: str | None, checkpoint: Checkpoint
    ) -> frozenset[str]:
        """The nodes that ran in the step a checkpoint closes: those that saw new versions
        (not those whose versions LangGraph advanced for a snapshot it bumped)."""
        thread = self._threads.get(thread_id)
        parent = None if thread is None else thread.skeleton(ns, parent_id or "")
        if parent is None:
            return frozenset()
        before = parent.get("versions_seen", {})
        seen = checkpoint.get("versions_seen", {})
        bumped = seen.get(_BUMPS, {})
        ran = []
        for node, versions in seen.items():  # a loop, not generators: once per checkpoint
            had = before.get(node)
            if had == versions or node in _SEEN_ALSO:
                continue
            had = had or {}
            for channel, version in versions.items():
                if version != had.get(channel) and (
                    not bumped or bumped.get(f"{node}{_BUMP_MARK}{channel}") != version
                ):
                    ran.append(node)
                    break
        return frozenset(ran)

    def _recorded(self, thread_id: str, ns: str, checkpoint_id: str | None) -> bool:
        """Whether this saver has recorded or read the checkpoint lately (one a resumed
        invocation loaded: no save of it comes), or the thread as it last read it holds it."""
        if (thread_id, ns, checkpoint_id) in self._saved:
            return True
        thread = self._threads.get(thread_id)
        return thread is not None and checkpoint_id in thread.checkpoints.get(ns, {})

    def _saved_now(self, thread_id: str, ns: str, checkpoint_id: str) -> None:
        """Note a checkpoint this saver recorded or read (the latest `_SAVED` are kept)."""
        with self._lock:  # the condition's
            self._saved[(thread_id, ns, checkpoint_id)] = None
            self._saved.move_to_end((thread_id, ns, checkpoint_id))
            while len(self._saved) > _SAVED:
                self._saved.popitem(last=False)

    def _since(self, thread: Thread) -> datetime:
        """When the node's first attempt began, at the latest: the thread's newest event or
        the invocation's first read, whichever is later.

        LangGraph does not tell a saver when a task began; in a sequential graph this is
        when the node began, and for parallel nodes their super-step's start bounds it.
        """
        return max(thread.machine.last_timestamp, self._read_at.get(thread.thread_id, _EPOCH))

    def _append(self, thread_id: str, build: Build, *, create: bool) -> None:
        """Build events on the thread's state as this saver knows it; record them atomically.

        Optimistic, as event sourcing is: no read before the write. If another process
        appended first, the store refuses the versions; this saver then catches up with
        the thread and builds again. A thread this saver last wrote itself needs no look at
        the erasure generation either: the append requires the store to hold the very bytes
        of the thread's newest event, which a run erased since (or a new run under its id)
        does not, so the store refuses it and the generation is read then.
        """
        with self._lock:
            thread = self._threads.get(thread_id)
            if thread is None or thread.head is None or thread.deleted:
                generation = self._follow_generation()
                thread = self._threads.get(thread_id)
            else:
                generation = self._generation or 0
            for _ in range(_RETRIES):
                known_absent = thread is None and thread_id in self._free
                if (thread is None or thread.deleted) and not known_absent:
                    try:
                        thread = self._live(thread_id)
                    except Exception as error:
                        self._torn(generation, error)
                        generation, thread = self._follow_generation(), None
                        continue
                if thread is None and not create:
                    return
                if self._try_append(thread_id, thread, build):
                    return
                # Refused: the store moved on (another writer, or an erasure): catch up
                # with it and build again.
                generation, thread = self._follow_generation(), None
            raise ConcurrencyConflict(self._find_id(thread_id) or uuid.UUID(int=0), 0)

    def _try_append(self, thread_id: str, thread: Thread | None, build: Build) -> bool:
        """Record what `build` makes of the thread in one transaction; False on a conflict.

        A thread's first write starts its run in the same transaction (one commit, not two).
        """
        run = None
        if thread is None:
            thread, run = self._start(thread_id)
        steps = build(thread)
        if not steps:
            return True
        if run is None:
            run = self._writer(thread)
        recorded: list[tuple[Event, RunState, Known | None]] = []
        work = unit_of(run)
        try:
            # One event is a transaction of its own (what is pending, a deferred start too,
            # written with it): no batch around it.
            with run.batch() if len(steps) > 1 else _ONE_EVENT:
                for step in steps:
                    known = None
                    if type(step) is _Record:  # most events: recorded here, not by a closure
                        event, known = run.record(step.kind, **step.fields), step.known
                    elif type(step) is _Knowing:
                        event, known = step.step(run), step.known
                    else:
                        event = step(run)
                    recorded.append((event, work.state, known))
        except (ConcurrencyConflict, RunErased):  # another writer appended, or took the new
            # run's id; or the run was erased since it was read (another may have its id)
            self._forget(thread_id)
            return False
        for event, machine, known in recorded:
            thread.fold(event, machine, known)
        thread.link, thread.head = work.stored_link, work.stored_head
        self._last_run = run
        self._remember(thread)
        return True

    def _writer(self, thread: Thread) -> Run:
        """A run handle on the thread as this saver knows it: the one of the saver's last
        append when that was to this thread and nothing was folded into it since (a thread's
        saves most often follow one another), else a new one."""
        run = self._last_run
        if run is not None:
            work = unit_of(run)
            if (
                work.state is thread.machine
                and work.stored_link is thread.link
                and work.stored_head is thread.head
            ):
                return run
        return Run(
            self.engine.store, thread.pipeline, thread.machine, link=thread.link, head=thread.head
        )

    def _start(self, thread_id: str) -> tuple[Thread, Run]:
        """The thread's next run, its `RunStarted` written with the run's first batch."""
        params: dict[str, Any] = {"thread_id": thread_id}
        if self._shape:  # the given graph's picture, for the diagrams (not the rules)
            params[GRAPH_PARAM] = {"edges": self._shape}
        run_id, generation = self._next_run(thread_id)
        run = self.engine.start_run(
            self._graphs.get(thread_id) or self.pipeline,
            params=params,
            labels=_labels(thread_id, generation),
            run_id=run_id,
            deferred=True,
        )
        return Thread(thread_id, run.pipeline, run.machine), run

    def _forget(self, thread_id: str) -> None:
        """Drop what this saver knows of the thread: the store has moved on without it."""
        self._threads.pop(thread_id, None)
        self._free.pop(thread_id, None)

    def _remember(self, thread: Thread) -> None:
        """Keep the thread's fold for the next call; forget the least recently used beyond
        `_CACHED_THREADS` (the store has them all), so memory and GC stay flat."""
        self._threads[thread.thread_id] = thread
        self._threads.move_to_end(thread.thread_id)
        while len(self._threads) > _CACHED_THREADS:
            forgotten, _ = self._threads.popitem(last=False)
            self._read_at.pop(forgotten, None)

    def _next_run(self, thread_id: str) -> tuple[UUID, int]:
        """The id the thread's next run takes, and its generation."""
        free = self._free.pop(thread_id, None)
        if free is not None:
            return free  # as of the last look; taken meanwhile, the append is refused
        return self._probe(thread_id)[1:]

    def _live(self, thread_id: str) -> Thread | None:
        """The thread's run caught up with the store; None if it has none or it was deleted."""
        thread = self._threads.get(thread_id)
        if thread is not None:
            self._catch_up(thread)
            if not thread.deleted:
                self._threads.move_to_end(thread_id)
                return thread
            del self._threads[thread_id]
        thread = self._find(thread_id)
        if thread is not None:
            self._remember(thread)
        return thread

    def _catch_up(self, thread: Thread) -> None:
        """Fold the thread's events that other writers appended since this saver's last look."""
        store = self.engine.store
        newer = store.read(thread.run_id, gt=thread.version, limit=PAGE)  # most often none
        for event in newer if len(newer) < PAGE else store.stream(thread.run_id, gt=thread.version):
            thread.fold(event)

    def _find_id(self, thread_id: str) -> UUID | None:
        """The id of the thread's newest run, deleted or not; None if it never had one."""
        return self._probe(thread_id)[0]

    def _probe(self, thread_id: str) -> tuple[UUID | None, UUID, int]:
        """The thread's newest run id (None if none), the id its next run takes and that
        run's generation.

        A thread's runs follow one another, one per generation (a deletion starts the
        next); the first generation without a run of the thread ends the chain, unless
        runs were erased from the store: then the chain may begin with erased
        generations, and the thread's runs after them are looked up (`_past_gap`).
        """
        found, generation, looked = None, 0, False
        while True:
            owned, free = self._generation_run(thread_id, generation)
            if owned is not None:
                found, generation = owned, generation + 1
                continue
            later = None if looked else self._past_gap(thread_id, generation)
            if later is None:
                return found, free, generation
            generation, looked = later, True

    def _past_gap(self, thread_id: str, gap: int) -> int | None:
        """The newest generation after `gap` holding a run of the thread, if erasures left one.

        `Engine.compact` erases every deleted run, so the erased generations of a thread
        are the first ones, and its later runs (in the run index, by their thread label)
        follow them. In a store nothing was ever erased from, the chain has no gap: no
        lookup. Each run carries its generation (`GENERATION_LABEL`), checked against its
        id, so a fork that copied the labels is no generation; only runs of older releases,
        without it, are looked for generation by generation (`_scan_past_gap`).
        """
        erasures = self._generation
        if erasures is None:
            erasures = self.engine.store.generation()
        if not erasures:
            return None
        runs = self.engine.runs(label={THREAD_LABEL: thread_id}, limit=_ALL_THREADS)
        newest: int | None = None
        unlabelled: set[UUID] = set()
        for summary in runs:
            generation = _generation_of(summary, thread_id)
            if generation is not None and generation > gap:
                newest = generation if newest is None else max(newest, generation)
            elif GENERATION_LABEL not in summary.labels:
                unlabelled.add(summary.run_id)
        if newest is not None or not unlabelled:
            return newest  # runs of older releases are older than any labelled one
        return _scan_past_gap(thread_id, gap, unlabelled)

    def _generation_run(self, thread_id: str, generation: int) -> tuple[UUID | None, UUID]:
        """The thread's run of `generation` if it has one, and the id a new one would take.

        Ids the first releases computed are still found, but only when the run's own
        thread label names this thread: under them two threads could meet.
        """
        ids = [(generation_run_id(thread_id, generation), False)]
        if generation > 0:
            ids.append((legacy_run_id(thread_id, generation), True))
        free = None
        for run_id, shared in ids:
            if not self._holds(run_id):
                free = free or run_id
            elif not shared or self._labelled(run_id, thread_id):
                return run_id, run_id
        return None, free or ids[-1][0]

    def _holds(self, run_id: UUID) -> bool:
        """Whether the store holds the run (a deleted one being erased too: its id is taken)."""
        try:
            return self.engine.store.last(run_id) is not None
        except RunBeingErased:
            return True

    def _labelled(self, run_id: UUID, thread_id: str) -> bool:
        """Whether the run's `RunStarted` names `thread_id` as its thread."""
        first = self.engine.store.read(run_id, limit=1)
        labels = first[0].labels if first and isinstance(first[0], RunStarted) else {}
        return labels.get(THREAD_LABEL) == thread_id

    def _find(self, thread_id: str) -> Thread | None:
        """The thread's live run read from the store; None (its next run id noted) if none."""
        run_id, free, generation = self._probe(thread_id)
        thread = None if run_id is None else self._read_thread(thread_id, run_id)
        if thread is None:
            self._free[thread_id] = (free, generation)
        return thread

    def _read_thread(self, thread_id: str, run_id: UUID) -> Thread | None:
        """The thread's state from its run (None: the run is deleted, or being erased)."""
        events = self.engine.store.stream(run_id)
        try:
            first = next(events)
            assert isinstance(first, RunStarted)
            thread = Thread.started(thread_id, first)
            for event in events:
                thread.fold(event)
        except RunBeingErased:
            return None
        return None if thread.deleted else thread

    # -- deleting, copying, pruning --------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        """Record the thread's deletion (`RunFinished` with status ``deleted``).

        Readers treat it as gone at once; `Engine.compact()` (``stagetrail compact``)
        removes its events from the store.
        """

        def finish(thread: Thread) -> Steps:
            return [lambda run: run.finish("deleted", {"langgraph": "delete_thread"})]

        thread_id = _stored_id("thread_id", thread_id)
        with self._lock:
            self._follow_generation()
            if self._live(thread_id) is not None:
                self._append(thread_id, finish, create=False)
            self._threads.pop(thread_id, None)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Treat the checkpoints (and their writes) made by these LangGraph runs as gone."""
        doomed = {str(r) for r in run_ids}
        if not doomed:
            return
        with self._lock:
            self._follow_generation()
            for thread in self._threads_for(None):
                removed = [
                    [ns, saved.checkpoint_id]
                    for ns in thread.namespaces()
                    for saved in thread.events_of(ns)
                    if saved.invocation in doomed
                ]
                self._remove(thread.thread_id, removed, "delete_for_runs")

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: each namespace keeps its newest checkpoint; ``delete``: all go.

        Raises:
            ValueError: an unknown strategy.
        """
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        with self._lock:
            self._follow_generation()
            for thread_id in map(functools.partial(_stored_id, "thread_id"), thread_ids):
                if strategy == "delete":
                    self.delete_thread(thread_id)
                    continue
                thread = self._live(thread_id)
                if thread is None:
                    continue
                removed = [
                    [ns, saved.checkpoint_id]
                    for ns in thread.namespaces()
                    for saved in thread.events_of(ns)[1:]
                ]
                self._remove(thread_id, removed, "prune keep_latest")

    def _remove(self, thread_id: str, removed: Removed, reason: str) -> None:
        if removed:
            step = _recorded(CheckpointsRemoved, removed=removed, reason=reason)
            self._append(thread_id, lambda thread: [step], create=False)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy a thread as a fork: a new run whose events are copies of the source's.

        Raises:
            ValueError: the target thread has checkpoints already.
        """
        source_thread_id = _stored_id("thread_id", source_thread_id)
        target_thread_id = _stored_id("thread_id", target_thread_id)
        with self._lock:
            self._follow_generation()
            source = self._live(source_thread_id)
            if source is None:
                return
            if self._live(target_thread_id) is not None:
                raise ValueError(f"cannot copy into thread {target_thread_id!r}: it exists")
            run_id, generation = self._next_run(target_thread_id)
            self.engine.fork(
                source.run_id,
                at=source.version,
                new_run_id=run_id,
                params={"thread_id": target_thread_id},
                labels=_labels(target_thread_id, generation),
            )

    # -- async -----------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """`get_tuple`, off the event loop."""
        conf = config["configurable"]
        thread_id = _stored_id("thread_id", conf["thread_id"])
        self._learn_graph(thread_id, conf.get("checkpoint_ns", ""), sys._getframe(1))
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """`list`, off the event loop."""
        found = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """`put`, off the event loop."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """`put_writes`, off the event loop."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """`delete_thread`, off the event loop."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """`delete_for_runs`, off the event loop."""
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """`copy_thread`, off the event loop."""
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`prune`, off the event loop."""
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        """The next channel version: a counter (ints sort, and take a byte or two to store)."""
        if current is None:
            return 1  # type: ignore[return-value]
        return int(str(current).split(".")[0]) + 1  # type: ignore[return-value]

    # -- values ----------------------------------------------------------------------------

    def _stored_metadata(self, metadata: Any) -> Any:
        """Checkpoint metadata as stored: plain JSON as itself, else through the serde.

        Raises:
            InvalidPayload: metadata nested too deep for any serializer to write.
        """
        try:
            return {"json": metadata} if skeleton_json.is_plain(metadata) else self._dump(metadata)
        except RecursionError:
            raise InvalidPayload(
                "metadata", "metadata", "is nested too deep to be stored"
            ) from None

    def _dump(self, value: Any) -> Encoded:
        return _encoded(self.serde.dumps_typed(value))

    def _metadata(self, thread: Thread, saved: Saved) -> Any:
        if saved.metadata is not None:
            return self._load(saved.metadata)
        return thread.copies(saved.namespace, saved.checkpoint_id)[1]

    def _load(self, stored: Any) -> Any:
        return self.serde.loads_typed(serde_form(*stored))


@functools.lru_cache(maxsize=64)
def _pipeline_of(nodes: tuple[str, ...]) -> Pipeline:
    """The table of a thread of a graph with these nodes (built once per graph shape)."""
    return thread_pipeline(nodes)


def _shape_of(graph: Any) -> Shape:
    """A graph's edges as LangGraph draws them (`get_graph`), ``"if"`` marking conditional ones.

    A `StateGraph` is compiled for it; anything else without `get_graph` (node names) or a
    graph LangGraph cannot draw has none.
    """
    compiled = graph.compile() if hasattr(graph, "compile") else graph
    draw = getattr(compiled, "get_graph", None)
    if draw is None:
        return []
    try:
        edges = draw().edges
    except Exception:  # a graph LangGraph cannot draw still records; it has no picture
        return []
    return [
        [str(edge.source), str(edge.target), *(["if"] if edge.conditional else [])]
        for edge in edges
    ]


def _durability(config: RunnableConfig) -> str | None:
    """The durability mode of the LangGraph invocation saving; None for a direct call."""
    conf = config["configurable"]
    if _LOOP not in conf:
        return None
    return str(conf.get(_DURABILITY, "async"))


def _paused(status: str, reason: Any = None) -> Step:
    """A note pausing the thread's run (see `projections.STATUS_NOTE`)."""
    value = {"status": status} if reason is None else {"status": status, "reason": reason}
    return lambda run: run.note(STATUS_NOTE, value)


def _interrupt_value(values: list[Any]) -> Any:
    """What the ``interrupt()`` calls of a task asked, as JSON (one: its value itself)."""
    asked = [
        getattr(one, "value", one)
        for value in values
        for one in (value if isinstance(value, list | tuple) else [value])
    ]
    shown = asked[0] if len(asked) == 1 else asked
    return shown if skeleton_json.is_plain(shown) else str(shown)


def _pending(checkpoint: Checkpoint) -> bool:
    """Whether a node is left to run after `checkpoint` (else the graph is at its end).

    A node runs when a channel it triggers on holds a value newer than the one it last
    saw: its ``branch:to:<node>`` edge (the input's ``__start__``), or another channel
    its ``versions_seen`` names; a pending `Send` is a value in ``__pregel_tasks``.
    Channels read and cleared are left out of the checkpoint's values.
    """
    versions, seen = checkpoint["channel_versions"], checkpoint["versions_seen"]
    held = checkpoint["channel_values"]
    if held.get(TASKS):
        return True
    for channel in held:
        if channel.startswith(_BRANCH) or channel == START:
            return True
    for node, saw in seen.items():
        if node.startswith("__"):  # LangGraph's own bookkeeping, not a node
            continue
        if any(ch in held and str(versions.get(ch)) != str(v) for ch, v in saw.items()):
            return True
    return False


def _stored_id(field: str, value: Any) -> str:
    """A thread or checkpoint id as text the store can hold, else one clear error.

    Raises:
        InvalidArgument: the id holds a lone surrogate (no encoding can store it) or a NUL.
    """
    text = str(value)
    if text.isascii() and "\x00" not in text:  # the usual id: no surrogate, no NUL
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidArgument(
            field,
            f"{text!r} holds a lone surrogate at index {error.start}: "
            "an id must be valid Unicode text to be stored",
        ) from None
    if "\x00" in text:
        raise InvalidArgument(
            field,
            f"{text!r} holds a NUL character at index {text.index(chr(0))}, "
            "which no store can hold",
        )
    return text


def _routes(thread: Thread, node: str) -> Steps:
    """The route events a node's outcome needs: none when the thread's table declares the hub
    (the outcome takes the route implicitly), else the route (a thread recorded before)."""
    return [] if thread.pipeline.hub == HUB else [route_to(node)]


def route_to(node: str) -> Step:
    """The hub's route to `node`: a `StageCompleted` of ``__graph__`` named for the node.

    A decided outcome (attempt `DECIDED`): LangGraph's loop chose the node, nothing of
    the hub ran, so the route moves the machine but counts as no attempt anywhere.
    """
    return _recorded(StageCompleted, stage=HUB, attempt=DECIDED, outcome=node)


def _failed_attempt(node: str, attempt: Retried, took: float) -> Step:
    """A node's attempt that LangGraph's `RetryPolicy` retried, as its `StageFailed`."""
    return lambda run: run.stage_failed(
        node, attempt.error, error_type=attempt.error_type, duration=max(0.0, took)
    )


def _retry(node: str, attempt: Retried) -> Step:
    """LangGraph's decision to try the node again, as the supervisor records one."""

    def record(run: Run) -> Event:
        return run.record(
            RetryScheduled,
            stage=node,
            attempt=run.machine.next_attempt(node),
            delay=attempt.delay,
            reason=f"LangGraph RetryPolicy, after {attempt.error_type}",
            policy=_RETRY_POLICY,
        )

    return record


class _Turn:
    """A loop's save in execution order (see `StagetrailSaver._in_order`): entered, it waits
    for what the save follows; left, it tells the saves that follow it."""

    __slots__ = ("checkpoint_id", "heard", "loaded", "ns", "ran", "saver", "thread_id", "writing")

    def __init__(
        self,
        saver: StagetrailSaver,
        thread_id: str,
        ns: str,
        checkpoint_id: str | None,
        writing: bool,
        ran: frozenset[str],
        heard: str | None,
        loaded: bool,
    ) -> None:
        self.saver, self.thread_id, self.ns = saver, thread_id, ns
        self.checkpoint_id, self.writing, self.ran = checkpoint_id, writing, ran
        self.heard, self.loaded = heard, loaded

    def __enter__(self) -> None:
        """Wait for the saves this one follows (counted first when it is a task's writes)."""
        try:
            self.saver._wait_turn(self)
        except BaseException:
            self.saver._end_turn(self)
            raise

    def __exit__(self, *exc: object) -> None:
        """Tell the saves that follow this one."""
        self.saver._end_turn(self)


class _Knowing:
    """A step whose event's values the saver holds as the serde wrote them (see `Known`)."""

    __slots__ = ("known", "step")

    def __init__(self, step: Step, known: Known) -> None:
        self.step, self.known = step, known

    def __call__(self, run: Run) -> Event:
        """Record the event."""
        return self.step(run)


class _Record:
    """A step that records one event of `kind` with `fields` through `Run.record`, with what
    the saver holds of its values, if anything (see `Known`)."""

    __slots__ = ("fields", "kind", "known")

    def __init__(self, kind: type[Event], fields: dict[str, Any], known: Known | None = None):
        self.kind, self.fields, self.known = kind, fields, known

    def __call__(self, run: Run) -> Event:
        """Record the event."""
        return run.record(self.kind, **self.fields)


def _recorded(kind: type[Event], **payload: Any) -> Step:
    """A step that records one event of `kind` with `payload` through `Run.record`."""
    return _Record(kind, payload)


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def _encoded(value: Typed) -> Encoded:
    """A serialised value as JSON can hold it: plain msgpack as its JSON, else base64.

    msgpack that unpacks without extension types or non-str keys is plain JSON unless
    it holds bytes or a NaN, which JSON refuses: then it stays base64. The check walks
    the unpacked value's types (`skeleton.is_plain`), a fraction of a round trip through
    the JSON encoder for a reply's long text. Below `_JSON_FROM` bytes, base64 costs
    less than the check. The walk recurses, two frames a level: a value as deep as the
    serde takes, saved from a deep call, may run out of stack; it then stays base64,
    which holds it exactly too.
    """
    kind, data = value
    if kind == "msgpack" and len(data) >= _JSON_FROM:
        try:
            plain = ormsgpack.unpackb(data)
            if skeleton_json.is_plain(plain):
                return [AS_JSON, plain]
        except (ValueError, TypeError, RecursionError):
            pass
    return [kind, base64.b64encode(data).decode("ascii")]


def _stored(thread: Thread, value: Typed, encoded: Encoded | None) -> Encoded:
    """A channel value as stored: a reference to the identical write the run holds, or the
    value as `_encoded` gives it (`encoded`, when it was made already)."""
    where = thread.reference(value)
    if where is not None:
        return [REFERENCE, where]
    return _encoded(value) if encoded is None else encoded


def _skeleton_forms(
    skeleton: dict[str, Any], parent: dict[str, Any] | None, checkpoint_id: str, metadata: Any
) -> tuple[dict[str, Any] | None, bytes]:
    """The skeleton as stored on `parent` (None: by serde), and what the saver's fold of the
    checkpoint keeps: the whole skeleton (its id in it) and JSON `metadata` as `marshal`
    bytes (format 2 keeps no references: every object of a copy is a new one)."""
    plain = skeleton_json.encode(skeleton, parent)
    whole = None if plain is None else {**skeleton, "id": checkpoint_id}
    return plain, marshal.dumps((whole, metadata), 2)


def _unless_known(version: str, known: Any) -> list[str]:
    """A blob's version, or nothing when the stored skeleton says it already."""
    return [] if known is not None and str(known) == version else [version]


@attrs.frozen
class _Query:
    """What `StagetrailSaver.list` selects: a namespace, a checkpoint, those before one."""

    ns: str | None
    checkpoint_id: str | None
    before_id: str | None
    filter: dict[str, Any] | None
    limit: int | None

    def selects(self, saved: Saved, metadata: Callable[[], Any]) -> bool:
        """Whether `saved` is selected (its `metadata` read only when a filter needs it)."""
        if self.checkpoint_id and saved.checkpoint_id != self.checkpoint_id:
            return False
        if self.before_id and saved.checkpoint_id >= self.before_id:
            return False
        return not self.filter or _matches(metadata(), self.filter)


def _matches(metadata: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return all(metadata.get(key) == value for key, value in wanted.items())
