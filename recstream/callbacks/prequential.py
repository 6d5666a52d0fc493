"""PrequentialMonitor: "test, then train" quality of an online model, over a rolling window.

Each training batch -- every batch, also each one inside a sink, seen through
``cb_params.batch_observers`` just before it trains -- is first scored by the network in eval mode
under ``torch.no_grad()``; the scores and labels go into a ring buffer of the last ``window``
events, and into whole-stream metrics. Every ``log_every`` batches (and at the end of training)
the metrics are reported in ``cb_params.prequential`` (``{"auc", "logloss", "window_events",
"events", "auc_total", "logloss_total", "step"}``), as one line on stderr (``verbose``), in the
log (``logging``, INFO) and to TensorBoard (``prequential/auc``, ``prequential/logloss``,
``prequential/auc_total``) when a ``SummaryWriter`` or a log directory is given. Each event is
scored by a model that has not trained on it yet, so this is an honest online estimate with no
held-out set. Driven by hand without ``batch_observers``, it scores
``cb_params.train_dataset_element`` at ``on_train_step_begin``.

Conventions: ``network(*inputs)`` returns LOGITS (as every ``recstream.models`` model), turned
into probabilities with a sigmoid; pass ``output="probabilities"`` if the network already
returns them. The labels are found as everywhere in recstream
(`recstream.data.protocol.split_batch`): the ``"label"`` key of a dict batch, else the
last column of ``(inputs..., labels)`` (e.g. ``recstream.data.Batch``); pass
``unpack=fn(batch) -> (args, kwargs, labels)`` for anything else.
Labels must be 0/1 for the AUC (it is None while the window holds one class only).

Restarts: `state_dict` / `load_state_dict` (a `PrequentialState`) carry the counters, the window
and the whole-stream metrics. `ModelCheckpoint` saves them with every checkpoint (its tensors:
the streaming AUC's non-zero histogram bins, 16 bytes per bin in use) and `RecModel.restore` + `online_train`
load them, so after a resume ``events``, ``auc_total`` and ``logloss_total`` go on from the
checkpoint: they describe exactly the events up to the checkpoint's stream position, and the
events after it, trained again, are counted once.

Metrics: the window's AUC is the exact sort-based one (`recstream.metrics.exact_auc`,
O(window log window) per report, not per batch: the streaming [`AUC`][recstream.metrics.auc.AUC]
cannot forget old events); the whole stream's AUC is that streaming one (binned, within its
``error_bound()``), both log losses `recstream.metrics.LogLoss`. Cost per batch: one extra
eval-mode forward and one device-to-host copy of the scores.

>>> import torch
>>> from recstream.callbacks.base import CallbackParams, RunContext
>>> net = torch.nn.Linear(1, 1)
>>> p = CallbackParams(network=net, cur_step_num=1,
...                    train_dataset_element=(torch.tensor([[1.0], [-1.0]]), torch.tensor([1.0, 0.0])))
>>> mon = PrequentialMonitor(window=100, log_every=1, verbose=False)
>>> mon.on_train_step_begin(RunContext(p))
>>> sorted(p.prequential), p.prequential["window_events"]
(['auc', 'auc_total', 'events', 'logloss', 'logloss_total', 'step', 'window_events'], 2)
"""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from ..data.protocol import split_batch
from ..metrics import AUC, LogLoss, exact_auc
from ..validation import check_bool, check_callable, check_choice, check_int, check_number, describe
from .base import Callback
from .console import say

log = logging.getLogger(__name__)
OUTPUTS = ("logits", "probabilities")


def _split_batch(batch: Any) -> tuple[tuple, dict, Any]:
    """`split_batch`, with an error that says which callback failed and how to fix it."""
    try:
        return split_batch(batch)
    except ValueError as e:
        raise ValueError(f"PrequentialMonitor: cannot find the labels of a training batch "
                         f"({type(batch).__name__}): {e}; pass unpack=fn(batch) -> (args, kwargs, labels)") from e


