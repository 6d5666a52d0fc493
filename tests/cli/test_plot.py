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
    (tmp_path / "metrics.jsonl").write_text("not json\n")
    done = _plot(tmp_path)
    assert done.returncode == 2 and "holds no rows yet" in done.stderr.splitlines()[-1]
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    done = _plot(tmp_path, "--metric", "auc")
    assert done.returncode == 2 and "--metric auc: not a metric of this run" in done.stderr


def test_malformed_rows_are_skipped_with_a_count(tmp_path):
    """A row that is a list, 100k-deep, invalid UTF-8 or a 5000-digit number ended plot with
    AttributeError / RecursionError / UnicodeDecodeError / ValueError (exit 1)."""
    good = [{"step": 10 * i, "loss": 0.5, "auc": 0.7, "seconds": float(i)} for i in range(1, 4)]
    bad = [b"[1, 2]\n", b'{"step": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", b'{"step": 5, "auc": "\xff"}\n',
           b'{"step": ' + b"9" * 5000 + b"}\n", b"not json\n", b'{"step": 1e400, "auc": 10' + b"0" * 400 + b"}\n"]
    (tmp_path / "metrics.jsonl").write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in good) + b"".join(bad))
    done = _plot(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "skipped 5 malformed rows of" in done.stderr and "(first: line 4, not a JSON object (a list))" in done.stderr
    assert {p.name for p in tmp_path.glob("*.png")} == {"loss.png", "metrics.png", "throughput.png"}


def test_thousands_of_metric_keys_draw_the_first_and_say_so(tmp_path):
    """5,000 metric keys took 67 s (a legend of 5,000 lines); metrics.png now draws 12, or the named ones."""
    rows = [{"step": 10 * i, "loss": 0.5, **{f"m{k:04d}": k / 5000 for k in range(5000)}} for i in range(1, 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = _plot(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "metrics.png draws 12 of 5000 metrics (--metric NAME picks them)" in done.stderr
    done = _plot(tmp_path, "--metric", "m4999", "--metric", "m0001")
    assert done.returncode == 0 and "draws" not in done.stderr, done.stderr


def test_plots_label_their_axes_draw_a_metric_per_axis_and_throughput_over_time():
    """No y labels, AUC and log loss on one axis, and a throughput line of two points (for 3 rows)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from recstream.cli.plot_cmd import figures
    rows = [{"epoch": e, "step": 40 * e, "loss": 0.6 - 0.05 * e, "auc": 0.7 + 0.01 * e, "logloss": 0.55 - 0.01 * e,
             "seconds": 2.0 * e + (e == 2)} for e in range(1, 4)]
    drawn = figures(plt, rows, ["auc", "logloss"])
    try:
        assert set(drawn) == {"loss.png", "metrics.png", "throughput.png"}
        for fig in drawn.values():
            assert all(ax.get_ylabel() for ax in fig.axes), [ax.get_ylabel() for ax in fig.axes]
        assert [ax.get_ylabel() for ax in drawn["metrics.png"].axes] == ["auc", "logloss"]
        assert [len(ax.lines) for ax in drawn["metrics.png"].axes] == [1, 1]
        (loss,) = drawn["loss.png"].axes  # the mean training loss beside the whole set's evaluation loss
        assert [line.get_label() for line in loss.lines] == ["mean training loss", "evaluation log loss (whole set)"]
        (speed,) = drawn["throughput.png"].axes
        xs, ys = speed.lines[0].get_data()
        assert list(xs) == [2.0, 5.0, 6.0] and list(ys) == [20.0, 40 / 3, 40.0]
        assert speed.get_xlabel() == "seconds since the start"
    finally:
        for fig in drawn.values():
            plt.close(fig)
