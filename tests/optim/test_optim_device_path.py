"""The row-sparse optimizers' device path (static shapes, no host sync: what CUDA runs) leaves the
same tables and state as the host path (its compiled kernels: equal to float32 rounding), on CPU
tensors with duplicate rows in every gradient."""
import pytest
import torch

from recstream.hostpath import device_path
from recstream.optim import FTRL, LazyAdam, RowWiseAdagrad
from recstream.testing import SyncCounter

OPTIMIZERS = {
    "ftrl": lambda p: FTRL(p, lr=0.1, l1=0.05, l2=0.01),
    "rowwise_adagrad": lambda p: RowWiseAdagrad(p, lr=0.1, weight_decay=0.01),
    "lazy_adam": lambda p: LazyAdam(p, lr=0.05),
    "adam_boost": lambda p: torch.optim.Adam(p, lr=0.05),
}


def _train(make, on_device_path: bool, dims=(4, 1), steps=4, fuse=False):
    torch.manual_seed(0)
    tables = [torch.nn.Embedding(20, d, sparse=True) for d in dims]
    params = [t.weight for t in tables]
    opt = make(params)
    if isinstance(opt, torch.optim.Adam):
        from recstream.optim.sparse_rows import accept_sparse_rows
        accept_sparse_rows(opt, params, fuse=fuse)
    g = torch.Generator().manual_seed(1)
    counter = SyncCounter()
    for _ in range(steps):
        ids = torch.randint(0, 8, (40,), generator=g)  # many duplicates per row
        loss = sum((t(ids) * torch.randn(40, t.embedding_dim, generator=g)).sum() for t in tables)
        opt.zero_grad()
        loss.backward()
        if on_device_path:
            with device_path(), counter:
                opt.step()
        else:
            opt.step()
    return [p.detach().clone() for p in params], opt, counter


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_device_path_matches_host_path_without_syncs(name):
    # boost's Adam: tables of one width (tables of different widths are not joined: see the report)
    dims = (4, 4) if name == "adam_boost" else (4, 1)
    host, host_opt, _ = _train(OPTIMIZERS[name], False, dims=dims)
    dev, dev_opt, counter = _train(OPTIMIZERS[name], True, dims=dims)
    assert counter.syncs == 0, dict(counter.sync_ops)
    for a, b in zip(host, dev, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    for p_host, p_dev in zip(host_opt.param_groups[0]["params"], dev_opt.param_groups[0]["params"], strict=True):
        for key, value in host_opt.state[p_host].items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(dev_opt.state[p_dev][key], value, rtol=1e-5, atol=1e-6)


def test_fused_tables_device_path_matches_host_path_without_syncs():
    host, _, _ = _train(OPTIMIZERS["adam_boost"], False, dims=(4, 4, 4), fuse=True)
    dev, _, counter = _train(OPTIMIZERS["adam_boost"], True, dims=(4, 4, 4), fuse=True)
    assert counter.syncs == 0, dict(counter.sync_ops)
    for a, b in zip(host, dev, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_device_path_leaves_untouched_rows_alone():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 3, sparse=True)
    opt = LazyAdam(emb.parameters(), lr=0.1)
    before = emb.weight.detach().clone()
    emb(torch.tensor([2, 5, 2, 2])).sum().backward()
    with device_path():
        opt.step()
    changed = (emb.weight != before).any(dim=1)
    assert changed.tolist() == [i in (2, 5) for i in range(10)]
    assert opt.state[emb.weight]["exp_avg"][[0, 1, 3]].abs().sum() == 0