class _Window:
    """Ring buffer of the last `size` (score, label) pairs."""

    def __init__(self, size: int):
        self.scores = np.zeros(size, dtype=np.float64)
        self.labels = np.zeros(size, dtype=np.float64)
        self.pos, self.count, self.total = 0, 0, 0

    def add(self, scores: np.ndarray, labels: np.ndarray) -> None:
        n, size = len(scores), len(self.scores)
        self.total += n
        if n >= size:  # the batch alone fills the window: keep its last `size` events
            scores, labels, n = scores[-size:], labels[-size:], size
        end = self.pos + n
        first = min(end, size) - self.pos
        self.scores[self.pos:self.pos + first], self.labels[self.pos:self.pos + first] = scores[:first], labels[:first]
        self.scores[:n - first], self.labels[:n - first] = scores[first:], labels[first:]
        self.pos, self.count = end % size, min(self.count + n, size)

    def view(self) -> tuple[np.ndarray, np.ndarray]:
        return self.scores[:self.count], self.labels[:self.count]  # order does not matter to the metrics

    def chronological(self) -> tuple[np.ndarray, np.ndarray]:
        """The events held, oldest first."""
        if self.count < len(self.scores):  # not wrapped yet: pos == count
            return self.view()
        order = np.r_[self.pos:len(self.scores), 0:self.pos]
        return self.scores[order], self.labels[order]

    def load(self, scores: np.ndarray, labels: np.ndarray, pos: int, size: int, total: int) -> None:
        """The ring saved by a window of `size` events: as it was when the sizes agree (the same
        layout, so the window's figures are the same to the last bit), else its newest events
        that fit, oldest first."""
        self.pos = self.count = 0
        if size == len(self.scores):
            n = len(scores)
            self.scores[:n], self.labels[:n] = scores, labels
            self.pos, self.count = pos % size, n
        elif len(scores):
            order = np.r_[pos:len(scores), 0:pos] if len(scores) == size else slice(None)
            self.add(scores[order], labels[order])
        self.total = total


@dataclass(frozen=True)
class PrequentialState:
    """What a `PrequentialMonitor` has counted (its `state_dict`): everything a restarted monitor
    needs to go on as if it never stopped.

    Attributes:
        batches: batches scored (the reports fall every ``log_every`` of them).
        events: events scored (``events`` of the reports).
        window_size: the ``window`` of the monitor that saved this.
        window_scores, window_labels: float64 tensors, the ring buffer's filled part (at most
            `window_size` events, in the ring's order).
        window_pos: where the ring writes next.
        auc: the whole-stream streaming AUC's state (`recstream.metrics.AUC.state_dict`).
        logloss: the whole-stream log loss's state (`recstream.metrics.LogLoss.state_dict`).
    """

    batches: int
    events: int
    window_size: int
    window_scores: torch.Tensor
    window_labels: torch.Tensor
    window_pos: int
    auc: dict
    logloss: dict

    @classmethod
    def from_dict(cls, state: Mapping) -> PrequentialState:
        """The state from its plain form (as a checkpoint holds it); `ValueError` naming what is wrong."""
        owner = "PrequentialMonitor.load_state_dict"
        names = [f.name for f in fields(cls)]
        if not isinstance(state, Mapping) or set(state) != set(names):
            got = sorted(state) if isinstance(state, Mapping) else describe(state)
            raise ValueError(f"{owner}: 'state' must be a PrequentialState or a dict with the keys {names}, got {got}")
        for name in ("batches", "events", "window_size", "window_pos"):
            check_int(owner, f"state[{name!r}]", state[name], minimum=1 if name == "window_size" else 0)
        scores, labels = state["window_scores"], state["window_labels"]
        if not (isinstance(scores, torch.Tensor) and isinstance(labels, torch.Tensor) and scores.dim() == 1
                and scores.shape == labels.shape and len(scores) <= state["window_size"]):
            raise ValueError(f"{owner}: 'window_scores' and 'window_labels' must be 1-d tensors of one length, "
                             f"at most window_size ({state['window_size']}); got {describe(scores)} and "
                             f"{describe(labels)}")
        if len(scores) > state["events"] or state["window_pos"] >= state["window_size"]:
            raise ValueError(f"{owner}: the window holds {len(scores)} events at position {state['window_pos']} of "
                             f"{state['window_size']}, after {state['events']} events in all: not a state it can hold")
        for name in ("auc", "logloss"):
            if not isinstance(state[name], Mapping):
                raise ValueError(f"{owner}: state[{name!r}] must be a metric's state_dict, got {describe(state[name])}")
        return cls(**{name: state[name] for name in names})


