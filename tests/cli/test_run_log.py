"""MetricsLog continuing a run's files (``append=True``: ``recstream online`` resuming, ``eval``):
a torn last line, left by a process killed mid-write, is cut off with a warning instead of
making every later run fail on it; malformed rows elsewhere are kept in the file and left out."""
from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time

from recstream.cli.jsonl_rows import read_rows
from recstream.cli.run_log import MetricsLog

ROWS = [{"step": 10, "auc": 0.7}, {"step": 20, "auc": 0.71}]


def write_rows(directory, tail: bytes = b"") -> None:
    (directory / "metrics.jsonl").write_bytes("".join(json.dumps(r) + "\n" for r in ROWS).encode() + tail)


def lines(directory) -> list[dict]:
    text = (directory / "metrics.jsonl").read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_a_torn_last_line_is_cut_off_with_a_warning(tmp_path, caplog):
    write_rows(tmp_path, b'{"step": 30, "au')
    with caplog.at_level(logging.WARNING, logger="recstream.cli"):
        log = MetricsLog(str(tmp_path), online=True, append=True)
    assert log.rows == ROWS and log.last == ROWS[-1]
    assert any("metrics.jsonl:3: removed a torn last line (16 bytes" in r.getMessage() for r in caplog.records)
    log.add({"step": 30, "auc": 0.72})
    assert lines(tmp_path) == ROWS + [{"step": 30, "auc": 0.72}]
    csv = (tmp_path / "metrics.csv").read_text().splitlines()
    assert csv == ["step,auc", "10,0.7", "20,0.71", "30,0.72"]  # written again from the JSONL


def test_a_whole_last_row_without_its_newline_is_kept(tmp_path):
    write_rows(tmp_path, b'{"step": 30, "auc": 0.72}')
    log = MetricsLog(str(tmp_path), append=True)
    log.add({"step": 40, "auc": 0.73})
    assert [r["step"] for r in lines(tmp_path)] == [10, 20, 30, 40]


def test_malformed_rows_are_left_in_the_file_and_out_of_the_rows(tmp_path, caplog):
    deep = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    bad = [b"[1, 2]\n", deep, b"\xff\xfe{}\n", b'{"x": ' + b"9" * 5000 + b"}\n", b"not json\n"]
    write_rows(tmp_path, b"".join(bad))
    before = (tmp_path / "metrics.jsonl").read_bytes()
    with caplog.at_level(logging.WARNING, logger="recstream.cli"):
        log = MetricsLog(str(tmp_path), append=True)
    assert log.rows == ROWS
    assert [n for n, _ in read_rows(str(tmp_path / "metrics.jsonl")).skipped] == [3, 4, 5, 6, 7]
    assert any("5 malformed rows left out (kept in the file; first: line 3, not a JSON object (a list))"
               in r.getMessage() for r in caplog.records)
    assert (tmp_path / "metrics.jsonl").read_bytes() == before


CHILD = """
import sys
from recstream.cli.run_log import MetricsLog
log = MetricsLog(sys.argv[1])
pad = "x" * (16 << 20)
print("ready", flush=True)
step = 0
while True:
    step += 1
    log.add({"step": step, "pad": pad})
"""


def test_a_process_killed_mid_write_leaves_a_file_the_next_run_continues(tmp_path):
    """A real writer SIGKILLed while a 16 MB row is being written (the kernel stops a large write
    between pages): the next MetricsLog(append=True) keeps the whole rows and appends after them."""
    torn = 0
    for attempt in range(3):
        run = tmp_path / str(attempt)
        run.mkdir()
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(run)], stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline() == "ready\n"
            path = run / "metrics.jsonl"
            deadline = time.monotonic() + 60
            while path.stat().st_size < (24 << 20) and time.monotonic() < deadline:  # inside the second row
                time.sleep(0.0005)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(30)
        torn += not path.read_bytes().endswith(b"\n")
        whole = path.read_bytes().count(b"\n")
        log = MetricsLog(str(run), append=True)
        assert [r["step"] for r in log.rows] == list(range(1, whole + 1))
        log.add({"step": whole + 1})
        assert [r["step"] for r in lines(run)] == list(range(1, whole + 2))
    assert torn, "no kill landed mid-write: the test did not exercise a torn line"
