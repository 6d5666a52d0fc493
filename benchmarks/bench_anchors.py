"""Anchors: recstream's online models against Vowpal Wabbit and River on the same visible streams.

Streams (generated, known Bayes AUC): ``drifting`` (:class:`~recstream.data.DriftingCTR`: new
users/items, shifting popularity, drifting tastes) and ``coldstart``
(:class:`~recstream.data.ColdStartCTR`: ~43% of events by users never seen before, user
attributes and item genres, user x genre and attributes x genre interactions); dynamic user/item
tables for recstream.

Protocol, the same for every system and on the same events: the stream comes in batches of
``--batch-size`` (256); the first ``--warmup`` (20%) of the batches is a warm start (one pass of
training, not scored); on the rest, test-then-train: every event of a batch is scored before any
update from its batch, then the system trains on the batch (VW and River one event at a time,
recstream in one step, or in ``k`` sequential micro-steps of the already scored batch: the rows
``micro 32``). The prequential AUC is the exact AUC of all scores of the scored part
(``roc_auc``); for recstream's one-step rows ``PrequentialMonitor`` (window = the whole scored
part) gives the same figure, checked. ``events/s`` is the scored part's events over the wall
time of scoring and training them (inputs prepared beforehand in each system's own format: VW
text lines, River dicts, recstream batches); one thread.

Systems (anchors optional: ``pip install vowpalwabbit==9.11.9 river==0.26.1``, or the ``bench``
extra; absent ones are skipped with that line):

- VW defaults: ``--loss_function logistic``; VW quadratic: the pairs of each stream's crosses
  (``QUADRATIC``), ``-b 24 --l2 1e-5``; VW's best found: ``-b 24``, and the quadratic pairs with
  ``-b 24 -l 0.25``. Namespaces: u user, i item, c category, a attributes,
  g genres, d dense.
- River: ``LogisticRegression(optimizer=AdaGrad())`` and ``FMClassifier()`` (defaults, seed 0) on
  one-hot dicts (``"user=123": 1``, dense values as they are), and tuned (``--search``'s grid on
  both streams): the logistic regression with VW's quadratic pairs as crossed tokens
  (``"user=1*genres=4": 1``) or without, AdaGrad at the rates of ``RIVER_LR``, the FM with AdaGrad
  (``RIVER_FM``).
- recstream: WideDeep and DeepFM (default widths) with ``default_optimizer``, through
  ``RecModel.train`` (warm start) and ``RecModel.online_train`` (the rest), and the best
  configurations found (``BEST``). "crosses" rows add the stream's ``CROSSES`` (exact-id
  ``CrossFeature``s of the truth's interacting features, computed by ``with_crosses``) to the
  wide/linear part -- recstream's counterpart of VW's quadratic terms.

Also per stream: the share of scored events whose user (item) was never seen in an earlier batch,
and each system's AUC on those events and on the others. Every stream runs under each of
``--seeds`` (default 0 and 1: another draw of the same generator); a summary per stream gives each
system's AUC per seed, their mean and spread, and recstream's best row minus VW's and River's best
per seed.

    python benchmarks/bench_anchors.py            # 400 batches x 256 per stream, seeds 0 and 1
    python benchmarks/bench_anchors.py --quick    # 30 batches: a smoke run, not a measurement
    python benchmarks/bench_anchors.py --search --no-anchors --streams coldstart --only crosses \
        --crosses user:genres occupation:genres   # recstream's crosses rows with other crosses
"""
from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from recstream import RecModel
from recstream.callbacks import Callback, PrequentialMonitor
from recstream.data import Batch, ColdStartCTR, CrossFeature, DriftingCTR, Schema, roc_auc
from recstream.data.convert import with_crosses
from recstream.data.streams import IterableStream
from recstream.models import DeepFM, WideDeep, default_optimizer

