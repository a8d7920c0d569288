"""Several pools side by side: ``python -m fuzz explore --pools K``.

Each pool runs in its own driver process (``python -m fuzz explore --pools 1``) with its own
ranks, and with nccl its own GPUs (each pool locks free GPUs, see :mod:`fuzz.pool`), so a
hang or crash in one pool never stalls another. The drivers share the corpus (entries are
written atomically and merged by signature) and the Hypothesis example database (a directory
database is safe to share). Pool ``i`` explores with seed ``SEED + i`` and writes its own report
to ``REPORT/pool-i`` (its log to ``REPORT/pool-i/explore.log``); this process prints one
combined progress line from those reports and writes the combined report to ``REPORT``.

Budget: every pool counts its budget from this process's start (``--started``), so the pools end
within the budget's promise (README.md, "Budgets") as one campaign would. Should a pool still be
running ``POOL_STOP_BEFORE_S`` before that limit, it gets SIGTERM (it saves what it found and
writes its report), and SIGKILL at ``POOL_KILL_BEFORE_S``.

Signals: SIGINT and SIGTERM are passed to every pool, which stop, save what they found and
write their reports; the combined report follows. The pools die with this process
(PR_SET_PDEATHSIG), so even a SIGKILL leaves no driver and, through them, no rank behind.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from fuzz.exitcodes import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NO_CASES,
    EXIT_OK,
    EXIT_USAGE,
    campaign_exit,
    no_cases_line,
)
from fuzz.report import save_report
from fuzz.stop import stop_signal

#: Seconds between the pools' report rewrites, which the combined progress line reads.
POOL_REPORT_EVERY_S = 2.0
#: Seconds the pools get to stop after SIGTERM before they are killed.
STOP_GRACE_S = 90.0
#: Seconds before the budget's wall-time limit at which pools still running get SIGTERM, and then
#: SIGKILL: a backstop, as each pool keeps the limit itself.
POOL_STOP_BEFORE_S = 5.0
POOL_KILL_BEFORE_S = 2.0

_PR_SET_PDEATHSIG = 1


def run_pools(args: argparse.Namespace, seed: int, properties: list[str]) -> int:
    """Run ``args.pools`` campaigns side by side; returns the worst exit code (2 > 1 > 0)."""
    # imports Hypothesis: not at the top, for `python -m fuzz` start-up
    from fuzz.explore import grace, process_started
    from fuzz.status import StatusLine

    started_at = process_started()
    limit = started_at + args.budget + grace(args.budget)

    report = args.report if args.report is not None else Path(tempfile.mkdtemp(prefix="shardfuzz-pools-"))
    dirs = [report / f"pool-{i}" for i in range(args.pools)]
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    print(
        f"explore: {args.pools} pools of {args.world_size} ranks ({args.backend}), "
        f"seeds {seed}..{seed + args.pools - 1}, reports and logs in {report}/pool-*",
        file=sys.stderr,
    )
    started = started_at
    status = StatusLine(every_tty=1.0)
    interrupted = by_ctrl_c = False
    try:
        for i, d in enumerate(dirs):
            d.mkdir(parents=True, exist_ok=True)
            log = open(d / "explore.log", "wb")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    _child_argv(args, seed + i, properties, d, started_at),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent,
                    start_new_session=True,  # Ctrl-C reaches this process only; it passes SIGINT on
                )
            )
        stopping = False
        while any(p.poll() is None for p in procs):
            time.sleep(0.2)
            now = time.monotonic()
            if now >= limit - POOL_KILL_BEFORE_S:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            elif now >= limit - POOL_STOP_BEFORE_S and not stopping:
                stopping = True
                for p in procs:
                    with contextlib.suppress(ProcessLookupError):
                        p.send_signal(signal.SIGTERM)
            status.show(lambda width: _line(merge(_read(dirs), seconds=time.monotonic() - started), args.pools, width))
    except KeyboardInterrupt:
        interrupted = True
        # Ctrl-C exits 130; SIGTERM (a scheduler) ends the campaign as its budget would (fuzz.exitcodes)
        by_ctrl_c = stop_signal() in (None, signal.SIGINT)
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        until = time.monotonic() + STOP_GRACE_S
        for p in procs:
            try:
                p.wait(timeout=max(0.1, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    status.end()
    summary = merge(_read(dirs), seconds=time.monotonic() - started)
    summary["interrupted"] = summary.get("interrupted", False) or interrupted
    summary["budget"] = args.budget
    if getattr(args, "torch_coverage", False):
        _add_torch_coverage(summary, _read(dirs), report, signal=not args.no_coverage_signal)
    print(_line(summary, args.pools), file=sys.stderr)
    for f in summary["failures"]:
        tag = "known" if f["known"] else "new"
        if f.get("known_as"):
            tag = f"known (as {f['known_as']})"
        print(f"{tag}: {f['signature']} x{f['hits']}: {f['summary']} -> {f['entry']}", file=sys.stderr)
    fallback = summary.get("corpus_fallback")
    if fallback:
        print(f"explore: {fallback['reason']}; entries saved to {fallback['directory'] or 'nowhere'}", file=sys.stderr)
    codes = [p.returncode for p in procs]
    ran = (EXIT_OK, EXIT_FAILED, EXIT_NO_CASES, EXIT_INTERRUPTED)  # a pool's own verdicts, not errors
    for i, code in enumerate(codes):
        if code not in ran:
            print(f"explore: pool {i} exited with {code}; see {dirs[i] / 'explore.log'}", file=sys.stderr)
    if args.report is not None:
        print(f"explore: report {save_report(report, summary)}", file=sys.stderr)
    if any(c not in ran for c in codes) and not interrupted:
        return EXIT_USAGE
    cases = int(summary.get("cases", 0))
    if cases == 0 and not interrupted:
        print(no_cases_line(args.budget, pools=len(codes)), file=sys.stderr)
    new = EXIT_FAILED in codes or any(not f["known"] for f in summary["failures"])
    return campaign_exit(new_failures=new, cases=cases, interrupted=by_ctrl_c)


def _child_argv(
    args: argparse.Namespace, seed: int, properties: list[str], report: Path, started: float | None = None
) -> list[str]:
    argv = [sys.executable, "-m", "fuzz", "explore", "--pools", "1", "--seed", str(seed)]
    if started is not None:
        argv += ["--started", repr(started)]
    argv += ["--budget", str(args.budget), "--backend", args.backend, "--world-size", str(args.world_size)]
    argv += ["--deadline", str(args.deadline), "--corpus", str(args.corpus), "--report", str(report)]
    argv += ["--report-every", str(POOL_REPORT_EVERY_S)]
    if args.reruns is not None:
        argv += ["--reruns", str(args.reruns)]
    for prefix in args.features:
        argv += ["--feature", prefix]
    for bug_id in getattr(args, "fixes", []):
        argv += ["--fix", bug_id]
    if args.max_examples is not None:
        argv += ["--max-examples", str(max(1, args.max_examples // args.pools))]
    for name in properties:
        argv += ["--property", name]
    if getattr(args, "model", None):
        argv += ["--model", args.model]
    if getattr(args, "torch_coverage", False):
        argv.append("--torch-coverage")  # each pool's data in its REPORT/pool-i/torch-coverage
        if args.no_coverage_signal:
            argv.append("--no-coverage-signal")
    if args.no_database:
        argv.append("--no-database")
    elif args.database is not None:
        argv += ["--database", str(args.database)]
    return argv


def _add_torch_coverage(summary: dict[str, Any], pools: list[dict[str, Any]], report: Path, *, signal: bool) -> None:
    """The pools' torch coverage data (each in REPORT/pool-i/torch-coverage) merged: a line is
    reached when a rank of any pool ran it. The new lines per property are the pools' own
    counts, summed (a line two pools each reached first counts for both)."""
    from fuzz.torch_coverage import ReachedLines, one_line, torch_summary

    lines = ReachedLines([report])
    lines.update()
    per_property: Counter[str] = Counter()
    for s in pools:
        torch = s.get("torch_coverage")
        if isinstance(torch, dict):
            per_property.update(torch.get("new_lines_per_property", {}))
    summary["torch_coverage"] = torch_summary(lines, per_property=dict(per_property), signal=signal)
    print(f"explore: {one_line(lines)}", file=sys.stderr)


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _read(dirs: list[Path]) -> list[dict[str, Any]]:
    out = []
    for d in dirs:
        try:
            out.append(json.loads((d / "summary.json").read_text()))
        except (OSError, ValueError):
            continue  # not written yet
    return out


def merge(summaries: list[dict[str, Any]], *, seconds: float) -> dict[str, Any]:
    """One summary (schema 1) for several pools' summaries: counts add, failures merge by signature."""

    def add(key: str) -> dict[str, Any]:
        total: Counter[str] = Counter()
        for s in summaries:
            total.update(s.get(key, {}))
        return dict(total)

    failures: dict[str, dict[str, Any]] = {}
    for s in summaries:
        for f in s.get("failures", []):
            seen = failures.get(f["signature"])
            if seen is None:
                failures[f["signature"]] = dict(f)
            else:
                seen["hits"] += f["hits"]
                seen["first_seen"] = min(seen["first_seen"], f["first_seen"])
                if not seen["entry"]:
                    for key in ("entry", "entry_fallback", "in_corpus", "commands"):
                        if key in f:
                            seen[key] = f[key]
    per_property: dict[str, Counter[str]] = {}
    for s in summaries:
        for prop, feats in s.get("features_per_property", {}).items():
            per_property.setdefault(prop, Counter()).update(feats)
    weights: Counter[str] = Counter()
    for s in summaries:
        weights.update(s.get("weights", {}))
    first = summaries[0] if summaries else {}
    return {
        "schema": 1,
        "seed": first.get("seed"),
        "seeds": [s.get("seed") for s in summaries],
        "started_at": first.get("started_at"),
        "seconds": round(seconds, 2),
        "budget": first.get("budget", 0.0),
        "wall_limit": first.get("wall_limit"),
        "cases": sum(s.get("cases", 0) for s in summaries),
        "interrupted": any(s.get("interrupted", False) for s in summaries),
        "restarts": sum(s.get("restarts", 0) for s in summaries),
        "recycled": sum(s.get("recycled", 0) for s in summaries),
        "environment_reruns": add("environment_reruns"),
        "backend": first.get("backend"),
        "world_size": first.get("world_size"),
        "pools": len(summaries),
        "fixes": sorted({b for s in summaries for b in s.get("fixes", [])}),
        "properties": sorted({p for s in summaries for p in s.get("properties", [])}),
        "cases_per_property": add("cases_per_property"),
        "seconds_per_property": add("seconds_per_property"),
        "features": add("features"),
        "features_per_property": {k: dict(v) for k, v in per_property.items()},
        "failures": sorted(failures.values(), key=lambda f: f["first_seen"]),
        "corpus_fallback": next((s["corpus_fallback"] for s in summaries if s.get("corpus_fallback")), None),
        "timeline": _merge_timelines([s.get("timeline", []) for s in summaries], list(failures.values())),
        "weights": {k: round(v / len(summaries), 4) for k, v in weights.items()} if summaries else {},
    }


