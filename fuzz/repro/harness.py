"""The entry point of a reduced reproducer: the case on every rank, and the failure's own check.

An unreduced script runs the case under the pool's machinery (:mod:`fuzz.repro.runtime`: a judge
process, rank watchers, the property's judge over every rank's outcome). A reduced script keeps
only what its failure needs to be seen, in the script's ``main``:

- the case as a constructor expression of the model's dataclasses (:func:`case_expression`),
  fields left at their defaults left out;
- every rank builds its :class:`~fuzz._rank.context.RankContext` from torchrun's environment
  and calls the body's rank program directly;
- then the check of the failure's kind: an exception is matched by type and innermost torch
  frame, as :func:`fuzz.signature.location` reads a traceback, by the torch API it entered by
  (:func:`fuzz.signature.entry_point`) and by its message but for numbers, where the entry
  tells; a mismatch by
  the property's judge over every rank's observation (gathered to rank 0); a hang by the stuck
  main thread's stack after :data:`HANG_AFTER_S`; a crash by the signal and faulthandler's
  stack of the rank, run as a child process.

The check prints ``REPRODUCED <signature>`` and exits 1 only when the failure is there;
otherwise the script exits 0. An exception's reduced script is then kept in its plain form
where that is confirmed (:func:`plain`, below): the case alone, the exception left to
propagate, the same rule applied from outside to what the ranks printed
(:func:`raised_verdicts`).

The case is in a function of its own, ``attempt(rank, world_size)``, which the reducer cuts
like the rest of the script (it leaves ``main`` as it is). For an exception or a mismatch
(:data:`POOLED_KINDS`) ``attempt`` holds the check too and returns the verdict line instead of
printing it and exiting; ``main`` brings up torchrun's process group, calls it, prints the
verdict and exits 1 if it says ``REPRODUCED``. The reducer runs ``attempt`` in the ranks of a
warm :class:`fuzz.pool.RankPool` (:meth:`~fuzz.pool.RankPool.run_script`) rather than a
torchrun per candidate. For a hang or a crash ``main`` holds the check (the watcher, the child
process) around its call of ``attempt``.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import re
import textwrap
from typing import Any

from fuzz.corpus import Entry
from fuzz.properties import get_property
from fuzz.signature import Signature, entry_point, torch_frame

#: Seconds after which a rank still in a hang case is looked at.
HANG_AFTER_S = 20


def _literal(value: Any, classes: dict[str, str], keep: set[str] | None = None) -> str:
    """``value`` (a model object) as a constructor expression; ``classes`` collects the classes
    it names (name -> module). Fields with a default are left out where they hold it, or where
    ``keep`` is given and does not name them."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        classes[cls.__qualname__] = cls.__module__
        args = []
        for f in dataclasses.fields(value):
            if not f.init:
                continue
            v = getattr(value, f.name)
            optional = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if f.default is not dataclasses.MISSING and _same(v, f.default):
                continue
            if f.default_factory is not dataclasses.MISSING and _same(v, f.default_factory()):
                continue
            if optional and keep is not None and f.name not in keep:
                continue
            args.append(f"{f.name}={_literal(v, classes, keep)}")
        return f"{cls.__qualname__}({', '.join(args)})"
    if isinstance(value, enum.Enum):
        kind = type(value)
        classes[kind.__qualname__] = kind.__module__
        return f"{kind.__qualname__}.{value.name}"
    if isinstance(value, tuple):
        items = [_literal(v, classes, keep) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(value, frozenset):
        return (
            f"frozenset({{{', '.join(_literal(v, classes) for v in sorted(value, key=repr))}}})"
            if value
            else "frozenset()"
        )
    return repr(value)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def case_expression(case: Any, keep: set[str] | None = None) -> tuple[str, dict[str, str]]:
    """(the case as an expression, the classes it names: name -> module); with ``keep``, only
    the fields it names (and those without a default)."""
    classes: dict[str, str] = {}
    return _literal(case, classes, keep), classes


def _expected_exceptions(signatures: list[str]) -> list[str]:
    """``type@where`` of every exception signature in ``signatures``."""
    out = []
    for text in signatures:
        sig = Signature.parse(text)
        if sig is not None and sig.kind in ("exception", "crash", "hang"):
            out.append(f"{sig.check}@{sig.where}" if sig.check else sig.where)
    return sorted(set(out))


#: The first statement of every ``main`` after ``import os``: the script is a CPU program (gloo,
#: ``RankContext(device=cpu)``), and a reduced one may have lost what pinned a tensor or mesh to
#: the CPU (``fully_shard`` without ``mesh=`` takes the accelerator's mesh where there is one).
#: So a GPU host runs it as a CPU-only host does.
HIDE_ACCELERATORS = "os.environ['CUDA_VISIBLE_DEVICES'] = ''"

#: A script's exit status (every rank's, and ``python -m fuzz repro``'s account of it):
#: :data:`EXIT_PASSED` where every rank finished and the check found nothing,
#: :data:`EXIT_REPRODUCED` where the entry's failure is there, :data:`EXIT_OTHER` where the
#: script could not run the case (not under torchrun, another world size) or the case failed in
#: another way (another exception, another mismatch, a rank stuck elsewhere). torchrun's own
#: status is 1 whenever a rank exits non-zero; its failure summary lists each rank's.
EXIT_PASSED, EXIT_REPRODUCED, EXIT_OTHER = 0, 1, 2

#: The first statements of every ``main``: the GPUs hidden before anything else.
_FIRST = f"    import os\n    {HIDE_ACCELERATORS}\n"
#: Then: refuse to run outside torchrun or at another world size (exit
#: :data:`EXIT_OTHER`), bring up torchrun's process group.
_HEAD = """\
    import sys
    import time
    if os.environ.get("WORLD_SIZE") != "{world_size}":
        print("run it with: torchrun --nproc-per-node {world_size} " + sys.argv[0], file=sys.stderr)
        sys.exit(2)
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
"""

#: The end of every ``main`` for a rank that found nothing wrong: it waits (on torchrun's store,
#: not a collective, which could unblock a rank stuck in the case) until every rank has found
#: nothing, and rank 0 alone says PASS; a rank that reproduces or fails exits at once and
#: torchrun ends the others, so no PASS is printed beside a failure.
_PASSED = """\
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store.add("repro-passed", 1)
    until = time.monotonic() + {wait}
    while store.add("repro-passed", 0) < world_size:
        if time.monotonic() > until:
            print(f"FAIL (not the entry's failure): rank {{rank}} finished, another rank did not", flush=True)
            os._exit(2)
        time.sleep(0.05)
    if rank == 0:
        print({passing}, flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
"""
#: The end of a mismatch's ``main``: rank 0's verdict is the script's (every rank has gathered
#: its observation to it); a passing verdict is printed by rank 0 alone.
_JUDGED = """\
    if verdict:
        print(verdict, flush=True)
    os._exit(0)
"""
#: How long a rank that passed waits for the others to pass.
PASS_WAIT_S = 60

#: The verdict line of an exception's script where no rank raised (the checked form's
#: ``attempt`` returns it; rank 0 of the plain form prints it once every rank finished).
NO_RANK_RAISED = "PASS: no rank raised"
#: The verdict lines of a script that found nothing wrong, one per kind of check below: an
#: exception, a mismatch, a hang, a crash.
PASSING = frozenset(
    {
        NO_RANK_RAISED,
        "PASS or another failure: None",
        "PASS: every rank finished",
        "PASS: no rank died",
        "PASS: every loss, gradient and parameter agrees",  # a printed script's (fuzz.repro.printed)
    }
)

#: The kinds whose check is a function of the rank, ``attempt(rank, world_size)``, returning
#: the verdict line: a rank of :class:`fuzz.pool.RankPool` can run it in its process group
#: (:meth:`fuzz.pool.RankPool.run_script`), so that the reducer's attempts need no torchrun.
POOLED_KINDS = ("exception", "mismatch")
#: The function of a pooled script that runs the case and checks it on one rank.
ATTEMPT = "attempt"

_ATTEMPT_PRELUDE = """\
def attempt(rank, world_size):
    import torch
    import torch.distributed as dist
{imports}
    case = {case}
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device("cpu"), backend="gloo")
"""

#: A frame of a Python traceback or of faulthandler's output: the file and the function.
FRAME = r'File "([^"]+)", line \d+,? in (\S+)'

_EXCEPTION = """\
    import re
    import traceback
    try:
        {program}(case, case.body, ctx)
    except BaseException as e:  # torch's CheckpointException is a BaseException
        frames = [f for f in (torch_frame(p, f) for p, f in re.findall(r'{frame}', traceback.format_exc())) if f]
        found = f"{{type(e).__module__}}.{{type(e).__qualname__}}@{{(frames or ['torch/?:?'])[-1]}}"
        if {match}:
            return f"REPRODUCED {signature}: rank {{rank}} raised {{found}}: {{e}}"
        return f"FAIL (not the entry's failure): rank {{rank}} raised {{found}}: {{e}}"
    return {passing!r}
"""

_MISMATCH = """\
    import json
    obs = json.loads(json.dumps({program}(case, case.body, ctx)))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ""
    reports = tuple(RankReport(rank=r, observation=o) for r, o in enumerate(outs))
    failure = {judge}(case, Outcome(kind=OutcomeKind.OK, ranks=reports, seconds=0.0))
    if failure is not None and failure.signature in {expected!r}:
        import hashlib
        observed = hashlib.sha256(json.dumps(outs, sort_keys=True).encode()).hexdigest()[:16]
        return f"REPRODUCED {{failure.signature}}: observations {{observed}}: {{failure.summary}}"
    return f"PASS or another failure: {{failure and failure.signature}}"
"""

#: ``main`` of a pooled script: its verdict as the exit status (1: reproduced, 2: another
#: failure; a rank that passed, or one that does not judge, waits for the others: ``_PASSED``).
_ATTEMPT_MAIN = """\

def main():
{head}\
    verdict = attempt(rank, world_size)
    if verdict and verdict not in {passing!r}:
        sys.stdout.write(verdict + "\\n")  # one write: the ranks share torchrun's output
        sys.stdout.flush()
        os._exit(1 if verdict.startswith("REPRODUCED") else 2)
{passed}"""

#: A hang's ``main``: a watcher thread looks at the main thread after ``{after}`` seconds; a
#: rank still in the case is stuck in one of the entry's frames (exit 1) or elsewhere (exit 2).
_HANG = """\
    import threading
    import traceback
    finished = threading.Event()

    def watch():
        time.sleep({after})
        if finished.is_set():
            return
        stack = traceback.extract_stack(sys._current_frames()[threading.main_thread().ident])
        frames = [torch_frame(f.filename, f.name) for f in stack]
        print(f"rank {{rank}} is still in the case after {after} s:", file=sys.stderr)
        sys.stderr.write("".join(traceback.format_list(stack)))
        if any(f in {expected!r} for f in frames):
            print(f"REPRODUCED {signature}: rank {{rank}} is stuck", flush=True)
            os._exit(1)
        where = ([f for f in frames if f] or ["?"])[-1]
        print(f"FAIL (not the entry's failure): rank {{rank}} is still running, in {{where}}", flush=True)
        os._exit(2)

    threading.Thread(target=watch, daemon=True).start()
    attempt(rank, world_size)
    finished.set()
"""

#: A crash's ``main``: each rank runs the case in a child process (itself, with ``REPRO_CHILD``)
#: and reads the signal and faulthandler's innermost frame of torch from what it wrote.
_CRASH_HEAD = """\
    import re
    import subprocess
    import sys
    if os.environ.get("WORLD_SIZE") == "{world_size}" and not os.environ.get("REPRO_CHILD"):
        env = {{**os.environ, "REPRO_CHILD": "1"}}
        child = subprocess.run([sys.executable, __file__], env=env, stderr=subprocess.PIPE, text=True)
        sys.stderr.write(child.stderr)
        frames = [torch_frame(p, f) for p, f in re.findall(r'{frame}', child.stderr)]
        found = f"signal {{child.returncode}}@{{([f for f in frames if f] or ['?'])[0]}}"
        if found in {expected!r}:
            print(f"REPRODUCED {signature}: rank {{os.environ['RANK']}} died: {{found}}", flush=True)
            sys.exit(1)
        if child.returncode != 0:
            print(f"FAIL (not the entry's failure): rank {{os.environ['RANK']}}: {{found}}", flush=True)
            sys.exit(2)
        import torch.distributed as dist
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
{passed}\
    import faulthandler
    faulthandler.enable()
"""

#: The body of ``attempt`` for a hang or a crash: the case alone (``main`` checks it).
_RUN = """\
    {program}(case, case.body, ctx)
"""

#: The rest of a crash's ``main`` (its check, the child process, is at its head): the child
#: runs the case and exits 0.
_CRASH = """\
    attempt(rank, world_size)
    os._exit(0)
"""


def torch_frame_source() -> str:
    """:func:`fuzz.signature.torch_frame` as a script carries it: the one rule of "a frame
    inside torch", its source without the docstring."""
    fn = ast.parse(textwrap.dedent(inspect.getsource(torch_frame))).body[0]
    assert isinstance(fn, ast.FunctionDef)
    if ast.get_docstring(fn) is not None:
        fn.body = fn.body[1:]
    return ast.unparse(fn) + "\n"


def _signatures(entry: Entry, signature: str) -> list[str]:
    """The signatures a script's check takes as the entry's failure: ``signature`` (what the
    unreduced script printed) and the entry's own."""
    return sorted({signature, entry.signature, *entry.signatures})


def hang_expected(entry: Entry, signature: str) -> list[str]:
    """The frames (``torch/FILE:FUNCTION``) a hang's watcher takes as the entry's hang, one of
    them anywhere on the stuck main thread's stack."""
    return sorted({":".join(e.split(":")[:2]) for e in _expected_exceptions(_signatures(entry, signature))})


def hang_verdict(entry: Entry, signature: str, rank: int, stack: str) -> str | None:
    """The verdict line a hang script's watcher prints for a rank whose main thread is stuck
    with ``stack`` (``traceback.format_stack``'s text): ``REPRODUCED`` where a frame of it is
    one of the entry's (``_HANG``'s rule, by :func:`fuzz.signature.torch_frame`), else None."""
    expected = hang_expected(entry, signature)
    if any(torch_frame(file, function) in expected for file, function in re.findall(FRAME, stack)):
        return f"REPRODUCED {signature}: rank {rank} is stuck"
    return None


def crash_found(status: int, stack: str) -> str:
    """What a crash's check reads from a dead rank (its exit status, faulthandler's output):
    ``signal -11@torch/FILE:FUNCTION`` of the innermost frame of torch, as ``_CRASH_HEAD`` does
    in the script; "" where no frame of torch is in it."""
    frames = [f for f in (torch_frame(p, fn) for p, fn in re.findall(FRAME, stack)) if f]
    return f"signal {status}@{frames[0]}" if frames else ""


def crash_expected(entry: Entry, signature: str) -> list[str]:
    """What a crash's check takes as the entry's crash (:func:`crash_found`'s form)."""
    return _signal_names(_expected_exceptions(_signatures(entry, signature)))


def crash_verdict(entry: Entry, signature: str, rank: int, status: int, stack: str) -> str | None:
    """The verdict line a crash script prints for a rank that died so (``REPRODUCED``), or
    None where it is not the entry's crash."""
    found = crash_found(status, stack)
    return f"REPRODUCED {signature}: rank {rank} died: {found}" if found in crash_expected(entry, signature) else None


def _signal_names(expected: list[str]) -> list[str]:
    """``signal SIGSEGV@where`` as the child's status reads: ``signal -11@where``."""
    import signal

    out = []
    for text in expected:
        cause, at, where = text.partition("@")
        name = cause.removeprefix("signal ")
        if name.startswith("SIG") and hasattr(signal, name):
            out.append(f"signal {-int(getattr(signal, name))}{at}{where}")
    return out


#: What a message's first line keeps when compared: numbers (paths into the tree, values,
#: sizes) change as a reduction drops modules and steps, so each run of digits and dots is one
#: ``#``; and the items of a brace display (a set's repr, ``{torch.float32, torch.bfloat16}``,
#: whose order follows the objects' hashes and so varies from one process to the next) are
#: sorted. The checked script computes the same with the patterns written out
#: (``_SHAPE_IN_SCRIPT``).
_NUMBERS = re.compile(r"\d+(?:\.\d+)*")
_BRACES = re.compile(r"\{([^{}]*)\}")
_SHAPE_IN_SCRIPT = (
    r"""re.sub(r'\{([^{}]*)\}', lambda m: '{' + ', '.join(sorted(m[1].split(', '))) + '}', """
    r"""re.sub(r'\d+(?:\.\d+)*', '#', str(e).partition('\n')[0]))"""
)


def message_shape(message: str) -> str:
    """The shape of an exception message's first line (see ``_NUMBERS``)."""
    numbered = _NUMBERS.sub("#", message.partition("\n")[0])
    return _BRACES.sub(lambda m: "{" + ", ".join(sorted(m[1].split(", "))) + "}", numbered)


def _raised(entry: Entry) -> tuple[str | None, str | None]:
    """(the torch API the entry's exception entered by, :func:`fuzz.signature.entry_point`; the
    shape of its message's first line) from the first rank's traceback that has one; None for
    what the entry does not tell."""
    ranks = entry.details.get("ranks") if isinstance(entry.details, dict) else None
    for rank in ranks or []:
        point = entry_point(rank.get("traceback")) if isinstance(rank, dict) else None
        if point:
            message = rank.get("message")
            return point, message_shape(message) if isinstance(message, str) else None
    return None, None


def exception_rule(entry: Entry, signature: str) -> tuple[list[str], str | None, str | None]:
    """What an exception must be to be the entry's: (``type@innermost torch frame`` of each of its
    signatures, the torch API it entered by or None, its message's first line with numbers as
    ``#`` or None). The checked script's ``attempt`` writes this rule out; :func:`raised_verdicts`
    applies it to what a plain script's ranks printed."""
    expected = _expected_exceptions(_signatures(entry, signature))
    entered, shape = _raised(entry)
    return expected, entered, shape


def main_of(entry: Entry, signature: str, plain: bool = False) -> str:
    """The harness of a script: :func:`fuzz.signature.torch_frame` as the script carries it, and
    ``main`` (the ``__main__`` block of an exception's ``plain`` form), which runs ``attempt`` on
    every rank under torchrun and exits :data:`EXIT_REPRODUCED`, :data:`EXIT_PASSED` or
    :data:`EXIT_OTHER`."""
    kind = entry.kind
    n = entry.case.world_size
    head = _HEAD.format(world_size=n)
    fields: dict[str, Any] = {"signature": signature, "after": HANG_AFTER_S, "frame": FRAME, "world_size": n}
    rule = torch_frame_source()
    if plain:
        expected = _expected_exceptions(_signatures(entry, signature))
        main = _PLAIN_MAIN.format(head=_FIRST + head, expected=expected, **fields)
        return rule + "\n\n" + main + _passed(NO_RANK_RAISED)
    if kind == "mismatch":  # every rank took part in the gather rank 0 judged: it alone speaks
        head = head.replace("    import time\n", "")
        return _ATTEMPT_MAIN.format(head=_FIRST + head, passing=sorted(PASSING), passed=_JUDGED)
    if kind in POOLED_KINDS:
        return rule + _ATTEMPT_MAIN.format(head=_FIRST + head, passing=sorted(PASSING), passed=_passed(""))
    if kind == "hang":
        body = _HANG.format(expected=hang_expected(entry, signature), **fields)
        return rule + "\n\ndef main():\n" + _FIRST + head + body + _passed("PASS: every rank finished")
    passed = textwrap.indent(_passed("PASS: no rank died"), "    ")
    crash = _CRASH_HEAD.format(expected=crash_expected(entry, signature), passed=passed, **fields)
    return rule + "\n\ndef main():\n" + _FIRST + crash + head + _CRASH


def _passed(passing: str) -> str:
    """``_PASSED`` for a script whose rank 0 says ``passing`` (a pooled script: its verdict)."""
    said = repr(passing) if passing else "verdict or " + repr(NO_RANK_RAISED)
    return _PASSED.format(wait=PASS_WAIT_S, passing=said)


def main_source(entry: Entry, signature: str) -> tuple[str, list[str]]:
    """(the reduced script's ``attempt`` and harness (:func:`main_of`), the carried modules it
    imports). ``signature`` is what the unreduced script printed for the entry.
    ``attempt(rank, world_size)`` is the case on one rank in a process group already up. For the
    :data:`POOLED_KINDS` ``attempt`` also checks the case and returns the verdict line, which
    ``main`` prints and exits with; for a hang or a crash ``main`` checks it."""
    case = entry.case
    program_module, program = case.body.PROGRAM.split(":")
    judge = get_property(case.property).judge
    signatures = _signatures(entry, signature)
    expression, classes = case_expression(case)
    imports = {"fuzz._rank.context": ["RankContext"], program_module: [program]}
    for name, module in classes.items():
        imports.setdefault(module, []).append(name)
    kind = entry.kind
    fields: dict[str, Any] = {"program": program, "signature": signature}
    if kind == "mismatch":
        imports.setdefault(judge.__module__, []).append(judge.__name__)
        imports.setdefault("fuzz.verdict", []).extend(["Outcome", "OutcomeKind", "RankReport"])
        body = _MISMATCH.format(judge=judge.__name__, expected=signatures, **fields)
    elif kind == "exception":
        # The same failure entered torch by the same API, with the same message but for its
        # numbers: a generic innermost frame (nn.Module.__getattr__'s AttributeError) is met by
        # many a broken script, through the same API too.
        expected, entered, shape = exception_rule(entry, signature)
        match = f"found in {expected!r}" + (f" and frames[0] == {entered!r}" if entered else "")
        match += f" and {_SHAPE_IN_SCRIPT} == {shape!r}" if shape else ""
        body = _EXCEPTION.format(match=match, passing=NO_RANK_RAISED, frame=FRAME, **fields)
    else:
        body = _RUN.format(**fields)
    lines = [f"    from {module} import {', '.join(sorted(set(names)))}" for module, names in sorted(imports.items())]
    head = _ATTEMPT_PRELUDE.format(imports="\n".join(lines), case=expression)
    return head + body + "\n\n" + main_of(entry, signature), sorted(imports)


class _RankOfContext(ast.NodeTransformer):
    """``ctx.rank`` read as ``rank``."""

    def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
        if node.attr == "rank" and isinstance(node.value, ast.Name) and node.value.id == "ctx":
            return ast.copy_location(ast.Name("rank", ast.Load()), node)
        return self.generic_visit(node)  # type: ignore[return-value]


def lift_attempt(code: str, entry: Entry) -> str | None:
    """A hang's or a crash's flat script ``code`` of the shape scripts were rendered in before
    :func:`main_source` gave them ``attempt``: the case, its context and the program's call
    taken out of ``main`` (which the reducer leaves as it is) into ``attempt(rank,
    world_size)``, so that they are cut like the rest. None where ``code`` has ``attempt``
    already, is of another kind, or its ``main`` reads the case or its context elsewhere."""
    tree = ast.parse(code)
    main = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"), None)
    if entry.kind not in ("hang", "crash") or main is None or _attempt_of(tree) is not None:
        return None

    def reads(node: ast.AST) -> set[str]:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in ("case", "ctx")}

    moved: list[ast.stmt] = []
    kept: list[ast.stmt] = []
    for stmt in main.body:
        assigned = isinstance(stmt, ast.Assign) and [ast.unparse(t) for t in stmt.targets] in (["case"], ["ctx"])
        if assigned or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and reads(stmt)):
            moved.append(stmt)
            if not assigned:
                kept.append(ast.parse("attempt(rank, world_size)").body[0])
        else:
            kept.append(stmt)
    if sum(not isinstance(s, ast.Assign) for s in moved) != 1:
        return None
    main.body = kept
    main = _RankOfContext().visit(main)  # the watcher's rank
    if reads(main):
        return None
    attempt = ast.parse("def attempt(rank, world_size):\n    import torch").body[0]
    assert isinstance(attempt, ast.FunctionDef)
    attempt.body += moved
    tree.body.insert(tree.body.index(main), attempt)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