INSTALL = "pip install vowpalwabbit==9.11.9 river==0.26.1"
NAMESPACES = {"user": "u", "item": "i", "category": "c", "age": "a", "gender": "a", "occupation": "a", "genres": "g"}
QUADRATIC = {"drifting": ("ui", "uc", "ic"), "coldstart": ("ug", "ai", "ag", "ig")}


def make_stream(name: str, batches: int, batch_size: int, seed: int):
    if name == "drifting":
        return DriftingCTR(num_batches=batches, batch_size=batch_size, seed=seed, table="dynamic")
    return ColdStartCTR(num_batches=batches, batch_size=batch_size, seed=seed, table="dynamic")


@dataclass
class Stream:
    """One stream's batches, split into the warm start and the scored part, with its facts."""
    name: str
    batches: list[Batch]
    warm: int
    bayes: float
    schema: object
    probabilities: np.ndarray  # the truth's, of the scored part, in order
    labels: np.ndarray = field(init=False)  # of the scored part, in order
    new_user: np.ndarray = field(init=False)  # its events whose user no earlier batch had
    new_item: np.ndarray = field(init=False)

    def __post_init__(self):
        self.labels = np.concatenate([b.labels.numpy() for b in self.scored])
        self.new_user, self.new_item = (_unseen(self.batches, key, self.warm) for key in ("user", "item"))

    @property
    def scored(self) -> list[Batch]:
        return self.batches[self.warm:]


def _unseen(batches: list[Batch], key: str, warm: int) -> np.ndarray:
    seen, flags = set(), []
    for t, batch in enumerate(batches):
        ids = batch.features.bag(key)[0].tolist()
        if t >= warm:
            flags.extend(i not in seen for i in ids)
        seen.update(ids)
    return np.array(flags, dtype=bool)


# --- events as VW lines and River dicts ------------------------------------------------------------
def _events(batch: Batch) -> list[tuple[dict[str, list[str]], list[float], float]]:
    """Per event: {namespace: tokens}, dense values, label."""
    f = batch.features
    offsets, values = f.offsets.numpy(), f.values.numpy()
    dense, labels = f.dense.numpy(), batch.labels.numpy()
    out = []
    for b in range(f.batch_size):
        spaces: dict[str, list[str]] = {}
        for k, name in enumerate(f.keys):
            ids = values[offsets[k * f.batch_size + b]:offsets[k * f.batch_size + b + 1]]
            spaces.setdefault(NAMESPACES[name], []).extend(f"{name}={i}" for i in ids)
        out.append((spaces, dense[b].tolist(), float(labels[b])))
    return out


def vw_line(spaces, dense, label=None) -> str:
    parts = [f"|{ns} " + " ".join(tokens) for ns, tokens in spaces.items()]
    if dense:
        parts.append("|d " + " ".join(f"x{j}:{v:.6g}" for j, v in enumerate(dense)))
    text = " ".join(parts)
    return text if label is None else f"{1 if label > 0.5 else -1} {text}"


def river_dict(spaces, dense, pairs=()) -> dict[str, float]:
    """One-hot dict of an event; `pairs` (namespace pairs, VW's ``-q``): their crossed tokens too
    (``"user=1*genres=4": 1``), VW's quadratic terms for River's linear model."""
    x = {token: 1.0 for tokens in spaces.values() for token in tokens}
    for a, b in pairs:
        x.update({f"{ta}*{tb}": 1.0 for ta in spaces.get(a, ()) for tb in spaces.get(b, ())})
    x.update({f"x{j}": v for j, v in enumerate(dense)})
    return x


# --- one-event-at-a-time systems -------------------------------------------------------------------
@dataclass
class Anchor:
    """An online learner that scores and learns one event at a time, on inputs it prepares."""
    name: str
    prepare: Callable  # (spaces, dense, label) -> (score input, learn input)
    score: Callable  # (model, score input) -> float
    learn: Callable  # (model, learn input, label) -> None
    make: Callable  # () -> model


