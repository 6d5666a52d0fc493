"""Every ```python block of the README runs, each in a fresh process and a directory of its own.

Blocks marked ```python fragment are excerpts (they continue code the reader writes) and are not
run. A block that reads the online example's ``incoming`` directory gets it filled first, by the
command its comment names.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)


def test_the_readme_has_runnable_blocks():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, tmp_path):
    code = BLOCKS[index]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    if 'DirectoryStream("incoming"' in code:
        subprocess.run([sys.executable, "-m", "recstream.cli.main", "produce", "--synthetic", "--rows", "4096",
                        "--file-records", "2048", "--directory", "incoming"], cwd=tmp_path, env=env, check=True,
                       capture_output=True, timeout=120)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"README block {index} failed:\n{code}\n{done.stderr[-3000:]}"
