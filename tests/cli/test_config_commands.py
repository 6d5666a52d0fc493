"""`recstream init | train | eval | online` in subprocesses, on Criteo-format data in the real TSV
layout made by `recstream produce`: the worked examples of examples/configs end to end, the run
directory they write, the --json result line, and `init`'s output accepted by `train`."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from recstream.cli import templates
from recstream.cli.errors import EXIT_USAGE

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "configs"


def cli(cwd, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "recstream", *argv], capture_output=True, text=True,
                            timeout=timeout, env=ENV, cwd=cwd)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def make_data(cwd, line: str) -> None:
    """Run the `recstream produce` command a config's comment gives."""
    argv = line.split("recstream produce", 1)[1].split()
    assert cli(cwd, "produce", *argv).returncode == 0


def json_result(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout  # --json: the one JSON line is all of stdout
    return json.loads(lines[0])


def produce_line(text: str) -> str:
    return next(line for line in text.splitlines() if "recstream produce" in line)


def test_init_writes_the_examples_and_refuses_to_overwrite(tmp_path):
    assert templates.OFFLINE == (EXAMPLES / "criteo_offline.yaml").read_text()
    assert templates.ONLINE == (EXAMPLES / "criteo_online.yaml").read_text()
    result = cli(tmp_path, "init")
    assert result.returncode == 0 and "recstream train recstream.yaml" in result.stdout
    # the example, its comments' commands naming the file written
    assert (tmp_path / "recstream.yaml").read_text() == templates.OFFLINE.replace("criteo_offline.yaml",
                                                                                 "recstream.yaml")
    assert "recstream train recstream.yaml" in (tmp_path / "recstream.yaml").read_text()
    again = cli(tmp_path, "init")
    assert again.returncode == EXIT_USAGE and "exists; use --force" in again.stderr
    assert cli(tmp_path, "init", "online.yaml", "--online").returncode == 0
    assert (tmp_path / "online.yaml").read_text() == templates.ONLINE.replace("criteo_online.yaml", "online.yaml")
    assert "recstream online online.yaml" in (tmp_path / "online.yaml").read_text()


def test_offline_example_train_then_eval(tmp_path):
    """examples/configs/criteo_offline.yaml as written: produce its data, train, evaluate."""
    config = str(EXAMPLES / "criteo_offline.yaml")
    make_data(tmp_path, produce_line(templates.OFFLINE))
    first = (tmp_path / "data" / "criteo" / "part-00000000.tsv").read_text().splitlines()[0].split("\t")
    assert len(first) == 40 and len(first[-1]) == 8  # label, 13 counts, 26 hex ids: the Criteo layout

    train = json_result(cli(tmp_path, "train", config, "--json"))
    run = tmp_path / "runs" / "criteo_offline"
    assert train["command"] == "train" and train["epochs"] == 2 and train["steps"] == 80
    assert 0.6 < train["metrics"]["auc"] <= 1.0 and train["metrics"]["logloss"] > 0
    assert {"config.yaml", "train.log", "metrics.csv", "metrics.jsonl", "checkpoints"} <= set(os.listdir(run))
    assert (run / "config.yaml").read_text() == templates.OFFLINE
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2] and rows[-1]["auc"] == train["metrics"]["auc"]
    with open(run / "metrics.csv") as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [40, 80]
    checkpoints = sorted(os.listdir(run / "checkpoints"))
    assert len(checkpoints) == 3 and os.path.basename(train["checkpoint"]) in checkpoints  # keep: 3
    assert "metrics: epoch=2" in (run / "train.log").read_text()

    result = cli(tmp_path, "eval", config, "--json")
    evaluated = json_result(result)
    assert evaluated["step"] == 80 and abs(evaluated["metrics"]["auc"] - train["metrics"]["auc"]) < 1e-9
    assert result.stderr.strip().splitlines()[-1].startswith("recstream eval: auc=")  # the human line
    assert (run / "eval.jsonl").exists() and (run / "eval.config.yaml").exists()


def test_online_example_and_resume(tmp_path):
    """examples/configs/criteo_online.yaml: a directory of Criteo events with event id/time; a second
    run resumes at the saved stream position and trains on the new events only."""
    config = str(EXAMPLES / "criteo_online.yaml")
    line = produce_line(templates.ONLINE)
    make_data(tmp_path, line.replace("--rows 20000", "--rows 6000"))
    first = json_result(cli(tmp_path, "online", config, "--json"))
    run = tmp_path / "runs" / "criteo_online"
    assert first["resumed_from_step"] is None and first["steps"] == 24  # 6000 events / 256
    assert first["metrics"]["events"] == 6000 and 0.0 <= first["metrics"]["auc"] <= 1.0
    assert {"config.yaml", "online.log", "metrics.csv", "metrics.jsonl", "checkpoints"} <= set(os.listdir(run))
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [20, 24]  # log_every: 20, and the final report
    assert os.listdir(run / "checkpoints") == ["model-1_24.safetensors"]  # it was model-25_1

    make_data(tmp_path, line.replace("--rows 20000", "--rows 2560"))
    result = cli(tmp_path, "online", config, "--json")
    second = json_result(result)
    assert second["resumed_from_step"] == 24 and second["steps"] == 34  # 10 more batches, nothing read twice
    assert "recstream online: resumed from step 24" in result.stderr  # it went to online.log only
    # names show the steps, one series across the restart (no model_1-*)
    assert sorted(os.listdir(run / "checkpoints"))[-1] == "model-1_34.safetensors"
    assert all(name.startswith("model-1_") for name in os.listdir(run / "checkpoints"))
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [20, 24, 34]
    # the prequential event count goes on across the restart (it started at 0 again: prequential.png went back)
    assert [r["events"] for r in rows] == [5120, 6000, 8560]
    assert rows[2]["seconds"] > rows[1]["seconds"]


def test_init_config_is_accepted_by_train(tmp_path):
    assert cli(tmp_path, "init", "my.yaml").returncode == 0
    text = (tmp_path / "my.yaml").read_text()
    # a smaller run of the same file: only the data size and the epochs differ
    make_data(tmp_path, produce_line(text).replace("--rows 24000 --file-records 20000", "--rows 3000 "
                                                                                          "--file-records 2000"))
    (tmp_path / "my.yaml").write_text(text.replace("epochs: 2", "epochs: 1"))
    result = cli(tmp_path, "train", "my.yaml")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("recstream train: 1 epochs, 4 steps"), result.stdout
