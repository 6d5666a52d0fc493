"""Small deterministic schemas and data for the model tests (independent of SyntheticCTR,
so pinned values depend only on recstream.models, nn, optim, train and torch)."""
from __future__ import annotations

import torch

from recstream.data import Batch, CategoricalFeature, Features, Schema
from recstream.models import DLRM, DCNv2, DeepFM, WideDeep

SMALL = dict(hidden=(16, 8), embedding_dim=4)
BUILDERS = {
    "widedeep": lambda s, **kw: WideDeep(s, **{**SMALL, **kw}),
    "deepfm": lambda s, **kw: DeepFM(s, **{**SMALL, **kw}),
    "dcnv2": lambda s, **kw: DCNv2(s, num_cross_layers=2, **{**SMALL, **kw}),
    "dcnv2_parallel_lowrank": lambda s, **kw: DCNv2(s, num_cross_layers=2, structure="parallel", low_rank=3,
                                                    **{**SMALL, **kw}),
    "dlrm": lambda s, **kw: DLRM(s, bottom=(8,), top=(16,), embedding_dim=kw.pop("embedding_dim", 4), **kw),
}
MODEL_NAMES = list(BUILDERS)


def mixed_schema(num_dense: int = 3) -> Schema:
    """Single-hot, multi-hot sum and multi-hot mean features, with unequal schema widths."""
    return Schema([f"d{i}" for i in range(num_dense)], [
        CategoricalFeature("user", vocab_size=30, embedding_dim=4),
        CategoricalFeature("item", hash_buckets=50, embedding_dim=8),
        CategoricalFeature("tags", vocab_size=20, multi_hot=True, pooling="sum", embedding_dim=4),
        CategoricalFeature("hist", vocab_size=40, multi_hot=True, pooling="mean", embedding_dim=4),
    ])


def random_features(schema: Schema, batch_size: int, generator: torch.Generator,
                    max_len: int = 3) -> Features:
    """Random ids (multi-hot bags of 0..max_len ids, single-hot bags of exactly one)."""
    lengths = []
    for f in schema.categorical:
        if f.multi_hot:
            lengths.append(torch.randint(0, max_len + 1, (batch_size,), generator=generator))
        else:
            lengths.append(torch.ones(batch_size, dtype=torch.int64))
    lengths = torch.stack(lengths)
    values = [torch.randint(0, f.num_embeddings, (int(lengths[i].sum()),), generator=generator)
              for i, f in enumerate(schema.categorical)]
    dense = torch.randn(batch_size, schema.num_dense, generator=generator)
    return Features.from_lengths(dense, torch.cat(values), lengths)


class LogisticData:
    """A re-iterable list of Batches with labels from a hidden logistic model: per-id
    effects (summed over each bag) plus a dense linear term. Deterministic given seed."""

    def __init__(self, schema: Schema, num_batches: int, batch_size: int, seed: int = 0, truth_seed: int = 123):
        g = torch.Generator().manual_seed(truth_seed)
        effects = [torch.randn(f.num_embeddings, generator=g) * 1.5 for f in schema.categorical]
        w = torch.randn(schema.num_dense, generator=g)
        g = torch.Generator().manual_seed(seed)
        self.batches = []
        for _ in range(num_batches):
            x = random_features(schema, batch_size, g)
            logit = x.dense @ w - 0.5
            for i, eff in enumerate(effects):
                ids, offs = x.bag(i)
                bag_of = torch.repeat_interleave(torch.arange(batch_size), offs[1:] - offs[:-1])
                logit = logit.index_add(0, bag_of, eff[ids])
            labels = (torch.rand(batch_size, generator=g) < torch.sigmoid(logit)).float()
            self.batches.append(Batch(x, labels))

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)
