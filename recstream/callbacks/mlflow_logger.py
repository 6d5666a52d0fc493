"""MLflowLogger: log training loss, learning rates, evaluation metrics and run parameters to MLflow.

What is logged, to which run, and how a resumed training continues it: the class docstring. It
needs the optional extra ``pip install 'recstream[mlflow]'``; this module imports ``mlflow``
only when a logger is built, so ``import recstream`` never does.
"""
from __future__ import annotations

import re
import time
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from ..data.protocol import batch_rows
from ..validation import check_bool, check_choice, check_int, check_str, check_type, describe
from ._monitoring import scalar_results
from .base import Callback
from .loss_monitor import loss_value

_OWNER = "MLflowLogger"
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- ]")  # what MLflow accepts in a metric or param name, on every OS
_SQL_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
_PREQUENTIAL = ("auc", "logloss", "auc_total", "logloss_total")


def _import_mlflow():
    """The mlflow module, or an ImportError that names the extra to install."""
    try:
        import mlflow
        import mlflow.tracking  # noqa: F401  (MlflowClient)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] != "mlflow":
            raise
        raise ImportError("recstream.callbacks.MLflowLogger needs the MLflow client: "
                          "pip install 'recstream[mlflow]'  (mlflow-skinny)") from e
    return mlflow


def _check_sql_store(uri: str) -> None:
    """mlflow-skinny alone answers a database URI with an unrelated "model registry" error: say what is missing."""
    try:
        import alembic  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ModuleNotFoundError as e:
        raise ImportError(f"MLflowLogger: the tracking store {uri!r} needs SQLAlchemy and Alembic, which "
                          f"mlflow-skinny leaves out ({e}): pip install 'recstream[mlflow]'") from e


def _str_dict(name: str, value) -> dict[str, str]:
    """`tags` / `params`: str keys, scalar values (stored by MLflow as strings)."""
    if value is None:
        return {}
    check_type(_OWNER, name, value, Mapping, allowed="a dict of str keys", allow_none=True)
    out = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"{_OWNER}: the keys of '{name}' must be non-empty str, got {describe(key)}")
        if not isinstance(item, (str, int, float, bool)):
            raise TypeError(f"{_OWNER}: '{name}[{key!r}]' must be a str, int, float or bool, got {describe(item)}")
        out[key] = str(item)
    return out


def _key(name: str) -> str:
    return _BAD_KEY_CHARS.sub("_", name)


