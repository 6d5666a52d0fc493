"""Synthetic Criteo-shaped CTR data with a known ground truth, in constant memory.

Each example has ``num_dense`` standard-normal dense values and ``num_categorical`` ids
drawn from a power law (Zipf-like, exponent ``zipf_alpha``) over vocabularies of up to
2**31 ids. The click label is ``Bernoulli(sigmoid(logit))`` with a hidden logit::

    logit = base_logit + w . dense + sum_f e_f(id_f) + sum_{(f, g) in pairs} c * a_f(id_f) * b_g(id_g)

Per-id values (``e``, ``a``, ``b``) are computed from a 64-bit hash of (feature, id), so a
vocabulary of 10**8 costs no memory: nothing is tabulated. Ids are scattered over the
vocabulary (rank r -> id ``(m * r + k) mod V``), so frequent ids are not simply 0, 1, 2...

Learnability: main effects are scaled by ``1 / sqrt(1 + rank / head_size)`` and
interaction factors by ``1 / (1 + rank / head_size)``. The signal sits on the frequent ids
a model sees many times; tail ids (rarely seen, impossible to learn) carry small effects:
with the defaults, knowing only the top-100 ids of each feature already gives an AUC
within 0.003 of the Bayes AUC (`bayes_auc`, the AUC of the true probabilities,
about 0.80), so simple models get close to it within a few thousand steps (how many:
docs/benchmarks.md). The interactions (worth ~0.005 AUC) reward models that capture them.

Everything is deterministic given ``seed``; batch i of the training stream and the test
split come from independent random streams, so `train_batches` can be re-iterated.

>>> gen = SyntheticCTR(num_dense=2, num_categorical=3, vocab_sizes=[10, 10**5, 10**8], batch_size=64)
>>> (features, labels), = gen.train_batches(1)
>>> features.dense.shape, features.values.shape, int(features.values.max()) < 10**8
(torch.Size([64, 2]), torch.Size([192]), True)
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import torch

from ..features import Features
from ..validation import check_int, check_number, check_type
from .batch import Batch
from .hashing import hash_int64, hash_strings, splitmix64, to_buckets
from .memory import InMemoryDataset
from .schema import CategoricalFeature, DenseFeature, Schema

_DEFAULT_VOCABS = (100, 1_000, 10_000, 100_000)
_MAX_VOCAB = 2 ** 31  # keeps (id * inverse) mod V inside int64
_TRAIN, _TEST = 0, 1  # random-stream ids
_CHUNK = 1 << 16


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (ties count one half), vectorized via ranks."""
    scores, labels = np.asarray(scores, dtype=np.float64).ravel(), np.asarray(labels).ravel() > 0.5
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"roc_auc: needs both classes, got {n_pos} positives and {n_neg} negatives")
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    avg_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based mean rank of each tie group
    rank_sum = avg_rank[inverse][labels].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def _unit(h: np.ndarray) -> np.ndarray:
    """uint64 hashes -> uniform on [-sqrt(3), sqrt(3)] (zero mean, unit variance)."""
    return ((h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 * 2.0 - 1.0) * math.sqrt(3.0)


class SyntheticCTR:
    """A CTR task with Zipf ids and a hidden logistic ground truth (see module doc)."""

    def __init__(self, num_dense: int = 13, num_categorical: int = 26, vocab_sizes: Sequence[int] | None = None,
                 zipf_alpha: float = 1.1, seed: int = 0, *, batch_size: int = 1024, embedding_dim: int = 16,
                 hash_buckets: int | None = None, head_size: float = 20.0, base_logit: float = -1.2,
                 dense_scale: float = 0.6, id_scale: float = 0.45, interaction_scale: float = 0.35,
                 num_interactions: int = 4) -> None:
        owner = "SyntheticCTR"
        self.num_dense = check_int(owner, "num_dense", num_dense, minimum=0)
        self.num_categorical = check_int(owner, "num_categorical", num_categorical, minimum=0)
        num_interactions = check_int(owner, "num_interactions", num_interactions, minimum=0)
        if num_dense + num_categorical == 0:
            raise ValueError("SyntheticCTR: needs at least one dense or categorical feature")
        if vocab_sizes is None:
            vocab_sizes = [_DEFAULT_VOCABS[i % len(_DEFAULT_VOCABS)] for i in range(num_categorical)]
        vocab_sizes = list(check_type(owner, "vocab_sizes", vocab_sizes, Sequence, allowed="a sequence of ints"))
        if len(vocab_sizes) != num_categorical:
            raise ValueError(f"SyntheticCTR: 'vocab_sizes' needs {num_categorical} entries, got {len(vocab_sizes)}")
        self.vocab_sizes = [check_int(owner, f"vocab_sizes[{i}]", v, minimum=1, maximum=_MAX_VOCAB)
                            for i, v in enumerate(vocab_sizes)]
        self.zipf_alpha = check_number(owner, "zipf_alpha", zipf_alpha, minimum=0)
        self.seed = check_int(owner, "seed", seed, minimum=0)
        self.head_size = check_number(owner, "head_size", head_size, minimum=0, min_open=True)
        self.batch_size = check_int(owner, "batch_size", batch_size, minimum=1)
        self.hash_buckets = check_int(owner, "hash_buckets", hash_buckets, minimum=2, allow_none=True)
        self.base_logit = check_number(owner, "base_logit", base_logit)
        for name, value in (("dense_scale", dense_scale), ("id_scale", id_scale),
                            ("interaction_scale", interaction_scale)):
            check_number(owner, name, value, minimum=0)
        self.schema = self._make_schema(embedding_dim, hash_buckets)
        self._make_truth(dense_scale, id_scale, interaction_scale, num_interactions)

    # --- setup ---------------------------------------------------------------------------
    def _make_schema(self, embedding_dim: int, hash_buckets: int | None) -> Schema:
        cats = []
        for i, v in enumerate(self.vocab_sizes):
            hashed = hash_buckets is not None and v > hash_buckets
            cats.append(CategoricalFeature(f"C{i + 1}", vocab_size=None if hashed else v,
                                           hash_buckets=hash_buckets if hashed else None,
                                           embedding_dim=embedding_dim))
        return Schema([DenseFeature(f"I{i + 1}") for i in range(self.num_dense)], cats)

    def _make_truth(self, dense_scale: float, id_scale: float, interaction_scale: float, n_pairs: int) -> None:
        rng = np.random.default_rng([self.seed, 7919])
        nf = self.num_categorical
        self.dense_weights = rng.normal(0.0, dense_scale / math.sqrt(max(self.num_dense, 1)), self.num_dense)
        self.id_scales = id_scale * rng.uniform(0.4, 1.0, nf)  # some features matter more
        self._keys = rng.integers(0, 2 ** 63, size=(3, nf), dtype=np.int64).view(np.uint64)
        self._mult, self._add, self._inv = [], [], []
        for v in self.vocab_sizes:  # per feature (not per id): an affine bijection rank -> id
            m = int(rng.integers(1, v)) if v > 1 else 1
            while math.gcd(m, v) != 1:
                m += 1
            self._mult.append(m)
            self._add.append(int(rng.integers(0, v)))
            self._inv.append(pow(m, -1, v) if v > 1 else 0)
        pairs = [(f, g) for f in range(nf) for g in range(f + 1, nf)]
        chosen = rng.choice(len(pairs), size=min(n_pairs, len(pairs)), replace=False) if pairs else []
        self.pairs = [pairs[i] for i in sorted(chosen)]
        self.interaction_scale = float(interaction_scale)

    # --- ground truth --------------------------------------------------------------------
    def _ranks(self, f: int, ids: np.ndarray) -> np.ndarray:
        v = self.vocab_sizes[f]
        return ((ids - self._add[f]) % v) * self._inv[f] % v

    def _value(self, which: int, f: int, ids: np.ndarray, ranks: np.ndarray) -> np.ndarray:
        """Hash-derived per-id value, shrunk on rare ids: which=0 main effect (by
        1/sqrt(1 + rank/head)), 1/2 interaction factors (by 1/(1 + rank/head): products
        of two ids are harder to learn, so they sit on the most frequent ids)."""
        h = splitmix64(hash_int64(ids) ^ self._keys[which, f])
        shrink = 1.0 + ranks / self.head_size
        return _unit(h) / (np.sqrt(shrink) if which == 0 else shrink)

    def id_effect(self, feature: int, ids) -> np.ndarray:
        """Main effect on the logit of raw ids of categorical `feature` (any vocab size, O(len(ids)))."""
        check_int("SyntheticCTR.id_effect", "feature", feature, minimum=0, maximum=self.num_categorical - 1)
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_sizes[feature]):
            raise ValueError(f"SyntheticCTR.id_effect: 'ids' must be in [0, {self.vocab_sizes[feature]}) "
                             f"for feature {feature}")
        return self.id_scales[feature] * self._value(0, feature, ids, self._ranks(feature, ids))

    def _sample(self, rng: np.random.Generator, n: int) -> tuple[Batch, np.ndarray]:
        """n examples and their true click probabilities."""
        dense = rng.standard_normal((n, self.num_dense), dtype=np.float32)
        logit = self.base_logit + dense.astype(np.float64) @ self.dense_weights
        nf, a = self.num_categorical, self.zipf_alpha
        ids, ranks = np.empty((nf, n), dtype=np.int64), np.empty((nf, n), dtype=np.int64)
        for f, v in enumerate(self.vocab_sizes):  # per feature, vectorized over rows
            u = rng.random(n)
            x = (v + 1.0) ** u if a == 1.0 else (1.0 + u * ((v + 1.0) ** (1.0 - a) - 1.0)) ** (1.0 / (1.0 - a))
            ranks[f] = np.minimum(np.floor(x).astype(np.int64) - 1, v - 1)
            ids[f] = (self._mult[f] * ranks[f] + self._add[f]) % v
            logit += self.id_scales[f] * self._value(0, f, ids[f], ranks[f])
        for f, g in self.pairs:
            logit += self.interaction_scale * (self._value(1, f, ids[f], ranks[f]) *
                                               self._value(2, g, ids[g], ranks[g]))
        p = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(n) < p).astype(np.float32)
        return Batch(self._features(dense, ids), torch.from_numpy(labels)), p

    def _features(self, dense: np.ndarray, ids: np.ndarray) -> Features:
        out = ids.copy()
        for f, feat in enumerate(self.schema.categorical):
            if feat.hashed:  # hash the decimal text, exactly as the file readers would
                out[f] = to_buckets(hash_strings(pa.array(ids[f]).cast(pa.string())), feat.hash_buckets)
        nf, n = ids.shape
        offsets = torch.from_numpy(np.arange(nf * n + 1, dtype=np.int64))  # single-hot: one id per bag
        return Features(torch.from_numpy(dense), torch.from_numpy(out.reshape(-1)), offsets, n, nf,
                        keys=self.schema.categorical_names)

    # --- public streams ------------------------------------------------------------------
    def train_batches(self, n: int, start: int = 0) -> SyntheticBatches:
        """`n` training batches (batch indices ``start .. start+n-1``), re-iterable."""
        n = check_int("SyntheticCTR.train_batches", "n", n, minimum=0)
        return SyntheticBatches(self, n, check_int("SyntheticCTR.train_batches", "start", start, minimum=0))

    def _test_chunks(self, n_rows: int, owner: str) -> Iterator[tuple[Batch, np.ndarray]]:
        check_int(owner, "n_rows", n_rows, minimum=2)
        for i, start in enumerate(range(0, n_rows, _CHUNK)):
            yield self._sample(np.random.default_rng([self.seed, _TEST, i]), min(_CHUNK, n_rows - start))

    def test_split(self, n_rows: int, batch_size: int | None = None) -> InMemoryDataset:
        """A held-out set of `n_rows` (same rows for the same seed and n_rows)."""
        check_int("SyntheticCTR.test_split", "batch_size", batch_size, minimum=1, allow_none=True)
        batch = Batch.concat([b for b, _ in self._test_chunks(n_rows, "SyntheticCTR.test_split")])
        return InMemoryDataset(batch, batch_size or self.batch_size, schema=self.schema)

    def bayes_auc(self, n_rows: int) -> float:
        """AUC of the true probabilities on ``test_split(n_rows)``: the best any model can score."""
        chunks = list(self._test_chunks(n_rows, "SyntheticCTR.bayes_auc"))
        return roc_auc(np.concatenate([p for _, p in chunks]),
                       np.concatenate([b.labels.numpy() for b, _ in chunks]))


class SyntheticBatches:
    """Re-iterable stream of training batches; batch i depends only on (seed, i).

    Made by `SyntheticCTR.train_batches`, which checks `n` and `start`.
    """

    def __init__(self, gen: SyntheticCTR, n: int, start: int = 0) -> None:
        self.gen, self.n, self.start = gen, n, start
        self.batch_size = gen.batch_size
        self.schema = gen.schema

    def get_dataset_size(self) -> int:
        return self.n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Batch]:
        for i in range(self.start, self.start + self.n):
            yield self.gen._sample(np.random.default_rng([self.gen.seed, _TRAIN, i]), self.gen.batch_size)[0]
