"""The training and evaluation loops: the only place where epochs and steps are iterated.

`train_loop` runs both execution modes with the same code: a `DatasetHelper` yields one *step*
per iteration, which is one batch in normal mode and one `Sink` (many batches, run by
`SinkNetwork`) in sink mode; `cur_step_num` advances by the number of batches the step trained.
Hook order, counters and stop checks follow MindSpore's `Model._train_process`.

Hot-path rules: no host sync per step (the loss stays a device tensor in ``net_outputs``; callbacks
read it when they need to), network mode switched once per phase, not per step.
"""
from __future__ import annotations

from typing import Iterable

import torch

from ..callbacks.base import CallbackList, CallbackParams, RunContext
from ..data.channel import reset
from ..data.transfer import to_device
from .data_adapter import dataset_size, unpack
from .sink import DatasetHelper, Sink


class FitEval:
    """What `fit` evaluates between epochs: dataset, frequency, sink flag and the eval callbacks."""

    def __init__(self, dataset, frequency, sink_mode: bool, callbacks: CallbackList):
        self.dataset, self.frequency, self.sink_mode, self.callbacks = dataset, frequency, sink_mode, callbacks

    def due(self, epoch: int) -> bool:
        return epoch % self.frequency == 0 if isinstance(self.frequency, int) else epoch in self.frequency


def check_first_batch(batch, needs_label: bool, name: str = "train_dataset") -> None:
    """Arity check on the first batch, so a wrong dataset fails here with a clear message."""
    if not needs_label:
        return
    args, kwargs = unpack(batch)
    if len(args) < 2 and "label" not in kwargs:
        got = f"a dict with keys {sorted(kwargs)}" if kwargs else f"{len(args)} element(s) ({type(batch).__name__})"
        raise ValueError(f"When 'loss_fn' is set, each batch of '{name}' must be (data, label) "
                         f"or a dict with a 'label' key; got {got}")


def train_loop(model, epochs: Iterable[int], helper: DatasetHelper, callbacks: CallbackList,
               params: CallbackParams, fit_eval: FitEval | None = None, first_step: int = 0) -> None:
    """Train over `epochs` (1-based numbers, possibly endless); see the module docstring.

    `first_step` is where `cur_step_num` starts (0, except for an online run resumed from a checkpoint).
    """
    ctx = RunContext(params)
    step_net = model._step_network(helper)
    device = helper.device
    move = device.type != "cpu"  # CPU batches are used in place; sink batches arrive moved
    sink_mode = helper.dataset_sink_mode
    helper.should_stop = ctx.get_stop_requested
    position = getattr(helper.dataset, "position", None)  # streams: resume point after a batch
    meta = getattr(helper.dataset, "last_batch_meta", None)
    params.cur_step_num = first_step
    params.dataset_sink_mode = sink_mode
    model._set_train_mode(True)
    callbacks.on_train_begin(ctx)
    checked = False
    try:
        for epoch in epochs:
            params.cur_epoch_num = epoch
            callbacks.on_train_epoch_begin(ctx)
            for inputs in helper:
                if sink_mode:
                    sink: Sink = inputs[0]
                    expected = helper.sink_size()
                    params.cur_step_num += expected
                    params.train_dataset_element = sink.first
                    if sink.first is None:  # the source ran dry (only an exhausted finite stream)
                        params.cur_step_num -= expected
                        break
                    if not checked:
                        check_first_batch(sink.first, model._needs_label)
                        checked = True
                    callbacks.on_train_step_begin(ctx)
                    outputs = step_net(*inputs)
                    params.cur_step_num += sink.count - expected  # a pass shorter than advertised
                    if sink.position is not None:
                        params.train_position, params.train_batch_metas = sink.position, sink.metas
                else:
                    batch = to_device(inputs, device, non_blocking=True) if move else inputs
                    if not checked:
                        check_first_batch(batch, model._needs_label)
                        checked = True
                    params.cur_step_num += 1
                    params.train_dataset_element = batch
                    callbacks.on_train_step_begin(ctx)
                    args, kwargs = unpack(batch)
                    outputs = step_net(*args, **kwargs)
                    if callable(position):  # read in the iterating thread, right after the batch
                        params.train_position = position()
                        params.train_batch_metas = [meta()] if callable(meta) else []
                params.net_outputs = outputs
                callbacks.on_train_step_end(ctx)
                if ctx.get_stop_requested():
                    break
            if fit_eval is not None and fit_eval.due(epoch):
                _eval_in_fit(model, fit_eval, params)
            if not sink_mode:
                reset(helper.dataset)
            callbacks.on_train_epoch_end(ctx)
            params.pop("metrics", None)
            params.pop("eval_results", None)
            if ctx.get_stop_requested():
                break
    finally:
        helper.release()
    callbacks.on_train_end(ctx)


def _eval_in_fit(model, fit_eval: FitEval, params: CallbackParams) -> None:
    """Evaluate between epochs with the same params; restore the training fields afterwards."""
    saved = {k: params.get(k) for k in ("cur_step_num", "batch_num", "dataset_sink_mode", "net_outputs")}
    params.eval_network = model.eval_network
    params.valid_dataset = fit_eval.dataset
    params.batch_num = dataset_size(fit_eval.dataset)
    params.mode = "eval"
    params.cur_step_num = 0
    # The callbacks were entered for the whole run already: call them, do not re-enter them.
    eval_loop(model, fit_eval.dataset, fit_eval.callbacks, params, add_eval_loss=True)
    params.mode = "train"
    params.update(saved)
    model._set_train_mode(True)


def eval_loop(model, dataset, callbacks: CallbackList, params: CallbackParams, add_eval_loss: bool = False) -> dict:
    """Run the eval network over `dataset`, feeding the metrics; returns ``{name: value}``."""
    ctx = RunContext(params)
    device = model._device
    move = device.type != "cpu"
    params.dataset_sink_mode = False
    model._clear_metrics()
    model._set_train_mode(False)
    callbacks.on_eval_begin(ctx)
    callbacks.on_eval_epoch_begin(ctx)
    last_loss = None
    with torch.no_grad():
        for i, batch in enumerate(dataset):
            batch = to_device(batch, device, non_blocking=True) if move else batch
            if i == 0:
                check_first_batch(batch, model._eval_needs_label, "valid_dataset")
            params.cur_step_num += 1
            params.eval_dataset_element = batch
            callbacks.on_eval_step_begin(ctx)
            args, kwargs = unpack(batch)
            outputs = model.eval_network(*args, **kwargs)
            params.net_outputs = outputs
            callbacks.on_eval_step_end(ctx)
            model._update_metrics(outputs)
            if add_eval_loss:
                # MindSpore builds a fresh Loss metric at every eval step, so its `eval_loss` is the
                # LAST batch's loss (not the mean). Reproduced for conformance; the mean is in
                # metrics["loss"] when a "loss" metric is configured.
                last_loss = model._loss_output(outputs)
            if ctx.get_stop_requested():
                break
    callbacks.on_eval_epoch_end(ctx)
    reset(dataset)
    metrics = model._get_metrics()
    params.metrics = metrics
    if add_eval_loss:
        params.eval_results = dict(metrics, eval_loss=None if last_loss is None else float(last_loss.float().mean()))
    callbacks.on_eval_end(ctx)
    model._set_train_mode(True)  # the network is back in train mode after evaluating
    return metrics