def _vw(stream: str, search: bool) -> list[Anchor]:
    from vowpalwabbit import Workspace

    def vw(args: str) -> Callable:
        return lambda: Workspace(f"{args} --quiet")
    prep = lambda s, d, y: (vw_line(s, d), vw_line(s, d, y))  # noqa: E731
    score = lambda m, x: m.predict(x)  # noqa: E731 (the raw margin: the AUC needs only the order)
    learn = lambda m, x, y: m.learn(x)  # noqa: E731
    quad = " ".join(f"-q {pair}" for pair in QUADRATIC[stream])
    rows = [Anchor("VW defaults", prep, score, learn, vw("--loss_function logistic")),
            Anchor(f"VW quadratic ({quad}, -b 24 --l2 1e-5)", prep, score, learn,
                   vw(f"--loss_function logistic {quad} -b 24 --l2 1e-5")),
            # VW's best found (--search and by hand, docs/benchmarks.md "Anchors"): -b 24 on drifting,
            # the quadratic terms with -l 0.25 on coldstart
            Anchor("VW -b 24", prep, score, learn, vw("--loss_function logistic -b 24")),
            Anchor(f"VW quadratic ({quad}, -b 24 -l 0.25)", prep, score, learn,
                   vw(f"--loss_function logistic {quad} -b 24 -l 0.25"))]
    if search:
        rows += [Anchor(f"VW quadratic ({quad}, -b 24)", prep, score, learn,
                        vw(f"--loss_function logistic {quad} -b 24"))]
    return rows


# River's tuned rows (--search's grid on both streams, docs/benchmarks.md "Anchors"): logistic
# regression with AdaGrad lr 0.2 (the best on drifting), with the stream's quadratic terms and lr 0.05
# (the best on coldstart), the FM with AdaGrad.
RIVER_LR = {"one-hot": 0.2, "quadratic": 0.05}
RIVER_FM = {"n_factors": 8, "weights_lr": 0.2, "latent_lr": 0.1}


def _river(stream: str, search: bool) -> list[Anchor]:
    from river import facto, linear_model, optim
    quad = " ".join(QUADRATIC[stream])

    def prep(pairs=()):
        return lambda s, d, y: (river_dict(s, d, pairs),) * 2
    score = lambda m, x: m.predict_proba_one(x).get(True, 0.0)  # noqa: E731
    learn = lambda m, x, y: m.learn_one(x, y > 0.5)  # noqa: E731

    def lr(name, pairs, make_optimizer):
        return Anchor(name, prep(pairs), score, learn,
                      lambda: linear_model.LogisticRegression(optimizer=make_optimizer()))

    def fm(name, n_factors, weights_lr, latent_lr):
        return Anchor(name, prep(), score, learn, lambda: facto.FMClassifier(
            n_factors=n_factors, weight_optimizer=optim.AdaGrad(weights_lr),
            latent_optimizer=optim.AdaGrad(latent_lr), seed=0))
    f = RIVER_FM
    rows = [lr("River LogisticRegression (AdaGrad)", (), optim.AdaGrad),
            lr(f"River LogisticRegression, AdaGrad lr {RIVER_LR['one-hot']}", (),
               lambda: optim.AdaGrad(RIVER_LR["one-hot"])),
            lr(f"River LogisticRegression, quadratic ({quad}), AdaGrad lr {RIVER_LR['quadratic']}", QUADRATIC[stream],
               lambda: optim.AdaGrad(RIVER_LR["quadratic"])),
            Anchor("River FMClassifier (defaults)", prep(), score, learn, lambda: facto.FMClassifier(seed=0)),
            fm(f"River FMClassifier ({f['n_factors']} factors, AdaGrad lr {f['weights_lr']} / latent "
               f"{f['latent_lr']})", **f)]
    if search:
        rows += [lr(f"River LogisticRegression, AdaGrad lr {v}", (), lambda v=v: optim.AdaGrad(v)) for v in (0.05, 0.5)]
        rows += [lr(f"River LogisticRegression, FTRL alpha {a}", (), lambda a=a: optim.FTRLProximal(alpha=a, l2=0.0))
                 for a in (0.1, 0.3)]
        rows += [lr(f"River LogisticRegression, quadratic ({quad}), AdaGrad lr {v}", QUADRATIC[stream],
                    lambda v=v: optim.AdaGrad(v)) for v in (0.02, 0.03, 0.1, 0.2, 0.5)]
        rows += [lr(f"River LogisticRegression, quadratic ({quad}), FTRL alpha {a}", QUADRATIC[stream],
                    lambda a=a: optim.FTRLProximal(alpha=a, l2=0.0)) for a in (0.1, 0.3)]
        rows += [fm(f"River FMClassifier (8 factors, AdaGrad lr {w} / latent {v})", 8, w, v)
                 for w, v in ((0.1, 0.05), (0.5, 0.2))]
    return rows


