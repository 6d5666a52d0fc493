"""The test tiers cannot silently rot: every test that starts a process (a subprocess, torchrun,
a multiprocessing worker) or a broker is in tier 2 (`E2E` in tests/conftest.py or
`@pytest.mark.e2e`), every `E2E` entry names a file and tests that exist, and every test
package keeps tests in tier 1 (the README's command). Static: the test files are read, not run.

A test starts a process when its body, a function or class of the tests it calls, or a fixture it
requests (its module's, a conftest's up the tree, or one imported from another test module) does;
a process started inside recstream or an example (not visible here) is listed by hand in `E2E`.
"""
from __future__ import annotations

import ast
import fnmatch
from functools import cache
from pathlib import Path

from tests import conftest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
PROCESS_CALLS = {"subprocess.run", "subprocess.Popen", "subprocess.call", "subprocess.check_call",
                 "subprocess.check_output", "Popen", "os.system", "os.fork", "os.forkpty", "os.posix_spawn",
                 "os.posix_spawnp", "os.spawnv", "os.spawnl", "os.execv", "mp.spawn", "spawn",
                 "start_processes", "multiprocessing.Process", "multiprocessing.Pool", "mp.Process",
                 "mp.Pool", "TansuBroker"}


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts if path.is_relative_to(REPO) else (path.stem,)
    return ".".join(parts)


def _path_of(module: str) -> Path | None:
    path = REPO.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def _namespace(path: Path) -> dict:
    """Name -> definition node, or (module path, name) for a name imported from a test module, or
    module path for a test module imported whole."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: dict = {}
    package = _module_name(path).split(".")[:-1]
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = (path, node)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if module.split(".")[0] != "tests":
                continue
            for alias in node.names:
                whole = _path_of(f"{module}.{alias.name}")
                source = _path_of(module)
                if whole is not None:
                    names[alias.asname or alias.name] = whole
                elif source is not None:
                    names[alias.asname or alias.name] = (source, alias.name)
    return names


def _lookup(path: Path, name: str, seen=frozenset()):
    """The (path, node) that `name` means in the module at `path`, following imports."""
    found = _namespace(path).get(name)
    if isinstance(found, tuple) and isinstance(found[1], str):
        if found in seen:
            return None
        return _lookup(found[0], found[1], seen | {found})
    return found


def _conftests(path: Path) -> list[Path]:
    """The conftest.py files that apply to a test file, nearest first."""
    found, folder = [], path.parent
    while True:
        if (folder / "conftest.py").is_file():
            found.append(folder / "conftest.py")
        if folder in (TESTS, REPO, folder.parent):
            break
        folder = folder.parent
    if (REPO / "conftest.py").is_file() and REPO / "conftest.py" not in found:
        found.append(REPO / "conftest.py")
    return found


def _is_fixture(node: ast.AST) -> bool:
    return any("fixture" in (_dotted(d.func if isinstance(d, ast.Call) else d) or "")
               for d in getattr(node, "decorator_list", []))


def _fixture(path: Path, name: str):
    for where in [path, *_conftests(path)]:
        found = _lookup(where, name)
        if found is not None and not isinstance(found, Path) and _is_fixture(found[1]):
            return found
    return None


def starts_process(path: Path, node: ast.AST, requests_fixtures: bool, seen: set | None = None) -> str | None:
    """Why the function/class `node` of the module at `path` starts a process (a chain of names
    ending in the call), or None."""
    seen = set() if seen is None else seen
    key = (path, node.name)
    if key in seen:
        return None
    seen.add(key)
    if requests_fixtures:
        args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        for arg in args:
            fixture = _fixture(path, arg.arg)
            if fixture is not None:
                why = starts_process(*fixture, True, seen)
                if why:
                    return f"fixture {arg.arg} -> {why}"
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            called = _dotted(sub.func) or ""
            if called in PROCESS_CALLS or called.split(".")[-1] in {"Popen", "TansuBroker"}:
                return called
            target = None
            if isinstance(sub.func, ast.Name):
                target = _lookup(path, sub.func.id)
            elif isinstance(sub.func, ast.Attribute) and isinstance(sub.func.value, ast.Name):
                module = _lookup(path, sub.func.value.id)
                if isinstance(module, Path):
                    target = _lookup(module, sub.func.attr)
            if isinstance(target, tuple) and target[1] is not node:
                why = starts_process(*target, _is_fixture(target[1]), seen)
                if why:
                    return f"{called} -> {why}"
    return None


def _tests_of(path: Path):
    """(name, node, marked e2e) of every test function and method in a test file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module_marked = any(
        isinstance(n, ast.Assign) and any(_dotted(t) == "pytestmark" for t in n.targets)
        and "mark.e2e" in ast.unparse(n.value) for n in tree.body)

    def marked(n):
        return module_marked or any("mark.e2e" in ast.unparse(d) for d in n.decorator_list)

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            yield node.name, node, marked(node)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for method in node.body:
                if isinstance(method, ast.FunctionDef) and method.name.startswith("test"):
                    yield f"{node.name}::{method.name}", method, marked(node) or marked(method)


