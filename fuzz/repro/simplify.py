"""Rewrites of a flat script that leave what it does as it was and what a reader must follow
shorter: cut 0 of :func:`fuzz.repro.delta.ddmin`, kept only if the script still reproduces.

Each rewrite works inside the functions that may be cut (``main`` and frozen definitions are
left alone), repeated until none applies:

- **Objects**: ``obj.f``, where ``obj`` is a local bound once to a dataclass built in place
  (``side = Side(composed=c, training=t)``) and nothing assigns ``obj.f``, becomes what the
  field was built with, or the field's default where the call does not give it; ``obj.p``,
  where ``p`` is a property that returns one expression, becomes that expression;
  ``getattr(obj, 'name', default)`` becomes ``obj.name`` for a field, ``default`` where
  nothing binds the name for it (the class and its bases do not, nothing assigns it on ``obj``,
  which is handed to nothing); ``obj is None`` becomes False (``is not``: True);
- **Parameters**: a parameter that every call of its function binds to one and the same build of
  a frozen dataclass from constants and enum members (given in the call, or through the
  caller's local or the caller's own such parameter) has its fields read as a local's are;
  ``Training(lr=0.1).lr`` becomes ``0.1``;
- **Scalars**: such a local that is only ever used as ``obj.attr`` (read or assigned) becomes
  one local per attribute (``side_opt``), its constructor's arguments assigned to them in order;
- **Tables**: ``TABLE[key]``, where ``TABLE`` is a module-level dict display that nothing
  changes and ``key`` is written as one of its keys, becomes that key's value;
- **Enum aliases and tests**: a local bound once to an enum member (``item = Item.MODEL``)
  becomes the member, and ``Item.MODEL.value`` the constant the class assigns it; a comparison
  of two members of one enum (``is``, ``==``, ``in`` a tuple of members) or of a member with
  None (``is None``) becomes its constant, and an ``if`` on a constant (or on a display of pure
  elements, ``()`` being false) the branch it takes; ``a, b = (x, y)`` of names and constants
  becomes two assignments;
- **Constants**: a local bound once to a constant or a tuple of them (``key = ()``) becomes
  that constant where it is read;
- **Bags**: a local bound to ``{}`` and only subscripted by constant keys becomes one local
  per key;
- **Imports**: in functions, imported names nothing reads go, neighbouring imports from one
  module become one, and an import of what an earlier one in the block bound under another
  name goes, its name replaced by the earlier one;
- **Firsts and empties**: ``next(iter((a, b)))`` becomes ``a``; a comprehension over an empty
  display becomes an empty display, one over a display of one element the display of its
  item, and ``**{}`` goes from a call or a dict display, with a local bound only to ``{}``
  and only unpacked so;
- **Identities**: ``x * 1``, ``x // 1``, ``x + 0``, ``x - 0``, ``[] + x`` and the like become
  ``x``, ``*()`` goes from a display or a call and ``*[a, b]`` becomes ``a, b``, and
  ``dict()``, ``list()``, ``tuple()`` become displays;
- **Appends**: ``v = []`` followed by ``v.append(a)`` and ``v += [b]`` becomes ``v = [a, b]``,
  and ``d = {}`` followed by ``d['k'] = x`` becomes ``d = {'k': x}``;
- **Keywords**: ``f(**kw)``, where ``kw`` is a local bound once to a dict display of string
  keys and pure values (or of any values, unpacked once in the next statement) and only
  unpacked so, becomes ``f(k=v, ...)``;
- **Read next**: ``x = v`` followed by a statement that reads ``x`` once, before it runs any
  code, where nothing else reads or binds ``x``, becomes that statement with ``v`` in place of
  ``x`` (``loss = f(out); loss.backward()``: ``f(out).backward()``), unless that makes the
  statement wider than :data:`MERGED_WIDTH` (and wider than it was); ``x = e`` followed by
  ``return x`` becomes ``return e``;
- **Last returns**: a function whose one ``return`` is in an ``if`` (no ``else``) that ends
  it, ``if t: return x``, ends in ``return x if t else None`` instead (what falling off its end
  returned), so that it has one ``return``, its last statement, and may be inlined.

What is not pure (a call whose value is used twice) is never duplicated, but for calls of the
script's own dataclasses, which only build an object.
"""

from __future__ import annotations

import ast
import copy
import keyword
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from fuzz.repro.delta import (
    Frozen,
    _Function,
    _objects,
    _Replace,
    _stores,
    _Substitute,
    _unparse,
    _untouched,
    aliases_replaced,
    bind,
    chain_root,
    propagate_aliases,
)
from fuzz.repro.fold import clean, is_dataclass

_ROUNDS = 8


@dataclass
class _Class:
    fields: list[str] = field(default_factory=list)
    defaults: dict[str, ast.expr] = field(default_factory=dict)
    properties: dict[str, ast.expr] = field(default_factory=dict)
    plain: bool = True  # no methods but properties: its objects may become scalars
    frozen: bool = False  # nothing assigns its fields (``frozen=True``, or so in the script)
    names: set[str] = field(default_factory=set)  # every name its body (and its bases') binds


def _assigned(tree: ast.Module) -> set[str] | None:
    """The attribute names the module assigns or deletes anywhere (``x.f = v``, ``del x.f``,
    ``x.f += v``), or None where it may assign any (``setattr``, ``__setattr__``, ``__dict__``,
    ``vars``)."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute):
            if n.attr in ("__setattr__", "__dict__"):
                return None
            if not isinstance(n.ctx, ast.Load):
                out.add(n.attr)
        elif isinstance(n, ast.Name) and n.id in ("setattr", "vars", "delattr"):
            return None
    return out


def _classes(tree: ast.Module) -> dict[str, _Class]:
    """The module's dataclasses without ``__post_init__`` (nothing runs when one is built). One
    is frozen where its decorator says so, or where nothing in the script assigns an attribute
    of any of its fields' names (its objects are then never changed: a reduction that cut
    ``frozen=True`` from the decorator leaves what it meant)."""
    out: dict[str, _Class] = {}
    assigned = _assigned(tree)
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or not is_dataclass(node):
            continue
        info = _Class()
        bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
        inherited = [out[b] for b in bases if b in out]
        for base in inherited:
            info.fields += base.fields
            info.defaults.update(base.defaults)
            info.names |= base.names
        info.names |= {n.id for stmt in node.body for n in ast.walk(stmt) if isinstance(n, ast.Name)}
        info.names |= {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        plain = all(b in out or b == "object" for b in bases) and len(bases) == len(node.bases)
        post_init = False
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if "ClassVar" in ast.unparse(stmt.annotation):
                    continue
                name = stmt.target.id
                if name not in info.fields:
                    info.fields.append(name)
                default = _default(stmt.value)
                if default is not None:
                    info.defaults[name] = default
                elif stmt.value is not None:
                    info.defaults.pop(name, None)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                returned = _property(stmt)
                if returned is not None:
                    info.properties[stmt.name] = returned
                else:
                    plain = False
                    post_init |= stmt.name == "__post_init__"
            elif not (
                isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))
            ):
                plain = False
        if post_init:
            continue
        info.plain = plain
        info.frozen = any("frozen=True" in ast.unparse(d) for d in node.decorator_list) or (
            assigned is not None and not assigned & set(info.fields)
        )
        out[node.name] = info
    return out


def _default(value: ast.expr | None) -> ast.expr | None:
    """The expression a field's default builds (``field(default_factory=F)``: ``F()``)."""
    if value is None:
        return None
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "field":
        for kw in value.keywords:
            if kw.arg == "default":
                return kw.value if _pure(kw.value) else None
            if kw.arg == "default_factory" and isinstance(kw.value, ast.Name):
                return ast.Call(ast.Name(kw.value.id, ast.Load()), [], [])
        return None
    return value if _pure(value) else None


def _property(fn: ast.stmt) -> ast.expr | None:
    """What a ``@property`` that is one ``return`` of an expression returns."""
    if not isinstance(fn, ast.FunctionDef) or [ast.unparse(d) for d in fn.decorator_list] != ["property"]:
        return None
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return None
    args = fn.args
    if len(args.args) != 1 or args.args[0].arg != "self" or args.vararg or args.kwarg or args.kwonlyargs:
        return None
    return body[0].value


