"""Specialization: a reduced script as one module that runs the entry's case and checks its failure.

After the trace passes (:mod:`fuzz.repro.reduce`), the carried modules are flattened into the
script (:mod:`fuzz.repro.flatten`) under a ``main`` that runs the case and checks the failure
(:mod:`fuzz.repro.harness`); then the script is specialized to the case, each step kept only if
the failure still reproduces:

- **Folding** (:mod:`fuzz.repro.fold`): a run of the script instrumented to record, on every
  rank, the values of the attributes read off the case's model objects, the results of the
  model's functions and methods, and the outcome of every test in the rank code; then each
  such expression whose value was one literal on every rank and every time becomes that
  literal, an ``if`` whose test became constant becomes the branch it took, and what nothing
  refers to any more goes (unused-names pass), the model's classes and the case's fields with
  them.
- **Delta debugging** over the statements left (:func:`fuzz.repro.reduce.ddmin`).

The oracle runs the script under ``torchrun --standalone --nproc-per-node N``.
"""

from __future__ import annotations

import ast
import re
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fuzz.corpus import Entry
from fuzz.repro import script as _script
from fuzz.repro.flatten import flatten
from fuzz.repro.fold import clean, drop_unnamed_functions, fold, instrument, read_records
from fuzz.repro.harness import ATTEMPT, case_expression, current_harness, is_plain, main_source
from fuzz.repro.printed import is_printed
from fuzz.signature import Signature

#: The module name a flat script's code is kept under by the reducer's passes.
FLAT = "__main__"
#: Rounds of folding: a second round rarely finds more than a site or two.
ROUNDS = 1
#: Calls that register a property: a flat script calls its judge directly.
REGISTRATIONS = {"register"}


#: Lines of 96 characters at most that a reduced script's docstring gives what was observed:
#: the entry's summary may hold a whole traceback, which the issue Markdown (``--issue``) and the
#: entry keep.
OBSERVED_LINES = 2


def observed(entry: Entry) -> str:
    """What a rank saw, from the entry's summary: a known bug's summary ends in it, in
    parentheses (``... (rank 0 raised KeyError: 'x')``), after the bug's own words; else the
    summary's first line."""
    flat = " ".join(entry.summary.split())
    at = flat.rfind("(rank ")
    if at > 0 and flat.endswith(")"):
        return flat[at + 1 : -1]
    return " ".join(entry.summary.strip().partition("\n")[0].split())


def docstring(entry: Entry, source: str, signature: str, plain: bool = False) -> str:
    """What the reduced script reproduces (the entry, its signature, the known bug and its
    upstream issue), what was observed (the summary's first line, at most
    :data:`OBSERVED_LINES`), and how to run it: short, as the head of a script for an issue.
    ``plain``: the script is an exception's plain form (:func:`fuzz.repro.harness.plain`)."""
    import textwrap

    name = Path(source).name if source else entry.file_name
    lines = [f"Reproduces shardfuzz corpus entry {name}: {signature}"]
    if entry.status == "known" and entry.bug:
        from fuzz import known

        upstream, url = _script.upstream_of(entry)
        said = f"Known torch bug: {known.get(entry.bug).title}; upstream: {url or upstream or 'not linked'}."
        lines += textwrap.wrap(said, 96)
    lines += textwrap.wrap(f"Observed: {observed(entry)}", 96, max_lines=OBSERVED_LINES, placeholder=" ...")
    expected = {
        "exception": "no rank raises",
        "crash": "no rank dies",
        "hang": "every rank finishes",
        "mismatch": "the property's judge finds nothing",
    }[entry.kind]
    run = f"Run: torchrun --nproc-per-node {entry.case.world_size} THIS_FILE.py"
    if plain:
        raised = Signature.parse(signature)
        what = f"{raised.check} in {raised.where}" if raised is not None and raised.check else signature
        said = f"{run}: while the failure is there a rank raises {what}, prints its traceback and REPRODUCED "
        said += "and exits 1;"
    else:
        said = f"{run}: while the failure is there a rank prints REPRODUCED and exits 1;"
    said += f" once it is gone rank 0 prints PASS and every rank exits 0 (expected: {expected});"
    said += " a rank exits 2 where the script cannot run (not under torchrun, another world size) or the case"
    said += " fails another way (it prints FAIL). torchrun's own status is 1 whenever a rank's is not 0."
    lines += textwrap.wrap(said, 96)
    return "\n".join(lines)


