"""`Model`: the high-level API (MindSpore's `mindspore.train.Model`) on PyTorch.

Split of concerns:
- data adapter (`data_adapter.py`): what a dataset and a batch may be, sizes, resets, devices;
- dataset helper / sink (`sink.py`): how batches reach the device, one step or one sink at a time;
- loops (`loop.py`): epochs, steps, hooks, stop checks, evaluation — the only loops;
- this file: the networks (train step, eval, predict), metrics, argument checks and run set-up.

>>> import torch
>>> from recstream import Model
>>> from recstream.callbacks import LossMonitor
>>> net = torch.nn.Linear(4, 2)
>>> model = Model(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
...               metrics={"accuracy", "loss"})
>>> data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(4)]
>>> model.train(2, data)
>>> sorted(model.eval(data))
['accuracy', 'loss']
"""
from __future__ import annotations

import torch
from torch import nn

from ..callbacks.base import CallbackList, CallbackParams, as_callback_list
from ..metrics import get_metrics
from . import checks
from .cells import TrainOneStepCell, WithEvalCell, WithLossCell
from ..data.transfer import to_device
from .data_adapter import check_dataset, dataset_size, network_device
from .loop import FitEval, eval_loop, train_loop
from .sink import DatasetHelper, connect_network_with_dataset

_KWARGS = ("loss_scale_manager", "keep_batchnorm_fp32", "boost_config_dict", "acc_level", "progress_bar")