# -- the plain form of an exception's script ---------------------------------------------------
#
# What a maintainer pastes into an issue: the case on every rank, and nothing around it. The
# exception is left to propagate: torch's excepthook prints it on the rank's standard error
# behind ``[rankN]: `` and torchrun exits 1, or every rank prints PASS and the script exits 0.
# The check of the checked form (``attempt``'s ``try``) is then applied from outside, to what
# the ranks printed (:func:`raised_verdicts`), by the same rule (:func:`exception_rule`).

_PLAIN_MAIN = """\
if __name__ == "__main__":
{head}\
    import re
    import traceback
    try:
        attempt(rank, world_size)
    except BaseException as e:  # torch's CheckpointException is a BaseException
        text = traceback.format_exc()
        sys.stderr.write("".join(f"[rank{{rank}}]: {{line}}\\n" for line in text.splitlines()))
        frames = [f for f in (torch_frame(p, f) for p, f in re.findall(r'{frame}', text)) if f]
        found = f"{{type(e).__module__}}.{{type(e).__qualname__}}@{{(frames or ['torch/?:?'])[-1]}}"
        if found in {expected!r}:
            print(f"REPRODUCED {signature}: rank {{rank}} raised {{found}}", flush=True)
            os._exit(1)
        print(f"FAIL (not the entry's failure): rank {{rank}} raised {{found}}", flush=True)
        os._exit(2)
"""


