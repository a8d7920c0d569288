"""Reduction: shrink a corpus entry's reproducer script while its failure still reproduces.

The unreduced script (:mod:`fuzz.repro.script`) runs once, traced; every later candidate is a
flat script, run under ``torchrun --standalone --nproc-per-node N`` or in a rank pool (below),
and is kept only if it reproduces: ``REPRODUCED`` with the signature the unreduced script
printed (a candidate that passes, fails otherwise or times out is rejected). The passes,
cheapest first:

1. **Trace.** The unreduced script runs once with ``REPRO_TRACE=DIR`` (honoured by
   :mod:`fuzz.repro.runtime`): every process (launcher, ranks, judge) writes the lines of the
   carried modules it ran. Then, in every carried module, a function or method that no process
   ran is dropped (or, where its name is still referred to, left as a stub ``...``), and inside
   the functions that ran, every statement that did not run is dropped: branches never taken,
   ``except`` clauses never entered (a ``try`` left without one becomes its body), loops never
   entered. Docstrings and the annotations of functions go too.
2. **Unused names.** Top-level functions, classes, assignments and imported names that nothing
   left refers to (by name, attribute or string) are dropped, until nothing changes; then the
   modules nothing imports any more.
3. **Flattening and the failure's own check** (:mod:`fuzz.repro.specialize`): the modules the
   case needs become one module under a ``main`` that runs the body's rank program on every
   rank and checks the failure's kind (:mod:`fuzz.repro.harness`); the pool's runtime, the
   import hook and, but for mismatches, the judge are gone. If this candidate does not
   reproduce, it is tried without the trace pass.
4. **Folding** (:mod:`fuzz.repro.fold`): what an instrumented run saw once becomes a literal
   (the case's fields, the model's functions, the rank code's tests), the branches not taken,
   the case's unread fields, the model's unread fields and uncalled methods go.
5. **Delta debugging** (:mod:`fuzz.repro.delta`): whole definitions with what names them, then
   function bodies, then chunks of statements, each candidate tidied statically, for as long as
   ``budget_s`` allows.

Where the failure is an exception or a mismatch, the attempts of passes 4 and 5 run in a warm
:class:`~fuzz.pool.RankPool` (gloo, CPU, the case's world size) whose ranks execute the
candidate's ``attempt`` function (:mod:`fuzz.repro.harness`), once the pool has reproduced the
flattened script as torchrun did; the folded and the final scripts are verified under torchrun,
and one that does not reproduce there is replaced by the last one that did. A crash's attempts
run in the pool as well: a rank that dies is judged by the crash script's own rule, applied to
its exit status and faulthandler's output (:func:`fuzz.repro.harness.crash_verdict`); and so do
a hang's, with the deadline of the watcher's wait (:data:`~fuzz.repro.harness.HANG_AFTER_S`;
the short one, :data:`QUICK_HANG_AFTER_S`, is too short for a loaded machine's ranks to reach
the hang): a rank still running then is judged by the watcher's rule on its main thread's
stack as the rank last sampled it (:func:`fuzz.repro.harness.hang_verdict`).

The reduced script is kept beside its entry (``NAME.repro.py`` for ``NAME.json``); its second
line holds a hash of the entry and of the carried sources it was reduced from
(:func:`stored_header`). It is current while the entry is unchanged (:func:`is_current`), and
it is reduced again when the entry changes; one reduced from older carried sources is still a
standalone reproducer, reduced again on request (``--refresh``).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fuzz import known
from fuzz.corpus import Entry
from fuzz.errors import InvalidArgument, PoolError
from fuzz.model import to_jsonable
from fuzz.patching import patch_env
from fuzz.pool import RankPool, ScriptOutcome
from fuzz.properties import get_property
from fuzz.repro import render_entry, values
from fuzz.repro.delta import ddmin, drop_validation, frozen_for
from fuzz.repro.fold import WORD
from fuzz.repro.harness import (
    ATTEMPT,
    HANG_AFTER_S,
    PASSING,
    POOLED_KINDS,
    checked,
    crash_verdict,
    hang_verdict,
    is_plain,
    lift_attempt,
    main_source,
    plain,
    raised_verdicts,
    signature_free,
)
from fuzz.repro.portable import portable
from fuzz.repro.printed import print_entry, printable
from fuzz.repro.script import carried_modules, code_lines, imported_modules, relative, roots_for
from fuzz.repro.specialize import Origins, fold_case_functions, initial, render_flat, specialize, tidy
from fuzz.stop import raise_if_stopped

#: Modules whose paths depend on timing (the judge polls, the samplers sample): the trace
#: pass drops their functions that did not run, never a statement inside one that ran.
WHOLE_FUNCTIONS = {"fuzz.repro.runtime", "fuzz._rank.worker"}
#: The second line of a stored reduced script.
HEADER = "# shardfuzz reduced reproducer:"
#: Seconds of delta debugging (pass 5) by default, after the trace passes and folding. Most
#: attempts run in the pool (an exception or a mismatch), about as long as the case itself.
DEFAULT_BUDGET_S = 240.0
#: A candidate may take this many times as long as the unreduced script, plus the slack.
TIMEOUT_FACTOR = 2.0
TIMEOUT_SLACK_S = 30.0
#: What a pooled attempt raises where an earlier attempt's device mesh left torch holding one of
#: the process groups the pool destroyed after it (DeviceMesh finds groups of the same ranks
#: again, and the name no longer resolves): the attempt runs again on fresh ranks.
STALE_GROUP = "Could not resolve the process group registered under the name"
#: What an SPMD attempt (fully_shard(dp_mesh_dims=...) over tensor parallelism) raises in a pool
#: whose ranks ran an earlier one: the parameters' mesh and the one fully_shard is given are
#: equal but no longer the same object (the first attempt reproduces, every later one fails so,
#: under torchrun none does). Such an attempt runs again on fresh ranks too.
STALE_MESH = "Expected param's DTensor mesh to be the same mesh passed to fully_shard, but got different mesh objects"
#: Where folding every plain value at once does not reproduce, each site is folded alone, at
#: most this many (in the pool, an attempt each).
SINGLE_SITES = 40
#: The first candidate that reproduces in the pool runs RATE_RUNS times more there, in the same
#: ranks, then (where one of those passes) RATE_RUNS times on fresh ranks: a failure that does not
#: reproduce every time on either races (a collective racing a hook, say), as does one whose known
#: bug's record says so (:attr:`fuzz.known.KnownBug.races`). Each candidate of such a
#: failure is kept only if it reproduces RACE_VOTES times in a row, in the pool and under torchrun
#: alike; else the cuts drift towards scripts that reproduce now and then, which one lucky
#: attempt would keep and the final torchrun would refuse.
RATE_RUNS = 4
RACE_VOTES = 3
#: Where a mismatch's judge is cut like the rest (its bug's fix is checked), a candidate must
#: reproduce, and pass with the fix, this many times each: a cut of the judge (an ``abs``, the
#: load that made both sides equal) can leave a comparison of values that torch draws anew in
#: each process (torch 2.13 seeds each process at random), which reproduces and passes with the
#: fix by turns; one attempt of each kept such a coin flip one time in four (a 4-rank DCP
#: script reduced so compared two models initialised apart).
JUDGE_FREE_VOTES = 2
#: Torchrun attempts at most to find the last pooled script that torchrun confirms.
BISECTIONS = 8
#: In the pool, a candidate may take this many times as long as the slowest that reproduced
#: there, and at least POOL_DEADLINE_MIN_S (a candidate that hangs costs no more than that).
POOL_DEADLINE_FACTOR = 3.0
POOL_DEADLINE_MIN_S = 15.0
#: A hang script's watcher looks at the ranks after HANG_AFTER_S (20 s), and every rank waits as
#: long before it exits, whether it hung or not: each torchrun attempt of a hang entry costs that
#: at least. Candidates run with this wait instead (their text changed for the run, not the
#: script kept); the script that is kept in the end is confirmed with the full wait.
QUICK_HANG_AFTER_S = 10
#: Scripts print ``REPRODUCED <signature>: <what>`` (the unreduced mismatch script
#: ``REPRODUCED <signature> (<check>): <what>``); a signature holds neither ": " nor " (" but may
#: hold a space (a crash's ``crash:dcp:signal SIGSEGV@...``).
_REPRODUCED = re.compile(r"^REPRODUCED (.+?)(?:: | \(|:?$)", re.MULTILINE)
#: A mismatch script's digest of every rank's observation, beside REPRODUCED (fuzz.repro.harness).
_OBSERVED = re.compile(r"^REPRODUCED \S+ observations ([0-9a-f]+)", re.MULTILINE)


@dataclass
class Reduction:
    script: str
    lines_before: int
    lines_after: int
    seconds: float
    attempts: int
    signature: str
    #: Of the attempts, those run in the rank pool and under torchrun, with their seconds.
    pool_attempts: int = 0
    pool_seconds: float = 0.0
    torchrun_attempts: int = 0
    torchrun_seconds: float = 0.0


# -- the oracle ----------------------------------------------------------------------------------


def run_script(
    text: str, *, timeout: float, env: dict[str, str] | None = None, nproc: int | None = None
) -> tuple[int | None, str, float]:
    """(exit status or None on a timeout, stdout and stderr, seconds) of ``python FILE.py``, or
    with ``nproc`` of ``torchrun --standalone --nproc-per-node N FILE.py``. Every process still
    running the file afterwards (torchrun puts ranks in sessions of their own) is ended by its pid.
    The run's temporary directory (``TMPDIR``, :func:`tempfile.gettempdir`) is a new empty one:
    a candidate cut down to load a checkpoint from there without saving it first must not find
    what an earlier run left. A stop already requested (:mod:`fuzz.stop`) is raised again
    instead of running anything."""
    raise_if_stopped()  # a KeyboardInterrupt lost on its way must not leave the reduction going
    with tempfile.TemporaryDirectory(prefix="shardfuzz-reduce-") as tmp:
        file = Path(tmp) / "repro.py"
        file.write_text(text)
        own_tmp = Path(tmp) / "tmp"
        own_tmp.mkdir()
        log = Path(tmp) / "output"
        start = time.monotonic()
        status: int | None
        command = [sys.executable, str(file)]
        if nproc is not None:
            command[1:1] = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
        with log.open("w") as out:
            proc = subprocess.Popen(
                command,
                cwd=tmp,
                env={**os.environ, "TMPDIR": str(own_tmp), **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                status = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                status = None
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        seconds = time.monotonic() - start
        _end_processes_running(str(file))
        return status, log.read_text(errors="replace"), seconds


def _end_processes_running(file: str) -> None:
    """SIGKILL every process of this user whose command line names ``file`` (a unique path)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if file in (proc / "cmdline").read_bytes().decode(errors="replace").split("\0"):
                os.kill(int(proc.name), signal.SIGKILL)