def _merge_timelines(timelines: list[list[dict[str, Any]]], failures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At each time any pool sampled, the sum over pools of their latest sample.

    Distinct failures come from the merged failures' first sightings (pools start together),
    so a signature that two pools found counts once.
    """
    times = sorted({p["t"] for tl in timelines for p in tl})
    merged = []
    idx = [0] * len(timelines)
    latest: list[dict[str, Any] | None] = [None] * len(timelines)
    for t in times:
        for i, tl in enumerate(timelines):
            while idx[i] < len(tl) and tl[idx[i]]["t"] <= t:
                latest[i] = tl[idx[i]]
                idx[i] += 1
        points = [p for p in latest if p is not None]
        per_property: Counter[str] = Counter()
        for p in points:
            per_property.update(p.get("per_property", {}))
        merged.append(
            {
                "t": t,
                "cases": sum(p["cases"] for p in points),
                "distinct_failures": sum(1 for f in failures if f["first_seen"] <= t),
                "per_property": dict(per_property),
            }
        )
    return merged


def _line(summary: dict[str, Any], pools: int, width: int | None = None) -> str:
    from fuzz.status import clock, fit_line

    seconds = summary.get("seconds", 0.0)
    rate = summary["cases"] / seconds if seconds > 0 else 0.0
    return fit_line(
        f"[{clock(seconds)} / {clock(summary.get('budget') or 0.0)}] {pools} pools, cases {summary['cases']}",
        [f"({rate:.1f}/s)", f"restarts {summary['restarts']}"]
        + ([f"re-run for the machine {sum(reruns.values())}"] if (reruns := summary.get("environment_reruns")) else []),
        [f"{f['signature']} x{f['hits']}" for f in summary["failures"]],
        width,
    )