def _pure(node: ast.expr | None) -> bool:
    """Constants, names and attributes of names, and displays of them."""
    if node is None:
        return False
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.Name, ast.Attribute)):
        return chain_root(node) is not None
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_pure(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _pure(k) for k in node.keys) and all(_pure(v) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        return _pure(node.operand)
    return False


def _functions(tree: ast.Module, frozen: Frozen) -> list[_Function]:
    out: list[_Function] = []
    for top in tree.body:
        if _untouched(top, frozen):
            continue
        out += [n for n in ast.walk(top) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return out


def _statement_lists(node: ast.AST) -> Iterator[tuple[ast.AST, str, list[ast.stmt]]]:
    """Every ``(holder, field, statements)`` under ``node``: bodies, ``else`` and ``finally``
    blocks, the bodies of ``except`` clauses."""
    for holder in ast.walk(node):
        for name in ("body", "orelse", "finalbody"):
            stmts = getattr(holder, name, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                yield holder, name, stmts


def _set_list(holder: ast.AST, name: str, stmts: list[ast.stmt]) -> None:
    setattr(holder, name, stmts or ([ast.Pass()] if name == "body" else []))


def _nested(fn: _Function) -> bool:
    return any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Global, ast.Nonlocal))
        and n is not fn
        for n in ast.walk(fn)
    )


def _stable(node: ast.expr, stores: dict[str, int]) -> bool:
    """A pure expression whose names are bound at most once in the function (so it means the
    same wherever the function reads it after the binding)."""
    return _pure(node) and all(stores.get(n.id, 0) <= 1 for n in ast.walk(node) if isinstance(n, ast.Name))


# -- objects: fields and properties ---------------------------------------------------------------


def _getattr_of(node: ast.AST) -> tuple[str, str, ast.expr] | None:
    """(object, attribute, default) of ``getattr(NAME, 'attr', default)``."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) == 3
        and not node.keywords
    ):
        return None
    obj, attr, default = node.args
    if isinstance(obj, ast.Name) and isinstance(attr, ast.Constant) and isinstance(attr.value, str):
        return obj.id, attr.value, default
    return None


def _escaped(fn: _Function) -> set[str]:
    """The names ``fn`` reads other than as the object of an attribute (``f(side)``,
    ``getattr(side, 'x', d)`` with a constant name counting as an attribute)."""
    inside: set[int] = {
        id(n.value) for n in ast.walk(fn) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
    }
    inside |= {id(n.args[0]) for n in ast.walk(fn) if isinstance(n, ast.Call) and _getattr_of(n) is not None}
    return {
        n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in inside
    }


def _given(call: ast.Call, info: _Class, attr: str) -> ast.expr | None:
    """What ``call`` builds field ``attr`` with, or its default (None if neither is known)."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    for kw in call.keywords:
        if kw.arg == attr:
            return kw.value
    if attr in info.fields and info.fields.index(attr) < len(call.args):
        return call.args[info.fields.index(attr)]
    if attr in info.fields:
        return info.defaults.get(attr)
    return None


class _Fields(ast.NodeTransformer):
    def __init__(
        self, fn: _Function, classes: dict[str, _Class], given: dict[str, ast.Call], top: frozenset[str]
    ) -> None:
        self.classes = classes
        self.stores = _stores(fn)
        self.objects = {**given, **_objects(fn, set(classes))}
        self.closed = _Closed(classes, {n for n, k in self.stores.items() if k and n in top}, top)
        self.assigned = {
            (n.value.id, n.attr)
            for n in ast.walk(fn)
            if isinstance(n, ast.Attribute) and not isinstance(n.ctx, ast.Load) and isinstance(n.value, ast.Name)
        }
        self.escaped = _escaped(fn)
        self.changed = False

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load):
            return node
        if self.closed.build(node.value):  # ``Training(lr=0.1).lr``: what the build gives
            assert isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
            built = _given(node.value, self.classes[node.value.func.id], node.attr)
            if built is not None and self.closed(built):
                self.changed = True
                return ast.copy_location(copy.deepcopy(built), node)
            return node
        if not isinstance(node.value, ast.Name):
            return node
        base = node.value.id
        call = self.objects.get(base)
        if call is None or (base, node.attr) in self.assigned:
            return node
        assert isinstance(call.func, ast.Name)
        info = self.classes[call.func.id]
        if node.attr in info.properties:
            prop = copy.deepcopy(info.properties[node.attr])
            for n in ast.walk(prop):
                if isinstance(n, ast.Name) and n.id == "self":
                    n.id = base
            self.changed = True
            return ast.copy_location(prop, node)
        value = _given(call, info, node.attr)
        if value is None or (base in self.escaped and not info.frozen):
            return node  # what the object was handed to may have changed the field
        empty_build = (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id in self.classes
            and not value.args
            and not value.keywords
        )
        if not (_stable(value, self.stores) or empty_build or self.closed(value)):
            return node
        self.changed = True
        return ast.copy_location(copy.deepcopy(value), node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        """``getattr(obj, 'name', default)`` with a constant name: ``obj.name`` where the class
        has that field, ``default`` where nothing binds the name for it (no field, method or
        class attribute, and nothing assigns it on ``obj``, which is handed to nothing)."""
        self.generic_visit(node)
        found = _getattr_of(node)
        call = self.objects.get(found[0]) if found is not None else None
        if found is None or call is None or found[1].startswith("__"):
            return node
        base, attr, default = found
        assert isinstance(call.func, ast.Name)
        info = self.classes[call.func.id]
        if attr in info.fields or attr in info.properties:
            self.changed = True
            return ast.copy_location(ast.Attribute(ast.Name(base, ast.Load()), attr, ast.Load()), node)
        if attr in info.names or (base, attr) in self.assigned or base in self.escaped:
            return node
        self.changed = True
        return default

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        """``obj is None`` / ``obj is not None``: an object built in place is never None."""
        self.generic_visit(node)
        if (
            len(node.ops) == 1
            and isinstance(node.ops[0], (ast.Is, ast.IsNot))
            and isinstance(node.left, ast.Name)
            and node.left.id in self.objects
            and isinstance(node.comparators[0], ast.Constant)
            and node.comparators[0].value is None
        ):
            self.changed = True
            return ast.copy_location(ast.Constant(isinstance(node.ops[0], ast.IsNot)), node)
        return node


def _object_fields(tree: ast.Module, frozen: Frozen) -> bool:
    classes = _classes(tree)
    top = _class_names(tree)
    given = _parameter_objects(tree, classes, top)
    changed = False
    for fn in _functions(tree, frozen):
        visitor = _Fields(fn, classes, given.get(id(fn), {}), top)
        if not visitor.objects:
            continue
        for stmt in fn.body:
            visitor.visit(stmt)
        changed |= visitor.changed
    return changed


# -- parameters: an object every call passes alike ------------------------------------------------


@dataclass
class _Closed:
    """Whether an expression means the same in every function of the module: constants, the
    members of its classes (``LeafKind.LINEAR``), tuples of such, and builds of its frozen
    dataclasses from such (nothing runs but the build, and nothing changes the object).
    ``shadowed``: names a function binds, which then mean something else there."""

    classes: dict[str, _Class]
    shadowed: set[str]
    top: frozenset[str]  # the module's classes (an enum's members are attributes of one)

    def __call__(self, node: ast.expr | None) -> bool:
        if node is None:
            return False
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.UnaryOp):
            return self(node.operand)
        if isinstance(node, ast.Tuple):  # not a list: one copy could be changed, not the other
            return all(self(e) for e in node.elts)
        if isinstance(node, ast.Attribute):  # an enum member
            return isinstance(node.value, ast.Name) and self._class_name(node.value.id)
        return self.build(node)

    def build(self, node: ast.expr) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in self.classes
            and self.classes[node.func.id].frozen
            and node.func.id not in self.shadowed
            and all(self(a) for a in node.args)
            and all(k.arg is not None and self(k.value) for k in node.keywords)
        )

    def _class_name(self, name: str) -> bool:
        return name not in self.shadowed and name in self.top


def _class_names(tree: ast.Module) -> frozenset[str]:
    return frozenset(n.name for n in tree.body if isinstance(n, ast.ClassDef))


