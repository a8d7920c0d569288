"""Folding a flat reduced script to its case, from what an instrumented run of it saw.

:func:`instrument` rewrites the script so that every rank records, per expression site:

- attributes read off the case's model objects (``training.lr``, ``body.composition.mesh``);
- calls of the model's functions and of methods of its objects (``training.skipped_at(0, 0)``);
- the tests of ``if`` statements and conditional expressions in the rank code (functions that
  came from ``fuzz._rank`` and ``fuzz.model``, never the judge's, whose tests decide the
  verdict).

Each rank writes what it saw when it ends (:data:`RECORDER`). :func:`fold` then replaces every
site that saw one literal value (None, bool, int, float, str and tuples of them) on every rank
and every time by that value, and an ``if`` whose test became constant by the branch it took.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

#: The recorder the instrumented script starts with (then :data:`EXIT`); ``@MODEL@`` names the
#: model's classes.
RECORDER = """
import atexit as _sf_atexit, json as _sf_json, os as _sf_os, signal as _sf_signal
_SF_SEEN = {}
_SF_MODEL = set(@MODEL@)
_SF_LITERAL = (type(None), bool, int, float, str)


def _sf_literal(v):
    if type(v) in _SF_LITERAL:
        return type(v) is not float or v == v and abs(v) != float("inf")
    return type(v) is tuple and len(v) <= 16 and all(_sf_literal(x) for x in v)


def _sf_record(i, v):
    seen = _SF_SEEN.setdefault(i, set())
    if len(seen) < 2:
        seen.add(repr(v) if _sf_literal(v) else "<object>")
    return v


def _sf_a(i, base, name):
    v = getattr(base, name)
    if type(base).__name__ in _SF_MODEL and not callable(v):
        _sf_record(i, v)
    return v


def _sf_c(i, f, *args, **kwargs):
    v = f(*args, **kwargs)
    owner = getattr(f, "__self__", None)
    if getattr(f, "__name__", "") in _SF_MODEL or type(owner).__name__ in _SF_MODEL:
        _sf_record(i, v)
    return v

"""

#: How a recorder ends (``@P@`` its names' prefix, ``@SEEN@`` its table of values per site,
#: ``@STEM@`` its files' stem): each process writes its table to ``@DIRECTORY@/@STEM@-PID.json``
#: when it ends, whether by ``os._exit`` (torchrun's ranks, the harness), a normal exit or SIGTERM.
EXIT = """
def @P@_dump():
    path = @P@_os.path.join(@DIRECTORY@, f"@STEM@-{@P@_os.getpid()}.json")
    with open(path, "w") as f:
        @P@_json.dump({k: sorted(v) for k, v in @SEEN@.items()}, f)


@P@_exit = @P@_os._exit


def @P@_end(code):
    @P@_dump()
    @P@_exit(code)


@P@_os._exit = @P@_end
@P@_atexit.register(@P@_dump)
@P@_signal.signal(@P@_signal.SIGTERM, lambda *_: @P@_end(143))
"""


def recorder(body: str, prefix: str, seen: str, stem: str, directory: str) -> ast.Module:
    """A recorder's prelude: ``body`` (its imports, table and functions) and :data:`EXIT`."""
    ending = EXIT.replace("@P@", prefix).replace("@SEEN@", seen).replace("@STEM@", stem)
    return ast.parse((body + ending).replace("@DIRECTORY@", repr(directory)))


