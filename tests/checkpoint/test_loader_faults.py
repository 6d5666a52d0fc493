"""Checkpoint loaders under hostile files: every failure is a `CheckpointError` raised before the
network, the optimizer or the RNGs change, `restore` falls back to the next older checkpoint, and
an optional keyed digest (RECSTREAM_CHECKPOINT_KEY) refuses files edited with their CRCs recomputed.

The files are real checkpoints, rewritten with safetensors the way an attacker (or a buggy tool)
would: content changed and every CRC recomputed, so only the new checks can catch them.
"""
import json
import random

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from recstream import RecModel, checkpoint
from recstream.callbacks import CheckpointConfig, ModelCheckpoint
from recstream.checkpoint import CheckpointError, file_format, load_checkpoint, save_checkpoint
from recstream.checkpoint.state_codec import checksum
from recstream.data.streams import IterableStream

KEY_VAR = "RECSTREAM_CHECKPOINT_KEY"


def _rewrite(path, edit_meta=None, edit_tensors=None, keep_hmac=True):
    """Rewrite a checkpoint with edited metadata/tensors and every checksum recomputed."""
    with safe_open(path, "pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if edit_tensors:
        edit_tensors(tensors)
    if "checksums" in meta:
        meta["checksums"] = json.dumps({k: checksum(v) for k, v in tensors.items()})
    if edit_meta:
        edit_meta(meta)
    if not keep_hmac:
        meta.pop("hmac_sha256", None)
    if file_format.META_CHECKSUM in meta:
        meta[file_format.META_CHECKSUM] = str(file_format._metadata_crc(meta))
    save_file(tensors, path, metadata=meta)


def _net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def _deep(depth):
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("entry", ["meta", "network", "aliases", "checksums"])
def test_deeply_nested_json_metadata_is_a_checkpoint_error(tmp_path, entry):
    path = save_checkpoint(tmp_path / "c.safetensors", _net(1), extra={"epoch": 1})
    _rewrite(path, edit_meta=lambda m: m.__setitem__(entry, _deep(100_000)))
    net = _net(2)
    before = _net(2)
    with pytest.raises(CheckpointError, match="c.safetensors"):
        load_checkpoint(path, net, restore_rng=False)
    assert _same(net, before)


def _bad_rng(which):
    def edit(meta):
        rng = json.loads(meta["rng"])
        if which == "python":
            rng["python"] = {"__tuple__": [3, {"__tuple__": [1, 2, 3]}, None]}  # 3 words, not 625
        elif which == "numpy":
            rng["numpy"]["__tuple__"][0] = "PCG64"
        else:
            rng["torch_cpu"] = rng["numpy"]["__tuple__"][1]  # an int64 tensor of 624 keys, not a torch state
        meta["rng"] = json.dumps(rng)
    return edit


@pytest.mark.parametrize("which", ["python", "numpy", "torch"])
def test_a_bad_rng_state_fails_before_anything_is_modified(tmp_path, which):
    net, opt = _net(1), None
    net(torch.ones(2, 3)).sum().backward()
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    opt.step()
    path = save_checkpoint(tmp_path / "c.safetensors", net, opt)
    _rewrite(path, edit_meta=_bad_rng(which))
    fresh, before = _net(2), _net(2)
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.5)
    torch_state, py_state, np_state = torch.get_rng_state(), random.getstate(), np.random.get_state()
    with pytest.raises(CheckpointError, match="RNG state"):
        load_checkpoint(path, fresh, fresh_opt)
    assert _same(fresh, before) and fresh_opt.state_dict()["state"] == {}
    assert fresh_opt.param_groups[0]["lr"] == 0.5
    assert torch.equal(torch.get_rng_state(), torch_state) and random.getstate() == py_state
    assert np.array_equal(np.random.get_state()[1], np_state[1])


def test_a_wrong_shape_is_a_checkpoint_error_and_changes_nothing(tmp_path):
    path = save_checkpoint(tmp_path / "c.safetensors", _net(1))
    _rewrite(path, edit_tensors=lambda t: t.__setitem__("network.2.weight", torch.zeros(1, 5)))
    fresh, before = _net(2), _net(2)
    with pytest.raises(CheckpointError, match="shape"):
        load_checkpoint(path, fresh, restore_rng=False)
    assert _same(fresh, before)


def test_a_structurally_broken_document_is_a_checkpoint_error(tmp_path):
    path = save_checkpoint(tmp_path / "c.safetensors", _net(1))
    _rewrite(path, edit_meta=lambda m: m.__setitem__("network", json.dumps({"__items__": 5})))
    with pytest.raises(CheckpointError):
        load_checkpoint(path, _net(2), restore_rng=False)


# ----- restore falls back -----
def _batches(n):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 3, generator=g), torch.rand(4, 1, generator=g)) for _ in range(n)]


def _model(net=None):
    net = net or _net(3)
    return RecModel(net, torch.nn.MSELoss(), torch.optim.Adam(net.parameters(), lr=0.01), progress_bar=False)


def _run(ckpt_dir, n=6):
    data = _batches(n)
    stream = IterableStream(lambda: iter(data))
    ckpt = ModelCheckpoint("run", ckpt_dir, CheckpointConfig(save_checkpoint_steps=2, keep_checkpoint_max=5))
    _model().online_train(stream, callbacks=[ckpt])
    return sorted(ckpt_dir.glob("*.safetensors"), key=lambda p: load_checkpoint(p, restore_rng=False)["cur_step_num"])


