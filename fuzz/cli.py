"""The command line: a thin layer over :mod:`fuzz.explore`, :mod:`fuzz.bench` and the corpus.

Exit codes: 0 ran and nothing new failed (replay: no longer fails); 1 a new failure was found
or reproduced; 2 bad arguments or an unreadable input, with a message that names it.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

from fuzz.errors import ShardfuzzError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def duration(text: str) -> float:
    """Seconds from ``300``, ``300s``, ``10m``, ``8h`` or ``1h30m``."""
    m = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or m is None or not any(m.groups()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; write e.g. 300, 90s, 10m or 8h")
    h, mins, s = (float(g) if g else 0.0 for g in m.groups())
    seconds = h * 3600 + mins * 60 + s
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive duration")
    return seconds


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _pool_args(p: argparse.ArgumentParser, *, world_size: bool = True) -> None:
    p.add_argument(
        "--backend", choices=("gloo", "nccl"), default="gloo", help="gloo (CPU, default) or nccl (one GPU per rank)"
    )
    if world_size:
        p.add_argument("--world-size", type=positive_int, default=2, help="number of ranks (default 2)")
    p.add_argument(
        "--deadline", type=duration, default=60.0, help="seconds a case may take before it is a hang (default 60)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m fuzz", description="Property-based fuzzing of PyTorch's composable distributed APIs."
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    ex = sub.add_parser("explore", help="run properties for a time budget; new failures go to the corpus")
    ex.add_argument("--budget", type=duration, default=60.0, help="time budget, e.g. 300, 10m, 8h (default 60s)")
    ex.add_argument("--max-examples", type=positive_int, default=None, help="stop after this many cases")
    ex.add_argument(
        "--property",
        action="append",
        dest="properties",
        metavar="NAME",
        help="property to run (repeatable; default all)",
    )
    ex.add_argument("--corpus", type=Path, default=Path("corpus"), help="corpus directory (default ./corpus)")
    ex.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="DIR",
        help="directory for the campaign's report: summary.json and a self-contained report.html "
        "(rewritten every minute while the campaign runs)",
    )
    ex.add_argument("--report-every", type=float, default=60.0, help=argparse.SUPPRESS)
    ex.add_argument(
        "--pools",
        type=positive_int,
        default=1,
        help="pools side by side, each in its own process with its own ranks (and GPUs with nccl), "
        "sharing the corpus and database; seeds are SEED, SEED+1, ... (default 1)",
    )
    ex.add_argument("--seed", type=int, default=None, help="campaign seed (default: random)")
    db = ex.add_mutually_exclusive_group()
    db.add_argument(
        "--database",
        type=Path,
        default=None,
        metavar="DIR",
        help="Hypothesis example database: failures are saved there and replayed first by the next campaign "
        "or pytest run (default $SHARDFUZZ_DATABASE or .shardfuzz/hypothesis-db; may be shared)",
    )
    db.add_argument("--no-database", action="store_true", help="neither replay nor save Hypothesis examples")
    _pool_args(ex)

    rp = sub.add_parser("replay", help="re-run one corpus entry: exit 1 if it still fails, 0 if not")
    rp.add_argument("entry", type=Path, help="a corpus entry (JSON); its case fixes the world size")
    _pool_args(rp, world_size=False)

    rr = sub.add_parser(
        "repro", help="write a standalone script (imports only torch) that reproduces one corpus entry under torchrun"
    )
    rr.add_argument("entry", type=Path, help="a corpus entry (JSON)")
    rr.add_argument(
        "-o", "--output", type=Path, default=None, metavar="FILE.py", help="where to write the script (default stdout)"
    )

    sub.add_parser("properties", help="list the property names")

    cp = sub.add_parser("corpus", help="list the corpus entries")
    cp.add_argument("--corpus", type=Path, default=Path("corpus"), help="corpus directory (default ./corpus)")

    be = sub.add_parser("bench", help="pool against spawn-per-case on the same cases; ends with 'speedup: <ratio>x'")
    be.add_argument("--cases", type=positive_int, default=100, help="cases through the pool (default 100)")
    be.add_argument("--spawn-cases", type=positive_int, default=5, help="cases through spawn-per-case (default 5)")
    be.add_argument("--seed", type=int, default=0)
    _pool_args(be)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGINT and SIGTERM unwind as Ctrl-C does, so the pool is closed and found failures are saved,
    # and the stop is recorded for loops that check it (fuzz.stop). A SIGINT that a shell left
    # ignored (a background job) stays ignored.
    from fuzz.stop import request_stop

    signal.signal(signal.SIGTERM, request_stop)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, request_stop)
    try:
        handler = {
            "explore": _explore,
            "replay": _replay,
            "repro": _repro,
            "properties": _properties,
            "corpus": _corpus,
            "bench": _bench,
        }
        return int(handler[args.command](args))
    except ShardfuzzError as e:
        print(f"python -m fuzz {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `python -m fuzz corpus | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _properties(args: argparse.Namespace) -> int:
    from fuzz.properties import all_properties

    for prop in all_properties():
        print(f"{prop.name:16} {prop.description}")
    return EXIT_OK


def _explore(args: argparse.Namespace) -> int:
    import random

    from fuzz.properties import all_properties, get_property

    props = [get_property(n) for n in args.properties] if args.properties else all_properties()
    too_small = [p.name for p in props if p.min_world_size > args.world_size]
    if too_small:
        raise ShardfuzzError(f"--world-size {args.world_size} is too small for {too_small}")
    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    launched = _torchrun_rank()
    if launched is not None:  # one campaign per process that torchrun starts (docs/campaigns.md)
        rank, _ = launched
        seed += 1000 * rank
        if args.report is not None:
            args.report = args.report / f"launcher-rank-{rank}"
    if args.pools > 1:
        from fuzz.campaign import run_pools

        return run_pools(args, seed, [p.name for p in props])
    return _explore_one(args, seed, props)


def _torchrun_rank() -> tuple[int, int] | None:
    """(RANK, WORLD_SIZE) when torchrun (or another torchelastic launcher) started this process."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or "RANK" not in os.environ:
        return None
    return int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", "1"))


