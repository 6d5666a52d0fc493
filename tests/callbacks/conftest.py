"""Helpers for driving callbacks by hand, in the loop's hook order (`Model._train_loop`)."""
import pytest
import torch

from recstream.callbacks.base import CallbackList, CallbackParams, RunContext


class Driver:
    """Fake training run: calls hooks like `Model._train_loop`, with scripted losses and eval results.

    ``losses[e][s]`` is the loss tensor of step s of epoch e (0-based lists); ``eval_results``
    maps an epoch number to the dict set before that epoch's ``on_train_epoch_end``.
    """

    def __init__(self, callbacks, network=None, optimizer=None, batch_num=4, epoch_num=3,
                 sink_size=None, initial_epoch=0):
        self.cbs = CallbackList(callbacks)
        self.p = CallbackParams(network=network, train_network=network, optimizer=optimizer,
                                epoch_num=epoch_num, batch_num=sink_size or batch_num, mode="train",
                                cur_step_num=0, dataset_sink_mode=sink_size is not None)
        self.ctx = RunContext(self.p)
        self.sink_size = sink_size
        self.initial_epoch = initial_epoch

    def run(self, losses=None, eval_results=None, on_step=None):
        p, ctx, cbs = self.p, self.ctx, self.cbs
        eval_results = eval_results or {}
        stride = self.sink_size or 1
        with cbs:
            cbs.on_train_begin(ctx)
            for e in range(self.initial_epoch + 1, self.initial_epoch + p.epoch_num + 1):
                p.cur_epoch_num = e
                cbs.on_train_epoch_begin(ctx)
                steps = p.batch_num // stride if self.sink_size else p.batch_num
                for s in range(steps):
                    p.cur_step_num += stride
                    cbs.on_train_step_begin(ctx)
                    if on_step is not None:
                        on_step(p)
                    loss = losses[e - 1 - self.initial_epoch][s] if losses else 1.0 / p.cur_step_num
                    p.net_outputs = torch.tensor(float(loss))
                    cbs.on_train_step_end(ctx)
                    if ctx.get_stop_requested():
                        break
                if e in eval_results:
                    p.metrics = {k: v for k, v in eval_results[e].items() if k != "eval_loss"}
                    p.eval_results = dict(eval_results[e])
                cbs.on_train_epoch_end(ctx)
                p.pop("metrics", None)
                p.pop("eval_results", None)
                if ctx.get_stop_requested():
                    break
            cbs.on_train_end(ctx)
        return self


@pytest.fixture
def driver():
    return Driver


@pytest.fixture
def ctx_of():
    def make(**fields):
        return RunContext(CallbackParams(**fields))
    return make
