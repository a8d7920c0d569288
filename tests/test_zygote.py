"""Ranks forked from a zygote (fuzz.zygote): they start as fresh processes would, die with it,
and a pool whose zygote is gone carries on with new ones."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fuzz import zygote as zygote_module
from fuzz._rank.zygote import TORCH_DEFAULT_SEED
from fuzz.pool import RankPool
from fuzz.zygote import Zygote, ZygoteError, zygotes_wanted
from tests.conftest import pid_alive, wait_gone

START_S = 120.0

# What a fresh process would tell apart: its parent, its string hash seed, torch's seed.
PROBE = """
import os
import torch


def attempt(rank, world_size):
    comm = open("/proc/self/comm").read().strip()
    return f"{os.getppid()} {hash('shardfuzz')} {torch.initial_seed()} {comm}"
"""


def _probe(pool: RankPool) -> dict[int, list[str]]:
    outcome = pool.run_script(PROBE, deadline=60.0)
    assert not outcome.errors and not outcome.died, (outcome.errors, outcome.died)
    return {rank: verdict.split() for rank, verdict in outcome.verdicts.items()}


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.skipif(not zygotes_wanted(os.environ), reason="ranks start from scratch here (SHARDFUZZ_ZYGOTE=0)")
def test_forked_ranks_start_as_fresh_processes_and_respawn_from_the_same_zygotes() -> None:
    with RankPool(world_size=2) as pool:
        assert pool.wait_ready(START_S)
        first = _probe(pool)
        parents = {rank: int(seen[0]) for rank, seen in first.items()}
        assert os.getpid() not in parents.values()
        assert len(set(parents.values())) == 2, "each rank slot has a zygote of its own"
        assert all(_ppid(parent) == os.getpid() for parent in parents.values())
        assert first[0][1] != first[1][1], "the ranks of one pool share a string hash seed"
        assert [first[r][3] for r in (0, 1)] == ["shardfuzz-rank0", "shardfuzz-rank1"]
        if first[0][2] != str(TORCH_DEFAULT_SEED):  # this torch seeds each process at random
            assert first[0][2] != first[1][2]

        old = pool.pids
        pool.respawn()
        assert pool.wait_ready(START_S)
        again = _probe(pool)
        assert set(pool.pids).isdisjoint(old)
        assert not wait_gone(old, 10.0)
        assert {rank: int(seen[0]) for rank, seen in again.items()} == parents
        if first[0][2] != str(TORCH_DEFAULT_SEED):
            assert again[0][2] != first[0][2], "a respawned rank kept its torch seed"


@pytest.mark.skipif(not zygotes_wanted(os.environ), reason="ranks start from scratch here (SHARDFUZZ_ZYGOTE=0)")
def test_a_pool_without_a_hash_seed_per_rank_forks_every_rank_from_one_zygote() -> None:
    """``hash_seed_per_rank=False``: one zygote (one import of torch) for the whole pool; its
    ranks share the string hash seed and still start as fresh processes otherwise."""
    with RankPool(world_size=2, env={"SHARDFUZZ_TEST_ENV": "one-zygote"}, hash_seed_per_rank=False) as pool:
        assert pool.wait_ready(START_S)
        seen = _probe(pool)
        assert seen[0][0] == seen[1][0], "the ranks have zygotes of their own"
        assert _ppid(int(seen[0][0])) == os.getpid()
        assert seen[0][1] == seen[1][1]
        assert [seen[r][3] for r in (0, 1)] == ["shardfuzz-rank0", "shardfuzz-rank1"]
        if seen[0][2] != str(TORCH_DEFAULT_SEED):
            assert seen[0][2] != seen[1][2]


@pytest.mark.skipif(not zygotes_wanted(os.environ), reason="ranks start from scratch here (SHARDFUZZ_ZYGOTE=0)")
def test_a_killed_zygote_takes_its_rank_along_and_the_pool_goes_on() -> None:
    with RankPool(world_size=2) as pool:
        assert pool.wait_ready(START_S)
        parents = {rank: int(seen[0]) for rank, seen in _probe(pool).items()}
        rank1 = pool.pids[1]
        os.kill(parents[1], signal.SIGKILL)
        assert not wait_gone([rank1], 10.0), "a rank outlived its zygote"
        outcome = pool.run_script(PROBE, deadline=60.0)
        assert 1 in outcome.died and outcome.died[1][0] == -signal.SIGKILL, outcome
        assert outcome.respawned
        assert pool.wait_ready(START_S)
        after = {rank: int(seen[0]) for rank, seen in _probe(pool).items()}
        assert after[0] == parents[0] and after[1] != parents[1], "slot 1 got a new zygote"


def test_ranks_start_from_scratch_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDFUZZ_ZYGOTE", "0")
    with RankPool(world_size=2) as pool:
        assert pool.wait_ready(START_S)
        assert {int(seen[0]) for seen in _probe(pool).values()} == {os.getpid()}


def test_a_zygote_that_cannot_start_says_why(tmp_path: Path) -> None:
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no torch in this environment')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)}
    zygote = Zygote(env, str(tmp_path / "zygote.log"))
    r, w = os.pipe()
    try:
        with pytest.raises(ZygoteError, match="no torch in this environment"):
            zygote.fork({}, (r, w, w))
        assert not zygote.alive
    finally:
        zygote.close()
        os.close(r)
        os.close(w)


@pytest.mark.skipif(not zygotes_wanted(os.environ), reason="ranks start from scratch here (SHARDFUZZ_ZYGOTE=0)")
def test_a_forked_rank_is_waited_for_and_signalled_like_a_child(tmp_path: Path) -> None:
    """ForkedRank's Popen parts: wait's timeout, the exit status of a signal, no signal after it."""
    with RankPool(world_size=1) as pool:
        assert pool.wait_ready(START_S)
        proc = pool._ranks[0].proc
        assert proc.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.2)
        start = time.monotonic()
        proc.terminate()
        assert proc.wait(10.0) == -signal.SIGTERM
        assert time.monotonic() - start < 10.0
        assert not pid_alive(proc.pid)
        proc.kill()  # already reaped: nothing is sent to whatever has the pid now
        assert proc.poll() == -signal.SIGTERM


def _registry_of_two(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An empty registry of at most 2 zygotes, and an environment whose zygotes start at once
    (their torch fails to import): what the registry keeps, not what a zygote does."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no torch in this environment')\n")
    monkeypatch.setattr(zygote_module, "MAX_ZYGOTES", 2)
    monkeypatch.setattr(zygote_module, "_zygotes", {})
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def test_a_process_keeps_few_zygotes_and_one_per_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's name in the environment does not start a zygote per test, and past
    MAX_ZYGOTES the least recently used zygotes without ranks are ended."""
    base = _registry_of_two(tmp_path, monkeypatch)
    made = []
    try:
        first = zygote_module.zygote_for(0, {**base, "PYTEST_CURRENT_TEST": "a"})
        made.append(first)
        assert zygote_module.zygote_for(0, {**base, "PYTEST_CURRENT_TEST": "b"}) is first
        for n in range(3):
            made.append(zygote_module.zygote_for(0, {**base, "SHARDFUZZ_TEST_ENV": str(n)}))
            assert len(zygote_module._zygotes) <= 2
        assert not first.alive and made[-1] in zygote_module._zygotes.values()
    finally:
        for z in made:
            z.close()


def test_zygotes_of_pools_with_an_environment_of_their_own_are_ended_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_ZYGOTES, an idle zygote asked for by a pool with an environment of its own (a
    fault's) is ended before the process's usual ones, even when it was used more recently."""
    base = _registry_of_two(tmp_path, monkeypatch)
    made = []
    try:
        usual = zygote_module.zygote_for(0, base)
        made.append(usual)
        for n in range(3):
            made.append(zygote_module.zygote_for(0, {**base, "SHARDFUZZ_TEST_ENV": str(n)}, usual=False))
            assert len(zygote_module._zygotes) <= 2
        assert usual.alive and usual in zygote_module._zygotes.values()
        assert [z.alive for z in made[1:]] == [False, False, True]
        # asked for once as usual, it stays usual
        assert zygote_module.zygote_for(0, base, usual=False) is usual and usual.usual
    finally:
        for z in made:
            z.close()
