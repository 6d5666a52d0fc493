"""PrequentialMonitor: test-then-train order, rolling-window metrics, modes, reporting."""
import math

import numpy as np
import pytest
import torch
from safetensors import safe_open
from torch import nn

from recstream import Model
from recstream.callbacks.base import CallbackList, CallbackParams, RunContext
from recstream.callbacks.checkpointed import CHECKPOINT_ENTRY, callback_states, load_callback_states
from recstream.callbacks.prequential import PrequentialMonitor, PrequentialState, _Window
from recstream.checkpoint import load_checkpoint, save_checkpoint
from recstream.metrics import AUC, Metric, exact_auc


class Memorizer(nn.Module):
    """One weight per id: a single SGD step with a large lr makes it right on every id it trained on."""

    def __init__(self, n=10_000):
        super().__init__()
        self.w = nn.Embedding(n, 1)
        nn.init.zeros_(self.w.weight)

    def forward(self, ids):
        return self.w(ids).squeeze(1)


def unique_id_batches(n_batches, batch_size=16, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.permutation(10_000)[: n_batches * batch_size].reshape(n_batches, batch_size)
    return [(torch.from_numpy(b.astype(np.int64)), torch.from_numpy(rng.integers(0, 2, batch_size).astype(np.float32)))
            for b in ids]


def test_scores_before_training_on_the_batch():
    batches = unique_id_batches(8)
    net = Memorizer()
    mon = PrequentialMonitor(window=1000, log_every=4)
    model = Model(net, nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), lr=16 * 40.0), progress_bar=False)
    model.train(1, batches, callbacks=[mon])
    # Every id is new when scored, so an untrained-on event always scores 0.5: AUC 0.5, log loss ln 2.
    assert mon.last["auc"] == 0.5 and mon.last["logloss"] == pytest.approx(math.log(2))
    assert (mon.last["window_events"], mon.last["events"], mon.last["step"]) == (128, 128, 8)
    # Had it scored after training, the memorizer would be perfect: the test above would fail.
    net.eval()
    with torch.no_grad():
        after = torch.cat([net(x) for x, _ in batches])
    assert exact_auc(after, torch.cat([y for _, y in batches])) == 1.0


def run_loop(mon, net, batches, train=None):
    p = CallbackParams(network=net, cur_step_num=0)
    ctx = RunContext(p)
    with CallbackList([mon]) as cbs:
        cbs.on_train_begin(ctx)
        for batch in batches:
            p.cur_step_num += 1
            p.train_dataset_element = batch
            cbs.on_train_step_begin(ctx)
            if train:
                train(batch)
            cbs.on_train_step_end(ctx)
        cbs.on_train_end(ctx)
    return p


@pytest.mark.parametrize("window,batch_size", [(50, 16), (16, 16), (10, 16), (1000, 7)])
def test_rolling_window_matches_direct_computation(window, batch_size):
    torch.manual_seed(1)
    net = nn.Linear(3, 1)
    rng = np.random.default_rng(2)
    batches = [(torch.from_numpy(rng.standard_normal((batch_size, 3)).astype(np.float32)),
                torch.from_numpy(rng.integers(0, 2, batch_size).astype(np.float32))) for _ in range(9)]
    seen = []
    mon = PrequentialMonitor(window=window, log_every=1)
    p = CallbackParams(network=net, cur_step_num=0)
    ctx = RunContext(p)
    for x, y in batches:  # no training: scores are simply sigmoid(net(x))
        p.cur_step_num += 1
        p.train_dataset_element = (x, y)
        mon.on_train_step_begin(ctx)
        with torch.no_grad():
            seen.append((torch.sigmoid(net(x).squeeze(1)).double(), y.double()))
        s = torch.cat([a for a, _ in seen])[-window:]
        t = torch.cat([b for _, b in seen])[-window:]
        want_ll = -(t * torch.log(s) + (1 - t) * torch.log(1 - s)).mean().item()
        want_auc = exact_auc(s, t) if 0 < t.sum() < len(t) else None
        assert p.prequential["auc"] == (None if want_auc is None else pytest.approx(want_auc, abs=1e-12))
        assert p.prequential["logloss"] == pytest.approx(want_ll, rel=1e-9)
        assert p.prequential["window_events"] == len(s)


