"""The README runs as a reader runs it: its command-line walkthrough, then every ```python block,
in order, in ONE directory (each block in a fresh process), as someone following it top to bottom
in an empty directory would.

Blocks marked ```python fragment are excerpts (they continue code the reader writes) and are not
run. The steps the README's prose names before a block are done as written: the online example's
events come from the `recstream produce ... --directory incoming` command the text gives, and the
client example talks to `recstream serve models --port 8080` (started here, on a free port instead
of 8080). The `recstream` command is this checkout's (`python -m recstream.cli.main`).
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, re.S | re.M)
WALKTHROUGH = [b for b in re.findall(r"^```bash\n(.*?)^```", README, re.S | re.M) if "recstream init" in b]
PRODUCE_INCOMING = re.findall(r"(recstream produce [^`\n]*--directory incoming)", README)
CLIENT_URL = 'PredictionClient("http://127.0.0.1:8080")'


def test_the_readme_has_runnable_blocks():
    assert len(BLOCKS) >= 3 and len(WALKTHROUGH) == 1
    assert any('DirectoryStream("incoming"' in b for b in BLOCKS) and len(PRODUCE_INCOMING) == 1
    assert any(CLIENT_URL in b for b in BLOCKS)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment(tmp_path: Path) -> dict:
    """`recstream` on PATH is this checkout's command line (exec, so `kill %1` reaches the server)."""
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    (bin_dir / "recstream").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m recstream.cli.main "$@"\n')
    (bin_dir / "recstream").chmod(0o755)
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
                PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def _run(args, cwd, env, what, timeout=600):
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"README {what} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def _start_server(directory: str, port: int, cwd: Path, env: dict) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-m", "recstream.cli.main", "serve", directory, "--port", str(port)],
                              cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return server
        except OSError:
            if server.poll() is not None:
                break
            time.sleep(0.3)
    server.kill()
    raise AssertionError(f"recstream serve {directory} did not answer /health:\n{server.communicate()[0][-3000:]}")


@pytest.mark.e2e
def test_readme_block_runs(tmp_path):
    """The walkthrough, then each Python block, in order, in one directory: a later example must not
    trip over what an earlier one left (the online example once restored the Model example's `ckpt/`)."""
    if shutil.which("curl") is None:
        pytest.skip("the walkthrough's health check uses curl, which this machine lacks")
    env = _environment(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    port = _free_port()
    script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + \
        WALKTHROUGH[0].replace("8080", str(port))
    _run(["bash", "-c", script], work, env, "command-line walkthrough", timeout=900)
    for index, code in enumerate(BLOCKS):
        server = None
        if 'DirectoryStream("incoming"' in code:
            _run(["bash", "-c", PRODUCE_INCOMING[0]], work, env, "produce command of the online example")
        if CLIENT_URL in code:
            port = _free_port()
            server = _start_server("models", port, work, env)
            code = code.replace("8080", str(port))
        try:
            _run([sys.executable, "-c", code], work, env, f"python block {index}:\n{code}")
        finally:
            if server is not None:
                server.terminate()
                server.communicate(timeout=60)


def _command_lines(text: str) -> list[str]:
    """The shell lines of `text`'s ```bash blocks, comments and trailing blanks dropped."""
    lines = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def test_getting_started_runs_the_walkthrough_commands_in_its_order():
    """docs/getting-started.md says its commands are run by the tests: they are the README
    walkthrough's (run above), in the same order; its install lines are the README's."""
    guide = _command_lines((ROOT / "docs" / "getting-started.md").read_text())
    walkthrough = _command_lines("```bash\n" + WALKTHROUGH[0] + "```\n")
    readme_lines = _command_lines(README)
    commands = [line for line in guide if line.startswith("recstream ") and line != "recstream demo"]
    assert commands == [line for line in walkthrough if line in commands] and len(commands) >= 9, commands
    curls = [line for line in guide if line.startswith("curl ")]
    assert curls == [line for line in walkthrough if line.startswith("curl ")]
    assert all(line in readme_lines for line in guide if line.startswith("pip ")), guide
