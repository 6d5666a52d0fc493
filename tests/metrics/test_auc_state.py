"""AUC's saved state: the histograms' non-zero bins (not 16 MB of mostly zeros), exact round trips,
the dense form of older checkpoints still loading, and a corrupt state refused by name."""
import io

import numpy as np
import pytest
import torch

from recstream.distributed import merge_states
from recstream.metrics import AUC, Metric

DENSE_BYTES = 2 * AUC().num_bins * 8  # the two int64 histograms at the defaults: 16 MB


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _ctr_batches(n_batches=10, size=1000, seed=0, from_logits=False):
    """Click-through-like scores (mostly small probabilities) with labels that follow them."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        p = rng.beta(1.2, 20.0, size).astype(np.float32)
        y = (rng.random(size) < p * 3).astype(np.int64)
        scores = np.log(p / (1 - p)).astype(np.float32) if from_logits else p
        out.append((torch.from_numpy(scores), torch.from_numpy(y)))
    return out


def _through_a_file(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_the_state_of_10000_scores_is_a_small_fraction_of_the_dense_histograms():
    metric = AUC()
    for batch in _ctr_batches():
        metric.update(*batch)
    state = metric.state_dict()
    nonzero = int((metric._hist != 0).sum())
    assert state["hist"]["index"].numel() == nonzero <= 10_000
    assert _tensor_bytes(state) < DENSE_BYTES / 50, _tensor_bytes(state)  # 153 KB here; was all 16 MB
    assert _tensor_bytes(Metric.state_dict(metric)) >= DENSE_BYTES  # the former, dense state


@pytest.mark.parametrize("from_logits", [False, True])
def test_a_round_trip_goes_on_to_the_uninterrupted_auc_to_the_last_bit(from_logits):
    batches = _ctr_batches(from_logits=from_logits)
    whole, first = AUC(from_logits=from_logits), AUC(from_logits=from_logits)
    for batch in batches:
        whole.update(*batch)
    for batch in batches[:6]:
        first.update(*batch)
    resumed = AUC(from_logits=from_logits)
    resumed.load_state_dict(_through_a_file(first.state_dict()))
    assert torch.equal(resumed._hist, first._hist)
    for batch in batches[6:]:
        resumed.update(*batch)
    assert resumed.eval() == whole.eval() and resumed.error_bound() == whole.error_bound()
    assert torch.equal(resumed._hist, whole._hist)


def test_an_empty_and_an_unused_state_round_trip():
    never = AUC()
    never.load_state_dict(AUC().state_dict())
    with pytest.raises(RuntimeError, match="number of samples is 0"):
        never.eval()
    empty_batch = AUC()
    empty_batch.update(torch.zeros(0), torch.zeros(0))  # a histogram of zeros, not None
    state = empty_batch.state_dict()
    assert state["hist"]["index"].numel() == 0
    again = AUC()
    again.load_state_dict(_through_a_file(state))
    assert again._hist is not None and not again._hist.any()
    with pytest.raises(RuntimeError, match="both classes"):
        again.eval()


def test_the_dense_state_of_older_checkpoints_still_loads():
    batches = _ctr_batches(4)
    metric = AUC()
    for batch in batches[:2]:
        metric.update(*batch)
    old = _through_a_file(Metric.state_dict(metric))  # what AUC.state_dict returned before
    assert isinstance(old["hist"], torch.Tensor) and old["hist"].numel() == 2 * metric.num_bins
    resumed = AUC()
    resumed.load_state_dict(old)
    for batch in batches[2:]:
        metric.update(*batch)
        resumed.update(*batch)
    assert resumed.eval() == metric.eval()
    new = resumed.state_dict()["hist"]
    assert torch.equal(new["index"], metric.state_dict()["hist"]["index"])


def _state():
    metric = AUC(num_bins=4096)
    metric.update(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1]))
    return metric.state_dict()


def _with(**hist):
    state = _state()
    return {**state, "hist": {**state["hist"], **hist}}


@pytest.mark.parametrize("state, words", [
    (_with(count=torch.tensor([1, 1, 1], dtype=torch.int64)),
     r"state\['hist'\]: 'index' and 'count' must have one length, got 4 and 3"),
    (_with(index=torch.tensor([0, 1, 2, 2 * 3969], dtype=torch.int64)),
     r"state\['hist'\]\['index'\] holds 7938, out of range \[0, 7938\)"),
    (_with(index=torch.tensor([-1, 1, 2, 3], dtype=torch.int64)), r"\['index'\] holds -1, out of range"),
    (_with(index=torch.tensor([1, 2, 2, 3], dtype=torch.int64)), r"\['index'\] must be strictly increasing"),
    (_with(count=torch.tensor([1, -2, 1, 1], dtype=torch.int64)), r"\['count'\] holds a negative count, -2"),
    (_with(count=torch.ones(4)), r"\['count'\] must be a 1-d int64 tensor, got a torch.float32 tensor"),
    (_with(index=[1, 2, 3, 4]), r"\['index'\] must be a 1-d int64 tensor, got a list"),
    (_with(length=100), r"\(num_bins=3969\): state\['hist'\]\['length'\] is 100, expected 7938"),
    ({**_state(), "hist": {"index": torch.zeros(0, dtype=torch.int64)}},
     r"state\['hist'\] must be a dict with the keys \['count', 'index', 'length'\], got \['index'\]"),
    ({**_state(), "hist": -torch.ones(7938, dtype=torch.int64)}, r"state\['hist'\] holds a negative count"),
    ({**_state(), "hist": torch.ones(7938)}, r"state\['hist'\] must hold int64 counts, got torch.float32"),
])
def test_a_corrupt_state_is_refused_by_name_and_changes_nothing(state, words):
    metric = AUC(num_bins=4096)
    metric.update(torch.tensor([0.2, 0.9]), torch.tensor([0, 1]))
    before = metric._hist.clone()
    with pytest.raises(ValueError, match=r"AUC.load_state_dict.*" + words):
        metric.load_state_dict(state)
    assert torch.equal(metric._hist, before)


def test_ranks_states_merge_bin_by_bin():
    """`all_reduce_metrics` adds the ranks' states: compact histograms add their counts per bin."""
    batches = _ctr_batches(3, size=500)
    ranks, whole = [AUC(), AUC(), AUC()], AUC()
    for rank, batch in zip(ranks, batches, strict=True):
        rank.update(*batch)
        rank.update(*batches[0])  # every rank shares some bins with the others
        whole.update(*batch)
        whole.update(*batches[0])
    merged = AUC()
    merged.load_state_dict(merge_states([r.state_dict() for r in ranks], "AUC"))
    assert torch.equal(merged._hist, whole._hist) and merged.eval() == whole.eval()
    with pytest.raises(ValueError, match=r"AUC: 'hist': the histograms have 7938 and 2031618 bins"):
        merge_states([_state(), ranks[0].state_dict()], "AUC")
