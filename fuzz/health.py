"""``python -m fuzz.health``: do long campaigns stay healthy?

Runs many cases through one :class:`~fuzz.pool.RankPool`, round robin over the properties, and
at given marks (after 200 and 2,000 cases by default) samples every rank from the driver side:
resident memory and threads from ``/proc/<pid>/status``, open descriptors from
``/proc/<pid>/fd``, and with NCCL the GPU memory ``nvidia-smi`` charges to the rank's pid. The
last mark must be within ``limit`` (20%) of the first, both ways, for every rank and metric:
growth is a leak (process groups, meshes, modules kept alive by hooks, threads never joined),
and a shrink that large means the first mark was not a steady state.

The comparison means something only if the same processes were sampled at both marks. A case
that fails ends its ranks and the pool spawns new ones (new pids, fresh memory), so cases of
known torch bugs that would end the ranks are not run (``_known_to_fail``), a failure is counted
and named, and the table says when ranks were respawned between marks and how many cases each
sampled process had run.

The last line is ``health: ok`` or ``health: drift in <metrics>``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from fuzz import known
from fuzz.cli import positive_int
from fuzz.corpus import KnownBugs, load_corpus
from fuzz.errors import InvalidArgument, ShardfuzzError
from fuzz.model import Case
from fuzz.pool import RankPool, sample_process
from fuzz.properties import Property, all_properties, get_property

#: Largest allowed change of a metric between the first and the last mark (fraction).
LIMIT = 0.20
METRICS = ("rss_mib", "threads", "fds", "gpu_mib")
_HEADERS = {"rss_mib": "RSS MiB", "threads": "threads", "fds": "fds", "gpu_mib": "GPU MiB"}
#: Cases drawn from a property's strategy at a time (each chunk with its own derived seed).
DRAW_CHUNK = 100
EXIT_OK, EXIT_DRIFT, EXIT_USAGE = 0, 1, 2


# --------------------------------------------------------------------------------- sampling


def parse_nvidia_smi(text: str) -> dict[int, float]:
    """MiB per pid from ``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits``.

    A pid with contexts on several GPUs is charged the sum; rows that do not parse (``[N/A]``
    on some drivers) are left out."""
    out: dict[int, float] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 2:
            continue
        try:
            pid, mib = int(cells[0]), float(cells[1])
        except ValueError:
            continue
        out[pid] = out.get(pid, 0.0) + mib
    return out


def gpu_memory_by_pid(*, timeout: float = 30.0) -> dict[int, float] | None:
    """GPU memory per pid, or None where nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_nvidia_smi(done.stdout) if done.returncode == 0 else None


# --------------------------------------------------------------------------------- verdict


def change(first: float | None, last: float | None) -> float | None:
    """last / first; None when either is unknown; 1.0 for 0 -> 0, infinity for 0 -> more."""
    if first is None or last is None:
        return None
    if first == 0:
        return 1.0 if last == 0 else math.inf
    return last / first


def within(ratio: float | None, limit: float = LIMIT) -> bool:
    """Whether a ratio is within ``limit`` of 1 (an unknown ratio is not a drift)."""
    return ratio is None or abs(ratio - 1.0) <= limit + 1e-12


def verdict(
    marks: Sequence[dict[str, Any]], limit: float = LIMIT
) -> tuple[dict[int, dict[str, float | None]], list[str]]:
    """Ratios last mark / first mark per rank and metric, and the drifted ``rank R <metric>``s.

    ``marks`` are as in :func:`health_bench`'s result: each has ``ranks``, a list of dicts with
    ``rank`` and the metrics of :data:`METRICS` (None where not measured)."""
    if len(marks) < 2:
        raise InvalidArgument(f"{len(marks)} mark(s) sampled; a verdict needs at least two")
    first = {r["rank"]: r for r in marks[0]["ranks"]}
    last = {r["rank"]: r for r in marks[-1]["ranks"]}
    ratios: dict[int, dict[str, float | None]] = {}
    drifted: list[str] = []
    for rank in sorted(first):
        ratios[rank] = {}
        for metric in METRICS:
            ratio = change(first[rank].get(metric), last.get(rank, {}).get(metric))
            ratios[rank][metric] = ratio
            if not within(ratio, limit):
                drifted.append(f"rank {rank} {metric}")
    return ratios, drifted


# --------------------------------------------------------------------------------- cases