def with_verdicts(entry: Entry, script: str, output: str, signature: str | None = None) -> str:
    """``output`` of ``script``; where it is an exception's plain form, its verdict lines are
    those of the whole rule read from its ranks' tracebacks
    (:func:`fuzz.repro.harness.raised_verdicts`), in place of its own (the signature's rule)."""
    if not is_plain(script):
        return output
    own = [line for line in output.splitlines() if not line.startswith(("REPRODUCED ", "FAIL ("))]
    return "\n".join([*own, *raised_verdicts(entry, output, signature)]) + "\n"


def run_kept(
    script: str, entry: Entry, *, timeout: float, env: dict[str, str] | None = None
) -> tuple[int | None, str, float]:
    """:func:`run_script` of a reduced script under torchrun (the case's world size), its output
    with the verdicts of a plain form's ranks (:func:`with_verdicts`)."""
    status, output, seconds = run_script(script, timeout=timeout, env=env, nproc=entry.case.world_size)
    return status, with_verdicts(entry, script, output), seconds


def reproduced(status: int | None, output: str) -> str | None:
    """The signature a run reproduced, or None."""
    found = _REPRODUCED.search(output)
    return found.group(1).rstrip(":") if status == 1 and found else None


_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+(?:Error|Exception|Interrupt)|AssertionError)\b.*", re.MULTILINE)


def why_not(status: int | None, output: str) -> str:
    """One line on why a run did not reproduce, for an error message: its verdict where it printed
    one, else the last exception a rank raised (not torchrun's own ``ChildFailedError``), else its
    last line that has words (torchrun ends a failed run with a rule of ``=`` signs); with its exit
    status or "timed out"."""
    said = "timed out" if status is None else f"exit {status}"
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    verdicts = [line for line in lines if line.startswith(VERDICT_WORDS)]
    errors = [e for e in _ERROR_LINE.findall(output) if "ChildFailedError" not in e]
    worded = [line for line in lines if re.search(r"[A-Za-z]{2}", line)]
    last = (verdicts or [e.strip() for e in errors] or worded or ["no output"])[-1]
    return f"{said}: {last[:300]}"


# -- hashes and the stored script ----------------------------------------------------------------


#: The words a verdict line starts with (:mod:`fuzz.repro.harness`).
VERDICT_WORDS = ("PASS", "FAIL", "REPRODUCED")
_VERDICT_START = re.compile(r"(?=PASS|FAIL \(|REPRODUCED )")


def passed(output: str) -> bool:
    """Whether a script's output says it passed: verdicts, each of them one of :data:`PASSING`
    (no ``REPRODUCED``, no ``FAIL``, no other failure)."""
    # the ranks share torchrun's standard output, and a print's text and its newline are two
    # writes: two ranks' verdicts can meet on one line ("PASS: no rank raisedPASS: ...")
    verdicts = [
        v.strip()
        for line in output.splitlines()
        if line.startswith(VERDICT_WORDS)
        for v in _VERDICT_START.split(line)
        if v.strip()
    ]
    return bool(verdicts) and all(v in PASSING for v in verdicts)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: Entry fields a campaign updates when it meets the entry again; a script does not depend on them.
_COUNTERS = ("count", "reruns", "reproduced")


def entry_hash(entry: Entry) -> str:
    """A hash of what a reduced script depends on: the entry but for its counters, with the case
    encoded sparsely (fields at their defaults left out), so that a field the model gains later
    does not make every stored script stale."""
    data = {k: v for k, v in entry.to_json().items() if k not in _COUNTERS}
    data["case"] = to_jsonable(entry.case, sparse=True)
    return _digest(json.dumps(data, sort_keys=True))


def sources_hash(modules: dict[str, str]) -> str:
    return _digest(json.dumps(modules, sort_keys=True))


def unreduced_modules(entry: Entry) -> dict[str, str]:
    prop = get_property(entry.case.property)
    return carried_modules(roots_for(prop, entry.case.body.PROGRAM))


def stored_header(entry: Entry, seconds: float | None = None, sources: str | None = None) -> str:
    """The second line of a kept script: the entry's hash, the hash of the carried sources it was
    reduced from (those as they are now unless ``sources`` is given), and the seconds it took."""
    took = f" seconds={seconds:.1f}" if seconds is not None else ""
    sources = sources_hash(unreduced_modules(entry)) if sources is None else sources
    return f"{HEADER} entry={entry_hash(entry)} sources={sources}{took}"


