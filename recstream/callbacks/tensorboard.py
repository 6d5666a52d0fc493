"""TensorBoard: write training loss, learning rates and evaluation metrics as TensorBoard scalars.

Scalars (x axis: the global step ``cur_step_num``, so evaluation points line up with the loss):

- ``train/loss`` (and ``train/loss_scale`` when the step returns ``(loss, overflow, scale)``);
- ``train/lr`` (``train/lr/group<i>`` with several param groups);
- ``eval/<name>`` for each evaluation result of ``fit`` (``eval/eval_loss`` beside a metric
  named ``loss`` at ``eval/loss``: tags never collide), and for a standalone ``Model.eval``.

``update_freq="epoch"`` writes the training scalars at each epoch end; an int N writes them every
N global steps (the loss is read from the device only then). Uses
``torch.utils.tensorboard.SummaryWriter``, which needs the optional ``tensorboard`` package.
Files are flushed at each epoch end and closed at the end of training (or on ``__exit__``).

>>> import tempfile
>>> tb = TensorBoard(log_dir=tempfile.mkdtemp(), update_freq=100)
"""
from __future__ import annotations

import os

from ..validation import check_bool, check_choice, check_int, check_number, check_type
from ._monitoring import scalar_results
from .base import Callback
from .loss_monitor import loss_value


def _summary_writer_class():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:  # torch raises ImportError when the tensorboard package is absent
        raise ImportError("recstream.callbacks.TensorBoard needs the 'tensorboard' package: "
                          "pip install tensorboard  (or: pip install 'recstream[tensorboard]')") from e
    return SummaryWriter


class TensorBoard(Callback):
    """Log scalars for TensorBoard; see the module docstring. `flush_secs`: SummaryWriter's flush period."""

    called_in_fit_eval = False
    rank_zero_only = True

    def __init__(self, log_dir: str | os.PathLike = "runs", update_freq="epoch", write_lr: bool = True,
                 flush_secs: int = 120):
        owner = "TensorBoard"
        self.log_dir = os.fspath(check_type(owner, "log_dir", log_dir, (str, os.PathLike), allowed="a path"))
        if not self.log_dir:
            raise ValueError(f"{owner}: 'log_dir' must be a non-empty path, got {log_dir!r}")
        if isinstance(update_freq, str):  # "epoch", or a number of steps
            self.update_freq = check_choice(owner, "update_freq", update_freq, ("epoch",))
        else:
            self.update_freq = check_int(owner, "update_freq", update_freq, minimum=1)
        self.write_lr = check_bool(owner, "write_lr", write_lr)
        self.flush_secs = check_number(owner, "flush_secs", flush_secs, minimum=0, min_open=True)
        self._writer_cls = _summary_writer_class()  # fail at construction, not mid-training
        self._writer = None
        self._last_logged_step = 0
        self._global_step = 0

    @property
    def writer(self):
        """The SummaryWriter (created on first use), e.g. to add your own scalars or histograms."""
        if self._writer is None:
            self._writer = self._writer_cls(log_dir=self.log_dir, flush_secs=self.flush_secs)
        return self._writer

    def _write_train(self, p) -> None:
        step = p.cur_step_num or 0
        outputs = p.net_outputs
        loss = loss_value(outputs)  # the host sync happens only when logging
        if loss is not None:
            self.writer.add_scalar("train/loss", loss, step)
        if isinstance(outputs, (tuple, list)) and len(outputs) == 3:
            scale = loss_value(outputs[2])
            if scale is not None:
                self.writer.add_scalar("train/loss_scale", scale, step)
        optimizer = p.optimizer
        if self.write_lr and optimizer is not None and hasattr(optimizer, "param_groups"):
            groups = optimizer.param_groups
            for i, group in enumerate(groups):
                tag = "train/lr" if len(groups) == 1 else f"train/lr/group{i}"
                self.writer.add_scalar(tag, float(group["lr"]), step)

    def _write_results(self, results: dict, step: int) -> None:
        for name, value in scalar_results("TensorBoard", results):
            self.writer.add_scalar(f"eval/{name}", value, step)

    def on_train_begin(self, run_context):
        self._last_logged_step = run_context.original_args().cur_step_num or 0

    def on_train_step_end(self, run_context):
        if self.update_freq == "epoch":
            return
        p = run_context.original_args()
        self._global_step = p.cur_step_num
        if p.cur_step_num - self._last_logged_step >= self.update_freq:
            self._last_logged_step = p.cur_step_num
            self._write_train(p)

    def on_train_epoch_end(self, run_context):
        p = run_context.original_args()
        self._global_step = p.cur_step_num or 0
        if self.update_freq == "epoch":
            self._write_train(p)
        results = p.eval_results or p.metrics
        if results:
            self._write_results(results, self._global_step)
        self.writer.flush()

    def on_train_end(self, run_context):
        self.close()

    def on_eval_end(self, run_context):
        # Standalone Model.eval: place the point at the last training step seen (0 if none).
        metrics = run_context.original_args().metrics
        if metrics:
            self._write_results(metrics, self._global_step)
            self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file (a later write opens a new one)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.flush()
            writer.close()

    def __exit__(self, *exc_info):
        self.close()
        return None