class Model:
    """Train, evaluate and predict with a `torch.nn.Module` (see the module docstring).

    Args:
        network: the model. With `loss_fn`, called as ``network(*data)``; without, ``network(*batch)``
            must return the loss (and, if `optimizer` is None too, may update itself).
        loss_fn: ``loss_fn(outputs, label)``; batches are then ``(data..., label)``.
        optimizer: any ``torch.optim.Optimizer`` (or an object with ``step``/``zero_grad``).
        metrics: names (``{"accuracy", "auc", "loss"}``) or ``{name: Metric}``.
        eval_network / eval_indexes: a custom eval network and the positions of
            ``(loss, outputs, label)`` in its outputs.
        amp_level: "O0" | "O1" | "O2" | "O3" | "auto". boost_level: "O0" | "O1" | "O2".
        kwargs: ``loss_scale_manager``, ``keep_batchnorm_fp32``, ``boost_config_dict``,
            ``progress_bar`` ("auto": only on a terminal; True; False).
    """

    def __init__(self, network, loss_fn=None, optimizer=None, metrics=None, eval_network=None,
                 eval_indexes=None, amp_level="O0", boost_level="O0", **kwargs):
        checks.check_module("network", network)
        checks.check_kwargs(kwargs, _KWARGS)
        if loss_fn is not None and not callable(loss_fn):
            raise TypeError(f"'loss_fn' must be callable (e.g. an nn.Module), got {type(loss_fn).__name__}")
        checks.check_optimizer(optimizer)
        self._network, self._loss_fn, self._optimizer = network, loss_fn, optimizer
        self._amp_level = checks.check_amp_level(amp_level, optimizer)
        self._boost_level = checks.check_boost_level(kwargs.get("acc_level", boost_level), kwargs)
        self._keep_bn_fp32 = checks.check_optional_bool("keep_batchnorm_fp32", kwargs.get("keep_batchnorm_fp32"))
        self._loss_scale_manager = kwargs.get("loss_scale_manager")
        if self._loss_scale_manager is not None and optimizer is None:
            raise ValueError("'optimizer' must be set when 'loss_scale_manager' is given (got optimizer=None)")
        self._progress_bar = checks.check_progress_bar(kwargs.get("progress_bar", "auto"))
        self._train_network = self._build_train_network()
        self._metric_fns = get_metrics(metrics)
        self._eval_network, self._eval_indexes = self._build_eval_network(eval_network, eval_indexes)
        self._predict_network = self._build_predict_network()

    # ------------------------------------------------------------------ networks
    def _build_train_network(self) -> nn.Module:
        if self._optimizer is None:
            return self._network if self._loss_fn is None else WithLossCell(self._network, self._loss_fn)
        if self._amp_level == "O0" and self._loss_scale_manager is None:
            net = self._network if self._loss_fn is None else WithLossCell(self._network, self._loss_fn)
            return TrainOneStepCell(net, self._optimizer)
        from . import amp  # mixed precision builds its own step cell (autocast, casts, loss scale)
        return amp.build_train_network(self._network, self._loss_fn, self._optimizer, level=self._amp_level,
                                       keep_batchnorm_fp32=self._keep_bn_fp32,
                                       loss_scale_manager=self._loss_scale_manager,
                                       device=network_device(self._network))

    def _build_eval_network(self, eval_network, eval_indexes):
        checks.check_eval_indexes(eval_indexes)
        if eval_network is not None:
            checks.check_module("eval_network", eval_network)
            return eval_network, eval_indexes
        if not self._metric_fns:
            return None, None
        if self._loss_fn is None:
            raise ValueError("'metrics' needs either 'loss_fn' (to build the eval network) or 'eval_network'; "
                             "got loss_fn=None and eval_network=None")
        if self._amp_level != "O0":
            from . import amp
            return amp.build_eval_network(self._network, self._loss_fn, self._amp_level, network_device(self._network),
                                          keep_batchnorm_fp32=self._keep_bn_fp32), [0, 1, 2]
        return WithEvalCell(self._network, self._loss_fn), [0, 1, 2]

    def _build_predict_network(self) -> nn.Module:
        if self._amp_level == "O0":
            return self._network
        from . import amp
        return amp.build_predict_network(self._network, self._amp_level, network_device(self._network),
                                         keep_batchnorm_fp32=self._keep_bn_fp32)

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

    # ------------------------------------------------------------------ loop services
    @property
    def _device(self) -> torch.device:
        return network_device(self._network)

    @property
    def _needs_label(self) -> bool:
        return self._loss_fn is not None

    @property
    def _eval_needs_label(self) -> bool:
        return isinstance(self._eval_network, WithEvalCell)

    def _step_network(self, helper: DatasetHelper) -> nn.Module:
        return connect_network_with_dataset(self._train_network, helper)

    def _set_train_mode(self, training: bool) -> None:
        self._train_network.train(training)
        if self._eval_network is not None:
            self._eval_network.train(training)

    def _clear_metrics(self) -> None:
        for metric in self._metric_fns.values():
            metric.clear()

    def _update_metrics(self, outputs) -> None:
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else outputs
        if not isinstance(outputs, (tuple, list)):
            raise TypeError(f"the eval network must return a tensor or a tuple of tensors, got {type(outputs).__name__}")
        for name, metric in self._metric_fns.items():
            if self._eval_indexes is None:
                metric.update(*outputs)
            elif _is_loss_metric(metric):
                metric.update(outputs[self._eval_indexes[0]])
            else:
                metric.update(outputs[self._eval_indexes[1]], outputs[self._eval_indexes[2]])

    def _get_metrics(self) -> dict:
        return {name: metric.eval() for name, metric in self._metric_fns.items()}

    def _loss_output(self, outputs):
        if self._eval_indexes is None:
            return None
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else outputs
        return outputs[self._eval_indexes[0]]

    # ------------------------------------------------------------------ public API
    def train(self, epoch, train_dataset, callbacks=None, dataset_sink_mode=False, sink_size=-1, initial_epoch=0):
        """Train for epochs ``initial_epoch+1 .. epoch`` (see SEMANTICS: hooks, sink mode, stop)."""
        self._run(epoch, train_dataset, callbacks, dataset_sink_mode, sink_size, initial_epoch, None)

    def fit(self, epoch, train_dataset, valid_dataset=None, valid_frequency=1, callbacks=None,
            dataset_sink_mode=False, valid_dataset_sink_mode=False, sink_size=-1, initial_epoch=0):
        """Train, evaluating `valid_dataset` after epochs selected by `valid_frequency`."""
        checks.check_bool("valid_dataset_sink_mode", valid_dataset_sink_mode)
        checks.check_valid_frequency(valid_frequency)
        fit_eval = None
        if valid_dataset is not None:
            check_dataset(valid_dataset, "valid_dataset")
            if not self._metric_fns:
                raise ValueError("'valid_dataset' is given but the Model has no 'metrics' to evaluate it with; "
                                 "pass metrics=... to Model")
            fit_eval = FitEval(valid_dataset, valid_frequency, valid_dataset_sink_mode, None)
        self._run(epoch, train_dataset, callbacks, dataset_sink_mode, sink_size, initial_epoch, fit_eval)

    def _run(self, epoch, train_dataset, callbacks, sink_mode, sink_size, initial_epoch, fit_eval):
        checks.check_epochs(epoch, initial_epoch)
        checks.check_bool("dataset_sink_mode", sink_mode)
        checks.check_int("sink_size", sink_size)
        check_dataset(train_dataset, "train_dataset")
        user_callbacks = as_callback_list(callbacks)
        helper = DatasetHelper(train_dataset, sink_mode, sink_size if sink_mode else -1,
                               epoch_num=epoch - initial_epoch, device=self._device)
        params = self._train_params(epoch - initial_epoch, train_dataset, sink_mode, sink_size, user_callbacks)
        with CallbackList(user_callbacks + self._default_callbacks(user_callbacks)) as cbs:
            if fit_eval is not None:
                fit_eval.callbacks = CallbackList([cb for cb in cbs.callbacks if _runs_in_fit_eval(cb)])
            train_loop(self, range(initial_epoch + 1, epoch + 1), helper, cbs, params, fit_eval)

    def _train_params(self, epoch_num, dataset, sink_mode, sink_size, callbacks) -> CallbackParams:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        return CallbackParams(
            train_network=self._train_network, network=self._network, optimizer=self._optimizer,
            loss_fn=self._loss_fn, epoch_num=epoch_num, mode="train",
            batch_num=sink_size if sink_mode and sink_size > 0 else dataset_size(dataset),
            parallel_mode="data_parallel" if distributed else "stand_alone",
            device_number=torch.distributed.get_world_size() if distributed else 1,
            train_dataset=dataset, train_dataset_element=None, list_callback=list(callbacks),
            cur_step_num=0, dataset_sink_mode=sink_mode, last_save_ckpt_step=None, latest_ckpt_file=None)

    def _default_callbacks(self, user_callbacks) -> list:
        if self._progress_bar is False:
            return []
        from ..callbacks import ProgressBar, progress_bar_default
        if any(isinstance(cb, ProgressBar) for cb in user_callbacks):
            return []
        show = progress_bar_default() if self._progress_bar == "auto" else self._progress_bar
        return [ProgressBar()] if show else []

    def eval(self, valid_dataset, callbacks=None, dataset_sink_mode=False) -> dict:
        """Evaluate the metrics over `valid_dataset`; returns ``{name: value}``."""
        checks.check_bool("dataset_sink_mode", dataset_sink_mode)
        check_dataset(valid_dataset, "valid_dataset")
        if not self._metric_fns:
            raise ValueError("Model.eval needs 'metrics': pass metrics={...} to Model (got none)")
        user_callbacks = as_callback_list(callbacks)
        params = CallbackParams(eval_network=self._eval_network, valid_dataset=valid_dataset,
                                batch_num=dataset_size(valid_dataset), mode="eval", cur_step_num=0,
                                list_callback=user_callbacks, network=self._network)
        with CallbackList(user_callbacks) as cbs:
            return eval_loop(self, valid_dataset, cbs, params)

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
        checks.check_epochs(epoch, 0)
        checks.check_int("sink_size", sink_size)
        if train_dataset is None and valid_dataset is None:
            raise ValueError("Model.build needs 'train_dataset' or 'valid_dataset', got neither")
        for name, dataset in (("train_dataset", train_dataset), ("valid_dataset", valid_dataset)):
            if dataset is not None:
                check_dataset(dataset, name)
                self._warm_up(dataset)

    def _warm_up(self, dataset) -> None:
        from .data_adapter import unpack
        from .cells import split_label
        batch = next(iter(dataset), None)
        if batch is None:
            return
        args, kwargs = unpack(to_device(batch, self._device))
        if self._loss_fn is not None:
            args, kwargs, _ = split_label(args, kwargs)
        was_training = self._network.training
        self._network.eval()
        with torch.no_grad():
            self._network(*args, **kwargs)
        self._network.train(was_training)

    def infer_train_layout(self, train_dataset=None, dataset_sink_mode=True, sink_size=-1) -> dict:
        """Each parameter's placement: ``{name: {shape, dtype, device, placement, ranks}}``."""
        checks.check_bool("dataset_sink_mode", dataset_sink_mode)
        checks.check_int("sink_size", sink_size)
        return _layout(self._network)

    def infer_predict_layout(self, *predict_data) -> dict:
        """Like `infer_train_layout`, for the predict network."""
        return _layout(self._predict_network)


def _is_loss_metric(metric) -> bool:
    from ..metrics import Loss
    return isinstance(metric, Loss)


def _runs_in_fit_eval(cb) -> bool:
    """MindSpore skips its own callbacks, except TimeMonitor, during the evaluation inside fit."""
    from ..callbacks import BUILTIN_CALLBACK_NAMES
    name = type(cb).__name__
    return name == "TimeMonitor" or name not in BUILTIN_CALLBACK_NAMES


def _layout(network: nn.Module) -> dict:
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    ranks = list(range(torch.distributed.get_world_size())) if distributed else [0]
    layout = {}
    for name, p in network.named_parameters():
        own = getattr(p, "recstream_layout", None)  # sharded tables describe their own placement
        layout[name] = own or {"shape": list(p.shape), "dtype": str(p.dtype).replace("torch.", ""),
                               "device": str(p.device), "placement": "replicated", "ranks": ranks}
    return layout