def test_ring_buffer_wraps():
    w = _Window(5)
    w.add(np.arange(3.0), np.zeros(3))
    w.add(np.arange(3.0, 7.0), np.ones(4))
    assert sorted(w.view()[0].tolist()) == [2.0, 3.0, 4.0, 5.0, 6.0] and w.total == 7
    w.add(np.arange(10.0, 18.0), np.ones(8))  # larger than the window
    assert sorted(w.view()[0].tolist()) == [13.0, 14.0, 15.0, 16.0, 17.0]


def test_restores_mode_and_builds_no_graph():
    net = nn.Sequential(nn.Linear(2, 4), nn.Dropout(0.5), nn.Linear(4, 1))
    batch = (torch.randn(8, 2), torch.tensor([0.0, 1.0] * 4))
    modes = []
    net.register_forward_pre_hook(lambda m, a: modes.append(m.training))
    mon = PrequentialMonitor(log_every=1)
    for training in (True, False):
        net.train(training)
        run_loop(mon, net, [batch])
        assert net.training is training
    assert modes == [False, False]  # scored in eval mode (dropout off) both times
    assert all(p.grad is None for p in net.parameters())

    class Broken(nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    broken = Broken().train()
    with pytest.raises(RuntimeError, match="boom"):
        run_loop(PrequentialMonitor(), broken, [batch])
    assert broken.training is True


def test_probabilities_dict_batches_custom_unpack_and_one_class():
    class Probs(nn.Module):
        def forward(self, x):
            return x[:, 0]

    x = torch.tensor([[0.9], [0.2], [0.6], [0.4]])
    y = torch.tensor([1.0, 0.0, 1.0, 0.0])
    p = run_loop(PrequentialMonitor(output="probabilities", log_every=1), Probs(), [{"x": x, "label": y}])
    assert p.prequential["auc"] == 1.0
    assert p.prequential["logloss"] == pytest.approx(-np.mean(np.log([0.9, 0.8, 0.6, 0.6])))
    mon = PrequentialMonitor(output="probabilities", log_every=1, unpack=lambda b: ((b["in"],), {}, b["y"]))
    p = run_loop(mon, Probs(), [{"in": x, "y": torch.ones(4)}])
    assert p.prequential["auc"] is None and p.prequential["logloss"] > 0  # one class: AUC undefined


def test_tensorboard_directory_and_writer(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    batches = [(torch.randn(8, 2), torch.tensor([0.0, 1.0] * 4)) for _ in range(4)]
    run_loop(PrequentialMonitor(log_every=2, tensorboard=str(tmp_path)), nn.Linear(2, 1), batches)
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [e.step for e in acc.Scalars("prequential/auc")] == [2, 4]
    assert [e.step for e in acc.Scalars("prequential/logloss")] == [2, 4]

    class Recorder:
        def __init__(self):
            self.calls = []

        def add_scalar(self, tag, value, step):
            self.calls.append((tag, step))

    rec = Recorder()
    run_loop(PrequentialMonitor(log_every=3, tensorboard=rec), nn.Linear(2, 1), batches)
    assert rec.calls == [("prequential/auc", 3), ("prequential/logloss", 3), ("prequential/auc_total", 3),
                         ("prequential/auc", 4), ("prequential/logloss", 4),
                         ("prequential/auc_total", 4)]  # + final report at the end


@pytest.mark.parametrize("kwargs,match", [
    (dict(window=0), "window"), (dict(log_every=0), "log_every"), (dict(output="odds"), "output"),
    (dict(unpack=3), "unpack"), (dict(tensorboard=3), "tensorboard"),
])
def test_argument_errors(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        PrequentialMonitor(**kwargs)


def test_unusable_batch_is_a_clear_error():
    with pytest.raises(ValueError, match=r"PrequentialMonitor: cannot find the labels.*unpack="):
        run_loop(PrequentialMonitor(), nn.Linear(2, 1), [torch.randn(3, 2)])


def test_every_batch_of_a_sink_is_scored_before_it_trains_and_whole_stream_metrics_are_exact(capsys):
    from recstream import Model
    from recstream.metrics import exact_auc

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 1), nn.Flatten(0))
    batches = [(torch.randn(16, 3), torch.randint(0, 2, (16,)).float()) for _ in range(10)]
    seen = []

    class Spy(PrequentialMonitor):  # records what the monitor scores, in order
        def _score(self, network, batch):
            scores, labels = super()._score(network, batch)
            seen.append((scores, labels))
            return scores, labels

    mon = Spy(window=64, log_every=1000)
    model = Model(net, nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), lr=0.5), progress_bar=False)
    model.train(2, batches, callbacks=[mon], dataset_sink_mode=True, sink_size=5)  # 2 sinks of 5
    assert len(seen) == 10  # not only the first batch of each of the 2 sinks
    scores = np.concatenate([s for s, _ in seen])
    labels = np.concatenate([y for _, y in seen])
    assert mon.last["events"] == 160 and mon.last["window_events"] == 64
    assert abs(mon.last["auc_total"] - exact_auc(scores, labels)) < 1e-4
    assert abs(mon.last["auc"] - exact_auc(scores[-64:], labels[-64:])) < 1e-12
    err = capsys.readouterr().err
    assert "prequential step" in err and "all 160 events: auc" in err  # visible without logging set up


