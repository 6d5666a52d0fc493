"""`recstream plot RUN_DIR`: PNGs from a run's metrics.jsonl; mistakes are one line, exit 2."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _plot(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "recstream.cli.main", "plot", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=120)


def test_plots_of_an_offline_and_an_online_run(tmp_path):
    offline = tmp_path / "offline"
    offline.mkdir()
    rows = [{"epoch": e, "step": 40 * e, "loss": 0.6 - 0.05 * e, "eval_loss": 0.62 - 0.04 * e, "auc": 0.7 + 0.01 * e,
             "seconds": 2.0 * e} for e in range(1, 4)]
    (offline / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"epoch": 4, "ste')
    done = _plot(offline)  # a torn last line (a crash mid-write) is left out
    assert done.returncode == 0, done.stderr
    assert {p.name for p in offline.glob("*.png")} == {"loss.png", "metrics.png", "throughput.png"}
    online, out = tmp_path / "online", tmp_path / "plots"
    online.mkdir(), out.mkdir()
    rows = [{"step": 10 * i, "events": 1000 * i, "auc": 0.7, "auc_total": 0.69, "logloss": 0.5} for i in range(1, 5)]
    (online / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _plot(online, "--output", out).returncode == 0
    assert (out / "prequential.png").stat().st_size > 1000 and not list(online.glob("*.png"))


def test_plot_mistakes_are_one_line_with_exit_status_2(tmp_path):
    for args, message in (([tmp_path / "missing"], "is not a directory"),
                          ([tmp_path], "has no metrics.jsonl"),
                          ([tmp_path, "--output", tmp_path / "nope"], None)):
        if message is None:
            (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
            message = "is not a directory (create it first)"
        done = _plot(*args)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    done = _plot(tmp_path)
    assert done.returncode == 2 and "metrics.jsonl:2: not a JSON row" in done.stderr
