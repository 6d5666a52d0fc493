"""`recstream train` as a user runs it: one line per epoch with mean losses, a time that is the
command's, Ctrl-C (a real SIGINT to the process) naming the checkpoint written and the command that
resumes, a run directory refused without --resume/--new, --resume continuing at the right epoch
(one checkpoint series, metrics.csv going on), and eval --checkpoint best|newest."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

from tests.cli.test_config_commands import ENV, EXAMPLES, cli, json_result

CONFIG = (EXAMPLES / "criteo_offline.yaml").read_text()


def setup(tmp_path, epochs: int) -> str:
    assert cli(tmp_path, "produce", "--synthetic", "--format", "criteo", "--no-meta", "--rows", "6000",
               "--file-records", "5000", "--directory", "data/criteo").returncode == 0
    text = CONFIG.replace("epochs: 2", f"epochs: {epochs}").replace("every_steps: 20", "every_steps: 4") \
        .replace("patience: 2", "patience: 20")
    (tmp_path / "c.yaml").write_text(text)
    return "c.yaml"


def rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_train_prints_one_line_per_epoch_with_mean_losses_and_the_commands_time(tmp_path):
    config = setup(tmp_path, 2)
    start = time.perf_counter()
    result = cli(tmp_path, "train", config, "--json")
    wall = time.perf_counter() - start
    out = json_result(result)
    epochs = [line for line in result.stderr.splitlines() if line.startswith("epoch")]
    assert [line.split(":")[0] for line in epochs] == ["epoch 1/2", "epoch 2/2"], result.stderr
    assert "net_output" not in result.stderr and "eval_loss" not in result.stderr  # last-batch figures
    assert set(out["metrics"]) == {"loss", "auc", "logloss"}
    # the command's time (it reported fit's 1.3 s of a 6.9 s command); the interpreter's exit is outside it
    assert 0.5 * wall < out["seconds"] <= wall, (out["seconds"], wall)


def test_ctrl_c_names_the_checkpoint_and_resume_continues_the_run(tmp_path):
    config = setup(tmp_path, 5)
    run = tmp_path / "runs" / "criteo_offline"
    proc = subprocess.Popen([sys.executable, "-m", "recstream", "train", config], cwd=tmp_path, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:  # Ctrl-C once epoch 2 is done
        seen.append(line)
        if line.startswith("epoch 2/5"):
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.communicate(timeout=120)[1]
    err = "".join(seen) + rest
    assert proc.returncode == 130, err
    written = re.search(r"interrupted (in epoch 3|after epoch 2); checkpoint (\S+) written", err)
    assert written and os.path.isfile(written.group(2)), err
    assert f"resume with: recstream train {config} --resume" in err and "Traceback" not in err
    before = rows(run)
    assert [r["epoch"] for r in before] == [1, 2]  # no row for the epoch Ctrl-C cut short

    again = cli(tmp_path, "train", config)
    assert again.returncode == 2 and "--resume" in again.stderr and "--new" in again.stderr, again.stderr

    resumed = cli(tmp_path, "train", config, "--resume", "--json")
    out = json_result(resumed)
    # the signal lands in epoch 3 (a checkpoint inside it: epoch 3 again) or just after epoch 2 ended
    assert re.search(r"resumed from model-3_2\d\.safetensors, written inside epoch 3: that epoch runs again",
                     resumed.stderr) or "resumed from model-2_20.safetensors (end of epoch 2, step 20)" in \
        resumed.stderr, resumed.stderr
    after = rows(run)
    assert [r["epoch"] for r in after] == [1, 2, 3, 4, 5] and after[:2] == before
    steps = [r["step"] for r in after]
    assert steps == [10, 20, 30, 40, 50] and out["steps"] == 50
    names = sorted(os.listdir(run / "checkpoints"))
    assert all(re.fullmatch(r"model-\d+_\d+\.safetensors", n) for n in names), names  # one series, no model_1-*
    assert os.path.basename(out["checkpoint"]) == "model-5_50.safetensors"

    best = max(after, key=lambda r: r["auc"])  # the example's early stopping monitors auc
    evaluated = json_result(cli(tmp_path, "eval", config, "--checkpoint", "best", "--json"))
    assert (evaluated["epoch"], evaluated["step"]) == (best["epoch"], best["step"])
    assert abs(evaluated["metrics"]["auc"] - best["auc"]) < 1e-9
    newest = json_result(cli(tmp_path, "eval", config, "--checkpoint", "newest", "--json"))
    assert (newest["epoch"], newest["step"]) == (5, 50)

    new = cli(tmp_path, "train", config, "--new", "--json")
    assert json_result(new)["steps"] == 50
    aside = [d for d in os.listdir(run) if d.startswith("earlier-")]
    assert len(aside) == 1 and (run / aside[0] / "checkpoints" / "model-5_50.safetensors").is_file()
    assert [r["epoch"] for r in rows(run)] == [1, 2, 3, 4, 5]
