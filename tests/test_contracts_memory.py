"""The memory contracts (fuzz/_rank/memory.py): a case passes on unmutated torch, and the
contracts notice a reshard that registers the sharded parameters but keeps the unsharded storage
(tests/faults/C04), which changes no number."""

from __future__ import annotations

from typing import Any

import pytest

from fuzz.explore import run_case
from fuzz.properties import get_property
from tests.conftest import fault_env, fault_pool
from tests.contract_cases import FAULT_CASES


def test_memory_case_passes_on_unmutated_torch(check_case: Any) -> None:
    check_case(FAULT_CASES["C04_reshard_keeps_unsharded_storage"]())


def test_memory_contract_notices_storage_kept_after_reshard() -> None:
    name = "C04_reshard_keeps_unsharded_storage"
    case = FAULT_CASES[name]()
    with fault_pool(fault_env(name), world_size=2, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is not None
    assert failure.kind == "mismatch", failure.summary
    problems = " | ".join(failure.details.get("problems", [failure.summary]))
    # the first contract to see it: at '1''s forward, '0' (resharded after its forward) holds
    # its 80 bytes beyond the bound of the root's and '1''s
    assert "memory: when '1''s forward starts, [\"'0'\"] hold unsharded parameters" in failure.summary, problems
    assert "the composition allows 160 bytes" in failure.summary


def test_a_group_completed_at_the_root_post_forward_may_stay_unsharded(check_case: Any) -> None:
    from tests.contract_cases import partial_group_twice

    check_case(partial_group_twice())


@pytest.mark.parametrize(
    ("path", "expected"),
    [("", "the root"), ("1.0", "'1.0'")],
)
def test_unit_names_in_messages(path: str, expected: str) -> None:
    from fuzz._rank.memory import name

    assert name(path) == expected


_OFFLOAD_SCRIPT = """
import os, sys, torch, torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
from fuzz._rank.memory import offload_problems, param_groups
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)).cuda()
fully_shard(model[0], offload_policy=CPUOffloadPolicy(pin_memory=sys.argv[2] == "pinned"))
fully_shard(model, offload_policy=CPUOffloadPolicy())
model(torch.randn(2, 8, device="cuda")).sum().backward()
if sys.argv[2] == "claims-pinned":  # unpinned parameters, the unit told it pins them
    for fp in param_groups(model[0])[0].fsdp_params:
        fp.pin_memory = True
print("PROBLEMS", offload_problems(model[0], "'0'") + offload_problems(model, "the root"))
dist.destroy_process_group()
"""


def _offload_problems(mode: str, env: dict[str, str] | None = None) -> str:
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    run_env = {**os.environ, **(env or {})}
    out = subprocess.run(
        [sys.executable, "-c", _OFFLOAD_SCRIPT, port, mode], env=run_env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return next(line for line in out.stdout.splitlines() if line.startswith("PROBLEMS"))


def test_offload_contract_on_an_accelerator() -> None:
    """CPUOffloadPolicy keeps the sharded parameters and gradients on the CPU, pinned by default:
    none reported on unmutated torch; unpinned parameters of a unit that pins are named, and so
    under the fault C12 (pin_memory ignored). Needs a CUDA device (on the CPU there is nothing to
    tell apart: every tensor is on the CPU)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("CPUOffloadPolicy's contract needs an accelerator")
    assert _offload_problems("pinned") == "PROBLEMS []"
    assert "not pinned" in _offload_problems("claims-pinned")
    assert "'0': a sharded parameter" in _offload_problems("pinned", fault_env("C12_offload_pin_memory_ignored"))
