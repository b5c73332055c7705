"""What a LangGraph thread's run holds: a fold of its events into checkpoints, writes and blobs.

Pure: no LangGraph import and no I/O. The saver reads a thread's new events
from the store, folds them in here, and decodes values with LangGraph's serde
only when a caller asks for them.
"""

from __future__ import annotations

import marshal
from base64 import b64decode
from collections.abc import Sequence
from typing import Any, NamedTuple
from uuid import UUID

import ormsgpack

from engine.integrations.langgraph import skeleton
from engine.machine import RunState, apply, replay
from engine.pipeline import Pipeline
from events import (
    CheckpointSaved,
    CheckpointsRemoved,
    Event,
    RunFinished,
    RunStarted,
    StageCompleted,
    StageFailed,
    WritesSaved,
    task_writes,
)

Typed = tuple[str, bytes]
"""A value as LangGraph's serde wrote it: type tag and bytes (base64 or JSON in the events)."""
AS_JSON = "~msgpack"
"""The type tag of a msgpack value that is plain JSON, stored as that JSON (not as base64)."""
REFERENCE = "="
"""The type tag of a blob that is a reference to an identical value stored earlier in the run."""
Write = tuple[str, str, Typed, str]
"""One pending write: task id, channel, value, task path."""
NODE_TASK = "~__pregel_pull, "
"""The start of the task path LangGraph gives a node's task (the node's name follows)."""


class Saved(NamedTuple):
    """What a thread keeps of a `CheckpointSaved`: its ids, and its stored skeleton and
    metadata only where the serde wrote them (plain JSON ones are in `Thread.frozen`).

    Not the event itself: a cached thread's checkpoints stay a few objects for the
    garbage collector to walk, not a dozen dicts and lists each.
    """

    namespace: str
    checkpoint_id: str
    parent_id: str | None
    invocation: str | None
    checkpoint: tuple[str, str] | None
    """The skeleton as the serde wrote it (type, base64); None when it is plain JSON."""
    metadata: tuple[str, str] | None
    """The metadata as the serde wrote it (type, base64); None when it is plain JSON."""


class Known:
    """What the saver that records an event holds of it already: folding it decodes nothing.

    Args:
        values: the values of the event's blobs (a checkpoint's) or writes (a task's), as
            the serde wrote them, in the event's order.
        frozen: a checkpoint's JSON skeleton (its id in it, None when stored by serde) and
            JSON metadata (None likewise) as `marshal` bytes of format 2, which copies
            every object anew (see `Thread.copies`).
    """

    __slots__ = ("frozen", "values")

    def __init__(self, values: Sequence[Typed], frozen: bytes | None = None) -> None:
        self.values = values
        self.frozen = frozen


def serde_form(kind: str, data: Any) -> Typed:
    """A value as an event holds it, back as the serde wrote it: JSON packed again, base64 decoded.

    A plain msgpack value kept as JSON packs back to the bytes it came from (msgpack
    writes a plain value one way, the shortest), so the serde reads what it wrote.
    """
    if kind == AS_JSON:
        return ("msgpack", ormsgpack.packb(data))
    return (kind, b64decode(data))


