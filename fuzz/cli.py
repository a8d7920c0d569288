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
import tempfile
from pathlib import Path
from typing import Any, NoReturn

from fuzz.cli_explore import check_directory, check_model_of, check_output_file, explore_command, need_coverage_py
from fuzz.errors import ShardfuzzError
from fuzz.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from fuzz.stop import request_stop, stop_signal

# Imported where they are used, not here: fuzz.properties, fuzz.explore, fuzz.database, fuzz.bench
# import Hypothesis (~0.3 s), fuzz.corpus and fuzz.repro the case model, fuzz.campaign and
# fuzz.report the coverage checklist; an argument error or `--help` needs none of them.
# None of them imports this module.


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


def _int_at_least(text: str, floor: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < floor:
        raise argparse.ArgumentTypeError(f"{value} must be at least {floor}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


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
    # A pool of --pools K: the time.monotonic() its parent started at, which its budget counts from.
    ex.add_argument("--started", type=float, default=None, help=argparse.SUPPRESS)
    ex.add_argument(
        "--pools",
        type=positive_int,
        default=1,
        help="pools side by side, each in its own process with its own ranks (and GPUs with nccl), "
        "sharing the corpus and database; seeds are SEED, SEED+1, ... (default 1)",
    )
    ex.add_argument("--seed", type=int, default=None, help="campaign seed (default: random)")
    ex.add_argument(
        "--model",
        default=None,
        metavar="FILE.py:NAME",
        help="fuzz your own model: FILE.py:NAME or module.path:NAME, NAME a zero-argument callable returning "
        "(model, batch_fn, loss_fn); runs the user_parity and user_state properties over it (docs/user_models.md)",
    )
    ex.add_argument(
        "--feature",
        action="append",
        dest="features",
        default=[],
        metavar="PREFIX",
        help="run only cases with a feature (as the report's feature table names them) that starts with PREFIX, "
        "e.g. knob: or writer:thread_count (repeatable: any of them); a soak of one path, best with --property",
    )
    ex.add_argument(
        "--fix",
        action="append",
        dest="fixes",
        default=[],
        metavar="BUG",
        help="run the ranks under the written fix of known bug BUG (fuzz/fixes/BUG.json, applied as torch is "
        "imported; repeatable): the bug is then absent, its path is drawn as often as any other, and a failure "
        "its corpus entry would take is reported as new; best with --feature and a copy of the corpus",
    )
    ex.add_argument(
        "--reruns",
        type=non_negative_int,
        default=None,
        metavar="N",
        # the default is fuzz.explore.RERUNS (not imported here: --help stays fast; a test checks it)
        help="re-run each new failure N times before it is saved, to tell a reproducible failure from a "
        "flaky one (default 3; 0 saves it unconfirmed)",
    )
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
    ex.add_argument(
        "--torch-coverage",
        action="store_true",
        help="measure the lines of torch's distributed packages that the ranks run (coverage.py; data in "
        "REPORT/torch-coverage, else a temporary directory; figures in the report) and give more time to the "
        "properties still reaching new ones",
    )
    ex.add_argument(
        "--no-coverage-signal",
        action="store_true",
        help="with --torch-coverage: measure only; the scheduler does not follow new torch lines",
    )
    _pool_args(ex)

    rp = sub.add_parser("replay", help="re-run one corpus entry: exit 1 if it still fails, 0 if not")
    rp.add_argument("entry", type=Path, help="a corpus entry (JSON); its case fixes the world size")
    _pool_args(rp, world_size=False)

    rr = sub.add_parser(
        "repro", help="write a standalone script (imports only torch) that reproduces one corpus entry under torchrun"
    )
    rr.add_argument("entry", type=Path, nargs="?", help="a corpus entry (JSON)")
    rr.add_argument(
        "-o", "--output", type=Path, default=None, metavar="FILE", help="where to write the script (default stdout)"
    )
    rr.add_argument(
        "--issue",
        action="store_true",
        help="write Markdown for an upstream issue: title, versions, observed and expected, command, script, upstream",
    )
    rr.add_argument(
        "--full",
        action="store_true",
        help="the unreduced script (every carried module), even where one is stored beside the entry or printed",
    )
    rr.add_argument(
        "--all",
        type=Path,
        default=None,
        metavar="DIR",
        help="render every entry of a corpus directory and print the figures (rendered, code lines, stored scripts "
        "printed and kept reduced, time to store); exits 2 naming unreadable entries after the rest",
    )
    rr.add_argument(
        "--run", action="store_true", help="with --all: run each script under torchrun, print exit statuses"
    )
    rr.add_argument(
        "--fixed",
        action="store_true",
        help="with --all: run each stored script whose known bug has a fix written on torch with that fix "
        "(it must exit 0 and say PASS), print how many do",
    )
    rr.add_argument(
        "--reduce",
        action="store_true",
        help="store the script printed from the case beside the entry as NAME.repro.py, once it reproduces under "
        "torchrun here (and passes with its bug's fix where one is written); exit 2 naming what the printers do "
        "not write yet where they cannot print the entry. With --all: every entry the printers write",
    )

    sub.add_parser("properties", help="list the property names")

    cp = sub.add_parser("corpus", help="list the corpus entries")
    cp.add_argument("--corpus", type=Path, default=Path("corpus"), help="corpus directory (default ./corpus)")
    cp.add_argument(
        "--by-bug",
        action="store_true",
        help="one line per torch bug: id, upstream issue or 'none found', entries, torch versions seen, title",
    )

    cv = sub.add_parser(
        "coverage", help="what the suite draws of torch's API surface (--api), or which lines of torch it ran (--torch)"
    )
    cv.add_argument(
        "--api",
        action="store_true",
        help="the API-surface table, read from the installed torch: each item drawn (with its count) or why not",
    )
    cv.add_argument(
        "--checklist",
        nargs="?",
        const="",
        default=None,
        metavar="AREA",
        help="the feature checklist (fuzz.coverage) with each item's count per property, from --report's "
        "summary.json; only AREA's items (e.g. models) where given",
    )
    cv.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="DIR",
        help="a campaign's report directory: counts from its summary.json",
    )
    cv.add_argument(
        "--torch",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="the lines of torch's distributed packages reached, per module, with the functions never reached: "
        "from the data of a campaign run with --torch-coverage (DIR: its REPORT/torch-coverage, or REPORT), or, "
        "with --corpus, from replaying every corpus entry (data kept in DIR where given)",
    )
    cv.add_argument(
        "--corpus",
        type=Path,
        default=None,
        metavar="DIR",
        help="with --torch: replay every entry of this corpus directory on pools that measure torch coverage",
    )
    _pool_args(cv, world_size=False)

    be = sub.add_parser("bench", help="pool against spawn-per-case on the same cases; ends with 'speedup: <ratio>x'")
    be.add_argument(
        "--cases",
        type=positive_int,
        default=None,
        help="cases through the pool (default 100); with --torch-coverage: per property (default 30)",
    )
    be.add_argument("--spawn-cases", type=positive_int, default=5, help="cases through spawn-per-case (default 5)")
    be.add_argument("--seed", type=int, default=0)
    be.add_argument(
        "--hang",
        action="store_true",
        help="instead: the hang cost of planted deadlocks (seconds from a deadlock's start to its result), "
        "at 2 and 4 ranks unless --world-size is given",
    )
    be.add_argument(
        "--runs",
        type=positive_int,
        default=1,
        help="with --hang: deadlocks per plant and world size; with --torch-coverage: passes (off, then on)",
    )
    be.add_argument(
        "--torch-coverage",
        action="store_true",
        help="instead: seconds per case of every property without and with torch coverage, and cases per minute",
    )
    be.add_argument(
        "--startup",
        action="store_true",
        help="instead: seconds from `python -m fuzz explore`'s start to its first case, cold (no .pyc, as in a "
        "fresh virtual environment) and warm; --runs of each (default 1)",
    )
    be.add_argument(
        "--faults",
        type=Path,
        default=None,
        metavar="DIR",
        help="instead: a campaign under each injected fault of DIR (tests/faults, ../shared/mutants) and the "
        "seconds to its first new failure",
    )
    be.add_argument("--fault", action="append", default=None, metavar="NAME", help="with --faults: only these")
    be.add_argument("--budget", type=duration, default=120.0, help="with --faults: seconds per fault (default 120)")
    _pool_args(be, world_size=False)
    be.add_argument("--world-size", type=positive_int, default=None, help="number of ranks (default 2)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGINT and SIGTERM unwind as Ctrl-C does, so the pool is closed and found failures are saved,
    # and the stop is recorded for loops that check it (fuzz.stop). A SIGINT that a shell left
    # ignored (a background job) stays ignored.
    signal.signal(signal.SIGTERM, request_stop)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, request_stop)
    try:
        handler = {
            "explore": explore_command,
            "replay": _replay,
            "repro": _repro,
            "properties": _properties,
            "corpus": _corpus,
            "coverage": _coverage,
            "bench": _bench,
        }
        return int(handler[args.command](args))
    except ShardfuzzError as e:
        print(f"python -m fuzz {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM outside a campaign (which saves what it found and returns): the pools
        # are closed on the way out, and a stored script is written only once it is confirmed
        # (written whole, as corpus entries are), so a stop loses only the work in progress.
        signum = stop_signal() or signal.SIGINT
        print(f"python -m fuzz {args.command}: stopped by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum
    except BrokenPipeError:  # `python -m fuzz corpus | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _properties(args: argparse.Namespace) -> int:
    from fuzz.properties import all_properties

    for prop in all_properties():
        print(f"{prop.name:16} {prop.description}")
    return EXIT_OK


def _replay(args: argparse.Namespace) -> int:
    from fuzz.corpus import load_entry
    from fuzz.explore import run_case
    from fuzz.pool import RankPool
    from fuzz.properties import get_property

    entry = load_entry(args.entry)
    prop = get_property(entry.case.property)
    check_model_of(entry.case)
    world_size = entry.case.world_size
    with RankPool(world_size=world_size, backend=args.backend, deadline=args.deadline) as pool:
        failure = run_case(pool, prop, entry.case)
    if failure is None:
        print(f"replay: {args.entry} passes now (was {entry.signature})")
        return EXIT_OK
    same = "same signature" if failure.signature == entry.signature else f"was {entry.signature}"
    print(f"replay: {args.entry} still fails: {failure.signature} ({same}): {_full_summary(failure)}")
    if entry.status == "known":
        from fuzz.report import upstream_url

        url = upstream_url(entry.upstream)
        upstream = f"upstream {entry.upstream}" + (f" ({url})" if url and url != entry.upstream else "")
        print(f"replay: a known torch bug, {upstream if entry.upstream else 'no upstream issue'}: {entry.summary}")
    return EXIT_FAILED


def _full_summary(failure: Any) -> str:
    """The failure's summary, with an exception's message in full where the summary cut it
    (fuzz.signature keeps the first 300 characters, for signatures and tables), and at most
    2000 characters, cut at a word boundary."""
    from fuzz.report import shorten

    summary = str(failure.summary)
    ranks = failure.details.get("ranks") if isinstance(failure.details, dict) else None
    if failure.kind == "exception" and isinstance(ranks, list):
        first = next((r for r in ranks if isinstance(r, dict) and r.get("exc_type")), None)
        if first is not None and first.get("message"):
            summary = f"rank {first.get('rank')} raised {first['exc_type']}: {first['message']}"
    return shorten(" ".join(summary.split()), 2000)


def _repro(args: argparse.Namespace) -> int:
    from fuzz.corpus import load_entry
    from fuzz.repro import render_entry

    if args.all is not None:
        if args.entry is not None or args.output is not None or args.issue or args.full:
            raise ShardfuzzError("--all DIR takes no ENTRY, -o, --issue or --full")
        from fuzz.repro.bench import bench_all

        bench_all(args.all, run=args.run, reduce=args.reduce, fixed=args.fixed)
        return EXIT_OK
    if args.entry is None:
        raise ShardfuzzError("name a corpus entry (ENTRY.json), or a corpus directory with --all DIR")
    if args.run or args.fixed:
        raise ShardfuzzError(f"{'--run' if args.run else '--fixed'} goes with --all DIR")
    if args.full and args.reduce:
        raise ShardfuzzError("--full and --reduce exclude each other: --full writes the unreduced script")
    entry = load_entry(args.entry)
    if args.output is not None:
        check_output_file("-o", args.output)
    from fuzz.repro.printed import is_printed, print_entry, printable
    from fuzz.repro.script import code_lines
    from fuzz.repro.store import header_fields, store_printed, stored_script

    if args.reduce:
        say = (lambda line: print(line, file=sys.stderr)) if args.output is not None else (lambda _: None)
        script = store_printed(args.entry, entry, say=say)  # NotPrintable names what is not printed yet
    else:
        # The script stored beside the entry is what a reader wants, else the one printed from the
        # case; the unreduced one (every carried module) where neither is, or with --full.
        kept = None if args.full else stored_script(args.entry, entry)
        if kept is None and not args.full and printable(entry):
            kept = print_entry(entry)
        script = kept if kept is not None else render_entry(entry, source=str(args.entry))
    which = "printed from the case" if is_printed(script) else "unreduced"
    if header_fields(script):  # a script stored beside the entry
        which = ("printed from the case" if is_printed(script) else "reduced") + ", kept beside the entry"
    which = f"{which}; {code_lines(script)} code lines"
    if args.issue:
        from fuzz.repro.issue import render_issue

        script = render_issue(entry, script, source=str(args.entry))
        which = f"its script {which}"
    if args.output is None:
        sys.stdout.write(script)
        return EXIT_OK
    try:
        args.output.write_text(script)
    except OSError as e:
        raise ShardfuzzError(
            f"-o {args.output}: cannot write the {'issue' if args.issue else 'script'}: {e.strerror or e}"
        ) from None
    run = f"torchrun --nproc-per-node {entry.case.world_size} {'repro.py' if args.issue else args.output}"
    print(
        f"repro: wrote {args.output} ({which}); run "
        f"{'its script' if args.issue else 'it'} with {run} (exit 1 if the failure reproduces)",
        file=sys.stderr,
    )
    return EXIT_OK


def _corpus(args: argparse.Namespace) -> int:
    """The corpus as a table; unreadable entries are named on stderr (exit 2) after the rest."""
    from fuzz.corpus import load_corpus

    if not args.corpus.is_dir():
        what = "is not a directory" if args.corpus.exists() else "does not exist"
        raise ShardfuzzError(f"--corpus {args.corpus} {what}")
    from fuzz.corpus_view import bug_counts, by_bug, by_entry

    entries, problems = load_corpus(args.corpus)
    if entries:
        print("\n".join((by_bug if args.by_bug else by_entry)(entries)))
        print(bug_counts(entries))
    elif not problems:
        print(f"(no entries in {args.corpus})", file=sys.stderr)
    for problem in problems:
        print(f"python -m fuzz corpus: error: {problem}", file=sys.stderr)
    return EXIT_USAGE if problems else EXIT_OK


def _coverage(args: argparse.Namespace) -> int:
    """The API-surface table (fuzz.api_surface), with the counts of a campaign's summary.json;
    or the torch lines reached (fuzz.torch_coverage), from a campaign's data or a corpus."""
    import json

    if args.api and args.torch is not None:
        raise ShardfuzzError("--api and --torch measure different things; name one")
    if args.checklist is not None:
        return _coverage_checklist(args)
    if args.torch is not None:
        return _coverage_torch(args)
    if args.corpus is not None:
        raise ShardfuzzError("--corpus goes with --torch")
    if not args.api:
        raise ShardfuzzError(
            "name what to measure: --api (the API surface of the installed torch) or --torch DIR "
            "(the torch lines a campaign reached)"
        )
    from fuzz.api_surface import api_coverage, format_table

    features = None
    if args.report is not None:
        path = args.report / "summary.json"
        try:
            summary = json.loads(path.read_text())
        except OSError as e:
            raise ShardfuzzError(f"--report {args.report}: cannot read {path}: {e.strerror or e}") from None
        except ValueError as e:
            raise ShardfuzzError(f"--report {args.report}: {path} is not JSON: {e}") from None
        raw = summary.get("features") if isinstance(summary, dict) else None
        features = raw if isinstance(raw, dict) else {}
    sys.stdout.write(format_table(api_coverage(features)))
    return EXIT_OK


def _coverage_checklist(args: argparse.Namespace) -> int:
    """The checklist's rows (of one area where given) with their counts per property."""
    import json

    from fuzz.coverage import AREAS, coverage_per_property, format_per_property

    area = args.checklist or None
    if area is not None and area not in AREAS:
        raise ShardfuzzError(f"--checklist {area}: not an area of the checklist ({', '.join(AREAS)})")
    if args.report is None:
        raise ShardfuzzError("--checklist reads a campaign's counts: give --report DIR")
    path = args.report / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except OSError as e:
        raise ShardfuzzError(f"--report {args.report}: cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ShardfuzzError(f"--report {args.report}: {path} is not JSON: {e}") from None
    per = summary.get("features_per_property") if isinstance(summary, dict) else None
    sys.stdout.write(format_per_property(coverage_per_property(per if isinstance(per, dict) else {}, area)))
    return EXIT_OK


def _coverage_torch(args: argparse.Namespace) -> int:
    from fuzz.torch_coverage import format_table, load, torch_summary

    if args.report is not None:
        raise ShardfuzzError("--report goes with --api; name a campaign's coverage data with --torch DIR")
    need_coverage_py("--torch")
    directory = Path(args.torch) if args.torch else None
    if args.corpus is None:
        if directory is None:
            raise ShardfuzzError(
                "--torch needs a directory of coverage data (a campaign's REPORT/torch-coverage), "
                "or --corpus DIR to measure a corpus"
            )
        lines = load(directory)
    else:
        lines = _measure_corpus(args, directory)
    sys.stdout.write(format_table(torch_summary(lines)))
    return EXIT_OK


def _measure_corpus(args: argparse.Namespace, directory: Path | None) -> Any:
    """Replay every entry of ``args.corpus`` on pools whose ranks measure torch coverage (one pool
    per world size); the data goes to ``directory`` (kept) or a temporary one (removed)."""
    import shutil

    from fuzz.corpus import load_corpus
    from fuzz.pool import RankPool
    from fuzz.properties import get_property
    from fuzz.torch_coverage import ReachedLines, rank_env

    if not args.corpus.is_dir():
        what = "is not a directory" if args.corpus.exists() else "does not exist"
        raise ShardfuzzError(f"--corpus {args.corpus} {what}")
    entries, problems = load_corpus(args.corpus)
    for problem in problems:
        print(f"python -m fuzz coverage: skipped: {problem}", file=sys.stderr)
    if not entries:
        raise ShardfuzzError(f"--corpus {args.corpus}: no entry to replay")
    if directory is not None:
        check_directory("--torch", directory)
        directory.mkdir(parents=True, exist_ok=True)
    data = directory if directory is not None else Path(tempfile.mkdtemp(prefix="shardfuzz-torch-coverage-"))
    try:
        by_size: dict[int, list[Any]] = {}
        for _, entry in entries:
            by_size.setdefault(entry.case.world_size, []).append(entry)
        done = 0
        for world_size, group in sorted(by_size.items()):
            with RankPool(
                world_size=world_size, backend=args.backend, deadline=args.deadline, env=rank_env(data)
            ) as pool:
                for entry in group:
                    prop = get_property(entry.case.property)
                    failure = prop.judge(entry.case, pool.run(entry.case, stall=prop.stall))
                    done += 1
                    verdict = "passes" if failure is None else f"fails: {failure.signature}"
                    print(f"coverage: [{done}/{len(entries)}] {entry.signature}: {verdict}", file=sys.stderr)
        lines = ReachedLines([data])
        lines.update()
        return lines
    finally:
        if directory is None:
            shutil.rmtree(data, ignore_errors=True)


def _bench(args: argparse.Namespace) -> int:
    from fuzz.bench import bench, bench_hang

    if args.faults is not None:
        from fuzz.bench import bench_faults

        bench_faults(
            str(args.faults), budget=args.budget, seed=args.seed, world_size=args.world_size or 2, names=args.fault
        )
        return EXIT_OK
    if args.torch_coverage:
        from fuzz.bench import bench_torch_coverage

        need_coverage_py("--torch-coverage")
        bench_torch_coverage(
            backend=args.backend,
            world_size=args.world_size or 2,
            cases=args.cases or 30,
            passes=args.runs,
            seed=args.seed,
        )
        return EXIT_OK
    if args.startup:
        from fuzz.bench import bench_startup

        bench_startup(backend=args.backend, world_size=args.world_size or 2, runs=args.runs)
        return EXIT_OK
    if args.hang:
        sizes = (args.world_size,) if args.world_size is not None else (2, 4)
        bench_hang(backend=args.backend, world_sizes=sizes, runs=args.runs, deadline=args.deadline)
        return EXIT_OK
    bench(
        backend=args.backend,
        world_size=args.world_size or 2,
        pool_cases=args.cases or 100,
        spawn_cases=args.spawn_cases,
        seed=args.seed,
    )
    return EXIT_OK
