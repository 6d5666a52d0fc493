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
from collections.abc import Callable
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


class PrequentialMonitor(Callback):
    """Rolling test-then-train AUC and log loss (see module docstring).

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
        self._params = None  # the run's params while scoring through batch_observers
        self.last: dict | None = None

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
        if self._buf.count and self._steps % self.log_every:
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
