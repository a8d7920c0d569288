"""The checking half of a crash's printed script (the round trip printers, :mod:`fuzz.repro.print_parts`):
a rank that dies prints nothing, and torchrun stops the others once one has, so each rank runs
the case's ``main(rank, world_size)`` in a child process of its own and watches it.

- The child (the script again, with ``CHILD`` set) joins torchrun's process group and runs
  ``main`` with faulthandler on (the current thread's stack, innermost call first, on a fatal
  signal).
- The rank itself joins no group. Where its child was killed by a signal, it reads the signal
  and the innermost frame of torch's own code off the child's stack (:data:`STACK`, the rule of
  :func:`fuzz.signature.location`) and exits 1 (``REPRODUCED``) where they are in ``DIED`` (the
  entry's signature and aliases), else 2 (``FAIL``); where its child exited another way, 2.
- Where every rank's child finished, each rank meets the others on torchrun's store and prints
  ``PASS`` (exit 0).
"""

from __future__ import annotations

import textwrap
from typing import Any

from fuzz.repro.print_check import FRAME, header

#: The pattern a crash script reads faulthandler's frames with (``File "...", line N in f``:
#: :data:`~fuzz.repro.print_check.FRAME` without the traceback's comma).
STACK = FRAME.replace(", in ", " in ")


def died_expected(entry: Any) -> list[str]:
    """``signal SIGNAME@torch/x.py:function`` of the entry's crash signature and its aliases."""
    return [s.split(":", 2)[2] for s in (entry.signature, *entry.aliases) if s.startswith("crash:")]


def died_line(entry: Any) -> str:
    """``DIED = {...}``: how the entry's rank died (:func:`died_expected`)."""
    found = sorted(set(died_expected(entry)))
    one = f"DIED = {set(found)!r}" if len(found) == 1 else ""
    return one if one and len(one) <= 110 else "DIED = {\n" + "".join(f"    {s!r},\n" for s in found) + "}"


def crash_header(entry: Any, what: str, world_size: int) -> list[str]:
    """The comment lines of :func:`fuzz.repro.print_check.header`, its run line said for a crash."""
    lines = header(entry, what, world_size)
    at = next(i for i, line in enumerate(lines) if line.startswith("# Run: "))
    run = (
        f"Run: torchrun --nproc-per-node {world_size} THIS_FILE.py. Each rank runs main in a child process. "
        "Exit 1 (REPRODUCED): a child died as in DIED (the signal, in that function of torch); "
        "0 (PASS): every child ran through; 2: it failed another way."
    )
    return [*lines[:at], *(f"# {line}" for line in textwrap.wrap(run, 96))]


def crash_imports() -> list[str]:
    """The imports :func:`crash_main_block` needs."""
    return [
        "import faulthandler",
        "import os",
        "import re",
        "import signal",
        "import subprocess",
        "import sys",
        "import torch.distributed as dist",
    ]


def crash_main_block() -> str:
    """``if __name__ == "__main__":`` of a crash script (the module docstring says what it does)."""
    return textwrap.dedent(
        f"""\
        if __name__ == "__main__":
            if os.environ.get("CHILD"):  # the rank's work, in a process that may die
                faulthandler.enable(all_threads=False)  # the stack, innermost call first
                dist.init_process_group("gloo")
                main(dist.get_rank(), dist.get_world_size())
                os._exit(0)
            rank = os.environ.get("RANK")
            env = {{**os.environ, "CHILD": "1"}}
            child = subprocess.run([sys.executable, __file__], env=env, stderr=subprocess.PIPE, text=True)
            sys.stderr.write(child.stderr)
            if child.returncode < 0:  # killed by a signal
                stack = child.stderr.partition("most recent call first")[2]
                frames = re.findall(r'{STACK}', stack)
                died = f"signal {{signal.Signals(-child.returncode).name}}@{{':'.join(frames[0]) if frames else '?'}}"
                said = "REPRODUCED" if died in DIED else "FAIL (another failure)"
                print(f"{{said}}: rank {{rank}}'s child died: {{died}}", flush=True)
                os._exit(1 if died in DIED else 2)
            if child.returncode:
                print(f"FAIL (another failure): rank {{rank}}'s child exited {{child.returncode}}", flush=True)
                os._exit(2)
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
            store.set(f"finished {{rank}}", "1")
            store.wait([f"finished {{r}}" for r in range(int(os.environ["WORLD_SIZE"]))])
            print("PASS: no rank died", flush=True)
            os._exit(0)"""
    )
