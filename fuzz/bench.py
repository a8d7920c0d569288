"""``python -m fuzz bench``: per-case cost of the pool against fresh ranks per case.

Both run the same parity cases (drawn once, with a fixed seed) through the same rank-side code.
The baseline spawns ranks the way PyTorch's MultiProcessTestCase does (see
:mod:`fuzz._spawn_baseline`); the pool's figure includes its one start-up, spread over its cases.
The last line is ``speedup: <ratio>x`` (baseline seconds per case over pool seconds per case).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from fuzz._spawn_baseline import run_spawned
from fuzz.case import Case
from fuzz.errors import ShardfuzzError
from fuzz.pool import RankPool
from fuzz.properties import get_property


def sample_cases(world_size: int, n: int, seed: int) -> list[Case]:
    """``n`` parity cases drawn deterministically from the property's strategy."""
    out: list[Case] = []

    @settings(
        max_examples=n, database=None, phases=(Phase.generate,), deadline=None, suppress_health_check=list(HealthCheck)
    )
    @hypothesis_seed(seed)
    @given(get_property("parity").cases(world_size=world_size))
    def collect(case: Case) -> None:
        out.append(case)

    collect()
    return out[:n]


@dataclass(frozen=True)
class BenchResult:
    pool_startup_s: float
    pool_per_case_s: float  # start-up included, spread over the cases
    pool_median_case_s: float
    spawn_per_case_s: float
    pool_cases: int
    spawn_cases: int

    @property
    def speedup(self) -> float:
        return self.spawn_per_case_s / self.pool_per_case_s


def bench(
    *,
    backend: str = "gloo",
    world_size: int = 2,
    pool_cases: int = 100,
    spawn_cases: int = 5,
    seed: int = 0,
    out: Callable[[str], None] = print,
) -> BenchResult:
    cases = sample_cases(world_size, max(pool_cases, spawn_cases), seed)
    prop = get_property("parity")
    with RankPool(world_size=world_size, backend=backend) as pool:
        out(f"bench: {backend}, {world_size} ranks on {pool.devices}, {len(cases)} parity cases (seed {seed})")
        t0 = time.perf_counter()
        pool.start()
        pool._await_ready()
        startup = time.perf_counter() - t0
        times = []
        for case in cases[:pool_cases]:
            t = time.perf_counter()
            failure = prop.judge(case, pool.run(case))
            times.append(time.perf_counter() - t)
            if failure is not None:
                raise ShardfuzzError(f"bench case failed, fix that first: {failure.summary}")
        total = time.perf_counter() - t0
        out(
            f"pool:  start-up {startup:.2f}s, {len(times)} cases in {total:.2f}s: "
            f"{total / len(times):.4f}s per case (median case {statistics.median(times):.4f}s)"
        )
        spawn_times = []
        for case in cases[:spawn_cases]:
            t = time.perf_counter()
            run_spawned(case, backend=backend, devices=pool.devices)
            spawn_times.append(time.perf_counter() - t)
        spawn = statistics.fmean(spawn_times)
        out(
            f"spawn-per-case (multiprocessing spawn + FileStore, as MultiProcessTestCase): "
            f"{len(spawn_times)} cases, {spawn:.3f}s per case"
        )
    result = BenchResult(startup, total / len(times), statistics.median(times), spawn, len(times), len(spawn_times))
    out(f"speedup: {result.speedup:.1f}x")
    return result
