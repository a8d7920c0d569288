"""The rank pool's failure handling, for real: two gloo ranks on CPU, one fault at a time.

Every test shares one pool (spawning costs about a second each time), so every failure test
also checks that the pool respawned its ranks and runs the next clean case correctly.
"""

from __future__ import annotations

import os
import selectors
import time
from typing import Any

import pytest

from fuzz.errors import InvalidArgument
from fuzz.model import Case, FaultAction, FaultBody
from fuzz.pool import HANG_HOLD_MIN_S, HANG_HOLD_SLOWEST, OutcomeKind, RankPool, Stall
from fuzz.pytest_plugin import HistoryDependentCrash, make_checker
from fuzz.signature import failure_from_outcome
from fuzz.verdict import FAILURE_GRACE_S, WAITING_HANG, HangWatch, blocking_call

WORLD_SIZE = 2
DEADLINE = 8.0
FAULTY = 1  # the rank every fault is injected into


def fault_case(action: FaultAction, rank: int = FAULTY, world_size: int = WORLD_SIZE, seconds: float = 0.0) -> Case:
    return Case(
        property="_fault",
        world_size=world_size,
        seed=0,
        body=FaultBody(action=action, rank=rank, seconds=seconds),
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


def assert_all_gone(pids: list[int], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive:
            return
        if time.monotonic() > end:
            pytest.fail(f"rank processes {alive} (of {pids}) are still alive")
        time.sleep(0.05)


def assert_clean_case_ok(pool: RankPool) -> None:
    outcome = pool.run(fault_case(FaultAction.NONE))
    assert outcome.kind is OutcomeKind.OK, outcome.describe()
    assert [o["value"] for o in outcome.observations] == [3.0] * WORLD_SIZE, outcome.describe()


@pytest.fixture(scope="module")
def pool():
    p = RankPool(world_size=WORLD_SIZE, backend="gloo", deadline=DEADLINE)
    try:
        p.start()
        yield p
    finally:
        p.close()


def test_clean_case_is_ok_and_all_reduces(pool: RankPool) -> None:
    restarts = pool.restarts
    outcome = pool.run(fault_case(FaultAction.NONE))
    assert outcome.ok, outcome.describe()
    assert outcome.kind is OutcomeKind.OK
    assert len(outcome.ranks) == WORLD_SIZE
    for rank, report in enumerate(outcome.ranks):
        assert report.rank == rank
        assert report.status == "ok"
        assert report.observation == {"value": 3.0}  # 1 + 2
        assert report.exc_type is None and report.exit_status is None
    assert pool.restarts == restarts  # an ok case keeps the ranks
    assert len(pool.pids) == WORLD_SIZE


def test_ranks_with_too_many_threads_are_replaced_between_cases() -> None:
    """A rank at max_rank_threads after an ok case is stopped and a fresh one spawned, before
    the next case; the replaced ranks are gone and the count says so (not as a restart)."""
    with RankPool(world_size=WORLD_SIZE, backend="gloo", deadline=DEADLINE, max_rank_threads=1) as p:
        first = p.pids
        assert_clean_case_ok(p)
        assert p.recycled == 1 and p.restarts == 0
        assert_all_gone(first)
        assert_clean_case_ok(p)
        assert p.recycled == 2 and not set(p.pids) & set(first)
    with RankPool(world_size=WORLD_SIZE, backend="gloo", deadline=DEADLINE, max_rank_threads=None) as p:
        assert_clean_case_ok(p)
        assert p.recycled == 0 and all(n is not None and n > 1 for n in p.rank_threads())


@pytest.mark.slow  # waits out the whole 8 s deadline
def test_the_deadline_ends_a_case_whose_ranks_wait_in_no_blocking_call(pool: RankPool) -> None:
    """Every rank sleeps past the deadline: no rank waits in a collective, so only the deadline,
    the backstop, ends the case, with every rank's stack."""
    assert_clean_case_ok(pool)  # ranks joined, so the deadline measures the case alone
    old_pids = pool.pids
    restarts = pool.restarts
    start = time.monotonic()
    outcome = pool.run(fault_case(FaultAction.SLEEP, seconds=10 * DEADLINE))
    wall = time.monotonic() - start

    assert outcome.kind is OutcomeKind.HANG, outcome.describe()
    assert outcome.stalled is None, outcome.describe()
    assert DEADLINE - 0.1 <= outcome.seconds < DEADLINE + 3.0, outcome.seconds
    assert wall < DEADLINE + 5.0, wall  # stack dump and respawn are bounded too
    for report in outcome.ranks:
        assert report.status == "stuck" and report.stack and "run_fault" in report.stack, outcome.describe()
    assert "missed the deadline" in failure_from_outcome("_fault", outcome).summary

    assert pool.restarts == restarts + 1
    assert set(pool.pids).isdisjoint(old_pids)
    assert_all_gone(old_pids)
    assert_clean_case_ok(pool)


def test_a_deadlock_in_collectives_ends_long_before_the_deadline(pool: RankPool) -> None:
    """The faulty rank waits in an all_reduce that the other rank skipped; that one waits in
    the end-of-case step check for a peer that never arrives. Every rank still in the case waits
    in a blocking call with its stack unchanged: the generic rule ends the case as a hang, with
    every rank's stack, as at a deadline (here 60 s)."""
    assert_clean_case_ok(pool)
    old_pids = pool.pids
    restarts = pool.restarts
    assert pool.hang_hold("_fault") == HANG_HOLD_MIN_S  # the property's cases take milliseconds
    outcome = pool.run(fault_case(FaultAction.HANG), deadline=60.0)

    assert outcome.kind is OutcomeKind.HANG, outcome.describe()
    assert outcome.stalled == WAITING_HANG, outcome.describe()
    assert outcome.seconds < 30.0, outcome.describe()  # the rule: about 2 s + 4 s; the deadline: 60 s
    stuck = outcome.ranks[FAULTY]
    assert stuck.status == "stuck", outcome.describe()
    assert stuck.stack is not None
    assert "all_reduce" in stuck.stack and "run_fault" in stuck.stack, stuck.stack
    # The case that left its ranks out of step is the one that fails.
    other = outcome.ranks[1 - FAULTY]
    assert other.status == "stuck", outcome.describe()
    assert other.stack is not None and "_check_in_step" in other.stack, other.stack
    failure = failure_from_outcome("_fault", outcome)
    assert failure.signature.startswith("hang:_fault@torch/distributed/distributed_c10d.py:"), failure.signature
    assert WAITING_HANG in failure.summary

    assert pool.restarts == restarts + 1
    assert set(pool.pids).isdisjoint(old_pids)
    assert_all_gone(old_pids)
    assert_clean_case_ok(pool)


def test_a_hang_that_a_named_stall_names_keeps_its_name(pool: RankPool) -> None:
    """The generic rule sees the deadlock long before the stall would (30 s in): the hang still
    carries the stall's name, since the stall's pattern holds in the stacks."""

    def alone(stacks: list[str]) -> bool:
        return "run_fault" in stacks[FAULTY] and "run_fault" not in stacks[1 - FAULTY]

    stall = Stall(name="the faulty rank alone in all_reduce", deadlocked=alone, after=30.0, hold=3.0)
    assert_clean_case_ok(pool)
    outcome = pool.run(fault_case(FaultAction.HANG), deadline=60.0, stall=stall)
    assert outcome.kind is OutcomeKind.HANG, outcome.describe()
    assert outcome.stalled == stall.name, outcome.describe()
    assert outcome.seconds < 30.0, outcome.describe()
    assert_clean_case_ok(pool)


def test_the_hold_follows_the_property_s_slowest_healthy_case(pool: RankPool) -> None:
    pool.slowest["_slow_property"] = 10.0
    try:
        assert pool.hang_hold("_slow_property") == HANG_HOLD_SLOWEST * 10.0
        assert pool.hang_hold("_never_ran") == HANG_HOLD_MIN_S
    finally:
        del pool.slowest["_slow_property"]
    assert_clean_case_ok(pool)
    assert 0.0 < pool.slowest["_fault"] < 60.0  # ok cases are timed per property


def test_wait_ready_gives_up_without_ending_starting_ranks() -> None:
    # Ranks started from scratch, not forked from this process's zygotes (fuzz.zygote): a forked
    # rank may join within the first look, a fresh one spends seconds importing torch.
    p = RankPool(world_size=WORLD_SIZE, backend="gloo", deadline=DEADLINE, env={"SHARDFUZZ_ZYGOTE": "0"})
    try:
        p.start()
        pids = p.pids
        assert p.wait_ready(0.0) is False  # just spawned: still importing torch
        assert p.pids == pids and all(pid_alive(pid) for pid in pids)
        assert p.wait_ready(p.start_timeout) is True
        assert_clean_case_ok(p)
    finally:
        p.close()


def test_a_stall_ends_a_hang_long_before_its_deadline(pool: RankPool) -> None:
    """The faulty rank waits alone in an all_reduce that the other rank skipped: its stack
    samples show the pattern, which ends the case as a hang named after the stall, with the
    stacks taken as at a deadline."""

    def alone(stacks: list[str]) -> bool:
        return "run_fault" in stacks[FAULTY] and "run_fault" not in stacks[1 - FAULTY]

    stall = Stall(name="the faulty rank alone in all_reduce", deadlocked=alone, after=1.0, hold=1.0)
    assert_clean_case_ok(pool)
    outcome = pool.run(fault_case(FaultAction.HANG), deadline=60.0, stall=stall)
    assert outcome.kind is OutcomeKind.HANG, outcome.describe()
    assert outcome.stalled == stall.name
    assert outcome.seconds < 15.0, outcome.describe()
    stuck = outcome.ranks[FAULTY]
    assert stuck.status == "stuck" and stuck.stack and "all_reduce" in stuck.stack, outcome.describe()
    assert "ended before the deadline: the faulty rank alone" in outcome.describe()
    failure = failure_from_outcome("_fault", outcome)
    assert failure.kind == "hang" and "stuck in" in failure.summary and stall.name in failure.summary
    assert_clean_case_ok(pool)


def test_a_stall_must_hold_and_its_samples_show_every_rank_still_running(pool: RankPool) -> None:
    """Both ranks sleep 4 s in the case: the samples show them in run_fault, but a pattern that
    must hold for 30 s never does, so the case ends normally; and a stall does not change an
    ok case's outcome."""
    seen: list[list[str]] = []

    def record(stacks: list[str]) -> bool:
        seen.append(stacks)
        return True

    stall = Stall(name="never for long enough", deadlocked=record, after=0.5, hold=30.0)
    outcome = pool.run(fault_case(FaultAction.SLEEP, seconds=4.0), deadline=60.0, stall=stall)
    assert outcome.ok and outcome.stalled is None, outcome.describe()
    sampled = [s for s in seen if all("run_fault" in t and "time.sleep" in t for t in s)]
    assert sampled, f"no look saw both ranks' samples in run_fault: {seen[-1:]}"
    assert all(s == ["", ""] or s[0] or s[1] for s in seen)


def test_raise_on_one_rank_is_an_exception_with_every_rank_accounted_for(pool: RankPool) -> None:
    old_pids = pool.pids
    restarts = pool.restarts
    outcome = pool.run(fault_case(FaultAction.RAISE))

    assert outcome.kind is OutcomeKind.EXCEPTION, outcome.describe()
    # The others get a grace period, not the whole deadline.
    assert outcome.seconds < DEADLINE, outcome.seconds
    assert outcome.seconds < FAILURE_GRACE_S + 3.0, outcome.seconds
    raiser = outcome.ranks[FAULTY]
    assert raiser.status == "error"
    assert raiser.exc_type == "builtins.RuntimeError"
    assert raiser.message == f"injected fault on rank {FAULTY}"
    assert raiser.traceback is not None and "injected fault" in raiser.traceback, raiser.traceback
    for report in outcome.ranks:
        assert report.traceback or report.stack, f"rank {report.rank} has no account:\n{outcome.describe()}"
    blocked = outcome.ranks[1 - FAULTY]
    assert blocked.status == "stuck"
    assert blocked.stack is not None and "all_reduce" in blocked.stack, blocked.stack

    assert pool.restarts == restarts + 1
    assert_all_gone(old_pids)
    assert_clean_case_ok(pool)


def test_waiting_out_the_grace_after_a_failure_sleeps(pool: RankPool, monkeypatch: pytest.MonkeyPatch) -> None:
    """After one rank raised, the driver waits for the others in select, not in a loop that
    polls: a case's wait costs a few wake-ups (a message, a look at the stacks), not one per
    microsecond of the grace period."""
    waits: list[float] = []

    class Counted(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
        def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            waits.append(-1.0 if timeout is None else timeout)
            return super().select(timeout)

    monkeypatch.setattr(selectors, "DefaultSelector", Counted)
    outcome = pool.run(fault_case(FaultAction.RAISE))
    assert outcome.kind is OutcomeKind.EXCEPTION, outcome.describe()
    assert outcome.seconds > FAILURE_GRACE_S / 2, outcome.seconds  # the grace was waited out
    assert len(waits) < 100, f"{len(waits)} waits in {outcome.seconds:.1f} s, {waits.count(0.0)} of them for 0 s"
    assert_clean_case_ok(pool)


@pytest.mark.parametrize(
    ("action", "exit_status"),
    [(FaultAction.EXIT, 3), (FaultAction.SIGKILL, -9), (FaultAction.SIGSEGV, -11)],
    ids=["exit", "sigkill", "sigsegv"],
)
def test_dead_rank_is_a_crash_with_its_exit_status(pool: RankPool, action: FaultAction, exit_status: int) -> None:
    assert_clean_case_ok(pool)  # the ranks are up, so pool.pids are the ones the case runs on
    old_pids = pool.pids
    restarts = pool.restarts
    outcome = pool.run(fault_case(action))

    assert outcome.kind is OutcomeKind.CRASH, outcome.describe()
    assert outcome.seconds < DEADLINE, outcome.seconds  # seen at once, not at the deadline
    dead = outcome.ranks[FAULTY]
    assert dead.status == "dead", outcome.describe()
    assert dead.exit_status == exit_status, outcome.describe()
    if action is FaultAction.SIGSEGV:
        assert dead.stack is not None and "Segmentation fault" in dead.stack, dead.stack
        assert "run_fault" in dead.stack, dead.stack
    assert outcome.ranks[1 - FAULTY].exit_status is None  # the survivor is not reported dead

    assert pool.restarts == restarts + 1
    assert set(pool.pids).isdisjoint(old_pids)
    assert_all_gone(old_pids, timeout=0.0)  # killed and reaped before run() returned
    for pid in old_pids:
        assert not os.path.exists(f"/proc/{pid}"), f"rank pid {pid} was not reaped"
    assert_clean_case_ok(pool)


def test_case_of_another_world_size_is_rejected(pool: RankPool) -> None:
    cases_run = pool.cases_run
    with pytest.raises(InvalidArgument, match="world_size"):
        pool.run(fault_case(FaultAction.NONE, rank=0, world_size=WORLD_SIZE + 1))
    with pytest.raises(InvalidArgument, match="world_size"):
        pool.run(fault_case(FaultAction.NONE, rank=0, world_size=1))
    assert pool.cases_run == cases_run
    assert_clean_case_ok(pool)  # a rejected case leaves the pool usable


@pytest.mark.parametrize(
    "kwargs",
    [
        {"backend": "mpi"},
        {"world_size": 0},
        {"world_size": -1},
        {"deadline": 0},
    ],
    ids=["backend-mpi", "world-size-0", "world-size-neg", "deadline-0"],
)
def test_bad_pool_arguments_are_rejected(kwargs: dict) -> None:
    with pytest.raises(InvalidArgument):
        RankPool(**kwargs)


def test_two_pools_in_one_process_do_not_collide(pool: RankPool) -> None:
    other = RankPool(world_size=WORLD_SIZE, backend="gloo", deadline=DEADLINE)
    try:
        other.start()
        assert set(other.pids).isdisjoint(pool.pids)
        assert other._store.port != pool._store.port
        for p in (other, pool, other):
            assert_clean_case_ok(p)
    finally:
        other.close()
    assert_clean_case_ok(pool)  # closing one pool leaves the other alone


def test_close_ends_every_rank_and_is_idempotent() -> None:
    p = RankPool(world_size=WORLD_SIZE, backend="gloo", deadline=DEADLINE)
    p.start()
    assert_clean_case_ok(p)
    pids = p.pids
    assert len(pids) == WORLD_SIZE and all(pid_alive(pid) for pid in pids)
    start = time.monotonic()
    p.close()
    assert time.monotonic() - start < 10.0 + 1.0  # close()'s own timeout
    for pid in pids:
        assert not pid_alive(pid), f"rank pid {pid} survived close()"
        assert not os.path.exists(f"/proc/{pid}"), f"rank pid {pid} was not reaped"
    assert p.pids == []
    p.close()  # a second close is a no-op
    p.close()
    assert p.pids == []


def test_close_while_ranks_are_still_starting() -> None:
    p = RankPool(world_size=WORLD_SIZE, backend="gloo", deadline=DEADLINE)
    p.start()
    pids = p.pids
    p.close()
    for pid in pids:
        assert not pid_alive(pid), f"rank pid {pid} survived close()"


# ------------------------------------------------------------------------- the pytest checker


class _CrashFirst:
    """A pool whose first ``crashes`` runs segfault a rank, whatever the case."""

    def __init__(self, pool: RankPool, crashes: int) -> None:
        self.pool, self.crashes = pool, crashes

    def run(self, case: Case, **kwargs: Any) -> object:
        if self.crashes:
            self.crashes -= 1
            return self.pool.run(fault_case(FaultAction.SIGSEGV), **kwargs)
        return self.pool.run(case, **kwargs)


def test_a_crash_the_case_does_not_repeat_is_a_warning_not_a_failure(pool: RankPool) -> None:
    check = make_checker(_CrashFirst(pool, crashes=1), known_signatures={})
    with pytest.warns(
        HistoryDependentCrash, match=r"crash:_fault:signal SIGSEGV[\s\S]*passed when run again[\s\S]*rank 1: dead"
    ):
        check(fault_case(FaultAction.NONE))


def test_a_crash_the_case_repeats_fails_the_test(pool: RankPool) -> None:
    check = make_checker(_CrashFirst(pool, crashes=2), known_signatures={})
    with pytest.raises(AssertionError, match="crash:_fault:signal SIGSEGV"):
        check(fault_case(FaultAction.NONE))
    assert_clean_case_ok(pool)


# ------------------------------------------------------------------------- the generic hang rule


def _stack(*frames: tuple[str, str, str]) -> str:
    """A sampled stack as traceback.format_stack writes it: (path, function, source line)."""
    return "".join(
        f'  File "{path}", line {10 + i}, in {fn}\n    {line}\n' for i, (path, fn, line) in enumerate(frames)
    )


C10D = "/x/site-packages/torch/distributed/distributed_c10d.py"
OURS = ("/x/fuzz/_rank/programs.py", "run_fault", "dist.all_reduce(t)")
IN_ALL_REDUCE = _stack(OURS, (C10D, "all_reduce", "work.wait()"))
IN_BARRIER = _stack(OURS, (C10D, "barrier", "work.wait()"))


@pytest.mark.parametrize(
    ("stack", "where"),
    [
        (IN_ALL_REDUCE, "torch/distributed/distributed_c10d.py:all_reduce"),
        (IN_BARRIER, "torch/distributed/distributed_c10d.py:barrier"),
        (
            _stack(
                OURS, ("/x/torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", "wait_for_unshard", "work.wait()")
            ),
            "torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py:wait_for_unshard",
        ),
        (
            _stack(
                OURS, ("/x/torch/distributed/elastic/utils/store.py", "get_all", "data = store.get(f'{prefix}{idx}')")
            ),
            "torch/distributed/elastic/utils/store.py:get_all",
        ),
        (
            _stack(
                OURS,
                (
                    "/x/torch/distributed/_functional_collectives.py",
                    "wait_tensor",
                    "return torch.ops._c10d_functional.wait_tensor(tensor)",
                ),
            ),
            "torch/distributed/_functional_collectives.py:wait_tensor",
        ),
        # computing, sleeping, or in torch.distributed but not waiting: no blocking call
        (_stack(OURS, ("/usr/lib/python3/time.py", "sleep", "time.sleep(s)")), None),
        (_stack(("/x/torch/distributed/checkpoint/planner.py", "create_plan", "plan = [x for x in items]")), None),
        (_stack(("/x/torch/nn/modules/linear.py", "forward", "return F.linear(input, self.weight)")), None),
        ("", None),
    ],
)
def test_blocking_calls_are_read_from_the_innermost_frame(stack: str, where: str | None) -> None:
    assert blocking_call(stack) == where


def test_the_rule_holds_once_every_rank_in_the_case_waits_unchanged_for_the_hold() -> None:
    watch = HangWatch(hold=4.0)
    assert not watch.look([IN_ALL_REDUCE, IN_BARRIER], 0.0)
    assert not watch.look([IN_ALL_REDUCE, IN_BARRIER], 3.9)
    assert watch.look([IN_ALL_REDUCE, IN_BARRIER], 4.0)
    # a rank that has finished the case (None) does not keep the others from being stuck
    finished = HangWatch(hold=4.0)
    assert not finished.look([None, IN_ALL_REDUCE], 0.0)
    assert finished.look([None, IN_ALL_REDUCE], 5.0)
    # nothing left in the case, or no rank sampled yet: no hang
    assert not HangWatch(hold=0.0).look([None, None], 9.0)
    assert not HangWatch(hold=0.0).look(["", ""], 9.0)


def test_a_slow_case_that_makes_progress_is_no_hang() -> None:
    """Both ranks are in collectives at every look, but their stacks move (other lines, other
    calls): each move starts the wait again, so the rule never holds, however long it runs."""
    watch = HangWatch(hold=4.0)
    for t in range(60):
        line = f"    step_{t % 3}()\n"
        a = _stack(OURS, (C10D, "all_reduce", "work.wait()")).replace("    dist.all_reduce(t)\n", line)
        b = IN_BARRIER if t % 2 else IN_ALL_REDUCE
        assert not watch.look([a, b], float(t))


def test_a_rank_outside_a_blocking_call_keeps_the_rule_from_holding() -> None:
    """One rank computes (or sleeps, or imports) while the other waits for it: not a deadlock."""
    computing = _stack(OURS, ("/x/torch/nn/modules/linear.py", "forward", "return F.linear(input, self.weight)"))
    watch = HangWatch(hold=4.0)
    for t in range(30):
        assert not watch.look([IN_ALL_REDUCE, computing], float(t))
    assert not HangWatch(hold=4.0).look([IN_ALL_REDUCE, ""], 100.0)  # a rank not sampled yet
