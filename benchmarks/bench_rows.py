"""One table of ROWS rows: training-step time and peak memory, fused table vs HashEmbedding.

Run one configuration per process (``python -m benchmarks`` does, so that the peak resident
memory of each is its own): batch 1024 single-id lookups from a power law over the rows, dim 16,
row-wise Adagrad (the lean optimizer state a large table wants); the HashEmbedding gets
``capacity = rows`` and keys from the same id space. Prints one JSON line: rows, kind, median
ms per step, peak RSS MiB, and the bytes of the table's tensors.

    python benchmarks/bench_rows.py 1000000 fused
"""
from __future__ import annotations

import json
import math
import resource
import statistics
import sys
import time

import torch

from recstream.nn import EmbeddingBagCollection, EmbeddingTableConfig, HashEmbedding
from recstream.optim import RowWiseAdagrad


def _peak_rss_mib() -> float:
    """This process's peak resident memory. VmHWM, not getrusage's ru_maxrss: the latter keeps the
    parent's peak across fork + exec, so every child would report its parent's."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024  # not Linux: best effort


def main(rows: int, kind: str, steps: int = 20, batch: int = 1024, dim: int = 16, threads: int = 1) -> dict:
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    u = torch.rand(steps + 3, batch, generator=gen, dtype=torch.float64)
    ids = (torch.exp(u * math.log(rows + 1)) - 1).long().clamp_(0, rows - 1)  # P(k) ~ 1/(k+1)
    if kind == "fused":
        module = EmbeddingBagCollection([EmbeddingTableConfig("t", rows, dim)], sparse=True)
        offsets = torch.arange(batch + 1)

        def forward(x):  # trusted input: no per-call validation (it costs host syncs)
            return module(x, offsets, batch, validate=False)
    elif kind == "hash":
        module = HashEmbedding(dim, capacity=rows, permit_filter_value=1)

        def forward(x):
            return module(x)
    else:
        raise ValueError(f"kind must be 'fused' or 'hash', got {kind!r}")
    opt = RowWiseAdagrad(module.parameters(), lr=0.05)
    times = []
    for i in range(steps + 3):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        forward(ids[i]).pow(2).mean().backward()
        opt.step()
        if i >= 3:
            times.append(time.perf_counter() - start)
    tensors = [*module.parameters(), *module.buffers()]
    result = {"rows": rows, "kind": kind, "ms_per_step": 1e3 * statistics.median(times),
              "peak_rss_mib": _peak_rss_mib(),
              "table_mib": sum(t.numel() * t.element_size() for t in tensors) / 2 ** 20}
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
