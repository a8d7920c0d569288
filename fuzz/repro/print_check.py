"""The checking half of every printed script (:mod:`fuzz.repro.printed`, :mod:`fuzz.repro.print_state`):
what it says of itself, and how it turns what its ``main(rank, world_size)`` did into an exit status.

- An exception: a rank that raises prints its traceback and exits 1 (``REPRODUCED``) where the
  exception is the entry's (its type, raised in the same innermost frame of torch's own code, read
  off the traceback's text as :func:`fuzz.signature.location` reads it: :data:`FRAME`), else 2
  (``FAIL``); where no rank raises, rank 0 prints ``PASS`` once every rank finished, and they exit 0.
- A hang or a crash: the same, under a watchdog (``faulthandler.dump_traceback_later``) that prints
  every thread's stack and exits 1 once the program has run :data:`DEADLINE_S` seconds (a crashed
  rank leaves the others waiting).
- A mismatch: ``main`` returns what differs from its reference (:func:`compare_parts`: ``differs``
  with the tolerance policy of :mod:`fuzz.tolerance`, naming the value, what it should be and a
  clean factor where it is one) or None; rank 0 prints the first rank's (``REPRODUCED``, every rank
  exits 1) or ``PASS`` (exit 0); a rank that raises exits 2.

Outside torchrun (no process group to join) a script fails another way: exit 2.
"""

from __future__ import annotations

import textwrap
from typing import Any

from fuzz import known
from fuzz.model import Dtype
from fuzz.repro.print_model import PRINTED_MARK
from fuzz.tolerance import tolerance_for

#: Seconds a hang or crash script runs before its watchdog says it reproduced.
DEADLINE_S = 60
#: The pattern a script reads its exception's frames of torch's own code with, off the
#: traceback's text (DCP's CheckpointException carries the failing ranks' tracebacks in it):
#: the path from its last "/torch/" on (no other package below it) and the function, not a
#: comprehension's (the rule of :func:`fuzz.signature.torch_frame`; a test checks they agree).
FRAME = r'File "[^"]*/(torch/[^"-]+)", line \d+, in (?!<\w+comp>)(\S+)'


def expected_of(signature: str) -> str:
    """``Type@torch/x.py:function`` of an exception's signature (``exception:PROPERTY:module.Type@...``)."""
    raised = signature.split(":", 2)[2]
    kind, _, where = raised.partition("@")
    return f"{kind.rpartition('.')[2]}@{where}"


def expected_raised(entry: Any) -> list[str]:
    """The entry's exceptions, ``Type@torch/x.py:function`` each: its signature's and its aliases'."""
    return [expected_of(s) for s in (entry.signature, *entry.aliases) if s.startswith("exception:")]


def header(entry: Any, what: str, world_size: int) -> list[str]:
    """The comment lines a script opens with: the mark, the bug, what it does, how to run it."""
    said = []
    if entry is not None and entry.bug:
        bug = known.get(entry.bug)
        said.append(f"Known torch bug: {bug.title}; upstream: {bug.url or bug.upstream or 'none found'}.")
    said.append(what)
    kind = "mismatch" if entry is None else entry.kind
    run = f"Run: torchrun --nproc-per-node {world_size} THIS_FILE.py. Exit 1 (REPRODUCED): "
    run += {
        "exception": "a rank raised the exception in RAISED (its type, in that function of torch)",
        "hang": f"a rank was still running after {DEADLINE_S} s (its stacks are printed)",
        "crash": f"a rank died, or waited for one that died for {DEADLINE_S} s (stacks printed)",
        "mismatch": "a value differs from the reference (named at run time)",
    }[kind]
    said.append(run + "; 0 (PASS): every rank ran through; 2: it failed another way.")
    return [PRINTED_MARK, *(f"# {line}" for text in said for line in textwrap.wrap(text, 96))]


def raised_line(expected: list[str]) -> str:
    """``RAISED = {...}``: the entry's exceptions, ``Type@torch/x.py:function`` each (:func:`expected_of`)."""
    found = sorted(set(expected))
    one = f"RAISED = {set(found)!r}" if len(found) == 1 else ""
    return one if one and len(one) <= 110 else "RAISED = {\n" + "".join(f"    {s!r},\n" for s in found) + "}"


def main_imports(kind: str) -> list[str]:
    """The imports :func:`main_block` needs."""
    lines = ["import os", "import torch.distributed as dist", "import traceback"]
    return lines + {
        "exception": ["import re"],
        "hang": ["import faulthandler", "import threading"],
        "crash": ["import faulthandler", "import threading"],
    }.get(kind, [])