def _parameter_objects(
    tree: ast.Module, classes: dict[str, _Class], top: frozenset[str]
) -> dict[int, dict[str, ast.Call]]:
    """For each top-level function (by ``id``), the parameters that every call of it binds to
    one and the same closed build of a frozen dataclass (:class:`_Closed`): given so, by the
    caller's own local bound once to it, or by a parameter of the caller found so (repeated
    until nothing more is found). A function named anywhere but as what a call calls, or a
    parameter it binds again, is left out. ``_Fields`` then reads such a parameter's fields as
    it does a local object's, across the call."""
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    if len(functions) != len([n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]):
        return {}  # a name defined twice: which one a call reaches is not plain
    called: dict[str, list[tuple[ast.Call, ast.FunctionDef | None]]] = {name: [] for name in functions}
    named_otherwise: set[str] = set()

    def visit(node: ast.AST, caller: ast.FunctionDef | None, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id in called:
                called[child.func.id].append((child, caller if not inside else None))
                for part in [*child.args, *child.keywords]:
                    visit(part, caller, inside)
                continue
            if isinstance(child, ast.Name) and child.id in called:
                named_otherwise.add(child.id)
            nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef))
            if caller is None and isinstance(child, ast.FunctionDef) and child.name in functions and node is tree:
                visit(child, child, False)
            else:
                visit(child, caller, inside or nested)

    visit(tree, None, False)
    found: dict[str, dict[str, ast.Call]] = {name: {} for name in functions}
    # what the rounds below read and never change: each function's bindings and local objects
    stores = {name: _stores(fn) for name, fn in functions.items()}
    local_objects = {name: _objects(fn, set(classes)) for name, fn in functions.items()}
    for _ in range(len(functions) + 1):
        grew = False
        for name, fn in functions.items():
            if name in named_otherwise or not called[name]:
                continue
            params = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
            closed = _Closed(classes, set(stores[name]) - params, top)
            for param, value in _alike_arguments(fn, called[name], classes, found, local_objects, top).items():
                if param in found[name] or stores[name].get(param) != 1 or not closed.build(value):
                    continue
                found[name][param] = value  # type: ignore[assignment]
                grew = True
        if not grew:
            break
    return {id(functions[name]): params for name, params in found.items() if params}


def _alike_arguments(
    fn: ast.FunctionDef,
    calls: list[tuple[ast.Call, ast.FunctionDef | None]],
    classes: dict[str, _Class],
    found: dict[str, dict[str, ast.Call]],
    local_objects: dict[str, dict[str, ast.Call]],
    top: frozenset[str],
) -> dict[str, ast.expr]:
    """The parameters of ``fn`` that each of ``calls`` binds to the same closed build, seen
    through the caller's locals (``local_objects``) and found parameters."""
    closed = _Closed(classes, set(), top)
    out: dict[str, ast.expr] | None = None
    for call, caller in calls:
        bound = bind(fn, call)
        if bound is None:
            return {}
        resolved: dict[str, ast.expr] = {}
        caller_objects = local_objects.get(caller.name, {}) if caller is not None else {}
        caller_params = found.get(caller.name, {}) if caller is not None else {}
        for param, value in bound.items():
            if isinstance(value, ast.Name) and caller is not None:
                value = caller_objects.get(value.id) or caller_params.get(value.id) or value
            if closed.build(value):
                resolved[param] = value
        if out is None:
            out = resolved
        else:
            out = {p: v for p, v in out.items() if p in resolved and _built_alike(resolved[p], v, classes)}
    return out or {}


def _built_alike(a: ast.expr | None, b: ast.expr | None, classes: dict[str, _Class]) -> bool:
    """Whether two closed expressions build the same value: builds of one class compared field
    by field (given by keyword, by position or by default)."""
    if a is None or b is None:
        return a is b
    if isinstance(a, ast.Call) and isinstance(b, ast.Call):
        if not (isinstance(a.func, ast.Name) and isinstance(b.func, ast.Name) and a.func.id == b.func.id):
            return False
        info = classes.get(a.func.id)
        return info is not None and all(
            _built_alike(_given(a, info, f), _given(b, info, f), classes) for f in info.fields
        )
    if isinstance(a, ast.Tuple) and isinstance(b, ast.Tuple):
        return len(a.elts) == len(b.elts) and all(_built_alike(x, y, classes) for x, y in zip(a.elts, b.elts))
    return ast.dump(a) == ast.dump(b)


# -- scalars: an object only used by its attributes -----------------------------------------------


def _scalars(tree: ast.Module, frozen: Frozen) -> bool:
    classes = _classes(tree)
    changed = False
    for fn in _functions(tree, frozen):
        if _nested(fn):
            continue
        stores = _stores(fn)
        for base, call in _objects(fn, set(classes)).items():
            assert isinstance(call.func, ast.Name)
            info = classes[call.func.id]
            if (
                not info.plain
                or any(isinstance(a, ast.Starred) for a in call.args)
                or any(k.arg is None for k in call.keywords)
            ):
                continue
            if _scalarized(fn, base, call, info, stores):
                changed = True
                stores = _stores(fn)
    return changed


def _scalarized(fn: _Function, base: str, call: ast.Call, info: _Class, stores: dict[str, int]) -> bool:
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(fn):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    uses = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == base]
    binding = None
    attrs: list[str] = []
    for use in uses:
        parent = parents.get(id(use))
        if isinstance(use.ctx, ast.Store):
            if not (isinstance(parent, ast.Assign) and parent.value is call and parent.targets == [use]):
                return False
            binding = parent
        elif isinstance(parent, ast.Attribute) and parent.value is use:
            if parent.attr in info.properties:
                return False
            attrs.append(parent.attr)
        else:
            return False
    if binding is None or len(call.args) > len(info.fields):
        return False
    given: dict[str, ast.expr] = dict(zip(info.fields, call.args))
    given.update({k.arg: k.value for k in call.keywords if k.arg})
    if any(k not in info.fields for k in given):
        return False
    read = {
        p.attr for use in uses if isinstance(p := parents.get(id(use)), ast.Attribute) and isinstance(p.ctx, ast.Load)
    }
    for attr in read:
        if attr not in given and attr not in info.defaults and attr in info.fields:
            return False  # read before any value is known
    taken = set(stores)
    names: dict[str, str] = {}
    for attr in dict.fromkeys([*given, *attrs]):
        name = f"{base}_{attr}"
        while name in taken:
            name += "_"
        taken.add(name)
        names[attr] = name
    assigns: list[ast.stmt] = [ast.Assign([ast.Name(names[attr], ast.Store())], value) for attr, value in given.items()]
    assigns += [
        ast.Assign([ast.Name(names[attr], ast.Store())], copy.deepcopy(info.defaults[attr]))
        for attr in dict.fromkeys(attrs)
        if attr not in given and attr in info.defaults and attr in read
    ]

    class Replace(ast.NodeTransformer):
        def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
            self.generic_visit(node)
            if isinstance(node.value, ast.Name) and node.value.id == base:
                return ast.copy_location(ast.Name(names[node.attr], node.ctx), node)
            return node

    for _, _, stmts in list(_statement_lists(fn)):
        if binding in stmts:
            i = stmts.index(binding)
            stmts[i : i + 1] = assigns or [ast.Pass()]
    Replace().visit(fn)
    return True


# -- tables --------------------------------------------------------------------------------------


def _tables(tree: ast.Module, frozen: Frozen) -> bool:
    tables: dict[str, ast.Dict] = {}
    bound: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound[node.id] = bound.get(node.id, 0) + 1
    # values: pure, or builds of frozen dataclasses from constants (``Tolerance(rtol=1e-05, ...)``)
    closed = _Closed(_classes(tree), {n for n, k in bound.items() if k}, _class_names(tree))
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Dict)
            and all(k is not None and _pure(k) for k in node.value.keys)
            and all(_pure(v) or closed(v) for v in node.value.values)
            and bound.get(node.targets[0].id) == 1
        ):
            tables[node.targets[0].id] = node.value
    for node in ast.walk(tree):  # a table that something changes or hands on is not folded
        if isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Name):
            tables.pop(node.value.id, None)
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.attr
            in (
                "update",
                "pop",
                "setdefault",
                "clear",
                "popitem",
            )
        ):
            tables.pop(node.value.id, None)
    if not tables:
        return False
    changed = False
    for fn in _functions(tree, frozen):
        visitor = _Lookup(tables, _stores(fn))
        for stmt in fn.body:
            visitor.visit(stmt)
        changed |= visitor.changed
    return changed


class _Lookup(ast.NodeTransformer):
    def __init__(self, tables: dict[str, ast.Dict], stores: dict[str, int]) -> None:
        self.tables, self.stores, self.changed = tables, stores, False

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        self.generic_visit(node)
        if not (isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Name)):
            return node
        table = self.tables.get(node.value.id)
        if table is None or self.stores.get(node.value.id):
            return node  # a local of the same name
        value = _entry(table, node.slice)
        if value is None:
            return node
        self.changed = True
        return ast.copy_location(value, node)