def read_tables(directory: Path, stem: str) -> dict[int, set[str]]:
    """Per site, every value any process recorded in ``directory/STEM-*.json``."""
    out: dict[int, set[str]] = {}
    for path in directory.glob(f"{stem}-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for site, values in data.items():
            out.setdefault(int(site), set()).update(values)
    return out


class _Instrument(ast.NodeTransformer):
    """Numbers every site it wraps; ``tests_in`` are the functions whose tests are recorded."""

    def __init__(self, tests_in: set[str]) -> None:
        self.sites = 0
        self.tests_in = tests_in
        self.function: list[str] = []

    def _site(self, node: ast.expr) -> ast.Constant:
        self.sites += 1
        node.sf_site = self.sites  # type: ignore[attr-defined]
        return ast.Constant(self.sites)

    def _def(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> ast.AST:
        top = not self.function
        self.function.append(node.name if top else self.function[0])
        self.generic_visit(node)
        self.function.pop()
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _def

    def _records_tests(self) -> bool:
        return bool(self.function) and self.function[0] in self.tests_in

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load):
            return node
        return ast.Call(ast.Name("_sf_a", ast.Load()), [self._site(node), node.value, ast.Constant(node.attr)], [])

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if isinstance(node.func, ast.Name) and node.func.id == "super":
            return node
        self.generic_visit(node)
        return ast.Call(ast.Name("_sf_c", ast.Load()), [self._site(node), node.func, *node.args], node.keywords)

    def _test(self, node: ast.If | ast.IfExp) -> ast.AST:
        self.generic_visit(node)
        if self._records_tests():
            node.test = ast.Call(ast.Name("_sf_record", ast.Load()), [self._site(node.test), node.test], [])
        return node

    visit_If = visit_IfExp = _test


def instrument(code: str, model: set[str], tests_in: set[str], directory: str) -> str:
    """``code`` recording its sites; ``model`` names the model's classes and functions, whose
    values are recorded; ``tests_in`` the functions whose ``if`` tests are."""
    tree = ast.parse(code)
    _Instrument(tests_in).visit(tree)
    future = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    rest = [n for n in tree.body if n not in future]
    prelude = recorder(RECORDER.replace("@MODEL@", repr(sorted(model))), "_sf", "_SF_SEEN", "fold", directory)
    tree.body = [*future, *prelude.body, *rest]
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def read_records(directory: Path) -> dict[int, set[str]]:
    """Per site, every value any process recorded."""
    return read_tables(directory, "fold")


class _Fold(ast.NodeTransformer):
    """Replaces the sites of :class:`_Instrument` (same numbering) that saw one literal."""

    def __init__(self, values: dict[int, Any], tests_in: set[str]) -> None:
        self.sites = 0
        self.values = values
        self.inner = _Instrument(tests_in)
        self.folded = 0

    def _value(self, node: ast.expr, site: int) -> ast.expr:
        if site in self.values:
            self.folded += 1
            return ast.copy_location(ast.parse(self.values[site], mode="eval").body, node)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load):
            return node
        self.sites += 1
        return self._value(node, self.sites)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if isinstance(node.func, ast.Name) and node.func.id == "super":
            return node
        self.generic_visit(node)
        self.sites += 1
        return self._value(node, self.sites)

    def _def(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> ast.AST:
        top = not self.inner.function
        self.inner.function.append(node.name if top else self.inner.function[0])
        self.generic_visit(node)
        self.inner.function.pop()
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _def

    def _test(self, node: ast.If | ast.IfExp) -> ast.AST:
        self.generic_visit(node)
        if self.inner._records_tests():
            self.sites += 1
            node.test = self._value(node.test, self.sites)
        return node

    visit_If = visit_IfExp = _test


def _constant_test(node: ast.If | ast.IfExp) -> bool | None:
    if isinstance(node.test, ast.Constant):
        return bool(node.test.value)
    return None


class _Prune(ast.NodeTransformer):
    """An ``if`` (or conditional expression) with a constant test becomes the branch it takes."""

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        self.generic_visit(node)
        taken = _constant_test(node)
        if taken is None:
            return node
        return node.body if taken else node.orelse

    def visit_If(self, node: ast.If) -> Any:
        self.generic_visit(node)
        taken = _constant_test(node)
        if taken is None:
            return node
        return (node.body if taken else node.orelse) or None


def _fill_bodies(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            stmts = getattr(node, name, None)
            if name == "body" and isinstance(stmts, list) and not stmts:
                setattr(node, name, [ast.Pass()])


def fold(code: str, records: dict[int, set[str]], tests_in: set[str]) -> tuple[str, int]:
    """(``code`` with every site that saw one literal folded to it, how many were folded)."""
    values = {site: next(iter(seen)) for site, seen in records.items() if len(seen) == 1 and "<object>" not in seen}
    tree = ast.parse(code)
    folder = _Fold(values, tests_in)
    tree = folder.visit(tree)
    tree = _Prune().visit(tree)
    _fill_bodies(tree)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n", folder.folded


def _has_call(node: ast.AST) -> bool:
    return any(isinstance(n, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)) for n in ast.walk(node))


def _inert(stmt: ast.stmt) -> bool:
    """A statement that does nothing: ``pass``, ``continue`` or a constant on its own."""
    return isinstance(stmt, (ast.Pass, ast.Continue)) or (
        isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
    )


def _read_names(fn: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}


class _Clean(ast.NodeTransformer):
    """What folding leaves idle: constants as statements, loops over nothing they use with an
    idle body, and assignments (without calls) of locals that nothing reads."""

    def __init__(self) -> None:
        self.reads: list[set[str]] = []
        self.changed = False

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        self.reads.append(_read_names(node))
        self.generic_visit(node)
        self.reads.pop()
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Expr(self, node: ast.Expr) -> ast.AST | None:
        if isinstance(node.value, ast.Constant):
            self.changed = True
            return None
        return node

    def visit_For(self, node: ast.For) -> ast.AST | None:
        self.generic_visit(node)
        if all(_inert(s) for s in node.body) and not node.orelse and not _has_call(node.iter):
            self.changed = True
            return None
        return node

    def visit_Assign(self, node: ast.Assign) -> ast.AST | None:
        if not self.reads or _has_call(node.value):
            return node
        names = [t for t in node.targets if isinstance(t, ast.Name)]
        if len(names) == len(node.targets) and all(t.id not in self.reads[-1] for t in names):
            self.changed = True
            return None
        return node


def _positional(tree: ast.Module) -> dict[str, int]:
    """Per class name: the most arguments any call of it passes by position (a ``*args`` counts
    as all of them)."""
    out: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            n = 10**6 if any(isinstance(a, ast.Starred) for a in node.args) else len(node.args)
            out[node.func.id] = max(out.get(node.func.id, 0), n)
    return out


def _dataclass_fields(tree: ast.Module) -> bool:
    """Fields with a default of the script's own dataclasses that nothing reads by name and no
    call passes by position (the case's expression passes only the fields something reads)."""
    refs: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            refs[node.attr] = refs.get(node.attr, 0) + 1
        elif isinstance(node, ast.keyword) and node.arg:
            refs[node.arg] = refs.get(node.arg, 0) + 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 200:
            for word in node.value.replace(".", " ").split():
                refs[word] = refs.get(word, 0) + 1
    positional = _positional(tree)
    changed = False
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and is_dataclass(node)):
            continue
        body: list[ast.stmt] = []
        index = 0
        for s in node.body:
            field = isinstance(s, ast.AnnAssign) and "ClassVar" not in ast.unparse(s.annotation)
            if (
                field
                and isinstance(s, ast.AnnAssign)
                and s.value is not None
                and isinstance(s.target, ast.Name)
                and s.target.id not in refs
                and index >= positional.get(node.name, 0)
            ):
                continue
            index += field
            body.append(s)
        changed |= len(body) != len(node.body)
        node.body = body or [ast.Pass()]
    return changed


