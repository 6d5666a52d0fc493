"""`RunState`: what the loop knows about the run right now, as typed, documented attributes.

The training and evaluation loops (`recstream.train.Model`) own one `RunState` per run and write
it in place (attribute stores only: nothing is allocated per step). Callbacks read it, either
directly (``run_context.run_state``) or under MindSpore's names through `CallbackParams`
(``cb_params.cur_step_num`` is ``state.step``), which is a view of it: both always agree.

Why typed: the online exactly-once protocol (position -> durable checkpoint -> commit) rides on
these fields; a misspelt key of a string-keyed dict would read as None and silently commit
nothing, or the wrong thing.

>>> state = RunState(mode="train", epoch=1, step=3)
>>> state.step, state.position, state.metrics
(3, None, None)
>>> state.end_epoch()  # the loop clears what held for one epoch only
>>> state.metrics is None and state.eval_results is None
True
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class RunState:
    """The run's state, written by the loop; None where a field does not apply (yet).

    Attributes:
        mode: "train" or "eval" (``cb_params.mode``).
        epoch: 1-based number of the epoch being run (``cur_epoch_num``).
        epoch_num: epochs this call runs (None: endless, online) (``epoch_num``).
        step: batches trained (or evaluated) so far; in sink mode, during a sink's hooks, the step
            the sink ends on (``cur_step_num``).
        batch_num: batches per epoch (``batch_num``).
        sink_mode: whether steps are sinks of batches (``dataset_sink_mode``).
        batch: the step's first training batch (``train_dataset_element``).
        eval_batch: the evaluation batch of the current eval step (``eval_dataset_element``).
        outputs: the step's network outputs, on the device (``net_outputs``): read them only
            when needed, a read waits for the device.
        position: the source position just after the last TRAINED batch (``train_position``);
            on several ranks online, the job position of every rank (``{"step", "ranks"}``).
        batch_metas: the stream's metadata of the step's batches (``train_batch_metas``).
        metrics: evaluation results of this epoch (``metrics``); cleared at each epoch end.
        eval_results: ``fit``'s evaluation results with ``eval_loss`` (``eval_results``);
            cleared at each epoch end.
        online: whether this is `RecModel.online_train` (``online``).
        checkpoint_step: step of the last checkpoint written (``last_save_ckpt_step``).
        checkpoint_file: path of that checkpoint (``latest_ckpt_file``).
        checkpoint_position: the position that checkpoint holds, once it is durable (written,
            fsynced, renamed): what the committer may commit to the source.
        batch_observers: functions called with every batch just before it trains, also inside a
            sink (``batch_observers``); a callback appends to it at ``on_train_begin``.
        partial_batch: the weights hold part of a batch (online micro-steps interrupted by an
            exception; None otherwise): no stream position describes them, so no checkpoint may be
            written.
    """

    mode: str | None = None
    epoch: int | None = None
    epoch_num: int | None = None
    step: int | None = None
    batch_num: int | None = None
    sink_mode: bool | None = None
    batch: Any = None
    eval_batch: Any = None
    outputs: Any = None
    position: Any = None
    batch_metas: Any = None
    metrics: dict | None = None
    eval_results: dict | None = None
    online: bool | None = None
    checkpoint_step: int | None = None
    checkpoint_file: str | None = None
    checkpoint_position: Any = None
    batch_observers: list | None = field(default=None)
    partial_batch: bool | None = None

    def end_epoch(self) -> None:
        """What held for one epoch only (its evaluation) does not hold for the next."""
        self.metrics = self.eval_results = None


# MindSpore's cb_params name -> RunState attribute: the fields `CallbackParams` shows as a view.
FIELDS: dict[str, str] = {
    "mode": "mode",
    "cur_epoch_num": "epoch",
    "epoch_num": "epoch_num",
    "cur_step_num": "step",
    "batch_num": "batch_num",
    "dataset_sink_mode": "sink_mode",
    "train_dataset_element": "batch",
    "eval_dataset_element": "eval_batch",
    "net_outputs": "outputs",
    "train_position": "position",
    "train_batch_metas": "batch_metas",
    "metrics": "metrics",
    "eval_results": "eval_results",
    "online": "online",
    "last_save_ckpt_step": "checkpoint_step",
    "latest_ckpt_file": "checkpoint_file",
    "checkpoint_position": "checkpoint_position",
    "batch_observers": "batch_observers",
    "partial_batch": "partial_batch",
}