def anchors(stream: str, search: bool = False) -> tuple[list[Anchor], list[str]]:
    """The anchors that import here, and a line per system that does not (`search`: VW's and River's
    variants too)."""
    rows, missing = [], []
    for system, build in (("Vowpal Wabbit", lambda: _vw(stream, search)), ("River", lambda: _river(stream, search))):
        try:
            rows += build()
        except ImportError:
            missing.append(f"{system}: not installed ({INSTALL}), skipped")
    return rows, missing


def run_anchor(anchor: Anchor, stream: Stream) -> dict:
    def inputs(batches):
        return [[anchor.prepare(*e) + (e[2],) for e in _events(b)] for b in batches]
    warm, scored = inputs(stream.batches[:stream.warm]), inputs(stream.scored)
    model = anchor.make()
    for batch in warm:
        for _, x, y in batch:
            anchor.learn(model, x, y)
    scores = []
    start = time.perf_counter()
    for batch in scored:
        scores.extend(anchor.score(model, x) for x, _, _ in batch)  # the whole batch first
        for _, x, y in batch:
            anchor.learn(model, x, y)
    seconds = time.perf_counter() - start
    return _result(anchor.name, np.asarray(scores, dtype=np.float64), stream, seconds)


# --- recstream ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """A recstream configuration: model, `default_optimizer` arguments, micro-step size (None: one step),
    and whether the model gets the stream's `CROSSES` (`CrossFeature`s, wide/linear part only)."""
    name: str
    model: Callable  # (schema) -> network
    optimizer: dict = field(default_factory=dict)
    micro: int | None = None
    crosses: bool = False


# recstream's exact-id crosses per stream (the features of each stream's truth's interactions), of
# CROSS_BUCKETS hashed rows each: fed to the wide/linear part (CrossFeature's default).
CROSSES = {"drifting": (("user", "category"), ("user", "item")),
           "coldstart": (("user", "genres"), ("age", "genres"), ("gender", "genres"), ("occupation", "genres"))}
CROSS_BUCKETS = 1 << 20


def _crossed(config: Config, stream: Stream, pairs=None) -> tuple[Schema, list[Batch]]:
    """The stream's schema and batches, with crosses (computed by `with_crosses`) if `config` asks:
    of `pairs` (tuples of feature names), None: the stream's `CROSSES`."""
    if not config.crosses:
        return stream.schema, stream.batches
    base = stream.schema
    pairs = CROSSES[stream.name] if pairs is None else pairs
    crosses = [CrossFeature("_x_".join(c), c, hash_buckets=CROSS_BUCKETS) for c in pairs]
    schema = Schema(base.dense, base.categorical, label=base.label, crosses=crosses)
    return schema, [Batch(with_crosses(schema, b.features), b.labels) for b in stream.batches]


DEFAULTS = [Config("recstream WideDeep, default_optimizer", WideDeep),
            Config("recstream DeepFM, default_optimizer", DeepFM)]