def _attempt_of(tree: ast.Module) -> ast.FunctionDef | None:
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == ATTEMPT), None)


def _is_check(node: ast.stmt) -> bool:
    """Whether ``node`` is the checked form's ``try: ... except BaseException as e:``."""
    return (
        isinstance(node, ast.Try)
        and len(node.handlers) == 1
        and isinstance(node.handlers[0].type, ast.Name)
        and node.handlers[0].type.id == "BaseException"
        and not node.orelse
        and not node.finalbody
    )


def _is_main(node: ast.stmt) -> bool:
    if isinstance(node, ast.FunctionDef):
        return node.name in ("main", "torch_frame")
    return isinstance(node, ast.If) and "__name__" in ast.unparse(node.test)


def is_plain(script: str) -> bool:
    """Whether ``script`` is an exception's plain form: its ``__main__`` block runs ``attempt``,
    which holds the case alone (the check is the block's)."""
    tree = ast.parse(script)
    block = next((n for n in tree.body if isinstance(n, ast.If) and "__name__" in ast.unparse(n.test)), None)
    calls = [] if block is None else [n for n in ast.walk(block) if isinstance(n, ast.Call)]
    return any(isinstance(c.func, ast.Name) and c.func.id == ATTEMPT for c in calls)


#: The modules the check of an exception's ``attempt`` imports (``_EXCEPTION``).
_CHECK_IMPORTS = {"re", "traceback"}


