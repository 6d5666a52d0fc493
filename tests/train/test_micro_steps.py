"""Micro-steps in online training: `RecModel.online_train(..., micro_batch_size=k)` trains each batch
as k-row optimizer steps in order, scores the whole batch before any of them, and keeps the stream
positions, step counter and checkpoints per batch. (Exactly once under SIGKILL with micro-steps:
tests/train/test_exactly_once_kill.py.)"""
import copy
import warnings

import numpy as np
import pytest
import torch

from recstream import RecModel
from recstream.callbacks import CheckpointConfig, LambdaCallback, ModelCheckpoint, PrequentialMonitor
from recstream.data import DriftingCTR
from recstream.data.batch import Batch, WeightedLabel, split_rows, with_loss_weight
from recstream.data.streams import IterableStream
from recstream.metrics import exact_auc
from recstream.models import DeepFM, WideDeep, default_optimizer
from recstream.train.micro_steps import MicroSteps

BATCHES, ROWS, MICRO = 6, 100, 32  # 100 rows: slices of 32, 32, 32 and 4


def _gen():
    return DriftingCTR(num_batches=BATCHES, batch_size=ROWS, seed=3, table="hashed", table_size=512)


def _net(gen, kind=DeepFM):
    torch.manual_seed(0)
    return kind(gen.schema, hidden=(16,), embedding_dim=4)


def _stream(gen):
    return IterableStream(lambda: (gen.batch(t) for t in range(BATCHES)))


def _hand_micro_steps(net, opt, batch, size, loss_fn):
    """What micro-steps mean, written out: one optimizer step per consecutive slice of `size` rows."""
    for start in range(0, batch.batch_size, size):
        part = batch.slice(start, start + size)
        opt.zero_grad()
        loss_fn(net(part.features), part.labels).backward()
        opt.step()


def _same_parameters(a, b):
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-6, msg=f"{name} differs")


@pytest.mark.parametrize("kind", [DeepFM, WideDeep])
@pytest.mark.parametrize("sink_mode", [False, True])
def test_micro_steps_equal_a_hand_loop_of_steps_on_the_slices(kind, sink_mode):
    gen = _gen()
    net = _net(gen, kind)
    hand = copy.deepcopy(net)
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net, lr=1e-2), progress_bar=False)
    model.online_train(_stream(gen), dataset_sink_mode=sink_mode, sink_size=4, micro_batch_size=MICRO)

    opt, loss_fn = default_optimizer(hand, lr=1e-2), torch.nn.BCEWithLogitsLoss()
    hand.train()
    for t in range(BATCHES):
        _hand_micro_steps(hand, opt, gen.batch(t), MICRO, loss_fn)
    _same_parameters(net, hand)

    # and it is not what one step per batch gives (the comparison above can fail)
    whole = copy.deepcopy(_net(gen, kind))
    RecModel(whole, torch.nn.BCEWithLogitsLoss(), default_optimizer(whole, lr=1e-2), progress_bar=False) \
        .online_train(_stream(gen), dataset_sink_mode=sink_mode, sink_size=4)
    with pytest.raises(AssertionError):
        _same_parameters(net, whole)


def test_step_counter_positions_and_hooks_stay_per_batch(tmp_path):
    gen = _gen()
    net = _net(gen)
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net), progress_bar=False)
    stream = _stream(gen)
    ckpt = ModelCheckpoint("online", str(tmp_path), CheckpointConfig(save_checkpoint_steps=2, keep_checkpoint_max=10))
    seen = []
    steps = LambdaCallback(on_train_step_end=lambda ctx: seen.append(
        (ctx.original_args().cur_step_num, dict(ctx.original_args().train_position))))
    model.online_train(stream, callbacks=[ckpt, steps], dataset_sink_mode=False, micro_batch_size=MICRO)
    assert seen == [(t + 1, {"batches": t + 1}) for t in range(BATCHES)]
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == [  # at batch boundaries, named by batch
        f"online-1_{s}.safetensors" for s in (2, 4, 6)]


