"""The ranks' end-of-case step check: a case after which one rank has run a collective the
others did not fails itself, instead of leaving a queued message for the next case to trip
over. Two gloo ranks spawned here, outside the pool, so the fault can be placed by hand.
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fuzz._rank.context import CollectivesOutOfStep, RankContext


def _rank(rank: int, store_path: str, extra: str, results: str) -> None:
    store = dist.FileStore(store_path, 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=5))
    ctx = RankContext(rank=rank, world_size=2, device=torch.device("cpu"), backend="gloo")
    outcome = "ok"
    try:
        ctx.end_case()  # a case with matched collectives
        mesh = ctx.mesh((2,), ("shard",))
        if extra == "all_gather" and rank == 0:
            # Paired by gloo with rank 1's check (as large as the check's own message): rank 1
            # sees rank 0's values, and rank 0's own check waits for a rank 1 that has gone on.
            dist.all_gather([torch.zeros(2, dtype=torch.int64) for _ in range(2)], torch.tensor([7, 7]))
        elif extra == "broadcast" and rank == 0:
            # A root's message that rank 1 takes as rank 0's part of its check; rank 1's own
            # part then waits for a receiver that never comes.
            dist.broadcast(torch.tensor([7, 7], dtype=torch.int64), src=0)
        ctx.end_case()
        del mesh
    except CollectivesOutOfStep as e:
        outcome = f"out of step: {e}"
    except RuntimeError as e:  # the rank left waiting: gloo's own timeout, shortened above
        outcome = f"error: {e}"
    with open(os.path.join(results, f"rank{rank}"), "w") as f:
        f.write(outcome)
    os._exit(0)  # a rank left waiting cannot tear its group down cleanly


@pytest.mark.parametrize("extra", ["none", "all_gather", "broadcast"])
def test_a_collective_run_by_one_rank_fails_the_case_that_ran_it(extra: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_rank, args=(r, os.path.join(tmp, "store"), extra, tmp)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0, f"rank exited with {p.exitcode}"
        outcomes = [Path(tmp, f"rank{r}").read_text() for r in range(2)]
    if extra == "none":
        assert outcomes == ["ok", "ok"]
    elif extra == "all_gather":
        assert outcomes[1].startswith("out of step"), outcomes
        assert "gathered case numbers [7, 1]" in outcomes[1], outcomes
        assert outcomes[0].startswith("error"), outcomes  # in the pool: a hang, with stacks
    else:
        # Neither rank ends the case cleanly: in the pool, a hang with every rank's stack.
        assert all(o.startswith("error") for o in outcomes), outcomes
