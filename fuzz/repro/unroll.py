"""Partial evaluation of a builder called on a literal: a cut of :func:`fuzz.repro.delta.ddmin`,
kept only if the script still reproduces and is shorter.

The rank code builds a case's model by recursion over the case's tree
(``build_node(Block(children=(Leaf(kind=LeafKind.LINEAR), ...)), 4)``). Once the case is a
literal in the script, every such call can be evaluated as far as the literal decides it: the
function's parameters become the arguments, ``isinstance`` of an object built in place and a
field read off one become constants, an ``if`` on a constant its branch, a comprehension over a
display one element per item, and what follows the first ``return`` goes. A call whose function
is then one ``return`` becomes the expression returned; one that still has statements is inlined
before its statement (:func:`fuzz.repro.delta._inlined`). The recursive calls that this leaves,
on smaller literals, are evaluated in turn, until none is left: the model is written out as the
torch modules it is built of, and the tree's classes and the builder go.

Arguments count as literal where duplicating them cannot change what runs: constants, enum
members, displays of literals, and the script's own dataclasses built from literals (which only
build an object). A local bound once to a literal and read only as such an argument
(``root = Block(...)``; ``build_node(root, 4)``) is the literal in its place
(:func:`_literal_locals`).
"""

from __future__ import annotations

import ast
import copy
from typing import TypeGuard

from fuzz.repro.delta import (
    Frozen,
    _call_site,
    _fixed,
    _inlined,
    _reads,
    _Replace,
    _stores,
    _Substitute,
    _unparse,
    bind,
    propagate_aliases,
)
from fuzz.repro.simplify import _Class, _classes, _Constants, _given, _statement_lists

#: Calls evaluated at most in one :func:`unroll` (a tree's nodes, with room to spare).
MAX_CALLS = 256


def _enums(tree: ast.Module) -> set[str]:
    return {n.name for n in tree.body if isinstance(n, ast.ClassDef) and any("Enum" in ast.unparse(b) for b in n.bases)}