def plain(code: str, entry: Entry, signature: str) -> str | None:
    """The plain form of an exception's checked flat script ``code``: ``attempt`` without the
    check around the case (nor the imports only the check used), under a ``__main__`` block that
    runs it and checks what it raised (:func:`main_of`); None where ``code`` is not a checked
    exception script."""
    tree = ast.parse(code)
    fn = _attempt_of(tree)
    if fn is None or sum(_is_check(n) for n in fn.body) != 1:
        return None
    body: list[ast.stmt] = []
    for node in fn.body:
        if _is_check(node):
            assert isinstance(node, ast.Try)
            body.extend(node.body)
        elif (
            isinstance(node, ast.Return) and isinstance(node.value, ast.Constant) and node.value.value == NO_RANK_RAISED
        ):
            continue
        else:
            body.append(node)
    used = {n.id for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    fn.body = [
        n
        for n in body
        if not (isinstance(n, ast.Import) and all(a.name in _CHECK_IMPORTS and a.name not in used for a in n.names))
    ] or [ast.Pass()]
    tree.body = [n for n in tree.body if not _is_main(n)]
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n\n" + main_of(entry, signature, plain=True)


def current_harness(script: str, entry: Entry) -> str:
    """A kept script with the harness of :func:`main_of` as it is now (the reducer never cuts
    ``main``, so a script reduced before keeps the harness it was reduced with): its leading
    comments and the case as they are; ``torch_frame`` and ``main`` (or the ``__main__`` block)
    anew, and a checked exception's ``except`` as :func:`main_source` writes it."""
    lines = script.splitlines(keepends=True)
    cut = next((i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")), len(lines))
    head, code = "".join(lines[:cut]), "".join(lines[cut:])
    said = re.search(r"^# Reproduces shardfuzz corpus entry \S+: (.+)$", head, re.MULTILINE)
    signature = said[1].strip() if said else entry.signature
    was_plain = entry.kind == "exception" and is_plain(code)
    tree = ast.parse(code)
    tree.body = [n for n in tree.body if not _is_main(n)]
    fn = _attempt_of(tree)
    if entry.kind == "exception" and not was_plain and fn is not None:
        # the signature's rule, the one the script was kept by (as its plain form's)
        match = f"found in {_expected_exceptions(_signatures(entry, signature))!r}"
        check = _EXCEPTION.format(match=match, passing=NO_RANK_RAISED, frame=FRAME, program="run", signature=signature)
        handler = next(n for n in ast.parse(textwrap.dedent(check)).body if _is_check(n))
        for node in fn.body:
            if _is_check(node):
                assert isinstance(node, ast.Try) and isinstance(handler, ast.Try)
                node.handlers = handler.handlers
    body = ast.unparse(ast.fix_missing_locations(tree)) + "\n\n"
    if was_plain:
        return head + body + main_of(entry, signature, plain=True)
    return head + body + main_of(entry, signature) + '\n\nif __name__ == "__main__":\n    main()\n'


def signature_free(code: str, signature: str) -> str | None:
    """A mismatch script whose check takes any failure its judge reports, and says it is the
    entry's ``signature`` (None where ``code`` has no such check). Only for a bug whose fix is
    checked: a candidate must then also pass with the fix, so a failure that goes with the fix
    is the bug's whatever the judge names it, and the code that names it (the signature, its
    tags) is cut like the rest."""
    tree = ast.parse(code)
    fn = _attempt_of(tree)
    if fn is None:
        return None
    found = False
    failures: set[str] = set()
    for node in ast.walk(fn):
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And)):
            continue
        named = [v for v in node.test.values if _signature_in(v)]
        rest = [v for v in node.test.values if not _signature_in(v)]
        if len(named) != 1 or not rest:
            continue
        failure = named[0].left.value  # type: ignore[attr-defined]
        failures.add(ast.unparse(failure))
        node.test = rest[0] if len(rest) == 1 else ast.BoolOp(op=ast.And(), values=rest)
        said = ast.parse(f"return f{f'REPRODUCED {signature}: {{{ast.unparse(failure)}.summary}}'!r}").body[0]
        node.body = [said]
        found = True
    if not found:
        return None
    for node in ast.walk(fn):  # the passing verdict names no signature either
        if isinstance(node, ast.Attribute) and node.attr == "signature" and ast.unparse(node.value) in failures:
            node.attr = "summary"
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def _signature_in(node: ast.expr) -> bool:
    """``X.signature in [...]``: the check of the entry's signature."""
    return (
        isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Attribute)
        and node.left.attr == "signature"
        and len(node.ops) == 1
        and isinstance(node.ops[0], ast.In)
    )


