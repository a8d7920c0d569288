"""Delta debugging of a flat reduced script: the last pass of :mod:`fuzz.repro.reduce`.

Every candidate is the current script with something cut, then tidied (``tidy``: the static
clean-up of :func:`fuzz.repro.specialize.tidy`, what nothing refers to any more and calls of
functions left without a body); it is kept if it is smaller and ``test`` says it still
reproduces. The cuts, coarsest first, in rounds until a round keeps nothing or the time is up:

0. **Objects**: the fields read off the dataclass objects the script builds by keywords (the
   case) become the expressions they were built with (:func:`propagate_objects`), kept if it
   reproduces even where it is not smaller; then the rewrites of :mod:`fuzz.repro.simplify`
   (objects to their fields and to scalars, table lookups, enum tests, constant branches), which
   run again after inlining;
1. **Definitions**: a top-level function, class or assignment, with every innermost statement
   that names it (its calls, the loops over what it returns);
2. **Bodies**: a function's or method's body becomes ``pass`` (a function that only had an
   effect loses it; its calls as statements then go, by the tidying);
3. **Builders, methods, parameters, then inlining**: every call of a function on literals (the
   model's builder on the case's tree) is evaluated as far as the literal decides it, down the
   recursion, and kept if that is shorter (:mod:`fuzz.repro.unroll`); a module class of the
   script is tried as ``nn.Sequential`` of its children (:func:`fuzz.repro.unroll.as_sequential`).
   A method called on an object that the calling function builds in place
   (``comp = Composition(...)``; ``comp.steps()``, or ``comp.paths`` for a property) is copied
   to a top-level function ``Composition_steps(self)`` which those uses call
   (:func:`hoist_method`). A parameter that the function (or a class's ``__init__``) never
   reads, or for which every call passes the same constant (or leaves the same constant
   default), goes from the definition and from every call, the constant taking its place in the
   body (:func:`drop_parameter`; only where every reference to the function is a plain call, so
   that all its calls are seen). A method-less dataclass is collapsed to one of its fields
   (:func:`fuzz.repro.records.collapse_record`: its calls become what they bind to the field,
   reads of the field the object). Then a top-level function called once, with at most a final
   ``return``, is replaced by its body (its parameters bound by assignments, its locals renamed
   where the caller uses their names), before the statement that calls it where the call is not
   the statement itself (or a comprehension's first iterable, evaluated once before it runs);
   kept if it reproduces even where it is not smaller (it leaves fewer functions);
4. **Unwrapping**: a ``with``, ``if`` or ``try`` becomes its body, a ``for`` its first
   iteration; kept if it reproduces (it leaves fewer compound statements);
5. **Statements**: chunks of statements, top-level and in bodies, outermost first, the chunks
   halved down to single statements (ddmin without its complement steps);
6. **Elements**: a keyword argument of a call, an entry of a dict, an element of a list, tuple
   or set display, one at a time (what is left to cut once the statements are 1-minimal: the
   case's fields, a table's entries and the enum members only they name); then a method call
   cut to its object, a call to one of its arguments, and a conditional expression to one of its
   branches.

No cut may leave a name the script binds unbound (:func:`unbound`), nor lessen its seeding
calls and ``generator=`` keywords (:func:`seeding`): a reduced script draws what its source drew
in every process and every run, whatever seed torch started the process with.

The harness's ``main`` (torchrun's set-up) and the ``if __name__ == "__main__"`` guard are
never cut; the harness's ``attempt`` is never cut whole, only statements of it, never those that
hold its ``return`` statements (the verdicts: a script must still say PASS once the failure is
gone) nor its ``except`` clauses (the check of the exception). For a mismatch, the judge and what
it uses are left as they are (``frozen``): a judge cut down could find its mismatch in anything.
What its classes check when they are built (``__post_init__``) is not the judge's: it goes
first, in one attempt (:func:`drop_validation`), and what only it named is then cut like the
rank code.
"""

from __future__ import annotations

import ast
import builtins
import copy
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeGuard

from fuzz.repro.fold import WORD, is_dataclass
from fuzz.repro.harness import ATTEMPT
from fuzz.repro.script import code_lines

#: A script as the reducer tests it: True if it still reproduces.
Test = Callable[[str], bool]
_COMPOUND_BODIES = ("body", "orelse", "finalbody")


def _size(code: str) -> tuple[int, int]:
    return code_lines(code), len(code)


#: Names a module has without binding them.
_GIVEN = frozenset(dir(builtins)) | {"__file__", "__name__", "__builtins__", "__spec__", "__doc__"}


def unbound(code: str) -> frozenset[str]:
    """What a cut may not leave: :func:`undefined` and :func:`unbound_reads` of ``code``, parsed
    once."""
    tree = ast.parse(code)
    return _undefined(tree) | _unbound_reads(tree)


def undefined(code: str) -> frozenset[str]:
    """Names that ``code`` reads and binds nowhere (no assignment, parameter, definition, import
    or ``except ... as`` of that name anywhere in it): a cut that leaves one may still reproduce
    where the failure comes before the name is read, and then the script breaks on a build
    without the bug instead of saying PASS."""
    return _undefined(ast.parse(code))


def _undefined(tree: ast.Module) -> frozenset[str]:
    bound = set(_GIVEN)
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            bound.add(n.id)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, ast.alias):
            bound.add(n.asname or n.name.split(".")[0])
        elif isinstance(n, ast.ExceptHandler) and n.name:
            bound.add(n.name)
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            bound.update(n.names)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return frozenset(read - bound)


def unbound_reads(code: str) -> frozenset[str]:
    """``function:name`` for each name a top-level function (or a method of a top-level class)
    reads that neither it (anywhere in it, nested scopes included) nor the module's top level
    binds, nor the builtins: what :func:`undefined` misses where the name is bound in another
    function (``case``, a local of ``attempt`` and a parameter elsewhere), and what a cut of
    its one binding leaves to fail at run time."""
    return _unbound_reads(ast.parse(code))


def _unbound_reads(tree: ast.Module) -> frozenset[str]:
    module = set(_GIVEN)
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            module.add(stmt.name)
            continue
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
                module.add(n.id)
            elif isinstance(n, ast.alias):
                module.add(n.asname or n.name.split(".")[0])
    functions: list[tuple[str, _Function]] = []
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.append((stmt.name, stmt))
        elif isinstance(stmt, ast.ClassDef):
            functions += [
                (f"{stmt.name}.{m.name}", m)
                for m in stmt.body
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
    out: set[str] = set()
    for name, fn in functions:
        bound = _stored(fn) | {a.arg for a in ast.walk(fn) if isinstance(a, ast.arg)}
        for n in ast.walk(fn):
            if isinstance(n, (ast.Global, ast.Nonlocal)):
                bound.update(n.names)
        read = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        out.update(f"{name}:{r}" for r in read - bound - module)
    return frozenset(out)


#: Calls that seed a generator (``torch.manual_seed(0)``, ``torch.Generator().manual_seed(0)``,
#: ``random.seed(0)``) and the keyword that draws from a given one (``generator=gen``).
_SEEDS = frozenset({"manual_seed", "manual_seed_all", "seed"})


def seeding(code: str) -> int:
    """How many seeding calls and ``generator=`` keywords ``code`` has: a cut may not lessen
    them. Without them a script draws from the seed torch started each process with, which torch
    2.13 picks anew for each process and torch 2.11 does not: a judge then compares values drawn
    apart (two models initialised apart), which on 2.11 reproduces and passes with the fix alike
    in every attempt, and on 2.13 flips a coin (a one-sided comparison) in each run."""
    return _seeding(ast.parse(code))


def _seeding(tree: ast.Module) -> int:
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            count += name in _SEEDS
            count += sum(kw.arg == "generator" for kw in node.keywords)
    return count


def _guard(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "__name__" in ast.unparse(node.test)


#: Names of top-level definitions that are left as they are (they may only go whole, once nothing
#: refers to them): for a mismatch, the judge and what it uses (:func:`frozen_for`).
Frozen = frozenset[str]


def _fixed(node: ast.stmt, frozen: Frozen = frozenset()) -> bool:
    """A top-level statement that is never cut whole."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name in ("main", ATTEMPT) or node.name in frozen
    if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in frozen for t in node.targets):
        return True
    if isinstance(node, ast.ImportFrom) and node.module == "__future__":
        return True
    return _guard(node)


def _untouched(node: ast.stmt, frozen: Frozen = frozenset()) -> bool:
    """A top-level statement whose inside is never cut either."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == "main" or node.name in frozen
    return _guard(node)


def _returns(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Return) for n in ast.walk(node))


def _blocks(node: ast.AST, handlers: bool = True) -> Iterator[list[ast.stmt]]:
    """The statement lists directly inside ``node`` (but the ``except`` clauses' unless
    ``handlers``)."""
    for field in _COMPOUND_BODIES:
        inner = getattr(node, field, None)
        if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
            yield inner
    if handlers:
        for handler in getattr(node, "handlers", []) or []:
            yield handler.body


def _harness(node: ast.stmt) -> bool:
    return isinstance(node, ast.FunctionDef) and node.name == ATTEMPT


def units(tree: ast.Module, frozen: Frozen = frozenset()) -> list[tuple[ast.stmt, list[ast.stmt]]]:
    """Every statement that may be cut (the statement, the list it is in), outermost first. In
    ``attempt``, the statements that hold a ``return`` (the verdicts) and the ``except`` clauses
    (the check of the exception) are the harness's: they stay."""
    out: list[tuple[ast.stmt, list[ast.stmt]]] = []
    read = _harness_reads(tree)

    def visit(stmts: list[ast.stmt], top: bool, harness: bool) -> None:
        for node in stmts:
            if top and _fixed(node, frozen):
                continue
            if harness and (_returns(node) or _binds(node) & read):
                continue
            out.append((node, stmts))
        for node in stmts:
            if not (top and _untouched(node, frozen)):
                inner = harness or (top and _harness(node))
                for block in _blocks(node, handlers=not inner):
                    visit(block, False, inner)

    visit(tree.body, True, False)
    return out


def _binds(node: ast.stmt) -> set[str]:
    out = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    out.update(
        a.asname or a.name.split(".")[0]
        for n in ast.walk(node)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    )
    return out


def _harness_reads(tree: ast.Module) -> set[str]:
    """The names that ``attempt``'s own statements read (its ``except`` clauses, its verdicts
    and the tests that choose them): the statements that bind them stay, so that every verdict
    can still be returned."""
    read: set[str] = set()
    for fn in tree.body:
        if not _harness(fn):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ExceptHandler):
                parts: list[ast.AST] = [node]
            elif isinstance(node, ast.Return) and node.value is not None:
                parts = [node.value]
            elif isinstance(node, ast.If) and _returns(node):
                parts = [node.test]
            else:
                continue
            for part in parts:
                read.update(n.id for n in ast.walk(part) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))
    return read


