"""`Model.summary()`: what a network holds and what it costs in memory, as a plain-text table.

Per top-level module: type, parameters (trainable), bytes of parameters and buffers. Then every
embedding table (``nn.Embedding`` / ``nn.EmbeddingBag``, the tables of an
`EmbeddingBagCollection`, a `HashEmbedding`'s capacity): rows, width, bytes, and whether its
gradients are sparse. Then the optimizer's state bytes (moments, accumulators), which for a CTR
model are often larger than the weights. Bytes are counted from the tensors themselves, so a
sharded table counts this rank's rows.

>>> import torch
>>> net = torch.nn.Sequential(torch.nn.Embedding(1000, 8), torch.nn.Flatten(), torch.nn.Linear(16, 1))
>>> print(summarize(net, torch.optim.Adam(net.parameters())).splitlines()[0])
module  type       parameters  trainable  bytes
"""
from __future__ import annotations

import torch
from torch import nn


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _embedding_rows(network: nn.Module) -> list[list[str]]:
    rows = []
    for name, m in network.named_modules():
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)):
            rows.append([name, f"{m.num_embeddings:,}", str(m.embedding_dim), _human(_bytes([m.weight])),
                         str(bool(m.sparse))])
        elif hasattr(m, "tables") and all(hasattr(t, "num_embeddings") for t in getattr(m, "tables", ())):
            for t in m.tables:  # an EmbeddingBagCollection: one fused storage, listed per table
                size = t.num_embeddings * t.embedding_dim * 4
                rows.append([f"{name}.{t.name}", f"{t.num_embeddings:,}", str(t.embedding_dim), _human(size),
                             str(bool(getattr(m, "sparse", False)))])
        elif hasattr(m, "embedding_size") and hasattr(m, "capacity"):  # a HashEmbedding
            rows.append([name, f"{m.capacity:,} (hash)", str(m.embedding_size),
                         _human(_bytes(m.parameters()) + _bytes(m.buffers())), str(bool(m.sparse))])
    return rows


def summarize(network: nn.Module, optimizer=None) -> str:
    """The summary text of `network` (and `optimizer`'s state); see the module docstring."""
    rows = [["module", "type", "parameters", "trainable", "bytes"]]
    children = list(network.named_children()) or [("", network)]
    for name, m in children:
        params = list(m.parameters())
        rows.append([name or "(network)", type(m).__name__, f"{sum(p.numel() for p in params):,}",
                     f"{sum(p.numel() for p in params if p.requires_grad):,}",
                     _human(_bytes(params) + _bytes(m.buffers()))])
    total = list(network.parameters())
    rows.append(["total", "", f"{sum(p.numel() for p in total):,}",
                 f"{sum(p.numel() for p in total if p.requires_grad):,}",
                 _human(_bytes(total) + _bytes(network.buffers()))])
    lines = _table(rows)
    tables = _embedding_rows(network)
    if tables:
        lines += ["", *_table([["embedding table", "rows", "dim", "bytes", "sparse grads"], *tables])]
    if optimizer is not None:
        state = [v for s in getattr(optimizer, "state", {}).values() for v in s.values() if isinstance(v, torch.Tensor)]
        note = "" if state else " (created at the first step)"
        lines += ["", f"optimizer {type(optimizer).__name__}: state {_human(_bytes(state))}{note}"]
    return "\n".join(lines)
