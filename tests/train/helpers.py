"""Small networks and datasets shared by the train tests."""
import torch

from recstream import Model
from recstream.callbacks.base import Callback


def batches(n_batches=5, batch=4, seed=0, features=4):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch, features, generator=g)
        out.append((x, (x[:, 0] > 0).long()))
    return out


def linear_model(metrics=None, **kwargs):
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    return Model(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                 metrics=metrics, progress_bar=False, **kwargs)


class MSDataset:
    """A MindSpore-style dataset: get_dataset_size() and reset(), iterated anew after reset."""

    def __init__(self, data):
        self.data, self.resets, self.iters = data, 0, 0

    def get_dataset_size(self):
        return len(self.data)

    def reset(self):
        self.resets += 1

    def __iter__(self):
        self.iters += 1
        return iter(self.data)


class Recorder(Callback):
    """Records (hook, cur_epoch_num, cur_step_num) and lets a test stop the run at a hook."""

    def __init__(self, stop_at=None):
        self.calls, self.stop_at, self.params = [], stop_at, None

    def _rec(self, name, ctx):
        p = ctx.original_args()
        self.params = p
        self.calls.append((name, p.cur_epoch_num, p.cur_step_num))
        if self.stop_at == (name, p.cur_epoch_num, p.cur_step_num):
            ctx.request_stop()

    def on_train_begin(self, ctx): self._rec("train_begin", ctx)
    def on_train_epoch_begin(self, ctx): self._rec("epoch_begin", ctx)
    def on_train_step_begin(self, ctx): self._rec("step_begin", ctx)
    def on_train_step_end(self, ctx): self._rec("step_end", ctx)
    def on_train_epoch_end(self, ctx): self._rec("epoch_end", ctx)
    def on_train_end(self, ctx): self._rec("train_end", ctx)
    def on_eval_begin(self, ctx): self._rec("eval_begin", ctx)
    def on_eval_end(self, ctx): self._rec("eval_end", ctx)
