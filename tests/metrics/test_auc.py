"""Streaming AUC: exactness against exact_auc, the error bound, inputs and bad inputs."""
import numpy as np
import pytest
import torch

from recstream.metrics import AUC, exact_auc
from recstream.metrics.auc import _OCTAVES


def stream(metric, scores, labels, batch=100_000):
    for i in range(0, len(scores), batch):
        metric.update(scores[i : i + batch], labels[i : i + batch])
    return metric


def logit_normal(rng, n, mean, std, shift, rate):
    """Labels with positive rate ``rate``; positives' logits shifted up by ``shift``."""
    y = rng.random(n) < rate
    z = rng.normal(mean, std, n) + shift * y
    return 1 / (1 + np.exp(-z)), y


def _dist(name, rng, n):
    if name == "uniform":
        return rng.random(n), rng.random(n) < 0.5
    if name == "ctr":  # nearly all scores in [0.01, 0.1], 4% positives
        return logit_normal(rng, n, -3.3, 0.45, 0.6, 0.04)
    if name == "ctr_weak":  # almost no signal: many near-equal pairs
        return logit_normal(rng, n, -3.0, 0.3, 0.05, 0.1)
    if name == "beta":
        y = rng.random(n) < 0.2
        return np.where(y, rng.beta(2, 30, n), rng.beta(1.5, 35, n)), y
    if name == "near_half":  # untrained model: scores within 0.5 +- 0.001
        y = rng.random(n) < 0.3
        return 0.5 + 1e-3 * np.tanh(rng.normal(0, 1, n) + 0.3 * y), y
    if name == "near_one":
        y = rng.random(n) < 0.5
        return 1 - 10 ** rng.uniform(-6, -2, n) * np.where(y, 0.8, 1.0), y
    if name == "discrete":  # heavy ties
        y = rng.random(n) < 0.4
        return np.round(rng.random(n) + 0.2 * y, 2) / 1.2, y
    if name == "tiny":  # probabilities around 1e-7
        y = rng.random(n) < 0.5
        return 10 ** rng.uniform(-8, -6, n) * np.where(y, 1.3, 1.0), y
    raise KeyError(name)


DISTRIBUTIONS = ["uniform", "ctr", "ctr_weak", "beta", "near_half", "near_one", "discrete", "tiny"]


