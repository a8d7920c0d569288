"""``python -m fuzz bench``: per-case cost of the pool against fresh ranks per case.

Both run the same parity cases (drawn once, with a fixed seed) through the same rank-side code.
The baseline spawns ranks the way PyTorch's MultiProcessTestCase does (see
:mod:`fuzz._spawn_baseline`); the pool's figure includes its one start-up, spread over its cases.
The last line is ``speedup: <ratio>x`` (baseline seconds per case over pool seconds per case).

``python -m fuzz bench --hang`` measures instead what a deadlock costs: the seconds from the
start of a case that deadlocks to its result (:func:`bench_hang`); ``python -m fuzz bench
--torch-coverage`` what measuring torch coverage costs (:func:`bench_torch_coverage`); ``python
-m fuzz bench --startup`` a campaign's time to first case, cold and warm (:func:`bench_startup`).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from fuzz import known
from fuzz._spawn_baseline import run_spawned
from fuzz.corpus import builtin_corpus
from fuzz.errors import ShardfuzzError
from fuzz.model import Case, FaultAction, FaultBody
from fuzz.patching import fault_applies
from fuzz.pool import RankPool
from fuzz.properties import get_property
from fuzz.signature import location
from fuzz.verdict import OutcomeKind


def sample_cases(world_size: int, n: int, seed: int) -> list[Case]:
    """``n`` parity cases drawn deterministically from the property's strategy, leaving out those
    that meet a known torch bug (fuzz.known.bugs_met): the benchmark times healthy cases, and
    fails on any case that does not pass."""
    out: list[Case] = []

    @settings(
        max_examples=2 * n,
        database=None,
        phases=(Phase.generate,),
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis_seed(seed)
    @given(get_property("parity").cases(world_size=world_size))
    def collect(case: Case) -> None:
        if not known.bugs_met(case):
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


#: The properties :func:`bench_torch_coverage` times, each with cases of its own.
COVERAGE_BENCH_PROPERTIES = ("parity", "metamorphic", "mixed_precision", "state_dict", "dcp", "invalid")


def bench_torch_coverage(
    *,
    backend: str = "gloo",
    world_size: int = 2,
    cases: int = 30,
    passes: int = 1,
    seed: int = 0,
    properties: tuple[str, ...] = COVERAGE_BENCH_PROPERTIES,
    out: Callable[[str], None] = print,
) -> dict[str, tuple[float, float]]:
    """Seconds per case of each property without and with torch coverage (fuzz.torch_coverage):
    the same ``cases`` cases of each property (drawn once with ``seed``, leaving out those that
    meet a known torch bug, whose failures would respawn the ranks) run through a fresh pool
    without coverage, then one with it, ``passes`` times; each figure is the median over the
    passes, from the ranks' start-up (not counted) to the last case. The last line gives cases
    per minute over all properties; the line before, the ranks' start-up."""
    from fuzz.torch_coverage import rank_env

    accelerator = backend == "nccl"
    drawn = {name: _healthy_cases(name, world_size, cases, seed, accelerator) for name in properties}
    timed: dict[tuple[str, str], list[float]] = {}
    startup: dict[str, list[float]] = {"off": [], "on": []}
    out(f"bench: torch coverage off and on, {backend}, {world_size} ranks, {passes} passes (seed {seed})")
    for _ in range(passes):
        for mode in ("off", "on"):
            with tempfile.TemporaryDirectory(prefix="shardfuzz-bench-coverage-") as data:
                env = rank_env(Path(data)) if mode == "on" else None
                t0 = time.perf_counter()
                with RankPool(world_size=world_size, backend=backend, env=env) as pool:
                    pool.wait_ready(pool.start_timeout)
                    startup[mode].append(time.perf_counter() - t0)
                    for name, group in drawn.items():
                        prop = get_property(name)
                        t = time.perf_counter()
                        for case in group:
                            prop.judge(case, pool.run(case, stall=prop.stall))
                        timed.setdefault((mode, name), []).append(time.perf_counter() - t)
    result: dict[str, tuple[float, float]] = {}
    out(f"{'property':16} {'cases':>5} {'off s/case':>10} {'on s/case':>10} {'on/off':>7}")
    for name, group in drawn.items():
        if not group:
            continue
        off, on = (statistics.median(timed[(mode, name)]) / len(group) for mode in ("off", "on"))
        result[name] = (off, on)
        out(f"{name:16} {len(group):>5} {off:>10.4f} {on:>10.4f} {on / off:>7.3f}")
    n = sum(len(g) for g in drawn.values())
    total_off = sum(result[k][0] * len(drawn[k]) for k in result)
    total_on = sum(result[k][1] * len(drawn[k]) for k in result)
    off_s, on_s = statistics.median(startup["off"]), statistics.median(startup["on"])
    out(f"start-up of the ranks: off {off_s:.2f}s, on {on_s:.2f}s")
    out(
        f"cases per minute: off {60 * n / total_off:.0f}, on {60 * n / total_on:.0f} "
        f"({100 * (total_on / total_off - 1):+.1f}% time)"
    )
    return result


