"""A synthetic rating stream with heavy cold start and explicit interactions: `ColdStartCTR`.

Where `DriftingCTR` tests drift, this regime tests what a model does with
ids it has never seen, and whether it can learn interactions between a user and an item's
attributes. It is shaped like a time-ordered rating log (a user rates a burst of items in a
session, then leaves; the label is "liked it"):

* **a stream of newcomers**: ``initial_users + users_per_batch * t`` users exist at batch ``t``;
  a share ``session_share`` of a batch's events come from the ``session_users`` newest users
  (uniformly), the rest from everyone so far (user ``floor(n_t * U**user_exponent)``). With the
  defaults about 40% of the events are by users never seen in an earlier batch, and a new
  user's events fall in their first two batches;
* **users have attributes** (``age`` of ``num_ages`` buckets, ``gender`` of 2, ``occupation`` of
  ``num_occupations``) and **items have genres** (1 to ``max_genres`` of ``num_genres``, a
  multi-hot bag); items arrive too (``initial_items + items_per_batch * t``), popular ones are
  drawn more (``floor(m_t * U**item_exponent)``);
* **explicit interactions**: the label depends on user x genre and attributes x genre terms, which a
  model without crosses (or factors) of those features cannot express.

The click is ``Bernoulli(sigmoid(logit))`` with (``G`` the item's genres, ``k = |G|``; every
per-id value below is uniform with zero mean and unit variance, from a 64-bit hash of (seed,
id); ``r = attribute_share``)::

    logit = base_logit
          + user_scale * (r * b_occupation + sqrt(1 - r**2) * b_u)       # attributes predict the user
          + item_scale * (r * sum_G(b_g) / sqrt(k) + sqrt(1 - r**2) * b_i)  # genres predict the item
          + attribute_scale * sum_G(A[age, g] + A[gender, g] + A[occupation, g]) / sqrt(3 k)
          + taste_scale * sum_G(T[u, g]) / sqrt(k)                         # the user's own genre taste

So a new user's first answer is best made from their attributes (the ``b_occupation`` and
``A[., g]`` terms), and a known user's from a user x genre cross (``T[u, g]``). Nothing drifts:
the difficulty is the newcomers. Batch ``t`` depends only on ``(seed, t)`` (deterministic,
re-iterable, random-access: `batch`); `bayes_auc` is the AUC of the true
probabilities on the stream's own events -- what a perfect model scores there.

Features: ``user`` and ``item`` (raw scattered int64 keys, ``table`` ``"dynamic"`` or ``"hashed"``
as in `DriftingCTR`), ``age``, ``gender``, ``occupation`` (fixed
vocabularies) and ``genres`` (multi-hot, ``pooling="mean"``); no dense features.

>>> gen = ColdStartCTR(num_batches=40, batch_size=256, seed=1)
>>> batch = gen.batch(0)
>>> batch.features.keys, tuple(batch.features.dense.shape)
(('user', 'item', 'age', 'gender', 'occupation', 'genres'), (256, 0))
>>> 0.75 < gen.bayes_auc(0, 40) < 0.9, gen.schema.feature("genres").multi_hot
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
from .schema import CategoricalFeature, Schema

TABLES = ("dynamic", "hashed")
ATTRIBUTES = ("age", "gender", "occupation")
_SALT_NAMES = ("user_bias", "item_bias", "occupation_bias", "genre_bias", "taste", "age", "gender", "occupation",
               "genre_count", "genre_pick", "age_genre", "gender_genre", "occupation_genre")
_SALTS = {name: np.uint64((i * 0x9E3779B97F4A7C15 + 0x51ED27) % 2 ** 64) for i, name in enumerate(_SALT_NAMES)}


class ColdStartCTR(GeneratedStream):
    """A rating stream full of new users, with attribute and user x genre interactions (see the module doc).

    Args:
        num_batches: stream length in batches.
        batch_size: events per batch.
        seed: everything is a function of ``(seed, batch index)``.
        table: ``"dynamic"`` (``CategoricalFeature(dynamic=True, capacity=table_size)``) or
            ``"hashed"`` (``hash_buckets=table_size``) user and item features.
        table_size: rows of the user and item tables.
        embedding_dim: width of every feature's table.
        initial_users: users before the first batch.
        users_per_batch: new users each batch adds (population growth).
        session_users: the newest users, who make `session_share` of the events.
        session_share: in [0, 1]: the share of events the newest `session_users` make.
        user_exponent: in (0, 1]; activity bias to the newest among the other events.
        initial_items: items before the first batch.
        items_per_batch: new items each batch adds.
        item_exponent: the items' popularity bias to the newest.
        num_genres: genres in all.
        max_genres: at most how many genres an item has.
        num_ages: the age attribute's vocabulary.
        num_occupations: the occupation attribute's vocabulary (gender has 2 values).
        attribute_share: ``r`` in [0, 1]: how much of a user's (item's) bias its occupation (genres) predicts.
        base_logit: the truth's intercept.
        user_scale: the scale of the users' biases in the truth.
        item_scale: the scale of the items' biases in the truth.
        attribute_scale: the scale of the attribute x genre terms in the truth.
        taste_scale: the scale of the user x genre terms in the truth.
        permit_filter_value: of the dynamic tables: sightings before a key gets a row.
        evict_filter_value: of the dynamic tables: steps unseen before a key is evicted (None: capacity only).
    """

    # Odd multipliers / offsets of the id scattering (bijective mod 2**62): fixed, part of the data's meaning.
    _SCATTER = {"user": (0xD6E8FEB86659FD93, 0x2545F491), "item": (0x94D049BB133111EB, 0x4F1BBCDC)}

    def __init__(self, num_batches: int = 400, batch_size: int = 256, seed: int = 0, *, table: str = "dynamic",
                 table_size: int = 1 << 15, embedding_dim: int = 8, initial_users: int = 500,
                 users_per_batch: int = 16, session_users: int = 32, session_share: float = 0.85,
                 user_exponent: float = 0.5, initial_items: int = 400, items_per_batch: int = 2,
                 item_exponent: float = 0.4, num_genres: int = 18, max_genres: int = 3, num_ages: int = 7,
                 num_occupations: int = 21, attribute_share: float = 0.6, base_logit: float = 0.2,
                 user_scale: float = 0.8, item_scale: float = 1.0, attribute_scale: float = 0.6,
                 taste_scale: float = 1.0, permit_filter_value: int = 1,
                 evict_filter_value: int | None = None) -> None:
        owner = "ColdStartCTR"
        self.num_batches = check_int(owner, "num_batches", num_batches, minimum=1)
        self.batch_size = check_int(owner, "batch_size", batch_size, minimum=2)
        self.seed = check_int(owner, "seed", seed, minimum=0)
        self.table = check_choice(owner, "table", table, TABLES)
        self.table_size = check_int(owner, "table_size", table_size, minimum=2)
        self.initial_users = check_int(owner, "initial_users", initial_users, minimum=1)
        self.users_per_batch = check_int(owner, "users_per_batch", users_per_batch, minimum=0)
        self.session_users = check_int(owner, "session_users", session_users, minimum=1)
        self.session_share = check_number(owner, "session_share", session_share, minimum=0, maximum=1)
        self.user_exponent = check_number(owner, "user_exponent", user_exponent, minimum=0, min_open=True, maximum=1)
        self.initial_items = check_int(owner, "initial_items", initial_items, minimum=1)
        self.items_per_batch = check_int(owner, "items_per_batch", items_per_batch, minimum=0)
        self.item_exponent = check_number(owner, "item_exponent", item_exponent, minimum=0, min_open=True, maximum=1)
        self.num_genres = check_int(owner, "num_genres", num_genres, minimum=1)
        self.max_genres = check_int(owner, "max_genres", max_genres, minimum=1, maximum=self.num_genres)
        self.vocab = {"age": check_int(owner, "num_ages", num_ages, minimum=1), "gender": 2,
                      "occupation": check_int(owner, "num_occupations", num_occupations, minimum=1)}
        self.attribute_share = check_number(owner, "attribute_share", attribute_share, minimum=0, maximum=1)
        self.base_logit = check_number(owner, "base_logit", base_logit)
        self.scales = {name: check_number(owner, name, value, minimum=0) for name, value in (
            ("user_scale", user_scale), ("item_scale", item_scale), ("attribute_scale", attribute_scale),
            ("taste_scale", taste_scale))}
        self._seed_salt = np.uint64(int(np.random.default_rng([self.seed, 7919]).integers(0, 2 ** 63)))
        self.schema = self._make_schema(check_int(owner, "embedding_dim", embedding_dim, minimum=1),
                                        permit_filter_value, evict_filter_value)

    def _make_schema(self, dim: int, permit: int, evict: int | None) -> Schema:
        if self.table == "dynamic":
            ids = [CategoricalFeature(n, dynamic=True, capacity=self.table_size, embedding_dim=dim,
                                      permit_filter_value=permit, evict_filter_value=evict) for n in ("user", "item")]
        else:
            ids = [CategoricalFeature(n, hash_buckets=self.table_size, embedding_dim=dim) for n in ("user", "item")]
        attributes = [CategoricalFeature(n, vocab_size=self.vocab[n], embedding_dim=dim) for n in ATTRIBUTES]
        genres = CategoricalFeature("genres", vocab_size=self.num_genres, embedding_dim=dim, multi_hot=True,
                                    max_len=self.max_genres, pooling="mean")
        return Schema([], [*ids, *attributes, genres])

    def _hash(self, salt: str, index: np.ndarray) -> np.ndarray:
        return splitmix64(np.asarray(index, dtype=np.uint64) ^ _SALTS[salt] ^ self._seed_salt)

    def _uniform(self, salt: str, index: np.ndarray) -> np.ndarray:
        """Hash-derived values of `index`, uniform with zero mean and unit variance."""
        return ((self._hash(salt, index) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 * 2.0 - 1.0) * math.sqrt(3)

    def attributes(self, users: np.ndarray) -> dict[str, np.ndarray]:
        """``{"age", "gender", "occupation"}`` of user numbers `users`."""
        return {n: (self._hash(n, users) % np.uint64(self.vocab[n])).astype(np.int64) for n in ATTRIBUTES}

    def genres(self, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(genres [n, max_genres], mask [n, max_genres])`` of item numbers `items`: the first
        ``count`` columns of a row are the item's distinct genres, the mask marks them."""
        items = np.asarray(items, dtype=np.uint64)
        count = (self._hash("genre_count", items) % np.uint64(self.max_genres)).astype(np.int64) + 1
        # distinct genres: a hash-keyed order of all genres per item, first `count` taken
        cells = items[:, None] * np.uint64(self.num_genres) + np.arange(self.num_genres, dtype=np.uint64)
        order = np.argsort(self._hash("genre_pick", cells), axis=1, kind="stable")[:, :self.max_genres]
        return order.astype(np.int64), np.arange(self.max_genres)[None, :] < count[:, None]

    # --- the truth ---------------------------------------------------------------------------
    def logits(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """True click logits of user numbers `users` with item numbers `items`."""
        s, r = self.scales, self.attribute_share
        q = math.sqrt(1.0 - r * r)
        attrs = self.attributes(users)
        genres, mask = self.genres(items)
        k = mask.sum(1)
        g = np.uint64(self.num_genres)

        def over_genres(salt: str, rows: np.ndarray) -> np.ndarray:  # sum over the item's genres of V[row, g]
            cells = np.asarray(rows, dtype=np.uint64)[:, None] * g + genres.astype(np.uint64)
            return (self._uniform(salt, cells) * mask).sum(1)

        user = r * self._uniform("occupation_bias", attrs["occupation"]) + q * self._uniform("user_bias", users)
        genre_bias = (self._uniform("genre_bias", genres) * mask).sum(1) / np.sqrt(k)
        item = r * genre_bias + q * self._uniform("item_bias", items)
        attribute = sum(over_genres(f"{n}_genre", attrs[n]) for n in ATTRIBUTES) / np.sqrt(3 * k)
        taste = over_genres("taste", users) / np.sqrt(k)
        return (self.base_logit + s["user_scale"] * user + s["item_scale"] * item
                + s["attribute_scale"] * attribute + s["taste_scale"] * taste)

    def _draw_users(self, rng: np.random.Generator, t: int, n: int) -> np.ndarray:
        total = self.num_users(t)
        recent = min(self.session_users, total)
        everyone = np.minimum((total * rng.random(n) ** self.user_exponent).astype(np.int64), total - 1)
        newest = total - 1 - rng.integers(0, recent, n)
        return np.where(rng.random(n) < self.session_share, newest, everyone)

    def _events(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(users, items, true probabilities, labels) of batch `t`."""
        rng = np.random.default_rng([self.seed, t])
        n, m = self.batch_size, self.num_items(t)
        users = self._draw_users(rng, t, n)
        items = np.minimum((m * rng.random(n) ** self.item_exponent).astype(np.int64), m - 1)
        p = 1.0 / (1.0 + np.exp(-self.logits(users, items)))
        labels = (rng.random(n) < p).astype(np.float32)
        return users, items, p, labels

    def batch(self, t: int) -> Batch:
        """Batch `t` of the stream."""
        t = check_int("ColdStartCTR.batch", "t", t, minimum=0, maximum=self.num_batches - 1)
        users, items, _, labels = self._events(t)
        attrs = self.attributes(users)
        genres, mask = self.genres(items)
        n = self.batch_size
        ones = np.ones(n, dtype=np.int64)
        # feature-major, as Features stores them
        values = np.concatenate([self._keys("user", users), self._keys("item", items),
                                 *(attrs[name] for name in ATTRIBUTES), genres[mask]])
        lengths = np.stack([ones, ones, ones, ones, ones, mask.sum(1)])
        features = Features.from_lengths(torch.zeros(n, 0), torch.from_numpy(values), torch.from_numpy(lengths),
                                         keys=self.schema.categorical_names)
        return Batch(features, torch.from_numpy(labels))

    def _truth(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        e = self._events(t)
        return e[2], e[3]