class Thread:
    """One thread's run folded: the machine state and every live checkpoint, write and blob."""

    def __init__(self, thread_id: str, pipeline: Pipeline, machine: RunState) -> None:
        self.thread_id = thread_id
        self.run_id: UUID = machine.run_id
        self.pipeline = pipeline
        self.machine = machine
        self.checkpoints: dict[str, dict[str, Saved]] = {}
        """Namespace → checkpoint id → what is kept of its event, in the order they were saved."""
        self.writes: dict[tuple[str, str], dict[tuple[str, int], Write]] = {}
        """(namespace, checkpoint id) → (task id, index) → the write."""
        self.blobs: dict[tuple[str, str, str], Typed] = {}
        """(namespace, channel, version) → the channel's value at that version."""
        self.frozen: dict[tuple[str, str], bytes] = {}
        """(namespace, checkpoint id) → its JSON skeleton and metadata as `marshal` bytes:
        neither ever changes, and each reader's copy of both comes back in one C call.
        Kept when the checkpoint is removed: a later one may be stored as a patch on it."""
        self.newest_ids: dict[str, str] = {}
        """Namespace → the greatest checkpoint id folded in since it was last found (it may
        have been removed since: `latest` then looks for the newest again)."""
        self.newest: tuple[tuple[str, str], dict[str, Any] | None] | None = None
        """The newest checkpoint folded in and its skeleton rebuilt (None: serde's), which
        the next one is most often a patch on (older ones come back from `frozen`)."""
        self.known: dict[Typed, str] = {}
        """Each value stored so far → where it is (``version.index``), to refer to, not repeat."""
        self.values: dict[str, Typed] = {}
        """Where a value is stored → the value."""
        self.deleted = False
        self.link: bytes | None = None
        """The chain link of the newest event folded in, when this process wrote it (None:
        the next append reads it from the store)."""
        self.head: bytes | None = None
        """The stored bytes of that event, when this process wrote it (None: not known): the
        next append requires the store to hold them, so it never lands in another run
        that took the id after this one was erased."""

    @classmethod
    def started(cls, thread_id: str, first: RunStarted) -> Thread:
        """The thread's run as its `RunStarted` begins it (fold the later events in next)."""
        return cls(thread_id, *replay(first))

    @property
    def version(self) -> int:
        """The version of the newest event folded in."""
        return self.machine.version

    def fold(
        self, event: Event, machine: RunState | None = None, known: Known | None = None
    ) -> None:
        """Take in the next event of the run, checking it with the engine's rules.

        Args:
            event: the run's next event.
            machine: the machine state after `event`, when the caller has just checked
                it (the saver does, before appending): the rules are not run twice.
            known: what the saver that just recorded `event` holds of it (its values as
                the serde wrote them): taken as is, not decoded again from the event.
        """
        self.machine = apply(self.pipeline, self.machine, event) if machine is None else machine
        if machine is None:
            self.link = self.head = None  # another writer's event: its link is read when needed
        kind = type(event)
        if kind is CheckpointSaved:
            self._checkpoint(event, known)  # type: ignore[arg-type]
        elif kind is WritesSaved:
            self._writes(event.namespace, event.version, event.payload(), known)  # type: ignore[attr-defined]
        elif kind is StageCompleted or kind is StageFailed:
            self._outcome(event, known)  # type: ignore[arg-type]
        elif kind is CheckpointsRemoved:
            self._removed(event)  # type: ignore[arg-type]
        elif kind is RunFinished:
            self.deleted = True

    def _checkpoint(self, event: CheckpointSaved, known: Known | None = None) -> None:
        ns, key = event.namespace, (event.namespace, event.checkpoint_id)
        stored, metadata = event.checkpoint, event.metadata
        held = self.newest_ids.get(ns)
        if held is not None and event.checkpoint_id > held:
            self.newest_ids[ns] = event.checkpoint_id
        self.checkpoints.setdefault(ns, {})[event.checkpoint_id] = Saved(
            ns,
            event.checkpoint_id,
            event.parent_id,
            event.invocation,
            None if isinstance(stored, dict) else (stored[0], stored[1]),
            None if isinstance(metadata, dict) else (metadata[0], metadata[1]),
        )
        # The skeleton rebuilt from the event's own copy of what was stored (a private copy,
        # its validator's) on the parent's: it shares nothing the caller holds.
        parent = self.skeleton(ns, event.parent_id or "")
        plain = skeleton.decode(stored, parent) if isinstance(stored, dict) else None
        if plain is not None:
            plain.setdefault("id", event.checkpoint_id)  # stored once, as the event's
        if known is not None and known.frozen is not None:
            frozen = known.frozen
        else:
            plain_metadata = metadata["json"] if isinstance(metadata, dict) else None
            # Plain JSON holds only what marshal copies exactly: dict, list, str, numbers.
            frozen = marshal.dumps((plain, plain_metadata))
        self.newest = (key, plain)
        self.frozen[key] = frozen
        versions = {} if plain is None else plain["channel_versions"]
        values = None if known is None else known.values
        for position, (channel, blob) in enumerate(event.blobs.items()):
            *version, kind, data = blob  # no version: the skeleton's for the channel
            if values is not None:
                value = values[position]
            else:
                value = self.values[data] if kind == REFERENCE else serde_form(kind, data)
            at = version[0] if version else versions[channel]
            self.blobs[(ns, channel, str(at))] = value

    def skeleton(self, ns: str, checkpoint_id: str) -> dict[str, Any] | None:
        """The checkpoint's skeleton as stored in JSON, rebuilt (None: stored by serde, or an
        unknown checkpoint); the newest one's is the same object each time. Not to be changed."""
        key = (ns, checkpoint_id)
        newest = self.newest
        if newest is not None and newest[0] == key:
            return newest[1]
        frozen = self.frozen.get(key)
        return None if frozen is None else marshal.loads(frozen)[0]

    def copies(self, ns: str, checkpoint_id: str) -> tuple[Any, Any]:
        """Fresh copies of the checkpoint's JSON skeleton and metadata (None: stored by serde)."""
        copied: tuple[Any, Any] = marshal.loads(self.frozen[(ns, checkpoint_id)])
        return copied

    def _outcome(self, event: StageCompleted | StageFailed, known: Known | None = None) -> None:
        """Take in the writes a node's outcome carries, if it carries any."""
        carried = task_writes(event.result if isinstance(event, StageCompleted) else event.details)
        if carried is not None:
            self._writes("", event.version, self.node_writes(event.stage, carried), known)

    def node_writes(self, node: str, carried: dict[str, Any]) -> dict[str, Any]:
        """A node outcome's writes, the checkpoint and task path they leave out put back.

        Left out, the checkpoint is the root namespace's newest and the path the node's own.
        """
        newest = self.latest("")
        return {
            "checkpoint_id": carried.get("checkpoint_id") or (newest and newest.checkpoint_id),
            "task_id": carried["task_id"],
            "task_path": carried.get("task_path", NODE_TASK + node),
            "writes": carried["writes"],
        }

    def node_carries(self, node: str, saved: dict[str, Any]) -> dict[str, Any]:
        """What a node's outcome carries of `saved` writes: only what `node_writes` cannot infer."""
        newest = self.latest("")
        carried = {"task_id": saved["task_id"], "writes": saved["writes"]}
        if newest is None or newest.checkpoint_id != saved["checkpoint_id"]:
            carried["checkpoint_id"] = saved["checkpoint_id"]
        if saved["task_path"] != NODE_TASK + node:
            carried["task_path"] = saved["task_path"]
        return carried

    def _writes(
        self, ns: str, version: int, saved: dict[str, Any], known: Known | None = None
    ) -> None:
        """Take in one task's writes (a `WritesSaved`'s fields, or those its outcome carries)."""
        task_id, path = saved["task_id"], saved["task_path"]
        stored = self.writes.setdefault((ns, saved["checkpoint_id"]), {})
        values = None if known is None else known.values
        for position, (index, channel, kind, data) in enumerate(saved["writes"]):
            value = serde_form(kind, data) if values is None else values[position]
            stored[(task_id, index)] = (task_id, channel, value, path)
            self._keep(value, f"{version}.{position}")

    def _keep(self, value: Typed, where: str) -> None:
        """Remember a write's value, for a later channel value equal to it to refer to.

        Only values worth a reference: a few bytes cost less to repeat than to point at.
        Values are known by the serde's own bytes, so equal bytes are equal values.
        """
        if len(value[1]) <= len(where) + 8:
            return
        if value not in self.known:
            self.known[value] = where
            self.values[where] = value

    def reference(self, value: Typed) -> str | None:
        """Where a write with an identical value is stored already in this run, if anywhere."""
        return self.known.get(value)

    def _removed(self, event: CheckpointsRemoved) -> None:
        for ns, checkpoint_id in event.removed:
            self.checkpoints.get(ns, {}).pop(checkpoint_id, None)
            self.writes.pop((ns, checkpoint_id), None)

    def has_write(self, ns: str, checkpoint_id: str, task_id: str, index: int) -> bool:
        """Whether this task's write at `index` against the checkpoint is stored already."""
        return (task_id, index) in self.writes.get((ns, checkpoint_id), {})

    def latest(self, ns: str) -> Saved | None:
        """The newest live checkpoint of a namespace (LangGraph's ids sort by time)."""
        saved = self.checkpoints.get(ns)
        if not saved:
            return None
        newest = self.newest_ids.get(ns)
        if newest is None or newest not in saved:  # not found yet, or removed: look once
            newest = self.newest_ids[ns] = max(saved)
        return saved[newest]

    def channel_values(self, ns: str, versions: dict[str, Any]) -> dict[str, Typed]:
        """The stored value of each channel at its version (channels left empty are absent)."""
        found: dict[str, Typed] = {}
        for channel, version in versions.items():
            blob = self.blobs.get((ns, channel, str(version)))
            if blob is not None and blob[0] != "empty":
                found[channel] = blob
        return found

    def pending_writes(self, ns: str, checkpoint_id: str) -> list[Write]:
        """The checkpoint's writes in the order LangGraph applies them (path, task id, index)."""
        stored = self.writes.get((ns, checkpoint_id))
        if not stored:
            return []
        keys = sorted(stored, key=lambda k: (stored[k][3], k[0], k[1]))
        return [stored[k] for k in keys]

    def events_of(self, ns: str) -> list[Saved]:
        """The live checkpoints of a namespace, newest first."""
        saved = self.checkpoints.get(ns, {})
        return [saved[k] for k in sorted(saved, reverse=True)]

    def namespaces(self) -> list[str]:
        """The namespaces with at least one live checkpoint."""
        return [ns for ns, saved in self.checkpoints.items() if saved]