def checked(code: str, entry: Entry, signature: str) -> str:
    """The checked form of a plain flat script ``code`` (:func:`plain` undone): ``attempt``'s
    body inside the check of :func:`main_source`, under its ``main``; ``code`` itself where it
    is not plain (or not an exception's)."""
    tree = ast.parse(code)
    fn = _attempt_of(tree)
    if entry.kind != "exception" or fn is None or any(_is_check(n) for n in fn.body):
        return code
    source, _ = main_source(entry, signature)
    template = ast.parse(source)
    check_fn = _attempt_of(template)
    assert check_fn is not None
    wrapped: list[ast.stmt] = []
    for node in check_fn.body:
        if _is_check(node):
            assert isinstance(node, ast.Try)
            node.body = fn.body
            wrapped.append(node)
        elif wrapped or (isinstance(node, ast.Import) and {a.name for a in node.names} <= _CHECK_IMPORTS):
            wrapped.append(node)  # the check's imports; its last return
    fn.body = wrapped
    tree.body = [n for n in tree.body if not _is_main(n)]
    tree.body += [n for n in template.body if isinstance(n, ast.FunctionDef) and n.name in ("torch_frame", "main")]
    tree.body += ast.parse('if __name__ == "__main__":\n    main()').body
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


_RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$", re.MULTILINE)
_CHAINED = re.compile(
    r"^(?:The above exception was the direct cause of the following exception:"
    r"|During handling of the above exception, another exception occurred:)$",
    re.MULTILINE,
)


