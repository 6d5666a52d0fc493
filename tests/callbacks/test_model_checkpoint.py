"""ModelCheckpoint + CheckpointConfig: when files are written, their names, pruning, contents."""
import os

import pytest
import torch

from recstream.callbacks import CheckpointConfig, ModelCheckpoint, load_checkpoint
from recstream.callbacks import model_checkpoint as mc


def _files(d):
    return sorted(n for n in os.listdir(d) if not n.startswith("."))


def _net_opt():
    net = torch.nn.Linear(2, 1)
    return net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)


# ---------------------------------------------------------------- CheckpointConfig
def test_config_rules():
    cfg = CheckpointConfig(save_checkpoint_steps=10, save_checkpoint_seconds=30)
    assert cfg.save_checkpoint_steps == 10 and cfg.save_checkpoint_seconds is None  # steps wins
    cfg = CheckpointConfig(save_checkpoint_steps=0, save_checkpoint_seconds=30, keep_checkpoint_max=0,
                           keep_checkpoint_per_n_minutes=5)
    assert cfg.save_checkpoint_seconds == 30 and cfg.keep_checkpoint_max == 0 and cfg.keep_checkpoint_per_n_minutes == 5
    cfg = CheckpointConfig(keep_checkpoint_max=3, keep_checkpoint_per_n_minutes=5)
    assert cfg.keep_checkpoint_per_n_minutes is None  # count wins
    cfg = CheckpointConfig(save_checkpoint_steps=5, keep_checkpoint_max=0)
    assert cfg.keep_checkpoint_max == 1  # neither keep rule: keep one
    assert CheckpointConfig(append_info=["epoch_num", "step_num", {"lr": 0.1}]).append_dict == \
        {"epoch_num": 0, "step_num": 0, "lr": 0.1}


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"save_checkpoint_steps": -1}, ValueError, "save_checkpoint_steps.*-1"),
    ({"save_checkpoint_steps": 1.5}, TypeError, "save_checkpoint_steps"),
    ({"save_checkpoint_steps": "abc"}, TypeError, "save_checkpoint_steps.*'abc'"),
    ({"keep_checkpoint_max": True}, TypeError, "keep_checkpoint_max"),
    ({"save_checkpoint_steps": 0, "save_checkpoint_seconds": 0, "keep_checkpoint_max": 0}, ValueError, "can't all be"),
    ({"append_info": "epoch_num"}, TypeError, "append_info.*list"),
    ({"append_info": ["epochs"]}, ValueError, "epochs"),
    ({"append_info": [{"a": 1}, {"b": 2}]}, ValueError, "one dict"),
    ({"append_info": [3]}, TypeError, r"append_info\[0\]"),
    ({"crc_check": "yes"}, TypeError, "crc_check"),
    ({"append_info": [{"a": [1]}]}, TypeError, "a"),
    ({"exception_save": 1}, TypeError, "exception_save"),
    ({"saved_network": "net"}, TypeError, "saved_network"),
])
def test_config_rejects(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        CheckpointConfig(**kwargs)


def test_model_checkpoint_rejects(tmp_path):
    with pytest.raises(ValueError, match="prefix.*'a/b'"):
        ModelCheckpoint(prefix="a/b", directory=tmp_path)
    with pytest.raises(TypeError, match="prefix"):
        ModelCheckpoint(prefix=3, directory=tmp_path)
    with pytest.raises(ValueError, match="prefix"):
        ModelCheckpoint(prefix="", directory=tmp_path)
    with pytest.raises(TypeError, match="config"):
        ModelCheckpoint(directory=tmp_path, config={"save_checkpoint_steps": 1})
    with pytest.raises(TypeError, match="directory"):
        ModelCheckpoint(directory=3)


# ---------------------------------------------------------------- saving
def test_saves_every_n_steps_with_mindspore_names_and_final(tmp_path, driver):
    net, opt = _net_opt()
    cb = ModelCheckpoint(prefix="m", directory=tmp_path,
                         config=CheckpointConfig(save_checkpoint_steps=3, keep_checkpoint_max=10))
    driver([cb], net, opt, batch_num=4, epoch_num=2).run()
    # global steps 3 and 6 (epoch 1 step 3, epoch 2 step 2), then the final step 8 (not saved yet).
    assert _files(tmp_path) == ["m-1_3.safetensors", "m-2_2.safetensors", "m-2_4.safetensors"]
    assert cb.latest_ckpt_file_name == str(tmp_path / "m-2_4.safetensors")
    meta = load_checkpoint(cb.latest_ckpt_file_name, torch.nn.Linear(2, 1), restore_rng=False)
    assert (meta["epoch"], meta["step_in_epoch"], meta["cur_step_num"], meta["batch_num"]) == (2, 4, 8, 4)
    assert isinstance(meta["time"], float)


def test_no_duplicate_final_save(tmp_path, driver):
    net, opt = _net_opt()
    cb = ModelCheckpoint(directory=tmp_path, config=CheckpointConfig(save_checkpoint_steps=4))
    driver([cb], net, opt, batch_num=4, epoch_num=2).run()
    assert _files(tmp_path) == ["CKP-1_4.safetensors", "CKP-2_4.safetensors"]


def test_keeps_at_most_n_files_oldest_removed(tmp_path, driver):
    net, opt = _net_opt()
    cb = ModelCheckpoint(prefix="k", directory=tmp_path,
                         config=CheckpointConfig(save_checkpoint_steps=1, keep_checkpoint_max=2))
    driver([cb], net, opt, batch_num=3, epoch_num=2).run()
    assert _files(tmp_path) == ["k-2_2.safetensors", "k-2_3.safetensors"]


def test_saves_by_seconds(tmp_path, driver, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(mc, "_monotonic", lambda: clock[0])
    net, opt = _net_opt()
    cb = ModelCheckpoint(prefix="s", directory=tmp_path,
                         config=CheckpointConfig(save_checkpoint_steps=0, save_checkpoint_seconds=10,
                                                 keep_checkpoint_max=10))

    def tick(p):  # each step takes 4 "seconds": saves after >10 s, i.e. every third step
        clock[0] += 4.0

    driver([cb], net, opt, batch_num=4, epoch_num=2).run(on_step=tick)
    assert _files(tmp_path) == ["s-1_3.safetensors", "s-2_2.safetensors", "s-2_4.safetensors"]


def test_prefix_gets_suffix_when_files_exist(tmp_path, driver):
    net, opt = _net_opt()
    (tmp_path / "CKP-1_1.safetensors").write_bytes(b"old run")
    (tmp_path / "CKP_1-3_1.safetensors").write_bytes(b"older run")
    (tmp_path / "CKPX-1_1.safetensors").write_bytes(b"another prefix")
    cb = ModelCheckpoint(directory=tmp_path, config=CheckpointConfig(save_checkpoint_steps=2, keep_checkpoint_max=1))
    assert cb.prefix == "CKP_2"
    driver([cb], net, opt, batch_num=2, epoch_num=2).run()
    # Earlier runs' files are neither overwritten nor pruned.
    assert _files(tmp_path) == ["CKP-1_1.safetensors", "CKPX-1_1.safetensors", "CKP_1-3_1.safetensors",
                                "CKP_2-2_2.safetensors"]
    assert ModelCheckpoint(prefix="fresh", directory=tmp_path).prefix == "fresh"


def test_sink_mode_saves_at_sink_boundaries(tmp_path, driver):
    net, opt = _net_opt()
    cb = ModelCheckpoint(prefix="sink", directory=tmp_path,
                         config=CheckpointConfig(save_checkpoint_steps=3, keep_checkpoint_max=10))
    # One sink of 5 steps per epoch: cur_step_num 5, 10, 15 -> every sink passes the 3-step mark.
    driver([cb], net, opt, epoch_num=3, sink_size=5).run()
    assert _files(tmp_path) == ["sink-1_5.safetensors", "sink-2_5.safetensors", "sink-3_5.safetensors"]
    assert load_checkpoint(tmp_path / "sink-2_5.safetensors", restore_rng=False)["cur_step_num"] == 10


def test_contents_network_optimizer_append_info(tmp_path, driver):
    net, opt = _net_opt()

    def train_step(p):
        opt.zero_grad()
        net(torch.ones(1, 2)).sum().backward()
        opt.step()

    cfg = CheckpointConfig(save_checkpoint_steps=100, append_info=["epoch_num", "step_num", {"run": "abc"}])
    cb = ModelCheckpoint(prefix="c", directory=tmp_path, config=cfg)
    driver([cb], net, opt, batch_num=2, epoch_num=2).run(on_step=train_step)
    net2, opt2 = _net_opt()
    meta = load_checkpoint(cb.latest_ckpt_file_name, net2, opt2)
    assert (meta["epoch_num"], meta["step_num"], meta["run"]) == (2, 4, "abc")
    assert torch.equal(net2.weight, net.weight)
    assert torch.equal(opt2.state[net2.weight]["momentum_buffer"], opt.state[net.weight]["momentum_buffer"])


def test_exception_save_writes_breakpoint_file(tmp_path, driver):
    net, opt = _net_opt()
    cb = ModelCheckpoint(prefix="e", directory=tmp_path,
                         config=CheckpointConfig(save_checkpoint_steps=100, exception_save=True))

    def boom(p):
        if p.cur_step_num == 3:
            raise RuntimeError("step failed")

    with pytest.raises(RuntimeError, match="step failed"):
        driver([cb], net, opt, batch_num=2, epoch_num=3).run(on_step=boom)
    assert _files(tmp_path) == ["e-2_1_breakpoint.safetensors"]
    assert load_checkpoint(tmp_path / "e-2_1_breakpoint.safetensors", restore_rng=False)["cur_step_num"] == 3


def test_keep_one_per_n_minutes(tmp_path, driver):
    net, opt = _net_opt()
    cfg = CheckpointConfig(save_checkpoint_steps=1, keep_checkpoint_max=0, keep_checkpoint_per_n_minutes=1)
    cb = ModelCheckpoint(prefix="w", directory=tmp_path, config=cfg)
    driver([cb], net, opt, batch_num=3, epoch_num=2).run()
    # All saves fall in one minute: the window keeps its first file, plus the newest one.
    assert _files(tmp_path) == ["w-1_1.safetensors", "w-2_3.safetensors"]


def test_failed_save_does_not_prune_the_last_good_file(tmp_path, driver, monkeypatch):
    from recstream.checkpoint import file_format

    net, opt = _net_opt()
    cb = ModelCheckpoint(prefix="f", directory=tmp_path,
                         config=CheckpointConfig(save_checkpoint_steps=2, keep_checkpoint_max=1))
    real_save = file_format.save_file

    def fail_after_first(p):
        if p.cur_step_num == 3:
            monkeypatch.setattr(file_format, "save_file", lambda *a, **k: (_ for _ in ()).throw(OSError("no space")))

    with pytest.raises(OSError, match="no space"):
        driver([cb], net, opt, batch_num=2, epoch_num=2).run(on_step=fail_after_first)
    assert _files(tmp_path) == ["f-1_2.safetensors"]
    assert file_format.save_file is not real_save
    load_checkpoint(tmp_path / "f-1_2.safetensors", restore_rng=False)


FULL_DISK_WORKER = """
import resource, signal, sys, torch
sys.path.insert(0, {repo!r})
from recstream import Model
from recstream.callbacks import CheckpointConfig, ModelCheckpoint
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
net = torch.nn.Linear(64, 64)
model = Model(net, torch.nn.MSELoss(), torch.optim.Adam(net.parameters()), progress_bar=False)
data = [(torch.randn(4, 64), torch.randn(4, 64))] * 4
ckpt = ModelCheckpoint("run", {directory!r}, CheckpointConfig(save_checkpoint_steps=4, keep_checkpoint_max=5))
model.train(1, data, callbacks=[ckpt])          # one good checkpoint (~50 KB)
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))  # now the "disk" is full
try:
    model.train(2, data, callbacks=[ckpt], initial_epoch=1)
except OSError as e:
    print("ERROR", e)
"""


def test_full_disk_gives_a_clear_error_and_keeps_the_last_checkpoint(tmp_path):
    """A real write that fails (file-size limit: EFBIG, as a full disk's ENOSPC would) is reported
    with the file and the cause, leaves no partial file, and the previous checkpoint loads."""
    import subprocess
    import sys
    from pathlib import Path
    repo = str(Path(__file__).resolve().parents[2])
    script = tmp_path / "worker.py"
    script.write_text(FULL_DISK_WORKER.format(repo=repo, directory=str(tmp_path / "ckpt")))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(text for text in out.stdout.splitlines() if text.startswith("ERROR"))
    assert "could not write checkpoint" in line and "File too large" in line and "run-1_4.safetensors" in line
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files == ["run-1_4.safetensors"]  # no temp file left behind
    meta = load_checkpoint(tmp_path / "ckpt" / files[0], torch.nn.Linear(64, 64))
    assert meta["cur_step_num"] == 4
