"""Callbacks: code that runs at given moments of `Model.train` / `fit` / `eval` (MindSpore's API).

- `Callback`, `CallbackList`, `RunContext`, `CallbackParams`: the hook protocol; `RunState`: the
  loop's typed run state, which `CallbackParams` shows under MindSpore's names.
- `LossMonitor`: print the training loss every N steps.
- `TimeMonitor`: print each epoch's time and mean step time (and host data time).
- `ModelCheckpoint` + `CheckpointConfig`: save network/optimizer/RNG by steps or seconds, keep N.
- `save_checkpoint` / `load_checkpoint` / `CheckpointError`: the checkpoint file itself (resume
  exactly); defined in `recstream.checkpoint`, re-exported here.
- `EarlyStopping`: stop when a monitored metric stops improving.
- `ReduceLROnPlateau`: lower the learning rate when a monitored metric plateaus.
- `LearningRateScheduler`: set the lr from a function of the step, or drive a torch LR scheduler.
- `History`: per-epoch training loss and evaluation results (`Model.train`/`fit` return one).
- `EpochSummary`: one line per epoch on stderr (online: per interval, and one at the end), the
  default where no progress bar is drawn.
- `LambdaCallback`: a callback made of plain functions.
- `ProgressBar`: tqdm bars with steps/s, ETA and the loss (`progress_bar_default()`: show it?).
- `TensorBoard`: write loss, learning rates and metrics for TensorBoard.
- `MLflowLogger`: log loss, learning rates, metrics and run parameters to MLflow (extra ``mlflow``).
- `PrequentialMonitor`: score each batch before training on it; rolling AUC and log loss.
- `DivergenceError`: what training raises when a loss or weight becomes non-finite; nothing
  non-finite is ever checkpointed or published (`recstream.callbacks.divergence`).

- `Publisher`: a callback that runs after the step's durable checkpoint and its commit
  (``after_step_commit`` / ``after_train_commit``), whatever the order of the callback list.

Publishing model versions for serving while training is such a `Publisher`, `ModelPublisher`; it
lives with the rest of serving, in `recstream.serving`.

As in MindSpore, the evaluation inside `fit` calls user callbacks but skips the built-in ones
except `TimeMonitor`: each callback says so with its class attribute `Callback.called_in_fit_eval`.

>>> from recstream.callbacks import LossMonitor, TimeMonitor
>>> callbacks = [LossMonitor(per_print_times=100), TimeMonitor()]
>>> [cb.called_in_fit_eval for cb in callbacks]
[False, True]
"""
from ..checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .base import Callback, CallbackList, CallbackParams, Publisher, RunContext
from .checkpoint_config import CheckpointConfig
from .divergence import DivergenceError
from .early_stopping import EarlyStopping
from .epoch_summary import EpochSummary
from .history import History
from .lambda_callback import LambdaCallback
from .loss_monitor import LossMonitor
from .lr_scheduler import LearningRateScheduler
from .mlflow_logger import MLflowLogger
from .model_checkpoint import ModelCheckpoint
from .prequential import PrequentialMonitor
from .progress_bar import ProgressBar, progress_bar_default
from .reduce_lr_on_plateau import ReduceLROnPlateau
from .run_state import RunState
from .tensorboard import TensorBoard
from .time_monitor import TimeMonitor

__all__ = [
    "Callback", "CallbackList", "RunContext", "CallbackParams", "LossMonitor", "TimeMonitor",
    "ModelCheckpoint", "CheckpointConfig", "save_checkpoint", "load_checkpoint", "CheckpointError",
    "EarlyStopping", "ReduceLROnPlateau", "LearningRateScheduler", "History", "LambdaCallback",
    "ProgressBar", "progress_bar_default", "TensorBoard", "PrequentialMonitor", "EpochSummary", "MLflowLogger",
    "DivergenceError",
    "RunState", "Publisher",
]
