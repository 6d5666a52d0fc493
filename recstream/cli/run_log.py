"""MetricsLog: a run's metrics as rows in ``metrics.jsonl`` and ``metrics.csv`` (and the run's log).

One row per training epoch (``epoch``, ``step``, ``loss``, the evaluation results of ``fit``,
``seconds`` since the start) or, online, one per prequential report (``step``, ``events``,
``auc``, ``logloss``, ``auc_total``, ``logloss_total``, ``loss``).

``loss`` is a mean, never one batch's value: the training loss averaged over the epoch's examples
(online: over the steps since the previous row), `LossMean`. Where a sink trains several batches
per step hook, only each sink's last loss is seen, and the column is ``sink_last_loss`` instead
(the mean of those). The evaluation's loss is its ``logloss``, over the whole evaluation set: the
last-batch ``eval_loss`` that `Model.fit` reports (MindSpore's) is left out of the rows.

JSONL gets each row as it comes (flushed: a crash loses nothing written); the CSV's header is the
union of the keys seen, so the file is rewritten on the rare row that brings a new key (fit
evaluates only some epochs).

A run that continues the files (``append=True``: ``online`` resuming, ``eval``) reads the JSONL
with `jsonl_rows.repair`: a torn last line (a process killed mid-write) is cut off the file, with a
warning, so that the next row starts on a line of its own; a malformed row elsewhere (not JSON,
not an object, invalid UTF-8, nested too deep) is left in the file and out of the rows, with a
warning. The CSV, a table view of the JSONL, is then written again from the rows.

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> log = MetricsLog(d)
>>> log.add({"epoch": 1, "loss": 0.5}); log.add({"epoch": 2, "loss": 0.4, "auc": 0.7})
>>> print(open(os.path.join(d, "metrics.csv")).read().strip())
epoch,loss,auc
1,0.5,
2,0.4,0.7
"""
from __future__ import annotations

import csv
import json
import logging
import math
import os
import time

import torch

from ..callbacks import Callback
from ..data.protocol import batch_rows
from .jsonl_rows import repair

log = logging.getLogger("recstream.cli")