def _unparse(tree: ast.Module) -> str:
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def without(code: str, drop: list[int], frozen: Frozen = frozenset()) -> str:
    """``code`` without the statements numbered ``drop`` in :func:`units`' order."""
    tree = ast.parse(code)
    found = units(tree, frozen)
    gone = {id(found[i][0]) for i in drop}
    for stmts in {id(lst): lst for _, lst in found}.values():
        stmts[:] = [n for n in stmts if id(n) not in gone] or [ast.Pass()]
    return _unparse(tree)


def frozen_for(code: str, roots: set[str]) -> Frozen:
    """The top-level definitions of ``code`` among ``roots``, those they name, and so on (by
    name: an attribute's name is a method of a class that is named already, or is not theirs)."""
    defs: dict[str, ast.stmt] = {}
    for node in ast.parse(code).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs[node.name] = node
        elif isinstance(node, ast.Assign):
            defs.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
    out: set[str] = set()
    todo = [r for r in roots if r in defs]
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out.add(name)
        named = {n.id for n in ast.walk(defs[name]) if isinstance(n, ast.Name)}
        todo.extend(n for n in named if n in defs and n not in out)
    return frozenset(out)


def drop_validation(code: str, frozen: Frozen) -> str | None:
    """``code`` without the ``__post_init__`` methods of the frozen classes (None if they have
    none). A dataclass's ``__post_init__`` checks the case it is built from: it raises or does
    nothing, so what it names (the case model's rules) is no part of the judge's verdict, and
    freezing it with the judge would keep the whole case model in every mismatch script."""
    tree = ast.parse(code)
    found = False
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in frozen:
            kept = [s for s in node.body if not (isinstance(s, ast.FunctionDef) and s.name == "__post_init__")]
            found |= len(kept) < len(node.body)
            node.body = kept or [ast.Pass()]
    return _unparse(tree) if found else None


# -- cut 1: a definition and what names it -------------------------------------------------------


def _names(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def _header(node: ast.stmt) -> list[ast.AST]:
    """The parts of a compound statement outside its bodies (all of a simple one)."""
    if isinstance(node, (ast.If, ast.While)):
        return [node.test]
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return [node.target, node.iter]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return list(node.items)
    if isinstance(node, ast.Try):
        return [h.type for h in node.handlers if h.type is not None]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [*node.decorator_list, node.args, *([node.returns] if node.returns else [])]
    if isinstance(node, ast.ClassDef):
        return [*node.decorator_list, *node.bases, *node.keywords]
    return [node]


def definitions(code: str, frozen: Frozen = frozenset()) -> list[str]:
    """Names of the top-level definitions that may be cut, largest first."""
    sized = []
    for node in ast.parse(code).body:
        if _fixed(node, frozen):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = node.name
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        else:
            continue
        sized.append(((node.end_lineno or node.lineno) - node.lineno, name))
    return [name for _, name in sorted(sized, key=lambda s: -s[0])]


class _Refused(Exception):
    """A cut would change what stays as it is (the harness, a frozen definition)."""


def cut_definition(code: str, name: str, frozen: Frozen = frozenset()) -> str | None:
    """``code`` without the top-level definition of ``name`` and every innermost statement that
    names it (None if there is no such definition, or if one of those statements is the
    harness's or a frozen definition's)."""
    tree = ast.parse(code)

    def defines(node: ast.stmt) -> bool:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return node.name == name
        return isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)

    if not any(defines(n) and not _fixed(n, frozen) for n in tree.body):
        return None

    def prune(stmts: list[ast.stmt], top: bool, harness: bool) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for node in stmts:
            if top and defines(node) and not _fixed(node, frozen):
                continue
            if not _names(node, name):
                out.append(node)
            elif top and _untouched(node, frozen):
                raise _Refused
            elif any(True for _ in _blocks(node)) and not any(_names(h, name) for h in _header(node)):
                inner = harness or (top and _harness(node))
                for field in _COMPOUND_BODIES:
                    block = getattr(node, field, None)
                    if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                        kept = prune(block, False, inner)
                        setattr(node, field, kept or ([ast.Pass()] if field == "body" else []))
                for handler in getattr(node, "handlers", []) or []:
                    if inner and _names(handler, name):
                        raise _Refused
                    handler.body = prune(handler.body, False, inner) or [ast.Pass()]
                if isinstance(node, ast.Try) and not node.handlers and not node.finalbody:
                    node.finalbody = [ast.Pass()]  # a try/finally whose finally named it all
                out.append(node)
            elif (harness and _returns(node)) or (top and _fixed(node, frozen)):
                raise _Refused
        return out

    try:
        tree.body = prune(tree.body, True, False)
    except _Refused:
        return None
    return _unparse(tree)


# -- cut 2: a function's body --------------------------------------------------------------------


def _inert(body: list[ast.stmt]) -> bool:
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)) for s in body)


_Function = ast.FunctionDef | ast.AsyncFunctionDef


def _functions(tree: ast.Module, frozen: Frozen = frozenset()) -> Iterator[tuple[str, _Function]]:
    """(qualified name, function) of every function that may lose its body, outermost first."""

    def visit(stmts: list[ast.stmt], prefix: str, top: bool) -> Iterator[tuple[str, _Function]]:
        for node in stmts:
            if top and (_untouched(node, frozen) or _harness(node)):
                continue
            inner = prefix
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{prefix}{node.name}."
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not (top and _fixed(node, frozen)):
                    yield f"{prefix}{node.name}", node
            for block in _blocks(node):
                yield from visit(block, inner, False)

    yield from visit(tree.body, "", True)


def bodies(code: str, frozen: Frozen = frozenset()) -> list[str]:
    """Qualified names of the functions whose body may become ``pass``, largest first."""
    found = [
        ((fn.end_lineno or fn.lineno) - fn.lineno, qual)
        for qual, fn in _functions(ast.parse(code), frozen)
        if not _inert(fn.body)
    ]
    return [qual for _, qual in sorted(found, key=lambda f: -f[0])]


def cut_body(code: str, qualname: str, frozen: Frozen = frozenset()) -> str | None:
    """``code`` with the body of function ``qualname`` replaced by ``pass`` (None if none is)."""
    tree = ast.parse(code)
    for qual, fn in _functions(tree, frozen):
        if qual == qualname and not _inert(fn.body):
            fn.body = [ast.Pass()]
            return _unparse(tree)
    return None


def drop_idle_calls(tree: ast.Module) -> ast.Module:
    """Statements that only call a top-level function whose body does nothing (``pass``, a
    constant): they go, and the function with them once nothing else names it (left to the
    unused-names pass). So do such calls among the operands of an ``or`` (``check() or
    compare(...)``: the call gives None, and ``None or x`` is ``x``), where their arguments are
    names or constants (nothing to compute)."""
    idle = {
        n.name
        for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _fixed(n) and _inert(n.body)
    }
    if not idle:
        return tree

    def idle_call(node: ast.stmt) -> bool:
        if not isinstance(node, ast.Expr):
            return False
        value = node.value.value if isinstance(node.value, ast.Await) else node.value
        return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in idle

    for node in ast.walk(tree):
        for field in _COMPOUND_BODIES:
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                kept = [n for n in stmts if not idle_call(n)]
                setattr(node, field, kept or ([ast.Pass()] if field == "body" and node is not tree else []))
    _IdleOperands(idle).visit(tree)
    return tree


class _IdleOperands(ast.NodeTransformer):
    """``f() or x`` is ``x`` where ``f`` is idle (returns None) and its arguments compute
    nothing: see :func:`drop_idle_calls`."""

    def __init__(self, idle: set[str]) -> None:
        self.idle = idle

    def _idle(self, node: ast.expr) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in self.idle
            and all(isinstance(a, (ast.Name, ast.Constant)) for a in [*node.args, *(k.value for k in node.keywords)])
        )

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        self.generic_visit(node)
        if not isinstance(node.op, ast.Or):
            return node
        # The last operand is the value where all before it are false: an idle one there gives
        # None, as an ``or`` of falsy values ending in None would not; it stays.
        kept = [v for v in node.values[:-1] if not self._idle(v)] + node.values[-1:]
        if len(kept) == len(node.values):
            return node
        return kept[0] if len(kept) == 1 else ast.BoolOp(ast.Or(), kept)


