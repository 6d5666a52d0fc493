"""Callbacks: code that runs at given moments of `Model.train` / `fit` / `eval` (MindSpore's API).

- `Callback`, `CallbackList`, `RunContext`, `CallbackParams`: the hook protocol and run state.
- `LossMonitor`: print the training loss every N steps.
- `TimeMonitor`: print each epoch's time and mean step time (and host data time).
- `ModelCheckpoint` + `CheckpointConfig`: save network/optimizer/RNG by steps or seconds, keep N.
- `save_checkpoint` / `load_checkpoint`: the safetensors checkpoint file itself (resume exactly).
- `EarlyStopping`: stop when a monitored metric stops improving.
- `ReduceLROnPlateau`: lower the learning rate when a monitored metric plateaus.
- `LearningRateScheduler`: set the lr from a function of the step, or drive a torch LR scheduler.
- `History`: per-epoch training loss and evaluation results.
- `LambdaCallback`: a callback made of plain functions.
- `ProgressBar`: tqdm bars with steps/s, ETA and the loss (`progress_bar_default()`: show it?).
- `TensorBoard`: write loss, learning rates and metrics for TensorBoard.
- `ModelPublisher`: publish versioned full/delta model snapshots for serving (online training).
- `PrequentialMonitor`: score each batch before training on it; rolling AUC and log loss.

`BUILTIN_CALLBACK_NAMES`: class names of the built-in callbacks; as in MindSpore, the evaluation
inside `fit` does not call them, except `TimeMonitor`.

>>> from recstream.callbacks import LossMonitor, TimeMonitor
>>> callbacks = [LossMonitor(per_print_times=100), TimeMonitor()]
"""
from .base import Callback, CallbackList, CallbackParams, RunContext
from .checkpoint_config import CheckpointConfig
from .checkpoint_io import CheckpointError, load_checkpoint, save_checkpoint
from .early_stopping import EarlyStopping
from .history import History
from .lambda_callback import LambdaCallback
from .loss_monitor import LossMonitor
from .lr_scheduler import LearningRateScheduler
from .model_checkpoint import ModelCheckpoint
from .prequential import PrequentialMonitor
from .publisher import ModelPublisher
from .progress_bar import ProgressBar, progress_bar_default
from .reduce_lr_on_plateau import ReduceLROnPlateau
from .tensorboard import TensorBoard
from .time_monitor import TimeMonitor

BUILTIN_CALLBACK_NAMES = frozenset({
    "LossMonitor", "TimeMonitor", "ModelCheckpoint", "EarlyStopping", "ReduceLROnPlateau",
    "LearningRateScheduler", "History", "LambdaCallback", "ProgressBar", "TensorBoard",
})

__all__ = [
    "Callback", "CallbackList", "RunContext", "CallbackParams", "LossMonitor", "TimeMonitor",
    "ModelCheckpoint", "CheckpointConfig", "save_checkpoint", "load_checkpoint", "CheckpointError",
    "EarlyStopping", "ReduceLROnPlateau", "LearningRateScheduler", "History", "LambdaCallback",
    "ProgressBar", "progress_bar_default", "TensorBoard", "ModelPublisher", "PrequentialMonitor",
    "BUILTIN_CALLBACK_NAMES",
]