def current(script: str, entry: Entry, source: str = "") -> str:
    """A kept script with the harness (:func:`fuzz.repro.harness.current_harness`) and the
    comments that say how to run it as they are now; its header line and its case unchanged."""
    from fuzz.repro.reduce import HEADER

    if is_printed(script):  # printed from the case: no carried harness
        return script
    text = current_harness(script, entry)
    lines = text.splitlines(keepends=True)
    cut = next((i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")), len(lines))
    head = [line for line in lines[:cut] if line.startswith(("#!", HEADER))]
    said = re.search(r"^# Reproduces shardfuzz corpus entry \S+: (.+)$", "".join(lines[:cut]), re.MULTILINE)
    signature = said[1].strip() if said else entry.signature
    comments = docstring(entry, source, signature, plain=is_plain(text)).splitlines()
    return "".join(head) + "".join(f"# {line}\n" for line in comments) + "\n" + "".join(lines[cut:])


#: Where each top-level name of a flat script came from: flat name -> (module, name).
Origins = dict[str, tuple[str, str]]


def _drop_registrations(tree: ast.Module) -> None:
    """Top-level ``NAME = register(...)`` whose name nothing reads."""
    from fuzz.repro.reduce import _refs

    total = _refs(tree)

    def registration(node: ast.stmt) -> bool:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            return False
        func = node.value.func
        if not (isinstance(func, ast.Name) and func.id in REGISTRATIONS):
            return False
        own = _refs(node)
        return all(isinstance(t, ast.Name) and total[t.id] - own[t.id] <= 0 for t in node.targets)

    tree.body = [n for n in tree.body if not registration(n)]


def _drop_unused(tree: ast.Module) -> ast.Module:
    from fuzz.repro.reduce import drop_unused

    _drop_registrations(tree)
    trees = {FLAT: tree}
    drop_unused(trees, Counter())
    return trees[FLAT]


def flat_tree(modules: dict[str, str], main: str) -> tuple[ast.Module, Origins]:
    """The flat module of ``modules`` (those ``main`` needs) under ``main``, nothing unused left."""
    tree, origins = flatten(modules, main)
    tree.body.append(ast.parse('if __name__ == "__main__":\n    main()').body[0])
    tree = _Annotations().visit(tree)
    return _drop_unused(ast.fix_missing_locations(tree)), origins


class _Annotations(ast.NodeTransformer):
    """Variable annotations say nothing a run needs: a dataclass field's becomes ``object``
    (``ClassVar`` ones stay: they are not fields), a local's goes."""

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        node.body = [self._field(n) if isinstance(n, ast.AnnAssign) else self.visit(n) for n in node.body]
        return node

    def _field(self, node: ast.AnnAssign) -> ast.stmt:
        if "ClassVar" not in ast.unparse(node.annotation):
            node.annotation = ast.Name("object", ast.Load())
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST | None:
        if node.value is None or not isinstance(node.target, ast.Name):
            return None if node.value is None else node
        return ast.copy_location(ast.Assign([node.target], node.value), node)


def render_flat(entry: Entry, source: str, signature: str, code: str, header: str = "") -> str:
    """The script: shebang, header comment, :func:`docstring` as a comment (prose for the reader,
    as in an issue's script), then ``code`` (a flat module)."""
    said = docstring(entry, source, signature, plain=is_plain(code))
    parts = ["#!/usr/bin/env python3", *([header] if header else []), *(f"# {line}" for line in said.splitlines())]
    return "\n".join(parts) + "\n\n" + code


def initial(entry: Entry, modules: dict[str, str], signature: str) -> tuple[str, Origins]:
    """(the flat module's code for ``modules``, where its names came from)."""
    main, _ = main_source(entry, signature)
    tree, origins = flat_tree(modules, main)
    return ast.unparse(tree) + "\n", origins


def _case_functions() -> list[Callable[..., Any]]:
    """Judge-side functions whose value is a function of the case alone: a mismatch's script
    gets their value for its case as a literal (the API family and tags a mismatch is charged
    to come from the known-bug registry's conditions, which the script need not carry)."""
    from fuzz.properties.parity import api_of

    return [api_of]


class _CaseCalls(ast.NodeTransformer):
    def __init__(self, functions: dict[str, Callable[..., Any]], scope: dict[str, Any]) -> None:
        self.functions, self.scope, self.folded = functions, scope, 0

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        fn = self.functions.get(node.func.id) if isinstance(node.func, ast.Name) else None
        if fn is None:
            return node
        try:  # the arguments, as the judge writes them, over the entry's own case
            args = [eval(ast.unparse(a), {}, dict(self.scope)) for a in node.args]
            kwargs = {k.arg: eval(ast.unparse(k.value), {}, dict(self.scope)) for k in node.keywords if k.arg}
            value = fn(*args, **kwargs)
        except Exception:  # an argument the case alone does not give
            return node
        if not isinstance(value, (str, int, float, bool, type(None))):
            return node
        self.folded += 1
        return ast.copy_location(ast.Constant(value), node)


def fold_case_functions(code: str, entry: Entry, origins: Origins) -> str | None:
    """``code`` with the calls of :func:`_case_functions` whose arguments are the case's (``body.
    composition``, ``case.world_size``, literals) replaced by their value for ``entry``'s case
    (None if there is none)."""
    flat_of = {origin: flat for flat, origin in origins.items()}
    functions = {
        flat_of[(fn.__module__, fn.__name__)]: fn for fn in _case_functions() if (fn.__module__, fn.__name__) in flat_of
    }
    if not functions:
        return None
    tree = ast.parse(code)
    calls = _CaseCalls(functions, {"case": entry.case, "body": entry.case.body})
    tree = calls.visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n" if calls.folded else None


def _case_assignment(tree: ast.Module) -> ast.Assign | None:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in ("main", ATTEMPT):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and ast.unparse(stmt.targets[0]) == "case":
                    return stmt
    return None


def shrink_case(code: str, entry: Entry, origins: Origins) -> str:
    """The case's expression in ``main`` without the fields nothing reads any more (those with a
    default), and what only they needed; repeated until nothing changes."""
    from fuzz.repro.reduce import _refs

    flat_of = {origin: flat for flat, origin in origins.items()}
    for _ in range(4):
        tree = ast.parse(code)
        assign = _case_assignment(tree)
        if assign is None:
            return code
        assign.value = ast.Constant(None)
        keep = set(_refs(tree))
        expression, classes = case_expression(entry.case, keep)
        value = ast.parse(expression, mode="eval").body
        for node in ast.walk(value):
            if isinstance(node, ast.Name) and (classes.get(node.id), node.id) in flat_of:
                node.id = flat_of[(classes[node.id], node.id)]
        assign.value = value
        shrunk = ast.unparse(_drop_unused(tree)) + "\n"
        if shrunk == code:
            return code
        code = shrunk
    return code


def _folded(code: str, records: dict[int, set[str]], rank: set[str], entry: Entry, origins: Origins) -> tuple[str, int]:
    """(``code`` folded to ``records`` and cleaned up, how many sites were folded)."""
    folded, count = fold(code, records, rank)
    for _ in range(2):
        folded = shrink_case(ast.unparse(_drop_unused(ast.parse(clean(folded)))) + "\n", entry, origins)
    return folded, count


def tidy(code: str, entry: Entry, origins: Origins) -> str:
    """``code`` without what a cut left idle: statements that only call a function without a
    body (:func:`fuzz.repro.delta.drop_idle_calls`), locals that only name another value
    (:func:`fuzz.repro.delta.propagate_aliases`), what folding's clean-up drops
    (:func:`fuzz.repro.fold.clean`), the definitions and the case's fields nothing refers to,
    the functions nothing names (:func:`fuzz.repro.fold.drop_unnamed_functions`)."""
    from fuzz.repro.delta import drop_idle_calls, propagate_aliases

    code = clean(ast.unparse(propagate_aliases(drop_idle_calls(ast.parse(code)))) + "\n")
    tree = drop_unnamed_functions(_drop_unused(ast.parse(code)))
    return shrink_case(ast.unparse(tree) + "\n", entry, origins)


def specialize(
    code: str,
    entry: Entry,
    signature: str,
    origins: Origins,
    test: Callable[[str], bool],
    *,
    timeout: float,
    say: Callable[[str], None] = lambda _: None,
) -> str:
    """``code`` folded to the case (see the module's docstring), each step kept if ``test`` holds."""
    from fuzz.repro.reduce import reproduced, run_script

    model = {flat for flat, (module, _) in origins.items() if module.startswith("fuzz.model")}
    rank = {flat for flat, (module, _) in origins.items() if module.startswith(("fuzz._rank", "fuzz.model"))}
    for round_ in range(ROUNDS):
        with tempfile.TemporaryDirectory(prefix="shardfuzz-fold-") as tmp:
            instrumented = render_flat(entry, "", signature, instrument(code, model, rank, tmp))
            status, output, _ = run_script(instrumented, timeout=timeout, nproc=entry.case.world_size)
            if reproduced(status, output) != signature:
                say(f"  fold {round_}: the instrumented script does not reproduce; left as it is")
                return code
            records = read_records(Path(tmp))
        try:
            candidate, count = _folded(code, records, rank, entry, origins)
        except (SyntaxError, ValueError, TypeError, KeyError, RecursionError) as e:
            say(f"  fold {round_}: not folded ({type(e).__name__}: {e})")
            return code
        say(f"  fold {round_}: {count} sites folded")
        if candidate == code or not test(candidate):
            return code
        code = candidate
    return code
