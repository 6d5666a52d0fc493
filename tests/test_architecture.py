"""The package layering of docs/architecture.md holds: imports point only down, never into a
private module of another package, and no package imports one of its own level except where the
picture allows it (train may use callbacks)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "recstream"

# Lowest first; a package may import packages of lower levels (and itself).
LEVELS = [
    {"validation", "sorting", "hostpath"},
    {"features", "testing"},
    {"data", "nn", "optim", "metrics"},
    {"checkpoint"},
    {"distributed"},
    {"models"},
    {"train", "callbacks"},
    {"serving"},
    {"cli"},
]
SAME_LEVEL_ALLOWED = {("train", "callbacks")}
LEVEL_OF = {pkg: i for i, level in enumerate(LEVELS) for pkg in level}


def _package_of(path: Path) -> str | None:
    parts = path.relative_to(ROOT).parts
    if len(parts) == 1:  # recstream/__init__.py, __main__.py: the top assembles everything
        name = parts[0].removesuffix(".py")
        return None if name.startswith("__") else name
    return parts[0]


def _imports(path: Path):
    """(imported module as a dotted name inside recstream, line) for every recstream import."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module_parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if module_parts[-1] == "__init__":
        module_parts = module_parts[:-1]
    package_parts = module_parts if path.name == "__init__.py" else module_parts[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "recstream":
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "recstream":
                continue
            if node.module is None or node.level:  # `from . import x`: x may be a module
                for alias in node.names:
                    yield f"{target}.{alias.name}", node.lineno
            else:
                yield target, node.lineno


def _violations():
    for path in sorted(ROOT.rglob("*.py")):
        own = _package_of(path)
        if own is None:
            continue
        for target, line in _imports(path):
            parts = target.split(".")[1:]
            if not parts:
                continue
            other = parts[0]
            where = f"{path.relative_to(ROOT.parent)}:{line} imports {target}"
            if other == own or other not in LEVEL_OF:
                continue
            if any(p.startswith("_") and not p.startswith("__") for p in parts[1:]):
                yield f"{where}: a private module of another package"
            if LEVEL_OF[other] > LEVEL_OF[own]:
                yield f"{where}: an upward import ({own} is below {other})"
            elif LEVEL_OF[other] == LEVEL_OF[own] and (own, other) not in SAME_LEVEL_ALLOWED:
                yield f"{where}: a sideways import between packages of one level"


def test_every_package_has_a_level():
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in ROOT.glob("*.py") if not p.stem.startswith("__")}
    assert packages | modules == set(LEVEL_OF)


def test_imports_point_down_and_never_into_private_modules():
    assert list(_violations()) == []


@pytest.mark.parametrize("package,source,expected", [
    ("data", "from ..serving import x\n", "upward"),
    ("models", "from recstream.nn._private import x\n", "private"),
    ("data", "from ..nn import x\n", "sideways"),
    ("callbacks", "from ..train import Model\n", "sideways"),
])
def test_the_checker_catches(tmp_path, package, source, expected):
    fake = tmp_path / "recstream"
    for pkg in LEVEL_OF:
        (fake / pkg).mkdir(parents=True, exist_ok=True)
        (fake / pkg / "__init__.py").write_text("")
    (fake / package / "bad.py").write_text(source)
    globals()["ROOT"], saved = fake, ROOT
    try:
        found = list(_violations())
    finally:
        globals()["ROOT"] = saved
    assert len(found) == 1 and expected in found[0]
