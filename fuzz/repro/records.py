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
from fuzz.repro.simplify import _Class, _classes


def _records(tree: ast.Module, frozen: Frozen) -> dict[str, _Class]:
    """The script's method-less dataclasses outside ``frozen`` (:func:`fuzz.repro.simplify._classes`:
    fields in the order ``__init__`` takes them, with their defaults)."""
    return {
        name: info
        for name, info in _classes(tree).items()
        if name not in frozen and info.plain and not info.properties and info.fields
    }


def record_fields(code: str, frozen: Frozen) -> list[str]:
    """``Class.field`` for every field of the script's method-less dataclasses (outside
    ``frozen``) whose class is called somewhere."""
    tree = ast.parse(code)
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return [f"{c}.{f}" for c, info in _records(tree, frozen).items() if c in called for f in info.fields]


class _Collapse(ast.NodeTransformer):
    def __init__(self, cls: str, info: _Class, keep: str) -> None:
        self.cls, self.info, self.keep = cls, info, keep
        self.failed = False

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if not (isinstance(node.func, ast.Name) and node.func.id == self.cls):
            return node
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            self.failed = True
            return node
        index = self.info.fields.index(self.keep)
        given = next((k.value for k in node.keywords if k.arg == self.keep), None)
        if given is None and index < len(node.args):
            given = node.args[index]
        if given is None:
            default = self.info.defaults.get(self.keep)
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
    info = _records(tree, frozen).get(cls)
    if info is None or keep not in info.fields:
        return None
    collapse = _Collapse(cls, info, keep)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            continue
        collapse.visit(node)
    if collapse.failed:
        return None
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"
