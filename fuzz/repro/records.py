"""A record collapsed to the one field that is read of it: a cut of :func:`fuzz.repro.delta.ddmin`,
kept only if the script still reproduces and is shorter.

A judge builds small dataclasses to hand its findings on: ``Mismatch(index=i, actual=a, ...)``
of which only ``is not None`` is asked, ``Failure(kind, signature, summary, details)`` of which
the check reads ``.summary``, ``RankReport(rank=r, observation=o)`` read for ``.observation``.
What a maintainer would write is the value itself. For a dataclass of the script's own with no
methods and a field ``f``, the cut writes every call of the class as the expression it binds to
``f`` (its argument, else the field's default) and every read of an attribute named ``f`` as
the object it is read from; the class, left unused, goes with the tidying. Where something
reads another field, or an attribute of that name on another object, the candidate fails and
the oracle rejects it: the cut is tried field by field, a few attempts per script.
"""

from __future__ import annotations

import ast
import copy

from fuzz.repro.delta import Frozen


def _is_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return True
    return False


def _fields(node: ast.ClassDef) -> list[tuple[str, ast.expr | None]] | None:
    """The fields of a method-less dataclass in order (name, default), or None for a class
    with anything else in its body (methods, class variables that are not fields)."""
    out: list[tuple[str, ast.expr | None]] = []
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if "ClassVar" in ast.unparse(stmt.annotation):
                return None
            default = stmt.value
            if isinstance(default, ast.Call) and ast.unparse(default.func).endswith("field"):
                factory = next((k.value for k in default.keywords if k.arg == "default_factory"), None)
                value = next((k.value for k in default.keywords if k.arg == "default"), None)
                default = ast.Call(func=factory, args=[], keywords=[]) if factory is not None else value
            out.append((stmt.target.id, default))
        elif isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            continue
        else:
            return None
    return out


def _records(tree: ast.Module, frozen: Frozen) -> dict[str, list[tuple[str, ast.expr | None]]]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name not in frozen and not node.bases and _is_dataclass(node):
            fields = _fields(node)
            if fields:
                out[node.name] = fields
    return out


def record_fields(code: str, frozen: Frozen) -> list[str]:
    """``Class.field`` for every field of the script's method-less dataclasses (outside
    ``frozen``) whose class is called somewhere."""
    tree = ast.parse(code)
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return [f"{c}.{f}" for c, fields in _records(tree, frozen).items() if c in called for f, _ in fields]


class _Collapse(ast.NodeTransformer):
    def __init__(self, cls: str, fields: list[tuple[str, ast.expr | None]], keep: str) -> None:
        self.cls, self.fields, self.keep = cls, fields, keep
        self.failed = False

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if not (isinstance(node.func, ast.Name) and node.func.id == self.cls):
            return node
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            self.failed = True
            return node
        names = [f for f, _ in self.fields]
        index = names.index(self.keep)
        given = next((k.value for k in node.keywords if k.arg == self.keep), None)
        if given is None and index < len(node.args):
            given = node.args[index]
        if given is None:
            default = self.fields[index][1]
            if default is None:
                self.failed = True
                return node
            given = copy.deepcopy(default)
        return given

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if node.attr != self.keep:
            return node
        if not isinstance(node.ctx, ast.Load):
            self.failed = True
            return node
        return node.value


def collapse_record(code: str, key: str, frozen: Frozen) -> str | None:
    """``code`` with the dataclass ``Class`` of ``key`` (``Class.field``) collapsed to its
    ``field``: calls of the class written as the expression bound to the field, reads of an
    attribute of that name as the object read from. None where the class is not such a record
    (or a call of it passes ``*args`` / ``**kwargs``, or leaves the field without a value)."""
    cls, _, keep = key.partition(".")
    tree = ast.parse(code)
    fields = _records(tree, frozen).get(cls)
    if not fields or keep not in [f for f, _ in fields]:
        return None
    collapse = _Collapse(cls, fields, keep)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            continue
        collapse.visit(node)
    if collapse.failed:
        return None
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"