def _entry(display: ast.Dict, key: ast.expr) -> ast.expr | None:
    """A copy of the value ``display`` holds under a key written as ``key``, else None."""
    written = ast.dump(key)
    for k, v in zip(display.keys, display.values):
        if k is not None and ast.dump(k) == written:
            return copy.deepcopy(v)
    return None


# -- enums ---------------------------------------------------------------------------------------


def _enums(tree: ast.Module) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any("Enum" in ast.unparse(b) for b in node.bases):
            out[node.name] = {
                t.id
                for s in node.body
                if isinstance(s, ast.Assign)
                for t in s.targets
                if isinstance(t, ast.Name) and not t.id.startswith("_")
            }
    return out


def _member(node: ast.expr, enums: dict[str, set[str]], stores: dict[str, int]) -> tuple[str, str] | None:
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in enums
        and node.attr in enums[node.value.id]
        and not stores.get(node.value.id)
    ):
        return node.value.id, node.attr
    return None


def _enum_values(tree: ast.Module, enums: dict[str, set[str]]) -> dict[tuple[str, str], ast.Constant]:
    """The members of the module's enums (``enums``: :func:`_enums`) that are assigned a
    constant, with it."""
    return {
        (node.name, t.id): s.value
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name in enums
        for s in node.body
        if isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant)
        for t in s.targets
        if isinstance(t, ast.Name) and t.id in enums[node.name]
    }


def _enum_tests(tree: ast.Module, frozen: Frozen) -> bool:
    enums = _enums(tree)
    if not enums:
        return False
    values = _enum_values(tree, enums)
    changed = False
    for fn in _functions(tree, frozen):
        stores = _stores(fn)
        aliases: dict[str, ast.expr] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                if stores.get(name) == 1 and _member(node.value, enums, stores):
                    aliases[name] = node.value
        visitor = _EnumTests(enums, stores, aliases, values)
        for stmt in fn.body:
            visitor.visit(stmt)
        changed |= visitor.changed
        if aliases:
            _drop_bindings(fn, set(aliases))
    return changed


def _constant_aliases(tree: ast.Module, frozen: Frozen) -> bool:
    """A local bound once to a constant or a tuple of them (``key = ()``) and never rebound
    becomes that constant where it is read: a key the bags rewrite can then read as one."""
    changed = False
    for fn in _functions(tree, frozen):
        if _nested(fn):
            continue
        stores = _stores(fn)
        aliases = {
            node.targets[0].id: node.value
            for node in ast.walk(fn)
            if isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and stores.get(node.targets[0].id) == 1
            and _constant(node.value)[0]
        }
        if not aliases:
            continue
        for stmt in fn.body:
            _Substitute(aliases).visit(stmt)
        _drop_bindings(fn, set(aliases))
        changed = True
    return changed


class _EnumTests(ast.NodeTransformer):
    def __init__(
        self,
        enums: dict[str, set[str]],
        stores: dict[str, int],
        aliases: dict[str, ast.expr],
        values: dict[tuple[str, str], ast.Constant],
    ) -> None:
        self.enums, self.stores, self.aliases, self.values, self.changed = enums, stores, aliases, values, False

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        member = _member(node.value, self.enums, self.stores) if node.attr == "value" else None
        if member is None or member not in self.values or not isinstance(node.ctx, ast.Load):
            return node
        self.changed = True  # Item.MODEL.value: the member's constant
        return ast.copy_location(copy.deepcopy(self.values[member]), node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and node.id in self.aliases:
            self.changed = True
            return ast.copy_location(copy.deepcopy(self.aliases[node.id]), node)
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if len(node.ops) != 1:
            return node
        left, op, right = node.left, node.ops[0], node.comparators[0]
        a = _member(left, self.enums, self.stores)
        if a is None:
            return node
        if isinstance(op, (ast.Is, ast.IsNot)) and isinstance(right, ast.Constant) and right.value is None:
            value = isinstance(op, ast.IsNot)  # a member is never None
        elif isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)):
            b = _member(right, self.enums, self.stores)
            if b is None or b[0] != a[0]:
                return node
            value = (a == b) == isinstance(op, (ast.Is, ast.Eq))
        elif isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
            members = [_member(e, self.enums, self.stores) for e in right.elts]
            if any(m is None or m[0] != a[0] for m in members):
                return node
            value = (a in members) == isinstance(op, ast.In)
        else:
            return node
        self.changed = True
        return ast.copy_location(ast.Constant(value), node)


def _drop_bindings(fn: _Function, names: set[str]) -> None:
    for holder, name, stmts in list(_statement_lists(fn)):
        kept = [
            s
            for s in stmts
            if not (
                isinstance(s, ast.Assign)
                and len(s.targets) == 1
                and isinstance(s.targets[0], ast.Name)
                and s.targets[0].id in names
            )
        ]
        if len(kept) != len(stmts):
            _set_list(holder, name, kept)


#: Comparisons :func:`_truth` evaluates between constants (those of a loop written out over a
#: literal, ``if api == 'checkpoint'``).
_COMPARE = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


def _constant(node: ast.expr) -> tuple[bool, object]:
    """(True, value) for a constant or a tuple of constants, else (False, None)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return True, node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        known, value = _constant(node.operand)
        if known and type(value) in (int, float):
            return True, -value  # type: ignore[operator]
        return False, None
    if isinstance(node, ast.Tuple):
        items = [_constant(e) for e in node.elts]
        if all(ok for ok, _ in items):
            return True, tuple(v for _, v in items)
    return False, None


def _truth(test: ast.expr) -> bool | None:
    """The truth of a constant, of a display of pure elements (``()`` is false), of ``not`` one,
    or of a comparison (``==``, ``!=``, ``in``, ``not in``) between constants, else None."""
    if isinstance(test, ast.Constant):
        return bool(test.value)
    if isinstance(test, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and _pure(test):
        return bool(test.keys if isinstance(test, ast.Dict) else test.elts)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _truth(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _COMPARE:
        (known_left, left), (known_right, right) = _constant(test.left), _constant(test.comparators[0])
        membership = isinstance(test.ops[0], (ast.In, ast.NotIn))
        if known_left and known_right and (not membership or isinstance(right, (str, tuple))):
            try:
                return bool(_COMPARE[type(test.ops[0])](left, right))
            except TypeError:
                return None
    return None


def _pure_test(test: ast.expr) -> bool:
    """A test that only reads: pure operands (:func:`_pure`) compared, negated or joined."""
    if isinstance(test, ast.Compare):
        return _pure(test.left) and all(_pure(c) for c in test.comparators)
    if isinstance(test, ast.BoolOp):
        return all(_pure_test(v) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _pure_test(test.operand)
    return _pure(test)


def _bound_name(target: ast.expr) -> str | None:
    """What an assignment to ``target`` changes: ``a`` of ``a`` or of ``a['k']``."""
    if isinstance(target, ast.Name):
        return target.id
    if (
        isinstance(target, ast.Subscript)
        and isinstance(target.value, ast.Name)
        and isinstance(target.slice, ast.Constant)
    ):
        return target.value.id
    return None


class _Constants(ast.NodeTransformer):
    """An ``if`` on a constant becomes the branch it takes (so does a conditional expression
    whose branches are the same); ``a, b = (x, y)`` becomes ``a = x`` and ``b = y`` where no
    value reads what the targets change (``a``, ``b``, or ``d`` of ``d['k']``)."""

    def __init__(self) -> None:
        self.changed = False

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        self.generic_visit(node)
        truth = _truth(node.test)
        if truth is None and _pure_test(node.test) and ast.dump(node.body) == ast.dump(node.orelse):
            truth = True  # ``a if t else a``: ``a``, where ``t`` computes nothing
        if truth is not None:
            self.changed = True
            return node.body if truth else node.orelse
        return node

    @staticmethod
    def _split(stmt: ast.stmt) -> list[ast.stmt] | None:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            return None
        target, value = stmt.targets[0], stmt.value
        if not (isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)) or len(target.elts) != len(value.elts):
            return None
        names = [_bound_name(t) for t in target.elts]
        read = {n.id for v in value.elts for n in ast.walk(v) if isinstance(n, ast.Name)}
        written = [ast.dump(t) for t in target.elts]  # ``a`` or ``d['k']``: each once
        if None in names or len(set(written)) != len(written) or read & set(names):
            return None
        if any(isinstance(v, ast.Starred) for v in value.elts):
            return None
        return [ast.Assign([t], v) for t, v in zip(target.elts, value.elts)]

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        for name in ("body", "orelse", "finalbody"):
            stmts = getattr(node, name, None)
            if not (isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt)):
                continue
            out: list[ast.stmt] = []
            for s in stmts:
                truth = _truth(s.test) if isinstance(s, ast.If) else None
                split = self._split(s)
                if isinstance(s, ast.If) and truth is not None:
                    self.changed = True
                    out += s.body if truth else s.orelse
                elif split is not None:
                    self.changed = True
                    out += split
                else:
                    out.append(s)
            if out != stmts:
                setattr(node, name, out or ([ast.Pass()] if name == "body" else []))
        return node


def _constant_tests(tree: ast.Module, frozen: Frozen) -> bool:
    changed = False
    for top in tree.body:
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _untouched(top, frozen):
            visitor = _Constants()
            visitor.visit(top)
            changed |= visitor.changed
    return changed


# -- firsts and empties --------------------------------------------------------------------------


def _sole_argument(node: ast.expr | None, function: str) -> ast.expr | None:
    """The one positional argument of a call of the builtin ``function``, else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == function
        and len(node.args) == 1
        and not node.keywords
    ):
        return node.args[0]
    return None


