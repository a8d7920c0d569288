"""Shared test helpers: where the mutants live, and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
