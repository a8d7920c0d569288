"""Folding what plain Python computes in a reduced script, from what an instrumented run saw.

After inlining and unrolling, a script still computes much of its case in plain Python: the
paths of the tree (``[p for p, _ in layout.paths.items()]``), the parameter names a hook is
given, the order of the composition's steps, ``world_size * 2``. Each such expression evaluates
to the same small literal on every rank and every time; written as that literal, the code that
computed it (the model's classes, its helpers) goes with the next tidying.

:func:`instrument` wraps every expression at these places of the script's functions: the value
of an assignment, a ``for`` loop's or a comprehension's iterable, a call's argument, a
subscript, an ``if`` test, a ``return`` value. Each rank records, per site, the value's source
text (:func:`_sf_src` in :data:`RECORDER`) if the value is a literal (None, bool, int, finite
float, str, an enum member of the script's, tuples, lists, sets and dicts of them) **and** every
name the expression reads held plain data before and after it ran, unchanged: literals, the
script's dataclass objects holding them, builtins, and the script's own functions and classes
whose globals are such (a function that names a module, ``torch`` or ``dist``, is not). A
value computed from torch (a tensor's shape, a state dict's keys) is therefore never folded: it
is what the script exists to show. :func:`fold` replaces each site that recorded one value on
every rank every time by that value.

Never instrumented: ``main``, the definitions the reducer keeps as they are (a mismatch's
judge), and in ``attempt`` the harness (its ``except`` clauses, its verdicts, the tests that
choose them, the statements that bind what they read). A fold is a candidate like any cut: kept
only if the script still reproduces (and passes with the bug's fix, where that is checked).
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator
from pathlib import Path

from fuzz.repro.delta import _harness_reads, _returns
from fuzz.repro.fold import _fill_bodies, _Prune, read_tables, recorder

#: The recorder the instrumented script starts with (then :data:`fuzz.repro.fold.EXIT`: each
#: process writes ``values-PID.json``).
RECORDER = """
import atexit as _sv_atexit, builtins as _sv_builtins, dataclasses as _sv_dc, enum as _sv_enum
import json as _sv_json, os as _sv_os, signal as _sv_signal, sys as _sv_sys, types as _sv_types
_SV_SEEN = {}
_SV_MODULE = __name__
_SV_PLAIN = (type(None), bool, int, str)


def _sv_ours(v):
    return getattr(v, "__module__", None) == _SV_MODULE


def _sv_names(code):
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, _sv_types.CodeType):
            out |= _sv_names(c)
    return out


def _sv_data(v, depth=0, busy=None):
    if depth > 8:
        return False
    busy = set() if busy is None else busy
    t = type(v)
    if t in _SV_PLAIN or (t is float and v == v and abs(v) != float("inf")):
        return True
    if t in (tuple, list, set, frozenset):
        return len(v) <= 64 and all(_sv_data(x, depth + 1, busy) for x in v)
    if t is dict:
        return len(v) <= 64 and all(_sv_data(k, depth + 1, busy) and _sv_data(x, depth + 1, busy) for k, x in v.items())
    if isinstance(v, _sv_enum.Enum):
        return True
    if isinstance(v, (_sv_types.BuiltinFunctionType, type)) and getattr(v, "__module__", None) == "builtins":
        return True
    if isinstance(v, type):
        return _sv_ours(v)
    if isinstance(v, _sv_types.FunctionType):
        if not _sv_ours(v):
            return False
        if id(v) in busy:
            return True
        busy.add(id(v))
        names = [n for n in _sv_names(v.__code__) if n in v.__globals__ and not n.startswith("_sv")]
        return all(_sv_data(v.__globals__[n], depth + 1, busy) for n in names)
    if _sv_dc.is_dataclass(v) and _sv_ours(type(v)):
        return all(_sv_data(getattr(v, f.name, None), depth + 1, busy) for f in _sv_dc.fields(v))
    return False


def _sv_src(v):
    t = type(v)
    if t in _SV_PLAIN or t is float:
        return repr(v)
    if isinstance(v, _sv_enum.Enum):
        c = type(v)
        return f"{c.__name__}.{v.name}" if _sv_ours(c) and "." not in c.__qualname__ else None
    if t in (tuple, list, set, frozenset):
        items = [_sv_src(x) for x in (sorted(v, key=repr) if t in (set, frozenset) else v)]
        if None in items or (t in (set, frozenset) and not items):
            return None
        inner = ", ".join(items)
        if t is tuple:
            return f"({inner},)" if len(items) == 1 else f"({inner})"
        if t is list:
            return f"[{inner}]"
        return f"{{{inner}}}" if t is set else f"frozenset({{{inner}}})"
    if t is dict:
        items = [(_sv_src(k), _sv_src(x)) for k, x in v.items()]
        if any(k is None or x is None for k, x in items):
            return None
        return "{" + ", ".join(f"{k}: {x}" for k, x in items) + "}"
    return None