def _healthy_cases(name: str, world_size: int, n: int, seed: int, accelerator: bool) -> list[Case]:
    """``n`` cases of property ``name`` drawn with ``seed``, none meeting a known torch bug."""
    out: list[Case] = []

    @settings(
        max_examples=3 * n, database=None, phases=(Phase.generate,), deadline=None,
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @hypothesis_seed(seed)
    @given(get_property(name).cases(world_size=world_size, accelerator=accelerator))
    def collect(case: Case) -> None:
        if not known.bugs_met(case):
            out.append(case)

    collect()
    return out[:n]


#: Planted in the ranks by :func:`bench_hang` (a ``sitecustomize`` module on their PYTHONPATH):
#: ``dist.all_reduce`` becomes a barrier, so the one rank that all-reduces in the fault
#: property's hang case waits in a barrier that the other ranks never reach.
_BARRIER_PLANT = """\
import torch.distributed as _dist


def _barrier_instead(*args, **kwargs):
    return _dist.barrier()


_dist.all_reduce = _barrier_instead
"""

#: The deadlocks :func:`bench_hang` plants: the fault property's hang case as it is (one rank
#: waits in an all_reduce that the others skip; they wait in the end-of-case step check), and
#: with that all_reduce turned into a barrier.
PLANTS = ("all_reduce", "barrier")


@dataclass(frozen=True)
class HangCost:
    plant: str
    world_size: int
    #: Seconds from the start of the case (every rank joined and idle) to its outcome.
    seconds: float
    #: What ended it: the pool's name for an early end (Outcome.stalled), else "deadline".
    ended_by: str
    #: Where the rank that deadlocked waited (its innermost torch frame).
    where: str = ""


def bench_hang(
    *,
    backend: str = "gloo",
    world_sizes: tuple[int, ...] = (2, 4),
    plants: tuple[str, ...] = PLANTS,
    runs: int = 1,
    deadline: float = 60.0,
    out: Callable[[str], None] = print,
) -> list[HangCost]:
    """The hang cost of planted deadlocks: for each world size and plant, ``runs`` cases of the
    fault property that deadlock, each timed from its start to its outcome (``pool.run``, the
    ranks' stacks taken and the ranks ended, with every rank joined beforehand), on a pool with
    the campaign's default deadline. One line per case, then ``hang cost: ...`` lines with the
    worst case per world size and plant."""
    for plant in plants:
        if plant not in PLANTS:
            raise ShardfuzzError(f"no planted deadlock {plant!r}; there are {PLANTS}")
    results: list[HangCost] = []
    with tempfile.TemporaryDirectory(prefix="shardfuzz-hang-bench-") as plant_dir:
        with open(os.path.join(plant_dir, "sitecustomize.py"), "w") as f:
            f.write(_BARRIER_PLANT)
        for world_size in world_sizes:
            for plant in plants:
                env = None
                if plant == "barrier":
                    env = {"PYTHONPATH": os.pathsep.join(p for p in (plant_dir, os.environ.get("PYTHONPATH")) if p)}
                with RankPool(world_size=world_size, backend=backend, deadline=deadline, env=env) as pool:
                    for i in range(runs):
                        cost = _hang_once(pool, plant)
                        results.append(cost)
                        out(
                            f"bench: {plant}, {world_size} ranks, run {i + 1}: {cost.seconds:.2f}s, "
                            f"rank {world_size - 1} in {cost.where}, ended by: {cost.ended_by}"
                        )
    for world_size in world_sizes:
        for plant in plants:
            worst = max(r.seconds for r in results if r.world_size == world_size and r.plant == plant)
            out(f"hang cost: {plant}, {backend}, {world_size} ranks: {worst:.1f}s (worst of {runs})")
    return results


def _hang_once(pool: RankPool, plant: str) -> HangCost:
    """One planted deadlock on ``pool``, timed from its start (every rank joined and idle, a
    healthy case run first) to its outcome."""
    n = pool.world_size
    hang = Case("_fault", n, 0, FaultBody(action=FaultAction.HANG, rank=n - 1))
    warm = pool.run(Case("_fault", n, 0, FaultBody(action=FaultAction.NONE)))
    if not warm.ok:
        raise ShardfuzzError(f"the healthy case before the planted deadlock failed:\n{warm.describe()}")
    t = time.perf_counter()
    outcome = pool.run(hang)
    seconds = time.perf_counter() - t
    if outcome.kind is not OutcomeKind.HANG:
        raise ShardfuzzError(f"the planted deadlock ({plant}, {n} ranks) was no hang:\n{outcome.describe()}")
    return HangCost(plant, n, seconds, outcome.stalled or "deadline", location(outcome.ranks[-1].stack))


# -- faults: time to first failure under an injected fault --------------------------------------


@dataclass
class FaultRun:
    name: str
    caught: bool
    seconds: float | None  # campaign seconds to the first new failure
    signature: str
    cases: int


def load_fault(path: str) -> dict[str, object]:
    """A fault file (``module``, ``old``, ``new``; optional ``models``, ``properties``,
    ``features``), checked."""
    import json

    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ShardfuzzError(f"{path}: not a readable fault file: {e}") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("module", "old", "new")):
        raise ShardfuzzError(f"{path}: a fault file needs the strings 'module', 'old' and 'new'")
    return data