@pytest.mark.parametrize("sink_mode", [False, True])
def test_prequential_scores_come_from_the_model_before_the_batchs_first_micro_step(sink_mode):
    gen = _gen()
    net = _net(gen)
    hand = copy.deepcopy(net)
    monitor = PrequentialMonitor(window=BATCHES * ROWS, log_every=1, verbose=False)
    model = RecModel(net, torch.nn.BCEWithLogitsLoss(), default_optimizer(net, lr=1e-2), progress_bar=False)
    model.online_train(_stream(gen), callbacks=[monitor], dataset_sink_mode=sink_mode, sink_size=3,
                       micro_batch_size=MICRO)

    # by hand: score the whole batch, then train it in micro-steps
    opt, loss_fn = default_optimizer(hand, lr=1e-2), torch.nn.BCEWithLogitsLoss()
    before, after, labels = [], [], []
    for t in range(BATCHES):
        batch = gen.batch(t)
        hand.eval()
        with torch.no_grad():
            before.append(torch.sigmoid(hand(batch.features)).double().numpy())
        hand.train()
        _hand_micro_steps(hand, opt, batch, MICRO, loss_fn)
        hand.eval()
        with torch.no_grad():  # what a model that trained first would score: must differ
            after.append(torch.sigmoid(hand(batch.features)).double().numpy())
        hand.train()
        labels.append(batch.labels.double().numpy())
    scores, after, labels = np.concatenate(before), np.concatenate(after), np.concatenate(labels)
    got = monitor.compute()
    assert got["auc"] == pytest.approx(exact_auc(scores, labels), abs=1e-8)
    eps = 1e-7
    p = np.clip(scores, eps, 1 - eps)
    assert got["logloss"] == pytest.approx(float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p))),
                                           abs=1e-8)
    assert abs(got["auc"] - exact_auc(after, labels)) > 1e-4


def test_weighted_labels_are_sliced_with_their_weight_and_train_like_the_hand_loop():
    class WeightedBCE(torch.nn.Module):
        def forward(self, logits, label):
            return torch.nn.functional.binary_cross_entropy_with_logits(logits, label.labels) * label.weight

    gen = _gen()
    net = _net(gen)
    hand = copy.deepcopy(net)
    weighted = [with_loss_weight(gen.batch(t), 0.5 if t % 2 else 2.0) for t in range(BATCHES)]
    assert isinstance(weighted[0], Batch) and isinstance(weighted[0].labels, WeightedLabel)
    model = RecModel(net, WeightedBCE(), torch.optim.SGD(net.parameters(), lr=0.1), progress_bar=False)
    model.online_train(IterableStream(iter(weighted)), dataset_sink_mode=False, micro_batch_size=MICRO)

    opt = torch.optim.SGD(hand.parameters(), lr=0.1)
    hand.train()
    for b in weighted:
        for part in split_rows(b, MICRO):
            assert part.labels.weight == b.labels.weight
            opt.zero_grad()
            WeightedBCE()(hand(part.features), part.labels).backward()
            opt.step()
    _same_parameters(net, hand)


def test_split_rows_keeps_structure_and_order_and_refuses_mismatched_rows():
    gen = _gen()
    batch = gen.batch(0)
    parts = batch.split(MICRO)
    assert [p.batch_size for p in parts] == [32, 32, 32, 4]
    assert Batch.concat(parts).features.values.tolist() == batch.features.values.tolist()
    assert torch.equal(torch.cat([p.labels for p in parts]), batch.labels)
    for i, p in enumerate(parts):  # each slice is the same rows as Features.take would give
        rows = torch.arange(i * MICRO, min((i + 1) * MICRO, ROWS))
        assert p.features.offsets.tolist() == batch.features.take(rows).offsets.tolist()
    kw = split_rows({"x": torch.zeros(5, 2), "flag": True, "w": torch.tensor(1.0)}, 2)
    assert [d["x"].shape[0] for d in kw] == [2, 2, 1] and all(d["flag"] is True for d in kw)
    with pytest.raises(ValueError, match=r"different numbers of rows: \[3, 5\]"):
        split_rows((torch.zeros(5, 2), torch.zeros(3)), 2)
    with pytest.raises(ValueError, match="nothing with rows"):
        split_rows((1, "a"), 2)
    with pytest.raises(ValueError, match="'size'"):
        split_rows(torch.zeros(4), 0)


@pytest.mark.parametrize(("value", "error"), [(0, ValueError), (-3, ValueError), (2.0, TypeError),
                                              (True, TypeError), ("32", TypeError)])
