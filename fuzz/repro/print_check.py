"""The checking half of a printed script (:mod:`fuzz.repro.printed`): its ``main``.

- An exception: the composed training runs as it is; a rank that raises prints its traceback
  and exits 1 (``REPRODUCED``) where the exception is the entry's (its type, raised in the same
  innermost frame of torch's own code: :func:`fuzz.signature.torch_frame`, of which the script
  carries a copy, :func:`torch_frame_source`), else 2 (``FAIL``); where no rank raises, rank 0
  prints ``PASS`` once every rank finished, and every rank exits 0.
- A mismatch: the composed training and its reference, compared step by step with the
  tolerance policy of :mod:`fuzz.tolerance` (:func:`compare_lines`); rank 0 names the first
  tensor outside it (``REPRODUCED``, every rank exits 1) or prints ``PASS`` (exit 0); a rank that
  raises exits 2.

Outside ``torchrun --nproc-per-node N`` a script prints one line on how to run it and exits 2.
"""

from __future__ import annotations

import ast
import inspect

from fuzz.signature import torch_frame
from fuzz.tolerance import Tolerance

_TORCHRUN = """\
    if os.environ.get("WORLD_SIZE") != "{n}":
        print("run it with: torchrun --nproc-per-node {n} " + sys.argv[0], file=sys.stderr)
        sys.exit(2)
    dist.init_process_group("gloo")"""


def torch_frame_source() -> str:
    """:func:`fuzz.signature.torch_frame` as a script carries it: its code without the docstring
    and the annotations, with a comment naming the rule."""
    tree = ast.parse(inspect.getsource(torch_frame))
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    fn.body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) else fn.body
    fn.returns = None
    for arg in fn.args.args:
        arg.annotation = None
    code = ast.unparse(fn)
    head, _, rest = code.partition("\n")
    return f"{head}  # a frame of torch's own code (fuzz.signature.torch_frame)\n{rest}"


def exception_lines(expected: list[str], world_size: int, composes: list[str]) -> list[str]:
    """``EXPECTED``, ``torch_frame`` and ``main`` of an exception's script: ``expected`` are the
    entry's ``type@torch/x.py:function`` (its signature and aliases); ``composes`` the compose
    functions whose trainings run, in order (none: ``train(rank, world_size)`` composes itself)."""
    runs = (
        ["        train(rank, dist.get_world_size())"]
        if not composes
        else [
            f"        for composition in ({', '.join(composes)}):",
            "            train(rank, dist.get_world_size(), composition)",
        ]
    )
    expect = "EXPECTED = {" + "".join(f"\n    {e!r}," for e in sorted(expected)) + "\n}"
    main = [
        'if __name__ == "__main__":',
        _TORCHRUN.format(n=world_size),
        "    rank = dist.get_rank()",
        "    try:",
        *runs,
        "        dist.barrier()",
        "    except Exception as e:",
        "        traceback.print_exc()",
        "        frames = [torch_frame(f.filename, f.name) for f in traceback.extract_tb(e.__traceback__)]",
        """        found = f"{type(e).__module__}.{type(e).__qualname__}@{([f for f in frames if f] or ['?'])[-1]}\"""",
        """        said = "REPRODUCED" if found in EXPECTED else "FAIL (not the entry's exception)\"""",
        """        print(f"{said}: rank {rank} raised {found}: {e}", flush=True)""",
        "        os._exit(1 if found in EXPECTED else 2)",
        "    if rank == 0:",
        """        print("PASS: no rank raised", flush=True)""",
    ]
    return [
        f"# the entry's exception: its type @ the innermost frame of torch's own code\n{expect}",
        torch_frame_source(),
        "\n".join(main),
    ]


_DIFFERENCES = """\
def differences(got, want, rank):
    \"\"\"What differs from REFERENCE beyond the tolerance, first to last (no gradient counts as zeros).\"\"\"
    for what, e in want.items():
        a = got[what]
        if a is None and e is None:
            continue
        a = (torch.zeros_like(e) if a is None else a).double()
        e = (torch.zeros_like(a) if e is None else e).double()
        bad = ~torch.isclose(a, e, rtol=RTOL, atol=ATOL)
        if bad.any():
            i = int(bad.flatten().nonzero()[0])
            ratio = [f"; {f:.4g} times as much" for f in (2, 3, 4, 1 / 2, 1 / 3, 1 / 4) if torch.allclose(a, f * e)]
            yield (f"rank {rank}'s {what}: {float(a.flatten()[i]):.9g} where {REFERENCE} has "
                   f"{float(e.flatten()[i]):.9g} ({int(bad.sum())} of {bad.numel()} elements outside "
                   f"rtol={RTOL}, atol={ATOL}{''.join(ratio[:1])})")"""


def compare_lines(tol: Tolerance, dtype: str, reference: str, world_size: int, reference_fn: str) -> list[str]:
    """``RTOL, ATOL, REFERENCE``, ``differences`` (every loss of a rank, then each gradient, then
    each parameter after the step, step by step: what lies outside the tolerance, named) and
    ``main`` of a mismatch's script, whose training is ``train(rank, world_size, compose)`` and
    whose reference ``train(rank, world_size, reference_fn)`` (``reference`` says what it is)."""
    main = [
        'if __name__ == "__main__":',
        _TORCHRUN.format(n=world_size),
        "    rank, world_size = dist.get_rank(), dist.get_world_size()",
        "    try:",
        f"        got, want = train(rank, world_size, compose), train(rank, world_size, {reference_fn})",
        "        verdicts = [None] * world_size",
        "        dist.all_gather_object(verdicts, next(differences(got, want, rank), None))",
        "    except Exception as e:",
        "        traceback.print_exc()",
        """        print(f"FAIL (the case failed another way): rank {rank} raised {type(e).__name__}: {e}", """
        """flush=True)""",
        "        os._exit(2)",
        "    said = next(filter(None, verdicts), None)",
        "    if rank == 0:",
        """        print(f"REPRODUCED: {said}" if said else "PASS: every loss, gradient and parameter agrees", """
        """flush=True)""",
        "    os._exit(1 if said else 0)",
    ]
    return [
        f"RTOL, ATOL = {tol.rtol!r}, {tol.atol!r}  # the tolerance policy for {dtype}\nREFERENCE = {reference!r}",
        _DIFFERENCES,
        "\n".join(main),
    ]
