"""The rows of a JSONL metrics file (``metrics.jsonl``, ``eval.jsonl``), read without trusting it:
malformed lines are left out with their reason, and a torn last line (a process killed mid-write)
is found, and cut off by `repair`. Used by `run_log.MetricsLog` (continuing a run's files) and
``recstream plot``; no torch here, so that ``plot`` and ``--help`` stay light.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

log = logging.getLogger("recstream.cli")


@dataclass
class Rows:
    """What `read_rows` found in a JSONL file.

    rows: the JSON objects, in order. skipped: ``(line, reason)`` of each malformed line left out.
    torn: ``(line, byte offset)`` where a torn last line starts (no newline and not a JSON object:
    a write cut short), or None.
    """

    rows: list[dict] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    torn: tuple[int, int] | None = None


def _row(line: bytes) -> tuple[dict | None, str]:
    """A line parsed as a JSON object, or ``(None, why not)``."""
    try:
        value = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except RecursionError:
        return None, "nested too deep"
    except json.JSONDecodeError as e:
        return None, f"not JSON ({e.msg})"
    except ValueError:  # Python refuses ints of more than 4300 digits
        return None, "not JSON (a number too long)"
    if not isinstance(value, dict):
        return None, f"not a JSON object (a {type(value).__name__})"
    return value, ""


def read_rows(path: str) -> Rows:
    """The rows of a JSONL metrics file (see `Rows`); nothing is changed on disk.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "m.jsonl")
    >>> _ = open(path, "w").write('{"step": 1}\\n[2]\\n{"step": 3}\\n{"ste')
    >>> found = read_rows(path)
    >>> found.rows, found.skipped, found.torn
    ([{'step': 1}, {'step': 3}], [(2, 'not a JSON object (a list)')], (4, 28))
    """
    found, offset = Rows(), 0
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                row, why = _row(line)
                if row is not None:
                    found.rows.append(row)
                elif line.endswith(b"\n"):
                    found.skipped.append((number, why))
                else:  # the last line, cut by a crash mid-write
                    found.torn = (number, offset)
            offset += len(line)
    return found


def repair(path: str) -> Rows:
    """`read_rows`, then cut a torn last line off the file (and end a last row that lost its newline),
    with a warning for that and for malformed rows left in place."""
    found = read_rows(path)
    if found.torn is not None:
        line, start = found.torn
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(start)
        log.warning("%s:%d: removed a torn last line (%d bytes, an interrupted write); the rows before it are kept",
                    path, line, size - start)
    elif found.rows:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            ended = f.read(1) == b"\n"
        if not ended:
            with open(path, "ab") as f:
                f.write(b"\n")
    if found.skipped:
        first_line, why = found.skipped[0]
        log.warning("%s: %d malformed row%s left out (kept in the file; first: line %d, %s)", path,
                    len(found.skipped), "s" if len(found.skipped) > 1 else "", first_line, why)
    return found
