"""Every ```python block of the guides in docs/ runs, each in a fresh process and a directory of its own.

A block runs unless its fence carries the class ``.fragment`` (```` ```python {.fragment} ````, or
```` ```python {.fragment title="MindSpore"} ````): those are excerpts that continue code the reader
writes, or code of another library (MindSpore), and are only checked to be valid Python. A title
alone (```` ```python title="recstream" ````) does not stop a block from running. The runnable
blocks are self-contained: none needs a setup step before it. (The README's ```` ```python fragment````
marker cannot be used here: mkdocs does not render such a fence as code.)

The API reference pages (docs/api/) are built from the docstrings, whose examples run as doctests.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GUIDES = sorted(DOCS.glob("*.md"))
# A fence line, its info string (attributes, title) and the code up to the closing fence.
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```[ \t]*$", re.S | re.M)
FRAGMENT = re.compile(r"\{[^}]*\.fragment\b")


def blocks(path: Path) -> list[tuple[str, bool]]:
    """(code, runnable) of every python block of `path`, in order."""
    return [(code, not FRAGMENT.search(info)) for info, code in FENCE.findall(path.read_text())]


RUNNABLE = [(path.name, i, code) for path in GUIDES
            for i, code in enumerate(code for code, runnable in blocks(path) if runnable)]


def test_the_guides_have_runnable_blocks():
    count = {}
    for name, _, _ in RUNNABLE:
        count[name] = count.get(name, 0) + 1
    expected = {"model-and-callbacks.md": 6, "models.md": 4, "online.md": 2, "migrating-from-mindspore.md": 4,
                "distributed.md": 1}
    assert {name: min(count.get(name, 0), n) for name, n in expected.items()} == expected, count


def test_python_fences_render_and_are_seen():
    """mkdocs renders ```python, ```python {...} and ```python title="..."; anything else after
    `python` (the README's `fragment` word) shows as plain text, and an indented fence would be
    skipped by this test module without anyone noticing."""
    for path in GUIDES:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.name}:{number}: {line!r}"
            assert not re.match(r"\s+```python", line), f"indented python fence (not run): {where}"
            if line.startswith("```python"):
                assert re.fullmatch(r'```python( \{[^}]*\}| title="[^"]*")?[ \t]*', line), f"bad fence: {where}"


@pytest.mark.parametrize("path", GUIDES, ids=lambda p: p.name)
def test_every_block_is_valid_python(path):
    for i, (code, _) in enumerate(blocks(path)):
        compile(code, f"{path.name} block {i}", "exec")


@pytest.mark.parametrize("name, index, code", RUNNABLE, ids=[f"{name}-{i}" for name, i, _ in RUNNABLE])
def test_docs_block_runs(name, index, code, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"{name} block {index} failed:\n{code}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("blocked, outcome", [("mlflow", "1 skipped"), ("torch.nn.functional._nothing", "1 passed")])
def test_a_docstring_example_of_a_missing_extra_is_skipped_with_its_install_line(blocked, outcome):
    """The root conftest: MLflowLogger's example, run where `mlflow` cannot be imported, is skipped and
    names `pip install 'recstream[mlflow]'` (it failed before); with mlflow there, it runs."""
    code = (f"import sys; sys.modules[{blocked!r}] = None; import pytest; "
            "sys.exit(pytest.main(['recstream/callbacks/mlflow_logger.py', '-rs', '-p', 'no:cacheprovider']))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    assert outcome in done.stdout
    if blocked == "mlflow":
        assert "needs an optional extra" in done.stdout and "pip install 'recstream[mlflow]'" in done.stdout