# -- the driver ----------------------------------------------------------------------------------


#: The smallest group of definitions cut in one attempt before they are cut one at a time.
SMALLEST_GROUP = 4


def ddmin(
    code: str,
    test: Test,
    until: float,
    *,
    tidy: Callable[[str], str] = lambda c: c,
    frozen: Frozen = frozenset(),
    pretest: bool = False,
    kept: list[str] | None = None,
    fold_values: Callable[[str], list[str]] | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> str:
    """``code`` cut down while ``test`` holds, until ``time.monotonic()`` passes ``until``;
    the definitions named in ``frozen`` are left as they are. ``pretest``: an attempt is cheap
    next to tidying (the pool runs them), so each cut is tested before it is tidied. ``kept``
    gets every script that became the current one, in order. ``fold_values``: the script with
    what plain Python computes in it folded to the values an instrumented run saw
    (:mod:`fuzz.repro.values`), as candidates in order (every site, then each alone), the first
    that holds kept; tried once a round, after inlining."""
    current = code
    dangling = unbound(code)  # what the script read without binding before any cut
    seeds = seeding(code)  # what makes its draws the same in every process and every run
    try:
        tidied = tidy(code)
    except (SyntaxError, ValueError, TypeError, KeyError, RecursionError):
        tidied = code
    if tidied != code:
        if _size(tidied) < _size(code) and seeding(tidied) >= seeds and test(tidied):
            current, seeds = tidied, seeding(tidied)
        else:
            say("  delta: the tidied script does not reproduce; candidates are not tidied")
            tidy = lambda c: c  # noqa: E731

    best = current  # the smallest script that reproduced: a growing rewrite may not pay off

    def keep(candidate: str | None, grow: bool = False) -> bool:
        """Whether ``candidate`` (tidied) is kept; it becomes the current script if so. Unless
        ``grow`` (an inlining: it has fewer functions), it must be smaller. With ``pretest``,
        the candidate is tested as cut first, and tidied only if that reproduces (most cuts do
        not, and tidying costs several times a pooled attempt); where the tidied one does not
        reproduce, the cut one is kept."""
        if candidate is None or time.monotonic() >= until:
            return False

        def smaller(c: str) -> bool:
            if c == current or not (grow or _size(c) < _size(current)):
                return False
            try:  # a cut may not leave a name unbound, nor a draw unseeded
                tree = ast.parse(c)
            except SyntaxError:
                return False
            return not (_undefined(tree) | _unbound_reads(tree)) - dangling and _seeding(tree) >= seeds

        def accept(script: str) -> bool:
            nonlocal current, best, seeds
            current, seeds = script, seeding(script)
            if kept is not None:
                kept.append(current)
            best = current if _size(current) < _size(best) else best
            return True

        if pretest:
            if not smaller(candidate) or not test(candidate):
                return False
            try:
                tidied = tidy(candidate)
            except (SyntaxError, ValueError, TypeError, KeyError, RecursionError):
                tidied = candidate
            return accept(tidied if tidied != candidate and smaller(tidied) and test(tidied) else candidate)
        try:
            candidate = tidy(candidate)
        except (SyntaxError, ValueError, TypeError, KeyError, RecursionError):
            return False
        if not smaller(candidate) or not test(candidate):
            return False
        return accept(candidate)

    def each(
        names: Callable[[str, Frozen], list[str]], cut: Callable[[str, str, Frozen], str | None], grow: bool = False
    ) -> None:
        tried: set[str] = set()
        while time.monotonic() < until:
            todo = [n for n in names(current, frozen) if n not in tried]
            if not todo:
                return
            tried.add(todo[0])
            keep(cut(current, todo[0], frozen), grow)

    def grouped(names: Callable[[str, Frozen], list[str]], cut: Callable[[str, str, Frozen], str | None]) -> None:
        """``cut`` of several names at once, as delta debugging cuts chunks: a quarter of the
        names, then halves of that, down to groups of :data:`SMALLEST_GROUP`; each group is one
        attempt (the names a cut refuses are left out of it). Where most definitions are dead
        (a case's model classes once the case is folded), this takes them in a few attempts
        rather than one each, which counts where an attempt is a torchrun of 10 s or more."""
        size = len(names(current, frozen)) // 4
        while size >= SMALLEST_GROUP and time.monotonic() < until:
            todo = names(current, frozen)
            for start in range(0, len(todo), size):
                candidate = current
                for name in todo[start : start + size]:
                    candidate = cut(candidate, name, frozen) or candidate
                if candidate != current:
                    keep(candidate)
            size //= 2

    from fuzz.repro.records import collapse_record, record_fields
    from fuzz.repro.simplify import simplify
    from fuzz.repro.unroll import as_sequential, containers, unroll, unrollable

    def shorter(cut: Callable[[str, str, Frozen], str | None]) -> Callable[[str, str, Frozen], str | None]:
        """``cut``, its candidate tidied, and only if that is shorter (a rewrite that leaves
        what it replaced for the tidying to drop)."""

        def tidied(code: str, name: str, frozen: Frozen) -> str | None:
            out = cut(code, name, frozen)
            try:
                out = tidy(out) if out is not None else None
            except (SyntaxError, ValueError, TypeError, KeyError, RecursionError):
                return None
            return out if out is not None and _size(out) < _size(code) else None

        return tidied

    def expanded(code: str, name: str, frozen: Frozen) -> str | None:
        """Every call of ``name`` inlined, then each copy specialized to its arguments (objects,
        simplifications, builders), until nothing changes: kept by :func:`shorter` only if the
        copies together came out shorter than the function and its calls."""
        out = inline_everywhere(code, name, frozen)
        for _ in range(4):
            if out is None:
                return None
            before = out
            for rewrite in (propagate_objects, simplify):
                out = rewrite(out, frozen) or out
            for key in unrollable(out, frozen):
                out = unroll(out, key, frozen) or out
            for key in parameters(out, frozen):
                out = drop_parameter(out, key, frozen) or out
            if out == before:
                break
        return out

    def written_out(code: str, key: str, frozen: Frozen) -> str | None:
        """The loop ``key`` written out over its literal, its constant tests resolved."""
        out = unroll_loop(code, key, frozen)
        return (simplify(out, frozen) or out) if out is not None else None

    round_ = 0
    while time.monotonic() < until:
        before = current
        keep(propagate_objects(current, frozen), grow=True)
        keep(simplify(current, frozen), grow=True)
        grouped(definitions, cut_definition)
        each(definitions, cut_definition)
        say(f"  delta {round_}: definitions cut, {code_lines(current)} code lines")
        each(bodies, cut_body)
        say(f"  delta {round_}: bodies cut, {code_lines(current)} code lines")
        each(unrollable, shorter(unroll), grow=True)
        each(containers, shorter(as_sequential), grow=True)
        each(methods, hoist_method, grow=True)
        each(parameters, drop_parameter, grow=True)
        each(fields, drop_field)
        say(f"  delta {round_}: parameters and unread fields dropped, {code_lines(current)} code lines")
        each(record_fields, shorter(collapse_record), grow=True)
        say(f"  delta {round_}: records collapsed to a field, {code_lines(current)} code lines")
        each(inlinable, inline, grow=True)
        each(expression_functions, inline_expression, grow=True)
        each(called_often, shorter(expanded), grow=True)
        keep(simplify(current, frozen), grow=True)
        say(f"  delta {round_}: functions inlined and simplified, {code_lines(current)} code lines")
        if fold_values is not None and time.monotonic() < until:
            for folded in fold_values(current):  # every site at once, then each alone
                try:
                    folded = tidy(folded)
                except (SyntaxError, ValueError, TypeError, KeyError, RecursionError):
                    continue
                if time.monotonic() >= until:
                    break
                if code_lines(folded) <= code_lines(current) and keep(folded, grow=True):
                    keep(simplify(current, frozen), grow=True)
                    say(f"  delta {round_}: plain values folded, {code_lines(current)} code lines")
                    break
        each(literal_loops, written_out, grow=True)
        each(compounds, unwrap, grow=True)
        say(f"  delta {round_}: statements unwrapped, {code_lines(current)} code lines")
        _chunks(lambda: current, keep, until, frozen)
        say(f"  delta {round_}: statements cut, {code_lines(current)} code lines")
        _each_element(lambda: current, keep, until, frozen)
        say(f"  delta {round_}: elements cut, {code_lines(current)} code lines")
        _each_receiver(lambda: current, keep, until, frozen)
        say(f"  delta {round_}: method calls cut to their objects, {code_lines(current)} code lines")
        _each_argument(lambda: current, keep, until, frozen)
        say(f"  delta {round_}: calls cut to an argument, {code_lines(current)} code lines")
        _each_branch(lambda: current, keep, until, frozen)
        say(f"  delta {round_}: conditional expressions cut to a branch, {code_lines(current)} code lines")
        if current == before:
            break
        round_ += 1
    return current if _size(current) <= _size(best) else best


def _chunks(current: Callable[[], str], keep: Callable[[str | None], bool], until: float, frozen: Frozen) -> None:
    """Cut chunks of statements, outermost first, halving the chunks down to one statement."""
    size = max(1, len(units(ast.parse(current()), frozen)) // 8)
    while size >= 1 and time.monotonic() < until:
        start = 0
        while time.monotonic() < until:
            count = len(units(ast.parse(current()), frozen))
            if start >= count:
                break
            if not keep(without(current(), list(range(start, min(count, start + size))), frozen)):
                start += size  # else the same position now holds the next statements
        size //= 2


# -- cut 3: a function called once, inlined -------------------------------------------------------


def _stored(fn: _Function) -> set[str]:
    """The names ``fn`` binds in its own scope (parameters, assignments, imports, definitions)."""
    args = fn.args
    out = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a is not None}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            out.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not fn:
            out.add(node.name)
        elif isinstance(node, ast.alias):
            out.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
    return out


def _inlinable(fn: ast.stmt, frozen: Frozen) -> bool:
    """A plain function: no decorator, ``yield``, ``global``, and at most one ``return``, its
    last statement (``*args`` and ``**kwargs`` are bound to displays of what a call passes
    them, :func:`bind`)."""
    if not isinstance(fn, ast.FunctionDef) or fn.decorator_list:
        return False
    if _fixed(fn, frozen):
        return False
    for node in ast.walk(fn):
        if isinstance(node, (ast.Yield, ast.YieldFrom, ast.Await, ast.Global, ast.Nonlocal)):
            return False
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and node is not fn:
            return False  # a closure over a renamed local is beyond this pass
    returns = [n for n in ast.walk(fn) if isinstance(n, ast.Return)]
    return not returns or (len(returns) == 1 and fn.body[-1] is returns[0])


def _call_site(stmt: ast.stmt, name: str) -> ast.Call | None:
    """The call of ``name`` in ``stmt``, where its value can be computed before the statement:
    anywhere in a simple statement, the iterable of a ``for``, the context of a ``with`` or the
    test of an ``if``, but not in a lambda, a comprehension or an operand evaluated only maybe."""
    if isinstance(stmt, (ast.Expr, ast.Return, ast.Assign, ast.AugAssign, ast.AnnAssign)):
        where: list[ast.AST] = [stmt]
    elif isinstance(stmt, (ast.For, ast.AsyncFor)):
        where = [stmt.iter]
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        where = [item.context_expr for item in stmt.items]
    elif isinstance(stmt, ast.If):
        where = [stmt.test]
    else:
        return None
    maybe = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.BoolOp, ast.IfExp, ast.Await)

    def find(node: ast.AST) -> ast.Call | None:
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return find(node.generators[0].iter)  # evaluated once, before the comprehension runs
        if isinstance(node, maybe):
            return None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
            plain = not any(isinstance(a, ast.Starred) for a in node.args) and all(k.arg for k in node.keywords)
            return node if plain else None
        for child in ast.iter_child_nodes(node):
            found = find(child)
            if found is not None:
                return found
        return None

    for part in where:
        found = find(part)
        if found is not None:
            return found
    return None


