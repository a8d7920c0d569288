"""The pool's failure handling on NCCL (one GPU per rank). Skipped on hosts without 2 GPUs."""

from __future__ import annotations

import pytest
import torch

from fuzz.case import Case, FaultAction, FaultBody
from fuzz.pool import OutcomeKind, RankPool

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
def test_nccl_pool_survives_a_fault(action, kind):
    with RankPool(world_size=2, backend="nccl", deadline=10) as pool:
        assert pool.devices[0] != pool.devices[1]
        assert pool.run(_fault(FaultAction.NONE)).ok
        outcome = pool.run(_fault(action))
        assert outcome.kind is kind
        assert all(r.traceback or r.stack or r.exit_status is not None for r in outcome.ranks if r.status != "ok")
        after = pool.run(_fault(FaultAction.NONE))
        assert after.ok, after.describe()
        assert [o["value"] for o in after.observations] == [3.0, 3.0]