def _explore_one(args: argparse.Namespace, seed: int, props: list[Any]) -> int:
    import time

    from fuzz.database import default_directory, example_database
    from fuzz.explore import explore
    from fuzz.pool import RankPool

    db_dir = None if args.no_database else (args.database if args.database is not None else default_directory())
    database = example_database(db_dir) if db_dir is not None else None
    tty = sys.stderr.isatty()
    last = {"line": 0.0, "report": time.monotonic()}

    def show(progress: Any) -> None:
        now = time.monotonic()
        if now - last["line"] >= (0.5 if tty else 10.0):
            last["line"] = now
            print(("\r\x1b[K" if tty else "") + progress.line(), end="" if tty else "\n", file=sys.stderr, flush=True)
        if args.report is not None and now - last["report"] >= args.report_every:
            last["report"] = now
            _write_report(args.report, progress.summary(seed=seed, backend=args.backend, world_size=args.world_size))

    print(
        f"explore: {[p.name for p in props]} for {args.budget:.0f}s on {args.world_size} ranks ({args.backend}), "
        f"seed {seed}, corpus {args.corpus}, database {db_dir if db_dir is not None else 'none'}",
        file=sys.stderr,
    )
    with RankPool(world_size=args.world_size, backend=args.backend, deadline=args.deadline) as pool:
        print(f"explore: ranks on {', '.join(pool.devices)}", file=sys.stderr)
        progress = explore(
            pool,
            props,
            budget=args.budget,
            max_examples=args.max_examples,
            seed=seed,
            corpus=args.corpus,
            on_case=show,
            database=database,
        )
    if tty:
        print(file=sys.stderr)
    print(progress.line(), file=sys.stderr)
    if progress.interrupted:
        print("explore: stopped early by a signal; what was found is saved", file=sys.stderr)
    for found in progress.found.values():
        where = f" -> {found.path}" if found.path else ""
        tag = "known" if found.known else (found.entry.status if found.entry else "unconfirmed")
        if found.known_as:
            tag = f"known (as {found.known_as})"
        if found.in_corpus:
            tag = f"in corpus ({tag})"
        repro = ""
        if found.entry and not found.known and not found.in_corpus:
            repro = (
                f", reproduced {found.entry.reproduced}/{found.entry.reruns}"
                if found.entry.reruns
                else ", not re-run: the campaign was stopped first"
            )
        print(
            f"{tag}: {found.failure.signature} x{found.hits} (size {found.case.size}{repro}): "
            f"{found.failure.summary}{where}",
            file=sys.stderr,
        )
    if args.report is not None:
        html = _write_report(args.report, progress.summary(seed=seed, backend=args.backend, world_size=args.world_size))
        print(f"explore: report {html}", file=sys.stderr)
    return EXIT_FAILED if progress.new_failures else EXIT_OK