# The best found (--search on both streams and a grid of crosses, docs/benchmarks.md "Anchors"): the
# stream's crosses in the wide/linear part and the tables at lr 0.1 (online; default_optimizer's 0.05 is
# the offline choice) -- a narrower WideDeep with micro-steps of 32 is the best on drifting, DeepFM (one
# step per batch) on coldstart. (That search ran with the tables' accumulators from 0; from today's 1e-6,
# one-step WideDeep at tables lr 0.1 is level with or ahead of every micro-step row: docs/online.md.)
ONLINE = {"embedding_lr": 0.1}
BEST = [Config("recstream WideDeep hidden (64, 32), crosses, micro 32", functools.partial(WideDeep, hidden=(64, 32)),
               ONLINE, 32, True),
        Config("recstream DeepFM, crosses", DeepFM, ONLINE, None, True)]
SEARCH = [c for c in (Config(f"recstream {m.__name__}, {tag}", m, opt, micro, crosses)
                      for m in (WideDeep, DeepFM)
                      for tag, opt, micro, crosses in (
                          ("tables lr 0.1", ONLINE, None, False),
                          ("tables lr 0.2", {"embedding_lr": 0.2}, None, False),
                          ("dense lr 1e-2", {"lr": 1e-2, **ONLINE}, None, False),
                          ("micro 64", ONLINE, 64, False), ("micro 32", ONLINE, 32, False),
                          ("crosses", ONLINE, None, True), ("crosses, tables lr 0.05", {}, None, True),
                          ("crosses, micro 64", ONLINE, 64, True), ("crosses, micro 32", ONLINE, 32, True),
                          # WideDeep only: steps of 16 (docs/online.md's micro-steps table), FTRL's alpha
                          ("crosses, micro 16", ONLINE, 16, True),
                          ("crosses, wide lr 0.2", {"wide_lr": 0.2, **ONLINE}, None, True),
                          ("crosses, wide lr 0.5", {"wide_lr": 0.5, **ONLINE}, None, True)))
          if c.name not in {b.name for b in BEST}
          and not (c.model is DeepFM and ("wide lr" in c.name or "micro 16" in c.name))]