def _known_to_fail(case: Case) -> str | None:
    """The known torch bug a case would run into in a way that ends its ranks (an exception or
    a hang), if it can be told from the case; mismatches leave the ranks alive and are run."""
    return known.ends_ranks(case)


def draw_cases(prop: Property, world_size: int, n: int, seed: int) -> list[Case]:
    """Up to ``n`` cases drawn deterministically from the property's strategy (Hypothesis's
    generate phase only, as :func:`fuzz.bench.sample_cases`); fewer if the strategy has fewer."""
    out: list[Case] = []

    @settings(
        max_examples=n, database=None, phases=(Phase.generate,), deadline=None, suppress_health_check=list(HealthCheck)
    )
    @hypothesis_seed(seed)
    @given(prop.cases(world_size=world_size))
    def collect(case: Case) -> None:
        out.append(case)

    collect()
    return out[:n]


def _stream(prop: Property, world_size: int, seed: int, index: int, chunk_size: int) -> Iterator[Case]:
    """Endless cases of one property, drawn a chunk at a time so 2,000 cases are not held at once.
    A strategy with few distinct cases (``invalid``) repeats them, which a health run welcomes."""
    chunk = 0
    while True:
        cases = draw_cases(prop, world_size, chunk_size, (seed * 1000 + index) * 100_000 + chunk)
        if not cases:
            raise ShardfuzzError(f"property {prop.name!r} drew no cases for world_size={world_size}")
        yield from cases
        chunk += 1


