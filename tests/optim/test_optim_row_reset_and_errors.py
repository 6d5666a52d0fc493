"""Row-reset protocol (``param.pop_reset_rows``) and argument validation."""

import pytest
import torch
from torch import nn

from recstream.optim import FTRL, LazyAdam, RowWiseAdagrad

from ._optim_helpers import sparse_grad


class FakeResets:
    """Stands in for HashEmbedding: pending reassigned rows, cleared on pop."""

    def __init__(self):
        self.pending, self.calls = [], 0

    def __call__(self):
        self.calls += 1
        rows, self.pending = torch.tensor(self.pending, dtype=torch.long), []
        return rows


def _param_with_resets(rows=5, dim=3):
    p = nn.Parameter(torch.zeros(rows, dim))
    p.pop_reset_rows = FakeResets()
    return p


def test_lazy_adam_resets_moments_of_reassigned_rows_before_update():
    p = _param_with_resets()
    opt = LazyAdam([p], lr=0.1)
    for _ in range(3):
        p.grad = sparse_grad([1, 2, 3], torch.ones(3, 3), p.shape)
        opt.step()
    m_row3 = opt.state[p]["exp_avg"][3].clone()
    p.pop_reset_rows.pending = [1, 2]
    g = torch.full((1, 3), -2.0)
    p.grad = sparse_grad([1], g, p.shape)
    opt.step()
    st = opt.state[p]
    # Row 1: fresh moments, then this step's gradient only.
    torch.testing.assert_close(st["exp_avg"][1], 0.1 * g[0])
    torch.testing.assert_close(st["exp_avg_sq"][1], 0.001 * g[0] ** 2)
    # Row 2 reset but not in the batch: zero state; row 3 untouched: kept.
    assert not st["exp_avg"][2].any() and not st["exp_avg_sq"][2].any()
    assert torch.equal(st["exp_avg"][3], m_row3)
    assert p.pop_reset_rows.calls == 4 and p.pop_reset_rows.pending == []


def test_rowwise_adagrad_and_ftrl_reset_to_initial_accumulator():
    p, q = _param_with_resets(), _param_with_resets()
    ada = RowWiseAdagrad([p], lr=0.1, initial_accumulator_value=0.25)
    ftrl = FTRL([q], lr=0.1, initial_accumulator_value=0.5)
    for x in (p, q):
        x.grad = sparse_grad([0, 4], torch.ones(2, 3), x.shape)
    ada.step()
    ftrl.step()
    p.pop_reset_rows.pending = [4]
    q.pop_reset_rows.pending = [4, 4]  # duplicates are harmless
    p.grad = sparse_grad([0], torch.ones(1, 3), p.shape)
    q.grad = sparse_grad([0], torch.ones(1, 3), q.shape)
    ada.step()
    ftrl.step()
    assert ada.state[p]["sum"][4].item() == 0.25
    assert ada.state[p]["sum"][0].item() == pytest.approx(2.25)
    assert torch.equal(ftrl.state[q]["accumulator"][4], torch.full((3,), 0.5))
    assert not ftrl.state[q]["linear"][4].any()
    assert ftrl.state[q]["linear"][0].ne(0).all()


def test_pop_is_called_even_before_state_exists():
    p = _param_with_resets()
    p.pop_reset_rows.pending = [0, 1]
    opt = RowWiseAdagrad([p])
    p.grad = sparse_grad([2], torch.ones(1, 3), p.shape)
    opt.step()
    assert p.pop_reset_rows.calls == 1 and p.pop_reset_rows.pending == []


@pytest.mark.parametrize("bad", [[1, 2], torch.tensor([1.0]), torch.tensor([True])])
def test_pop_reset_rows_must_return_integer_tensor(bad):
    p = nn.Parameter(torch.zeros(3, 2))
    p.pop_reset_rows = lambda: bad
    opt = LazyAdam([p])
    p.grad = torch.ones(3, 2)
    with pytest.raises(TypeError, match="pop_reset_rows"):
        opt.step()


