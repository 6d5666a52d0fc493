"""Command-line mistakes and signals: the real CLI in a subprocess (`python -m recstream ...`).

Each case checks the exit status, the one line that explains it, and that stderr holds no
traceback (exit statuses: see `recstream --help`).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import recstream
from recstream.cli import serve
from recstream.cli.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recstream", *argv], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def last_error_line(result: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines, "no message on stderr"
    return lines[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_version_and_fast_help():
    result = cli("--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"recstream {recstream.__version__}")
    result = cli("--help")
    assert result.returncode == 0
    assert "exit status:" in result.stdout and "130  interrupted" in result.stdout
    for command in ("serve", "produce", "demo"):
        out = cli(command, "--help").stdout
        assert "``" not in out and ":class:" not in out, out  # no raw docstring markup


def test_help_does_not_import_torch():
    code = ("import sys\nfrom recstream.cli.main import main\n"
            "for argv in (['--help'], ['serve', '--help'], ['produce', '--help'], ['demo', '--help'], ['--version']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert result.stdout.strip().splitlines()[-1] == "False", result.stdout + result.stderr


@pytest.mark.parametrize("argv, message", [
    (["demo", "--epochs", "0"], "'--epochs' must be an int >= 1, got 0"),
    (["demo", "--threads", "-2"], "'--threads' must be an int >= 1, got -2"),
    (["serve", "models", "--port", "abc"], "argument --port: '--port' must be an int, got 'abc'"),
    (["serve", "models", "--port", "70000"], "'--port' must be an int >= 0 and <= 65535, got 70000"),
    (["produce", "--synthetic", "--rate", "-1", "--directory", "out"], "'--rate' must be a finite number >= 0"),
    (["produce", "--synthetic", "--rows", "-5", "--directory", "out"], "'--rows' must be an int >= 0, got -5"),
    (["demo", "--no-such-option"], "unrecognized arguments: --no-such-option"),
])
def test_bad_option_values_are_usage_errors(argv, message, tmp_path):
    result = subprocess.run([sys.executable, "-m", "recstream", *argv], capture_output=True, text=True,
                            timeout=60, env=ENV, cwd=tmp_path)
    assert result.returncode == EXIT_USAGE
    assert message in last_error_line(result)
    assert os.listdir(tmp_path) == []  # nothing created


def test_produce_missing_input_creates_nothing(tmp_path):
    out = tmp_path / "out"
    result = cli("produce", "--input", str(tmp_path / "missing.csv"), "--directory", str(out))
    assert result.returncode == EXIT_USAGE
    assert last_error_line(result) == f"recstream produce: --input {tmp_path / 'missing.csv'} does not exist"
    assert not out.exists()


def test_produce_criteo_needs_its_columns_and_creates_nothing(tmp_path):
    out = tmp_path / "out"
    result = cli("produce", "--synthetic", "--format", "criteo", "--num-dense", "2", "--directory", str(out))
    assert result.returncode == EXIT_USAGE
    assert last_error_line(result) == "recstream produce: --format criteo needs --num-dense 13 --num-categorical 26"
    assert not out.exists()


def test_produce_to_an_unreachable_broker_fails_in_one_line():
    port = free_port()  # closed again: connections are refused
    result = cli("produce", "--synthetic", "--kafka", f"127.0.0.1:{port}", "--topic", "t", "--connect-timeout", "1")
    assert result.returncode == EXIT_FAILURE
    assert last_error_line(result).startswith(f"recstream produce: cannot reach Kafka at 127.0.0.1:{port} within 1 s")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr  # no librdkafka log lines


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, EXIT_INTERRUPTED, "interrupted"),
                                             (signal.SIGTERM, EXIT_TERMINATED, "terminated")])
@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_produce_stops_cleanly_on_a_signal(tmp_path, sig, code, word, inherited):
    # "ignored": started as a non-interactive shell starts a background job (SIGINT ignored): the CLI
    # still stops on it (it used to ignore it and run on).
    def start_child():
        if inherited == "ignored":
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen([sys.executable, "-m", "recstream", "produce", "--synthetic", "--rows", "0",
                             "--num-dense", "1", "--num-categorical", "1", "--rate", "2000",
                             "--file-records", "1000000", "--directory", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            preexec_fn=start_child)
    try:
        deadline = time.monotonic() + 60
        while not any(n.endswith(".tmp") and os.path.getsize(tmp_path / n) for n in os.listdir(tmp_path)):
            assert proc.poll() is None and time.monotonic() < deadline, "produce wrote nothing"
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert "Traceback" not in err, err
    assert (proc.returncode, err.strip()) == (code, f"recstream produce: {word}")
    names = os.listdir(tmp_path)
    assert names == ["part-00000000.csv"]  # the records written so far are published, no .tmp left
    assert (tmp_path / names[0]).read_bytes().endswith(b"\n")


def test_serve_refuses_a_missing_directory_or_a_file(tmp_path):
    result = cli("serve", str(tmp_path / "mistyped"), "--port", "0")
    assert result.returncode == EXIT_USAGE
    assert last_error_line(result).startswith(f"recstream serve: {tmp_path / 'mistyped'} does not exist")
    (tmp_path / "file").write_text("x")
    result = cli("serve", str(tmp_path / "file"), "--port", "0")
    assert result.returncode == EXIT_USAGE
    assert last_error_line(result).startswith(f"recstream serve: {tmp_path / 'file'} is not a directory")


def test_serve_on_a_port_in_use_fails_at_once(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = cli("serve", str(tmp_path), "--port", str(port))
    assert result.returncode == EXIT_FAILURE
    assert last_error_line(result).startswith(f"recstream serve: cannot listen on 127.0.0.1:{port}")


def test_serve_waits_on_an_empty_directory_and_stops_on_sigterm(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "recstream", "serve", str(tmp_path), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout.readline().startswith("recstream serve: listening on http://127.0.0.1:")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert "no usable version" in err and "Traceback" not in err


def test_serve_default_body_limit_is_the_servers():
    from recstream.serving.server.http import DEFAULT_MAX_BODY_BYTES
    assert serve.DEFAULT_MAX_BODY_BYTES == DEFAULT_MAX_BODY_BYTES