def _literal(node: ast.expr, classes: dict[str, _Class], enums: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id in enums
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_literal(e, classes, enums) for e in node.elts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in classes:
        return all(_literal(a, classes, enums) for a in node.args) and all(
            k.arg is not None and _literal(k.value, classes, enums) for k in node.keywords
        )
    return False


def _bases(tree: ast.Module) -> dict[str, set[str]]:
    """Each top-level class's name with the names of its classes up the chain (itself included)."""
    direct = {
        n.name: {b.id for b in n.bases if isinstance(b, ast.Name)} for n in tree.body if isinstance(n, ast.ClassDef)
    }
    out: dict[str, set[str]] = {}
    for name in direct:
        seen, todo = {name}, [name]
        while todo:
            for base in direct.get(todo.pop(), set()):
                if base not in seen:
                    seen.add(base)
                    todo.append(base)
        out[name] = seen
    return out


class _Evaluate(ast.NodeTransformer):
    """What a literal decides: ``isinstance(C(...), K)``, ``C(...).field``, a comprehension over a
    display."""

    def __init__(self, classes: dict[str, _Class], bases: dict[str, set[str]]) -> None:
        self.classes, self.bases, self.changed = classes, bases, False

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if not (isinstance(node.func, ast.Name) and node.func.id == "isinstance" and len(node.args) == 2):
            return node
        built, kinds = node.args
        names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
        if not (isinstance(built, ast.Call) and isinstance(built.func, ast.Name) and built.func.id in self.bases):
            return node
        if not all(isinstance(k, ast.Name) and k.id in self.bases for k in names):
            return node  # a class not the script's (nn.Module): not decided here
        self.changed = True
        chain = self.bases[built.func.id]
        return ast.Constant(any(isinstance(k, ast.Name) and k.id in chain for k in names))

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        base = node.value
        if not (isinstance(node.ctx, ast.Load) and isinstance(base, ast.Call) and isinstance(base.func, ast.Name)):
            return node
        info = self.classes.get(base.func.id)
        value = _given(base, info, node.attr) if info is not None else None
        if value is None:
            return node
        self.changed = True
        return copy.deepcopy(value)

    def visit_ListComp(self, node: ast.ListComp) -> ast.AST:
        self.generic_visit(node)
        if len(node.generators) != 1:
            return node
        gen = node.generators[0]
        if (
            gen.ifs
            or gen.is_async
            or not isinstance(gen.target, ast.Name)
            or not isinstance(gen.iter, (ast.Tuple, ast.List))
        ):
            return node
        name = gen.target.id
        items = [_Substitute({name: item}).visit(copy.deepcopy(node.elt)) for item in gen.iter.elts]
        self.changed = True
        return ast.List(items, ast.Load())


def _after_return(stmts: list[ast.stmt]) -> list[ast.stmt]:
    """``stmts`` up to its first ``return``."""
    for i, stmt in enumerate(stmts):
        if isinstance(stmt, ast.Return):
            return stmts[: i + 1]
    return stmts


def _evaluated(fn: ast.FunctionDef, call: ast.Call, tree: ast.Module) -> ast.FunctionDef | None:
    """A copy of ``fn`` with no parameters, what ``call`` passes in their place, evaluated as far
    as it decides; None if a parameter is rebound or not given."""
    args = fn.args
    if args.vararg or args.kwarg or args.posonlyargs or args.kwonlyargs:
        return None
    bound = bind(fn, call)
    if bound is None or any(_reads(fn, p)[1] for p in bound):
        return None
    out = copy.deepcopy(fn)
    out.args = ast.arguments([], [], None, [], [], None, [])
    out.body = [_Substitute(bound).visit(s) for s in out.body]
    classes, bases = _classes(tree), _bases(tree)
    for _ in range(16):
        evaluate, constants = _Evaluate(classes, bases), _Constants()
        for stmt in out.body:
            evaluate.visit(stmt)
        constants.visit(out)
        out.body = _after_return(out.body)
        if not (evaluate.changed or constants.changed):
            break
    propagate_aliases(ast.Module([out], []))
    body = out.body
    if (
        len(body) == 2
        and isinstance(body[0], ast.Assign)
        and len(body[0].targets) == 1
        and isinstance(body[0].targets[0], ast.Name)
        and isinstance(body[1], ast.Return)
        and isinstance(body[1].value, ast.Name)
        and body[1].value.id == body[0].targets[0].id
    ):
        out.body = [ast.Return(body[0].value)]  # ``x = f(); return x``: ``return f()``
    return out


def _single_return(fn: ast.FunctionDef) -> bool:
    returns = [n for n in ast.walk(fn) if isinstance(n, ast.Return)]
    return len(returns) == 1 and fn.body[-1] is returns[0]


def _literal_locals(tree: ast.Module, names: set[str], classes: dict[str, _Class], enums: set[str]) -> bool:
    """In each function, a local bound once (not in a loop) to a literal and read once, as an
    argument of a call of one of the functions ``names``, replaced there by the literal, its
    binding dropped: whether any was."""
    changed = False
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        if any(isinstance(n, (ast.Global, ast.Nonlocal, ast.ClassDef)) for n in ast.walk(fn)):
            continue
        own = {
            id(n)
            for inner in ast.walk(fn)
            if inner is not fn and isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for n in ast.walk(inner)
        }
        stores = _stores(fn)
        reads: dict[str, int] = {}
        passed: set[str] = set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                reads[node.id] = reads.get(node.id, 0) + 1
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in names
                and id(node) not in own
            ):
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    if isinstance(arg, ast.Name):
                        passed.add(arg.id)
        alias: dict[str, ast.expr] = {}
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
                continue
            local = node.targets[0].id
            if id(node) in own or local not in passed or stores.get(local) != 1 or reads.get(local) != 1:
                continue
            if _literal(node.value, classes, enums):
                alias[local] = node.value
        if alias:
            _Substitute(alias).visit(fn)
            changed = True
    return changed


def unrollable(code: str, frozen: Frozen = frozenset()) -> list[str]:
    """Top-level functions called on literals (every argument a literal) somewhere."""
    tree = ast.parse(code)
    classes, enums = _classes(tree), _enums(tree)
    _literal_locals(tree, {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, classes, enums)
    out: list[str] = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.decorator_list or _fixed(node, frozen):
            continue
        if any(isinstance(n, (ast.Yield, ast.YieldFrom, ast.Global, ast.Nonlocal)) for n in ast.walk(node)):
            continue
        if any(
            _literal_call(call, node.name, classes, enums) and bool(call.args or call.keywords)
            for call in ast.walk(tree)
        ):
            out.append(node.name)
    return out


def _literal_call(node: ast.AST, name: str, classes: dict[str, _Class], enums: set[str]) -> TypeGuard[ast.Call]:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == name
        and all(_literal(a, classes, enums) for a in node.args)
        and all(k.arg is not None and _literal(k.value, classes, enums) for k in node.keywords)
    )


