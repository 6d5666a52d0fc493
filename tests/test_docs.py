"""Every ```python block of the guides in docs/ runs: a guide's blocks in order, each in a fresh process, in
one directory per guide.

A block runs unless its fence carries the class ``.fragment`` (```` ```python {.fragment} ````, or
```` ```python {.fragment title="MindSpore"} ````): those are excerpts that continue code the reader
writes, or code of another library (MindSpore), and are only checked to be valid Python. A title
alone (```` ```python title="recstream" ````) does not stop a block from running. The runnable
blocks need no setup step before them, and none reads what an earlier block of its page wrote unless the
page says so. (The README's ```` ```python fragment````
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


@pytest.mark.parametrize("name", sorted({name for name, _, _ in RUNNABLE}))
def test_docs_block_runs(name, tmp_path):
    """A guide's blocks run in order, each in a fresh process, all in ONE directory, as a reader who
    follows the page top to bottom runs them: a block must not trip over, or silently load, what an
    earlier one left there (a checkpoint directory of the same name, say)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for _, index, code in (block for block in RUNNABLE if block[0] == name):
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


# --- The API reference (docs/api/*.md): what mkdocstrings renders from the docstrings.
ROLE = re.compile(r":(class|meth|func|attr|mod|data|exc|obj):`")
API_IDS = sorted({line.split(":::", 1)[1].strip() for page in sorted((DOCS / "api").glob("*.md"))
                  for line in page.read_text().splitlines() if line.startswith(":::")})


def _api_object(identifier: str):
    import importlib
    parts = identifier.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise AssertionError(f"docs/api names {identifier!r}, which does not import")


def _rendered(obj) -> list[tuple[str, object]]:
    """(name, object) of `obj` and the public members mkdocstrings shows with it (filters: !^_)."""
    import inspect
    found = [(getattr(obj, "__qualname__", getattr(obj, "__name__", "?")), obj)]
    if inspect.ismodule(obj):
        members = [(n, m) for n, m in vars(obj).items() if getattr(m, "__module__", None) == obj.__name__]
    elif inspect.isclass(obj):
        members = list(vars(obj).items())
    else:
        members = []
    for name, member in members:
        if not name.startswith("_") and (inspect.isfunction(member) or inspect.isclass(member)
                                         or isinstance(member, property)):
            found.append((f"{found[0][0]}.{name}", member.fget if isinstance(member, property) else member))
    return found


def _args_names(doc: str) -> list[str]:
    """The parameter names of a Google-style ``Args:`` section."""
    lines = doc.expandtabs().splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "Args:":
            indent = len(line) - len(line.lstrip())
            body = []
            for entry in lines[i + 1:]:
                if entry.strip() and len(entry) - len(entry.lstrip()) <= indent:
                    break
                body.append(entry)
            first = min((len(e) - len(e.lstrip()) for e in body if e.strip()), default=0)
            return [re.split(r"[:(]", e.strip(), maxsplit=1)[0].strip() for e in body
                    if e.strip() and len(e) - len(e.lstrip()) == first]
    return []


@pytest.mark.parametrize("identifier", API_IDS)
def test_api_pages_render_cross_references_and_one_entry_per_parameter(identifier):
    """mkdocstrings (google style) shows a Sphinx role (:class:`X`) as literal text, and an Args entry
    that is not one parameter ("dropout / batch_norm / activation") as a required parameter without
    its default. Both reached the site before: the models page showed `:class:` 16 times."""
    import inspect
    for name, obj in _rendered(_api_object(identifier)):
        doc = inspect.cleandoc(obj.__doc__ or "")  # its own: mkdocstrings does not inherit docstrings
        assert not ROLE.search(doc), f"{name}: a Sphinx role in its docstring: {ROLE.search(doc).group(0)}"
        target = obj.__init__ if inspect.isclass(obj) else obj
        if not callable(target) or not _args_names(doc):
            continue
        try:
            params = set(inspect.signature(target).parameters)
        except (TypeError, ValueError):
            continue
        unknown = [arg for arg in _args_names(doc) if arg.lstrip("*") not in params]
        assert not unknown, f"{name}: Args entries that are not one parameter of {sorted(params)}: {unknown}"