def _first_item(node: ast.expr | None) -> ast.expr | None:
    """The first item of a list or tuple display whose other items are pure (the first is
    evaluated either way), else None."""
    if not isinstance(node, (ast.Tuple, ast.List)) or not node.elts or isinstance(node.elts[0], ast.Starred):
        return None
    return node.elts[0] if all(_pure(e) for e in node.elts[1:]) else None


class _Firsts(ast.NodeTransformer):
    def __init__(self) -> None:
        self.changed = False

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        inner = _sole_argument(node, "next")
        iterated = _sole_argument(inner, "iter")
        first = _first_item(iterated)
        if first is not None:  # next(iter([a, ...])) is a
            self.changed = True
            return first
        first = _first_item(_sole_argument(iterated, "enumerate"))
        if first is not None:  # next(iter(enumerate([a, ...]))) is (0, a)
            self.changed = True
            return ast.copy_location(ast.Tuple([ast.Constant(0), first], ast.Load()), node)
        kept = [k for k in node.keywords if not (k.arg is None and isinstance(k.value, ast.Dict) and not k.value.keys)]
        if len(kept) != len(node.keywords):
            node.keywords = kept
            self.changed = True
        return node

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        """A display of pure items indexed in place: ``{K.A: x, K.B: y}[K.A]`` is ``x``,
        ``[a, b][0]`` is ``a``, ``[a, b, c][:2]`` is ``[a, b]``."""
        self.generic_visit(node)
        display, index = node.value, node.slice
        if not isinstance(node.ctx, ast.Load) or not _pure(display):
            return node
        if isinstance(display, ast.Dict):
            value = _entry(display, index)
            if value is None:
                return node
            self.changed = True
            return ast.copy_location(value, node)
        if not isinstance(display, (ast.List, ast.Tuple)) or any(isinstance(e, ast.Starred) for e in display.elts):
            return node
        if isinstance(index, ast.Slice):
            bounds = [_constant(b) if b is not None else (True, None) for b in (index.lower, index.upper, index.step)]
            values = [v for _, v in bounds]
            if not all(ok and (v is None or type(v) is int) for ok, v in bounds) or values[2] == 0:
                return node
            self.changed = True
            elts = display.elts[slice(*values)]  # type: ignore[arg-type]
            return ast.copy_location(type(display)(elts=elts, ctx=ast.Load()), node)
        known, at = _constant(index)
        if known and type(at) is int and -len(display.elts) <= at < len(display.elts):
            self.changed = True
            return display.elts[at]
        return node

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp) -> ast.AST:
        self.generic_visit(node)
        first = node.generators[0].iter
        one = _one_item(node)
        if one is not None:
            self.changed = True
            return ast.copy_location(one, node)
        if not (isinstance(first, (ast.Tuple, ast.List)) and not first.elts):
            return node
        self.changed = True
        if isinstance(node, ast.DictComp):
            return ast.copy_location(ast.Dict([], []), node)
        if isinstance(node, ast.ListComp):
            return ast.copy_location(ast.List([], ast.Load()), node)
        if isinstance(node, ast.GeneratorExp):
            return ast.copy_location(ast.Tuple([], ast.Load()), node)
        return ast.copy_location(ast.Call(ast.Name("set", ast.Load()), [], []), node)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension


def _one_item(node: ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp) -> ast.expr | None:
    """A list, set or dict comprehension over a display of one element, without a condition,
    as the display of its one item (``[f(p) for p in ('',)]``: ``[f('')]``), where the
    element is pure or named once."""
    if isinstance(node, ast.GeneratorExp) or len(node.generators) != 1:
        return None
    gen = node.generators[0]
    items = gen.iter.elts if isinstance(gen.iter, (ast.Tuple, ast.List)) else []
    if gen.ifs or gen.is_async or not isinstance(gen.target, ast.Name) or len(items) != 1:
        return None
    item, name = items[0], gen.target.id
    if isinstance(item, ast.Starred):
        return None
    parts: list[ast.expr] = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
    uses = sum(1 for part in parts for n in ast.walk(part) if isinstance(n, ast.Name) and n.id == name)
    inner = any(
        isinstance(n, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp))
        for p in parts
        for n in ast.walk(p)
    )
    if inner or (uses > 1 and not _pure(item)):
        return None

    class Bind(ast.NodeTransformer):
        def visit_Name(self, n: ast.Name) -> ast.AST:
            return ast.copy_location(copy.deepcopy(item), n) if n.id == name else n

    bound = [Bind().visit(copy.deepcopy(part)) for part in parts]
    if isinstance(node, ast.DictComp):
        return ast.Dict([bound[0]], [bound[1]])
    if isinstance(node, ast.ListComp):
        return ast.List(bound, ast.Load())
    return ast.Set(bound)


def _empties(tree: ast.Module, frozen: Frozen) -> bool:
    changed = False
    for fn in _functions(tree, frozen):
        visitor = _Firsts()
        for stmt in fn.body:
            visitor.visit(stmt)
        changed |= visitor.changed
        stores = _stores(fn)
        empty = {
            n.targets[0].id
            for n in ast.walk(fn)
            if isinstance(n, ast.Assign)
            and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name)
            and isinstance(n.value, ast.Dict)
            and not n.value.keys
            and stores.get(n.targets[0].id) == 1
        }
        unpacked = {
            id(k.value)
            for n in ast.walk(fn)
            if isinstance(n, ast.Call)
            for k in n.keywords
            if k.arg is None and isinstance(k.value, ast.Name)
        }
        unpacked |= {
            id(v)
            for n in ast.walk(fn)
            if isinstance(n, ast.Dict)
            for k, v in zip(n.keys, n.values)
            if k is None and isinstance(v, ast.Name)
        }
        for n in ast.walk(fn):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in empty and id(n) not in unpacked:
                empty.discard(n.id)
        if not empty:
            continue
        for n in ast.walk(fn):
            if isinstance(n, ast.Call):
                kept = [
                    k
                    for k in n.keywords
                    if not (k.arg is None and isinstance(k.value, ast.Name) and k.value.id in empty)
                ]
                if len(kept) != len(n.keywords):
                    n.keywords = kept
                    changed = True
            elif isinstance(n, ast.Dict):
                items = [
                    (k, v)
                    for k, v in zip(n.keys, n.values)
                    if not (k is None and isinstance(v, ast.Name) and v.id in empty)
                ]
                if len(items) != len(n.keys):
                    n.keys, n.values = [k for k, _ in items], [v for _, v in items]
                    changed = True
        _drop_bindings(fn, empty)
    return changed


# -- bags and imports ----------------------------------------------------------------------------


def _key_name(key: ast.expr) -> str | None:
    """A local's name for a constant key (``'model'``, ``Item.MODEL``, ``()``, ``0``), None for
    another key."""
    if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.isidentifier():
        return key.value
    if isinstance(key, ast.Attribute) and isinstance(key.value, ast.Name):
        return key.attr.lower()
    if isinstance(key, ast.Tuple) and not key.elts:
        return "empty"
    if isinstance(key, ast.Constant) and type(key.value) is int and key.value >= 0:
        return f"at{key.value}"
    return None