def _round_robin(
    props: Sequence[Property], world_size: int, seed: int, cases: int, skipped: Counter[str]
) -> Iterator[tuple[Property, Case]]:
    # Drawing is a large part of a short run: draw about what each property needs, at most a chunk.
    chunk_size = min(DRAW_CHUNK, -(-cases // len(props)) + 4)
    streams = [_stream(p, world_size, seed, i, chunk_size) for i, p in enumerate(props)]
    while True:
        for prop, stream in zip(props, streams):
            for case in stream:
                bug = _known_to_fail(case)
                if bug is None:
                    yield prop, case
                    break
                skipped[bug] += 1


def _known_signatures(corpus: str | os.PathLike[str] | None) -> KnownBugs:
    return KnownBugs(load_corpus(corpus)[0] if corpus is not None else [])


# --------------------------------------------------------------------------------- the run


def _sample(pool: RankPool, backend: str, cases: int, since_spawn: int) -> dict[str, Any]:
    gpu = gpu_memory_by_pid() if backend == "nccl" else None
    ranks = []
    for rank, pid in enumerate(pool.pids):
        stats = sample_process(pid)
        ranks.append(
            {
                "rank": rank,
                "pid": pid,
                "rss_mib": stats.get("rss_mib"),
                "threads": stats.get("threads"),
                "fds": stats.get("fds"),
                "gpu_mib": gpu.get(pid) if gpu is not None else None,
            }
        )
    mark: dict[str, Any] = {"cases": cases, "restarts": pool.restarts, "cases_in_process": since_spawn, "ranks": ranks}
    if backend == "nccl":
        # Every process nvidia-smi saw: pids in another pid namespace (a container) do not match.
        mark["gpu_processes"] = None if gpu is None else {str(pid): mib for pid, mib in sorted(gpu.items())}
    return mark


def _check_marks(cases: int, marks: Sequence[int]) -> tuple[int, ...]:
    out = tuple(marks)
    if len(out) < 2:
        raise InvalidArgument(f"marks={out!r} needs at least two marks, e.g. (200, 2000)")
    if any(not isinstance(m, int) or isinstance(m, bool) or m < 1 for m in out):
        raise InvalidArgument(f"marks={out!r} must be positive integers (numbers of cases)")
    if any(a >= b for a, b in itertools.pairwise(out)):
        raise InvalidArgument(f"marks={out!r} must increase, e.g. (200, 2000)")
    if out[-1] > cases:
        raise InvalidArgument(f"marks={out!r} go past cases={cases}; use cases={out[-1]} or lower marks")
    return out


def health_bench(
    *,
    backend: str = "gloo",
    world_size: int = 2,
    cases: int = 2000,
    marks: Sequence[int] = (200, 2000),
    seed: int = 0,
    properties: Sequence[str] | None = None,
    deadline: float = 60.0,
    limit: float = LIMIT,
    corpus: str | os.PathLike[str] | None = "corpus",
    out: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run ``cases`` cases (round robin over ``properties``, default all that fit the world size),
    sample every rank at each of ``marks`` (numbers of cases run), print the table and the
    verdict, and return the figures.

    Failures whose signature is a ``known`` entry of ``corpus`` are counted as known; others as
    new. Either kind that ended the ranks shows as a restart."""
    if not isinstance(cases, int) or cases < 1:
        raise InvalidArgument(f"cases={cases!r} must be a positive integer")
    if not 0 < limit < 1:
        raise InvalidArgument(f"limit={limit!r} must be a fraction between 0 and 1, e.g. 0.2")
    marks = _check_marks(cases, marks)
    if properties:
        props = [get_property(name) for name in properties]
    else:
        props = [p for p in all_properties() if p.min_world_size <= world_size]
    too_big = [p.name for p in props if p.min_world_size > world_size]
    if too_big:
        raise InvalidArgument(f"properties {too_big} need more than world_size={world_size} ranks")
    known_bugs = _known_signatures(corpus)
    skipped: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    known_hits: Counter[str] = Counter()
    per_property: Counter[str] = Counter()
    sampled: list[dict[str, Any]] = []
    started = time.perf_counter()
    with RankPool(world_size=world_size, backend=backend, deadline=deadline, max_rank_threads=None) as pool:
        out(
            f"health: {backend}, {world_size} ranks on {pool.devices}, {cases} cases round robin over "
            f"{', '.join(p.name for p in props)} (seed {seed}); marks {', '.join(map(str, marks))}; limit {limit:.0%}"
        )
        since_spawn = 0
        pending = list(marks)
        run = 0
        pool.start()
        for prop, case in _round_robin(props, world_size, seed, cases, skipped):
            if run >= cases:
                break
            # New pids: the ranks were replaced after this case (a failure), so the processes
            # sampled next have run no case yet.
            pids = pool.pids
            failure = prop.judge(case, pool.run(case, stall=prop.stall))
            run += 1
            per_property[prop.name] += 1
            replaced = pool.pids != pids
            since_spawn = 0 if replaced else since_spawn + 1
            if failure is not None:
                is_known = known_bugs.explain(failure.signature, case, failure.kind) is not None
                hits = known_hits if is_known else failures
                if not hits[failure.signature]:  # each signature once, as it happens: a cut-off run still names it
                    respawned = " (ranks respawned)" if replaced else ""
                    label = "known" if hits is known_hits else "NEW"
                    out(f"  case {run}: {label} failure {failure.signature}{respawned}")
                hits[failure.signature] += 1
            if pending and run == pending[0]:
                pending.pop(0)
                pool._await_ready()  # after a failure the fresh ranks may still be starting
                sampled.append(_sample(pool, backend, run, since_spawn))
                out(f"  mark {run}: sampled after {time.perf_counter() - started:.0f}s, {pool.restarts} restart(s)")
        restarts = pool.restarts
    ratios, drifted = verdict(sampled, limit)
    result: dict[str, Any] = {
        "backend": backend,
        "world_size": world_size,
        "cases": run,
        "seed": seed,
        "limit": limit,
        "seconds": time.perf_counter() - started,
        "per_property": dict(per_property),
        "skipped_known": dict(skipped),
        "known_failures": dict(known_hits),
        "new_failures": dict(failures),
        "restarts": restarts,
        "marks": sampled,
        "ratios": {str(r): v for r, v in ratios.items()},
        "drift": drifted,
        "same_processes": [r["pid"] for r in sampled[0]["ranks"]] == [r["pid"] for r in sampled[-1]["ranks"]],
        "ok": not drifted,
    }
    for line in format_report(result):
        out(line)
    return result


# --------------------------------------------------------------------------------- output


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) and not value.is_integer() else f"{value:.0f}"


def _rss_growth(first: dict[str, Any], last: dict[str, Any], rank: int) -> str:
    """``+16.6 MiB RSS, 9.4 KiB/case``: the rate a slow leak would show, for one rank's same process."""
    a = next((r for r in first["ranks"] if r["rank"] == rank), None)
    b = next((r for r in last["ranks"] if r["rank"] == rank), None)
    if a is None or b is None or a["pid"] != b["pid"] or a["rss_mib"] is None or b["rss_mib"] is None:
        return ""
    delta = b["rss_mib"] - a["rss_mib"]
    return f"{delta:+.1f} MiB RSS, {delta * 1024 / (last['cases'] - first['cases']):+.1f} KiB/case"


def format_report(result: dict[str, Any]) -> list[str]:
    """The table, the ratios with PASS / DRIFT, and the final ``health:`` line."""
    marks = result["marks"]
    limit = result["limit"]
    lines = [
        f"{result['cases']} cases in {result['seconds']:.0f}s: "
        + ", ".join(f"{k} {v}" for k, v in sorted(result["per_property"].items())),
    ]
    if result["skipped_known"]:
        lines.append(
            "not run (known torch bugs that end the ranks): "
            + ", ".join(f"{k} x{v}" for k, v in sorted(result["skipped_known"].items()))
        )
    for title, key in (("known failures", "known_failures"), ("NEW failures", "new_failures")):
        if result[key]:
            lines.append(f"{title}: " + "; ".join(f"{k} x{v}" for k, v in sorted(result[key].items())))
    lines.append(
        f"{'mark':>6} {'rank':>4} {'pid':>8} {'cases in proc':>13} " + " ".join(f"{_HEADERS[m]:>8}" for m in METRICS)
    )
    for mark in marks:
        for r in mark["ranks"]:
            lines.append(
                f"{mark['cases']:>6} {r['rank']:>4} {r['pid']:>8} {mark['cases_in_process']:>13} "
                + " ".join(f"{_fmt(r[m]):>8}" for m in METRICS)
            )
    first, last = marks[0], marks[-1]
    if any("gpu_processes" in m and all(r["gpu_mib"] is None for r in m["ranks"]) for m in marks):
        lines.append(
            "note: no GPU figure for the ranks (nvidia-smi absent, or it lists other pids: "
            f"{[m.get('gpu_processes') for m in marks]})"
        )
    lines.append(f"ratio {last['cases']}/{first['cases']} (limit {1 - limit:.2f}..{1 + limit:.2f}):")
    for rank, ratios in sorted(result["ratios"].items(), key=lambda kv: int(kv[0])):
        cells = []
        for m in METRICS:
            ratio = ratios[m]
            cells.append(
                f"{_HEADERS[m]} "
                + ("-" if ratio is None else f"{ratio:.3f} {'PASS' if within(ratio, limit) else 'DRIFT'}")
            )
        growth = _rss_growth(first, last, int(rank))
        lines.append(f"  rank {rank}: " + ", ".join(cells) + (f" ({growth})" if growth else ""))
    if not result["same_processes"]:
        lines.append(
            f"note: the ranks were replaced between the marks ({last['restarts'] - first['restarts']} respawn(s) "
            f"after failures), so mark {last['cases']} samples processes that had run "
            f"{last['cases_in_process']} cases, not {last['cases']}: the comparison is not of the same processes"
        )
    caveat = "" if result["same_processes"] else "; not the same processes, see the note"
    if result["drift"]:
        metrics = sorted({d.split()[-1] for d in result["drift"]}, key=METRICS.index)
        lines.append(f"health: drift in {', '.join(metrics)} ({'; '.join(result['drift'])}{caveat})")
    else:
        lines.append("health: ok" + (f" ({caveat[2:]})" if caveat else ""))
    return lines


# --------------------------------------------------------------------------------- command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _marks(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of case counts, e.g. 200,2000"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m fuzz.health",
        description="Run many cases through one rank pool and check that every rank's memory, threads and "
        "descriptors stay within a limit between marks. Exit 0 ok, 1 drift, 2 bad arguments.",
    )
    p.add_argument("--cases", type=positive_int, default=2000, help="cases to run (default 2000)")
    p.add_argument("--marks", type=_marks, default=(200, 2000), help="case counts to sample at (default 200,2000)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="gloo (CPU, default) or nccl")
    p.add_argument("--world-size", type=positive_int, default=2, help="number of ranks (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--property", action="append", dest="properties", metavar="NAME", help="repeatable; default all")
    p.add_argument("--deadline", type=float, default=60.0, help="seconds a case may take (default 60)")
    p.add_argument("--limit", type=float, default=LIMIT, help="allowed change, a fraction (default 0.2)")
    p.add_argument("--corpus", default="corpus", help="corpus whose known entries name expected failures")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures as JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = health_bench(
            backend=args.backend,
            world_size=args.world_size,
            cases=args.cases,
            marks=args.marks,
            seed=args.seed,
            properties=args.properties,
            deadline=args.deadline,
            limit=args.limit,
            corpus=args.corpus,
        )
    except ShardfuzzError as e:
        print(f"python -m fuzz.health: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, sort_keys=True)
    return EXIT_OK if result["ok"] else EXIT_DRIFT


if __name__ == "__main__":
    sys.exit(main())