def _sv_state(deps):
    try:
        values = deps()
    except Exception:
        return None
    if not all(_sv_data(d) for d in values):
        return None
    try:
        return repr(values)
    except Exception:
        return None


def _sv(i, deps, expr):
    before = _sv_state(deps)
    v = expr()
    seen = _SV_SEEN.setdefault(i, set())
    if len(seen) < 2:
        src = _sv_src(v) if before is not None and _sv_data(v) else None
        if src is not None and (len(src) > 240 or _sv_state(deps) != before):
            src = None
        seen.add(src if src is not None else "<object>")
    return v

"""

_HARNESS_FUNCTIONS = frozenset({"main"})
#: Modules whose names compute plain data from plain data: what the script binds by importing
#: any other (torch, os, random) is a source of values the fold must not freeze.
_PLAIN_MODULES = frozenset(
    {
        "__future__",
        "dataclasses",
        "enum",
        "functools",
        "itertools",
        "collections",
        "re",
        "math",
        "typing",
        "operator",
        "hashlib",  # a digest of plain data (a checkpoint directory's name from the case's JSON)
        "json",
    }
)
_GIVEN = frozenset(dir(builtins))
_Scope = ast.FunctionDef | ast.AsyncFunctionDef


def _foldable(node: ast.expr) -> bool:
    """An expression worth folding and safe to wrap in a lambda."""
    if isinstance(node, (ast.Name, ast.Constant, ast.Starred, ast.Lambda, ast.Slice)):
        return False
    if isinstance(node, ast.Tuple) and any(isinstance(e, ast.Slice) for e in node.elts):
        return False  # x[a:b, c]: a slice is no value
    for n in ast.walk(node):
        if isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await, ast.NamedExpr)):
            return False
        if isinstance(n, ast.Name) and n.id in ("super", "locals", "vars", "globals", "__class__"):
            return False
    return True


def _free_names(node: ast.AST) -> list[str]:
    """The names ``node`` reads that it does not bind itself (a comprehension's targets, a
    lambda's parameters, each in its own scope), in order of appearance."""
    out: list[str] = []

    def visit(n: ast.AST, bound: frozenset[str]) -> None:
        if isinstance(n, ast.Lambda):
            inner = bound | {a.arg for a in ast.walk(n.args) if isinstance(a, ast.arg)}
            for d in [*n.args.defaults, *(d for d in n.args.kw_defaults if d is not None)]:
                visit(d, bound)
            visit(n.body, inner)
            return
        if isinstance(n, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            inner = bound
            for i, gen in enumerate(n.generators):
                visit(gen.iter, bound if i == 0 else inner)  # the first iterable is the enclosing scope's
                inner = inner | {t.id for t in ast.walk(gen.target) if isinstance(t, ast.Name)}
                for test in gen.ifs:
                    visit(test, inner)
            for part in (n.key, n.value) if isinstance(n, ast.DictComp) else (n.elt,):
                visit(part, inner)
            return
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            if n.id not in bound and n.id not in out and not n.id.startswith("_sv"):
                out.append(n.id)
            return
        for child in ast.iter_child_nodes(n):
            visit(child, bound)

    visit(node, frozenset())
    return out


def _import_names(node: ast.Import | ast.ImportFrom) -> list[tuple[str, bool]]:
    """(the name bound, whether what it names computes plain data only)."""
    if isinstance(node, ast.ImportFrom):
        plain = (node.module or "").split(".")[0] in _PLAIN_MODULES and node.level == 0
        return [(a.asname or a.name, plain) for a in node.names]
    return [(a.asname or a.name.split(".")[0], a.name.split(".")[0] in _PLAIN_MODULES) for a in node.names]


def _own_nodes(fn: _Scope) -> list[ast.AST]:
    """The nodes of ``fn``'s body, not those of functions or classes nested in it."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


class _Taint:
    """Which names may hold what torch (or the process, the clock, the environment) computed,
    statically: a value the fold must leave to be computed. A name is tainted where any binding
    of it, any mutation of it (``x.append(v)``, ``x[k] = v``, ``x.a = v``) or, for a parameter,
    any call's argument for it reads a tainted name; the roots are what the script imports from
    other modules than :data:`_PLAIN_MODULES`, exception objects, and the parameters of methods
    and of functions used other than by calling them. ``attempt``'s parameters are the rank and
    the world size."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.functions: list[tuple[_Scope, bool]] = []  # (function, is a method)
        self.globals: set[str] = set()  # tainted top-level names
        self.top: dict[str, ast.stmt] = {}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.append((node, False))
                self.top[node.name] = node
            elif isinstance(node, ast.ClassDef):
                self.top[node.name] = node
                self.functions.extend(
                    (m, True) for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                )
        self.locals = {id(fn): self._bound(fn) for fn, _ in self.functions}
        self.tainted: dict[int, set[str]] = {id(fn): set() for fn, _ in self.functions}
        self._solve()

    @staticmethod
    def _bound(fn: _Scope) -> set[str]:
        args = fn.args
        out = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
        out.update(a.arg for a in (args.vararg, args.kwarg) if a is not None)
        for n in _own_nodes(fn):
            if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
                out.add(n.id)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                out.update(name for name, _ in _import_names(n))
            elif isinstance(n, (ast.ExceptHandler, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name:
                out.add(n.name)
        return out

    def expr(self, node: ast.AST | None, fn: _Scope | None) -> bool:
        """Whether ``node`` (in ``fn``, or at the top level) reads a tainted name."""
        if node is None:
            return False
        local = self.locals[id(fn)] if fn is not None else set()
        tainted = self.tainted[id(fn)] if fn is not None else set()
        for name in _free_names(node):
            if name in local:
                if name in tainted:
                    return True
            elif name in self.globals or (name not in self.top and name not in _GIVEN and name not in self.plain):
                return True
        return False

    def _solve(self) -> None:
        self.plain: set[str] = set()  # top-level names bound to plain data by assignments and imports
        for node in self.tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name, plain in _import_names(node):
                    (self.plain if plain else self.globals).add(name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                self.plain.update(
                    n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                )
        changed = True
        while changed:
            changed = False
            for node in self.tree.body:  # top-level assignments and definitions
                names: set[str] = set()
                if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and self.expr(node.value, None):
                    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                elif (
                    isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                    and node.name not in self.globals
                ):
                    reads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
                    if reads & self.globals:
                        names = {node.name}
                if names - self.globals:
                    self.globals |= names
                    changed = True
            for fn, method in self.functions:
                changed |= self._function(fn, method)

    def _params(self, fn: _Scope, method: bool) -> set[str]:
        args = fn.args
        positional = [a.arg for a in [*args.posonlyargs, *args.args]]
        every = set(positional) | {a.arg for a in args.kwonlyargs}
        every.update(a.arg for a in (args.vararg, args.kwarg) if a is not None)
        if fn.name == "attempt" and not method:
            return set()
        if method:
            return every
        out: set[str] = {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        defaults = dict(zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True))
        defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None})
        passed: dict[str, list[tuple[ast.expr, _Scope | None]]] = {}
        for caller, node in self._references(fn.name):
            call = node if isinstance(node, ast.Call) else None
            if (
                call is None
                or any(isinstance(a, ast.Starred) for a in call.args)
                or any(k.arg is None for k in call.keywords)
            ):
                return every
            for name, value in zip(positional, call.args, strict=False):
                passed.setdefault(name, []).append((value, caller))
            for kw in call.keywords:
                passed.setdefault(kw.arg or "", []).append((kw.value, caller))
        for name in every:
            values = passed.get(name, [])
            if any(self.expr(v, c) for v, c in values) or self.expr(defaults.get(name), None):
                out.add(name)
        return out

    def _references(self, name: str) -> Iterator[tuple[_Scope | None, ast.AST]]:
        """Every use of the top-level ``name``: the call (or the name itself where it is not
        called), with the function it is in."""
        scopes: list[tuple[_Scope | None, list[ast.AST]]] = [(fn, _own_nodes(fn)) for fn, _ in self.functions]
        top = [
            n
            for node in self.tree.body
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            for n in ast.walk(node)
        ]
        scopes.append((None, top))
        for scope, nodes in scopes:
            funcs = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
            for n in nodes:
                if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name) or (
                    isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) and id(n) not in funcs
                ):
                    yield scope, n

    def _function(self, fn: _Scope, method: bool) -> bool:
        tainted = self.tainted[id(fn)]
        before = len(tainted)
        grew = False
        tainted |= self._params(fn, method)
        for node in _own_nodes(fn):
            targets: list[ast.AST] = []
            value: ast.AST | None = None
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = list(node.targets) if isinstance(node, ast.Assign) else [node.target]
                value = node.value
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                targets, value = [node.target], node.iter
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                targets, value = [node.optional_vars], node.context_expr
            elif isinstance(node, ast.ExceptHandler) and node.name:
                tainted.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                tainted.update(name for name, plain in _import_names(node) if not plain)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                tainted.add(node.name)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                tainted.update(node.names)
            elif isinstance(node, ast.NamedExpr):
                tainted.add(node.target.id)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                func = node.value.func  # x.append(v): x holds v now
                if isinstance(func, ast.Attribute) and self.expr(node.value, fn):
                    targets = [func.value]
            if targets and (value is None or self.expr(value, fn)):
                for target in targets:  # x = v, x[k] = v, x.a = v, (a, b) = v: every name in it
                    names = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
                    tainted.update(names)
                    # a module-level object changed here (TABLE[k] = v) is tainted wherever it is read
                    outside = (names - self.locals[id(fn)] - self.globals) & (set(self.top) | self.plain)
                    if outside:
                        self.globals |= outside
                        grew = True
        return len(tainted) != before or grew


class _Sites(ast.NodeTransformer):
    """Numbers the sites in one order (on the script as it is, before any change); with
    ``values`` (site -> source) replaces those that have one, else wraps every site in the
    recorder's ``_sv``."""

    def __init__(self, tree: ast.Module, skip: frozenset[str], values: dict[int, str] | None = None) -> None:
        self.skip = skip
        self.guarded = _harness_reads(tree)  # names attempt's harness reads: their bindings stay
        self.taint = _Taint(tree)
        self.values = values
        self.sites = 0
        self.folded = 0
        self.scope: _Scope | None = None
        self.harness = False  # inside attempt
        self.marked: dict[int, int] = {}
        self._mark(tree)

    def _mark(self, tree: ast.Module) -> None:
        """Number the sites: the expressions at the places the module's docstring names, in
        functions not skipped, that are worth folding and read no tainted name."""
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name not in self.skip | _HARNESS_FUNCTIONS:
                    self._mark_function(node, node.name == "attempt")
            elif isinstance(node, ast.ClassDef) and node.name not in self.skip:
                for m in node.body:
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self._mark_function(m, False)

    def _mark_function(self, fn: _Scope, harness: bool) -> None:
        def site(node: ast.expr | None) -> None:
            if node is not None and _foldable(node) and not self.taint.expr(node, fn):
                self.sites += 1
                self.marked[id(node)] = self.sites

        def visit(node: ast.AST, in_handler: bool) -> None:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                return  # nested: its own scope
            if harness and (isinstance(node, ast.ExceptHandler) or in_handler):
                return
            for child in ast.iter_child_nodes(node):
                visit(child, in_handler)
            if isinstance(node, ast.Return):
                if not harness:
                    site(node.value)
            elif isinstance(node, ast.If):
                if not (harness and _returns(node)):
                    site(node.test)
            elif isinstance(node, ast.IfExp):
                if not harness:
                    site(node.test)
            elif isinstance(node, ast.Assign):
                binds = {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
                if not (harness and binds & self.guarded):
                    site(node.value)
            elif isinstance(node, (ast.For, ast.comprehension)):
                site(node.iter)
            elif isinstance(node, ast.Call):
                for a in node.args:
                    site(a.value if isinstance(a, ast.Starred) else a)
                for kw in node.keywords:
                    site(kw.value)
            elif isinstance(node, ast.Subscript):
                site(node.slice)

        for stmt in fn.body:
            visit(stmt, False)

    def visit(self, node: ast.AST) -> ast.AST:
        node = super().visit(node)
        number = self.marked.get(id(node))
        if number is None or not isinstance(node, ast.expr):
            return node
        if self.values is not None:
            if number not in self.values:
                return node
            self.folded += 1
            return ast.copy_location(ast.parse(self.values[number], mode="eval").body, node)
        deps = ast.Tuple([ast.Name(n, ast.Load()) for n in _free_names(node)], ast.Load())
        return ast.Call(ast.Name("_sv", ast.Load()), [ast.Constant(number), _thunk(deps), _thunk(node)], [])


def _thunk(body: ast.expr) -> ast.Lambda:
    return ast.Lambda(
        ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]),
        body,
    )