def _hyperparameter(value):
    """A number (or tuple of numbers, as Adam's betas) worth logging; None for anything else."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    if isinstance(value, bool):  # implementation switches (foreach, fused, ...), not hyperparameters
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, tuple) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                  for v in value):
        return value
    return None


def _class_name(obj) -> str:
    return getattr(obj, "__name__", None) or type(obj).__name__


class MLflowLogger(Callback):
    """Log a training run to MLflow: metrics, parameters, and the run's end.

    Metrics, with ``step`` the global step ``cur_step_num`` (the x axis of `TensorBoard`, whose
    tag names they share, so keys never collide):

    - ``train/loss`` (and ``train/loss_scale`` when the step returns ``(loss, overflow, scale)``)
      and ``train/lr`` (``train/lr/group<i>`` with several param groups), every
      ``log_every_n_steps`` global steps (the loss is read from the device only then), or at
      each epoch end with ``log_every_n_steps="epoch"``;
    - ``eval/<name>`` for each evaluation result of ``fit`` (``eval/eval_loss`` beside a metric
      named ``loss`` at ``eval/loss``), and for a standalone ``Model.eval``;
    - ``prequential/<name>`` (``auc``, ``logloss``, ``auc_total``, ``logloss_total``) at each
      report of a `PrequentialMonitor` (its last one, at the end of training, when the monitor
      comes before this callback in the list).

    Parameters, once per run (``log_params``): the network, loss and optimizer classes, the
    optimizer's numeric hyperparameters (``optimizer/lr``, ``optimizer/betas``, ...;
    ``optimizer/group<i>/...`` with several groups), ``epoch_num``, ``batch_num``, ``batch_size``,
    ``dataset_sink_mode``, ``parallel_mode``, ``device_number``, and ``params`` (e.g. the Model's
    ``amp_level``, which callbacks do not see). MLflow parameters cannot change: a resumed run
    keeps the values it started with.

    The run: the one named by ``run_id`` (or by a restored `state_dict`), else the active run of
    a ``with mlflow.start_run():`` block in the same tracking store, else a new run in
    ``experiment_name``, started at ``on_train_begin``. The logger ends it at ``on_train_end``
    (``FINISHED``), or when training raises (``FAILED``; ``KILLED`` on Ctrl-C); the run of a
    ``with`` block is left to that block. One logger is one run: training again with it, or
    with a logger restored from its `state_dict`, continues the same run and its step axis
    (``Model.train`` counts steps from 0 again after a restore). Each logger writes through its
    own ``MlflowClient``, so two models trained in one process never mix their runs; each
    logging moment is one ``log_batch`` call. Under ``torchrun`` only rank 0 logs.

    Resume after a restart: save ``logger.state_dict()`` with the checkpoint, e.g.
    ``save_checkpoint(path, net, opt, extra={"mlflow": logger.state_dict()})``, and call
    ``logger.load_state_dict(meta["mlflow"])`` on the new process's logger.

    Needs ``pip install 'recstream[mlflow]'``: ``mlflow-skinny``, plus SQLAlchemy and Alembic
    for a local ``sqlite:///...`` store (MLflow's default); a tracking server (``http://...``)
    needs neither.

    Args:
        tracking_uri: where MLflow stores runs (``http://host:5000``, ``sqlite:///mlflow.db``, ...);
            None: MLflow's own default (``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``).
        experiment_name: created if missing; None: ``MLFLOW_EXPERIMENT_NAME`` /
            ``MLFLOW_EXPERIMENT_ID``, else MLflow's default experiment.
        run_name: the name of a new run (MLflow makes one up when None).
        run_id: log into this existing run (e.g. to continue it after a restart).
        log_every_n_steps: training scalars every this many global steps, or ``"epoch"``.
        log_params: log the run's parameters at the start of training.
        tags: ``{name: value}`` set on the run.
        params: more ``{name: value}`` parameters to log (they win over the collected ones).

    Examples:
        >>> import os, tempfile, torch
        >>> from recstream import Model
        >>> uri = "sqlite:///" + os.path.join(tempfile.mkdtemp(), "mlflow.db")
        >>> logger = MLflowLogger(tracking_uri=uri, experiment_name="ctr", log_every_n_steps=2)
        >>> net = torch.nn.Linear(4, 1)
        >>> model = Model(net, torch.nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
        ...               progress_bar=False)
        >>> data = [(torch.randn(8, 4), torch.rand(8, 1)) for _ in range(4)]
        >>> _ = model.train(2, data, callbacks=[logger])
        >>> run = logger.client.get_run(logger.run_id)
        >>> params = run.data.params
        >>> run.info.status, params["optimizer"], params["optimizer/lr"], params["batch_size"], sorted(run.data.metrics)
        ('FINISHED', 'SGD', '0.1', '8', ['train/loss', 'train/lr'])
        >>> [m.step for m in logger.client.get_metric_history(logger.run_id, "train/loss")]
        [2, 4, 6, 8]
    """

    called_in_fit_eval = False
    rank_zero_only = True

    def __init__(self, tracking_uri: str | None = None, experiment_name: str | None = None,
                 run_name: str | None = None, run_id: str | None = None, log_every_n_steps: int | str = 50,
                 log_params: bool = True, tags: Mapping[str, Any] | None = None,
                 params: Mapping[str, Any] | None = None):
        self.tracking_uri = check_str(_OWNER, "tracking_uri", tracking_uri, allow_none=True)
        self.experiment_name = check_str(_OWNER, "experiment_name", experiment_name, allow_none=True)
        self.run_name = check_str(_OWNER, "run_name", run_name, allow_none=True)
        self._run_id = check_str(_OWNER, "run_id", run_id, allow_none=True)
        if isinstance(log_every_n_steps, str):
            self.log_every_n_steps = check_choice(_OWNER, "log_every_n_steps", log_every_n_steps, ("epoch",))
        else:
            self.log_every_n_steps = check_int(_OWNER, "log_every_n_steps", log_every_n_steps, minimum=1)
        self.log_params = check_bool(_OWNER, "log_params", log_params)
        self.tags = _str_dict("tags", tags)
        self.params = _str_dict("params", params)
        self._mlflow = _import_mlflow()  # fail at construction, not mid-training
        self._client = None
        self._owns_run = False  # a run this logger (re)opened and so must end
        self._global_step = 0  # the last step seen, on this logger's axis (offset included)
        self._step_offset = 0
        self._last_logged_step = 0
        self._prequential_step = None
        self._batch_size_pending = False
        self._logged_params: dict[str, str] = {}

    @property
    def client(self):
        """The ``mlflow.tracking.MlflowClient`` this logger writes with (created on first use)."""
        if self._client is None:
            uri = self.tracking_uri or self._mlflow.get_tracking_uri()
            if uri.split(":", 1)[0].split("+")[0] in _SQL_SCHEMES:
                _check_sql_store(uri)
            self._client = self._mlflow.tracking.MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    @property
    def run_id(self) -> str | None:
        """The MLflow run logged into (None before the first training)."""
        return self._run_id

    # ------------------------------------------------------------------ the run
    def _experiment_id(self) -> str:
        from mlflow.environment_variables import MLFLOW_EXPERIMENT_ID, MLFLOW_EXPERIMENT_NAME
        from mlflow.exceptions import MlflowException

        name = self.experiment_name or MLFLOW_EXPERIMENT_NAME.get()
        if not name:
            return MLFLOW_EXPERIMENT_ID.get() or "0"  # "0": MLflow's default experiment
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:  # another process created it meanwhile
            experiment = self.client.get_experiment_by_name(name)
            if experiment is None:
                raise
            return experiment.experiment_id

    def _active_run_id(self) -> str | None:
        """The run of an enclosing ``with mlflow.start_run():`` in the same tracking store, if any."""
        active = self._mlflow.active_run()
        if active is None or (self.tracking_uri is not None and self.tracking_uri != self._mlflow.get_tracking_uri()):
            return None
        return active.info.run_id

    def _open_run(self) -> None:
        """Start a run, or reopen the known one; set `_owns_run` (whether we must end it)."""
        from mlflow.entities import RunTag
        from mlflow.exceptions import MlflowException

        client, active = self.client, self._active_run_id()
        if self._run_id is None and active is None:
            run = client.create_run(self._experiment_id(), run_name=self.run_name, tags=self.tags)
            self._run_id, self._owns_run, self._logged_params = run.info.run_id, True, {}
            return
        self._run_id = self._run_id or active
        try:
            run = client.get_run(self._run_id)
        except MlflowException as e:
            if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            raise ValueError(f"{_OWNER}: run_id {self._run_id!r} is not a run of the tracking store "
                             f"{self.tracking_uri or self._mlflow.get_tracking_uri()!r}") from e
        self._logged_params = dict(run.data.params)
        self._owns_run = self._run_id != active
        if self._owns_run and run.info.status != "RUNNING":
            client.update_run(self._run_id, status="RUNNING")
        if self.tags:
            client.log_batch(self._run_id, tags=[RunTag(k, v) for k, v in self.tags.items()])

    def _end_run(self, status: str) -> None:
        if self._owns_run:
            self._owns_run = False
            self.client.set_terminated(self._run_id, status=status)

    def _send(self, metrics: list | None = None, params: dict | None = None) -> None:
        """One ``log_batch`` call for everything of one logging moment."""
        from mlflow.entities import Param

        new = {}
        for key, value in (params or {}).items():
            # Parameters are immutable in MLflow: a resumed run keeps the value it started with.
            if key not in self._logged_params:
                new[key] = self._logged_params[key] = value
        if metrics or new:
            self.client.log_batch(self._run_id, metrics=metrics or [],
                                  params=[Param(k, v) for k, v in new.items()])

    # ------------------------------------------------------------------ what is logged
    def _run_params(self, p) -> dict[str, str]:
        out: dict[str, Any] = {}
        for name in ("network", "loss_fn", "optimizer"):
            if p.get(name) is not None:
                out[name] = _class_name(p[name])
        groups = getattr(p.optimizer, "param_groups", None) or []
        for i, group in enumerate(groups):
            prefix = "optimizer/" if len(groups) == 1 else f"optimizer/group{i}/"
            for name, value in group.items():
                value = _hyperparameter(value) if name != "params" else None
                if value is not None:
                    out[prefix + name] = value
        for name in ("epoch_num", "batch_num", "dataset_sink_mode", "parallel_mode", "device_number",
                     "amp_level", "boost_level"):
            if p.get(name) is not None:
                out[name] = p[name]
        batch_size = getattr(p.train_dataset, "batch_size", None)
        if isinstance(batch_size, int) and not isinstance(batch_size, bool):
            out["batch_size"] = batch_size
        else:  # found on the first batch instead
            self._batch_size_pending = True
        out.update(self.params)
        return {_key(k): str(v) for k, v in out.items()}

    def _metric(self, name: str, value: float, step: int):
        from mlflow.entities import Metric

        return Metric(_key(name), value, int(time.time() * 1000), step)

    def _train_metrics(self, p, step: int) -> list:
        out = []
        outputs = p.net_outputs
        loss = loss_value(outputs)  # the host sync happens only when logging
        if loss is not None:
            out.append(self._metric("train/loss", loss, step))
        if isinstance(outputs, (tuple, list)) and len(outputs) == 3:
            scale = loss_value(outputs[2])
            if scale is not None:
                out.append(self._metric("train/loss_scale", scale, step))
        groups = getattr(p.optimizer, "param_groups", None) or []
        for i, group in enumerate(groups):
            tag = "train/lr" if len(groups) == 1 else f"train/lr/group{i}"
            out.append(self._metric(tag, float(group["lr"]), step))
        return out

    def _result_metrics(self, results: Mapping, step: int) -> list:
        return [self._metric(f"eval/{name}", value, step) for name, value in scalar_results(_OWNER, results)]

    def _prequential_metrics(self, p) -> list:
        """A `PrequentialMonitor` report not logged yet (it sets ``cb_params.prequential``)."""
        report = p.prequential
        if not report or report.get("step") == self._prequential_step:
            return []
        self._prequential_step = report.get("step")
        step = self._step_offset + (report.get("step") or 0)
        return [self._metric(f"prequential/{name}", float(report[name]), step)
                for name in _PREQUENTIAL if report.get(name) is not None]

    # ------------------------------------------------------------------ hooks
    def on_train_begin(self, run_context):
        p = run_context.original_args()
        self._open_run()
        start = p.cur_step_num or 0
        # Model.train counts from 0 again after a restore: continue this run's axis instead.
        self._step_offset = self._global_step - start if start < self._global_step else 0
        self._global_step = self._last_logged_step = self._step_offset + start
        self._prequential_step = None
        self._batch_size_pending = False
        if self.log_params:
            self._send(params=self._run_params(p))

    def on_train_step_end(self, run_context):
        p = run_context.original_args()
        self._global_step = step = self._step_offset + p.cur_step_num
        metrics, params = [], None
        if self._batch_size_pending:
            self._batch_size_pending = False
            size = batch_rows(p.train_dataset_element)
            params = None if size is None else {"batch_size": str(size)}
        if self.log_every_n_steps != "epoch" and step - self._last_logged_step >= self.log_every_n_steps:
            self._last_logged_step = step
            metrics = self._train_metrics(p, step)
        if p.prequential:
            metrics += self._prequential_metrics(p)
        if metrics or params:
            self._send(metrics, params)

    def on_train_epoch_end(self, run_context):
        p = run_context.original_args()
        self._global_step = step = self._step_offset + (p.cur_step_num or 0)
        metrics = self._train_metrics(p, step) if self.log_every_n_steps == "epoch" else []
        results = p.eval_results or p.metrics
        if results:
            metrics += self._result_metrics(results, step)
        if p.prequential:
            metrics += self._prequential_metrics(p)
        self._send(metrics)

    def on_train_end(self, run_context):
        p = run_context.original_args()
        if p.prequential:  # the final report of a PrequentialMonitor placed before this logger
            self._send(self._prequential_metrics(p))
        self._end_run("FINISHED")

    def on_eval_end(self, run_context):
        # Standalone Model.eval: place the point at the last training step seen (0 if none).
        metrics = run_context.original_args().metrics
        if not metrics:
            return
        opened_here = self._run_id is None
        if opened_here:
            self._open_run()
        self._send(self._result_metrics(metrics, self._global_step))
        if opened_here:
            self._end_run("FINISHED")

    def __exit__(self, exc_type, exc, tb):
        # on_train_end does not run when training raises: end the run here, marked as failed.
        if self._owns_run:
            status = "KILLED" if exc_type is not None and issubclass(exc_type, KeyboardInterrupt) else (
                "FAILED" if exc_type is not None else "FINISHED")
            try:
                self._end_run(status)
            except Exception as e:  # never hide the training's own exception behind a logging one
                if exc_type is None:
                    raise
                warnings.warn(f"{_OWNER}: could not end MLflow run {self._run_id}: {e}", RuntimeWarning, stacklevel=2)
        return None

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict:
        """``{"run_id", "step"}``: enough for a restored logger to continue the same run and step axis."""
        return {"run_id": self._run_id, "step": self._global_step}

    def load_state_dict(self, state: dict) -> None:
        """Continue the run saved by `state_dict` (its id and last step)."""
        owner = f"{_OWNER}.load_state_dict"
        check_type(owner, "state", state, dict)
        if set(state) != {"run_id", "step"}:
            raise ValueError(f"{owner}: 'state' must have the keys ['run_id', 'step'] (from "
                             f"MLflowLogger.state_dict()), got {sorted(state)}")
        self._run_id = check_str(owner, "state['run_id']", state["run_id"], allow_none=True)
        self._global_step = check_int(owner, "state['step']", state["step"], minimum=0)

