"""The shape of the code stays what docs/design.md says: modules under 800 lines, no module that
reaches itself through imports (imports inside functions count: they run too), and no private
name (``_name``) imported from another module. Each check is shown to fail on a planted case."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 800


def _modules(root: Path) -> dict[str, Path]:
    found = {}
    for package in ("fuzz", "strategies"):
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import in ``path``, at any depth, that
    is not under ``if TYPE_CHECKING:``; relative imports resolved."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skipped = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
        for statement in branch.body
        for node in ast.walk(statement)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:  # a submodule
                    found.append((f"{base}.{alias.name}", []))
                else:
                    found.append((base, [alias.name]))
    return found


def _owner(target: str, modules: dict[str, Path]) -> str | None:
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def circles(root: Path) -> list[list[str]]:
    """The groups of modules that reach each other through imports (strongly connected, > 1)."""
    modules = _modules(root)
    graph = {
        name: {
            owner
            for target, _ in _imports(name, path, modules)
            if (owner := _owner(target, modules)) is not None and owner != name
        }
        for name, path in modules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def private_imports(root: Path) -> list[str]:
    modules = _modules(root)
    return [
        f"{name} imports {taken} from {target}"
        for name, path in modules.items()
        for target, names in _imports(name, path, modules)
        if _owner(target, modules) is not None
        for taken in names
        if taken.startswith("_") and not taken.startswith("__")
    ]


def long_modules(root: Path) -> list[str]:
    return [
        f"{name}: {len(path.read_text().splitlines())} lines"
        for name, path in _modules(root).items()
        if len(path.read_text().splitlines()) > MAX_LINES
    ]


def test_no_module_is_over_800_lines() -> None:
    assert long_modules(ROOT) == []


def test_no_module_reaches_itself_through_imports() -> None:
    assert circles(ROOT) == []


def test_no_private_name_is_imported_from_another_module() -> None:
    assert private_imports(ROOT) == []


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    (tmp_path / "strategies").mkdir()
    package = tmp_path / "fuzz"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from fuzz.b import public\n")
    (package / "b.py").write_text("public = 1\n\n\ndef later():\n    from fuzz import a\n\n    return a\n")
    (package / "c.py").write_text("from fuzz.b import _hidden\n" + "x = 1\n" * MAX_LINES)
    return tmp_path


def test_the_checks_find_what_is_planted(planted: Path) -> None:
    assert circles(planted) == [["fuzz.a", "fuzz.b"]]  # through an import inside a function
    assert private_imports(planted) == ["fuzz.c imports _hidden from fuzz.b"]
    assert long_modules(planted) == [f"fuzz.c: {MAX_LINES + 1} lines"]