def test_micro_batch_size_is_validated(value, error):
    net = torch.nn.Linear(4, 1)
    model = RecModel(net, torch.nn.MSELoss(), torch.optim.SGD(net.parameters(), lr=0.1), progress_bar=False)
    stream = IterableStream(iter([(torch.zeros(4, 4), torch.zeros(4, 1))]))
    with pytest.raises(error, match=r"RecModel.online_train: 'micro_batch_size' must be an int >= 1 or None"):
        model.online_train(stream, micro_batch_size=value)
    assert stream.position() == {"batches": 0}  # refused before reading anything


class _FailsOnCall(torch.nn.Module):
    """A linear model whose training forward raises on its `fail_at`-th call (a micro-step each)."""

    def __init__(self, fail_at: int):
        super().__init__()
        self.lin, self.calls, self.fail_at = torch.nn.Linear(2, 1), 0, fail_at

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == self.fail_at:
                raise RuntimeError("boom")
        return self.lin(x)


def test_a_failure_inside_a_batchs_micro_steps_writes_no_exception_checkpoint(tmp_path):
    """An exception checkpoint records the position before the failing batch; after a micro-step of
    it the weights hold some of its rows, so such a file would train them twice after a restore."""

    net = _FailsOnCall(4 + 3)  # the first batch's 4 slices, then the second's third
    model = RecModel(net, torch.nn.MSELoss(), torch.optim.SGD(net.parameters(), lr=0.1), progress_bar=False)
    data = [(torch.randn(8, 2), torch.randn(8, 1)) for _ in range(3)]
    ckpt = ModelCheckpoint("online", str(tmp_path), CheckpointConfig(save_checkpoint_steps=1, exception_save=True))
    with warnings.catch_warnings(record=True) as caught, pytest.raises(RuntimeError, match="boom"):
        warnings.simplefilter("always")
        model.online_train(IterableStream(iter(data)), callbacks=[ckpt], dataset_sink_mode=False,
                           micro_batch_size=2)
    assert not list(tmp_path.glob("*breakpoint*"))
    assert [p.name for p in tmp_path.glob("*.safetensors")] == ["online-1_1.safetensors"]
    assert any("part of a batch" in str(w.message) for w in caught)


def test_a_failure_on_a_batchs_first_micro_step_still_writes_the_exception_checkpoint(tmp_path):
    net = _FailsOnCall(5)  # the second batch's first slice: nothing of it trained yet
    model = RecModel(net, torch.nn.MSELoss(), torch.optim.SGD(net.parameters(), lr=0.1), progress_bar=False)
    data = [(torch.randn(8, 2), torch.randn(8, 1)) for _ in range(3)]
    ckpt = ModelCheckpoint("online", str(tmp_path), CheckpointConfig(save_checkpoint_steps=10, exception_save=True))
    with pytest.raises(RuntimeError, match="boom"):
        model.online_train(IterableStream(iter(data)), callbacks=[ckpt], dataset_sink_mode=False,
                           micro_batch_size=2)
    assert len(list(tmp_path.glob("*breakpoint*"))) == 1


def test_micro_steps_return_the_row_weighted_mean_loss():
    net = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(net.weight)

    class Step(torch.nn.Module):  # no update: the loss of each slice is the mean of its targets
        def forward(self, x, y):
            return (y - net(x)).mean()

    micro = MicroSteps(Step(), 3)
    loss = micro(torch.zeros(7, 1), torch.arange(7.0).view(7, 1))
    assert micro.steps_done == 3
    assert loss.item() == pytest.approx(3.0)  # (0+1+2) + (3+4+5) + 6, over 7 rows


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (slicing ids where they live)")
def test_split_on_cuda_gathers_on_the_device_and_matches_the_host_split():
    batch = _gen().batch(0)
    host, device = batch.split(MICRO), batch.to("cuda").split(MICRO)
    for h, d in zip(host, device, strict=True):
        assert d.features.values.device.type == "cuda" and d.labels.device.type == "cuda"
        assert torch.equal(d.features.values.cpu(), h.features.values)
        assert torch.equal(d.features.offsets.cpu(), h.features.offsets)
        assert torch.equal(d.features.dense.cpu(), h.features.dense) and torch.equal(d.labels.cpu(), h.labels)