#: Methods torch calls on objects of any class, by duck typing: DCP saves and loads whatever
#: implements the ``Stateful`` protocol (a runtime-checkable ``Protocol``) through these.
PROTOCOL_METHODS = frozenset({"state_dict", "load_state_dict"})


def _methods(tree: ast.Module, local: set[str]) -> bool:
    """Methods nothing calls by name, in classes whose bases are the script's own (torch calls
    no method of those by a name the script does not write, but :data:`PROTOCOL_METHODS`)."""
    words: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            words[node.attr] = words.get(node.attr, 0) + 1
        elif isinstance(node, ast.Name):
            words[node.id] = words.get(node.id, 0) + 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 200:
            for word in node.value.replace(".", " ").split():
                words[word] = words.get(word, 0) + 1
    changed = False
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [ast.unparse(b) for b in node.bases]
        if not all(b in local or b in ("object", "enum.Enum", "Enum", "str") for b in bases):
            continue
        before = len(node.body)
        node.body = [
            s
            for s in node.body
            if not (
                isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                and (
                    (not s.name.startswith("__") and s.name not in words and s.name not in PROTOCOL_METHODS)
                    or (s.name == "__post_init__" and all(_inert(b) for b in s.body))
                )
            )
        ] or [ast.Pass()]
        changed |= len(node.body) != before
    return changed


