"""The pool's failure handling on NCCL (one GPU per rank). Skipped on hosts without 2 GPUs."""

from __future__ import annotations

import pytest
import torch

from fuzz.model import Case, FaultAction, FaultBody
from fuzz.verdict import OutcomeKind

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")


def _fault(action: FaultAction) -> Case:
    return Case(property="_fault", world_size=2, seed=0, body=FaultBody(action=action, rank=1))


@pytest.mark.parametrize(
    ("action", "kind"),
    [
        (FaultAction.HANG, OutcomeKind.HANG),
        (FaultAction.RAISE, OutcomeKind.EXCEPTION),
        (FaultAction.SIGKILL, OutcomeKind.CRASH),
    ],
)
def test_nccl_pool_survives_a_fault(rank_pool, action, kind):
    """Runs on the session's pool (it holds the GPUs): ``--shardfuzz-backend nccl``."""
    if rank_pool.backend != "nccl" or rank_pool.world_size != 2:
        pytest.skip("run with --shardfuzz-backend nccl --shardfuzz-world-size 2")
    pool = rank_pool
    assert pool.devices[0] != pool.devices[1]
    assert pool.run(_fault(FaultAction.NONE)).ok
    restarts = pool.restarts
    outcome = pool.run(_fault(action), deadline=10)
    assert outcome.kind is kind
    assert all(r.traceback or r.stack or r.exit_status is not None for r in outcome.ranks if r.status != "ok")
    assert pool.restarts == restarts + 1
    after = pool.run(_fault(FaultAction.NONE))
    assert after.ok, after.describe()
    assert [o["value"] for o in after.observations] == [3.0, 3.0]
