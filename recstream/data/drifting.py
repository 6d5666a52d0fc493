"""A synthetic online CTR stream that changes over time, with its true click probabilities: `DriftingCTR`.

Batch ``t`` (``t = 0 .. num_batches - 1``) holds ``batch_size`` events of users, items and an
item category, plus ``num_dense`` standard-normal dense values. Over time:

* **new users and items appear**: ``initial_users + users_per_batch * t`` users exist at batch
  ``t`` (likewise items); their raw ids are scattered int64 keys (``idx * odd + k mod 2**62``),
  so no fixed vocabulary could be sized in advance;
* **popularity shifts** to the newcomers: the user of an event is user ``floor(n_t * U**a)``
  (``U`` uniform, ``a = user_exponent``; 1 is uniform over everyone so far, smaller favours
  the newest), the item likewise with ``item_exponent``, so old items fade out;
* **preferences drift**: user ``u`` has a latent taste ``p_u(t) = cos(th) a_u + sin(th) b_u``
  with ``th = 2 pi t / drift_period + phi_u``, which rotates over ``drift_period`` batches.

The click is ``Bernoulli(sigmoid(logit))`` with::

    logit = base_logit + w . dense + user_scale * c_u + item_scale * c_i + category_scale * c_cat
            + affinity_scale * <p_u(t), q_i> / sqrt(dim)

Per-id values (``a_u, b_u, phi_u, c_u, q_i, c_i, c_cat``) come from a 64-bit hash of (seed, id):
nothing is tabulated, and batch ``t`` depends only on ``(seed, t)``, so the stream is
deterministic, re-iterable and random-access (`batch`). `bayes_auc` is the AUC of
the TRUE probabilities on the stream's own events of a range of batches -- what a perfect
model scores there; `bayes_curve` gives it per window, for comparison with
[`PrequentialMonitor`][recstream.callbacks.prequential.PrequentialMonitor]'s figures.

``table`` picks how ``user`` and ``item`` reach a model: ``"dynamic"`` (raw keys,
``CategoricalFeature(dynamic=True, capacity=table_size)``: a
[`HashEmbedding`][recstream.nn.hash_embedding.HashEmbedding] each), ``"shared"`` (the same, both in one hash table,
``table="ids"``, of twice the capacity) or ``"hashed"`` (``hash_buckets=table_size``,
hashed exactly as the file readers do: a fixed table of the same size, where colliding ids
share rows). ``category`` is a fixed ``vocab_size`` feature in both.

>>> gen = DriftingCTR(num_batches=50, batch_size=256, seed=1)
>>> (features, labels), = list(gen)[:1]
>>> features.keys, features.dense.shape, len(gen)
(('user', 'item', 'category'), torch.Size([256, 2]), 50)
>>> 0.6 < gen.bayes_auc(0, 50) < 0.9, gen.schema.feature("user").dynamic
(True, True)
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..features import Features
from ..validation import check_choice, check_int, check_number
from .batch import Batch
from .generated_stream import GeneratedStream
from .hashing import splitmix64
from .schema import CategoricalFeature, DenseFeature, Schema

TABLES = ("dynamic", "shared", "hashed")
_SALTS = {name: np.uint64((i * 0x632BE59BD9B4E019 + 1) % 2 ** 64) for i, name in enumerate(
    ("user_bias", "item_bias", "cat_bias", "user_a", "user_b", "user_phase", "item_q", "item_cat"))}


class DriftingCTR(GeneratedStream):
    """A drifting CTR stream with known click probabilities (see the module doc).

    Args:
        num_batches: stream length in batches.
        batch_size: events per batch.
        seed: everything is a function of ``(seed, batch index)``.
        table: ``"dynamic"``, ``"shared"`` or ``"hashed"`` user/item features (see the module doc).
        table_size: rows of each user/item table (``capacity`` or ``hash_buckets``).
        embedding_dim: width of every feature's table.
        num_dense: dense features.
        initial_users: users present at batch 0.
        users_per_batch: new users arriving with each batch.
        initial_items: items present at batch 0.
        items_per_batch: new items arriving with each batch.
        num_categories: item categories (a fixed ``vocab_size`` feature).
        user_exponent: in (0, 1]; the users' activity bias to the newest (see the module doc).
        item_exponent: in (0, 1]; the items' popularity bias to the newest (see the module doc).
        drift_period: batches for a user's taste to turn a full circle.
        dim: latent taste width.
        base_logit: the logit's intercept (above; sets the click rate).
        dense_scale: spread of the dense weights ``w`` (drawn N(0, dense_scale / sqrt(num_dense))).
        user_scale: weight of ``c_u`` in the logit.
        item_scale: weight of ``c_i`` in the logit.
        category_scale: weight of ``c_cat`` in the logit.
        affinity_scale: weight of the taste match ``<p_u(t), q_i> / sqrt(dim)`` in the logit.
        permit_filter_value: sightings before a key gets a row in the dynamic tables.
        evict_filter_value: steps unseen after which the dynamic tables evict a key.
    """

    # Odd multipliers / offsets of the id scattering (bijective mod 2**62): fixed, part of the data's meaning.
    _SCATTER = {"user": (0x9E3779B97F4A7C15, 0x1234567), "item": (0xBF58476D1CE4E5B9, 0x7654321)}

    def __init__(self, num_batches: int = 400, batch_size: int = 512, seed: int = 0, *, table: str = "dynamic",
                 table_size: int = 1 << 14, embedding_dim: int = 8, num_dense: int = 2, initial_users: int = 300,
                 users_per_batch: int = 5, initial_items: int = 200, items_per_batch: int = 4,
                 num_categories: int = 20, user_exponent: float = 0.5, item_exponent: float = 0.35,
                 drift_period: float = 400.0, dim: int = 4, base_logit: float = -1.0, dense_scale: float = 0.5,
                 user_scale: float = 1.0, item_scale: float = 1.0, category_scale: float = 0.3,
                 affinity_scale: float = 1.5, permit_filter_value: int = 1,
                 evict_filter_value: int | None = None) -> None:
        owner = "DriftingCTR"
        self.num_batches = check_int(owner, "num_batches", num_batches, minimum=1)
        self.batch_size = check_int(owner, "batch_size", batch_size, minimum=2)
        self.seed = check_int(owner, "seed", seed, minimum=0)
        self.table = check_choice(owner, "table", table, TABLES)
        self.table_size = check_int(owner, "table_size", table_size, minimum=2)
        self.num_dense = check_int(owner, "num_dense", num_dense, minimum=0)
        self.initial_users = check_int(owner, "initial_users", initial_users, minimum=1)
        self.users_per_batch = check_int(owner, "users_per_batch", users_per_batch, minimum=0)
        self.initial_items = check_int(owner, "initial_items", initial_items, minimum=1)
        self.items_per_batch = check_int(owner, "items_per_batch", items_per_batch, minimum=0)
        self.num_categories = check_int(owner, "num_categories", num_categories, minimum=1)
        self.user_exponent = check_number(owner, "user_exponent", user_exponent, minimum=0, min_open=True, maximum=1)
        self.item_exponent = check_number(owner, "item_exponent", item_exponent, minimum=0, min_open=True, maximum=1)
        self.drift_period = check_number(owner, "drift_period", drift_period, minimum=0, min_open=True)
        self.dim = check_int(owner, "dim", dim, minimum=1)
        self.base_logit = check_number(owner, "base_logit", base_logit)
        self.scales = {name: check_number(owner, name, value, minimum=0) for name, value in (
            ("dense_scale", dense_scale), ("user_scale", user_scale), ("item_scale", item_scale),
            ("category_scale", category_scale), ("affinity_scale", affinity_scale))}
        rng = np.random.default_rng([self.seed, 104729])
        self.dense_weights = rng.normal(0.0, dense_scale / math.sqrt(max(self.num_dense, 1)), self.num_dense)
        self._seed_salt = np.uint64(int(rng.integers(0, 2 ** 63)))
        self.schema = self._make_schema(check_int(owner, "embedding_dim", embedding_dim, minimum=1),
                                        permit_filter_value, evict_filter_value)

    def _make_schema(self, dim: int, permit: int, evict: int | None) -> Schema:
        if self.table != "hashed":
            shared = "ids" if self.table == "shared" else None
            ids = [CategoricalFeature(n, dynamic=True, capacity=self.table_size, embedding_dim=dim, table=shared,
                                      permit_filter_value=permit, evict_filter_value=evict) for n in ("user", "item")]
        else:
            ids = [CategoricalFeature(n, hash_buckets=self.table_size, embedding_dim=dim) for n in ("user", "item")]
        category = CategoricalFeature("category", vocab_size=self.num_categories, embedding_dim=dim)
        return Schema([DenseFeature(f"x{j}") for j in range(self.num_dense)], [*ids, category])

    def _uniform(self, salt: str, index: np.ndarray, width: int = 1) -> np.ndarray:
        """Hash-derived values of ids `index`, uniform with zero mean and unit variance, ``[n, width]``."""
        base = np.asarray(index, dtype=np.uint64)[:, None] * np.uint64(width) + np.arange(width, dtype=np.uint64)
        h = splitmix64(base ^ _SALTS[salt] ^ self._seed_salt)
        return ((h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 * 2.0 - 1.0) * math.sqrt(3.0)

    def categories(self, items: np.ndarray) -> np.ndarray:
        """The category of items number `items`."""
        h = splitmix64(np.asarray(items, dtype=np.uint64) ^ _SALTS["item_cat"] ^ self._seed_salt)
        return (h % np.uint64(self.num_categories)).astype(np.int64)

    # --- the truth ---------------------------------------------------------------------------
    def _draw(self, rng: np.random.Generator, n_existing: int, exponent: float, n: int) -> np.ndarray:
        return np.minimum((n_existing * rng.random(n) ** exponent).astype(np.int64), n_existing - 1)

    def logits(self, t: int, users: np.ndarray, items: np.ndarray, dense: np.ndarray) -> np.ndarray:
        """True click logits at batch `t` of user numbers `users` with item numbers `items`."""
        s = self.scales
        theta = 2 * math.pi * t / self.drift_period + math.pi * self._uniform("user_phase", users)[:, 0]
        taste = (np.cos(theta)[:, None] * self._uniform("user_a", users, self.dim)
                 + np.sin(theta)[:, None] * self._uniform("user_b", users, self.dim))
        affinity = (taste * self._uniform("item_q", items, self.dim)).sum(1) / math.sqrt(self.dim)
        return (self.base_logit + dense.astype(np.float64) @ self.dense_weights
                + s["user_scale"] * self._uniform("user_bias", users)[:, 0]
                + s["item_scale"] * self._uniform("item_bias", items)[:, 0]
                + s["category_scale"] * self._uniform("cat_bias", self.categories(items))[:, 0]
                + s["affinity_scale"] * affinity)

    def _events(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(users, items, dense, true probabilities, labels) of batch `t`."""
        rng = np.random.default_rng([self.seed, t])
        n = self.batch_size
        users = self._draw(rng, self.num_users(t), self.user_exponent, n)
        items = self._draw(rng, self.num_items(t), self.item_exponent, n)
        dense = rng.standard_normal((n, self.num_dense), dtype=np.float32)
        p = 1.0 / (1.0 + np.exp(-self.logits(t, users, items, dense)))
        labels = (rng.random(n) < p).astype(np.float32)
        return users, items, dense, p, labels

    def batch(self, t: int) -> Batch:
        """Batch `t` of the stream."""
        t = check_int("DriftingCTR.batch", "t", t, minimum=0, maximum=self.num_batches - 1)
        users, items, dense, _, labels = self._events(t)
        ids = np.concatenate([self._keys("user", users), self._keys("item", items), self.categories(items)])
        n = self.batch_size
        offsets = torch.arange(3 * n + 1, dtype=torch.int64)  # single-hot: one id per bag
        features = Features(torch.from_numpy(dense), torch.from_numpy(ids), offsets, n, 3,
                            keys=self.schema.categorical_names)
        return Batch(features, torch.from_numpy(labels))

    def _truth(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        e = self._events(t)
        return e[3], e[4]

    def bayes_curve(self, window: int) -> list[tuple[int, float]]:
        """``(first batch, bayes_auc)`` of each run of `window` batches (the last may be shorter)."""
        window = check_int("DriftingCTR.bayes_curve", "window", window, minimum=1)
        return [(s, self.bayes_auc(s, min(s + window, self.num_batches))) for s in range(0, self.num_batches, window)]
