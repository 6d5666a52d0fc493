"""Shared pieces of the serving tests: a network with a HashEmbedding, its factory, data, training.

``build`` is importable as ``tests.serving.helpers:build`` so a server SUBPROCESS can rebuild
the network (``recstream serve DIR --model-factory tests.serving.helpers:build``).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from recstream.data import Batch, CategoricalFeature, Features, Schema
from recstream.nn import HashEmbedding

SCHEMA = Schema(["x0", "x1"], [
    CategoricalFeature("user", hash_buckets=1000, embedding_dim=4),
    CategoricalFeature("item", vocab_size=50, embedding_dim=4),
    CategoricalFeature("tags", vocab_size=20, embedding_dim=4, multi_hot=True, max_len=3),
])
CONFIG = {"dim": 4, "capacity": 96, "evict_filter_value": None}


class HashCTR(nn.Module):
    """All categorical ids through ONE HashEmbedding (key = feature * 2**40 + id), sum-pooled per
    bag, plus a dense projection and a small MLP head; returns logits ``[B]``."""

    def __init__(self, schema: Schema, dim: int = 4, capacity: int = 96, evict_filter_value=None):
        super().__init__()
        self.schema = schema
        self.emb = HashEmbedding(dim, capacity=capacity, evict_filter_value=evict_filter_value, sparse=False)
        self.dense = nn.Linear(schema.num_dense, dim)
        self.head = nn.Sequential(nn.Linear(dim, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, features: Features) -> torch.Tensor:
        b, f = features.batch_size, features.num_features
        lengths = features.lengths().reshape(-1)
        bag = torch.repeat_interleave(torch.arange(f * b), lengths)
        feature_of_id = bag // b
        keys = features.values + feature_of_id * (1 << 40)
        rows = self.emb(keys)
        pooled = torch.zeros(f * b, rows.shape[1]).index_add_(0, bag, rows).view(f, b, -1).sum(0)
        return self.head(torch.relu(pooled + self.dense(features.dense))).squeeze(1)


def build(manifest: dict) -> HashCTR:
    """The model factory servers use: same class, schema and config as published."""
    return HashCTR(Schema.from_dict(manifest["schema"]), **manifest["model"]["config"])


def make_batch(rng: np.random.Generator, batch_size: int = 32, users: int = 300) -> Batch:
    """Random events; the label depends on the user id parity and x0, so there is signal."""
    dense = rng.standard_normal((batch_size, 2)).astype(np.float32)
    user = rng.integers(1, users, batch_size)
    item = rng.integers(0, 50, batch_size)
    n_tags = rng.integers(0, 4, batch_size)
    tags = rng.integers(0, 20, int(n_tags.sum()))
    values = torch.from_numpy(np.concatenate([user, item, tags]).astype(np.int64))
    lengths = torch.from_numpy(np.stack([np.ones(batch_size, np.int64), np.ones(batch_size, np.int64), n_tags]))
    p = 1 / (1 + np.exp(-(2.0 * (user % 2) - 1.0 + dense[:, 0])))
    labels = torch.from_numpy((rng.random(batch_size) < p).astype(np.float32))
    return Batch(Features.from_lengths(torch.from_numpy(dense), values, lengths), labels)


def train_step(net: nn.Module, opt: torch.optim.Optimizer, batch: Batch) -> float:
    net.train()
    opt.zero_grad()
    loss = nn.functional.binary_cross_entropy_with_logits(net(batch.features), batch.labels)
    loss.backward()
    opt.step()
    return float(loss.detach())


def new_model(seed: int = 0, **config) -> tuple[HashCTR, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    net = HashCTR(SCHEMA, **{**CONFIG, **config})
    return net, torch.optim.SGD(net.parameters(), lr=0.2)


def rows_map(exported: dict) -> dict:
    """{key: (values, count, last_seen)} of an export, order-independent."""
    return {int(k): (v.tolist(), int(c), int(s)) for k, v, c, s in zip(
        exported["keys"], exported["values"], exported["counts"], exported["last_seen"], strict=True)}


def predict(net: nn.Module, features: Features) -> torch.Tensor:
    was = net.training
    net.eval()
    try:
        with torch.no_grad():
            return net(features)
    finally:
        net.train(was)