# --- state across restarts ------------------------------------------------------------------
def random_batches(n, batch_size=16, seed=3):
    rng = np.random.default_rng(seed)
    return [(torch.from_numpy(rng.standard_normal((batch_size, 3)).astype(np.float32)),
             torch.from_numpy(rng.integers(0, 2, batch_size).astype(np.float32))) for _ in range(n)]


def score(mon, net, batches):
    p = CallbackParams(network=net, cur_step_num=0)
    for batch in batches:
        p.cur_step_num += 1
        p.train_dataset_element = batch
        mon.on_train_step_begin(RunContext(p))


@pytest.mark.parametrize("window", [20, 1000])  # wrapped (several times) and not
def test_a_state_round_trip_goes_on_exactly_as_one_monitor(window):
    """A monitor loaded from another's state gives, after the same further events, the same figures
    to the last bit: window, counters and whole-stream totals (a restart began them from 0)."""
    torch.manual_seed(4)
    net, batches = nn.Linear(3, 1), random_batches(12)
    whole = PrequentialMonitor(window=window, log_every=1, verbose=False)
    score(whole, net, batches)
    first = PrequentialMonitor(window=window, log_every=1, verbose=False)
    score(first, net, batches[:7])
    state = first.state_dict()
    assert isinstance(state, PrequentialState) and (state.batches, state.events) == (7, 7 * 16)
    second = PrequentialMonitor(window=window, log_every=1, verbose=False)  # the restarted process
    second.load_state_dict(state)
    assert second.compute() == first.compute()
    score(second, net, batches[7:])
    assert second.compute() == whole.compute()  # auc, logloss, auc_total, logloss_total, events: equal
    assert second.compute()["events"] == 12 * 16 and second.compute()["auc_total"] is not None