def _bags(tree: ast.Module, frozen: Frozen) -> bool:
    """A local bound once to ``{}`` and only ever subscripted by constant keys becomes one local
    per key (``out['model'] = x`` ... ``out['model']``: ``out_model``)."""
    changed = False
    for fn in _functions(tree, frozen):
        if _nested(fn):
            continue
        stores = _stores(fn)
        parents = {id(c): n for n in ast.walk(fn) for c in ast.iter_child_nodes(n)}
        for node in list(ast.walk(fn)):
            if not (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Dict)
                and not node.value.keys
                and stores.get(node.targets[0].id) == 1
            ):
                continue
            bag = node.targets[0].id
            keys: dict[str, str] = {}
            ok = True
            for use in ast.walk(fn):
                if not (isinstance(use, ast.Name) and use.id == bag and isinstance(use.ctx, ast.Load)):
                    continue
                parent = parents.get(id(use))
                name = _key_name(parent.slice) if isinstance(parent, ast.Subscript) and parent.value is use else None
                if name is None or isinstance(parent.ctx, ast.Del):  # type: ignore[union-attr]
                    ok = False
                    break
                keys.setdefault(ast.dump(parent.slice), name)  # type: ignore[union-attr]
            if not ok:
                continue
            taken = set(stores)
            names: dict[str, str] = {}
            for dumped, name in keys.items():
                local = f"{bag}_{name}"
                while local in taken:
                    local += "_"
                taken.add(local)
                names[dumped] = local
            _BagItems(bag, names).visit(fn)
            _drop_bindings(fn, {bag})
            changed = True
            break  # the parents are stale: the next bag in the next round
    return changed


class _BagItems(ast.NodeTransformer):
    def __init__(self, bag: str, names: dict[str, str]) -> None:
        self.bag, self.names = bag, names

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == self.bag:
            return ast.copy_location(ast.Name(self.names[ast.dump(node.slice)], node.ctx), node)
        return node


def _imports(tree: ast.Module, frozen: Frozen) -> bool:
    """In functions: names a ``from ... import`` binds that the function does not read go, and
    imports from one module next to each other become one."""
    changed = False
    for fn in _functions(tree, frozen):
        read = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        for holder, name, stmts in list(_statement_lists(fn)):
            out: list[ast.stmt] = []
            for stmt in stmts:
                if isinstance(stmt, ast.ImportFrom) and stmt.module != "__future__":
                    names = [a for a in stmt.names if a.name == "*" or (a.asname or a.name) in read]
                    if len(names) != len(stmt.names):
                        changed = True
                        if not names:
                            continue
                        stmt.names = names
                    last = out[-1] if out else None
                    if isinstance(last, ast.ImportFrom) and (last.module, last.level) == (stmt.module, stmt.level):
                        last.names += stmt.names
                        changed = True
                        continue
                out.append(stmt)
            if len(out) != len(stmts):
                _set_list(holder, name, out)
    return changed


def _alias_key(stmt: ast.stmt, alias: ast.alias) -> tuple[str, str] | None:
    """(from where, what) an import's ``alias`` binds, where it binds it by ``as`` or by the
    imported name itself (not ``import a.b``, which binds ``a``), else None."""
    if isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module and stmt.module != "__future__":
        return None if alias.name == "*" else (stmt.module, alias.name)
    if isinstance(stmt, ast.Import) and alias.asname:
        return ("", alias.name)
    return None


def _duplicate_imports(tree: ast.Module, frozen: Frozen) -> bool:
    """In a function, imports in one block of the same thing under several names (``import
    torch.distributed.checkpoint as dcp_`` after ``... as dcp``, as inlining leaves them): the
    first stays, bound to the shortest of the names, and the others go, their names replaced
    by it."""
    changed = False
    for fn in _functions(tree, frozen):
        stores = _stores(fn)
        for holder, field_name, stmts in list(_statement_lists(fn)):
            names: dict[tuple[str, str], list[str]] = {}
            for stmt in stmts:
                for alias in stmt.names if isinstance(stmt, (ast.Import, ast.ImportFrom)) else []:
                    key = _alias_key(stmt, alias)
                    if key is not None:
                        names.setdefault(key, []).append(alias.asname or alias.name)
            rename: dict[str, str] = {}
            kept_name: dict[tuple[str, str], str] = {}
            for key, bound in names.items():
                if len(set(bound)) > 1 and all(stores.get(b) == 1 for b in bound):
                    kept_name[key] = min(bound, key=lambda b: (len(b), b))
                    rename.update({b: kept_name[key] for b in bound if b != kept_name[key]})
            if not rename:
                continue
            kept: list[ast.stmt] = []
            seen: set[tuple[str, str]] = set()
            for stmt in stmts:
                if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    aliases = []
                    for alias in stmt.names:
                        key = _alias_key(stmt, alias)
                        if key is None or key not in kept_name:
                            aliases.append(alias)  # not one of the names merged
                        elif key not in seen:  # the first import of it: bound to the kept name
                            seen.add(key)
                            alias.asname = None if kept_name[key] == alias.name else kept_name[key]
                            aliases.append(alias)
                    stmt.names = aliases
                    if not stmt.names:
                        continue
                kept.append(stmt)
            _set_list(holder, field_name, kept or [ast.Pass()])
            for node in ast.walk(fn):
                if isinstance(node, ast.Name) and node.id in rename:
                    node.id = rename[node.id]
            changed = True
    return changed


def _neutral(node: ast.expr) -> str | None:
    """What neutral element ``node`` is: ``1``, ``0``, or an empty list or tuple display."""
    if isinstance(node, ast.Constant) and type(node.value) is int and node.value in (0, 1):
        return str(node.value)
    if isinstance(node, (ast.List, ast.Tuple)) and not node.elts:
        return type(node).__name__
    return None


#: Calls that build an empty container, and the display that builds it.
_EMPTY = {"dict": "{}", "list": "[]", "tuple": "()"}


class _Identities(ast.NodeTransformer):
    """``x * 1``, ``1 * x``, ``x // 1``, ``x + 0``, ``0 + x``, ``x - 0``, ``[] + x``, ``x + []``
    (and of ``()``) become ``x``; ``*()`` and ``*[]`` go from a display or a call, and
    ``**{'k': v}`` becomes ``k=v`` in a call."""

    def __init__(self) -> None:
        self.changed = False

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        left, right = _neutral(node.left), _neutral(node.right)
        kept: ast.expr | None = None
        if isinstance(node.op, ast.Mult):
            kept = node.left if right == "1" else node.right if left == "1" else None
        elif isinstance(node.op, ast.FloorDiv):
            kept = node.left if right == "1" else None
        elif isinstance(node.op, ast.Sub):
            kept = node.left if right == "0" else None
        elif isinstance(node.op, ast.Add):
            if right in ("0", "List", "Tuple"):
                kept = node.left
            elif left in ("0", "List", "Tuple"):
                kept = node.right
        if kept is None:
            return node
        self.changed = True
        return kept

    def _starred(self, elts: list[ast.expr]) -> list[ast.expr]:
        """``*()`` goes and ``*[a, b]`` becomes ``a, b``."""
        out: list[ast.expr] = []
        for e in elts:
            if isinstance(e, ast.Starred) and isinstance(e.value, (ast.List, ast.Tuple)):
                out += e.value.elts
                self.changed = True
            else:
                out.append(e)
        return out

    def _spread(self, keywords: list[ast.keyword]) -> list[ast.keyword]:
        """``**{'k': v}`` becomes ``k=v`` (string keys that are names, none given twice)."""
        out: list[ast.keyword] = []
        for kw in keywords:
            display = kw.value
            if kw.arg is None and isinstance(display, ast.Dict):
                keys = [k.value if isinstance(k, ast.Constant) else None for k in display.keys]
                given = {k.arg for k in keywords if k.arg} | {
                    k.value
                    for other in keywords
                    if other is not kw and isinstance(other.value, ast.Dict)
                    for k in other.value.keys
                    if isinstance(k, ast.Constant)
                }
                if all(
                    isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k) and k not in given
                    for k in keys
                ) and len(set(keys)) == len(keys):
                    out += [ast.keyword(str(k), v) for k, v in zip(keys, display.values)]
                    self.changed = True
                    continue
            out.append(kw)
        return out

    def visit_Tuple(self, node: ast.Tuple) -> ast.AST:
        self.generic_visit(node)
        node.elts = self._starred(node.elts)
        return node

    def visit_List(self, node: ast.List) -> ast.AST:
        self.generic_visit(node)
        node.elts = self._starred(node.elts)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        node.args = self._starred(node.args)
        node.keywords = self._spread(node.keywords)
        if isinstance(node.func, ast.Name) and node.func.id in _EMPTY and not node.args and not node.keywords:
            self.changed = True
            return ast.parse(_EMPTY[node.func.id], mode="eval").body
        return node