class PrequentialMonitor(Callback):
    """Rolling test-then-train AUC and log loss (see module docstring).

    ``checkpoint_key`` (``"prequential"``): the entry of its state in a checkpoint (see
    `recstream.callbacks.checkpointed`).

    Args:
        window: number of most recent events the metrics cover.
        log_every: report every this many steps (metrics are computed only then).
        tensorboard: None, a ``SummaryWriter``-like object (``add_scalar``), or a log directory.
        output: what the network returns, ``"logits"`` or ``"probabilities"``.
        unpack: ``fn(batch) -> (args, kwargs, labels)``; default
            `recstream.data.protocol.split_batch`.
        eps: log-loss clipping of probabilities, 0 < eps < 0.5.
        verbose: print each report as one line on stderr (logging needs no configuration).
    """

    checkpoint_key = "prequential"

    def __init__(self, window: int = 10_000, log_every: int = 100, tensorboard: Any = None, *,
                 output: str = "logits", unpack: Callable | None = None, eps: float = 1e-7, verbose: bool = True):
        owner = "PrequentialMonitor"
        self.window = check_int(owner, "window", window, minimum=1)
        self.log_every = check_int(owner, "log_every", log_every, minimum=1)
        self.output = check_choice(owner, "output", output, OUTPUTS)
        self.unpack = check_callable(owner, "unpack", unpack, allow_none=True) or _split_batch
        if not (tensorboard is None or isinstance(tensorboard, (str, os.PathLike))
                or callable(getattr(tensorboard, "add_scalar", None))):
            raise TypeError(f"{owner}: 'tensorboard' must be None, a log directory or a SummaryWriter (with "
                            f"add_scalar), got {describe(tensorboard)}")
        self.eps = check_number(owner, "eps", eps, minimum=0, maximum=0.5, min_open=True, max_open=True)
        self._tb = tensorboard
        self._own_writer = None
        self.verbose = check_bool(owner, "verbose", verbose)
        self._buf = _Window(window)
        self._total_auc, self._total_logloss = AUC(), LogLoss(eps=self.eps)
        self._steps = 0  # batches scored
        self._reported = 0  # self._steps at the last report (restored: the saved state's)
        self._params = None  # the run's params while scoring through batch_observers
        self.last: dict | None = None

    def state_dict(self) -> PrequentialState:
        """The counters, the window and the whole-stream metrics (copies: training goes on).

        >>> from recstream.callbacks.base import CallbackParams, RunContext
        >>> batch = (torch.tensor([[1.0], [-1.0]]), torch.tensor([1.0, 0.0]))
        >>> p = CallbackParams(network=torch.nn.Linear(1, 1), train_dataset_element=batch)
        >>> mon = PrequentialMonitor(window=4, verbose=False)
        >>> mon.on_train_step_begin(RunContext(p))  # scores one batch of 2 events
        >>> again = PrequentialMonitor(window=4, verbose=False)  # e.g. after a restart
        >>> again.load_state_dict(mon.state_dict())
        >>> again.compute() == mon.compute()
        True
        >>> again.compute()["events"]
        2
        """
        buf = self._buf
        return PrequentialState(
            batches=self._steps, events=buf.total, window_size=len(buf.scores),
            window_scores=torch.from_numpy(buf.scores[:buf.count].copy()),
            window_labels=torch.from_numpy(buf.labels[:buf.count].copy()), window_pos=buf.pos,
            auc=self._total_auc.state_dict(), logloss=self._total_logloss.state_dict())

    def load_state_dict(self, state: PrequentialState | Mapping) -> None:
        """Go on from `state` (a `PrequentialState`, or its plain form from a checkpoint). A window of
        another size keeps the newest events that fit. Everything is checked before anything changes."""
        if not isinstance(state, PrequentialState):
            state = PrequentialState.from_dict(state)
        auc, logloss = AUC(), LogLoss(eps=self.eps)
        try:
            auc.load_state_dict(state.auc)
            logloss.load_state_dict(state.logloss)
        except (TypeError, ValueError) as e:
            raise ValueError(f"PrequentialMonitor.load_state_dict: the whole-stream metrics do not load: {e}") from e
        scores = state.window_scores.detach().cpu().double().numpy()
        labels = state.window_labels.detach().cpu().double().numpy()
        self._buf.load(scores, labels, state.window_pos, state.window_size, state.events)
        self._total_auc, self._total_logloss = auc, logloss
        self._steps = self._reported = state.batches  # a resume with nothing new reports nothing

    @property
    def writer(self):
        """The SummaryWriter in use (created on first use from a directory), or None."""
        if isinstance(self._tb, (str, os.PathLike)):
            if self._own_writer is None:
                from torch.utils.tensorboard import SummaryWriter
                self._own_writer = SummaryWriter(log_dir=os.fspath(self._tb))
            return self._own_writer
        return self._tb

    @torch.no_grad()
    def _score(self, network: torch.nn.Module, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        args, kwargs, labels = self.unpack(batch)
        was_training = network.training
        network.eval()  # dropout off, batch-norm statistics frozen, HashEmbedding read-only
        try:
            out = network(*args, **kwargs)
        finally:
            network.train(was_training)
        out = out.detach().reshape(-1).float()
        probs = torch.sigmoid(out) if self.output == "logits" else out
        labels = torch.as_tensor(labels).detach().reshape(-1).float()
        if labels.numel() != probs.numel():
            raise ValueError(f"PrequentialMonitor: {probs.numel()} scores for {labels.numel()} labels")
        return probs.cpu().double().numpy(), labels.cpu().double().numpy()

    def on_train_begin(self, run_context):
        p = run_context.original_args()
        if isinstance(p.batch_observers, list):  # the training loop shows us every batch
            p.batch_observers.append(self._observe)
            self._params = p

    def on_train_step_begin(self, run_context):
        p = run_context.original_args()
        if self._params is None and p.train_dataset_element is not None:
            self._observe(p.train_dataset_element, p)

    def _observe(self, batch, p=None) -> None:
        p = p if p is not None else self._params
        if p.network is None:
            return
        scores, labels = self._score(p.network, batch)
        self._buf.add(scores, labels)
        self._total_logloss.update(scores, labels)
        if np.all((labels == 0) | (labels == 1)):
            self._total_auc.update(scores, labels)
        self._steps += 1
        if self._steps % self.log_every == 0:
            self._report(p)

    def on_train_end(self, run_context):
        p = run_context.original_args()
        if self._buf.count and self._steps != self._reported:  # batches scored since the last report
            self._report(p)
        if self._params is not None and self._observe in (p.batch_observers or []):
            p.batch_observers.remove(self._observe)
        self._params = None
        self._close()

    def __exit__(self, *exc_info):
        self._close()  # also when training raised
        return None

    def _close(self) -> None:
        if self._own_writer is not None:
            self._own_writer.close()
            self._own_writer = None

    def compute(self) -> dict:
        """Metrics over the current window (``auc`` None with one class only, both None when empty)."""
        scores, labels = self._buf.view()
        auc = logloss = None
        if len(scores):
            binary = bool(np.all((labels == 0) | (labels == 1)))
            if binary and 0 < labels.sum() < len(labels):
                auc = exact_auc(scores, labels)
            metric = LogLoss(eps=self.eps)
            metric.update(scores, labels)
            logloss = float(metric.eval())
        return {"auc": auc, "logloss": logloss, "window_events": int(len(scores)), "events": self._buf.total,
                **self._totals()}

    def _totals(self) -> dict:
        """Whole-stream AUC (None until both classes were seen) and log loss (None before any event)."""
        try:
            auc = float(self._total_auc.eval())
        except (RuntimeError, ValueError):  # nothing yet, or one class only
            auc = None
        logloss = float(self._total_logloss.eval()) if self._buf.total else None
        return {"auc_total": auc, "logloss_total": logloss}

    def _report(self, p) -> None:
        step = p.cur_step_num or self._steps
        self._reported = self._steps
        result = dict(self.compute(), step=step)
        self.last = p.prequential = result
        fmt = lambda v: "n/a" if v is None else f"{v:.4f}"  # noqa: E731
        line = (f"prequential step {step}: auc {fmt(result['auc'])} logloss {fmt(result['logloss'])} over the "
                f"last {result['window_events']} events; all {result['events']} events: auc "
                f"{fmt(result['auc_total'])} logloss {fmt(result['logloss_total'])}")
        log.info(line)
        if self.verbose:
            say(line, file=sys.stderr)
        writer = self.writer
        if writer is not None:
            for name in ("auc", "logloss", "auc_total"):
                if result[name] is not None:
                    writer.add_scalar(f"prequential/{name}", result[name], step)