def unroll(code: str, name: str, frozen: Frozen = frozenset()) -> str | None:
    """``code`` with every call of function ``name`` on literals evaluated (see the module's
    docstring), the calls this leaves too, until none is left; None if one cannot be."""
    if name not in unrollable(code, frozen):
        return None
    tree = ast.parse(code)
    _literal_locals(tree, {name}, _classes(tree), _enums(tree))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    for _ in range(MAX_CALLS):
        classes, enums = _classes(tree), _enums(tree)
        own = {id(n) for n in ast.walk(fn)}
        done = False
        # A call whose evaluation is one expression: in place, wherever it is.
        for node in ast.walk(tree):
            if id(node) in own or not _literal_call(node, name, classes, enums):
                continue
            body = _evaluated(fn, node, tree)
            if body is None:
                return None
            if len(body.body) == 1 and isinstance(body.body[0], ast.Return) and body.body[0].value is not None:
                _Replace(node, body.body[0].value).visit(tree)
                done = True
                break
            # Else inlined before the statement that holds it, where it may be computed there.
            if not _single_return(body) and any(isinstance(n, ast.Return) for n in ast.walk(body)):
                return None
            if not _inline_at(tree, fn, node, body):
                return None
            done = True
            break
        if not done:
            break
    else:
        return None
    out = _unparse(tree)
    return out if out != code else None


def _inline_at(tree: ast.Module, fn: ast.FunctionDef, call: ast.Call, body: ast.FunctionDef) -> bool:
    """Inline ``body`` (``fn`` evaluated for ``call``) before the statement that holds ``call``."""
    for caller in ast.walk(tree):
        if not isinstance(caller, (ast.FunctionDef, ast.AsyncFunctionDef)) or caller is fn:
            continue
        for _, _, block in _statement_lists(caller):
            for i, stmt in enumerate(block):
                if _call_site(stmt, fn.name) is not call:
                    continue
                call.args, call.keywords = [], []  # bound in ``body`` already
                stmts = _inlined(body, call, stmt, caller)
                if stmts is None:
                    return False
                block[i : i + 1] = stmts
                return True
    return False


# -- a module class that holds its children in order, as nn.Sequential ----------------------------


def _module_classes(tree: ast.Module, frozen: Frozen) -> list[ast.ClassDef]:
    """Top-level subclasses of ``nn.Module`` with an ``__init__`` that takes the children first."""
    out: list[ast.ClassDef] = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or _fixed(node, frozen):
            continue
        if [ast.unparse(b) for b in node.bases] not in (["nn.Module"], ["torch.nn.Module"]):
            continue
        init = next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
        if init is not None and len(init.args.args) >= 2 and not init.args.vararg:
            out.append(node)
    return out


def containers(code: str, frozen: Frozen = frozenset()) -> list[str]:
    """Module classes of the script that :func:`as_sequential` may replace."""
    tree = ast.parse(code)
    return [c.name for c in _module_classes(tree, frozen)]


def as_sequential(code: str, name: str, frozen: Frozen = frozenset()) -> str | None:
    """``code`` with module class ``name`` replaced by ``nn.Sequential``: ``name(children, ...)``
    becomes ``nn.Sequential(*children)`` and every other mention of the class ``nn.Sequential``
    (a wrap policy's classes, ``isinstance``). A guess that the class only runs its children in
    order, as its registration under ``0``, ``1``, ... suggests: kept only if the script still
    reproduces."""
    tree = ast.parse(code)
    if name not in [c.name for c in _module_classes(tree, frozen)]:
        return None
    imported_nn = any(
        isinstance(n, ast.ImportFrom) and n.module == "torch" and any(a.name == "nn" and not a.asname for a in n.names)
        for n in tree.body
    )
    sequential = ast.parse("nn.Sequential" if imported_nn else "torch.nn.Sequential", mode="eval").body

    class _Rewrite(ast.NodeTransformer):
        def visit_Call(self, node: ast.Call) -> ast.AST:
            self.generic_visit(node)
            if not getattr(node, "_sequential", False) or not node.args or node.keywords:
                return node
            children = node.args[0]
            elts: list[ast.expr] = (
                children.elts if isinstance(children, (ast.List, ast.Tuple)) else [ast.Starred(children, ast.Load())]
            )
            return ast.Call(copy.deepcopy(sequential), elts, [])

        def visit_Name(self, node: ast.Name) -> ast.AST:
            return copy.deepcopy(sequential) if node.id == name and isinstance(node.ctx, ast.Load) else node

    for node in ast.walk(tree):  # mark the calls of the class before its name is replaced
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
            node._sequential = True  # type: ignore[attr-defined]
    tree = _Rewrite().visit(tree)
    tree.body = [n for n in tree.body if not (isinstance(n, ast.ClassDef) and n.name == name)]
    return _unparse(tree)