def _test_files():
    return sorted(p for p in TESTS.rglob("test_*.py") if p.is_file())


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def test_every_test_that_starts_a_process_or_a_broker_is_in_tier_2():
    untiered = []
    for path in _test_files():
        for name, node, marked in _tests_of(path):
            if marked or conftest.in_tier2(f"{_rel(path)}::{name}"):
                continue
            why = starts_process(path, node, requests_fixtures=True)
            if why:
                untiered.append(f"{_rel(path)}::{name} starts a process ({why})")
    assert not untiered, ("tests that start a process or a broker are tier 2: add them to E2E in "
                          "tests/conftest.py or mark them @pytest.mark.e2e:\n" + "\n".join(untiered))


def test_every_e2e_entry_names_a_file_and_tests_that_exist():
    stale = []
    for entry in conftest.E2E:
        file, pattern, _ = conftest.split_entry(entry)
        path = REPO / file
        if not path.is_file():
            stale.append(f"{entry}: no file {file}")
        elif not any(fnmatch.fnmatchcase(name, pattern) for name, _, _ in _tests_of(path)):
            stale.append(f"{entry}: no test in {file} matches {pattern!r}")
    assert not stale, "E2E in tests/conftest.py names what is not there:\n" + "\n".join(stale)


def test_both_tiers_hold_tests_and_every_test_package_keeps_tests_in_tier_1():
    tier = {1: set(), 2: set()}
    for path in _test_files():
        package = path.relative_to(TESTS).parts[0] if len(path.relative_to(TESTS).parts) > 1 else "."
        for name, _, marked in _tests_of(path):
            tier[2 if marked or conftest.in_tier2(f"{_rel(path)}::{name}") else 1].add(package)
    packages = {p.name for p in TESTS.iterdir() if p.is_dir() and any(p.rglob("test_*.py"))}
    assert tier[2], "tier 2 holds no test"
    assert packages | {"."} <= tier[1], f"test packages with no tier-1 test: {sorted(packages - tier[1])}"


def test_the_guard_sees_a_subprocess_through_helpers_classes_and_fixtures(tmp_path):
    """The analysis itself, on files written here: a chain through a helper, a class and a conftest
    fixture is found; a test with none of them is not."""
    (tmp_path / "conftest.py").write_text(
        "import pytest, subprocess\n@pytest.fixture\ndef server():\n    subprocess.Popen(['x'])\n")
    (tmp_path / "test_probe.py").write_text(
        "import multiprocessing\n"
        "class Runner:\n    def start(self):\n        multiprocessing.Process(target=print).start()\n"
        "def helper():\n    return Runner()\n"
        "def test_via_helper():\n    helper()\n"
        "def test_via_fixture(server):\n    pass\n"
        "def test_plain(tmp_path):\n    assert 1 + 1 == 2\n")
    found = {name: starts_process(tmp_path / "test_probe.py", node, True)
             for name, node, _ in _tests_of(tmp_path / "test_probe.py")}
    assert found == {"test_via_helper": "helper -> Runner -> multiprocessing.Process",
                     "test_via_fixture": "fixture server -> subprocess.Popen", "test_plain": None}


def test_e2e_entries_match_files_names_and_parameters(monkeypatch):
    monkeypatch.setattr(conftest, "E2E", ("tests/a.py", "tests/b.py::test_slow_*", "tests/c.py::test_x[*onnx*]"))
    assert conftest.in_tier2("tests/a.py::test_anything[1]")
    assert conftest.in_tier2("tests/b.py::test_slow_one") and not conftest.in_tier2("tests/b.py::test_fast")
    assert conftest.in_tier2("tests/c.py::test_x[DLRM-onnx]")
    assert not conftest.in_tier2("tests/c.py::test_x[DLRM-torchscript]") and not conftest.in_tier2("tests/c.py::test_x")
    assert not conftest.in_tier2("tests/sub/a.py::test_anything")