def bench_faults(
    directory: str, *, budget: float, seed: int, world_size: int, names: list[str] | None = None
) -> list[FaultRun]:
    """Run a campaign of ``budget`` seconds under each fault of ``directory`` (its
    ``harness/sitecustomize.py`` applies the file named by ``SHARDFUZZ_FAULT`` or ``MUTANT``,
    so ``tests/faults`` and ``../shared/mutants`` both work), over the fault's ``properties``
    (all when it names none; with its ``features``, only cases with one of them, as a campaign
    aimed at that path runs: ``explore --feature``), and print the seconds to its first new
    failure. A fault counts as
    caught when the campaign saves a failure that is not a known torch bug (the campaign's
    corpus starts as a copy of the suite's own)."""
    import json
    import shutil
    import subprocess
    import sys

    harness = os.path.join(directory, "harness")
    if not os.path.isfile(os.path.join(harness, "sitecustomize.py")):
        raise ShardfuzzError(f"--faults {directory}: no harness/sitecustomize.py there")
    files = sorted(f for f in os.listdir(directory) if f.endswith(".json"))
    if names:
        files = [f for f in files if f.removesuffix(".json") in names]
    if not files:
        raise ShardfuzzError(f"--faults {directory}: no fault files" + (f" named {names}" if names else ""))
    runs = []
    print(f"faults: {len(files)} from {directory}, {budget:.0f} s each, {world_size} ranks, seed {seed}", flush=True)
    for name in files:
        path = os.path.abspath(os.path.join(directory, name))
        fault = load_fault(path)
        if not fault_applies(fault):
            print(f"  {name.removesuffix('.json'):36} skipped: its text is not in this torch's {fault['module']}")
            continue
        listed = fault.get("properties")
        props = [str(p) for p in listed] if isinstance(listed, list) else []
        aimed = fault.get("features")
        features = [str(f) for f in aimed] if isinstance(aimed, list) else []
        with tempfile.TemporaryDirectory(prefix="shardfuzz-fault-") as tmp:
            # The suite's own corpus, so that a known torch bug met on the way is not taken
            # for the fault.
            known_entries = builtin_corpus()
            if known_entries is not None:
                shutil.copytree(known_entries, f"{tmp}/corpus")
            env = {
                **os.environ,
                "SHARDFUZZ_FAULT": path,
                "MUTANT": path,
                "PYTHONPATH": os.pathsep.join(p for p in (os.path.abspath(harness), os.environ.get("PYTHONPATH")) if p),
            }
            cmd = [sys.executable, "-m", "fuzz", "explore", "--budget", str(budget), "--seed", str(seed)]
            cmd += ["--world-size", str(world_size), "--corpus", f"{tmp}/corpus", "--report", f"{tmp}/report"]
            cmd += ["--no-database"] + [a for p in props for a in ("--property", p)]
            cmd += [a for f in features for a in ("--feature", f)]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            try:
                with open(f"{tmp}/report/summary.json") as f:
                    summary = json.load(f)
            except (OSError, ValueError):
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                raise ShardfuzzError(f"{name}: the campaign wrote no report (exit {proc.returncode}): {tail}") from None
        new = [f for f in summary.get("failures", []) if f.get("status") == "new"]
        first = min(new, key=lambda f: f["first_seen"]) if new else None
        run = FaultRun(
            name=name.removesuffix(".json"),
            caught=first is not None,
            seconds=None if first is None else float(first["first_seen"]),
            signature="" if first is None else str(first["signature"]),
            cases=int(summary.get("cases", 0)),
        )
        runs.append(run)
        when = f"caught in {run.seconds:.1f} s" if run.caught else "not caught"
        aim = f"  (only cases with {' or '.join(features)})" if features else ""
        print(f"  {run.name:36} {when:18} {run.cases:6} cases  {run.signature}{aim}", flush=True)
    caught = [r for r in runs if r.caught]
    times = [r.seconds for r in caught if r.seconds is not None]
    median = f", median {statistics.median(times):.1f} s, max {max(times):.1f} s" if times else ""
    print(f"caught: {len(caught)} of {len(runs)}{median}")
    return runs