def test_a_state_goes_through_a_checkpoint_file_with_its_histogram_among_the_tensors(tmp_path):
    torch.manual_seed(5)
    net, batches = nn.Linear(3, 1), random_batches(5)
    mon = PrequentialMonitor(window=30, verbose=False)
    score(mon, net, batches)
    path = save_checkpoint(tmp_path / "c.safetensors", net, extra={CHECKPOINT_ENTRY: callback_states([mon])})
    with safe_open(path, "pt") as f:  # the histograms' non-zero bins only: 80 events fill at most 80
        index = f.get_tensor("extra.callbacks.prequential.auc.hist.index")
        count = f.get_tensor("extra.callbacks.prequential.auc.hist.count")
        assert index.dtype == count.dtype == torch.int64 and 0 < index.numel() == count.numel() <= 5 * 16
        assert int(count.sum()) == 5 * 16 and int(index.max()) < 2 * AUC().num_bins
        assert len(f.metadata()["meta"]) < 10_000  # the bins are no JSON
    assert (tmp_path / "c.safetensors").stat().st_size < 40_000  # was 16 MB: the dense histograms
    again = PrequentialMonitor(window=30, verbose=False)
    load_callback_states([again], load_checkpoint(path, restore_rng=False)[CHECKPOINT_ENTRY], str(path), step=5)
    assert again.compute() == mon.compute()
    assert again.state_dict().batches == 5



def test_a_checkpoint_of_the_dense_format_still_loads_to_the_same_figures(tmp_path):
    """Checkpoints written before the compact state hold the whole histograms as one tensor."""
    torch.manual_seed(8)
    net, batches = nn.Linear(3, 1), random_batches(6)
    mon = PrequentialMonitor(window=30, verbose=False)
    score(mon, net, batches[:4])
    states = callback_states([mon])
    states["prequential"]["auc"] = Metric.state_dict(mon._total_auc)  # the former AUC.state_dict
    assert states["prequential"]["auc"]["hist"].numel() == 2 * AUC().num_bins
    path = save_checkpoint(tmp_path / "old.safetensors", net, extra={CHECKPOINT_ENTRY: states})
    again = PrequentialMonitor(window=30, verbose=False)
    load_callback_states([again], load_checkpoint(path, restore_rng=False)[CHECKPOINT_ENTRY], path, step=4)
    score(mon, net, batches[4:])
    score(again, net, batches[4:])
    assert again.compute() == mon.compute() and again.compute()["events"] == 6 * 16

def test_a_smaller_window_keeps_the_newest_events_of_the_saved_one():
    torch.manual_seed(6)
    net, batches = nn.Linear(3, 1), random_batches(5)
    big = PrequentialMonitor(window=50, verbose=False)
    score(big, net, batches)  # 80 events: the ring wrapped
    small, fresh = PrequentialMonitor(window=20, verbose=False), PrequentialMonitor(window=20, verbose=False)
    small.load_state_dict(big.state_dict())
    score(fresh, net, batches)
    assert sorted(small._buf.view()[0]) == sorted(fresh._buf.view()[0])  # the last 20 events
    assert small.compute()["auc_total"] == big.compute()["auc_total"]


@pytest.mark.parametrize("change, words", [
    (lambda s: {k: v for k, v in s.items() if k != "events"}, "with the keys"),
    (lambda s: {**s, "window_pos": 99}, "not a state it can hold"),
    (lambda s: {**s, "window_labels": s["window_labels"][:3]}, "1-d tensors of one length"),
    (lambda s: {**s, "auc": {**s["auc"], "hist": torch.zeros(5, dtype=torch.int64)}}, "do not load"),
])
def test_a_state_that_does_not_fit_is_a_clear_error_and_changes_nothing(change, words):
    torch.manual_seed(7)
    net = nn.Linear(3, 1)
    mon = PrequentialMonitor(window=20, verbose=False)
    score(mon, net, random_batches(3))
    state = {f: getattr(mon.state_dict(), f) for f in ("batches", "events", "window_size", "window_scores",
                                                        "window_labels", "window_pos", "auc", "logloss")}
    before = mon.compute()
    with pytest.raises(ValueError, match=words):
        mon.load_state_dict(change(state))
    assert mon.compute() == before
