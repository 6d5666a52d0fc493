"""`Model`: the high-level API (MindSpore's `mindspore.train.Model`) on PyTorch.

Split of concerns:

- data adapter (`recstream.data.protocol`): what a dataset and a batch may be, sizes, resets;
- dataset helper and sink (`sink.py`): how batches reach the device, one step or one sink of
  steps at a time (`Sink.run` is the sink loop);
- step cells (`cells.py`, `amp.py`, planned once by `plan.py`): what one training step does — the extension point
  (`TrainOneStepCell`, or any module passed as the network with ``loss_fn=None, optimizer=None``);
- callbacks (`recstream.callbacks.CallbackList`): hook dispatch;
- this class: the networks, the metrics, and the loops (`_train_loop`, `_eval_loop`): one
  ``for epoch / for step`` for both execution modes, hooks and counters as in docs/semantics.md.

Hot-path rules: no host sync per step (the loss stays a device tensor in ``net_outputs``;
callbacks read it when they need to), network mode switched once per phase, not per step.

>>> import torch
>>> from recstream import Model
>>> from recstream.callbacks import LossMonitor
>>> net = torch.nn.Linear(4, 2)
>>> model = Model(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
...               metrics={"accuracy", "loss"})
>>> data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(4)]
>>> history = model.train(2, data)
>>> sorted(model.eval(data))
['accuracy', 'loss']
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from ..callbacks import (
    Callback,
    CallbackList,
    CallbackParams,
    EpochSummary,
    History,
    ProgressBar,
    RunContext,
    RunState,
    progress_bar_default,
)
from ..callbacks.base import as_callback_list
from ..callbacks.divergence import LossWatch
from ..data.protocol import check_batch, check_dataset, dataset_size, reset, split_batch, unpack
from ..data.transfer import to_device
from ..distributed import all_reduce_metrics, rank, world_size
from ..metrics import Loss, get_metrics
from ..validation import check_bool, check_callable, check_choice, check_int, check_kwargs, check_module, check_type
from .cells import OptimizerLike, WithEvalCell
from .committer import OnlineCommitter
from .plan import BOOST_LEVELS, StepOptions, network_device, plan_step  # noqa: F401 (BOOST_LEVELS: its old home)
from .sink import DatasetHelper, batch_prefetch, check_sink_size
from .summary import summarize

_KWARGS = ("loss_scale_manager", "keep_batchnorm_fp32", "boost_config_dict", "acc_level", "progress_bar")


@dataclass
class _FitEvaluation:
    """What `fit` evaluates between epochs, how often, and with which callbacks."""

    dataset: Iterable
    frequency: int | list
    callbacks: CallbackList | None = None

    def due(self, epoch: int) -> bool:
        return epoch % self.frequency == 0 if isinstance(self.frequency, int) else epoch in self.frequency


class Model:
    """Train, evaluate and predict with a `torch.nn.Module` (see the module docstring).

    Args:
        network: the model. With `loss_fn`, called as ``network(*data)``; without, ``network(*batch)``
            must return the loss (and, if `optimizer` is None too, may update itself).
        loss_fn: ``loss_fn(outputs, label)``; batches are then ``(data..., label)``.
        optimizer: any ``torch.optim.Optimizer`` (or an object with ``step``/``zero_grad``).
        metrics: names (``{"accuracy", "auc", "loss"}``) or ``{name: Metric}``.
        eval_network: a custom eval network (default: built from `network` and `loss_fn`).
        eval_indexes: the positions of ``(loss, outputs, label)`` in `eval_network`'s outputs.
        amp_level: "O0" | "O1" | "O2" | "O3" | "auto".
        boost_level: "O0" | "O1" | "O2": named accelerations of the user's network and optimizer
            (`recstream.train.boost`; ``boost_config_dict`` switches each by name, `boost_report`
            says what was applied).
        kwargs: ``loss_scale_manager``, ``keep_batchnorm_fp32``, ``boost_config_dict``,
            ``progress_bar`` ("auto": only on a terminal; True; False).
    """

    def __init__(self, network, loss_fn=None, optimizer=None, metrics=None, eval_network=None,
                 eval_indexes=None, amp_level="O0", boost_level="O0", **kwargs):
        check_module("Model", "network", network)
        check_kwargs("Model", kwargs, _KWARGS)
        check_callable("Model", "loss_fn", loss_fn, allow_none=True)
        check_type("Model", "optimizer", optimizer, OptimizerLike, allow_none=True,
                   allowed="a torch.optim.Optimizer (an object with step() and zero_grad())")
        self._network, self._loss_fn, self._optimizer = network, loss_fn, optimizer
        options = StepOptions(amp_level, kwargs.get("acc_level", boost_level), kwargs.get("boost_config_dict"),
                              kwargs.get("keep_batchnorm_fp32"), kwargs.get("loss_scale_manager"))
        self._progress_bar = check_choice("Model", "progress_bar", kwargs.get("progress_bar", "auto"),
                                          ("auto", True, False))
        self._metric_fns = get_metrics(metrics)
        _check_eval_indexes(eval_indexes)
        if eval_network is not None:
            check_module("Model", "eval_network", eval_network)
        # amp, boost and the parallel mode (read once, here, as MindSpore reads it) resolved together.
        plan = plan_step(network, loss_fn, optimizer, options, eval_network, eval_indexes, bool(self._metric_fns))
        self._train_network, self._eval_network, self._predict_network = (
            plan.train_network, plan.eval_network, plan.predict_network)
        self._eval_indexes, self._amp_level, self._boost_level = plan.eval_indexes, plan.amp_level, plan.boost_level
        self._parallel_mode, self._plan = plan.parallel_mode, plan

    def summary(self, print_fn=print) -> str:
        """Print (with `print_fn`; None: don't) and return a table of the network's modules,
        parameters and bytes, its embedding tables, and the optimizer's state bytes."""
        text = summarize(self._network, self._optimizer)
        if print_fn is not None:
            print_fn(text)
        return text

    @property
    def boost_report(self) -> list[str]:
        """One line per boost acceleration: applied or skipped, and why (see `recstream.train.boost`)."""
        return list(self._plan.accelerations)

    @property
    def train_network(self) -> nn.Module:
        """The module each training step calls (e.g. `TrainOneStepCell`)."""
        return self._train_network

    @property
    def eval_network(self) -> nn.Module | None:
        """The module evaluation calls; by default returns ``(loss, outputs, label)``."""
        return self._eval_network

    @property
    def predict_network(self) -> nn.Module:
        """The module `predict` calls (the network itself, or its mixed-precision wrapper)."""
        return self._predict_network

    @property
    def _device(self) -> torch.device:
        """The device of the network's first parameter or buffer (CPU for a parameterless network)."""
        return network_device(self._network)

    # ------------------------------------------------------------------ public API
    def train(self, epoch, train_dataset, callbacks=None, dataset_sink_mode=False, sink_size=-1, initial_epoch=0):
        """Train for epochs ``initial_epoch+1 .. epoch`` (hooks, sink mode, stop: docs/semantics.md).
        Returns the run's `History` (per-epoch loss; MindSpore returns None)."""
        return self._run("Model.train", epoch, train_dataset, callbacks, dataset_sink_mode, sink_size, initial_epoch,
                         None)

    def fit(self, epoch, train_dataset, valid_dataset=None, valid_frequency=1, callbacks=None,
            dataset_sink_mode=False, valid_dataset_sink_mode=False, sink_size=-1, initial_epoch=0):
        """Train, evaluating `valid_dataset` after epochs selected by `valid_frequency`. Returns the
        run's `History` (per-epoch loss and evaluation results; MindSpore returns None)."""
        check_bool("Model.fit", "valid_dataset_sink_mode", valid_dataset_sink_mode)
        _check_valid_frequency(valid_frequency)
        fit_eval = None
        if valid_dataset is not None:
            check_dataset(valid_dataset, "valid_dataset")
            if not self._metric_fns:
                raise ValueError("Model.fit: 'valid_dataset' is given but the Model has no 'metrics' to evaluate "
                                 "it with; pass metrics=... to Model")
            fit_eval = _FitEvaluation(valid_dataset, valid_frequency)
        return self._run("Model.fit", epoch, train_dataset, callbacks, dataset_sink_mode, sink_size, initial_epoch,
                         fit_eval)

    def eval(self, valid_dataset, callbacks=None, dataset_sink_mode=False) -> dict:
        """Evaluate the metrics over `valid_dataset`; returns ``{name: value}``."""
        check_bool("Model.eval", "dataset_sink_mode", dataset_sink_mode)
        check_dataset(valid_dataset, "valid_dataset")
        if not self._metric_fns:
            raise ValueError("Model.eval needs 'metrics': pass metrics={...} to Model (got none)")
        user_callbacks = as_callback_list(callbacks, "Model.eval")
        state = RunState(mode="eval", step=0, batch_num=dataset_size(valid_dataset))
        params = CallbackParams.view(state, eval_network=self._eval_network, valid_dataset=valid_dataset,
                                     list_callback=user_callbacks, network=self._network)
        with CallbackList(user_callbacks) as cbs:
            return self._eval_loop(valid_dataset, cbs, params)

    def predict(self, *predict_data):
        """Run `predict_network` in eval mode without gradients on the given inputs."""
        if not predict_data:
            raise ValueError("Model.predict needs at least one input tensor, got none")
        net, was_training = self._predict_network, self._predict_network.training
        data = to_device(predict_data, self._device)
        net.eval()
        try:
            with torch.no_grad():
                return net(*data)
        finally:
            net.train(was_training)

    def build(self, train_dataset=None, valid_dataset=None, sink_size=-1, epoch=1):
        """Prepare before training: validate, and materialise lazy modules with one no-grad forward.

        Eager PyTorch has no graph to compile; what costs time on a first step here is
        initialising lazy parameters (``nn.LazyLinear`` ...), done now on the first batch.
        """
        _check_epochs("Model.build", epoch, 0)
        check_int("Model.build", "sink_size", sink_size)
        if train_dataset is None and valid_dataset is None:
            raise ValueError("Model.build needs 'train_dataset' or 'valid_dataset', got neither")
        for name, dataset in (("train_dataset", train_dataset), ("valid_dataset", valid_dataset)):
            if dataset is not None:
                check_dataset(dataset, name)
                self._warm_up(dataset)

    def infer_train_layout(self, train_dataset=None, dataset_sink_mode=True, sink_size=-1) -> dict:
        """Each parameter's placement: ``{name: {shape, dtype, device, placement, ranks}}``."""
        check_bool("Model.infer_train_layout", "dataset_sink_mode", dataset_sink_mode)
        check_int("Model.infer_train_layout", "sink_size", sink_size)
        return _layout(self._network)

    def infer_predict_layout(self, *predict_data) -> dict:
        """Like `infer_train_layout`, for the predict network."""
        return _layout(self._predict_network)

    # ------------------------------------------------------------------ the loops
    def _run(self, owner, epoch, train_dataset, callbacks, sink_mode, sink_size, initial_epoch, fit_eval):
        """Validate a train/fit call, set up its state and callbacks, and run the training loop."""
        _check_epochs(owner, epoch, initial_epoch)
        check_bool(owner, "dataset_sink_mode", sink_mode)
        if sink_mode:
            check_sink_size(owner, sink_size)
        else:
            check_int(owner, "sink_size", sink_size)  # ignored without sink, but still an int
        check_dataset(train_dataset, "train_dataset")
        user_callbacks = as_callback_list(callbacks, owner)
        helper = DatasetHelper(train_dataset, sink_mode, sink_size if sink_mode else -1,
                               epoch_num=epoch - initial_epoch, device=self._device,
                               ahead=batch_prefetch(self._network))  # a tiered table's rows, read ahead
        params = self._train_params(epoch - initial_epoch, train_dataset, sink_mode, sink_size, user_callbacks)
        callbacks = user_callbacks + self._default_callbacks(user_callbacks)
        if rank() != 0:  # printing, files and publishing happen once, on rank 0
            callbacks = [cb for cb in callbacks if not cb.rank_zero_only]
        history = next(cb for cb in callbacks if isinstance(cb, History))
        with CallbackList(callbacks) as cbs:
            if fit_eval is not None:  # MindSpore calls only TimeMonitor of its own callbacks there
                fit_eval.callbacks = CallbackList([cb for cb in cbs.callbacks if cb.called_in_fit_eval])
            # checkpoint -> commit (a source that takes commits) -> publish, whatever the callbacks' order
            committer = OnlineCommitter(cbs, train_dataset)
            self._train_loop(range(initial_epoch + 1, epoch + 1), helper, committer, params, fit_eval)
        return history

    def _train_loop(self, epochs: Iterable[int], helper: DatasetHelper, callbacks: Callback,
                    params: CallbackParams, fit_eval: _FitEvaluation | None = None, first_step: int = 0,
                    network: nn.Module | None = None) -> None:
        """Train over `epochs` (1-based numbers, possibly endless): the one training loop.

        A step is one batch, or one sink of batches; either way the hooks run once per step and
        `cur_step_num` counts batches. `first_step` is where it starts (0, except for an online run
        resumed from a checkpoint). `network` runs each batch instead of the train network (online
        micro-steps: `MicroSteps` around it).
        """
        ctx, state = RunContext(params), params.run_state
        network = self._train_network if network is None else network
        helper.should_stop = ctx.get_stop_requested  # a stop request also ends a wait for data
        state.step, state.sink_mode = first_step, helper.dataset_sink_mode
        self._set_train_mode(True)
        # Divergence guard: a non-finite loss is flagged on the device per step (no host sync), and
        # read at an offline epoch's end, at the run's end and by ModelCheckpoint / ModelPublisher.
        params.loss_watch = watch = LossWatch()
        callbacks.on_train_begin(ctx)
        checked = False
        try:
            for epoch in epochs:
                state.epoch = epoch
                callbacks.on_train_epoch_begin(ctx)
                for step in helper.steps():
                    if step.first is None:  # a sink whose source ran dry (a finite stream ended)
                        break
                    if not checked:
                        check_batch(step.first, self._loss_fn is not None)
                        checked = True
                    start = state.step
                    state.step = start + step.planned  # hooks see the step the sink ends on
                    state.batch = step.first
                    callbacks.on_train_step_begin(ctx)
                    state.outputs = self._run_step(step, state, start, network)
                    state.step = start + step.count  # a sink may end short of its plan
                    watch.observe(state.outputs, state.step, epoch)
                    if step.position is not None:
                        state.position, state.batch_metas = step.position, step.metas
                    callbacks.on_train_step_end(ctx)
                    if ctx.get_stop_requested():
                        break
                if fit_eval is not None and fit_eval.due(epoch):
                    self._evaluate_in_fit(fit_eval, params)
                if not helper.dataset_sink_mode:
                    reset(helper.dataset)
                if not params.get("online"):  # online, an epoch may be one sink: no read per step
                    watch.check()
                callbacks.on_train_epoch_end(ctx)
                state.end_epoch()
                if ctx.get_stop_requested() or helper.ended:  # ended: a finite stream reported its end
                    break
        finally:
            helper.release()
        watch.check()
        callbacks.on_train_end(ctx)

    def _run_step(self, step, state: RunState, start: int, network: nn.Module):
        """`step.run` on the train network. If a sink raises part-way, the state first records what
        the weights already hold (batches and position), so an exception checkpoint saves that."""
        try:
            return step.run(network, state.batch_observers or ())
        except BaseException:
            if step.trained is not None:
                state.step = start + step.trained
            if step.trained_position is not None:
                state.position, state.batch_metas = step.trained_position, []
            raise

    def _evaluate_in_fit(self, fit_eval: _FitEvaluation, params: CallbackParams) -> None:
        """Evaluate between epochs with the same params; restore the training fields afterwards."""
        state = params.run_state
        saved = (state.step, state.batch_num, state.sink_mode, state.outputs)
        params.eval_network = self._eval_network
        params.valid_dataset = fit_eval.dataset
        state.batch_num = dataset_size(fit_eval.dataset)
        state.mode, state.step = "eval", 0
        # The callbacks were entered for the whole run already: call them, do not re-enter them.
        self._eval_loop(fit_eval.dataset, fit_eval.callbacks, params, in_fit=True)
        state.mode = "train"
        state.step, state.batch_num, state.sink_mode, state.outputs = saved
        self._set_train_mode(True)

    def _eval_loop(self, dataset, callbacks: Callback, params: CallbackParams, in_fit: bool = False) -> dict:
        """Run the eval network over `dataset`, feeding the metrics: the one evaluation loop."""
        ctx, state = RunContext(params), params.run_state
        device = self._device
        move = device.type != "cpu"
        state.sink_mode = False
        for metric in self._metric_fns.values():
            metric.clear()
        self._set_train_mode(False)
        callbacks.on_eval_begin(ctx)
        callbacks.on_eval_epoch_begin(ctx)
        last_loss = None
        with torch.no_grad():
            for i, batch in enumerate(dataset):
                batch = to_device(batch, device, non_blocking=True) if move else batch
                if i == 0:
                    check_batch(batch, isinstance(self._eval_network, WithEvalCell), "valid_dataset")
                state.step += 1
                state.eval_batch = batch
                callbacks.on_eval_step_begin(ctx)
                args, kwargs = unpack(batch)
                outputs = self._eval_network(*args, **kwargs)
                state.outputs = outputs
                callbacks.on_eval_step_end(ctx)
                self._update_metrics(outputs)
                if in_fit:
                    # MindSpore builds a fresh Loss metric at every eval step, so its `eval_loss` is the
                    # LAST batch's loss (not the mean). Reproduced for conformance; the mean is in
                    # metrics["loss"] when a "loss" metric is configured.
                    last_loss = self._loss_output(outputs)
                if ctx.get_stop_requested():
                    break
        callbacks.on_eval_epoch_end(ctx)
        reset(dataset)
        all_reduce_metrics(self._metric_fns.values())  # several ranks: metrics of all their data
        metrics = {name: metric.eval() for name, metric in self._metric_fns.items()}
        state.metrics = metrics
        if in_fit:
            eval_loss = None if last_loss is None else float(last_loss.float().mean())
            state.eval_results = dict(metrics, eval_loss=eval_loss)
        callbacks.on_eval_end(ctx)
        self._set_train_mode(True)  # the network is back in train mode after evaluating
        return metrics

    # ------------------------------------------------------------------ loop services
    def _set_train_mode(self, training: bool) -> None:
        self._train_network.train(training)
        if self._eval_network is not None:
            self._eval_network.train(training)

    def _update_metrics(self, outputs) -> None:
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else outputs
        if not isinstance(outputs, (tuple, list)):
            raise TypeError("the eval network must return a tensor or a tuple of tensors, "
                            f"got {type(outputs).__name__}")
        for metric in self._metric_fns.values():
            if self._eval_indexes is None:
                metric.update(*outputs)
            elif isinstance(metric, Loss):
                metric.update(outputs[self._eval_indexes[0]])
            else:
                metric.update(outputs[self._eval_indexes[1]], outputs[self._eval_indexes[2]])

    def _loss_output(self, outputs):
        if self._eval_indexes is None:
            return None
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else outputs
        return outputs[self._eval_indexes[0]]

    def _train_params(self, epoch_num, dataset, sink_mode, sink_size, callbacks) -> CallbackParams:
        state = RunState(mode="train", epoch_num=epoch_num, step=0, sink_mode=sink_mode, batch_observers=[],
                         batch_num=sink_size if sink_mode and sink_size > 0 else dataset_size(dataset))
        return CallbackParams.view(
            state, train_network=self._train_network, network=self._network, optimizer=self._optimizer,
            loss_fn=self._loss_fn, parallel_mode=self._parallel_mode, device_number=world_size(), rank=rank(),
            train_dataset=dataset, list_callback=list(callbacks), amp_level=self._amp_level,
            boost_level=self._boost_level)

    def _default_callbacks(self, user_callbacks) -> list:
        """A `History` (returned by train/fit) unless the user passed one, and the run's visible
        output: a progress bar on a terminal, else `EpochSummary` lines (one per epoch; online,
        periodic ones and a final one)."""
        defaults = [] if any(isinstance(cb, History) for cb in user_callbacks) else [History()]
        if self._progress_bar is False or any(isinstance(cb, (ProgressBar, EpochSummary)) for cb in user_callbacks):
            return defaults
        show = progress_bar_default() if self._progress_bar == "auto" else self._progress_bar
        return defaults + [ProgressBar() if show else EpochSummary()]

    def _warm_up(self, dataset) -> None:
        batch = next(iter(dataset), None)
        if batch is None:
            return
        batch = to_device(batch, self._device)
        if self._loss_fn is not None:
            args, kwargs, _ = split_batch(batch)
        else:
            args, kwargs = unpack(batch)
        was_training = self._network.training
        self._network.eval()
        with torch.no_grad():
            self._network(*args, **kwargs)
        self._network.train(was_training)


# ---------------------------------------------------------------------- argument checks
def _check_eval_indexes(eval_indexes) -> None:
    if eval_indexes is None:
        return
    allowed = "None or a list of 3 ints (positions of loss, outputs and label in the eval network's outputs)"
    check_type("Model", "eval_indexes", eval_indexes, list, allowed=allowed)
    for i in eval_indexes:
        check_int("Model", "eval_indexes", i)
    if len(eval_indexes) != 3:
        raise ValueError(f"Model: 'eval_indexes' must be {allowed}, got {eval_indexes!r}")


def _check_epochs(owner: str, epoch, initial_epoch) -> None:
    check_int(owner, "epoch", epoch, minimum=1)
    check_int(owner, "initial_epoch", initial_epoch, minimum=0, maximum=epoch - 1)


def _check_valid_frequency(valid_frequency) -> None:
    allowed = "a positive int or a non-empty list of positive ints (epochs)"
    if isinstance(valid_frequency, list):
        if not valid_frequency:
            raise ValueError(f"Model.fit: 'valid_frequency' must be {allowed}, got []")
        for value in valid_frequency:
            check_int("Model.fit", "valid_frequency", value, minimum=1)
        return
    check_type("Model.fit", "valid_frequency", valid_frequency, (int, list), allowed=allowed)
    check_int("Model.fit", "valid_frequency", valid_frequency, minimum=1)


def _layout(network: nn.Module) -> dict:
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    ranks = list(range(torch.distributed.get_world_size())) if distributed else [0]
    layout = {}
    for name, p in network.named_parameters():
        own = getattr(p, "recstream_layout", None)  # sharded tables describe their own placement
        layout[name] = own or {"shape": list(p.shape), "dtype": str(p.dtype).replace("torch.", ""),
                               "device": str(p.device), "placement": "replicated", "ranks": ranks}
    return layout