def _identities(tree: ast.Module, frozen: Frozen) -> bool:
    changed = False
    for fn in _functions(tree, frozen):
        rewrite = _Identities()
        for stmt in fn.body:
            rewrite.visit(stmt)
        changed |= rewrite.changed
    return changed


def _method_argument(stmt: ast.stmt, name: str, method: str) -> ast.expr | None:
    """``e`` of the statement ``name.method(e)``, where ``e`` does not name ``name``."""
    if not (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and stmt.value.func.attr == method
        and isinstance(stmt.value.func.value, ast.Name)
        and stmt.value.func.value.id == name
        and len(stmt.value.args) == 1
        and not stmt.value.keywords
    ):
        return None
    item = stmt.value.args[0]
    return None if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(item)) else item


def _appended(stmt: ast.stmt, name: str) -> ast.expr | None:
    """``e`` of ``name.append(e)``, where ``e`` does not name ``name``."""
    return _method_argument(stmt, name, "append")


def _extended(stmt: ast.stmt, name: str) -> ast.expr | None:
    """``d`` of ``name += d``, where ``d`` is a list display or comprehension not naming ``name``."""
    if not (
        isinstance(stmt, ast.AugAssign)
        and isinstance(stmt.op, ast.Add)
        and isinstance(stmt.target, ast.Name)
        and stmt.target.id == name
        and isinstance(stmt.value, (ast.List, ast.ListComp))
    ):
        return None
    return None if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(stmt.value)) else stmt.value


def _stored_item(stmt: ast.stmt, name: str, top: frozenset[str]) -> tuple[ast.expr, ast.expr] | None:
    """(``k``, ``v``) of ``name[k] = v``, where ``k`` is a constant or an attribute of one of
    the module's classes (an enum member, ``Item.MODEL``) and ``v`` does not name ``name``."""
    if not (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Subscript)
        and isinstance(stmt.targets[0].value, ast.Name)
        and stmt.targets[0].value.id == name
    ):
        return None
    key = stmt.targets[0].slice
    if not (
        isinstance(key, ast.Constant)
        or (isinstance(key, ast.Attribute) and isinstance(key.value, ast.Name) and key.value.id in top)
    ):
        return None
    if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(stmt.value)):
        return None
    return stmt.targets[0].slice, stmt.value


def _updated_items(stmt: ast.stmt, name: str) -> list[tuple[ast.expr, ast.expr]] | None:
    """The (key, value) pairs of ``name.update({'k': v, ...})``, keys constants, values not
    naming ``name``."""
    display = _method_argument(stmt, name, "update")
    if not isinstance(display, ast.Dict) or not all(isinstance(k, ast.Constant) for k in display.keys):
        return None
    return [(k, v) for k, v in zip(display.keys, display.values) if k is not None]


def _mentions(stmt: ast.stmt, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(stmt))


def _absorbed(binding: ast.Assign, stmt: ast.stmt, name: str, top: frozenset[str]) -> bool:
    """Whether ``stmt`` adds to the display ``binding`` binds to ``name`` (``name.append(a)``,
    ``name += [b]``, ``name['k'] = x`` or ``name.update({'k': x})`` for keys it does not hold
    yet): if so, the display now holds what it added."""
    display = binding.value
    if isinstance(display, ast.Dict):
        entries = _updated_items(stmt, name)
        if entries is None:
            entry = _stored_item(stmt, name, top)
            entries = [entry] if entry is not None else None
        keys = [ast.dump(k) for k in display.keys if k is not None]
        added = [ast.dump(k) for k, _ in entries or []]
        if entries is None or set(added) & set(keys) or len(set(added)) != len(added) or None in display.keys:
            return False
        display.keys += [k for k, _ in entries]
        display.values += [v for _, v in entries]
        return True
    assert isinstance(display, ast.List)
    item, more = _appended(stmt, name), _extended(stmt, name)
    if item is not None:
        display.elts.append(item)
    elif isinstance(more, ast.List):
        display.elts += more.elts
    elif isinstance(more, ast.ListComp) and not display.elts:
        binding.value = more
    else:
        return False
    return True


def _appends(tree: ast.Module, frozen: Frozen) -> bool:
    """``v = []`` followed by ``v.append(a)`` and ``v += [b]`` statements becomes ``v = [a, b]``
    (or ``v = [x for ...]`` for a comprehension added to nothing), bound where the last of them
    was: the statements between, which do not name ``v``, run before it as they did. So does
    ``d = {}`` (or a display of constant keys) followed by ``d['k'] = x``, a key it does not
    hold yet: ``d = {'k': x}``."""
    changed = False
    top = _class_names(tree)
    for fn in _functions(tree, frozen):
        classes = top - {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
        for holder, field_name, stmts in list(_statement_lists(fn)):
            out = list(stmts)
            i = 0
            while i < len(out):
                stmt = out[i]
                i += 1
                if not (
                    isinstance(stmt, ast.Assign)
                    and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)
                    and isinstance(stmt.value, (ast.List, ast.Dict))
                ):
                    continue
                name, at = stmt.targets[0].id, i - 1
                j = i
                while j < len(out) and isinstance(stmt.value, (ast.List, ast.Dict)):
                    if not _absorbed(stmt, out[j], name, classes):
                        if _mentions(out[j], name):
                            break
                        j += 1
                        continue
                    del out[j]  # the binding moves down to where this statement was
                    out.insert(j, stmt)
                    del out[at]
                    at = j - 1
                    changed = True
                i = at + 1
            if out != stmts:
                _set_list(holder, field_name, out)
    return changed


def _drop_passes(tree: ast.Module) -> None:
    """``pass`` where its block holds something else."""
    for holder, name, stmts in list(_statement_lists(tree)):
        if len(stmts) > 1 and any(isinstance(s, ast.Pass) for s in stmts):
            _set_list(holder, name, [s for s in stmts if not isinstance(s, ast.Pass)] or stmts[:1])


def _spread_keywords(tree: ast.Module, frozen: Frozen) -> bool:
    """``f(a, **kw)``, where ``kw`` is a local bound once to a dict display of string keys and
    pure values and only ever unpacked so, becomes ``f(a, k=v, ...)``: the call's parameters
    are then plain keywords, which the parameter and inlining cuts can follow."""
    changed = False
    for fn in _functions(tree, frozen):
        if _nested(fn):
            continue
        stores = _stores(fn)
        unpacked = {id(k.value) for n in ast.walk(fn) if isinstance(n, ast.Call) for k in n.keywords if k.arg is None}
        for node in ast.walk(fn):
            if not (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Dict)
                and stores.get(node.targets[0].id) == 1
                and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.value.keys)
            ):
                continue
            name, display = node.targets[0].id, node.value
            uses = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
            if not uses or any(id(u) not in unpacked for u in uses):
                continue
            if not all(_stable(v, stores) for v in display.values) and not _next_use(fn, node, uses):
                continue
            for call in [n for n in ast.walk(fn) if isinstance(n, ast.Call)]:
                spread: list[ast.keyword] = []
                for k in call.keywords:
                    if k.arg is None and isinstance(k.value, ast.Name) and k.value.id == name:
                        spread += [
                            ast.keyword(key.value, copy.deepcopy(v))  # type: ignore[union-attr]
                            for key, v in zip(display.keys, display.values, strict=True)
                        ]
                    else:
                        spread.append(k)
                call.keywords = spread
            _drop_bindings(fn, {name})
            changed = True
            break
    return changed


def _next_use(fn: _Function, binding: ast.stmt, uses: list[ast.Name]) -> bool:
    """Whether the one read in ``uses`` is in the statement after ``binding`` in its block
    (imports between aside): a value computed there is computed in the same order."""
    if len(uses) != 1:
        return False
    for _, _, stmts in _statement_lists(fn):
        if binding in stmts:
            for stmt in stmts[stmts.index(binding) + 1 :]:
                if any(n is uses[0] for n in ast.walk(stmt)):
                    return True
                if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    return False
    return False


