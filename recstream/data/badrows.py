"""What readers do with rows they cannot turn into features: raise, or skip and account.

Reasons (the keys of ``reader.bad_rows``):

* ``column_count``: a CSV/TSV line with the wrong number of fields;
* ``unparsable``: text where a number was expected;
* ``non_finite``: NaN or +-inf in a dense column, or a value float32 (the model's type)
  makes infinite, such as ``1e39`` (checked after ``log1p_dense``);
* ``missing_value``: an empty value where one is required (dense without a fill value,
  label, non-hashed id without a vocabulary);
* ``id_out_of_range``: an id outside ``[0, vocab_size)`` of a non-hashed feature;
* ``bad_label``: a label that is not a finite number in ``[0, 1]``;
* ``oversize``: a CSV/TSV line longer than the reader's ``block_size`` (skipped unread);
* ``malformed``: a line that is not a row at all: invalid UTF-8, or a stray quote that
  opens a quoted value running into the next lines.

The stream sources (`recstream.data.streams`) use the same names for their records.

Rows are numbered from 1 over the data rows of each file (the header is not a row).

A `BadRowError` ends with how to skip such rows instead: the reader's keyword
(``pass on_bad_row='skip' ...``), or, for readers made inside `skip_hint`, the words given
there (the command line names its config key: ``set data.train.on_bad_row: skip in c.yaml ...``).

>>> h = BadRowHandler("skip", None, "demo")
>>> h.start_pass(); h.handle([BadRow("f.csv", 3, "unparsable", "x", "'abc'", None)]); h.counts
Counter({'unparsable': 1})
>>> with skip_hint("set data.train.on_bad_row: skip in c.yaml"):
...     h = BadRowHandler("raise", None, "demo")
>>> try:
...     h.handle([BadRow("f.csv", 3, "unparsable", "x", "'abc'", None)])
... except BadRowError as e:
...     print(e)
f.csv: row 3: column 'x': 'abc' (reason: unparsable); set data.train.on_bad_row: skip in c.yaml
"""
from __future__ import annotations

import contextvars
import json
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..validation import check_choice, check_type

REASONS = ("column_count", "unparsable", "non_finite", "missing_value", "id_out_of_range", "bad_label",
           "oversize", "malformed")
_POLICIES = ("raise", "skip")
DEFAULT_HINT = "pass on_bad_row='skip' to skip and count such rows"
# How to skip, for handlers made now; a context variable so that one caller's words (the CLI's config
# key) reach its readers only, never another thread's or a later caller's.
_HINT: contextvars.ContextVar[str | None] = contextvars.ContextVar("recstream_bad_row_hint", default=None)


@contextmanager
def skip_hint(hint: str) -> Iterator[None]:
    """Readers (their `BadRowHandler`) made inside end a `BadRowError` with `hint`
    instead of `DEFAULT_HINT` (which names the Python keyword)."""
    check_type("skip_hint", "hint", hint, str, allowed="the words that say how to skip bad rows")
    token = _HINT.set(hint)
    try:
        yield
    finally:
        _HINT.reset(token)


@dataclass(frozen=True)
class BadRow:
    """One rejected row: where it is, why, and (for the log) what it held."""

    path: str
    row: int
    reason: str
    column: str | None
    detail: str
    data: Any  # dict of raw column values, or the raw line text; written to the log only

    def message(self) -> str:
        where = f"column {self.column!r}: " if self.column else ""
        return f"{self.path}: row {self.row}: {where}{self.detail} (reason: {self.reason})"


class BadRowError(ValueError):
    """A data file holds a row that cannot be read; names the file, row and column."""

    def __init__(self, bad: BadRow, hint: str = DEFAULT_HINT) -> None:
        super().__init__(f"{bad.message()}; {hint}")
        self.bad_row, self.hint = bad, hint
        self.path, self.row, self.reason, self.column = bad.path, bad.row, bad.reason, bad.column


class BadRowHandler:
    """Applies the ``on_bad_row`` policy; counts by reason and writes the optional JSONL log."""

    def __init__(self, on_bad_row: str, bad_row_log: str | os.PathLike | None, owner: str) -> None:
        self.policy = check_choice(owner, "on_bad_row", on_bad_row, _POLICIES)
        check_type(owner, "bad_row_log", bad_row_log, (str, os.PathLike), allowed="a path", allow_none=True)
        if bad_row_log is not None and self.policy == "raise":
            raise ValueError(f"{owner}: 'bad_row_log' needs on_bad_row='skip' (with 'raise' the first bad "
                             f"row stops reading)")
        self.log_path = bad_row_log
        self.hint = _HINT.get() or DEFAULT_HINT  # what a BadRowError says to skip such rows
        self.counts: Counter = Counter()
        self._log = None

    def start_pass(self) -> None:
        """A new pass over the data: counts restart and the log is rewritten."""
        self.close()
        self.counts = Counter()
        if self.log_path is not None:
            self._log = open(self.log_path, "w", encoding="utf-8")

    def handle(self, bad: Sequence[BadRow]) -> None:
        """Raise for the earliest row under 'raise'; otherwise count and log every row."""
        if not bad:
            return
        if self.policy == "raise":
            raise BadRowError(min(bad, key=lambda b: b.row), self.hint)
        self.counts.update(b.reason for b in bad)
        if self._log is not None:
            for b in sorted(bad, key=lambda b: b.row):  # one line per rejected row, not per row read
                rec = {"file": b.path, "row": b.row, "reason": b.reason, "column": b.column,
                       "detail": b.detail, "data": b.data}
                self._log.write(json.dumps(rec, default=str) + "\n")
            self._log.flush()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
