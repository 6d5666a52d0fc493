"""save_checkpoint / load_checkpoint: round trips, atomicity, validation of broken files."""
import json
import os
import random

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from recstream.checkpoint import CheckpointError, file_format, load_checkpoint, save_checkpoint


class Net(torch.nn.Module):
    """Parameters, a BatchNorm (buffers), tied weights, a growable buffer and dropout."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.proj = torch.nn.Linear(4, 10, bias=False)
        self.proj.weight = self.emb.weight  # tied
        self.bn = torch.nn.BatchNorm1d(10)
        self.drop = torch.nn.Dropout(0.5)
        self.register_buffer("table", torch.arange(6.0).reshape(3, 2))

    def forward(self, idx):
        return self.drop(self.bn(self.proj(self.emb(idx)))).sum()


def _train(net, opt, steps, seed_batch=0):
    losses = []
    g = torch.Generator().manual_seed(seed_batch)
    for _ in range(steps):
        idx = torch.randint(0, 10, (8,), generator=g)
        opt.zero_grad()
        loss = net(idx)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("make_opt", [
    lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4),
    lambda ps: torch.optim.Adam(ps, lr=1e-2, betas=(0.8, 0.95), amsgrad=True),
], ids=["sgd_momentum", "adam"])
def test_round_trip_resumes_identically(tmp_path, make_opt):
    net = Net()
    opt = make_opt(net.parameters())
    _train(net, opt, 3)
    path = save_checkpoint(tmp_path / "a.safetensors", net, opt, extra={"epoch": 7, "note": "x"})
    expected = _train(net, opt, 4, seed_batch=1)
    with safe_open(path, "pt") as f:  # the tied weight is stored once, as an alias
        assert "network.emb.weight" in f.keys() and "network.proj.weight" not in f.keys()
        assert json.loads(f.metadata()["aliases"]) == {"network.proj.weight": "network.emb.weight"}

    torch.manual_seed(123)  # different init and a different RNG stream
    net2 = Net()
    opt2 = make_opt(net2.parameters())
    meta = load_checkpoint(path, net2, opt2)
    assert meta["epoch"] == 7 and meta["note"] == "x" and meta["format_version"] == 1
    assert net2.proj.weight is net2.emb.weight  # tying survives loading
    # Same hyper-parameters (with their types: betas stays a tuple), optimizer state and dropout masks.
    assert opt2.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    assert _train(net2, opt2, 4, seed_batch=1) == expected
    assert _same_state(net, net2)


def test_optimizer_state_keys_and_json_metadata(tmp_path):
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam([{"params": [net.weight]}, {"params": [net.bias], "lr": 0.5}], betas=(0.9, 0.99))
    net(torch.randn(4, 3)).sum().backward()
    opt.step()
    path = save_checkpoint(tmp_path / "c.safetensors", net, opt, rng=False)
    with safe_open(path, "pt") as f:
        keys, meta = set(f.keys()), f.metadata()
    assert {"network.weight", "network.bias", "optimizer.state.0.exp_avg", "optimizer.state.1.exp_avg_sq",
            "optimizer.state.0.step"} <= keys
    assert not any(k.startswith("rng.") for k in keys)
    groups = json.loads(meta["optimizer"])["param_groups"]
    assert [g["lr"] for g in groups] == [0.001, 0.5] and groups[0]["betas"] == {"__tuple__": [0.9, 0.99]}
    opt2 = torch.optim.Adam([{"params": [net.weight]}, {"params": [net.bias], "lr": 1.0}])
    load_checkpoint(path, optimizer=opt2)
    assert opt2.param_groups[1]["lr"] == 0.5 and opt2.param_groups[0]["betas"] == (0.9, 0.99)
    assert torch.equal(opt2.state[net.bias]["exp_avg"], opt.state[net.bias]["exp_avg"])


def test_restores_python_numpy_and_torch_rng(tmp_path):
    path = save_checkpoint(tmp_path / "r.safetensors", torch.nn.Linear(1, 1))
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    load_checkpoint(path)
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])
    torch.manual_seed(5)
    load_checkpoint(path, restore_rng=False)
    assert not torch.equal(torch.rand(3), expected[2])


def test_extra_values_and_non_tensor_module_state(tmp_path):
    class WithExtra(torch.nn.Linear):
        def get_extra_state(self):
            return {"vocab": ["a", "b"], "version": 2}

        def set_extra_state(self, state):
            self.loaded_extra = state

    extra = {"t": torch.arange(3), "nested": {"x": (1, 2.5, None), 3: float("inf")}}
    path = save_checkpoint(tmp_path / "e.safetensors", WithExtra(2, 2), extra=extra)
    net = WithExtra(2, 2)
    meta = load_checkpoint(path, net)
    assert net.loaded_extra == {"vocab": ["a", "b"], "version": 2}
    assert torch.equal(meta["t"], torch.arange(3)) and meta["nested"] == {"x": (1, 2.5, None), 3: float("inf")}


def test_bad_arguments(tmp_path):
    p = tmp_path / "x.safetensors"
    with pytest.raises(TypeError, match="'network'"):
        save_checkpoint(p, {"w": torch.ones(1)})
    with pytest.raises(TypeError, match="'optimizer'"):
        save_checkpoint(p, torch.nn.Linear(1, 1), optimizer="sgd")
    with pytest.raises(ValueError, match="reserved"):
        save_checkpoint(p, torch.nn.Linear(1, 1), extra={"format_version": 9})
    with pytest.raises(TypeError, match="extra.obj"):
        save_checkpoint(p, torch.nn.Linear(1, 1), extra={"obj": object()})
    assert not p.exists()
    with pytest.raises(FileNotFoundError, match="x.safetensors"):
        load_checkpoint(p)


def test_failed_write_keeps_previous_file_and_leaves_no_partial(tmp_path, monkeypatch):
    net = torch.nn.Linear(2, 2)
    path = tmp_path / "ck.safetensors"
    save_checkpoint(path, net, extra={"epoch": 1})
    before = path.read_bytes()

    def crash_midway(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial bytes")
        raise OSError("disk full")

    monkeypatch.setattr(file_format, "save_file", crash_midway)
    with torch.no_grad():
        net.weight.add_(1)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, net, extra={"epoch": 2})
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["ck.safetensors"]  # temp file cleaned up
    assert load_checkpoint(path, torch.nn.Linear(2, 2))["epoch"] == 1


def test_truncated_file_names_the_file(tmp_path):
    path = save_checkpoint(tmp_path / "t.safetensors", torch.nn.Linear(50, 50))
    data = open(path, "rb").read()
    for cut in (len(data) - 100, 30, 0):
        with open(path, "wb") as f:
            f.write(data[:cut])
        with pytest.raises(CheckpointError, match="t.safetensors"):
            load_checkpoint(path, torch.nn.Linear(50, 50))


def test_flipped_data_byte_fails_checksum(tmp_path):
    net = torch.nn.Linear(50, 50)
    path = save_checkpoint(tmp_path / "f.safetensors", net, rng=False)
    data = bytearray(open(path, "rb").read())
    data[-5] ^= 0xFF  # inside the tensor data, header intact
    open(path, "wb").write(bytes(data))
    net2 = torch.nn.Linear(50, 50)
    before = {k: v.clone() for k, v in net2.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"f\.safetensors.*checksum"):
        load_checkpoint(path, net2)
    assert all(torch.equal(before[k], v) for k, v in net2.state_dict().items())  # untouched


def test_foreign_safetensors_file_is_rejected(tmp_path):
    path = tmp_path / "foreign.safetensors"
    save_file({"w": torch.ones(2)}, str(path))
    with pytest.raises(CheckpointError, match="foreign.safetensors.*not a recstream checkpoint"):
        load_checkpoint(path)


def test_key_mismatch_strict_and_non_strict(tmp_path):
    path = save_checkpoint(tmp_path / "k.safetensors", torch.nn.Linear(2, 2))
    other = torch.nn.Sequential(torch.nn.Linear(2, 2))
    before = other[0].weight.detach().clone()
    with pytest.raises(CheckpointError, match=r"k\.safetensors.*missing keys \['0.bias', '0.weight'\]"):
        load_checkpoint(path, other)
    assert torch.equal(other[0].weight, before)
    with pytest.warns(RuntimeWarning, match="unexpected keys"):
        load_checkpoint(path, other, strict=False)
    bigger = torch.nn.Linear(3, 2)  # same keys; the bias fits, the weight does not
    before = {k: v.clone() for k, v in bigger.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"does not fit.*weight: file \(2, 2\) vs network \(2, 3\)"):
        load_checkpoint(path, bigger)
    assert all(torch.equal(before[k], v) for k, v in bigger.state_dict().items())  # nothing half-loaded


def test_module_with_own_loading_may_change_buffer_size(tmp_path):
    class Table(torch.nn.Module):  # like a hash table: rows grow, loading resizes the buffer
        def __init__(self, rows):
            super().__init__()
            self.register_buffer("rows", torch.zeros(rows, 2))

        def _load_from_state_dict(self, state_dict, prefix, *args):
            self.rows = state_dict[prefix + "rows"].clone()

    big = Table(5)
    big.rows.fill_(3)
    path = save_checkpoint(tmp_path / "h.safetensors", big)
    small = Table(1)
    load_checkpoint(path, small)
    assert small.rows.shape == (5, 2) and bool((small.rows == 3).all())


def test_optimizer_mismatch_is_checked_before_loading_anything(tmp_path):
    net = torch.nn.Linear(2, 2)
    path = save_checkpoint(tmp_path / "o.safetensors", net, torch.optim.SGD(net.parameters(), lr=0.1))
    net2 = torch.nn.Linear(2, 2)
    before = net2.weight.detach().clone()
    wrong = torch.optim.SGD([net2.weight], lr=0.1)  # 1 param instead of 2
    with pytest.raises(CheckpointError, match="parameter groups of sizes"):
        load_checkpoint(path, net2, wrong)
    assert torch.equal(net2.weight, before)
    no_opt = save_checkpoint(tmp_path / "n.safetensors", net)
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        load_checkpoint(no_opt, optimizer=torch.optim.SGD(net.parameters(), lr=0.1))


def test_combined_optimizer_round_trip(tmp_path):
    """A composite optimizer (sparse tables + dense) saves and loads through the checkpoint."""
    from recstream.optim import LazyAdam, sparse_and_dense
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.EmbeddingBag(10, 4, sparse=True), torch.nn.Linear(4, 1))
    opt = sparse_and_dense(net, sparse=lambda p: LazyAdam(p, lr=0.1), dense=lambda p: torch.optim.Adam(p, lr=0.1))
    ids, offsets = torch.tensor([1, 2, 3]), torch.tensor([0, 2])
    net[1](net[0](ids, offsets)).sum().backward()
    opt.step()
    path = save_checkpoint(tmp_path / "c.safetensors", net, opt)
    net2 = torch.nn.Sequential(torch.nn.EmbeddingBag(10, 4, sparse=True), torch.nn.Linear(4, 1))
    opt2 = sparse_and_dense(net2, sparse=lambda p: LazyAdam(p, lr=0.1), dense=lambda p: torch.optim.Adam(p, lr=0.1))
    load_checkpoint(path, net2, opt2)
    for a, b in zip(opt.state_dict()["optimizers"].values(), opt2.state_dict()["optimizers"].values(), strict=True):
        for sa, sb in zip(a["state"].values(), b["state"].values(), strict=True):
            assert all(torch.equal(sa[k], sb[k]) for k in sa if isinstance(sa[k], torch.Tensor))
    wrong = torch.optim.SGD(net2.parameters(), lr=0.1)
    with pytest.raises(CheckpointError, match="parameter groups"):
        load_checkpoint(path, net2, wrong)
