"""Train a WideDeep under hybrid_parallel, save/load sharded checkpoints, write what it holds.

    torchrun --nproc_per_node=N checkpoint_worker.py OUT ACTION

ACTION:

- ``save``: train batches 0-2, save ``OUT/ckpt`` (each rank's extra: its rank and step), write
  the gathered state to ``OUT/saved.safetensors``, train batches 3-4, write ``OUT/after-N.safetensors``;
- ``load``: load ``OUT/ckpt`` into N ranks, write the gathered state to ``OUT/loaded-N.safetensors``
  and the extras to ``OUT/extra-N.json``, train batches 3-4, write ``OUT/after-N.safetensors``;
- ``crash`` (RowWiseAdagrad for the tables): train batch 0, save ``OUT/first`` (and its gathered
  state, ``OUT/first.safetensors``), train batch 1, then save ``OUT/second`` with
  rank 1 killed by SIGKILL right after it wrote its shard (before the checkpoint is complete).

The gathered state (`full_state`) is built without the code under test: tables through the
collection's own gather (``state_dict()``), optimizer state by all-gathering each rank's rows.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from recstream import Model, checkpoint, distributed, set_auto_parallel_context
from recstream.data import SyntheticCTR
from recstream.models import WideDeep, default_optimizer

GLOBAL_BATCH = 48  # splits over 1, 2 and 3 ranks


def batches() -> list:
    # 121 rows in all: shards of uneven sizes on 2 ranks (61, 60) and on 3 (41, 41, 39)
    gen = SyntheticCTR(num_dense=4, num_categorical=3, vocab_sizes=[51, 40, 30], batch_size=GLOBAL_BATCH, seed=1)
    return list(gen.train_batches(5)), gen.schema


def build(embedding: str = "lazy_adam"):
    """The network, its optimizer (LazyAdam or RowWiseAdagrad + FTRL + Adam) and a Model."""
    torch.manual_seed(0)
    _, schema = batches()
    net = WideDeep(schema, hidden=(16, 8), embedding_dim=4)
    optimizer = default_optimizer(net, lr=0.01, embedding=embedding)
    model = Model(net, torch.nn.BCEWithLogitsLoss(), optimizer, progress_bar=False)  # shards under hybrid
    return net, optimizer, model


def train(model, first: int, stop: int) -> None:
    data, _ = batches()
    model.train(1, distributed.shard(data[first:stop]))


def _full(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A per-row optimizer tensor of a row-sharded parameter, all ranks' rows concatenated."""
    layout = getattr(param, "recstream_layout", None)
    if layout is None or value.dim() == 0 or not distributed.is_distributed():
        return value.detach().clone()
    parts = [None] * distributed.world_size()
    torch.distributed.all_gather_object(parts, value.detach().clone())
    return torch.cat(parts)


def full_state(net, optimizer) -> dict[str, torch.Tensor]:
    """Every weight (full tables) and every optimizer state entry (full rows), by name (collective)."""
    state = {f"model.{k}": v.detach().clone() for k, v in net.state_dict().items()}
    names = {id(p): n for n, p in net.named_parameters()}
    for leaf_name, leaf in optimizer.optimizers.items():
        for group in leaf.param_groups:
            for p in group["params"]:
                for key, value in leaf.state.get(p, {}).items():
                    value = value if isinstance(value, torch.Tensor) else torch.tensor(value)
                    state[f"optim.{leaf_name}.{names[id(p)]}.{key}"] = _full(value, p)
    return {k: v.contiguous() for k, v in state.items()}


def _write(path: Path, state: dict) -> None:
    if distributed.rank() == 0:
        save_file(state, path)


def _kill_rank_one_after_writing() -> None:
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    original = HuggingFaceStorageWriter.write_data

    def write_then_die(self, plan, planner):
        result = original(self, plan, planner)
        result.wait()
        os.kill(os.getpid(), signal.SIGKILL)
        return result

    HuggingFaceStorageWriter.write_data = write_then_die


def _refuse_pickles_from_disk() -> None:
    """Loading must read safetensors and JSON only: make a pickle read from a file fail loudly
    (collectives still unpickle their messages from memory)."""
    import io
    import pickle

    def guard(load):
        def checked(source, *args, **kwargs):
            if not isinstance(source, io.BytesIO):
                raise AssertionError(f"a pickle was loaded from {source!r}")
            return load(source, *args, **kwargs)
        return checked

    pickle.load = guard(pickle.load)
    torch.load = guard(torch.load)


def main(out: Path, action: str) -> None:
    torch.set_num_threads(1)
    distributed.init()
    set_auto_parallel_context(parallel_mode="hybrid_parallel")
    net, optimizer, model = build("rowwise_adagrad" if action == "crash" else "lazy_adam")
    n, r = distributed.world_size(), distributed.rank()
    if action == "save":
        train(model, 0, 3)
        checkpoint.save_sharded(out / "ckpt", net, optimizer, extra={"rank": r, "step": 3})
        _write(out / "saved.safetensors", full_state(net, optimizer))
    elif action == "load":
        _refuse_pickles_from_disk()
        extras = checkpoint.load_sharded(out / "ckpt", net, optimizer)
        _write(out / f"loaded-{n}.safetensors", full_state(net, optimizer))
        if r == 0:
            (out / f"extra-{n}.json").write_text(json.dumps(extras))
    else:
        train(model, 0, 1)
        checkpoint.save_sharded(out / "first", net, optimizer, extra={"rank": r, "step": 1})
        _write(out / "first.safetensors", full_state(net, optimizer))
        train(model, 1, 2)
        if r == 1:
            _kill_rank_one_after_writing()
        checkpoint.save_sharded(out / "second", net, optimizer, extra={"rank": r, "step": 2})
        return
    train(model, 3, 5)
    _write(out / f"after-{n}.safetensors", full_state(net, optimizer))
    distributed.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
