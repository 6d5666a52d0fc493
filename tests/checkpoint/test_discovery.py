"""`recstream.checkpoint.discovery.load_newest`: a directory of another model's checkpoints is said
in one line (issue 26: the README's examples run in one directory once restored another model's
`ckpt/`, which printed the same error five times and a traceback)."""
from __future__ import annotations

import logging
import os

import pytest
import torch

from recstream.checkpoint import CheckpointError, CheckpointMismatch, save_checkpoint
from recstream.checkpoint.discovery import load_newest


def _write(directory, n: int, net, opt=None) -> None:
    for i in range(n):
        path = save_checkpoint(os.path.join(directory, f"m-{i + 1}_1.safetensors"), net, opt)
        os.utime(path, (1_000_000 + i, 1_000_000 + i))  # a definite newest


def test_another_models_checkpoints_are_one_line_and_no_warning_per_file(tmp_path, caplog):
    other = torch.nn.Linear(4, 1)
    _write(tmp_path, 5, other, torch.optim.Adam(other.parameters()))
    mine = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    with caplog.at_level(logging.WARNING, logger="recstream.checkpoint"), \
            pytest.raises(CheckpointMismatch) as raised:
        load_newest(tmp_path, mine, torch.optim.Adam(mine.parameters()))
    message = str(raised.value)
    assert "\n" not in message and message.count("m-") == 1, message
    assert f"no checkpoint in {str(tmp_path)!r} fits this model: its 5 checkpoint(s) were written by another " \
           "model (the newest, m-5_1.safetensors: " in message
    assert not [r for r in caplog.records if "skipping checkpoint" in r.getMessage()]


def test_a_damaged_file_is_still_named_and_skipped(tmp_path, caplog):
    net = torch.nn.Linear(4, 1)
    _write(tmp_path, 2, net)
    with open(tmp_path / "m-2_1.safetensors", "r+b") as f:  # the newest, truncated
        f.truncate(40)
    with caplog.at_level(logging.WARNING, logger="recstream.checkpoint"):
        path, _ = load_newest(tmp_path, torch.nn.Linear(4, 1), None)
    assert os.path.basename(path) == "m-1_1.safetensors"
    assert any("skipping checkpoint" in r.getMessage() and "m-2_1" in r.getMessage() for r in caplog.records)
    os.remove(tmp_path / "m-1_1.safetensors")
    with pytest.raises(CheckpointError) as raised:  # damage only: not a mismatch
        load_newest(tmp_path, torch.nn.Linear(4, 1), None)
    assert not isinstance(raised.value, CheckpointMismatch) and "loads: m-2_1.safetensors" in str(raised.value)