def _write_report(directory: Path, summary: dict[str, Any]) -> Path:
    from fuzz.report import write_report

    try:
        _, html = write_report(directory, summary)
    except OSError as e:
        raise ShardfuzzError(f"--report {directory}: cannot write the report: {e.strerror or e}") from None
    return html


def _replay(args: argparse.Namespace) -> int:
    from fuzz.corpus import load_entry
    from fuzz.explore import run_case
    from fuzz.pool import RankPool
    from fuzz.properties import get_property

    entry = load_entry(args.entry)
    prop = get_property(entry.case.property)
    world_size = entry.case.world_size
    with RankPool(world_size=world_size, backend=args.backend, deadline=args.deadline) as pool:
        failure = run_case(pool, prop, entry.case)
    if failure is None:
        print(f"replay: {args.entry} passes now (was {entry.signature})")
        return EXIT_OK
    same = "same signature" if failure.signature == entry.signature else f"was {entry.signature}"
    print(f"replay: {args.entry} still fails: {failure.signature} ({same}): {failure.summary}")
    return EXIT_FAILED


def _repro(args: argparse.Namespace) -> int:
    from fuzz.corpus import load_entry
    from fuzz.repro import render_entry

    entry = load_entry(args.entry)
    script = render_entry(entry, source=str(args.entry))
    if args.output is None:
        sys.stdout.write(script)
        return EXIT_OK
    try:
        args.output.write_text(script)
    except OSError as e:
        raise ShardfuzzError(f"-o {args.output}: cannot write the script: {e.strerror or e}") from None
    print(
        f"repro: wrote {args.output}; run it with "
        f"torchrun --nproc-per-node {entry.case.world_size} {args.output} (exit 1 if the failure reproduces)",
        file=sys.stderr,
    )
    return EXIT_OK


def _corpus(args: argparse.Namespace) -> int:
    """The corpus as a table; unreadable entries are named on stderr (exit 2) after the rest."""
    from fuzz.corpus import load_corpus

    if not args.corpus.is_dir():
        what = "is not a directory" if args.corpus.exists() else "does not exist"
        raise ShardfuzzError(f"--corpus {args.corpus} {what}")
    entries, problems = load_corpus(args.corpus)
    rows = [(e.signature, e.case.property, str(e.case.size), e.status, str(e.count), path.name) for path, e in entries]
    header = ("signature", "property", "size", "status", "count", "file")  # size: (nodes, steps)
    widths = [max([len(header[i])] + [len(r[i]) for r in rows]) for i in range(len(header) - 1)]
    for row in (header, *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    if not entries and not problems:
        print(f"(no entries in {args.corpus})", file=sys.stderr)
    for problem in problems:
        print(f"python -m fuzz corpus: error: {problem}", file=sys.stderr)
    return EXIT_USAGE if problems else EXIT_OK


def _bench(args: argparse.Namespace) -> int:
    from fuzz.bench import bench

    bench(
        backend=args.backend,
        world_size=args.world_size,
        pool_cases=args.cases,
        spawn_cases=args.spawn_cases,
        seed=args.seed,
    )
    return EXIT_OK