def _name_counts(tree: ast.Module) -> tuple[dict[str, int], dict[str, int]]:
    """(how often each name is read or written, how often each is called by name)."""
    counts: dict[str, int] = {}
    calls: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            counts[node.id] = counts.get(node.id, 0) + 1
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            calls[node.func.id] = calls.get(node.func.id, 0) + 1
    return counts, calls


def inlinable(code: str, frozen: Frozen = frozenset()) -> list[str]:
    """Top-level functions named once outside their definition, by a call that is a statement."""
    tree = ast.parse(code)
    counts, _ = _name_counts(tree)
    return [
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and _inlinable(n, frozen) and counts.get(n.name) == 1
    ]


def _inline_next(tree: ast.Module, fn: ast.FunctionDef, frozen: Frozen) -> bool | None:
    """Replace the first call of ``fn`` in ``tree`` by its body: True if done, False where no
    call is left, None where the first one cannot be inlined (not a cuttable statement)."""
    cuttable = {id(stmt) for stmt, _ in units(tree, frozen)}
    for caller in ast.walk(tree):
        if not isinstance(caller, (ast.FunctionDef, ast.AsyncFunctionDef)) or caller is fn:
            continue
        for block in [b for node in ast.walk(caller) for b in _blocks(node)]:
            for i, stmt in enumerate(block):
                call = _call_site(stmt, fn.name)
                if call is None:
                    continue
                # The harness's own assignments (``failure = judge(...)``) are not cut, but a
                # call in them may be inlined: the assignment stays, of what the call returned.
                harness = _harness(caller) and isinstance(stmt, ast.Assign) and caller in tree.body
                body = _inlined(fn, call, stmt, caller) if id(stmt) in cuttable or harness else None
                if body is None:
                    return None
                block[i : i + 1] = body
                return True
    return False


def inline(code: str, name: str, frozen: Frozen = frozenset()) -> str | None:
    """``code`` with the one call of function ``name`` replaced by its body (None if it cannot)."""
    tree = ast.parse(code)
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None or not _inlinable(fn, frozen) or not _inline_next(tree, fn, frozen):
        return None
    tree.body.remove(fn)
    return _unparse(tree)


def called_often(code: str, frozen: Frozen = frozenset()) -> list[str]:
    """Top-level functions named at least twice outside their definition, each time by a call."""
    tree = ast.parse(code)
    counts, calls = _name_counts(tree)
    return [
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef)
        and _inlinable(n, frozen)
        and counts.get(n.name, 0) >= 2
        and counts.get(n.name) == calls.get(n.name)
    ]


def inline_everywhere(code: str, name: str, frozen: Frozen = frozenset()) -> str | None:
    """``code`` with every call of function ``name`` replaced by its body, one after the other
    (None if one cannot be): the step before each copy is specialized to its call's arguments."""
    for _ in range(16):
        tree = ast.parse(code)
        fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
        if fn is None or not _inlinable(fn, frozen):
            return None
        if not any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(tree) if n is not fn):
            tree.body.remove(fn)
            return _unparse(tree)
        if not _inline_next(tree, fn, frozen):
            return None
        code = _unparse(tree)
    return None