def main_block(kind: str) -> str:
    """``if __name__ == "__main__":``: run ``main`` on every rank, then the verdict and exit status."""
    watchdog = [
        "    def watchdog():  # still running: every thread's stack, exit 1",
        f"        print(f\"REPRODUCED: rank {{os.environ.get('RANK')}} still running after {DEADLINE_S} s\", flush=True)",  # noqa: E501
        "        faulthandler.dump_traceback()",
        "        os._exit(1)",
        "",
        f"    timer = threading.Timer({DEADLINE_S}, watchdog)",
        "    timer.start()",
    ]
    run = ["    try:", '        dist.init_process_group("gloo")']
    failed = ["        traceback.print_exc()", "        os._exit(2)  # it failed another way"]
    if kind == "mismatch":
        lines = [
            *run,
            "        said = [None] * dist.get_world_size()  # what each rank found to differ first",
            "        dist.all_gather_object(said, main(dist.get_rank(), dist.get_world_size()))",
            "    except BaseException:",
            *failed,
            "    said = next(filter(None, said), None)",
            "    if dist.get_rank() == 0:",
            '        print(f"REPRODUCED: {said}" if said else "PASS: every loss, gradient and parameter agrees", flush=True)',  # noqa: E501
            "    os._exit(1 if said else 0)",
        ]
    else:
        lines = [*run, "        main(dist.get_rank(), dist.get_world_size())", "        dist.barrier()"]
        if kind == "exception":
            lines += [
                "    except BaseException as e:  # DCP's CheckpointException is one; its text has the ranks' "
                "tracebacks",
                "        text = traceback.format_exc()",
                f"        frames = re.findall(r'{FRAME}', text)  # torch's own",
                "        raised = f\"{type(e).__name__}@{':'.join(frames[-1]) if frames else '?'}\"",
                '        said = "REPRODUCED" if raised in RAISED else "FAIL (another failure)"',
                "        print(f\"{text}{said}: rank {os.environ.get('RANK')} raised {raised}\", flush=True)",
                "        os._exit(1 if raised in RAISED else 2)",
            ]
        else:  # a rank that finished waits on the store, in no collective: the one stuck in one is seen
            lines = [
                *watchdog,
                *run,
                "        main(dist.get_rank(), dist.get_world_size())",
                "        timer.cancel()",
                '        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)',  # noqa: E501
                '        store.set(f"finished {dist.get_rank()}", "1")',
                '        store.wait([f"finished {r}" for r in range(dist.get_world_size())])',
                "    except BaseException:",
                *failed,
            ]
        passing = {"exception": "no rank raised", "hang": "every rank finished", "crash": "no rank died"}[kind]
        lines += [f'    print("PASS: {passing}", flush=True)', "    os._exit(0)"]
    return "\n".join(['if __name__ == "__main__":', *lines])


def compare_parts(dtype: Dtype, reference: str, sharded: bool) -> list[str]:
    """``RTOL, ATOL, REFERENCE``, ``full(t)`` (a tensor whole, gathered where fully_shard shards it)
    and ``differs(got, want, exact=False)``: the first value of ``want`` that ``got`` lacks or
    differs in beyond the tolerance policy for ``dtype`` (or at all), said, else None."""
    tol = tolerance_for(dtype.value)
    gather = "(t.full_tensor() if isinstance(t, DTensor) else t)" if sharded else "t"
    return [
        ("from torch.distributed.tensor import DTensor\n" if sharded else "")
        + f"RTOL, ATOL = {tol.rtol!r}, {tol.atol!r}  # the tolerance policy for {dtype.value}\n"
        + f"REFERENCE = {reference!r}",
        f"def full(t):\n    return {gather}.detach().clone()",
        textwrap.dedent(
            """\
            def differs(got, want, exact=False):
                for key, e in want.items():
                    if key not in got:
                        return f"{key} is missing"
                    a, e = got[key].double(), e.double()
                    bad = a != e if exact else ~torch.isclose(a, e, rtol=RTOL, atol=ATOL)
                    if bad.any():
                        i = int(bad.flatten().nonzero()[0])
                        factor = [f"; {f:.3g} times as much" for f in (2, 3, 4, 1 / 2, 1 / 3, 1 / 4) if torch.allclose(a, f * e)]
                        return (f"{key}: {float(a.flatten()[i]):.9g} where {REFERENCE} has {float(e.flatten()[i]):.9g} "
                                f"({int(bad.sum())} of {bad.numel()} elements differ{''.join(factor[:1])})")
                return None"""  # noqa: E501
        ),
    ]
