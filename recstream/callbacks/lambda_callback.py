"""LambdaCallback: a callback made of plain functions, one per hook (MindSpore's).

Each argument is ``None`` or a function taking the `RunContext`.

>>> seen = []
>>> cb = LambdaCallback(on_train_epoch_end=lambda ctx: seen.append(ctx.original_args().cur_epoch_num))
"""
from __future__ import annotations

from ..validation import check_callable
from .base import HOOKS, Callback


def _noop(run_context):
    return None


class LambdaCallback(Callback):
    """Call the given function at each hook; hooks left as None do nothing."""

    called_in_fit_eval = False

    def __init__(self, on_train_epoch_begin=None, on_train_epoch_end=None, on_train_step_begin=None,
                 on_train_step_end=None, on_train_begin=None, on_train_end=None,
                 on_eval_epoch_begin=None, on_eval_epoch_end=None, on_eval_step_begin=None,
                 on_eval_step_end=None, on_eval_begin=None, on_eval_end=None):
        given = dict(locals())
        self._fns = {}
        for hook in HOOKS:
            fn = check_callable("LambdaCallback", hook, given[hook], allow_none=True)
            self._fns[hook] = fn or _noop

    # Defined on the class (not as instance attributes, as MindSpore does) because CallbackList
    # decides which hooks to dispatch by looking at the class.
    def on_train_begin(self, run_context): self._fns["on_train_begin"](run_context)
    def on_train_epoch_begin(self, run_context): self._fns["on_train_epoch_begin"](run_context)
    def on_train_step_begin(self, run_context): self._fns["on_train_step_begin"](run_context)
    def on_train_step_end(self, run_context): self._fns["on_train_step_end"](run_context)
    def on_train_epoch_end(self, run_context): self._fns["on_train_epoch_end"](run_context)
    def on_train_end(self, run_context): self._fns["on_train_end"](run_context)
    def on_eval_begin(self, run_context): self._fns["on_eval_begin"](run_context)
    def on_eval_epoch_begin(self, run_context): self._fns["on_eval_epoch_begin"](run_context)
    def on_eval_step_begin(self, run_context): self._fns["on_eval_step_begin"](run_context)
    def on_eval_step_end(self, run_context): self._fns["on_eval_step_end"](run_context)
    def on_eval_epoch_end(self, run_context): self._fns["on_eval_epoch_end"](run_context)
    def on_eval_end(self, run_context): self._fns["on_eval_end"](run_context)