def _expression(fn: ast.stmt, frozen: Frozen) -> ast.expr | None:
    """What a plain function is, where it is one ``return`` of an expression (not recursive):
    else None. A parameter it reads more than once may only be given a name, a constant or an
    attribute of a name (:func:`inline_expression`), so that no argument is computed twice."""
    if not isinstance(fn, ast.FunctionDef) or not _inlinable(fn, frozen):
        return None
    if fn.args.kwonlyargs or fn.args.vararg or fn.args.kwarg:
        return None
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return None
    value = body[0].value
    reads = [n.id for n in ast.walk(value) if isinstance(n, ast.Name)]
    if fn.name in reads:
        return None  # recursive
    if any(isinstance(n, (ast.Lambda, ast.NamedExpr, *_COMPREHENSIONS)) for n in ast.walk(value)):
        return None  # a scope of its own, or a binding: left to the statement inliner
    return value


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _plain(node: ast.expr) -> bool:
    """A name, a constant or an attribute of a name: nothing computed where it is written again."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, (ast.Name, ast.Constant))


def _expression_functions(tree: ast.Module, frozen: Frozen) -> Iterator[tuple[str, ast.AST, ast.FunctionDef]]:
    """(key, scope, function) of each function that is one ``return`` of an expression: at the
    top (key: its name; scope: the module) or directly in the body of a top-level function
    that may be cut (``outer.inner``; scope: that function), named in its scope only by calls
    (recursion aside) and defined once there."""
    candidates: list[tuple[str, ast.AST, ast.FunctionDef]] = []
    for top in tree.body:
        if isinstance(top, ast.FunctionDef):
            candidates.append((top.name, tree, top))
            if not _untouched(top, frozen) and not _harness(top):
                candidates += [(f"{top.name}.{n.name}", top, n) for n in top.body if isinstance(n, ast.FunctionDef)]
    for key, scope, fn in candidates:
        if _expression(fn, frozen) is None:
            continue
        names = [n for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == fn.name]
        called = [
            n
            for n in ast.walk(scope)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == fn.name
        ]
        defined = [n for n in ast.walk(scope) if isinstance(n, ast.FunctionDef) and n.name == fn.name]
        if names and len(names) == len(called) and len(defined) == 1:
            yield key, scope, fn


def expression_functions(code: str, frozen: Frozen = frozenset()) -> list[str]:
    """Functions that are one ``return`` of an expression (:func:`_expression`), top-level or
    nested in a top-level function, named in their scope only by calls (see
    :func:`_expression_functions`)."""
    return [key for key, _, _ in _expression_functions(ast.parse(code), frozen)]


def inline_expression(code: str, name: str, frozen: Frozen = frozenset()) -> str | None:
    """``code`` with every call of ``name`` (a function that is one ``return`` of an
    expression) replaced by that expression, its parameters by the call's arguments, and the
    function gone; None where a call passes what it does not take, or a name the expression
    reads freely is bound where the call is."""
    tree = ast.parse(code)
    found = next(((scope, fn) for key, scope, fn in _expression_functions(tree, frozen) if key == name), None)
    if found is None:
        return None
    holder, fn = found
    expression = _expression(fn, frozen)
    assert expression is not None
    value: ast.expr = expression
    name = fn.name
    params = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args]}
    reads = [n.id for n in ast.walk(value) if isinstance(n, ast.Name)]
    twice = {p for p in params if reads.count(p) > 1}
    free = set(reads) - params
    scopes = [n for n in ast.walk(holder) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    for scope in scopes:
        if scope is fn or scope is holder:
            continue
        own = _stored(scope) if not isinstance(scope, ast.Lambda) else {a.arg for a in scope.args.args}
        if free & own and any(
            isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == name for c in ast.walk(scope)
        ):
            return None
    failed = False

    class _Calls(ast.NodeTransformer):
        def visit_Call(self, node: ast.Call) -> ast.AST:
            nonlocal failed
            self.generic_visit(node)
            if not (isinstance(node.func, ast.Name) and node.func.id == name):
                return node
            bound = bind(fn, node)
            if bound is None or any(not _plain(bound[p]) for p in twice):
                failed = True
                return node
            return ast.copy_location(_Substitute(bound).visit(copy.deepcopy(value)), node)

    block = holder.body  # type: ignore[attr-defined]
    block.remove(fn)
    if not block:
        block.append(ast.Pass())
    _Calls().visit(holder)
    return None if failed else _unparse(tree)


def bind(fn: ast.FunctionDef, call: ast.Call) -> dict[str, ast.expr] | None:
    """What ``call`` binds each parameter of ``fn`` to (its argument, else its default; for
    ``*args`` a tuple display of the positional arguments left, for ``**kwargs`` a dict display
    of the keywords left); None where a parameter gets nothing, the call passes what ``fn``
    does not take, or unpacks (``*xs``, ``**kw``)."""
    args = fn.args
    params = [*args.posonlyargs, *args.args]
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    if len(call.args) > len(params) and args.vararg is None:
        return None
    bound: dict[str, ast.expr] = {p.arg: a for p, a in zip(params, call.args)}
    if args.vararg is not None:
        bound[args.vararg.arg] = ast.Tuple(list(call.args[len(params) :]), ast.Load())
    given = {k.arg: k.value for k in call.keywords if k.arg}
    defaults = dict(zip([p.arg for p in params][len(params) - len(args.defaults) :], args.defaults))
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
    for p in [*params, *args.kwonlyargs]:
        value = bound.get(p.arg, given.pop(p.arg, None) if p.arg not in bound else None)
        if value is None:
            value = defaults.get(p.arg)
        if value is None:
            return None
        bound[p.arg] = value
    if args.kwarg is not None:
        bound[args.kwarg.arg] = ast.Dict([ast.Constant(k) for k in given], list(given.values()))
        given = {}
    return None if given else bound


def _inlined(fn: ast.FunctionDef, call: ast.Call, stmt: ast.stmt, caller: _Function) -> list[ast.stmt] | None:
    fn = copy.deepcopy(fn)
    caller_names = {n.id for n in ast.walk(caller) if isinstance(n, ast.Name)} | _stored(caller)
    local = _stored(fn)
    free = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id not in local}
    if free & _stored(caller):
        return None  # a global the callee reads is a local of the caller
    taken = caller_names | local | free
    rename: dict[str, str] = {}
    for old in sorted(local & caller_names):
        new = old + "_"
        while new in taken:
            new += "_"
        taken.add(new)
        rename[old] = new
    bound = bind(fn, call)
    if bound is None:
        return None
    assigned = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    substitute = {p: v for p, v in bound.items() if p not in assigned and isinstance(v, (ast.Name, ast.Constant))}

    class _Rewrite(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            if isinstance(node.ctx, ast.Load) and node.id in substitute:
                return ast.copy_location(copy.deepcopy(substitute[node.id]), node)
            if node.id in rename:
                node.id = rename[node.id]
            return node

        def visit_alias(self, node: ast.alias) -> ast.AST:
            bound_as = node.asname or node.name.split(".")[0]
            if bound_as in rename:
                node.asname = rename[bound_as]
            return node

    body: list[ast.stmt] = [
        ast.Assign([ast.Name(rename.get(p, p), ast.Store())], v) for p, v in bound.items() if p not in substitute
    ]
    body += [_Rewrite().visit(s) for s in fn.body]
    result: ast.expr = ast.Constant(None)
    if body and isinstance(body[-1], ast.Return):
        returned = body.pop()
        assert isinstance(returned, ast.Return)
        result = returned.value or ast.Constant(None)
    direct = getattr(stmt, "value", None) is call and isinstance(stmt, (ast.Expr, ast.Return, ast.Assign))
    if direct and isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        body.append(ast.Assign(stmt.targets, result))
    elif direct and isinstance(stmt, ast.Return):
        body.append(ast.Return(result))
    elif direct and isinstance(stmt, ast.Expr):
        if not isinstance(result, ast.Constant):
            body.append(ast.Expr(result))
    else:  # the call's value, computed before the statement, under a name of its own
        out = f"{fn.name.strip('_')}_out"
        while out in taken:
            out += "_"
        body.append(ast.Assign([ast.Name(out, ast.Store())], result))
        replaced = _Replace(call, ast.Name(out, ast.Load())).visit(stmt)
        assert isinstance(replaced, ast.stmt)
        body.append(replaced)
    return body or [ast.Pass()]


# -- cut 3a: a method called on an object built in place, made a function -----------------------


def _hoistable(method: ast.stmt) -> TypeGuard[ast.FunctionDef]:
    """A plain method (or a ``@property``) that names neither ``super`` nor ``__class__``."""
    if not isinstance(method, ast.FunctionDef) or method.name.startswith("__") or not method.args.args:
        return False
    if [ast.unparse(d) for d in method.decorator_list] not in ([], ["property"]):
        return False
    return not any(isinstance(n, ast.Name) and n.id in ("super", "__class__") for n in ast.walk(method))


def _method_uses(tree: ast.Module, cls: str, name: str) -> list[tuple[ast.AST, ast.Attribute, ast.Name]]:
    """(node to replace, the attribute, the receiver) of every use of method ``name`` on a local
    that its function binds once to a ``cls(...)`` it builds: the call ``x.name(...)``, or the
    attribute ``x.name`` of a property."""
    out: list[tuple[ast.AST, ast.Attribute, ast.Name]] = []
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        objects = _objects(fn, {cls})
        if not objects:
            continue
        calls = {id(n.func): n for n in ast.walk(fn) if isinstance(n, ast.Call)}
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == name
                and isinstance(node.ctx, ast.Load)
                and isinstance(node.value, ast.Name)
                and node.value.id in objects
            ):
                out.append((calls.get(id(node), node), node, node.value))
    return out


def methods(code: str, frozen: Frozen = frozenset()) -> list[str]:
    """Keys ``Class.method`` of the methods that :func:`hoist_method` may make functions."""
    tree = ast.parse(code)
    out: list[str] = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or _untouched(node, frozen):
            continue
        for method in node.body:
            if _hoistable(method) and _method_uses(tree, node.name, method.name):
                out.append(f"{node.name}.{method.name}")
    return out


def hoist_method(code: str, key: str, frozen: Frozen = frozenset()) -> str | None:
    """``code`` with method ``key`` (``Class.method``) copied to a top-level function
    ``Class_method(self, ...)`` after its class, and its uses on objects the script builds in
    place (``comp = Class(...)``; ``comp.method(a)``, or ``comp.method`` for a property) calling
    that function; then inlining, the objects step and the parameters cut can reach inside it.
    The method stays in the class while anything else names it (the tidying drops it after)."""
    cls, _, name = key.partition(".")
    if key not in methods(code, frozen):
        return None
    tree = ast.parse(code)
    at, node = next((i, n) for i, n in enumerate(tree.body) if isinstance(n, ast.ClassDef) and n.name == cls)
    method = next(m for m in node.body if isinstance(m, ast.FunctionDef) and m.name == name)
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))
    }
    function = f"{cls}_{name}".replace("__", "_")
    while function in taken:
        function += "_"
    hoisted = copy.deepcopy(method)
    hoisted.name, hoisted.decorator_list = function, []
    prop = bool(method.decorator_list)
    for use, attribute, receiver in _method_uses(tree, cls, name):
        replacement = ast.Call(ast.Name(function, ast.Load()), [ast.Name(receiver.id, ast.Load())], [])
        if isinstance(use, ast.Call) and not prop:
            replacement.args += use.args
            replacement.keywords = use.keywords
        else:
            use = attribute
        _Replace(use, ast.copy_location(replacement, use)).visit(tree)
    tree.body.insert(at + 1, hoisted)
    return _unparse(tree)


# -- cut 3b: a parameter that every call passes alike, or that nothing reads ---------------------


def _callee(tree: ast.Module, name: str, frozen: Frozen) -> tuple[_Function, bool] | None:
    """The function that a call of ``name`` runs (a top-level function, or the ``__init__`` of a
    top-level class; True for a method) where every call of ``name`` is plain (no ``*``/``**``)
    and, for a function, nothing names it but its calls; else None."""
    node = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name), None)
    if node is None or _fixed(node, frozen) or _untouched(node, frozen) or getattr(node, "decorator_list", None):
        return None
    if isinstance(node, ast.ClassDef):
        init = next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
        subclassed = any(isinstance(n, ast.ClassDef) and any(_names(b, name) for b in n.bases) for n in ast.walk(tree))
        if init is None or init.decorator_list or subclassed:
            return None
        fn, method = init, True
    else:
        fn, method = node, False
    if fn.args.vararg or fn.args.kwarg or fn.args.posonlyargs:
        return None
    calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and n.id == name and not method and id(n) not in calls:
            return None  # passed as a value: called with arguments this pass cannot see
    for call in _calls_of(tree, name):
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            return None
    return fn, method


def _calls_of(tree: ast.Module, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name]


def _argument(call: ast.Call, index: int, param: str, default: ast.expr | None) -> ast.expr | None:
    """What ``call`` passes for the parameter (``index`` among the positional ones, -1 for one
    that is keyword-only), else its default."""
    if 0 <= index < len(call.args):
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg == param), default)


def _parameters(fn: _Function, method: bool) -> list[tuple[str, int, ast.expr | None]]:
    """(name, index among the call's positional arguments or -1, default) of each parameter a
    caller may pass (not ``self``)."""
    args = fn.args
    positional = args.args[1:] if method else args.args
    defaults: list[ast.expr | None] = [None] * (len(args.args) - len(args.defaults)) + list(args.defaults)
    out = [(a.arg, i, d) for i, (a, d) in enumerate(zip(positional, defaults[1:] if method else defaults))]
    out += [(a.arg, -1, d) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    return out


def _reads(fn: _Function, name: str) -> tuple[bool, bool]:
    """Whether ``fn``'s body reads ``name``, and whether it binds it again."""
    read = stored = False
    for stmt in fn.body:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and n.id == name:
                read |= isinstance(n.ctx, ast.Load)
                stored |= not isinstance(n.ctx, ast.Load)
            elif (isinstance(n, ast.arg) and n.arg == name) or isinstance(n, (ast.Global, ast.Nonlocal)):
                stored = True  # a nested scope's own name, or one it shares: left alone
    return read, stored


def _alike(values: list[ast.expr | None]) -> ast.expr | None:
    """The one constant every call passes, else None."""
    first = values[0] if values else None
    if not isinstance(first, ast.Constant):
        return None
    return first if all(isinstance(v, ast.Constant) and ast.dump(v) == ast.dump(first) for v in values) else None


def parameters(code: str, frozen: Frozen = frozenset()) -> list[str]:
    """Keys ``function.parameter`` of the parameters that may go: those the function never reads,
    and those every call passes the same constant for (the constant takes the parameter's place)."""
    tree = ast.parse(code)
    out: list[str] = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            continue
        found = _callee(tree, node.name, frozen)
        if found is None:
            continue
        fn, method = found
        calls = _calls_of(tree, node.name)
        for param, index, default in _parameters(fn, method):
            read, stored = _reads(fn, param)
            if stored:
                continue
            values = [_argument(c, index, param, default) for c in calls]
            if any(v is None for v in values):
                continue  # a call that passes nothing for it fails as it is: leave it
            if not read or _alike(values) is not None:
                out.append(f"{node.name}.{param}")
    return out


def drop_parameter(code: str, key: str, frozen: Frozen = frozenset()) -> str | None:
    """``code`` without the parameter ``key`` (``function.parameter``) of :func:`parameters`:
    gone from the definition and from every call, its reads replaced by the constant the calls
    passed (None if it may not go)."""
    if key not in parameters(code, frozen):
        return None
    name, _, param = key.partition(".")
    tree = ast.parse(code)
    found = _callee(tree, name, frozen)
    assert found is not None
    fn, method = found
    calls = _calls_of(tree, name)
    index, default = next((i, d) for p, i, d in _parameters(fn, method) if p == param)
    constant = _alike([_argument(c, index, param, default) for c in calls])
    if constant is not None:
        fn.body = [_Substitute({param: constant}).visit(s) for s in fn.body]
    for call in calls:
        if 0 <= index < len(call.args):
            del call.args[index]
        call.keywords = [k for k in call.keywords if k.arg != param]
    args = fn.args
    if index >= 0:
        position = index + (1 if method else 0)
        first_default = len(args.args) - len(args.defaults)
        if position >= first_default:
            del args.defaults[position - first_default]
        del args.args[position]
    else:
        at = next(i for i, a in enumerate(args.kwonlyargs) if a.arg == param)
        del args.kwonlyargs[at], args.kw_defaults[at]
    return _unparse(tree)


def _own_fields(node: ast.ClassDef) -> list[ast.AnnAssign]:
    """The fields a dataclass of the script declares itself, in order (none if it is not one;
    a base's fields come first in its calls, so a field's index here is at most its position)."""
    if not is_dataclass(node):
        return []
    return [
        s
        for s in node.body
        if isinstance(s, ast.AnnAssign)
        and isinstance(s.target, ast.Name)
        and "ClassVar" not in ast.unparse(s.annotation)
    ]


def fields(code: str, frozen: Frozen = frozenset()) -> list[str]:
    """Keys ``Class.field`` of the fields of the script's own dataclasses that nothing reads:
    no attribute and no word of a string has the field's name, every keyword of that name is
    passed to the class itself, and no call of the class passes it by position."""
    tree = ast.parse(code)
    read: set[str] = set()
    keywords: dict[str, set[int]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            read.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            read.update(WORD.findall(node.value))
        elif isinstance(node, ast.Call):
            for k in node.keywords:
                if k.arg:
                    keywords.setdefault(k.arg, set()).add(id(node))
    out: list[str] = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or node.name in frozen:
            continue
        calls = _calls_of(tree, node.name)
        positional = max((len(c.args) for c in calls), default=0)
        if any(isinstance(a, ast.Starred) for c in calls for a in c.args) or any(
            k.arg is None for c in calls for k in c.keywords
        ):
            continue  # what a call passes cannot be told
        ours = {id(c) for c in calls}
        for index, field in enumerate(_own_fields(node)):
            assert isinstance(field.target, ast.Name)
            name = field.target.id
            if name not in read and index >= positional and keywords.get(name, set()) <= ours:
                out.append(f"{node.name}.{name}")
    return out


def drop_field(code: str, key: str, frozen: Frozen = frozenset()) -> str | None:
    """``code`` without the field ``key`` (``Class.field``) of :func:`fields`: gone from the
    class and from every call of it (what the calls passed for it goes with them)."""
    if key not in fields(code, frozen):
        return None
    name, _, field = key.partition(".")
    tree = ast.parse(code)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    cls.body = [s for s in cls.body if not (isinstance(s, ast.AnnAssign) and ast.unparse(s.target) == field)] or [
        ast.Pass()
    ]
    for call in _calls_of(tree, name):
        call.keywords = [k for k in call.keywords if k.arg != field]
    return _unparse(tree)


class _Replace(ast.NodeTransformer):
    def __init__(self, old: ast.AST, new: ast.AST) -> None:
        self.old, self.new = old, new

    def visit(self, node: ast.AST) -> ast.AST:
        return self.new if node is self.old else super().visit(node)


def _stores(fn: _Function) -> dict[str, int]:
    """How often each name is bound in ``fn`` (a binding in a loop counts twice)."""
    stores: dict[str, int] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            stores[node.id] = stores.get(node.id, 0) + 1
        elif isinstance(node, ast.arg):
            stores[node.arg] = stores.get(node.arg, 0) + 1
        elif isinstance(node, ast.alias):
            name = node.asname or node.name.split(".")[0]
            stores[name] = stores.get(name, 0) + 1
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not fn:
            stores[node.name] = stores.get(node.name, 0) + 1
    for loop in [n for n in ast.walk(fn) if isinstance(n, (ast.For, ast.AsyncFor, ast.While))]:
        for node in ast.walk(loop):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                stores[node.id] = stores.get(node.id, 0) + 2
    return stores


def propagate_aliases(tree: ast.Module) -> ast.Module:
    """In each function, a local bound once (not in a loop) to a constant or to a name bound at
    most once (``tp = 1``, ``forward = model``) is replaced by what it is bound to, and the
    binding goes; so is a display read once where only its items matter
    (:func:`_displays_read_once`)."""
    aliases_replaced(tree)
    return tree


def aliases_replaced(tree: ast.Module) -> bool:
    """:func:`propagate_aliases` on ``tree`` in place: whether it replaced any."""
    replaced = False
    modules = {a.asname or a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        if any(isinstance(n, (ast.Global, ast.Nonlocal, ast.ClassDef)) for n in ast.walk(fn)):
            continue
        stores = _stores(fn)
        alias: dict[str, ast.expr] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                target, value = node.targets[0].id, node.value
                if stores.get(target) != 1:
                    continue
                if isinstance(value, ast.Constant) or (isinstance(value, ast.Name) and stores.get(value.id, 0) <= 1):
                    alias[target] = value
                elif _module_attribute(value, modules, stores):
                    alias[target] = value  # dtype = torch.float32
        alias.update(_displays_read_once(fn, stores, alias))
        for name in list(alias):  # a chain ends at what its last alias is bound to
            seen = {name}
            value = alias[name]
            while isinstance(value, ast.Name) and value.id in alias and value.id not in seen:
                seen.add(value.id)
                value = alias[value.id]
            alias[name] = value
        if alias:
            _Substitute(alias).visit(fn)
            replaced = True
    return replaced


def chain_root(node: ast.expr) -> ast.Name | None:
    """The name an attribute chain starts at (``torch`` for ``torch.nn.Linear``), else None."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node if isinstance(node, ast.Name) else None


def _module_attribute(node: ast.expr, modules: set[str], stores: dict[str, int]) -> bool:
    """An attribute chain off a module the script imports at its top and the function does not
    rebind (``torch.float32``): the same object wherever it is read."""
    root = chain_root(node)
    return isinstance(node, ast.Attribute) and root is not None and root.id in modules and root.id not in stores


def _settled(node: ast.expr, stores: dict[str, int]) -> bool:
    """An expression that evaluates to the same objects wherever it is read: constants, names
    bound at most once, their attributes and constant subscripts, and displays of these."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name):
        return stores.get(node.id, 0) <= 1
    if isinstance(node, ast.Attribute):
        return _settled(node.value, stores)
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and _settled(node.value, stores)
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(not isinstance(e, ast.Starred) and _settled(e, stores) for e in node.elts)
    return False


def _displays_read_once(fn: _Function, stores: dict[str, int], taken: dict[str, ast.expr]) -> dict[str, ast.expr]:
    """Locals bound once (not in a loop) to a list or tuple display of settled items and read
    once, where only the items matter: indexed (``x[0]``), iterated (a ``for`` or a
    comprehension over it, ``iter(x)``, ``enumerate(x)``). Written in place, the display meets
    the folds of displays (``[a][0]`` is ``a``)."""
    reads: dict[str, list[ast.Name]] = {}
    where: set[int] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            reads.setdefault(node.id, []).append(node)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            where.add(id(node.value))
        elif isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.iter, ast.Name):
            where.add(id(node.iter))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("iter", "enumerate")
            and len(node.args) == 1
            and isinstance(node.args[0], ast.Name)
        ):
            where.add(id(node.args[0]))
    out: dict[str, ast.expr] = {}
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name, value = node.targets[0].id, node.value
        read = reads.get(name, [])
        if name in taken or stores.get(name) != 1 or len(read) != 1 or id(read[0]) not in where:
            continue
        if not isinstance(value, (ast.List, ast.Tuple)):
            continue
        if _settled(value, stores) and name not in {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}:
            out[name] = value
    return out


class _Substitute(ast.NodeTransformer):
    def __init__(self, alias: dict[str, ast.expr]) -> None:
        self.alias = alias

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and node.id in self.alias:
            return ast.copy_location(copy.deepcopy(self.alias[node.id]), node)
        return node

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        for field in _COMPOUND_BODIES:
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                kept = [s for s in stmts if not self._binding(s)]
                setattr(node, field, kept or ([ast.Pass()] if field == "body" else []))
        return node

    def _binding(self, stmt: ast.stmt) -> bool:
        return (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id in self.alias
        )


# -- cut 4: a compound statement unwrapped -------------------------------------------------------


def _head(node: ast.stmt) -> str | None:
    """The first line of a compound statement that may be unwrapped, else None."""
    if isinstance(node, (ast.With, ast.If, ast.Try)) or (
        isinstance(node, ast.For)
        and not node.orelse
        and not any(isinstance(n, (ast.Break, ast.Continue)) for n in ast.walk(node))
    ):
        return ast.unparse(node).splitlines()[0]
    return None


def _compounds(tree: ast.Module, frozen: Frozen) -> list[tuple[str, ast.stmt, list[ast.stmt]]]:
    out: list[tuple[str, ast.stmt, list[ast.stmt]]] = []
    seen: dict[str, int] = {}
    for node, stmts in units(tree, frozen):
        head = _head(node)
        if head is not None:
            seen[head] = seen.get(head, 0) + 1
            out.append((f"{head}#{seen[head]}", node, stmts))
    return out


def compounds(code: str, frozen: Frozen = frozenset()) -> list[str]:
    """Keys of the compound statements that may be unwrapped, outermost first."""
    return [key for key, _, _ in _compounds(ast.parse(code), frozen)]


def unwrap(code: str, key: str, frozen: Frozen = frozenset()) -> str | None:
    """``code`` with the compound statement ``key`` replaced by its body: a ``with`` without its
    context managers (their ``as`` names bound to them), an ``if`` or a ``try`` without its test
    or handlers, a ``for`` by its first iteration (``target = next(iter(iterable))``)."""
    tree = ast.parse(code)
    for found, node, stmts in _compounds(tree, frozen):
        if found != key:
            continue
        body: list[ast.stmt]
        if isinstance(node, ast.With):
            body = [ast.Assign([item.optional_vars], item.context_expr) for item in node.items if item.optional_vars]
            body += node.body
        elif isinstance(node, ast.For):
            first = ast.parse("next(iter(x))", mode="eval").body
            assert isinstance(first, ast.Call) and isinstance(first.args[0], ast.Call)
            first.args[0].args = [node.iter]
            body = [ast.Assign([node.target], first), *node.body]
        elif isinstance(node, ast.Try):
            body = [*node.body, *node.orelse, *node.finalbody]
        else:
            assert isinstance(node, ast.If)
            body = list(node.body)
        index = next(i for i, s in enumerate(stmts) if s is node)
        stmts[index : index + 1] = body
        return _unparse(tree)
    return None


#: A ``for`` loop over a literal is written out (:func:`unroll_loop`) if it has at most this
#: many items, and a body of at most :data:`MAX_UNROLLED_BODY` statements.
MAX_UNROLLED = 8
MAX_UNROLLED_BODY = 12


def _constants(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return True
    return isinstance(node, ast.Tuple) and all(_constants(e) for e in node.elts)


def _class_attribute(node: ast.expr) -> bool:
    """``Name.attr``: an enum member, a class's constant (what the loop body may not rebind)."""
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and isinstance(node.ctx, ast.Load)


def _loop_aliases(node: ast.For) -> list[dict[str, ast.expr]] | None:
    """Per item of ``node``'s literal iterable, what each target name is bound to, if the loop
    can be written out: constants (or tuples of them) or class attributes (``Item.MODEL``, of
    a name the body never binds) unpacked into names the body never binds,
    and no function or class in the body that could read a target name later."""
    items = node.iter.elts if isinstance(node.iter, (ast.List, ast.Tuple)) else None
    if not items or len(items) > MAX_UNROLLED or not all(_constants(e) or _class_attribute(e) for e in items):
        return None
    walked = [n for stmt in node.body for n in ast.walk(stmt)]
    bound = {n.id for n in walked if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    if any(isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id in bound for e in items):
        return None
    if len(node.body) > MAX_UNROLLED_BODY or node.orelse:
        return None
    if isinstance(node.target, ast.Name):
        names = [node.target.id]
        rows = [[item] for item in items]
    elif isinstance(node.target, ast.Tuple) and all(isinstance(t, ast.Name) for t in node.target.elts):
        names = [t.id for t in node.target.elts if isinstance(t, ast.Name)]
        if not all(isinstance(e, ast.Tuple) and len(e.elts) == len(names) for e in items):
            return None
        rows = [list(e.elts) for e in items if isinstance(e, ast.Tuple)]
    else:
        return None
    late = (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Global, ast.Nonlocal)
    if bound & set(names) or any(isinstance(n, (*late, ast.Break, ast.Continue)) for n in walked):
        return None
    return [dict(zip(names, row)) for row in rows]


def literal_loops(code: str, frozen: Frozen = frozenset()) -> list[str]:
    """Keys (as :func:`compounds`) of the ``for`` loops :func:`unroll_loop` can write out."""
    return [
        key
        for key, node, _ in _compounds(ast.parse(code), frozen)
        if isinstance(node, ast.For) and _loop_aliases(node) is not None
    ]


def unroll_loop(code: str, key: str, frozen: Frozen = frozenset()) -> str | None:
    """``code`` with the ``for`` loop ``key`` over a literal written out: its body once per item,
    the target names replaced by the item's values (``for api, path in [('checkpoint', ''),
    ...]: if api == 'checkpoint': ...`` becomes one copy per step, whose tests are then
    constants). Longer than the loop at first; the cuts and folds that follow shorten it."""
    tree = ast.parse(code)
    for found, node, stmts in _compounds(tree, frozen):
        if found != key or not isinstance(node, ast.For):
            continue
        aliases = _loop_aliases(node)
        if aliases is None:
            return None
        body: list[ast.stmt] = []
        for alias in aliases:
            copy_ = ast.Module(body=copy.deepcopy(node.body), type_ignores=[])
            body += _Substitute(alias).visit(copy_).body
        index = next(i for i, s in enumerate(stmts) if s is node)
        stmts[index : index + 1] = body
        return _unparse(tree)
    return None


# -- cut 5: an element of a literal, a keyword argument, a comprehension's condition -------------


def _inner_statements(tree: ast.Module, frozen: Frozen) -> list[ast.stmt]:
    """The statements whose parts the elements and branches cuts take: those that may be cut,
    and the assignments of the harness's own body (not those of its exception check)."""
    statements = [stmt for stmt, _ in units(tree, frozen)]
    for top in tree.body:
        if isinstance(top, ast.FunctionDef) and _harness(top):
            statements += [n for n in top.body if isinstance(n, ast.Assign)]
    return statements


def _elements(tree: ast.Module, frozen: Frozen) -> list[tuple[ast.AST, str, int]]:
    """(node, field, index) of every keyword argument of a call, every element of a dict,
    list, tuple or set display, every operand of ``and`` / ``or`` and every condition of a
    comprehension (``for i in (1,) if key(i) in out``) in the statements that may be cut (not
    in their decorators: a cut of ``frozen=True`` saves no line and hides that nothing changes
    the class's objects from the rewrites of :mod:`fuzz.repro.simplify`), and
    in the assignments of the harness's own body (``failure = judge(...) or check()``; not
    those of its exception check), in order."""
    seen: dict[int, tuple[ast.AST, str, int]] = {}
    for stmt in _inner_statements(tree, frozen):
        decorators = {  # ``@dataclass(frozen=True)``: shorter without it, and the rewrites need it
            id(n)
            for d in ast.walk(stmt)
            if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            for decorator in d.decorator_list
            for n in ast.walk(decorator)
        }
        for node in ast.walk(stmt):
            if id(node) in decorators:
                continue
            if isinstance(node, ast.BoolOp):
                fields = [("values", i) for i in range(len(node.values))]
            elif isinstance(node, ast.Call):
                fields = [("keywords", i) for i, k in enumerate(node.keywords) if k.arg]
            elif isinstance(node, ast.Dict):
                fields = [("keys", i) for i, k in enumerate(node.keys) if k is not None]
            elif isinstance(node, (ast.List, ast.Tuple, ast.Set)) and not isinstance(
                getattr(node, "ctx", None), (ast.Store, ast.Del)
            ):
                fields = [("elts", i) for i, e in enumerate(node.elts) if not isinstance(e, ast.Starred)]
            elif isinstance(node, ast.comprehension):
                fields = [("ifs", i) for i in range(len(node.ifs))]
            else:
                continue
            for field, i in fields:
                seen.setdefault(hash((id(node), field, i)), (node, field, i))
    return list(seen.values())


def cut_element(code: str, index: int, frozen: Frozen = frozenset()) -> str | None:
    """``code`` without the element numbered ``index`` in :func:`_elements`' order."""
    tree = ast.parse(code)
    found = _elements(tree, frozen)
    if index >= len(found):
        return None
    node, field, i = found[index]
    if field == "keys":
        assert isinstance(node, ast.Dict)
        del node.keys[i], node.values[i]
    else:
        del getattr(node, field)[i]
    if isinstance(node, ast.BoolOp) and len(node.values) == 1:
        _Replace(node, node.values[0]).visit(tree)
    return _unparse(tree)


def _receivers(tree: ast.Module, frozen: Frozen) -> list[ast.Call]:
    """Every method call (``x.to(dtype)``, ``model.get_submodule('')``) in the statements that
    may be cut whose value is used (not a statement of its own: cutting that statement is
    tried already), outermost first."""
    modules = {
        a.asname or a.name.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    seen: dict[int, ast.Call] = {}
    for stmt, _ in units(tree, frozen):
        statements = {id(n.value) for n in ast.walk(stmt) if isinstance(n, ast.Expr)}
        for node in ast.walk(stmt):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)) or id(node) in statements:
                continue
            receiver = node.func.value
            if isinstance(receiver, ast.Name) and receiver.id in modules:
                continue  # a module's function (torch.randn): no object to keep
            if isinstance(receiver, ast.Constant):
                continue  # '.'.join(...), 'x'.format(...)
            seen.setdefault(id(node), node)
    return list(seen.values())


def cut_receiver(code: str, index: int, frozen: Frozen = frozenset()) -> str | None:
    """``code`` with the method call numbered ``index`` in :func:`_receivers`' order replaced by
    the object it is called on (``x.to(dtype)`` by ``x``: a cast, copy or lookup the failure
    does not need)."""
    tree = ast.parse(code)
    found = _receivers(tree, frozen)
    if index >= len(found):
        return None
    call = found[index]
    assert isinstance(call.func, ast.Attribute)
    _Replace(call, call.func.value).visit(tree)
    return _unparse(tree)


#: How deep :func:`_arguments` looks for a call's replacement: its arguments, and theirs.
ARGUMENT_DEPTH = 2


def _arguments(tree: ast.Module, frozen: Frozen) -> list[tuple[ast.Call, ast.expr]]:
    """(call, expression) for every call in the statements that may be cut whose value is used
    (not a statement of its own: cutting that statement is tried already) and each positional
    argument of it that is not a constant, then each such argument of an argument that is a
    call itself (:data:`ARGUMENT_DEPTH`), outermost calls first."""
    seen: dict[tuple[int, int], tuple[ast.Call, ast.expr]] = {}

    def positional(call: ast.Call) -> list[ast.expr]:
        return [a for a in call.args if not isinstance(a, ast.Starred)]

    for stmt, _ in units(tree, frozen):
        statements = {id(n.value) for n in ast.walk(stmt) if isinstance(n, ast.Expr)}
        for node in ast.walk(stmt):
            if not isinstance(node, ast.Call) or id(node) in statements:
                continue
            level = positional(node)
            for _ in range(ARGUMENT_DEPTH):
                for arg in level:
                    if not isinstance(arg, ast.Constant):  # a value in place of a call: rarely the same failure
                        seen.setdefault((id(node), id(arg)), (node, arg))
                level = [a for arg in level if isinstance(arg, ast.Call) for a in positional(arg)]
    return list(seen.values())


def _replaced(
    code: str,
    index: int,
    frozen: Frozen,
    pairs: Callable[[ast.Module, Frozen], Sequence[tuple[ast.expr, ast.expr]]],
) -> str | None:
    """``code`` with the expression of the pair numbered ``index`` in ``pairs``' order replaced
    by that pair's other expression, or None past the last pair."""
    tree = ast.parse(code)
    found = pairs(tree, frozen)
    if index >= len(found):
        return None
    old, new = found[index]
    _Replace(old, new).visit(tree)
    return _unparse(tree)


def cut_to_argument(code: str, index: int, frozen: Frozen = frozenset()) -> str | None:
    """``code`` with the call of the pair numbered ``index`` in :func:`_arguments`' order
    replaced by that pair's argument (``json.loads(json.dumps(obs))`` by ``obs``,
    ``float(total)`` by ``total``: a conversion, copy or wrapper the failure does not need)."""
    return _replaced(code, index, frozen, _arguments)


def _conditionals(tree: ast.Module, frozen: Frozen) -> list[tuple[ast.IfExp, ast.expr]]:
    """(conditional expression, branch) for each branch of every ``a if t else b`` in the
    statements :func:`_elements` looks in, outermost first."""
    seen: dict[int, ast.IfExp] = {}
    for stmt in _inner_statements(tree, frozen):
        for node in ast.walk(stmt):
            if isinstance(node, ast.IfExp):
                seen.setdefault(id(node), node)
    return [(node, branch) for node in seen.values() for branch in (node.body, node.orelse)]


def cut_to_branch(code: str, index: int, frozen: Frozen = frozenset()) -> str | None:
    """``code`` with the conditional expression of the pair numbered ``index`` in
    :func:`_conditionals`' order replaced by that pair's branch (``failure if failure is None or
    not failure.signature.endswith(TAG) else None`` by ``failure``: a test the failure does not
    need, with what only it read)."""
    return _replaced(code, index, frozen, _conditionals)


def _each_position(
    count: Callable[[ast.Module, Frozen], int],
    cut: Callable[[str, int, Frozen], str | None],
    current: Callable[[], str],
    keep: Callable[[str | None], bool],
    until: float,
    frozen: Frozen,
) -> None:
    """``cut`` tried at each position (0 to ``count`` - 1) in turn; where one is kept, the same
    position holds the next candidate."""
    index = 0
    while time.monotonic() < until:
        if index >= count(ast.parse(current()), frozen):
            return
        if not keep(cut(current(), index, frozen)):
            index += 1


def _each_element(current: Callable[[], str], keep: Callable[[str | None], bool], until: float, frozen: Frozen) -> None:
    _each_position(lambda t, f: len(_elements(t, f)), cut_element, current, keep, until, frozen)


def _each_branch(current: Callable[[], str], keep: Callable[[str | None], bool], until: float, frozen: Frozen) -> None:
    _each_position(lambda t, f: len(_conditionals(t, f)), cut_to_branch, current, keep, until, frozen)


def _each_receiver(
    current: Callable[[], str], keep: Callable[[str | None], bool], until: float, frozen: Frozen
) -> None:
    _each_position(lambda t, f: len(_receivers(t, f)), cut_receiver, current, keep, until, frozen)


def _each_argument(
    current: Callable[[], str], keep: Callable[[str | None], bool], until: float, frozen: Frozen
) -> None:
    _each_position(lambda t, f: len(_arguments(t, f)), cut_to_argument, current, keep, until, frozen)


# -- cut 0: the case's objects by their fields ---------------------------------------------------


def propagate_objects(code: str, frozen: Frozen = frozenset()) -> str | None:
    """``code`` with every field read off a dataclass object built by keywords in the script
    (``case.body.tree``, where ``case = Case(body=ParityBody(tree=...))``, or a local bound once
    to such an object) replaced by the expression it was built with (None if there is none).
    The objects are built several times over, then: the case's classes often go once nothing
    passes the case whole any more."""
    tree = ast.parse(code)
    classes = {
        n.name
        for n in tree.body
        if isinstance(n, ast.ClassDef)
        and is_dataclass(n)
        and not any(
            isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == "__post_init__" for s in n.body
        )
    }
    changed = False
    for top in tree.body:
        if not isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)) or _untouched(top, frozen):
            continue
        for fn in [n for n in ast.walk(top) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for _ in range(8):  # a field of a field: one level a time
                fields = _Fields(classes, _objects(fn, classes))
                for stmt in fn.body:
                    fields.visit(stmt)
                if not fields.changed:
                    break
                changed = True
    return _unparse(tree) if changed else None


def _built(node: ast.expr, classes: set[str]) -> ast.Call | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in classes:
        return node
    return None


def _objects(fn: _Function, classes: set[str]) -> dict[str, ast.Call]:
    """The locals of ``fn`` bound once, to an object of one of ``classes`` built in place."""
    stores = _stores(fn)
    objects: dict[str, ast.Call] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            call = _built(node.value, classes)
            if call is not None and stores.get(node.targets[0].id) == 1:
                objects[node.targets[0].id] = call
    return objects


class _Fields(ast.NodeTransformer):
    def __init__(self, classes: set[str], objects: dict[str, ast.Call]) -> None:
        self.classes, self.objects, self.changed = classes, objects, False

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load):
            return node
        base = node.value
        call = self.objects.get(base.id) if isinstance(base, ast.Name) else _built(base, self.classes)
        for kw in call.keywords if call is not None else []:
            if kw.arg == node.attr:
                self.changed = True
                return ast.copy_location(copy.deepcopy(kw.value), node)
        return node
