"""Cold start: what a dynamic table should answer for an id it has not admitted yet, measured.

recstream's dynamic tables (`HashEmbedding`) answer a key without a row with ``default_value``
(zeros), and with the default ``permit_filter_value=1`` give it a row, drawn N(0, 0.01^2), in the
first training step that sees it. Test-then-train scores every new user's first batch of events
with that answer. This benchmark compares it with the mechanisms issue 25 proposed, on
`bench_anchors`'s protocol and streams (the same events, warm start on the first 20%, every event
scored before any update from its batch; prequential AUC, exact and deterministic on a CPU with
one thread), for recstream's DeepFM with the stream's crosses and the tables at lr 0.1 (the best on
``coldstart``) and its default WideDeep:

- ``zeros``: the default (``default_value`` zeros, new rows N(0, 0.01^2));
- ``mean``: every dynamic table answers unseen keys with the mean of its rows, weighted by how
  often each key was seen (``table_entries``' counts): an unseen id's first answer is the average
  id's, recomputed before each batch is scored (``default_value`` is writable; it travels with the
  state_dict to serving);
- ``mean init``: the same answer, and every newly admitted row starts at that mean (plus its
  usual N(0, 0.01^2) draw) instead of around zero -- the other half of the learned shared row
  (``cold_start="shared"``, branch ``coldstart``) without its gradient;
- ``unseen flag``: zeros, plus a learned per-feature "unseen" indicator fed to the model: two
  fixed-vocabulary features ``user_new`` and ``item_new`` (1 for an event whose id no earlier batch
  had -- exactly the keys the table has no row for when the batch is scored; in training, the keys
  admitted in that step), with their own embeddings and first-order weights;
- ``attr backoff``: the table's answer for a key it has not admitted is generated from the event's
  attributes of that entity (``ColdStartCTR``: the user's age, gender and occupation embeddings,
  the item's pooled genres; ``DriftingCTR``: the item's category -- its users have none): a learned
  linear map of their concatenated embeddings into the table's row space (its first-order column
  included), zero at the start, trained on the events of keys the step admits (their vector is the
  fresh row plus the generated one) -- the "meta-embedding" generator of Pan et al. (2019);
- ``attr backoff + start``: the same answer, and the row a training step admits starts at the
  generated vector (plus its usual N(0, 0.01^2) draw): a per-id generated start instead of
  ``mean init``'s shared one;
- ``attr backoff, fading``: the generated vector is added to young rows too, weighted by
  ``max(0, 1 - sightings / 16)`` (the key's count before the lookup; 1 for a key without a row): a
  new user's answer moves from the generated vector to its own row over its first 16 events
  (about its first session on ``ColdStartCTR``) instead of at its first step.

Per stream it also prints how well any first answer could do: the AUC, on the events of users no
earlier batch had, of the truth's logit without the user's own terms (``ColdStartCTR``: ``b_u``
and ``T[u, g]``; ``DriftingCTR``: ``c_u`` and the affinity) -- everything observable about a new
user's event, scored as well as it can be.

    python benchmarks/bench_cold_start.py               # both streams, seeds 0 and 1, both models
    python benchmarks/bench_cold_start.py --quick       # 30 batches, seed 0: a smoke run
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
from collections.abc import Callable

import bench_anchors as ba
import numpy as np
import torch
from torch import nn

from recstream.data import Batch, CategoricalFeature, ColdStartCTR, Schema, roc_auc
from recstream.features import Features
from recstream.models import DeepFM, WideDeep
from recstream.models.dynamic import table_key
from recstream.models.embedding import with_keys
from recstream.nn import HashEmbedding
from recstream.nn.hash_embedding import table_entries

MECHANISMS = ("zeros", "mean", "mean init", "unseen flag", "attr backoff", "attr backoff + start",
              "attr backoff, fading")
FADE = 16  # sightings over which "attr backoff, fading" hands a key over to its own row
CONFIGS = {"DeepFM, crosses": ba.Config("recstream DeepFM, crosses", DeepFM, ba.ONLINE, None, True),
           "WideDeep": ba.Config("recstream WideDeep, default_optimizer", WideDeep)}


def seen_mean(table: HashEmbedding) -> torch.Tensor:
    """The mean of `table`'s admitted rows, each weighted by its key's count of sightings (zeros if none)."""
    e = table_entries(table.state_dict())
    w = e["counts"].to(table.values.dtype) * e["admitted"]
    if float(w.sum()) == 0:
        return torch.zeros(table.embedding_size, dtype=table.values.dtype)
    return (e["values"] * w.unsqueeze(1)).sum(0) / w.sum()


def with_mean_answer(net: torch.nn.Module, init_too: bool) -> torch.nn.Module:
    """`net` whose dynamic tables answer unseen keys with `seen_mean` (set before each eval-mode
    lookup, i.e. before each batch is scored); `init_too`: the rows a training lookup admits start
    at it as well (the mean of the rows before that lookup: its new keys hold no trained row yet)."""
    for table in net.modules():
        if not isinstance(table, HashEmbedding):
            continue
        before = {}

        def answer(module, _args, before=before):
            mean = seen_mean(module)
            if module.training:
                before["mean"] = mean
            else:
                module.default_value.copy_(mean)
        table.register_forward_pre_hook(answer)
        if init_too:  # HashEmbedding draws a new row in _init_rows: shift the draw by the mean
            draw = table._init_rows
            table._init_rows = functools.partial(lambda n, b, d: d(n) + b["mean"], b=before, d=draw)
    return net


def with_unseen_flags(stream: ba.Stream) -> ba.Stream:
    """`stream` with fixed features ``user_new`` / ``item_new``: 1 where no earlier batch had the id."""
    base = stream.schema
    dim = base.feature("user").embedding_dim
    flags = [CategoricalFeature(f"{key}_new", vocab_size=2, embedding_dim=dim) for key in ("user", "item")]
    schema = Schema(base.dense, [*base.categorical, *flags], label=base.label)
    seen: dict[str, set] = {"user": set(), "item": set()}
    batches = []
    for b in stream.batches:
        f = b.features
        new = []
        for key in ("user", "item"):
            ids = f.bag(key)[0].tolist()
            new.append(np.array([i not in seen[key] for i in ids], dtype=np.int64))
            seen[key].update(ids)
        values = torch.cat([f.values, torch.from_numpy(np.concatenate(new))])
        lengths = torch.cat([f.lengths(), torch.ones(2, f.batch_size, dtype=torch.int64)])
        batches.append(Batch(Features.from_lengths(f.dense, values, lengths, keys=schema.categorical_names),
                             b.labels))
    return ba.Stream(stream.name, batches, stream.warm, stream.bayes, schema, stream.probabilities)


# The entity features the tables back off to, per stream: {dynamic feature: its attributes in the event}.
BACKOFF = {"coldstart": {"user": ("age", "gender", "occupation"), "item": ("genres",)},
           "drifting": {"item": ("category",)}}


class AttributeBackoff(nn.Module):
    """`net` (a model with a `FeatureEmbedding` ``embedding`` whose dynamic tables have a first-order
    column) whose dynamic features of `backoff` ({feature: attribute features}) answer, for an event
    whose key the feature's table has not admitted before the lookup, their (pending: zero) row plus
    ``generators[feature](concatenated attribute embeddings)``, a learned linear map into the table's
    row space (zero at the start). In training those are the keys the step admits (with
    ``permit_filter_value=1``): the generator learns from the events of new keys. `start`: a row
    the step admits starts at the generated vector (the mean over the key's events in the step).
    `fade`: the generated vector is added to admitted rows too, weighted by ``max(0, 1 - count / fade)``."""

    def __init__(self, net: nn.Module, backoff: dict[str, tuple[str, ...]], start: bool,
                 fade: int | None = None) -> None:
        super().__init__()
        self.net, self.schema, self.start, self.fade = net, net.schema, start, fade
        emb = net.embedding
        bounds = np.concatenate([[0], np.cumsum(emb.dims)]).tolist()
        self._slices = {n: (bounds[i], bounds[i + 1]) for i, n in enumerate(emb._names)}
        self.backoff = {f: tuple(a) for f, a in backoff.items()}
        self.generators = nn.ModuleDict()
        for f, attrs in self.backoff.items():
            table = emb.dynamic.table_of(f)
            g = nn.Linear(sum(emb.dims[emb._names.index(a)] for a in attrs), table.embedding_size)
            nn.init.zeros_(g.weight)
            nn.init.zeros_(g.bias)
            self.generators[f] = g
        inner = emb.with_first_order
        emb.with_first_order = lambda features: self._with_backoff(inner, features)

    def forward(self, features: Features) -> torch.Tensor:
        return self.net(features)

    def _with_backoff(self, inner, features: Features):
        emb = self.net.embedding
        features = with_keys(features, emb._names) if features.keys is None else features
        fresh = {}
        for f in self.backoff:
            ids, offsets = features.bag(f)
            if ids.numel() != features.batch_size:
                raise ValueError(f"AttributeBackoff: feature {f!r} must have one id per event")
            keys = table_key(ids)
            t = emb.dynamic.table_of(f).table
            slots = t.find(keys)
            admitted = (slots >= 0) & (t.rows[slots.clamp(min=0)] >= 0)
            weight = (~admitted).to(torch.get_default_dtype())
            if self.fade is not None:
                count = t.counts[slots.clamp(min=0)].to(weight.dtype)
                weight = torch.where(admitted, (1 - count / self.fade).clamp(min=0), weight)
            fresh[f] = (keys, ~admitted, weight)
        out, first = inner(features)
        add = torch.zeros_like(out)
        for f, attrs in self.backoff.items():
            keys, mask, weight = fresh[f]
            if not bool((weight > 0).any()):
                continue
            x = torch.cat([out[:, slice(*self._slices[a])] for a in attrs], dim=1)
            g = self.generators[f](x) * weight.to(out.dtype).unsqueeze(1)  # [B, 1 + dim]
            lo, hi = self._slices[f]
            add[:, lo:hi] = g[:, 1:]
            first = g[:, 0] if first is None else first + g[:, 0]
            if self.start and self.net.training:
                self._start_rows(emb.dynamic.table_of(f), keys[mask], g[mask].detach())
        return out + add, first

    @staticmethod
    @torch.no_grad()
    def _start_rows(table, keys: torch.Tensor, generated: torch.Tensor) -> None:
        """Adds to the rows just admitted for `keys` the mean of their events' `generated` vectors."""
        uniq, inverse = torch.unique(keys, return_inverse=True)
        sums = torch.zeros(len(uniq), generated.shape[1], dtype=generated.dtype).index_add_(0, inverse, generated)
        counts = torch.zeros(len(uniq), dtype=generated.dtype).index_add_(0, inverse, torch.ones_like(inverse,
                                                                                                      dtype=generated.dtype))
        rows = table.table.rows[table.table.find(uniq)]
        admitted = rows >= 0  # a pending key (permit_filter_value > 1) has no row to start
        table.values[rows[admitted]] += (sums / counts.unsqueeze(1))[admitted]


def _own_user_terms(gen, t: int) -> tuple[np.ndarray, np.ndarray]:
    """(the truth's logits of batch `t` without the terms of the user's own, labels): the generators'
    formulas (module docs of ColdStartCTR and DriftingCTR), user terms only."""
    s = gen.scales
    if isinstance(gen, ColdStartCTR):
        users, items, _, labels = gen._events(t)
        genres, mask = gen.genres(items)
        cells = users.astype(np.uint64)[:, None] * np.uint64(gen.num_genres) + genres.astype(np.uint64)
        taste = (gen._uniform("taste", cells) * mask).sum(1) / np.sqrt(mask.sum(1))
        own = (s["user_scale"] * math.sqrt(1 - gen.attribute_share ** 2) * gen._uniform("user_bias", users)
               + s["taste_scale"] * taste)
        return gen.logits(users, items) - own, labels
    users, items, dense, _, labels = gen._events(t)
    theta = 2 * math.pi * t / gen.drift_period + math.pi * gen._uniform("user_phase", users)[:, 0]
    taste = (np.cos(theta)[:, None] * gen._uniform("user_a", users, gen.dim)
             + np.sin(theta)[:, None] * gen._uniform("user_b", users, gen.dim))
    affinity = (taste * gen._uniform("item_q", items, gen.dim)).sum(1) / math.sqrt(gen.dim)
    own = s["user_scale"] * gen._uniform("user_bias", users)[:, 0] + s["affinity_scale"] * affinity
    return gen.logits(t, users, items, dense) - own, labels


def new_user_ceiling(name: str, args, seed: int, stream: ba.Stream) -> float:
    """The AUC on `stream`'s new users' events of the truth without the user's own terms."""
    gen = ba.make_stream(name, args.batches, args.batch_size, seed)
    parts = [_own_user_terms(gen, t) for t in range(stream.warm, args.batches)]
    logits, labels = (np.concatenate(x) for x in zip(*parts, strict=True))
    if not np.array_equal(labels, stream.labels):
        raise AssertionError(f"{name}: the generator's labels differ from the stream's")
    return roc_auc(logits[stream.new_user], labels[stream.new_user])


def run(config: ba.Config, mechanism: str, stream: ba.Stream) -> dict:
    """`config` with `mechanism` on `stream`: bench_anchors' `run_recstream` result."""
    if mechanism == "unseen flag":
        return ba.run_recstream(config, with_unseen_flags(stream))
    if mechanism.startswith("attr backoff"):
        model = config.model
        backoff, start = BACKOFF[stream.name], mechanism.endswith("start")
        fade = FADE if mechanism.endswith("fading") else None
        config = dataclasses.replace(config, model=lambda schema: AttributeBackoff(model(schema), backoff, start, fade))
        return ba.run_recstream(config, stream)
    if mechanism in ("mean", "mean init"):
        model: Callable = config.model
        config = dataclasses.replace(config, model=lambda schema: with_mean_answer(model(schema),
                                                                                  mechanism == "mean init"))
    return ba.run_recstream(config, stream)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--warmup", type=float, default=0.2)
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 (--quick: 0)")
    p.add_argument("--streams", nargs="+", default=["coldstart", "drifting"], choices=["drifting", "coldstart"])
    p.add_argument("--models", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS), choices=MECHANISMS)
    p.add_argument("--quick", action="store_true", help="30 batches, seed 0: a smoke run, not a measurement")
    args = p.parse_args(argv)
    seeds = args.seeds or ([0] if args.quick else [0, 1])
    if args.quick:
        args.batches = 30
    torch.set_num_threads(1)
    print("| stream | seed | model | first answer | AUC | vs zeros | new users | vs zeros | known users |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for name in args.streams:
        for seed in seeds:
            stream = ba.load(name, args, seed)
            ceiling = new_user_ceiling(name, args, seed, stream)
            bayes = roc_auc(stream.probabilities[stream.new_user], stream.labels[stream.new_user])
            print(f"| {name} | {seed} | truth without the user's own terms | | | | {ceiling:.4f} | | |")
            print(f"| {name} | {seed} | truth (Bayes) | | {stream.bayes:.4f} | | {bayes:.4f} | | |")
            for model in args.models:
                base = None
                for mechanism in args.mechanisms:
                    r = run(CONFIGS[model], mechanism, stream)
                    base = r if mechanism == "zeros" else base
                    d = {k: None if base is None else r[k] - base[k] for k in ("auc", "auc_new_users")}
                    rows.append({**r, "stream": name, "seed": seed, "model": model, "mechanism": mechanism,
                                 "delta": d["auc"], "delta_new_users": d["auc_new_users"]})
                    print(f"| {name} | {seed} | {model} | {mechanism} | {r['auc']:.4f} | {ba.fmt(d['auc'], '+.4f')} | "
                          f"{ba.fmt(r['auc_new_users'])} | {ba.fmt(d['auc_new_users'], '+.4f')} | "
                          f"{ba.fmt(r['auc_known_users'])} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