@pytest.mark.parametrize("fault", ["deep_json", "bad_rng"])
def test_restore_falls_back_to_the_next_older_checkpoint(tmp_path, fault):
    files = _run(tmp_path)  # steps 2, 4, 6
    assert len(files) == 3
    older = _net(0)
    load_checkpoint(files[1], older, restore_rng=False)
    edit = (lambda m: m.__setitem__("meta", _deep(100_000))) if fault == "deep_json" else _bad_rng("numpy")
    _rewrite(files[2], edit_meta=edit)
    net = _net(4)
    stream = IterableStream(lambda: iter(_batches(6)))
    meta = _model(net).restore(tmp_path, stream)
    assert meta["cur_step_num"] == 4 and stream.position() == {"batches": 4}
    assert _same(net, older)


# ----- the keyed digest -----
def test_crc_alone_accepts_an_edited_position_with_recomputed_checksums(tmp_path):
    """What CRC32 cannot do (documented): an edit with recomputed CRCs loads without a key."""
    path = save_checkpoint(tmp_path / "c.safetensors", _net(1), extra={"train_position": {"p:0": 100}})
    _rewrite(path, edit_meta=lambda m: m.__setitem__("meta", m["meta"].replace("100", "999")))
    assert load_checkpoint(path, restore_rng=False)["train_position"] == {"p:0": 999}


def test_keyed_digest_round_trip_and_refusals(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_VAR, "s3cret")
    net = _net(1)
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, net, extra={"train_position": {"p:0": 100}})
    with safe_open(path, "pt") as f:
        assert len(f.metadata()["hmac_sha256"]) == 64
    fresh = _net(2)
    assert load_checkpoint(path, fresh, restore_rng=False)["train_position"] == {"p:0": 100}
    assert _same(fresh, net)

    edited = tmp_path / "edited.safetensors"
    edited.write_bytes(path.read_bytes())
    _rewrite(edited, edit_meta=lambda m: m.__setitem__("meta", m["meta"].replace("100", "999")))
    with pytest.raises(CheckpointError, match="keyed digest"):
        load_checkpoint(edited, restore_rng=False)

    weights = tmp_path / "weights.safetensors"
    weights.write_bytes(path.read_bytes())
    _rewrite(weights, edit_tensors=lambda t: t["network.0.bias"].add_(1.0))
    with pytest.raises(CheckpointError, match="keyed digest"):
        load_checkpoint(weights, _net(2), restore_rng=False)

    monkeypatch.setenv(KEY_VAR, "other")
    with pytest.raises(CheckpointError, match="keyed digest"):
        load_checkpoint(path, restore_rng=False)

    monkeypatch.delenv(KEY_VAR)
    unsigned = save_checkpoint(tmp_path / "unsigned.safetensors", net)
    assert load_checkpoint(path, restore_rng=False)  # without a key the digest is not checked
    monkeypatch.setenv(KEY_VAR, "s3cret")
    with pytest.raises(CheckpointError, match="no keyed digest"):
        load_checkpoint(unsigned, restore_rng=False)


def test_keyed_digest_removed_from_a_signed_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_VAR, "s3cret")
    path = save_checkpoint(tmp_path / "c.safetensors", _net(1))
    _rewrite(path, keep_hmac=False)
    with pytest.raises(CheckpointError, match="no keyed digest"):
        load_checkpoint(path, restore_rng=False)


def test_an_empty_key_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_VAR, "")
    with pytest.raises(ValueError, match=KEY_VAR):
        save_checkpoint(tmp_path / "c.safetensors", _net(1))


# ----- sharded checkpoints (one process) -----
def _sharded(path, net, step):
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    net(torch.ones(2, 3)).sum().backward()
    opt.step()
    checkpoint.save_sharded(path, net, opt, extra={"cur_step_num": step, "epoch": 1})


@pytest.mark.parametrize("fault", ["deep_json", "not_an_object", "wrong_shape"])
def test_a_bad_sharded_checkpoint_is_a_checkpoint_error_and_changes_nothing(tmp_path, fault):
    net = _net(1)
    _sharded(tmp_path / "c", net, 1)
    if fault == "wrong_shape":
        other = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 1))
        with pytest.raises(CheckpointError, match="shape"):
            checkpoint.load_sharded(tmp_path / "c", other)
        return
    meta = tmp_path / "c" / checkpoint.sharded.META_FILE
    meta.write_text(_deep(100_000) if fault == "deep_json" else "[1, 2]")
    fresh, before = _net(2), _net(2)
    with pytest.raises(CheckpointError, match="recstream_checkpoint.json"):
        checkpoint.load_sharded(tmp_path / "c", fresh)
    assert _same(fresh, before)


def test_restore_falls_back_to_an_older_sharded_checkpoint(tmp_path):
    older = _net(1)
    _sharded(tmp_path / "run-1_1", older, 1)
    newer = _net(5)
    _sharded(tmp_path / "run-1_2", newer, 2)
    (tmp_path / "run-1_2" / checkpoint.sharded.META_FILE).write_text(_deep(100_000))
    net = _net(4)
    meta = _model(net).restore(tmp_path)
    assert meta["cur_step_num"] == 1 and _same(net, older)
