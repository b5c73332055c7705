"""Differential check: `decode_many` reads every state as `decode` of it alone does."""

from __future__ import annotations

import random
import uuid
from typing import Any

import attrs

from events.base import EVENT_TYPES
from events.codec import decode, decode_many
from events.values import fields_of

_RUN = uuid.uuid4()
_POOL: list[Any] = [
    None, "x", "", 1, 0, 2.0, True, [], {}, [str(_RUN), 1], [str(_RUN)], str(_RUN),
    "2024-01-01T00:00:00+00:00", "2024-01-01", 5, {"a": 1}, float("inf"),
]  # fmt: skip


def _outcome(call: Any) -> Any:
    try:
        event = call()
    except Exception as error:
        return ("raised", type(error).__name__, str(error))
    return (type(event), [(k, type(v), repr(v)) for k, v in fields_of(event).items()])


class TestDecodeManyDifferential:
    def test_random_states_read_as_alone(self) -> None:
        """Random states of every registered class decode (or fail) in a page as alone."""
        rng = random.Random(7)
        mismatches = []
        for topic, cls in sorted(EVENT_TYPES.items()):
            names = sorted({f.name for f in attrs.fields(cls)} - {"run_id", "version"})
            for _ in range(400):
                state: dict[str, Any] = {n: rng.choice(_POOL) for n in names}
                state["timestamp"] = rng.choice(["2024-01-01T00:00:00+00:00", "bad", 3])
                version = rng.choice([None, cls.class_version, 1, 2, 3, 2.0, True, "2"])
                if version is not None:
                    state["class_version"] = version
                for key in rng.sample([*state, "run_id", "version", "extra"], rng.randint(0, 2)):
                    if key in state and rng.random() < 0.7:
                        del state[key]
                    else:
                        state[key] = rng.choice(_POOL)
                alone = _outcome(lambda s=dict(state), t=topic: decode(t, s, _RUN, 3))
                paged = _outcome(lambda s=dict(state), t=topic: decode_many([(t, s, 3)], _RUN)[0])
                if alone != paged:
                    mismatches.append((topic, state, alone, paged))
        assert not mismatches, mismatches[:3]