@pytest.mark.parametrize("name", DISTRIBUTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_exact_auc_within_1e_3(name, dtype):
    rng = np.random.default_rng(DISTRIBUTIONS.index(name))
    s, y = _dist(name, rng, 100_000)
    scores, labels = torch.from_numpy(s).to(dtype), torch.from_numpy(y)
    metric = stream(AUC(), scores, labels, batch=25_000)
    exact = exact_auc(scores, labels)
    error = abs(metric.eval() - exact)
    assert error <= metric.error_bound() + 1e-12
    assert error < 1e-4  # observed max over these cases: 1.5e-5 (near_half)
    if name not in ("near_half", "discrete"):  # bound itself is below 1e-3 except for
        assert metric.error_bound() < 1e-3  # 0.002-wide score ranges and coarse ties


def test_millions_of_ctr_rows_in_batches():
    rng = np.random.default_rng(42)
    s, y = logit_normal(rng, 2_000_000, -3.3, 0.5, 0.7, 0.035)
    assert np.mean((s > 0.01) & (s < 0.1)) > 0.9
    scores = torch.from_numpy(s).float()
    labels = torch.from_numpy(y).long()
    metric = stream(AUC(), scores, labels, batch=65_536)
    exact = exact_auc(scores, labels)
    assert abs(metric.eval() - exact) < 1e-6
    assert metric.error_bound() < 1e-4


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_scores_are_exact(dtype):
    # one bin per representable value: within-bin pairs are true ties, so no error at all
    rng = np.random.default_rng(7)
    s, y = logit_normal(rng, 100_000, -2.0, 1.5, 0.8, 0.2)
    scores = torch.from_numpy(s).to(dtype)
    assert AUC()(scores, torch.from_numpy(y)) == pytest.approx(exact_auc(scores, y), abs=1e-12)


def test_logits_are_binned_without_sigmoid_saturation():
    rng = np.random.default_rng(3)
    y = rng.random(100_000) < 0.5
    z = rng.normal(20, 2, 100_000) + 0.5 * y  # float32 sigmoid is exactly 1.0 for most
    z = torch.from_numpy(z).float()
    exact = exact_auc(z, y)  # == exact AUC of the true sigmoid: a strictly increasing map
    assert exact_auc(torch.sigmoid(z), y) == pytest.approx(0.5, abs=0.05)  # saturated ties
    metric = AUC(from_logits=True)
    metric.update(z, y)
    assert abs(metric.eval() - exact) < 1e-4 and metric.error_bound() < 1e-3


@pytest.mark.parametrize("std", [1e-3, 1.0, 10.0])
def test_logits_match_exact(std):
    rng = np.random.default_rng(int(std * 1000))
    y = rng.random(200_000) < 0.3
    z = torch.from_numpy(rng.normal(0, std, 200_000) + 0.3 * std * y)
    metric = stream(AUC(from_logits=True), z, torch.from_numpy(y))
    exact = exact_auc(z, y)
    assert abs(metric.eval() - exact) <= metric.error_bound() + 1e-12
    assert abs(metric.eval() - exact) < 1e-4 and metric.error_bound() < 1e-3


def test_bound_is_attained_by_adversarial_ordering_within_a_bin():
    # every positive is just above every negative, but all share one bin
    scores = torch.tensor([0.3, 0.3, 0.3 + 1e-7, 0.3 + 1e-7])
    metric = AUC()
    metric.update(scores, [0, 0, 1, 1])
    assert exact_auc(scores, [0, 0, 1, 1]) == 1.0
    assert metric.eval() == 0.5 and metric.error_bound() == 0.5


@pytest.mark.parametrize("num_bins", [63, 200, 5000])
def test_bound_holds_for_coarse_histograms(num_bins):
    rng = np.random.default_rng(num_bins)
    for _ in range(20):
        s, y = logit_normal(rng, 3000, rng.normal(-2, 1), rng.uniform(0.1, 2), rng.uniform(-1, 2), 0.3)
        metric = AUC(num_bins=num_bins)
        metric.update(s, y)
        assert abs(metric.eval() - exact_auc(s, y)) <= metric.error_bound() + 1e-12


@pytest.mark.parametrize("from_logits", [False, True])
def test_binning_is_monotone_over_all_floats(from_logits):
    special = [0.0, -0.0, 1.0, 0.5, 1e-45, 1e-38, 2.0**-32, 2.0**-25, 64.0, 1e30, float("inf")]
    values = np.concatenate([special, np.negative(special), np.random.default_rng(0).standard_cauchy(100_000),
                             np.random.default_rng(1).random(100_000), 1 - 10 ** -np.linspace(0, 8, 1000)])
    ordered = torch.from_numpy(np.sort(values)).float()
    metric = AUC(num_bins=1000, from_logits=from_logits)
    bins = metric._bins(ordered)
    assert bins.min() >= 0 and bins.max() < metric.num_bins
    assert (bins[1:] >= bins[:-1]).all()
    assert bins[0] == 0 and bins[-1] == metric.num_bins - 1


def test_hand_computed_and_ties():
    assert AUC()([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert AUC()([0.5, 0.5, 0.2, 0.9], [0, 1, 0, 1]) == 0.875  # 0.5/0.5 tie counts 1/2


def test_input_layouts():
    two_col = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    one_hot = torch.tensor([[1, 0], [0, 1], [1, 0], [1, 0]])
    assert AUC()(two_col, one_hot) == pytest.approx(exact_auc(two_col[:, 1], [0, 1, 0, 0]))
    assert AUC()(two_col[:, 1:], one_hot[:, 1:]) == 1.0
    assert AUC()(np.array([0.1, 0.9]), [False, True]) == 1.0


def test_num_bins_budget():
    default = AUC()
    assert (default.mantissa_bits, default.num_bins) == (14, 2 * _OCTAVES * 2**14 + 1)
    assert default.num_bins <= 2**20
    assert AUC(num_bins=63).num_bins == 63
    assert AUC(num_bins=2**40).mantissa_bits == 23


def test_histogram_lives_on_input_device_and_is_constant_size():
    metric = AUC(num_bins=1000)
    metric.update(torch.rand(10), torch.randint(0, 2, (10,)))
    size = metric._hist.numel()
    metric.update(torch.rand(10_000), torch.randint(0, 2, (10_000,)))
    assert metric._hist.numel() == size == 2 * metric.num_bins
    assert metric._hist.device == torch.device("cpu") and metric._hist.dtype == torch.int64


def test_bad_inputs():
    with pytest.raises(ValueError, match="AUC: 'num_bins' must be an int >= 63, got 10"):
        AUC(num_bins=10)
    with pytest.raises(TypeError, match=r"AUC: 'num_bins' must be an int >= 63, got 1000000.0 \(float\)"):
        AUC(num_bins=1e6)
    with pytest.raises(TypeError, match=r"AUC: 'from_logits' must be a bool, got 1 \(int\)"):
        AUC(from_logits=1)
    with pytest.raises(RuntimeError, match="number of samples is 0"):
        AUC().eval()
    with pytest.raises(RuntimeError, match="both classes.*0 positive and 2 negative"):
        AUC()([0.1, 0.2], [0, 0])
    with pytest.raises(ValueError, match=r"y_pred must have shape \(N,\), \(N, 1\) or \(N, 2\), got \(2, 3\)"):
        AUC().update(np.zeros((2, 3)), [0, 1])
    with pytest.raises(ValueError, match="same number of samples, got 2 and 3"):
        AUC().update([0.1, 0.2], [0, 1, 1])
    with pytest.raises(ValueError, match=r"y_pred must be probabilities in \[0, 1\].*from_logits=True.*first one: 2.5"):
        AUC()([0.1, 2.5, 0.3], [0, 1, 1])
    with pytest.raises(ValueError, match="y_pred must not be NaN"):
        AUC(from_logits=True)([0.1, float("nan")], [0, 1])
    with pytest.raises(ValueError, match="2 value.*first one: 3.0"):
        AUC()([0.1, 0.2, 0.3], [0, 3, 3])
    with pytest.raises(ValueError, match=r"expects 2 input\(s\)"):
        AUC().update([0.1])
