"""Load full tables into a row-sharded EmbeddingBagCollection on N ranks and gather them back.

    torchrun --nproc_per_node=N reshard_worker.py IN.safetensors OUT.safetensors

Rank 0 writes what `state_dict()` gathers from the shards, plus each rank's shard row count.
"""
from __future__ import annotations

import json
import sys

import torch
from safetensors.torch import load_file, save_file

from recstream import distributed
from recstream.nn import EmbeddingBagCollection, EmbeddingTableConfig

TABLES = [EmbeddingTableConfig("user", 101, 4), EmbeddingTableConfig("item", 37, 4),
          EmbeddingTableConfig("tags", 12, 8, pooling="mean")]


def main(source: str, target: str) -> None:
    torch.set_num_threads(1)
    distributed.init()
    ebc = EmbeddingBagCollection(TABLES).shard_rows_()
    ebc.load_state_dict(load_file(source))
    rows = torch.tensor([p.shape[0] for p in ebc.parameters()])
    counts = [torch.zeros_like(rows) for _ in range(distributed.world_size())]
    torch.distributed.all_gather(counts, rows)
    gathered = ebc.state_dict()
    if distributed.rank() == 0:
        save_file(gathered, target, metadata={"shard_rows": json.dumps([c.tolist() for c in counts])})
    distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