def _last_returns(tree: ast.Module, frozen: Frozen) -> bool:
    changed = False
    for fn in _functions(tree, frozen):
        if not fn.body or isinstance(fn, ast.AsyncFunctionDef):
            continue
        last = fn.body[-1]
        returns = [n for n in ast.walk(fn) if isinstance(n, ast.Return)]
        nested = any(
            isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) for n in ast.walk(fn) if n is not fn
        )
        if nested or len(returns) != 1 or not isinstance(last, ast.If) or last.orelse:
            continue
        if len(last.body) != 1 or last.body[0] is not returns[0] or returns[0].value is None:
            continue
        fn.body[-1] = ast.Return(ast.IfExp(last.test, returns[0].value, ast.Constant(None)))
        changed = True
    return changed


def _merge_neighbours(fn: _Function, merge: Callable[[ast.stmt, ast.stmt], ast.stmt | None]) -> bool:
    """In every statement list of ``fn``, a statement and the one before it become what
    ``merge(before, statement)`` returns, where it returns a statement."""
    changed = False
    for holder, field_name, stmts in list(_statement_lists(fn)):
        out: list[ast.stmt] = []
        for stmt in stmts:
            merged = merge(out[-1], stmt) if out else None
            if merged is None:
                out.append(stmt)
            else:
                out[-1] = merged
                changed = True
        if len(out) != len(stmts):
            _set_list(holder, field_name, out)
    return changed


def _returned_at_once(tree: ast.Module, frozen: Frozen) -> bool:
    """``x = e`` followed by ``return x`` becomes ``return e`` (``x`` a plain local: no nested
    scope that could read it, no ``global`` or ``nonlocal``)."""

    def merge(prev: ast.stmt, stmt: ast.stmt) -> ast.stmt | None:
        if (
            isinstance(stmt, ast.Return)
            and isinstance(stmt.value, ast.Name)
            and isinstance(prev, ast.Assign)
            and len(prev.targets) == 1
            and isinstance(prev.targets[0], ast.Name)
            and prev.targets[0].id == stmt.value.id
        ):
            return ast.copy_location(ast.Return(prev.value), prev)
        return None

    changed = False
    for fn in _functions(tree, frozen):
        if not _nested(fn):
            changed |= _merge_neighbours(fn, merge)
    return changed


_RUNS_CODE = (
    ast.Call,
    ast.Yield,
    ast.YieldFrom,
    ast.Await,
    ast.NamedExpr,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)


def _evaluation(node: ast.AST, conditional: bool, out: list[tuple[ast.AST, bool]]) -> None:
    """The nodes of expression ``node`` in ``out`` in the order Python evaluates them, each after
    its operands, with whether it may not run (or may run again) when the expression does: a
    later operand of ``and``/``or`` or of a chained comparison, a branch of a conditional
    expression, the inside of a lambda or of a comprehension (but its first iterable)."""
    if isinstance(node, ast.Lambda):
        for child in ast.iter_child_nodes(node):
            _evaluation(child, True, out)
    elif isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        _evaluation(node.generators[0].iter, conditional, out)
        for child in ast.walk(node):
            if child is not node and child is not node.generators[0].iter:
                out.append((child, True))
    elif isinstance(node, ast.BoolOp):
        for i, value in enumerate(node.values):
            _evaluation(value, conditional or i > 0, out)
    elif isinstance(node, ast.IfExp):
        _evaluation(node.test, conditional, out)
        _evaluation(node.body, True, out)
        _evaluation(node.orelse, True, out)
    elif isinstance(node, ast.Compare):
        _evaluation(node.left, conditional, out)
        for i, value in enumerate(node.comparators):
            _evaluation(value, conditional or i > 0, out)
    elif isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values):
            if key is not None:
                _evaluation(key, conditional, out)
            _evaluation(value, conditional, out)
    else:
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.expr_context):
                _evaluation(child, conditional, out)
    out.append((node, conditional))


def _heads(stmt: ast.stmt) -> list[ast.expr] | None:
    """What ``stmt`` evaluates first, in order, each time it runs: a simple statement's
    expressions (an assignment's value before its targets), a ``with``'s first context, a
    ``for``'s iterable, an ``if``'s test; None for other statements."""
    if isinstance(stmt, (ast.Expr, ast.Return)):
        return [stmt.value] if stmt.value is not None else []
    if isinstance(stmt, ast.Assign):
        return [stmt.value, *stmt.targets]
    if isinstance(stmt, ast.AnnAssign):
        return [stmt.value, stmt.target] if stmt.value is not None else None
    if isinstance(stmt, ast.AugAssign):
        return [stmt.target, stmt.value]
    if isinstance(stmt, ast.With):
        return [stmt.items[0].context_expr]
    if isinstance(stmt, ast.For):
        return [stmt.iter]
    if isinstance(stmt, ast.If):
        return [stmt.test]
    return None


def _read_first(stmt: ast.stmt, name: str) -> ast.Name | None:
    """The one read of ``name`` in ``stmt``, where ``stmt`` evaluates it once, every time it
    runs, before it runs any code (a call, a comprehension, a ``yield``): what a value computed
    in the statement before may be computed in its place."""
    heads = _heads(stmt)
    reads = [n for n in ast.walk(stmt) if isinstance(n, ast.Name) and n.id == name]
    if heads is None or len(reads) != 1:
        return None
    order: list[tuple[ast.AST, bool]] = []
    for head in heads:
        _evaluation(head, False, order)
    for node, conditional in order:
        if node is reads[0]:
            return reads[0] if not conditional and isinstance(node.ctx, ast.Load) else None
        if isinstance(node, _RUNS_CODE):
            return None
    return None


#: :func:`_read_next` leaves a statement longer than this (its first line, unparsed) as it is:
#: a call nested in three others is shorter in lines and harder to read.
MERGED_WIDTH = 120


def _merged_fits(stmt: ast.stmt, read: ast.Name, value: ast.expr) -> bool:
    text = ast.unparse(stmt).splitlines()[0]
    width = len(text) - len(read.id) + len(ast.unparse(value))
    return width <= MERGED_WIDTH or width <= len(text)


def _read_next(tree: ast.Module, frozen: Frozen) -> bool:
    """``x = v`` followed by a statement that reads ``x`` once before it runs any code, where
    nothing else reads or binds ``x``, becomes that statement with ``v`` in place of ``x``
    (``loss = f(out); loss.backward()``: ``f(out).backward()``; ``params = m.parameters();
    opt = SGD(params)``: ``opt = SGD(m.parameters())``): ``v`` is computed when it was, after the
    statement before and before anything of the statement that reads it."""
    changed = False
    for fn in _functions(tree, frozen):
        stores = _stores(fn)
        reads: dict[str, int] = {}
        for n in ast.walk(fn):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                reads[n.id] = reads.get(n.id, 0) + 1
        declared = {x for n in ast.walk(fn) if isinstance(n, (ast.Global, ast.Nonlocal)) for x in n.names}

        def merge(
            prev: ast.stmt,
            stmt: ast.stmt,
            stores: dict[str, int] = stores,
            reads: dict[str, int] = reads,
            declared: set[str] = declared,
        ) -> ast.stmt | None:
            if not (
                isinstance(prev, ast.Assign)
                and len(prev.targets) == 1
                and isinstance(prev.targets[0], ast.Name)
                and not any(isinstance(n, _RUNS_CODE[1:5]) for n in ast.walk(prev.value))
            ):
                return None
            name = prev.targets[0].id
            if stores.get(name) != 1 or reads.get(name) != 1 or name in declared:
                return None
            read = _read_first(stmt, name)
            if read is None or not _merged_fits(stmt, read, prev.value):
                return None
            _Replace(read, prev.value).visit(stmt)
            return stmt

        changed |= _merge_neighbours(fn, merge)
    return changed


_REWRITES = (
    _read_next,
    _returned_at_once,
    _last_returns,
    _spread_keywords,
    _object_fields,
    _scalars,
    _tables,
    _enum_tests,
    _constant_aliases,
    _constant_tests,
    _empties,
    _bags,
    _duplicate_imports,
    _imports,
    _identities,
    _appends,
)


def simplify(code: str, frozen: Frozen = frozenset()) -> str | None:
    """``code`` rewritten (see the module's docstring), or None if no rewrite applies."""
    tree = ast.parse(code)
    changed = False
    if aliases_replaced(tree):  # aliases and displays read once, before any rewrite needs them
        tree, changed = ast.parse(clean(_unparse(tree))), True
    for _ in range(_ROUNDS):
        step = False
        for rewrite in _REWRITES:
            step |= rewrite(tree, frozen)
        if not step:
            break
        changed = True
        tree = ast.parse(clean(_unparse(propagate_aliases(tree))))  # the locals a rewrite left idle
    if not changed:
        return None
    _drop_passes(tree)
    out = _unparse(tree)
    return out if out != code else None
