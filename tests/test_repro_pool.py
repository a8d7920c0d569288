"""Scripts run in a warm rank pool, as the reducer's attempts are (fuzz.pool.RankPool.run_script,
fuzz._rank.worker): each rank executes the script as a module of its own and returns what its
``attempt`` returns; a rank that raises reports it; ranks that miss the others' answers by more
than the grace period, or that leave the process group out of step, are replaced."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fuzz.corpus import Entry, load_entry
from fuzz.pool import RankPool
from fuzz.repro.harness import crash_found, crash_verdict, hang_verdict

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


def _corpus_entry(name: str) -> Entry:
    return load_entry(Path(__file__).parent.parent / "corpus" / f"{name}.json")


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
    """A crash's attempts run in the pool (fuzz.repro.reduce): the dead rank's signal and what
    faulthandler wrote as it died come back, after the grace the others get, not the deadline."""
    outcome = pool.run_script(CRASH, deadline=30.0)
    status, stack = outcome.died[1]
    assert status == -11 and "Segmentation fault" in stack and "line 9 in attempt" in stack, stack
    assert 0 not in outcome.died and outcome.respawned
    assert outcome.seconds < 15.0  # the grace after rank 1's death, not the deadline
    assert pool.run_script(VERDICT.replace("RAISE", "False")).verdicts[1] == "REPRODUCED sum=[1.0, 1.0]"


def test_a_dead_rank_is_judged_by_the_crash_script_s_own_rule() -> None:
    """crash_verdict reads the first frame of torch in faulthandler's output, as a crash
    script's main does with its child's (fuzz.repro.harness._CRASH_HEAD), and names the entry's
    crash only for its signal at its frame."""
    entry = _corpus_entry("state_dict-crash-81ffab405f7f")
    stack = (
        "Fatal Python error: Segmentation fault\n\n"
        "Thread 0x00007f (most recent call first):\n"
        '  File "/x/fuzz/_rank/worker.py", line 60 in run\n\n'
        "Current thread 0x00007e (most recent call first):\n"
        '  File "/site/torch/distributed/fsdp/_state_dict_utils.py", line 300 in param_hook\n'
        '  File "/site/torch/nn/modules/module.py", line 2100 in state_dict\n'
    )
    assert crash_found(-11, stack) == "signal -11@torch/distributed/fsdp/_state_dict_utils.py:param_hook"
    verdict = crash_verdict(entry, entry.signature, 1, -11, stack)
    assert verdict is not None and verdict.startswith(f"REPRODUCED {entry.signature}: rank 1 died"), verdict
    assert crash_verdict(entry, entry.signature, 1, -6, stack) is None  # another signal
    assert crash_verdict(entry, entry.signature, 1, -11, stack.replace("param_hook", "other")) is None
    assert crash_verdict(entry, entry.signature, 1, -11, "Fatal Python error: Segmentation fault\n") is None


def test_a_rank_still_running_at_the_deadline_comes_back_with_its_main_thread_s_stack(pool: RankPool) -> None:
    """A hang's attempts run in the pool (fuzz.repro.reduce): a rank still running at the
    deadline (the hang watcher's wait) comes back with its main thread's stack as last sampled."""
    outcome = pool.run_script(STUCK, deadline=6.0)
    assert outcome.verdicts == {0: "PASS"} and outcome.respawned and not outcome.died
    stack = outcome.stuck[1]
    assert "torch/distributed/distributed_c10d.py" in stack and "in barrier" in stack, stack


def test_a_stuck_rank_is_judged_by_the_hang_script_s_own_rule() -> None:
    """hang_verdict takes a stack with one of the entry's frames anywhere on it, as a hang
    script's watcher does with the stuck main thread's (fuzz.repro.harness._HANG)."""
    entry = _corpus_entry("state_dict-hang-dff6a54ad235")
    stack = (
        '  File "<_shardfuzz_script_7>", line 40, in attempt\n    x = get_state_dict(model, opt)\n'
        '  File "/site/torch/distributed/_state_dict_utils.py", line 600, in _broadcast_state_dict\n'
        "    dist.broadcast_object_list(keys)\n"
        '  File "/site/torch/distributed/distributed_c10d.py", line 3300, in broadcast_object_list\n'
        "    broadcast(...)\n"
    )
    verdict = hang_verdict(entry, entry.signature, 0, stack)
    assert verdict == f"REPRODUCED {entry.signature}: rank 0 is stuck", verdict
    assert hang_verdict(entry, entry.signature, 0, stack.replace("_broadcast_state_dict", "other")) is None
    assert hang_verdict(entry, entry.signature, 0, "") is None  # never sampled