#: What Python's traceback adds to an AttributeError's, a NameError's or an ImportError's
#: message (not ``str(e)``, which the entry and the checked form read).
_SUGGESTION = re.compile(r"\. Did you mean: '[^']*'\?$")


def _exception_line(text: str) -> tuple[str, str] | None:
    """(the type as ``module.qualname``, the message's first line) of the last exception of a
    traceback as Python prints it (a chain's last part; a message that holds tracebacks of its
    own, as DCP's CheckpointException does, comes after the line read)."""
    last = _CHAINED.split(text)[-1]
    lines = last.splitlines()
    try:
        at = lines.index("Traceback (most recent call last):")
    except ValueError:
        return None
    for line in lines[at + 1 :]:
        if line.startswith(" ") or not line.strip():
            continue
        name, _, message = line.partition(": ")
        name = name.rstrip(":")
        return (name if "." in name else f"builtins.{name}"), _SUGGESTION.sub("", message)
    return None


def raised_verdicts(entry: Entry, output: str, signature: str | None = None) -> list[str]:
    """The verdict line, as the checked form words it, of each rank whose uncaught exception
    torch's excepthook printed into ``output`` (a plain script's, under torchrun): REPRODUCED
    where the exception meets :func:`exception_rule`, else FAIL."""
    from fuzz.signature import entry_point, location

    signature = signature or entry.signature
    expected, entered, shape = exception_rule(entry, signature)
    by_rank: dict[int, list[str]] = {}
    for line in _RANK_LINE.finditer(output):
        by_rank.setdefault(int(line[1]), []).append(line[2])
    verdicts = []
    for rank, lines in sorted(by_rank.items()):
        text = "\n".join(lines)
        raised = _exception_line(text)
        if raised is None:
            continue
        kind, message = raised
        where = location(text)
        found = f"{kind}@{where if where.startswith('torch/') else 'torch/?:?'}"
        ok = found in expected and (entered is None or entry_point(text) == entered)
        ok = ok and (shape is None or message_shape(message) == shape)
        if ok:
            verdicts.append(f"REPRODUCED {signature}: rank {rank} raised {found}: {message}")
        else:
            verdicts.append(f"FAIL (not the entry's failure): rank {rank} raised {found}: {message}")
    return verdicts