def _plain(value):
    """A JSON/CSV-able number (tensors and numpy scalars read once; NaN/inf as None)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    try:
        value = float(value)
    except (TypeError, ValueError):
        return str(value)
    return value if math.isfinite(value) else None


class LossMean:
    """The training loss averaged over examples, summed on the device (no host read per step).

    `observe` sees each batch before it trains (``cb_params.batch_observers``), `add` each step
    hook's loss; `take` reads the mean once and starts again. Each loss is weighted by the rows of
    its batch (the last batch of an epoch may be small). ``sampled``: a step hook saw more than one
    batch (a sink), so only each sink's last loss went in.

    >>> import torch
    >>> m = LossMean()
    >>> m.observe((torch.zeros(3, 1), torch.zeros(3))); m.add(torch.tensor(1.0))
    >>> m.observe((torch.zeros(1, 1), torch.zeros(1))); m.add(torch.tensor(3.0))
    >>> m.take(), m.take()
    (1.5, None)
    """

    def __init__(self) -> None:
        self._sum = self._rows = None
        self._batches, self._last_rows, self.sampled = 0, None, False

    def observe(self, batch) -> None:
        self._batches += 1
        self._last_rows = batch_rows(batch)

    def add(self, net_outputs) -> None:
        loss = net_outputs[0] if isinstance(net_outputs, (tuple, list)) and net_outputs else net_outputs
        if not isinstance(loss, torch.Tensor):
            return
        self.sampled = self.sampled or self._batches > 1
        weight = self._last_rows or 1
        value = loss.detach().float().mean() * weight
        self._sum = value if self._sum is None else self._sum + value
        self._rows = weight if self._rows is None else self._rows + weight
        self._batches = 0

    def take(self) -> float | None:
        """The mean since the last take (one host read), or None without a loss."""
        if self._sum is None:
            return None
        mean = float(self._sum) / self._rows
        self._sum = self._rows = None
        return mean


class MetricsLog(Callback):
    """Writes metric rows into `directory` (see the module docstring).

    online: rows per prequential report instead of per epoch. append: keep the rows of an
    earlier run (an online run that resumes, evaluations); else the files start empty.
    stem: the files' name (``metrics``: metrics.jsonl and metrics.csv).
    """

    called_in_fit_eval = False
    rank_zero_only = True

    def __init__(self, directory: str, *, online: bool = False, append: bool = False, stem: str = "metrics",
                 echo=None) -> None:
        self.jsonl = os.path.join(directory, f"{stem}.jsonl")
        self.csv = os.path.join(directory, f"{stem}.csv")
        self.online = online
        self.rows: list[dict] = []
        self.columns: list[str] = []
        if append and os.path.exists(self.jsonl):
            self.rows = repair(self.jsonl).rows
            self.columns = list(dict.fromkeys(k for row in self.rows for k in row))
            self._write_csv()  # the CSV may be torn too: written again from the JSONL
        else:
            for path in (self.jsonl, self.csv):
                open(path, "w").close()
        self._start = time.perf_counter()
        self._last_report = None
        self.loss = LossMean()
        self.echo = echo  # a text stream for one line per epoch (train), or None
        self.step_offset = 0  # a resumed run counts its steps from the checkpoint's epoch on
        self.events_offset = 0  # a resumed online run counts its events from the last row on
        self.final_step: int | None = None
        self._epoch_started = self._last_epoch = None

    def continue_after(self, epoch: int) -> None:
        """A resumed run (``append=True``) that trains epochs ``epoch+1 ..``: the rows of later epochs
        go (they are trained again), and its steps and seconds count on from the row of `epoch`."""
        kept = self._keep(lambda row: not isinstance(row.get("epoch"), int) or row["epoch"] <= epoch)
        last = next((row for row in reversed(kept) if row.get("epoch") == epoch), None)
        if last is not None and isinstance(last.get("step"), int):
            self.step_offset = last["step"]
        if last is not None and isinstance(last.get("seconds"), (int, float)):
            self._start -= last["seconds"]  # the time axis goes on (the time between the runs left out)

    @property
    def last(self) -> dict:
        return self.rows[-1] if self.rows else {}

    def add(self, row: dict) -> None:
        row = {k: _plain(v) for k, v in row.items()}
        self.rows.append(row)
        with open(self.jsonl, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        new = [k for k in row if k not in self.columns]
        self.columns += new
        if new:  # the header changes: write the whole file again
            self._write_csv()
        else:
            with open(self.csv, "a", newline="", encoding="utf-8") as f:
                csv.DictWriter(f, self.columns).writerow(row)
        log.info("metrics: %s", ", ".join(f"{k}={v}" for k, v in row.items()))

    def _write_csv(self) -> None:
        with open(self.csv, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, self.columns)
            writer.writeheader()
            writer.writerows(self.rows)

    def _keep(self, keep) -> list[dict]:
        """Keep the rows `keep` accepts; the files are written again when any goes."""
        kept = [row for row in self.rows if keep(row)]
        if len(kept) != len(self.rows):
            self.rows = kept
            with open(self.jsonl, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(row) + "\n" for row in kept)
            self._write_csv()
        return kept

    def continue_online(self, step: int, counts_restored: bool = False) -> None:
        """An online run resumed at checkpoint `step`: rows after it go (those events are trained
        again). `counts_restored`: the checkpoint held the prequential monitor's state, whose
        ``events`` go on from the checkpoint's; else (an older checkpoint) ``events`` count on from
        the last row kept, so that the event axis never goes back (the events after that row, up
        to `step`, are then not counted twice but not at all)."""
        kept = self._keep(lambda row: not isinstance(row.get("step"), int) or row["step"] <= step)
        last = next((row for row in reversed(kept) if isinstance(row.get("events"), int)), None)
        self.events_offset = last["events"] if last is not None and not counts_restored else 0
        if last is not None and isinstance(last.get("seconds"), (int, float)):
            self._start -= last["seconds"]

    def on_train_begin(self, run_context):
        p = run_context.original_args()
        if isinstance(p.batch_observers, list):
            p.batch_observers.append(self.loss.observe)

    def on_train_epoch_begin(self, run_context):
        p = run_context.original_args()
        if self._last_epoch is None and isinstance(p.epoch_num, int):
            self._last_epoch = (p.cur_epoch_num or 1) - 1 + p.epoch_num  # epochs run initial_epoch+1 .. epoch
        self._epoch_started = (time.perf_counter(), p.cur_step_num or 0)

    def _loss_column(self) -> dict:
        mean = self.loss.take()
        return {"sink_last_loss" if self.loss.sampled else "loss": mean}

    def on_train_epoch_end(self, run_context):
        if self.online:
            return
        p = run_context.original_args()
        started = (self._epoch_started or (0.0, 0))[1]
        if p.get("stop_signal") is not None and not (isinstance(p.batch_num, int) and
                                                     (p.cur_step_num or 0) - started == p.batch_num):
            self.loss.take()
            return  # an epoch cut short by Ctrl-C (or not known to be whole): no row; --resume trains it again
        row = {"epoch": p.cur_epoch_num, "step": self.step_offset + (p.cur_step_num or 0), **self._loss_column()}
        # fit's eval_loss is the last evaluation batch's (MindSpore's); logloss is the whole set's
        row.update({k: v for k, v in (p.eval_results or {}).items() if k != "eval_loss"})
        row["seconds"] = round(time.perf_counter() - self._start, 3)
        self.add(row)
        if self.echo is not None:
            self._echo(p, row)

    def _echo(self, p, row: dict) -> None:
        """One line per epoch: the row's figures, the epoch's steps and time."""
        started, first_step = self._epoch_started or (self._start, 0)
        steps, seconds = (p.cur_step_num or 0) - first_step, time.perf_counter() - started
        figures = ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                            if k not in ("epoch", "step", "seconds") and v is not None)
        total = f"/{self._last_epoch}" if self._last_epoch else ""
        print(f"epoch {p.cur_epoch_num}{total}: {figures}, {steps} steps in {seconds:.1f} s (step {row['step']})",
              file=self.echo, flush=True)

    def on_train_step_end(self, run_context):
        p = run_context.original_args()
        self.loss.add(p.net_outputs)
        if self.online:
            self._report(p)

    def on_train_end(self, run_context):
        p = run_context.original_args()
        self.final_step = self.step_offset + (p.cur_step_num or 0)  # where training stopped
        if self.loss.observe in (p.batch_observers or ()):
            p.batch_observers.remove(self.loss.observe)
        if self.online:
            self._report(p)

    def _report(self, p) -> None:
        report = p.get("prequential")
        if not report or report.get("step") == self._last_report:
            return  # the monitor computes its metrics every log_every steps only
        self._last_report = report.get("step")
        row = {"step": p.cur_step_num, **{k: v for k, v in report.items() if k != "step"},
               **({"events": self.events_offset + report["events"]} if isinstance(report.get("events"), int) else {}),
               **self._loss_column(), "seconds": round(time.perf_counter() - self._start, 3)}
        self.add(row)


class EvalLossMean(Callback):
    """Puts the whole evaluation set's log loss in ``eval_results["eval_loss"]`` where `Model.fit`
    put its last batch's (MindSpore's rule), for the callbacks after it (early stopping, TensorBoard,
    the metrics rows). The config's model trains on the binary cross-entropy, whose mean over the
    evaluation set is its ``logloss`` metric; runs before the config's callbacks."""

    called_in_fit_eval = False

    def on_train_epoch_end(self, run_context):
        results = run_context.original_args().eval_results
        if results and "eval_loss" in results and results.get("logloss") is not None:
            results["eval_loss"] = results["logloss"]


