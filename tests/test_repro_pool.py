"""Scripts run in a warm rank pool, as the printed scripts' differential tests run them
(fuzz.pool.RankPool.run_script, fuzz._rank.worker): each rank executes the script as a module of
its own and returns what its ``attempt`` returns; a rank that raises reports it; ranks that miss
the others' answers by more than the grace period, or that leave the process group out of step,
are replaced."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fuzz.pool import RankPool

VERDICT = """
from __future__ import annotations
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Shape:
    width: object


def attempt(rank, world_size):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1, world_size), mesh_dim_names=("a", "b"))
    t = torch.ones(Shape(width=2).width) * rank
    dist.all_reduce(t, group=mesh.get_group("b"))
    if RAISE and rank == 1:
        raise ValueError("boom")
    return f"REPRODUCED sum={t.tolist()}"


if __name__ == "__main__":
    raise SystemExit("not run in the pool")
"""

STUCK = """
import torch.distributed as dist


def attempt(rank, world_size):
    if rank == 1:
        dist.barrier()  # rank 0 never joins: under torchrun its exit would end this wait
    return "PASS"
"""


@pytest.fixture(scope="module")
def pool() -> Iterator[RankPool]:
    with RankPool(world_size=2, deadline=30.0) as p:
        yield p


def test_every_rank_returns_the_verdict_of_the_script(pool: RankPool) -> None:
    for _ in range(2):  # the script's process groups are freed after each run
        outcome = pool.run_script(VERDICT.replace("RAISE", "False"))
        assert outcome.verdicts == {0: "REPRODUCED sum=[1.0, 1.0]", 1: "REPRODUCED sum=[1.0, 1.0]"}, outcome
        assert not outcome.errors and not outcome.missing and not outcome.respawned


def test_an_exception_is_reported_with_the_others_verdicts(pool: RankPool) -> None:
    outcome = pool.run_script(VERDICT.replace("RAISE", "True"))
    assert outcome.verdicts == {0: "REPRODUCED sum=[1.0, 1.0]"}, outcome
    assert "builtins.ValueError: boom" in outcome.errors[1]
    assert not outcome.respawned  # the ranks are in step: the pool is kept


def test_a_rank_left_waiting_is_replaced(pool: RankPool) -> None:
    restarts = pool.restarts
    outcome = pool.run_script(STUCK, deadline=20.0)
    assert outcome.verdicts == {0: "PASS"} and 1 in outcome.missing and outcome.respawned
    assert outcome.seconds < 10.0  # the grace after rank 0's answer, not the deadline
    assert pool.restarts == restarts + 1
    assert pool.run_script(VERDICT.replace("RAISE", "False")).verdicts[1] == "REPRODUCED sum=[1.0, 1.0]"


DRAWS = """
import torch


def attempt(rank, world_size):
    if SEED is not None:
        torch.manual_seed(SEED)  # what an earlier attempt may leave behind
    return "PASS " + repr(torch.randn(3).tolist())
"""


def test_each_script_draws_as_a_fresh_process_would_whatever_ran_before(pool: RankPool) -> None:
    """A script under torchrun starts with the generators torch seeded its process with; in the
    pool each starts the same way, so what an attempt draws is not decided by earlier attempts."""
    first = pool.run_script(DRAWS.replace("SEED", "None")).verdicts
    pool.run_script(DRAWS.replace("SEED", "1234"))
    again = pool.run_script(DRAWS.replace("SEED", "None")).verdicts
    assert first == again and len(first) == 2, (first, again)


CRASH = """
import ctypes

import torch.distributed as dist


def attempt(rank, world_size):
    if rank == 1:
        ctypes.string_at(0)  # a segmentation fault
    dist.barrier()  # rank 1 never joins
    return "PASS"
"""


def test_a_rank_that_dies_is_reported_with_its_status_and_stack_soon(pool: RankPool) -> None:
    """A rank that dies while it runs a script: its signal and what faulthandler wrote as it died
    come back, after the grace the others get, not the deadline."""
    outcome = pool.run_script(CRASH, deadline=30.0)
    status, stack = outcome.died[1]
    assert status == -11 and "Segmentation fault" in stack and "line 9 in attempt" in stack, stack
    assert 0 not in outcome.died and outcome.respawned
    assert outcome.seconds < 15.0  # the grace after rank 1's death, not the deadline
    assert pool.run_script(VERDICT.replace("RAISE", "False")).verdicts[1] == "REPRODUCED sum=[1.0, 1.0]"


def test_a_rank_still_running_at_the_deadline_comes_back_with_its_main_thread_s_stack(pool: RankPool) -> None:
    """A rank still running a script at the deadline comes back with its main thread's stack, as
    last sampled."""
    outcome = pool.run_script(STUCK, deadline=6.0)
    assert outcome.verdicts == {0: "PASS"} and outcome.respawned and not outcome.died
    stack = outcome.stuck[1]
    assert "torch/distributed/distributed_c10d.py" in stack and "in barrier" in stack, stack
