"""Callback states that travel in checkpoints, so that a callback's figures go on after a restart.

A callback whose counts must survive a restart (`PrequentialMonitor`'s whole-stream totals) names
its entry in ``checkpoint_key`` (a class attribute; None, the default, for all others) and has
``state_dict()`` (a dict or a dataclass of JSON values and tensors) and ``load_state_dict(state)``.
`ModelCheckpoint` stores `callback_states` of the run's callbacks in each checkpoint, under the
``callbacks`` entry of its metadata (tensors among the file's tensors, never pickled);
`RecModel.restore` keeps them and `RecModel.online_train` hands them back with
`load_callback_states`. Two callbacks of one key are told apart by their order (``key``,
``key#2``, ...).

Why the checkpoint, and at its steps only: a state saved at a step end describes exactly the
batches the checkpoint's weights and stream position hold, so events trained again after a crash
are counted once. An exception checkpoint (``exception_save``) may follow a batch that was
observed but never trained, and sharded checkpoints carry JSON extras only: neither holds callback
states, and a resume from one starts those figures again (with a log line saying so).

>>> class Count(Callback):
...     checkpoint_key = "count"
...     def __init__(self): self.n = 0
...     def state_dict(self): return {"n": self.n}
...     def load_state_dict(self, state): self.n = state["n"]
>>> a = Count(); a.n = 7
>>> states = callback_states([a, Callback()])
>>> states
{'count': {'n': 7}}
>>> b = Count()
>>> load_callback_states([b], states, "ckpt-1_10.safetensors", step=10)
>>> b.n
7
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping

from .base import Callback

__all__ = ["CHECKPOINT_ENTRY", "callback_states", "load_callback_states", "saved_state"]

log = logging.getLogger("recstream.callbacks")
CHECKPOINT_ENTRY = "callbacks"  # the checkpoint metadata entry: {checkpoint_key: state}


def _keyed(callbacks: Iterable) -> list[tuple[str, Callback]]:
    """(entry, callback) of the callbacks that keep a state, in order; repeated keys numbered."""
    out, seen = [], {}
    for cb in callbacks:
        key = getattr(cb, "checkpoint_key", None)
        if not isinstance(key, str) or not key:
            continue
        seen[key] = seen.get(key, 0) + 1
        out.append((key if seen[key] == 1 else f"{key}#{seen[key]}", cb))
    return out


def _plain(state):
    """A dataclass state as the dict of its fields (a checkpoint stores plain values)."""
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
    return state


def callback_states(callbacks: Iterable) -> dict:
    """``{entry: state}`` of the callbacks with a ``checkpoint_key`` (empty when none has one)."""
    return {key: _plain(cb.state_dict()) for key, cb in _keyed(callbacks)}


def saved_state(meta: Mapping | None, key: str):
    """The state a checkpoint's metadata holds under `key`, or None."""
    states = (meta or {}).get(CHECKPOINT_ENTRY)
    return states.get(key) if isinstance(states, Mapping) else None


def load_callback_states(callbacks: Iterable, states: Mapping | None, path: str, step: int) -> None:
    """Give each callback with a ``checkpoint_key`` its state from checkpoint `path` (at `step`); one
    that finds none there (an older checkpoint, an exception or a sharded one) starts afresh, with
    a log line saying so. A state that does not fit its callback is a `ValueError` naming both."""
    states = states if isinstance(states, Mapping) else {}
    for key, cb in _keyed(callbacks):
        name = type(cb).__name__
        if key not in states:
            log.warning("%s holds no %s state (an older or an exception checkpoint): %s's whole-stream figures "
                        "start again at step %d", path, name, name, step)
            continue
        try:
            cb.load_state_dict(states[key])
        except (TypeError, ValueError) as e:
            raise ValueError(f"the {key!r} state of checkpoint {path} does not fit the run's {name}: {e}") from e
        log.info("%s continues from the state of %s (step %d)", name, path, step)
