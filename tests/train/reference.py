"""Rebuild the MindSpore reference scenarios (data, network, optimizer) from the recipe."""
import json
from pathlib import Path

import numpy as np
import torch

from recstream.callbacks.base import Callback

REFERENCE_PATH = Path(__file__).resolve().parents[1] / "data_files" / "mindspore_reference.json"


def load_reference() -> dict:
    return json.loads(REFERENCE_PATH.read_text())


def make_data(n: int, seed: int, batch: int = 4):
    """rng = default_rng(seed); x ~ N(0,1) (n,4) float32; y = (x @ [1,-1,0.5,0] > 0); batches in order."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    y = (x @ np.array([1, -1, 0.5, 0]) > 0).astype(np.int64)
    return [(torch.from_numpy(x[i:i + batch]), torch.from_numpy(y[i:i + batch])) for i in range(0, n, batch)]


def make_network(ref: dict) -> torch.nn.Linear:
    net = torch.nn.Linear(4, 2)
    with torch.no_grad():
        net.weight.copy_(torch.tensor(ref["init"]["weight"]))
        net.bias.copy_(torch.tensor(ref["init"]["bias"]))
    return net


class Trace(Callback):
    """Records every hook with the fields the reference recorded."""

    HOOKS = ("on_train_begin", "on_train_epoch_begin", "on_train_step_begin", "on_train_step_end",
             "on_train_epoch_end", "on_train_end", "on_eval_begin", "on_eval_epoch_begin",
             "on_eval_step_begin", "on_eval_step_end", "on_eval_epoch_end", "on_eval_end")

    def __init__(self):
        self.events = []
        for hook in self.HOOKS:
            setattr(self, hook, self._recorder(hook))

    def _recorder(self, hook):
        def record(run_context):
            p = run_context.original_args()
            event = {"hook": hook, "epoch": p.get("cur_epoch_num"), "step": p.get("cur_step_num"),
                     "batch_num": p.get("batch_num"), "epoch_num": p.get("epoch_num")}
            if hook == "on_train_step_end":
                event["loss"] = float(p.net_outputs)
            if p.get("metrics") is not None:
                event["metrics"] = dict(p.metrics)
            if p.get("eval_results") is not None:
                event["eval_results"] = dict(p.eval_results)
            self.events.append(event)
        return record