class BatchScorer(Callback):
    """Scores each whole batch of the stream (network in eval mode, no gradient) just before the
    first micro-step of it trains: every event before any update from its batch."""

    def __init__(self, batches: list[Batch], steps_per_batch: int):
        self.batches, self.k, self.seen, self.scores = batches, steps_per_batch, 0, []
        self._params = None

    def on_train_begin(self, run_context):
        p = run_context.original_args()
        if isinstance(p.batch_observers, list):
            p.batch_observers.append(self._observe)
            self._params = p

    def on_train_step_begin(self, run_context):
        if self._params is None:
            self._observe(None, run_context.original_args())

    @torch.no_grad()
    def _observe(self, _chunk, p=None) -> None:
        net = (p or self._params).network
        if self.seen % self.k == 0:
            was = net.training
            net.eval()
            try:
                logits = net(self.batches[self.seen // self.k].features).reshape(-1).float()
                self.scores.append(torch.sigmoid(logits).double().numpy())  # as PrequentialMonitor does
            finally:
                net.train(was)
        self.seen += 1


def _chunks(batches: list[Batch], size: int | None) -> list[Batch]:
    if size is None:
        return batches
    out = []
    for b in batches:
        n = b.features.batch_size
        out += [b.slice(s, min(s + size, n)) for s in range(0, n, size)]
    return out


def run_recstream(config: Config, stream: Stream, crosses=None) -> dict:
    schema, batches = _crossed(config, stream, crosses)
    torch.manual_seed(0)
    net = config.model(schema)
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net, **config.optimizer),
                     progress_bar=False)
    model.train(1, _chunks(batches[:stream.warm], config.micro))  # warm start: one pass
    size = batches[0].features.batch_size
    k = 1 if config.micro is None else -(-size // config.micro)
    chunks = _chunks(batches[stream.warm:], config.micro)
    scorer = BatchScorer(batches[stream.warm:], k)
    callbacks = [scorer]
    monitor = None
    if k == 1:  # recstream's own prequential metric, on the same events: the figures must agree
        monitor = PrequentialMonitor(window=len(stream.labels), log_every=10 ** 9, verbose=False)
        callbacks.append(monitor)
    start = time.perf_counter()
    model.online_train(IterableStream(lambda: iter(chunks)), callbacks=callbacks, dataset_sink_mode=False)
    seconds = time.perf_counter() - start
    result = _result(config.name, np.concatenate(scorer.scores), stream, seconds)
    if monitor is not None:
        if abs(monitor.last["auc"] - result["auc"]) > 1e-12:
            raise AssertionError(f"{config.name}: PrequentialMonitor's AUC {monitor.last['auc']} differs from "
                                 f"the scorer's {result['auc']}")
        result["prequential_monitor_auc"] = monitor.last["auc"]
    return result


def _result(name: str, scores: np.ndarray, stream: Stream, seconds: float | None) -> dict:
    y = stream.labels
    if len(scores) != len(y):
        raise AssertionError(f"{name}: {len(scores)} scores for {len(y)} events")

    def auc(mask):
        return roc_auc(scores[mask], y[mask]) if 0 < y[mask].sum() < mask.sum() else None
    return {"system": name, "auc": roc_auc(scores, y), "auc_new_users": auc(stream.new_user),
            "auc_known_users": auc(~stream.new_user), "events_per_s": None if seconds is None else len(y) / seconds}


# --- the run --------------------------------------------------------------------------------------------
def load(name: str, args, seed: int | None = None) -> Stream:
    """Stream `name` of `args`' size, seed `seed` (None: ``args.seed``)."""
    gen = make_stream(name, args.batches, args.batch_size, args.seed if seed is None else seed)
    warm = int(args.batches * args.warmup)
    truth = np.concatenate([gen.probabilities(t) for t in range(warm, args.batches)])
    return Stream(name, list(gen), warm, gen.bayes_auc(warm, args.batches), gen.schema, truth)


def fmt(v, spec=".4f") -> str:
    return "n/a" if v is None else format(v, spec)


def report(stream: Stream, seed: int, bayes: dict, rows: list[dict], missing: list[str]) -> None:
    print(f"\n{stream.name}: {len(stream.batches)} batches x {stream.batches[0].features.batch_size}, seed {seed}, "
          f"warm start on {stream.warm}, {len(stream.labels):,} events scored; Bayes AUC {stream.bayes:.4f}; "
          f"{stream.new_user.mean():.1%} of them by users and {stream.new_item.mean():.1%} on items no earlier "
          f"batch had")
    print("| system | prequential AUC | gap to Bayes | AUC, new users | AUC, known users | events/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in [bayes, *rows]:
        print(f"| {r['system']} | {r['auc']:.4f} | {stream.bayes - r['auc']:.4f} | {fmt(r['auc_new_users'])} | "
              f"{fmt(r['auc_known_users'])} | {fmt(r['events_per_s'], ',.0f')} |", flush=True)
    for line in missing:
        print(f"- {line}")


def family(system: str) -> str:
    """Which system a row's name belongs to: ``"recstream"``, ``"VW"``, ``"River"`` or ``"Bayes"``."""
    return system.split(" ")[0]


def summarize(name: str, by_seed: dict[int, dict]) -> dict:
    """Per system, its AUC under every seed, their mean and spread (max - min); per seed, recstream's
    best row minus VW's and River's best (the anchors' target: ahead on every stream). Printed too."""
    seeds = list(by_seed)
    systems = [r["system"] for r in by_seed[seeds[0]]["rows"]]
    auc = {s: [next(r["auc"] for r in by_seed[k]["rows"] if r["system"] == s) for k in seeds] for s in systems}
    table = [{"system": s, "aucs": a, "mean": float(np.mean(a)), "spread": max(a) - min(a)} for s, a in auc.items()]
    margins = {}
    for anchor in ("VW", "River"):
        pairs = [(max((v[i] for s, v in auc.items() if family(s) == "recstream"), default=None),
                  max((v[i] for s, v in auc.items() if family(s) == anchor), default=None)) for i in range(len(seeds))]
        if all(a is not None and b is not None for a, b in pairs):
            margins[anchor] = [a - b for a, b in pairs]
    print(f"\n{name}, seeds {', '.join(map(str, seeds))}: prequential AUC per seed, mean and spread (max - min)")
    print(f"| system | {' | '.join(f'seed {k}' for k in seeds)} | mean | spread |")
    print(f"| --- | {' | '.join('---' for _ in seeds)} | --- | --- |")
    for r in table:
        print(f"| {r['system']} | {' | '.join(f'{a:.4f}' for a in r['aucs'])} | {r['mean']:.4f} | {r['spread']:.4f} |")
    for anchor, m in margins.items():
        print(f"- recstream's best row minus {anchor}'s best, per seed: {', '.join(f'{v:+.4f}' for v in m)}")
    return {"seeds": seeds, "systems": table, "margins": margins}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--warmup", type=float, default=0.2, help="fraction of the batches trained on before scoring")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="the streams' seeds, each a whole run (default 0 1; --quick: 0); the summary gives the spread")
    p.add_argument("--seed", type=int, default=None, help="one seed: the same as --seeds SEED")
    p.add_argument("--streams", nargs="+", default=["drifting", "coldstart"], choices=["drifting", "coldstart"])
    p.add_argument("--quick", action="store_true", help="30 batches: a smoke run, not a measurement")
    p.add_argument("--search", action="store_true",
                   help="also SEARCH's recstream configurations, another of VW and River's grid")
    p.add_argument("--no-anchors", action="store_true", help="recstream rows only")
    p.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                   help="recstream rows whose name contains one of these texts only")
    p.add_argument("--exact", action="store_true",
                   help="--only's texts name whole rows (without the leading 'recstream '): 'WideDeep, crosses' "
                        "selects that row, not also 'WideDeep, crosses, micro 32'")
    p.add_argument("--crosses", nargs="+", default=None, metavar="A:B",
                   help="the crosses of the 'crosses' rows (features joined by ':'), instead of the stream's CROSSES")
    args = p.parse_args(argv)
    if args.seed is not None and args.seeds is not None:
        p.error(f"give --seed or --seeds, not both (got --seed {args.seed} and --seeds {args.seeds})")
    seeds = [args.seed] if args.seed is not None else args.seeds or ([0] if args.quick else [0, 1])
    if args.quick:
        args.batches = 30
    torch.set_num_threads(1)
    results = {}
    for name in args.streams:
        by_seed = {seed: run_stream(name, seed, args) for seed in seeds}
        results[name] = {**by_seed[seeds[0]], "by_seed": by_seed}
        if len(seeds) > 1:
            results[name]["summary"] = summarize(name, by_seed)
    return results


def selected(name: str, only: list[str] | None, exact: bool = False) -> bool:
    """Whether recstream row `name` runs under ``--only`` `only` (None: every row): a text of `only` is
    part of the name, or (`exact`) the whole name without its leading ``"recstream "``."""
    if only is None:
        return True
    if exact:
        return name.removeprefix("recstream ") in only
    return any(text in name for text in only)


def run_stream(name: str, seed: int, args) -> dict:
    """Every system on stream `name` of seed `seed`; prints its table."""
    stream = load(name, args, seed)
    found, missing = ([], []) if args.no_anchors else anchors(name, args.search)
    rows = [run_anchor(a, stream) for a in found]
    configs = DEFAULTS + BEST + (SEARCH if args.search else [])
    crosses = None if args.crosses is None else tuple(tuple(c.split(":")) for c in args.crosses)
    rows += [run_recstream(c, stream, crosses) for c in configs if selected(c.name, args.only, args.exact)]
    bayes = _result("Bayes (the true probabilities)", stream.probabilities, stream, None)
    report(stream, seed, bayes, rows, missing)
    return {"bayes": stream.bayes, "bayes_row": bayes, "new_users": float(stream.new_user.mean()),
            "new_items": float(stream.new_item.mean()), "rows": rows, "missing": missing}


if __name__ == "__main__":
    main()
