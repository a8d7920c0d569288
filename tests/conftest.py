"""Shared test helpers: where the mutants live, and a CLI runner."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from fuzz.pool import RankPool

ROOT = Path(__file__).resolve().parents[1]
#: Injected faults in torch (see ../shared/mutants/README.md), beside the checkout unless
#: SHARDFUZZ_MUTANTS points elsewhere (a machine that has the checkout without shared/).
MUTANTS = Path(os.environ.get("SHARDFUZZ_MUTANTS", ROOT.parent / "shared" / "mutants"))


def mutant_env(name: str) -> dict[str, str]:
    """Environment that makes every rank import torch with the named fault applied."""
    spec = MUTANTS / f"{name}.json"
    if not spec.exists():
        pytest.skip(f"mutant {spec} is not present beside this checkout")
    harness = str(MUTANTS / "harness")
    return {"MUTANT": str(spec), "PYTHONPATH": os.pathsep.join([harness, os.environ.get("PYTHONPATH", "")])}


FAULTS = ROOT / "tests" / "faults"


def fault_env(name: str) -> dict[str, str]:
    """Environment that makes every rank import torch with the fault ``tests/faults/NAME.json``
    applied (by tests/faults/harness); skips where this torch's source lacks the fault's text
    (a fault is written against one torch version's code)."""
    from fuzz.bench import load_fault
    from fuzz.patching import fault_applies

    path = FAULTS / f"{name}.json"
    fault = load_fault(str(path))
    if not fault_applies(fault):
        pytest.skip(f"fault {name}: its text is not in this torch's {fault['module']}")
    harness = str(FAULTS / "harness")
    return {"SHARDFUZZ_FAULT": str(path), "PYTHONPATH": os.pathsep.join([harness, os.environ.get("PYTHONPATH", "")])}


def fault_pool(env: dict[str, str], world_size: int = 2, deadline: float = 60.0) -> RankPool:
    """A pool whose ranks import torch under ``env`` (:func:`fault_env`, :func:`mutant_env`, a
    fix's), for a test of whether a check notices what that changes. Its ranks fork from one
    zygote (``hash_seed_per_rank=False``): one import of torch per pool instead of one per rank,
    their string hash seed shared, which such a question does not depend on."""
    from fuzz.pool import RankPool

    return RankPool(world_size=world_size, env=env, deadline=deadline, hash_seed_per_rank=False)


def sigint_as_from_a_terminal() -> None:
    """``preexec_fn`` of a process a test stops with SIGINT as Ctrl-C would: a test run started in
    the background by a shell without job control inherits SIGINT ignored, the process would keep
    it so (Python installs no handler for an ignored SIGINT), and the signal would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "fuzz", *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def torchrun(script: Path, env: dict[str, str] | None = None, nproc: int = 2) -> subprocess.CompletedProcess[str]:
    """Run a standalone repro script as its users do. ``--standalone`` picks a free rendezvous
    port, so parallel test workers never collide."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), str(script)],
        cwd=script.parent,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=240,
    )


def pid_alive(pid: int) -> bool:
    """True if ``pid`` names a process that has not exited (a zombie counts as exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` seconds for ``pids`` to exit; the ones still alive."""
    end = time.monotonic() + timeout
    alive = [p for p in pids if pid_alive(p)]
    while alive and time.monotonic() < end:
        time.sleep(0.05)
        alive = [p for p in alive if pid_alive(p)]
    return alive


def kill_leftovers(proc: subprocess.Popen[bytes], pids: list[int]) -> None:
    """After a failed assertion: end ``proc`` and ``pids``, only processes the test started."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in pids:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def missing_api(case: Any) -> str | None:
    """What ``case`` needs that this torch lacks (an SPMD program: fully_shard's dp_mesh_dims),
    as a skip reason; None where it can run here."""
    from fuzz import known
    from strategies._options import has_dp_mesh_dims

    if any(c.spmd for c in known.compositions(case)) and not has_dp_mesh_dims():
        return "an SPMD program: this torch's fully_shard has no dp_mesh_dims"
    return None