def instrument(code: str, skip: frozenset[str], directory: str) -> str:
    """``code`` recording its sites (see the module's docstring); ``skip`` names top-level
    definitions left as they are."""
    tree = ast.parse(code)
    _Sites(tree, skip).visit(tree)
    future = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    rest = [n for n in tree.body if n not in future]
    prelude = recorder(RECORDER, "_sv", "_SV_SEEN", "values", directory)
    tree.body = [*future, *prelude.body, *rest]
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def read_records(directory: Path) -> dict[int, set[str]]:
    """Per site, every value any process recorded."""
    return read_tables(directory, "values")


def foldable(records: dict[int, set[str]]) -> list[int]:
    """The sites that saw one literal on every rank every time, in order."""
    return sorted(site for site, seen in records.items() if len(seen) == 1 and "<object>" not in seen)


def fold(code: str, records: dict[int, set[str]], skip: frozenset[str]) -> tuple[str, int]:
    """(``code`` with every site that saw one literal on every rank every time folded to it, and
    an ``if`` on a constant folded to its branch; how many sites were folded)."""
    values = {site: next(iter(records[site])) for site in foldable(records)}
    tree = ast.parse(code)
    sites = _Sites(tree, skip, values)
    sites.visit(tree)
    _Prune().visit(tree)
    _fill_bodies(tree)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n", sites.folded