class BestCheckpoint(Callback):
    """Keeps the checkpoint of the best evaluated epoch under `monitor` (an evaluation result: early
    stopping's; `mode`: its resolved ``"min"`` or ``"max"``) in
    `directory` (``<run_dir>/best``) with ``best.json`` beside it: ``{"checkpoint", "epoch", "step",
    "monitor", "value"}`` -- what ``recstream eval --checkpoint best`` loads. The best epoch's file
    replaces the earlier best's once it is written."""

    called_in_fit_eval = False
    rank_zero_only = True

    def __init__(self, directory: str, monitor: str, mode: str, metrics: MetricsLog) -> None:
        self.directory, self.monitor, self.mode, self.metrics = directory, monitor, mode, metrics
        self.best = None
        record = read_best(directory)
        if record is not None and metrics.rows:  # a resumed run: the best so far stands
            self.best = record.get("value")

    def on_train_epoch_end(self, run_context):
        from ..checkpoint import save_checkpoint
        p = run_context.original_args()
        if p.get("stop_signal") is not None:
            return  # an epoch cut short by a signal is no candidate
        value = _plain((p.eval_results or {}).get(self.monitor))  # evaluated epochs only
        if not isinstance(value, float):
            return
        if self.best is not None and not (value < self.best if self.mode == "min" else value > self.best):
            return
        os.makedirs(self.directory, exist_ok=True)
        step = self.metrics.step_offset + (p.cur_step_num or 0)
        path = os.path.join(self.directory, f"best-epoch{p.cur_epoch_num}-step{step}.safetensors")
        save_checkpoint(path, p.network, p.optimizer, extra={"epoch": p.cur_epoch_num, "cur_step_num": step,
                                                             "monitor": self.monitor, "value": value})
        earlier = read_best(self.directory)
        record = {"checkpoint": os.path.basename(path), "epoch": p.cur_epoch_num, "step": step,
                  "monitor": self.monitor, "value": value}
        tmp = os.path.join(self.directory, "best.json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(tmp, os.path.join(self.directory, "best.json"))
        if earlier and earlier.get("checkpoint") != record["checkpoint"]:
            old = os.path.join(self.directory, str(earlier.get("checkpoint")))
            if os.path.isfile(old):
                os.remove(old)
        self.best = value


def read_best(directory: str) -> dict | None:
    """The record of `BestCheckpoint` in `directory`, or None (no such file, or not a record)."""
    try:
        with open(os.path.join(directory, "best.json"), encoding="utf-8") as f:
            record = json.load(f)
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("checkpoint"), str) else None
