"""Prequential figures across restarts: an online run that crashes or is SIGKILLed and resumes from
its checkpoint reports the same whole-stream totals (``events``, ``auc_total``, ``logloss_total``)
and window as one that never stopped: the monitor's state travels in each checkpoint and describes
exactly the events up to its stream position, so the events trained again are counted once."""
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recstream.checkpoint import load_checkpoint

from .prequential_worker import BATCH, EVENTS, Steps, run, write_events

WORKER = Path(__file__).with_name("prequential_worker.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("events")
    write_events(d)
    return d


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    resumed, monitor = run(data, tmp_path_factory.mktemp("whole"))
    assert resumed is None and monitor.compute()["events"] == EVENTS
    return monitor.compute()


class CrashAt(Steps):
    """A process that dies after step `at` (a checkpoint is due every 4 steps: `at` not one of them)."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at

    def on_train_step_end(self, ctx):
        if ctx.original_args().cur_step_num == self.at:
            raise RuntimeError("the process dies here")


def test_a_crash_and_a_resume_give_the_totals_of_a_run_that_never_stopped(data, uninterrupted, tmp_path):
    with pytest.raises(RuntimeError, match="dies here"):
        run(data, tmp_path, [CrashAt(10)])  # steps 9 and 10 were scored; the last checkpoint is step 8's
    resumed, monitor = run(data, tmp_path)
    assert resumed == 8
    # the same figures to the last bit (the window and the totals); before, the totals began at 0 again
    assert monitor.compute() == uninterrupted


def test_an_exception_checkpoint_holds_no_totals_and_the_resume_says_they_start_again(data, tmp_path, caplog):
    # the network fails training batch 10, after the monitor scored it: the breakpoint file holds
    # the weights and position of 9 batches, and no monitor state (it would count batch 10 twice)
    with pytest.raises(RuntimeError, match="failed training batch 10"):
        run(data, tmp_path, fail_at_batch=10, exception_save=True)
    breakpoint_file = next(tmp_path.glob("*_breakpoint.safetensors"))
    meta = load_checkpoint(breakpoint_file, restore_rng=False)
    assert "callbacks" not in meta
    with caplog.at_level(logging.WARNING, logger="recstream.callbacks"):
        resumed, monitor = run(data, tmp_path)
    assert resumed == meta["cur_step_num"]
    lines = [r.getMessage() for r in caplog.records if "PrequentialMonitor state" in r.getMessage()]
    assert len(lines) == 1 and f"start again at step {resumed}" in lines[0], lines
    assert monitor.compute()["events"] == EVENTS - 9 * BATCH  # counted from the restore point, once each


def _start(data, ckpt, pause: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WORKER), str(data), str(ckpt), str(pause)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))


def test_sigkill_mid_stream_and_a_resume_give_the_totals_of_a_run_that_never_stopped(data, uninterrupted,
                                                                                      tmp_path):
    proc = _start(data, tmp_path, 0.1)
    step, deadline = 0, time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        step = int(line.split()[1])
        if step >= 10 and step % 4:  # killed while it sleeps after this step: no checkpoint holds it
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc = _start(data, tmp_path, 0.0)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    resumed = int(next(line for line in lines if line.startswith("resumed")).split()[1])
    assert resumed < step  # the events of the steps after the checkpoint were scored, then trained again
    report = json.loads(next(line for line in lines if line.startswith("report")).split(" ", 1)[1])
    assert report == uninterrupted, (report, uninterrupted)