def is_dataclass(node: ast.ClassDef) -> bool:
    """Whether a class of the script is decorated as a dataclass (``@dataclass``, ``@dataclass(frozen=True)``)."""
    return any("dataclass" in ast.unparse(d) for d in node.decorator_list)


#: A Python name as it may appear in a string (a field named in ``getattr(obj, 'f')``, a function
#: named in a signature): what the reduction passes count as naming a definition.
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _drop_repeated_imports(tree: ast.Module) -> None:
    """The module's top-level imports without the names an earlier one imported already, the
    same way (``from dataclasses import dataclass`` after ``from dataclasses import dataclass,
    field``: inlining and unrolling bring a function's imports along); a name bound otherwise
    at the top level too is left alone."""
    bound: Counter[str] = Counter()
    for node in tree.body:
        for target in ast.walk(node) if not isinstance(node, (ast.Import, ast.ImportFrom)) else ():
            if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store):
                bound[target.id] += 1
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound[node.name] += 1
    seen: set[tuple[str | None, str, str]] = set()
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (
            isinstance(node, ast.ImportFrom) and node.module == "__future__"
        ):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            names = []
            for alias in node.names:
                key = (module, alias.name, alias.asname or alias.name)
                if key in seen and not bound[key[2].split(".")[0]]:
                    continue
                seen.add(key)
                names.append(alias)
            if not names:
                continue
            node.names = names
        body.append(node)
    tree.body = body


def drop_unnamed_functions(tree: ast.Module) -> ast.Module:
    """A whole program's top-level functions that nothing names (no name read, no word of a
    string; only attributes and fields that share the name: ``side.param_names`` is not the
    function ``param_names``), until none is left. Only for a script (its ``main`` runs it):
    a module whose functions are called from outside keeps them by no name."""
    while True:
        named: Counter[str] = Counter()
        for node in tree.body:
            for n in ast.walk(node):
                if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store):
                    named[n.id] += 1
                elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                    named.update(WORD.findall(n.value))
        own = {
            id(n): Counter(m.id for m in ast.walk(n) if isinstance(m, ast.Name) and not isinstance(m.ctx, ast.Store))
            for n in tree.body
        }
        body = [
            n
            for n in tree.body
            if not (
                isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                and not n.name.startswith("__")
                and n.name != "main"
                and named[n.name] - own[id(n)][n.name] <= 0
            )
        ]
        if len(body) == len(tree.body):
            return tree
        tree.body = body


def clean(code: str) -> str:
    """``code`` without what folding left idle (:class:`_Clean`), unread dataclass fields,
    uncalled methods of its own classes, and imports repeated at the top level."""
    tree = ast.parse(code)
    _drop_repeated_imports(tree)
    local = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    for _ in range(3):
        cleaner = _Clean()
        tree = cleaner.visit(tree)
        _fill_bodies(tree)
        fields = _dataclass_fields(tree)
        methods = _methods(tree, local)
        if not (cleaner.changed or fields or methods):
            break
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"