#: What the start-up benchmark's campaign runs: one parity case, no database, a fixed seed.
_STARTUP_ARGS = ("explore", "--property", "parity", "--max-examples", "1", "--seed", "1", "--no-database")


def bench_startup(
    *, backend: str = "gloo", world_size: int = 2, runs: int = 3, out: Callable[[str], None] = print
) -> dict[str, float]:
    """Time to first case of ``python -m fuzz explore``: the seconds from the process's start to
    the end of its first case (``first_case_s`` in its summary.json), the ranks' start-up
    included. Cold: Python finds no compiled ``.pyc`` of anything (torch's, Hypothesis's, the
    suite's), as in a fresh virtual environment (``PYTHONPYCACHEPREFIX`` set to an empty
    directory); warm: the same command as a second run in the installed environment finds it
    (its ``__pycache__`` directories, no prefix).
    Prints every run and the medians; returns the medians ({"cold": s, "warm": s})."""
    figures: dict[str, list[float]] = {"cold": [], "warm": []}
    for i in range(runs):
        with tempfile.TemporaryDirectory(prefix="shardfuzz-startup-") as tmp:
            cold = {**os.environ, "PYTHONPYCACHEPREFIX": os.path.join(tmp, "pyc")}
            warm = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
            for kind, env in (("cold", cold), ("warm", warm)):
                report = os.path.join(tmp, f"report-{kind}")
                argv = [sys.executable, "-m", "fuzz", *_STARTUP_ARGS, "--backend", backend]
                argv += ["--world-size", str(world_size), "--corpus", os.path.join(tmp, "corpus"), "--report", report]
                done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
                summary_path = Path(report) / "summary.json"
                if not summary_path.is_file():
                    raise ShardfuzzError(f"bench --startup: the campaign wrote no summary: {done.stderr[-2000:]}")
                first = json.loads(summary_path.read_text()).get("first_case_s")
                if first is None:
                    raise ShardfuzzError(f"bench --startup: the campaign ran no case: {done.stderr[-2000:]}")
                figures[kind].append(float(first))
                out(f"bench: startup run {i + 1}, {kind}: first case after {first:.1f}s")
    medians = {kind: statistics.median(values) for kind, values in figures.items()}
    out(
        f"time to first case ({backend}, {world_size} ranks, {os.cpu_count()} CPUs, median of {runs}): "
        f"cold {medians['cold']:.1f}s, warm {medians['warm']:.1f}s"
    )
    return medians