@pytest.mark.parametrize("cls,kwargs,exc,match", [
    (RowWiseAdagrad, {"lr": -0.1}, ValueError, r"RowWiseAdagrad: 'lr' must be a finite number >= 0\.0, got -0\.1"),
    (RowWiseAdagrad, {"eps": float("nan")}, ValueError, "'eps' must be a finite number >= 0.0, got nan"),
    (RowWiseAdagrad, {"weight_decay": -1}, ValueError, "'weight_decay' must be a finite number >= 0.0, got -1"),
    (RowWiseAdagrad, {"initial_accumulator_value": -1.0}, ValueError, "'initial_accumulator_value'"),
    (RowWiseAdagrad, {"lr": "0.1"}, TypeError, r"RowWiseAdagrad: 'lr' must be a finite number >= 0\.0, "
                                               r"got '0\.1' \(str\)"),
    (LazyAdam, {"betas": (0.9, 1.0)}, ValueError, r"LazyAdam: 'betas\[1\]' must be .*< 1\.0, got 1\.0"),
    (LazyAdam, {"betas": (-0.1, 0.9)}, ValueError, r"'betas\[0\]' must be a finite number >= 0\.0"),
    (LazyAdam, {"betas": (0.9, True)}, TypeError, r"'betas\[1\]' must be a finite number.*got True \(bool\)"),
    (LazyAdam, {"betas": 0.9}, TypeError, r"LazyAdam: 'betas' must be a pair \(beta1, beta2\), got 0\.9 \(float\)"),
    (LazyAdam, {"betas": (0.9, 0.99, 0.999)}, ValueError, r"'betas' must be a pair \(beta1, beta2\)"),
    (LazyAdam, {"eps": -1e-8}, ValueError, "LazyAdam: 'eps'"),
    (FTRL, {"lr": 0.0}, ValueError, r"FTRL: 'lr' must be a finite number > 0\.0, got 0\.0"),
    (FTRL, {"lr_power": 0.5}, ValueError, r"FTRL: 'lr_power' must be a finite number <= 0\.0, got 0\.5"),
    (FTRL, {"l1": -1.0}, ValueError, "FTRL: 'l1'"),
    (FTRL, {"l2": -1.0}, ValueError, "FTRL: 'l2'"),
    (FTRL, {"l2": None}, TypeError, r"FTRL: 'l2' must be a finite number >= 0\.0, got None \(NoneType\)"),
    (FTRL, {"initial_accumulator_value": -0.1}, ValueError, "'initial_accumulator_value'"),
])
def test_bad_hyper_parameters_are_rejected(cls, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        cls([nn.Parameter(torch.zeros(2))], **kwargs)


def test_bad_group_is_rejected_and_not_added():
    opt = LazyAdam([nn.Parameter(torch.zeros(2))])
    with pytest.raises(ValueError, match="LazyAdam: 'lr'"):
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(2))], "lr": -1.0})
    assert len(opt.param_groups) == 1
    with pytest.raises(TypeError, match=r"LazyAdam.add_param_group: 'param_group' must be a dict"):
        opt.add_param_group([nn.Parameter(torch.zeros(2))])


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support")
def test_unsupported_gradient_layouts():
    p = nn.Parameter(torch.zeros(3, 4))
    opt = RowWiseAdagrad([p])
    p.grad = torch.zeros(3, 4).to_sparse(2)  # sparse over both dims: not row-sparse
    with pytest.raises(ValueError, match="sparse_dim"):
        opt.step()
    # autograd refuses to store CSR grads on a strided param; check the helper.
    from recstream.optim._base import _rows_and_values
    with pytest.raises(TypeError, match="layout"):
        _rows_and_values(p, torch.eye(3).to_sparse_csr())


@pytest.mark.parametrize("cls", [RowWiseAdagrad, LazyAdam, FTRL])
def test_a_sparse_gradient_with_no_rows_is_a_no_op(cls):
    """A HashEmbedding step whose keys are all still pending has a gradient with no rows: nothing
    changes. (RowWiseAdagrad used to fail reshaping the empty gradient.)"""
    p = _param_with_resets()
    opt = cls([p], lr=0.1)
    p.grad = sparse_grad([], torch.ones(0, 3), p.shape)
    opt.step()
    assert not p.detach().any()


def test_default_optimizer_trains_a_step_whose_dynamic_keys_are_all_pending():
    from recstream import Model
    from recstream.data import Batch, CategoricalFeature, Features, Schema
    from recstream.models import WideDeep, default_optimizer

    schema = Schema(["x"], [CategoricalFeature("user", dynamic=True, capacity=100, permit_filter_value=2)])
    net = WideDeep(schema, hidden=(4,))
    x = Features.from_lengths(torch.zeros(3, 1), torch.tensor([1, 2, 3]), torch.ones(1, 3), keys=["user"])
    history = Model(net, nn.BCEWithLogitsLoss(), default_optimizer(net), progress_bar=False).train(
        1, [Batch(x, torch.zeros(3))])
    assert len(history.history["net_output"]) == 1
