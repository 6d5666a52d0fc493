"""MetricsLog: a run's metrics as rows in ``metrics.jsonl`` and ``metrics.csv`` (and the run's log).

One row per training epoch (``epoch``, ``step``, ``loss``, the evaluation results of ``fit``,
``seconds`` since the start) or, online, one per prequential report (``step``, ``events``,
``auc``, ``logloss``, ``auc_total``, ``logloss_total``, ``loss``). JSONL gets each row as it
comes (flushed: a crash loses nothing written); the CSV's header is the union of the keys seen,
so the file is rewritten on the rare row that brings a new key (fit evaluates only some epochs).

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

from ..callbacks import Callback
from ..callbacks.loss_monitor import loss_value
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


class MetricsLog(Callback):
    """Writes metric rows into `directory` (see the module docstring).

    online: rows per prequential report instead of per epoch. append: keep the rows of an
    earlier run (an online run that resumes, evaluations); else the files start empty.
    stem: the files' name (``metrics``: metrics.jsonl and metrics.csv).
    """

    called_in_fit_eval = False
    rank_zero_only = True

    def __init__(self, directory: str, *, online: bool = False, append: bool = False, stem: str = "metrics") -> None:
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

    def on_train_epoch_end(self, run_context):
        if self.online:
            return
        p = run_context.original_args()
        row = {"epoch": p.cur_epoch_num, "step": p.cur_step_num, "loss": loss_value(p.net_outputs)}
        row.update(p.eval_results or {})
        row["seconds"] = round(time.perf_counter() - self._start, 3)
        self.add(row)

    def on_train_step_end(self, run_context):
        if self.online:
            self._report(run_context.original_args())

    def on_train_end(self, run_context):
        if self.online:
            self._report(run_context.original_args())

    def _report(self, p) -> None:
        report = p.get("prequential")
        if not report or report.get("step") == self._last_report:
            return  # the monitor computes its metrics every log_every steps only
        self._last_report = report.get("step")
        row = {"step": p.cur_step_num, **{k: v for k, v in report.items() if k != "step"},
               "loss": loss_value(p.net_outputs), "seconds": round(time.perf_counter() - self._start, 3)}
        self.add(row)
