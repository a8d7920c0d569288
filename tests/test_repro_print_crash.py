"""A crash's printed script (fuzz/repro/print_crash.py): each rank runs ``main`` in a child and
says how that child died, read off its stack as fuzz.signature reads the pool's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.corpus import load_entry
from fuzz.repro.print_crash import STACK, crash_imports, crash_main_block
from fuzz.repro.print_model import assemble
from fuzz.signature import location
from tests.conftest import ROOT, torchrun


def test_the_stack_pattern_reads_the_corpus_stacks_as_the_signature_does() -> None:
    checked = 0
    for path in sorted((ROOT / "corpus").glob("*-crash-*.json")):
        details = load_entry(path).details
        ranks = details.get("ranks", []) if isinstance(details, dict) else []
        for rank in ranks:
            stack = rank.get("stack") or ""
            if "most recent call first" not in stack:
                continue
            frames = re.findall(STACK, stack.partition("most recent call first")[2])
            assert frames and ":".join(frames[0]) == location(stack), (path.name, rank["rank"])
            checked += 1
    assert checked >= 1


def _script(body: str, died: str) -> str:
    """A crash script whose ``main`` is ``body`` (the lines of a function body)."""
    main = "def main(rank, world_size):\n" + "\n".join(f"    {line}" for line in body.splitlines())
    return assemble(["\n".join(["import torch", *crash_imports()]), f"DIED = {{{died!r}}}", main, crash_main_block()])


_KILLED_IN_TORCH = """\
module = torch.nn.Identity()
module.register_forward_hook(lambda *_: os.kill(os.getpid(), signal.{sig}))  # dies inside torch's code
if rank == 1:
    module(torch.zeros(1))
dist.barrier()"""


def _verdicts(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith(("REPRODUCED", "PASS", "FAIL"))]


@pytest.mark.slow  # three torchrun runs (27 s); the crash entries' scripts reproduce when stored, and stay current
def test_a_crash_script_says_which_rank_died_and_where(tmp_path: Path) -> None:
    """The rank whose child dies as in DIED prints REPRODUCED (exit 1); one that dies of another
    signal fails another way (exit 2); where no child dies, every rank prints PASS (exit 0)."""
    script = tmp_path / "repro.py"
    died = "signal SIGSEGV@torch/nn/modules/module.py:inner"
    script.write_text(_script(_KILLED_IN_TORCH.format(sig="SIGSEGV"), died))
    done = torchrun(script)
    assert done.returncode == 1, done.stdout + done.stderr
    assert _verdicts(done) == [f"REPRODUCED: rank 1's child died: {died}"], done.stdout + done.stderr
    assert "exitcode  : 1" in done.stderr

    script.write_text(_script(_KILLED_IN_TORCH.format(sig="SIGABRT"), died))
    done = torchrun(script)
    said = _verdicts(done)
    assert said == ["FAIL (another failure): rank 1's child died: signal SIGABRT@torch/nn/modules/module.py:inner"]
    assert "exitcode  : 2" in done.stderr, done.stderr

    script.write_text(_script("dist.barrier()", died))
    done = torchrun(script)
    assert done.returncode == 0 and _verdicts(done) == ["PASS: no rank died"] * 2, done.stdout + done.stderr


def test_a_crash_script_outside_torchrun_fails_another_way(tmp_path: Path) -> None:
    script = tmp_path / "repro.py"
    script.write_text(_script("dist.barrier()", "signal SIGSEGV@?"))
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "REPRODUCED" not in done.stdout, done.stdout + done.stderr