def stored_path(entry_path: Path) -> Path:
    """Where the reduced script of the entry at ``entry_path`` is kept."""
    return entry_path.with_name(entry_path.name.removesuffix(".json") + ".repro.py")


def header_fields(script: str) -> dict[str, str]:
    for line in script.splitlines()[:3]:
        if line.startswith(HEADER):
            return dict(part.split("=", 1) for part in line[len(HEADER) :].split() if "=" in part)
    return {}


def is_current(script: str, entry: Entry) -> bool:
    """Whether ``script`` was reduced from this entry as it is now. A script is a standalone
    program that needs only torch, so a later change to the carried sources does not make it
    stale: it still reproduces what it reproduced (the tests run a sample of the stored scripts
    under torchrun, and the slow tier all of them); :func:`from_current_sources` tells whether
    it was reduced from the sources as they are now, and ``--reduce --refresh`` reduces again
    the ones that were not."""
    return header_fields(script).get("entry") == entry_hash(entry)


def from_current_sources(script: str, entry: Entry) -> bool:
    """Whether ``script`` was reduced from the carried sources as they are now."""
    return header_fields(script).get("sources") == sources_hash(unreduced_modules(entry))


def stored_script(entry_path: Path, entry: Entry, *, refresh: bool = False) -> str | None:
    """The stored reduced script of the entry if it is current (with ``refresh``, also reduced
    from the carried sources as they are now), else None."""
    path = stored_path(entry_path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    if not is_current(text, entry) or (refresh and not from_current_sources(text, entry)):
        return None
    return text


# -- pass 1: what no process ran -----------------------------------------------------------------


def _lines(nodes: list[ast.stmt]) -> Iterator[int]:
    for node in nodes:
        yield from range(node.lineno, (node.end_lineno or node.lineno) + 1)


def _ran(nodes: list[ast.stmt], ran: set[int]) -> bool:
    return any(line in ran for line in _lines(nodes))


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _strip_annotations(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    args = fn.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is not None:
            arg.annotation = None
    fn.returns = None


def _stub(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.stmt:
    fn.body = [ast.Expr(ast.Constant(...))]
    _strip_annotations(fn)
    return fn


def _body(stmts: list[ast.stmt]) -> list[ast.stmt]:
    return stmts or [ast.Pass()]


class _Pruner:
    """Pass 1 over one module: ``ran`` is the set of its lines that some process ran; names in
    ``referred`` are kept as stubs where their function did not run."""

    def __init__(self, ran: set[int], referred: set[str], whole_functions: bool = False) -> None:
        self.ran = ran
        self.referred = referred
        self.whole_functions = whole_functions

    def module(self, tree: ast.Module) -> ast.Module:
        out: list[ast.stmt] = []
        for node in tree.body:
            if _is_docstring(node):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                out.extend(self.block(node.orelse, top=True))
                continue
            out.extend(self.block([node], top=True))
        tree.body = out
        return tree

    def function(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
        if not _ran(fn.body, self.ran):
            return [_stub(fn)] if fn.name in self.referred else []
        _strip_annotations(fn)
        body = [n for n in fn.body if not _is_docstring(n)]
        fn.body = _body(self.whole(body) if self.whole_functions else self.block(body))
        return [fn]

    def whole(self, nodes: list[ast.stmt]) -> list[ast.stmt]:
        """``nodes`` with only the functions in them judged by the trace."""
        for node in nodes:
            for child in ast.walk(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and child is not node:
                    _strip_annotations(child)
        return nodes

    def cls(self, node: ast.ClassDef) -> list[ast.stmt]:
        body: list[ast.stmt] = []
        for child in node.body:
            if _is_docstring(child):
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body.extend(self.function(child))
            else:
                body.append(child)
        node.body = _body(body)
        return [node]

    def block(self, nodes: list[ast.stmt], top: bool = False) -> list[ast.stmt]:
        """``nodes`` without what did not run; at the top level of a module (``top``) only
        functions and classes are judged by the trace (the rest ran on import, before it)."""
        out: list[ast.stmt] = []
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.extend(self.function(node))
            elif isinstance(node, ast.ClassDef):
                out.extend(self.cls(node) if top or _ran([node], self.ran) else [])
            elif top or isinstance(node, (ast.Global, ast.Nonlocal, ast.Pass)):
                out.append(node)
            elif isinstance(node, ast.If):
                out.extend(self.branch(node))
            elif isinstance(node, ast.Try):
                out.extend(self.handlers(node))
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
                if _ran(node.body, self.ran):
                    node.body = _body(self.block(node.body))
                    node.orelse = self.block(node.orelse)
                    out.append(node)
                elif _ran(node.orelse, self.ran):
                    out.append(node)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                if _ran([node], self.ran):
                    node.body = _body(self.block(node.body))
                    out.append(node)
            elif _ran([node], self.ran):
                out.append(node)
        return out

    def branch(self, node: ast.If) -> list[ast.stmt]:
        body, orelse = _ran(node.body, self.ran), _ran(node.orelse, self.ran)
        if any(isinstance(n, ast.NamedExpr) for n in ast.walk(node.test)):
            body = body or bool(node.body)
        if not body and node.lineno == node.body[0].lineno:
            body = node.lineno in self.ran  # `if x: return` on one line: the trace cannot tell
        if body:
            node.body = _body(self.block(node.body))
            node.orelse = self.block(node.orelse) if orelse else []
            return [node]
        return self.block(node.orelse) if orelse else []

    def handlers(self, node: ast.Try) -> list[ast.stmt]:
        node.handlers = [h for h in node.handlers if _ran(h.body, self.ran)]
        for h in node.handlers:
            h.body = _body(self.block(h.body))
        node.body = self.block(node.body)
        node.orelse = self.block(node.orelse)
        node.finalbody = self.block(node.finalbody)
        if node.handlers or node.finalbody:
            node.body = _body(node.body)
            return [node]
        return [*node.body, *node.orelse]


# -- pass 2: unused names ------------------------------------------------------------------------


def _refs(node: ast.AST) -> Counter[str]:
    """The names ``node`` refers to: names, attributes, and the words of its strings."""
    out: Counter[str] = Counter()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out[n.id] += 1
        elif isinstance(n, ast.Attribute):
            out[n.attr] += 1
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and len(n.value) < 200:
            out.update(WORD.findall(n.value))
    return out


def _binds(node: ast.stmt) -> set[str] | None:
    """The names a removable top-level statement binds (None: not removable by name)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return None if node.name.startswith("__") else {node.name}
    if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets) and _pure(node.value):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _pure(node.value):
        return {node.target.id}
    return None


#: Calls whose value may go unused without losing an effect (a registration must stay).
PURE_CALLS = {"frozenset", "set", "dict", "tuple", "list", "compile", "TypeVar", "field", "namedtuple", "float", "int"}


def _pure(value: ast.expr | None) -> bool:
    """Whether evaluating ``value`` does nothing but build it."""
    for node in ast.walk(value) if value is not None else ():
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name not in PURE_CALLS:
                return False
    return True


#: What the runtime does for the reducer alone (REPRO_TRACE), taken out of every reduced script.
TRACE_NAMES = {"_trace", "_dump_trace", "_TRACED"}


def drop_tracing(tree: ast.Module) -> None:
    """Take the runtime's tracing (:func:`fuzz.repro.runtime._trace`) out of ``tree``."""

    def keep(node: ast.stmt) -> bool:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node.name not in TRACE_NAMES
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            return not (_refs(node).keys() & TRACE_NAMES)
        if isinstance(node, ast.If):
            return "REPRO_TRACE" not in ast.unparse(node.test)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            return not (_refs(node.value.func).keys() & TRACE_NAMES)
        return True

    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                setattr(node, field, [n for n in stmts if keep(n)] or [ast.Pass()])


def _alias_name(alias: ast.alias) -> str:
    return alias.asname or alias.name.split(".")[0]


def drop_unused(trees: dict[str, ast.Module], extra_refs: Counter[str]) -> None:
    """Pass 2 in place: drop top-level bindings and imported names nothing refers to."""
    for tree in trees.values():
        tree.body = [
            n
            for n in tree.body
            if not (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets))
        ]
    while True:
        total: Counter[str] = Counter(extra_refs)
        per: dict[int, Counter[str]] = {}
        for tree in trees.values():
            for node in tree.body:
                per[id(node)] = _refs(node)
                total.update(per[id(node)])
        changed = False
        for tree in trees.values():
            kept: list[ast.stmt] = []
            for node in tree.body:
                names = _binds(node)
                own = per[id(node)]
                if names is not None and all(total[name] - own[name] <= 0 for name in names):
                    changed = True
                    continue
                if isinstance(node, (ast.Import, ast.ImportFrom)) and not (
                    isinstance(node, ast.ImportFrom) and node.module == "__future__"
                ):
                    aliases = [a for a in node.names if a.name == "*" or total[_alias_name(a)] > 0]
                    if len(aliases) != len(node.names):
                        changed = True
                        if not aliases:
                            continue
                        node.names = aliases
                kept.append(node)
            tree.body = kept
        if not changed:
            return


def _unparse(tree: ast.Module) -> str:
    body = tree.body
    if all(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in body):
        return ""
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def closure(sources: dict[str, str], roots: list[str]) -> dict[str, str]:
    """The modules of ``sources`` that ``roots`` import, with their parent packages."""
    keep: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in keep or name not in sources:
            continue
        keep.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        todo.extend(imported_modules(name, sources[name]))
    return {name: sources[name] for name in sorted(keep)}


def prune(
    modules: dict[str, str], ran: dict[str, set[int]], roots: list[str], extra_refs: Counter[str], only: set[str] | None
) -> dict[str, str]:
    """Passes 1 and 2 over ``modules`` (pass 1 only on the modules in ``only``, if given)."""
    trees = {name: ast.parse(text) for name, text in modules.items()}
    for tree in trees.values():
        drop_tracing(tree)
    referred: Counter[str] = Counter(extra_refs)
    for tree in trees.values():
        referred.update(_refs(tree))
    for name, tree in trees.items():
        if only is None or name in only:
            _Pruner(ran.get(name, set()), set(referred), name in WHOLE_FUNCTIONS).module(tree)
    drop_unused(trees, extra_refs)
    return closure({name: _unparse(tree) for name, tree in trees.items()}, roots)


def read_trace(directory: Path, modules: dict[str, str]) -> dict[str, set[int]]:
    files = {"shardfuzz/" + relative(name): name for name in modules}
    ran: dict[str, set[int]] = {}
    for path in directory.glob("lines-*.json"):
        try:
            lines = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for file, line in lines:
            if file in files:
                ran.setdefault(files[file], set()).add(int(line))
    return ran


# -- the reducer ---------------------------------------------------------------------------------


def clear_checkpoints(code: str) -> None:
    """Remove the DCP checkpoint directories whose paths ``code`` holds as literals (folded from
    an earlier run, :func:`fuzz.model.dcp_root`) before it runs: what an earlier attempt or the
    instrumented run left there must not let a candidate that no longer saves load anyway."""
    root = re.escape(tempfile.gettempdir())
    for found in set(re.findall(root + r"/shardfuzz-dcp-\d+", code)):
        shutil.rmtree(found, ignore_errors=True)


class _Oracle:
    """Runs candidates of one entry and says whether they reproduce its signature: under
    torchrun (:func:`run_script`), or, once :meth:`open_pool` found that the pool agrees with
    torchrun on a candidate, in a warm :class:`~fuzz.pool.RankPool` (gloo, CPU, the case's world
    size), where an attempt costs the case and not a torchrun. Counts the attempts and their
    seconds, in the pool and under torchrun."""

    def __init__(self, entry: Entry, source: str, signature: str, timeout: float, say: Callable[[str], None]) -> None:
        self.entry, self.source, self.signature, self.timeout, self.say = entry, source, signature, timeout, say
        self.pool: RankPool | None = None
        self.deadline = timeout
        self.slowest = 0.0
        self.pool_attempts = self.torchrun_attempts = 0
        self.respawns = 0  # fresh ranks for an attempt that met a destroyed process group
        #: The entry's known bug's record, where it has one.
        self.bug = known.BUGS.get(entry.bug or "")
        races = self.bug is not None and self.bug.races
        #: Whether every attempt runs on fresh ranks: the first candidate reproduced in the
        #: pool, then, run again in the same ranks, did not, and on fresh ranks did (what it
        #: left in torch, a process-wide cache say, changes the next attempt's outcome;
        #: :meth:`_check_ranks_kept`). So too for a known bug that races: its race is timed as
        #: under torchrun in ranks that have not run a case before (in warm ranks, cuts kept
        #: there reproduced three times in a row and under torchrun one time in two).
        self.fresh_each = races
        #: How many times in a row a candidate must reproduce (and pass with the bug's fix, where
        #: that is checked): RACE_VOTES where the failure races (its known bug's record says so,
        #: or :meth:`_check_ranks_kept` finds it), at least JUDGE_FREE_VOTES where a mismatch's
        #: judge is cut (:meth:`open_fix`), else once.
        self.votes = RACE_VOTES if races else 1
        self._rate_known = races  # else measured on the first candidate that reproduces
        self.pool_seconds = self.torchrun_seconds = 0.0
        #: A mismatch's observations as the first candidate that reproduced saw them: every
        #: later candidate must observe exactly the same, so that a cut can never make the
        #: mismatch by changing what either side computes (the reference, the judge's input).
        self.observed: str | None = None
        #: Where the entry's known bug has a fix (fuzz.known.KnownBug.fix): the environment of
        #: torch with it, and ranks that import that torch. A candidate must pass there: a cut
        #: that keeps the symptom but drops its cause (a failure of the script's own making)
        #: fails with the fix as well.
        self.fix_env: dict[str, str] | None = None
        self.fixed: RankPool | None = None
        self.fixed_attempts = 0
        self._fix_dir: tempfile.TemporaryDirectory[str] | None = None
        self._fix_ready: dict[str, str] | None = None  # the fix's environment, before it is checked

    @property
    def judge_free(self) -> bool:
        """Whether a mismatch's judge and observations are cut like the rest of the script: where
        the bug's fix is checked, a candidate must both find the entry's mismatch with the bug and
        pass with the fix, so whatever the judge keeps still compares the composed run with the
        reference on something only the bug makes differ. Without the fix, the judge stays whole
        and the observations stay exactly as first observed."""
        return self.entry.kind == "mismatch" and self.fix_env is not None

    def _same_observations(self, output: str) -> bool:
        if self.entry.kind != "mismatch" or self.judge_free:
            return True
        found = _OBSERVED.search(output)
        digest = found.group(1) if found else None
        if self.observed is None:
            self.observed = digest
        if self._fix_ready is not None:
            # a fix that applies and is not refused yet (:meth:`open_fix`): a kept script whose
            # check is signature-free (:func:`signature_free`) prints no observations to compare
            return True
        return digest is not None and digest == self.observed

    @property
    def attempts(self) -> int:
        return self.pool_attempts + self.torchrun_attempts

    @property
    def quick_hang(self) -> bool:
        """Whether candidates run with the short wait of a hang script (:func:`quick_hang`)."""
        return self.entry.kind == "hang"

    def torchrun(self, code: str, full: bool = False) -> bool:
        """Whether the flat script ``code`` reproduces under torchrun (a hang entry's with the
        watcher's wait of :data:`QUICK_HANG_AFTER_S` unless ``full``), :attr:`votes` times in a
        row, and passes with the bug's fix where that is checked."""
        script = render_flat(self.entry, self.source, self.signature, code)
        if self.quick_hang and not full:
            script = quick_hang(script)
        ok, output, seconds = self._reproduces_under_torchrun(code, script, self.votes)
        for _ in range(self.votes if ok and self.fix_env is not None else 0):
            self.fixed_attempts += 1
            status, fixed, _ = run_script(
                script, timeout=self.timeout, nproc=self.entry.case.world_size, env=self.fix_env
            )
            if status != 0 or not passed(fixed):
                ok, output = False, "does not pass with the bug's fix: " + fixed
                break
        self._said("torchrun", code, ok, seconds, output)
        return ok

    def _reproduces_under_torchrun(self, code: str, script: str, votes: int) -> tuple[bool, str, float]:
        """Whether ``script`` (``code`` rendered) reproduces under torchrun ``votes`` times in a
        row; what the last run printed, and the seconds of all."""
        ok, output, seconds = False, "", 0.0
        for _ in range(votes):
            clear_checkpoints(code)
            self.torchrun_attempts += 1
            status, output, more = run_script(script, timeout=self.timeout, nproc=self.entry.case.world_size)
            self.torchrun_seconds += more
            seconds += more
            output = with_verdicts(self.entry, script, output, self.signature)
            ok = reproduced(status, output) == self.signature and self._same_observations(output)
            if not ok:
                break
        return ok, output, seconds

    def in_pool(self, code: str) -> bool:
        """Whether ``code`` reproduces in the pool (whose ranks call its ``attempt``)."""
        assert self.pool is not None
        try:
            outcome = self._pooled(code)
            ok = self._reproduced_in(outcome)
            votes = self.votes
            if ok and not self._rate_known:  # again: do the ranks keep state, does it race?
                self._check_ranks_kept(code)
            for _ in range(votes - 1):  # a racing failure: again, every time
                if not ok:
                    break
                seconds = outcome.seconds
                outcome = self._pooled(code)
                outcome.seconds = max(seconds, outcome.seconds)
                ok = self._reproduced_in(outcome)
        except PoolError as e:  # fresh ranks did not start: torchrun still can
            self.say(f"  the pool failed ({e}): the attempts left run under torchrun")
            self.close()
            return self.torchrun(code)
        # A candidate may take POOL_DEADLINE_FACTOR times the slowest that reproduced (a hang's
        # deadline is the watcher's wait, which every hang that reproduces takes whole).
        if ok and self.entry.kind != "hang":
            self.slowest = max(self.slowest, outcome.seconds)
            self.deadline = min(self.timeout, max(POOL_DEADLINE_MIN_S, POOL_DEADLINE_FACTOR * self.slowest))
        said = [*outcome.verdicts.values(), *outcome.errors.values()]
        if ok and self.fixed is not None:
            try:
                if not self._passes_fixed(code):
                    ok, said = False, ["does not pass with the bug's fix"]
            except PoolError as e:  # as above: torchrun checks the fix too
                self.say(f"  the pool with the fix failed ({e}): the attempts left run under torchrun")
                self.close()
                return self.torchrun(code)
        said += [f"rank {rank} {why}" for rank, why in outcome.missing.items()]
        self._said("pool", code, ok, outcome.seconds, "\n".join(s for s in said if s))
        return ok

    def _check_ranks_kept(self, code: str) -> None:
        """Run the first candidate that reproduced in the pool :data:`RATE_RUNS` times more, in
        the same ranks. Where one of those does not reproduce, run it as often on fresh ranks:
        where every one of those reproduces, what an attempt leaves in torch changes the next
        one's outcome, and every attempt from then on runs on fresh ranks (:attr:`fresh_each`);
        where one does not either, the failure races, and every candidate from then on must
        reproduce :data:`RACE_VOTES` times in a row (:attr:`votes`), on fresh ranks where those
        reproduced more often."""
        assert self.pool is not None
        self._rate_known = True
        same = sum(self._reproduced_in(self._pooled(code)) for _ in range(RATE_RUNS))
        if same == RATE_RUNS:
            return
        fresh = 0
        for _ in range(RATE_RUNS):
            self.pool.respawn()
            self.respawns += 1
            fresh += self._reproduced_in(self._pooled(code))
        self.fresh_each = fresh > same
        if same + fresh == 0:
            self.say(
                f"  run again, the first candidate did not reproduce in {2 * RATE_RUNS} attempts, in the same ranks "
                "or on fresh ones: the case varies from run to run, and the ranks are kept warm"
            )
            return
        if fresh == RATE_RUNS:
            self.say(
                f"  run again in the same ranks, the first candidate reproduced {same} of {RATE_RUNS} times, "
                f"on fresh ranks every time: every attempt runs on fresh ranks"
            )
            return
        self.votes = RACE_VOTES
        self.say(
            f"  run again, the first candidate reproduced {same} of {RATE_RUNS} times in the same ranks and "
            f"{fresh} of {RATE_RUNS} on fresh ones: the failure races; a candidate must reproduce "
            f"{RACE_VOTES} times in a row{', on fresh ranks' if self.fresh_each else ''}"
        )

    def _pooled(self, code: str) -> ScriptOutcome:
        """One attempt of ``code`` in the pool, counted, after the checkpoint directories an
        earlier run left are gone (:func:`clear_checkpoints`); a stop already requested is
        raised again instead (:mod:`fuzz.stop`)."""
        assert self.pool is not None
        raise_if_stopped()
        clear_checkpoints(code)
        outcome = self._attempt(self.pool, code)
        self.pool_attempts += 1
        self.pool_seconds += outcome.seconds
        return outcome

    def _reproduced_in(self, outcome: ScriptOutcome) -> bool:
        verdicts = list(outcome.verdicts.values())
        if self.entry.kind == "crash":  # the rank died: the check main makes of its child, applied here
            for rank, (status, stack) in outcome.died.items():
                verdicts.append(crash_verdict(self.entry, self.signature, rank, status, stack) or "")
        if self.entry.kind == "hang" and not outcome.errors and not outcome.died:
            # a rank still running at the watcher's time, judged by its main thread's stack (under
            # torchrun a rank that raises or dies ends the others before their watcher looks)
            for rank, stack in outcome.stuck.items():
                verdicts.append(hang_verdict(self.entry, self.signature, rank, stack) or "")
        return any(
            reproduced(1, verdict) == self.signature and self._same_observations(verdict) for verdict in verdicts
        )

    def _attempt(self, pool: RankPool, code: str) -> ScriptOutcome:
        """``code``'s ``attempt`` in the ranks of ``pool``: on fresh ranks where attempts do not
        leave the ranks as they found them (:attr:`fresh_each`), else on fresh ranks once more
        where an earlier attempt left torch a destroyed group or a stale mesh (STALE_GROUP,
        STALE_MESH)."""
        if self.fresh_each:
            pool.respawn()
            self.respawns += 1
        outcome = pool.run_script(code, function=ATTEMPT, deadline=self.deadline)
        said = [*outcome.errors.values(), *outcome.verdicts.values()]
        if any(STALE_GROUP in text or STALE_MESH in text for text in said):
            pool.respawn()
            self.respawns += 1
            outcome = pool.run_script(code, function=ATTEMPT, deadline=self.deadline)
        return outcome

    def _passes_fixed(self, code: str) -> bool:
        """Whether ``code`` passes in the ranks of torch with the bug's fix (:func:`passed`; a
        hang's or a crash's ``attempt`` returns no verdict, its ``main`` checks it: there, every
        rank finishes the case)."""
        assert self.fixed is not None
        for _ in range(self.votes):
            self.fixed_attempts += 1
            outcome = self._attempt(self.fixed, code)
            ok = not outcome.errors and not outcome.missing
            if self.entry.kind in POOLED_KINDS:
                ok = ok and passed("\n".join(outcome.verdicts.values()))
            if not ok:
                return False
        return True

    def trace_fix(self, full: str, modules: dict[str, str]) -> dict[str, set[int]]:
        """Where the entry's bug has a fix that applies to this torch: the lines of ``modules``
        that the unreduced script ``full`` runs on torch with it. With the bug the case stops
        where it fails, so a script flattened from that run alone lacks what runs after, and
        could never pass with the fix; the reduction keeps the lines of both runs."""
        self.prepare_fix()
        env = self._fix_ready
        if env is None:
            return {}
        with tempfile.TemporaryDirectory(prefix="shardfuzz-trace-") as tmp:
            run_script(full, timeout=600.0, env={**env, "REPRO_TRACE": tmp})
            return read_trace(Path(tmp), modules)

    def prepare_fix(self) -> None:
        """Make the fix of the entry's bug ready to be checked (:meth:`open_fix`), where there is
        one that applies to this torch."""
        bug = self.bug
        if bug is None or not bug.fix:
            return
        self._fix_dir = tempfile.TemporaryDirectory(prefix="shardfuzz-fix-")
        env = patch_env(bug.fix, self._fix_dir.name)
        if env is None:
            self.say(f"  the fix of {bug.id} does not apply to this torch (or no patch harness): not checked")
            return
        self._fix_ready = env

    def open_fix(self, code: str) -> None:
        """Check candidates against torch with the entry's bug fixed from now on (where
        :meth:`trace_fix` found a fix that applies), if ``code`` (which reproduces) passes with
        it."""
        env, bug = self._fix_ready, self.entry.bug
        if env is None:
            return
        script = render_flat(self.entry, self.source, self.signature, code)
        status, output, _ = run_script(script, timeout=self.timeout, nproc=self.entry.case.world_size, env=env)
        if status != 0 or not passed(output):
            self.say(f"  the script does not pass with the fix of {bug}: the fix is not checked")
            self._fix_ready = None
            return
        self.say(f"  every candidate must pass with the fix of {bug}")
        self.fix_env = env
        if self.judge_free:
            self.votes = max(self.votes, JUDGE_FREE_VOTES)
        if self.pool is not None:
            fixed = RankPool(world_size=self.entry.case.world_size, backend="gloo", deadline=self.timeout, env=env)
            try:
                fixed.start()
                self.fixed = fixed
            except PoolError as e:
                self.say(f"  no pool with the fix ({e}): every attempt runs under torchrun")
                fixed.close()
                self.close()

    def __call__(self, code: str) -> bool:
        return self.in_pool(code) if self.pool is not None else self.torchrun(code)

    def plain_form(self, code: str) -> str | None:
        """The plain form of an exception's checked script ``code``
        (:func:`fuzz.repro.harness.plain`) if it reproduces under torchrun, its ranks'
        tracebacks read by the check's rule, and passes with the bug's fix where that is
        checked (:meth:`torchrun`); else None."""
        candidate = plain(code, self.entry, self.signature) if self.entry.kind == "exception" else None
        if candidate is None:
            return None
        self.say("  the plain form (the check taken out, the exception left to propagate):")
        return candidate if self.torchrun(candidate, full=True) else None

    def fold_values(self, code: str, frozen: frozenset[str]) -> list[str]:
        """``code`` with the plain values an instrumented torchrun of it saw folded in
        (:mod:`fuzz.repro.values`; the definitions in ``frozen`` are left as they are): first
        with every site folded, then, where there are several, with each alone (at most
        :data:`SINGLE_SITES`), for the attempts to take the first that reproduces; empty where
        the instrumented script does not reproduce or nothing folds."""
        with tempfile.TemporaryDirectory(prefix="shardfuzz-values-") as tmp:
            script = render_flat(self.entry, self.source, self.signature, values.instrument(code, frozen, tmp))
            clear_checkpoints(code)
            status, output, seconds = run_script(script, timeout=self.timeout, nproc=self.entry.case.world_size)
            self.torchrun_attempts += 1
            self.torchrun_seconds += seconds
            if reproduced(status, output) != self.signature:
                self.say("  values: the instrumented script does not reproduce; nothing folded")
                return []
            records = values.read_records(Path(tmp))
        out = []
        try:
            folded, count = values.fold(code, records, frozen)
            if count:
                out.append(folded)
            if count > 1:
                for site in values.foldable(records)[:SINGLE_SITES]:
                    one, folds = values.fold(code, {site: records[site]}, frozen)
                    if folds and one not in out:
                        out.append(one)
        except (SyntaxError, ValueError, TypeError, KeyError, RecursionError) as e:
            self.say(f"  values: not folded ({type(e).__name__}: {e})")
            return out
        self.say(f"  values: {count} sites folded" + (f"; {len(out) - 1} of them alone" if count > 1 else ""))
        return out

    def _said(self, where: str, code: str, ok: bool, seconds: float, output: str) -> None:
        self.say(
            f"  attempt {self.attempts} ({where}, {seconds:.1f} s): {code_lines(code)} code lines, "
            f"{'kept' if ok else 'rejected'}"
        )
        if not ok:
            self.say("    " + " | ".join(output.strip().splitlines()[-3:])[:600])

    def open_pool(self, code: str) -> None:
        """Start the pool and run ``code`` (which reproduced under torchrun) in it; the pool is
        used from now on only if it reproduces there too, on these ranks or, once, on fresh
        ones (each rank draws from the seed torch started it with, which torch 2.13 picks anew
        for each process, as it does under torchrun: a failure that needs the ranks' data to
        differ in some way may miss one set of seeds)."""
        if self.entry.kind not in (*POOLED_KINDS, "crash", "hang"):
            return
        if self.entry.kind == "hang":  # a candidate is stuck if still running at the watcher's time
            self.deadline = HANG_AFTER_S
        pool = RankPool(world_size=self.entry.case.world_size, backend="gloo", deadline=self.timeout)
        try:
            pool.start()
            self.pool = pool
            if self.in_pool(code):
                return
            pool.respawn()
            if self.in_pool(code):
                return
            self.say("  the pool does not reproduce what torchrun does: every attempt runs under torchrun")
        except PoolError as e:
            self.say(f"  no pool ({e}): every attempt runs under torchrun")
        self.pool = None
        pool.close()

    def close(self) -> None:
        """End the pools; the fix, where it is checked, stays checked under torchrun."""
        for pool in (self.pool, self.fixed):
            if pool is not None:
                pool.close()
        self.pool = self.fixed = None

    def end(self) -> None:
        self.close()
        if self._fix_dir is not None:
            self._fix_dir.cleanup()
            self._fix_dir = None


def reduce_entry(
    entry: Entry,
    source: str = "",
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    say: Callable[[str], None] = lambda _: None,
) -> Reduction:
    """The reduced script of ``entry``; InvalidArgument if its script does not reproduce here.

    Candidates run in a warm rank pool where the failure's kind allows it
    (:data:`~fuzz.repro.harness.POOLED_KINDS`, a crash and a hang); what the pool kept is then
    verified under torchrun, once after folding and once at the end, and a script that torchrun
    does not confirm is replaced by the last one it did."""
    began = time.monotonic()
    full = render_entry(entry, source=source)
    modules = unreduced_modules(entry)
    name = source or entry.file_name
    with tempfile.TemporaryDirectory(prefix="shardfuzz-trace-") as tmp:
        status, output, seconds = run_script(full, timeout=600.0, env={"REPRO_TRACE": tmp})
        signature = reproduced(status, output)
        if signature is None:
            raise InvalidArgument(f"{name}: its script does not reproduce the failure here ({why_not(status, output)})")
        ran = read_trace(Path(tmp), modules)
    say(f"{name}: reproduced {signature} in {seconds:.1f} s (traced)")
    oracle = _Oracle(entry, source, signature, seconds * TIMEOUT_FACTOR + TIMEOUT_SLACK_S, say)
    try:
        for module, lines in oracle.trace_fix(full, modules).items():
            ran.setdefault(module, set()).update(lines)
        main, roots = main_source(entry, signature)
        extra = Counter(WORD.findall(main))
        code = None
        origins: Origins = {}
        tries: tuple[set[str] | None, ...] = (None, set())
        for only in tries:  # the trace passes, else none
            try:
                candidate, origins = initial(entry, prune(modules, ran, roots, extra, only), signature)
            except (KeyError, SyntaxError, ValueError) as e:  # a module the flattening cannot merge
                say(f"  not flattened: {type(e).__name__}: {e}")
                continue
            if oracle.torchrun(candidate, full=True):
                code = candidate
                break
        if code is None:
            raise InvalidArgument(f"{name}: its reduced script does not reproduce the failure here")
        if budget_s > 0:  # else one attempt is left (the folded script's): torchrun, no pool
            oracle.open_pool(code)
        oracle.open_fix(code)
        verified = code  # the last script that reproduced under torchrun
        code = specialize(code, entry, signature, origins, oracle, timeout=oracle.timeout, say=say)
        code = _confirmed(code, verified, oracle, "folded")
        verified = code
        say(f"  folded: {code_lines(render_flat(entry, source, signature, code))} code lines")
        if entry.kind == "mismatch":
            case_folded = fold_case_functions(code, entry, origins)
            if case_folded is not None and oracle(case_folded):
                say("  the judge's case functions folded to their values")
                code = case_folded
        tidied = lambda text: tidy(text, entry, origins)  # noqa: E731
        if oracle.judge_free:
            say("  the bug's fix is checked: the judge and the observations are cut like the rest")
            frozen: frozenset[str] = frozenset()
            code = _signature_free(code, signature, oracle)
        else:
            frozen = _judge_side(code, entry, origins)
            unchecked = drop_validation(code, frozen)
            if unchecked is not None and oracle(unchecked):
                say("  the judge's classes left without their case checks (__post_init__)")
                code = unchecked
                frozen = _judge_side(code, entry, origins)
        kept: list[str] = []
        code = ddmin(
            code,
            oracle,
            time.monotonic() + budget_s,
            tidy=tidied,
            frozen=frozen,
            pretest=oracle.pool is not None,
            kept=kept,
            fold_values=lambda text: oracle.fold_values(text, frozen),
            say=say,
        )
        code = _confirmed(code, verified, oracle, "delta-debugged", kept)
        code = oracle.plain_form(code) or code
    finally:
        oracle.end()
    return _reduction(oracle, full, render_flat(entry, source, signature, code), began, name)


def _reduction(oracle: _Oracle, before: str, script: str, began: float, name: str) -> Reduction:
    """The :class:`Reduction` of ``before`` to ``script`` (made portable), said in one line with
    the oracle's counts."""
    oracle.say(
        f"{name}: {code_lines(before)} -> {code_lines(script)} code lines, {oracle.attempts} attempts "
        f"({oracle.pool_attempts} in the pool, {oracle.pool_seconds:.1f} s, {oracle.respawns} on fresh ranks; "
        f"{oracle.torchrun_attempts} under torchrun, {oracle.torchrun_seconds:.1f} s; "
        f"{oracle.fixed_attempts} of them also with the bug's fix), {time.monotonic() - began:.1f} s"
    )
    script = portable(script)
    return Reduction(
        script=script,
        lines_before=code_lines(before),
        lines_after=code_lines(script),
        seconds=time.monotonic() - began,
        attempts=oracle.attempts,
        signature=oracle.signature,
        pool_attempts=oracle.pool_attempts,
        pool_seconds=oracle.pool_seconds,
        torchrun_attempts=oracle.torchrun_attempts,
        torchrun_seconds=oracle.torchrun_seconds,
    )


def reduce_again(
    entry: Entry,
    kept: str,
    source: str = "",
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    say: Callable[[str], None] = lambda _: None,
) -> Reduction:
    """``kept`` (a reduced script of ``entry``) reduced further: the passes after folding
    (delta debugging, with plain values folded) start from it instead of from the unreduced
    script, under the same oracles (the pool, torchrun, the bug's fix where it applies, a
    mismatch's judge and observations). InvalidArgument if ``kept`` does not reproduce here, or
    is a mismatch script whose judge it no longer names while the fix cannot be checked."""
    began = time.monotonic()
    name = source or entry.file_name
    tree = ast.parse(kept)
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant):
        tree.body = tree.body[1:]  # the docstring: rendered again
    code = ast.unparse(tree) + "\n"
    code = lift_attempt(code, entry) or code  # a hang's or a crash's case, out of ``main``
    status, output, seconds = run_kept(kept, entry, timeout=600.0)
    signature = reproduced(status, output)
    if signature is None:
        raise InvalidArgument(
            f"{name}: its kept script does not reproduce the failure here ({why_not(status, output)})"
        )
    say(f"{name}: the kept script reproduced {signature} in {seconds:.1f} s")
    code = checked(code, entry, signature)  # the check the attempts are judged by
    oracle = _Oracle(entry, source, signature, seconds * TIMEOUT_FACTOR + TIMEOUT_SLACK_S, say)
    try:
        oracle.prepare_fix()
        if budget_s > 0:
            oracle.open_pool(code)
        oracle.open_fix(code)
        frozen: frozenset[str] = frozenset()
        if oracle.judge_free:
            code = _signature_free(code, signature, oracle)
        elif entry.kind == "mismatch" and signature_free(code, signature) is None:
            raise InvalidArgument(
                f"{name}: the kept script's check takes any failure of its judge, which needs the bug's fix checked, "
                "and it is not checked here: reduce it where the fix applies, or from the unreduced script "
                "(--reduce --refresh)"
            )
        if entry.kind == "mismatch" and not oracle.judge_free:
            frozen = _judge_side(code, entry, {})
            if not frozen:
                raise InvalidArgument(
                    f"{name}: the kept script no longer names its judge and the bug's fix is not checked here: "
                    "reduce it from the unreduced script (--reduce --refresh)"
                )
        kept_on_way: list[str] = []
        reduced = ddmin(
            code,
            oracle,
            time.monotonic() + budget_s,
            tidy=lambda text: tidy(text, entry, {}),
            frozen=frozen,
            pretest=oracle.pool is not None,
            kept=kept_on_way,
            fold_values=lambda text: oracle.fold_values(text, frozen),
            say=say,
        )
        reduced = _confirmed(reduced, code, oracle, "delta-debugged", kept_on_way)
        reduced = oracle.plain_form(reduced) or reduced
    finally:
        oracle.end()
    return _reduction(oracle, kept, render_flat(entry, source, signature, reduced), began, name)


def reduce_kept_again(
    entry_path: Path,
    entry: Entry,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    say: Callable[[str], None] = lambda _: None,
) -> tuple[str, Reduction]:
    """The kept reduced script of the entry reduced further (:func:`reduce_again`), stored in its
    place if shorter. Its header keeps the carried sources it was first reduced from, and counts
    the seconds of both reductions."""
    path = stored_path(entry_path)
    kept = stored_script(entry_path, entry)
    if kept is None:
        raise InvalidArgument(f"{entry_path}: no current reduced script is kept beside it (reduce it first: --reduce)")
    result = reduce_again(entry, kept, str(entry_path), budget_s=budget_s, say=say)
    if result.lines_after >= code_lines(kept):
        say(f"{entry_path}: kept the stored script: the new reduction is no shorter ({result.lines_after})")
        result.script = kept
        return kept, result
    fields = header_fields(kept)
    seconds = float(fields.get("seconds", "0")) + result.seconds
    result.script = _store(path, result.script, stored_header(entry, seconds, fields.get("sources", "?")))
    return result.script, result


def _judge_side(code: str, entry: Entry, origins: Origins) -> frozenset[str]:
    """For a mismatch, the definitions of the flat script that the property's judge uses (the
    judge and what it names, transitively): delta debugging leaves them as they are. What the
    judge does not name (the known-bug registry once the judge's case functions are folded, see
    :func:`fuzz.repro.specialize.fold_case_functions`) may be cut like the rank code."""
    if entry.kind != "mismatch":
        return frozenset()
    judge = get_property(entry.case.property).judge
    flat_of = {origin: flat for flat, origin in origins.items()}
    return frozen_for(code, {flat_of.get((judge.__module__, judge.__name__), judge.__name__)})


def _signature_free(code: str, signature: str, oracle: _Oracle) -> str:
    """``code`` with the check that takes any failure of its judge (:func:`signature_free`)
    where that reproduces (and passes with the bug's fix, which ``oracle`` checks), else
    ``code``."""
    free = signature_free(code, signature)
    if free is None or free == code:
        return code
    if not oracle(free):
        oracle.say("  the check that takes any failure of the judge did not reproduce: the signature stays checked")
        return code
    oracle.say("  the check takes any failure of the judge (the fix tells the bug's): its signature is cut too")
    return free


def quick_hang(script: str) -> str:
    """A hang script with its watcher's wait of :data:`QUICK_HANG_AFTER_S` instead of
    HANG_AFTER_S, where the script has it as written (a candidate that passes ends once every
    rank has finished: the harness waits for no more)."""
    return script.replace(f"time.sleep({HANG_AFTER_S})", f"time.sleep({QUICK_HANG_AFTER_S})")


def _confirmed(code: str, verified: str, oracle: _Oracle, what: str, kept: list[str] | None = None) -> str:
    """``code`` if it is ``verified`` or reproduces under torchrun, else ``verified`` (a script
    that reproduced there). Needed only where the pool ran the attempts, or where a hang's ran
    with the short wait (:func:`quick_hang`). Where the pool kept
    scripts on the way (``kept``, in order) that torchrun does not confirm at the end (a rank
    that carried state from one attempt to the next), the last of them that torchrun confirms
    is found by bisection (at most :data:`BISECTIONS` torchruns) before falling back."""
    if code == verified or (oracle.pool is None and not oracle.quick_hang) or oracle.torchrun(code, full=True):
        return code
    lines = code_lines(verified)
    candidates = [c for c in (kept or []) if c != code]
    good, bad, tries = -1, len(candidates), 0
    while bad - good > 1 and tries < BISECTIONS:  # kept[good] reproduces (or is ``verified``)
        middle = (good + bad) // 2
        tries += 1
        if oracle.torchrun(candidates[middle], full=True):
            good = middle
        else:
            bad = middle
    if good >= 0:
        oracle.say(
            f"  the {what} script does not reproduce under torchrun: kept an earlier one that does "
            f"({code_lines(candidates[good])} code lines)"
        )
        return candidates[good]
    oracle.say(f"  the {what} script does not reproduce under torchrun: kept the one before ({lines} code lines)")
    return verified


def reduce_and_store(
    entry_path: Path,
    entry: Entry,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    refresh: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> tuple[str, Reduction | None]:
    """The entry's reduced script: the stored one if current (with ``refresh``, also reduced from
    the carried sources as they are now, and kept only if that is shorter than the stored one
    and the stored one passes with its bug's fix where one is written: a script reduced before
    the fix was does not always), else a new reduction, stored beside the entry (written whole,
    and only once it reproduced)."""
    stored = stored_script(entry_path, entry, refresh=refresh)
    if stored is not None:
        return stored, None
    if printable(entry):
        return store_printed(entry_path, entry, say=say), None
    result = reduce_entry(entry, str(entry_path), budget_s=budget_s, say=say)
    previous = stored_script(entry_path, entry)  # one reduced from older sources, with refresh
    if previous is not None and code_lines(previous) <= result.lines_after:
        with tempfile.TemporaryDirectory(prefix="shardfuzz-fixed-") as tmp:
            from fuzz.repro.bench import run_fixed

            with_fix = run_fixed(previous, entry, Path(tmp))
        if with_fix in (None, "passed"):
            say(
                f"{entry_path}: kept the stored script ({code_lines(previous)} code lines, reduced from older "
                f"sources): the new reduction is no shorter ({result.lines_after})"
            )
            return previous, result
        say(
            f"{entry_path}: replaced the stored script ({code_lines(previous)} code lines, reduced from older "
            f"sources) though it is shorter: it does not pass with its bug's fix ({with_fix})"
        )
    result.script = _store(stored_path(entry_path), result.script, stored_header(entry, result.seconds))
    return result.script, result


def store_printed(entry_path: Path, entry: Entry, *, say: Callable[[str], None] = lambda _: None) -> str:
    """An entry's script printed from its case (:func:`fuzz.repro.printed.print_entry`),
    stored beside the entry once it reproduces under torchrun here (exit 1) and passes with its
    bug's fix where one is written (exit 0); else InvalidArgument, and nothing is stored."""
    from fuzz.repro.bench import run_fixed

    start = time.monotonic()
    script = print_entry(entry)
    status, output, seconds = run_script(script, timeout=600.0, nproc=entry.case.world_size)
    said = [line for line in output.splitlines() if line.startswith(VERDICT_WORDS)]
    if status != 1 or not any(line.startswith("REPRODUCED") for line in said):
        raise InvalidArgument(f"{entry_path}: its printed script does not reproduce here ({why_not(status, output)})")
    say(f"{entry_path}: printed, {code_lines(script)} code lines, reproduced in {seconds:.1f} s: {said[0][:200]}")
    with tempfile.TemporaryDirectory(prefix="shardfuzz-fixed-") as tmp:
        with_fix = run_fixed(script, entry, Path(tmp))
    if with_fix not in (None, "passed"):
        raise InvalidArgument(f"{entry_path}: its printed script does not pass with its bug's fix ({with_fix})")
    say(f"{entry_path}: with its bug's fix: {with_fix or 'no fix written'}")
    return _store(stored_path(entry_path), script, stored_header(entry, time.monotonic() - start))


def _store(path: Path, script: str, header: str) -> str:
    """``script`` with ``header`` as its second line, written whole to ``path`` (a temporary file
    renamed into place); returns what was written."""
    lines = script.splitlines(keepends=True)
    text = "".join([lines[0], header + "\n", *lines[1:]])
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return text
