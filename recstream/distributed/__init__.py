"""Training on several processes with `torch.distributed` (launched by ``torchrun``).

- `init()` / `shutdown()`: join the process group ``torchrun`` describes, and leave it (no-ops in
  a plain process).
- `set_auto_parallel_context(parallel_mode=...)`, `get_auto_parallel_context(key)`,
  `reset_auto_parallel_context()`: how `Model` trains ("stand_alone", "data_parallel" or
  "hybrid_parallel").
- `rank()`, `world_size()`, `is_distributed()`.
- `shard(dataset)`: this rank's rows of each batch.
- `data_parallel(network)` / `hybrid_parallel(network)`: the training module `Model` builds in
  those modes; `sharding_plan(network)` describes where sharded rows live.
- `Lockstep(stream)`: one rank's stream handing out batches in step with the other ranks (online
  training under ``torchrun``: `RecModel.online_train` wraps its stream in it).
- `all_reduce_metrics(metrics)`: metric accumulators merged over all ranks (AUC over all data).
- Sharded checkpoints (each rank writes its rows; they load into any number of ranks) are
  `recstream.checkpoint.save_sharded` / `load_sharded`, one level up.

A training script that runs unchanged under ``python train.py`` and
``torchrun --nproc_per_node=2 train.py``::

    import recstream
    from recstream import distributed
    distributed.init()
    model = recstream.Model(net, loss_fn, optimizer, metrics={"auc"})
    model.train(epochs, distributed.shard(dataset))
    distributed.shutdown()

>>> from recstream import distributed
>>> distributed.shard([1, 2]), distributed.world_size()
([1, 2], 1)
"""
from .context import (
    PARALLEL_MODES,
    get_auto_parallel_context,
    init,
    is_distributed,
    parallel_mode,
    rank,
    reset_auto_parallel_context,
    set_auto_parallel_context,
    shutdown,
    world_size,
)
from .lockstep import Lockstep, fill_batch
from .metric_reduction import all_reduce_metrics, merge_states
from .parallelize import data_parallel, hybrid_parallel, sharding_plan, sparse_parameters
from .sharding import RowShard, shard

__all__ = ["init", "shutdown", "set_auto_parallel_context", "get_auto_parallel_context",
           "reset_auto_parallel_context",
           "parallel_mode", "PARALLEL_MODES", "rank", "world_size", "is_distributed", "shard", "RowShard",
           "data_parallel", "hybrid_parallel", "sharding_plan", "sparse_parameters", "all_reduce_metrics",
           "merge_states", "Lockstep", "fill_batch"]
