"""``python -m fuzz explore``: a campaign from its arguments (checked before anything runs),
in one pool or several, on a user's model where given; and the path checks the other commands
share (an unwritable --corpus, --report or -o is refused before any work)."""

from __future__ import annotations

import argparse
import errno
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fuzz.errors import ShardfuzzError
from fuzz.exitcodes import campaign_exit, no_cases_line


def explore_command(args: argparse.Namespace) -> int:
    from fuzz.properties import all_properties, get_property

    props = [get_property(n) for n in args.properties] if args.properties else all_properties()
    props = _with_model(args, props, explicit=bool(args.properties))
    too_small = [p.name for p in props if p.min_world_size > args.world_size]
    if too_small:
        raise ShardfuzzError(f"--world-size {args.world_size} is too small for {too_small}")
    if args.no_coverage_signal and not args.torch_coverage:
        raise ShardfuzzError("--no-coverage-signal goes with --torch-coverage")
    if args.torch_coverage:
        need_coverage_py("--torch-coverage")
    # Every path is checked before the campaign starts: a failure found after minutes of work
    # must not be lost to a path that could never be written.
    check_directory("--corpus", args.corpus)
    if args.report is not None:
        check_directory("--report", args.report)
    if not args.no_database:
        from fuzz.database import ENV_VAR, default_directory

        if args.database is not None:
            check_directory("--database", args.database)
        else:  # the default: $SHARDFUZZ_DATABASE where set
            check_directory(f"${ENV_VAR}" if os.environ.get(ENV_VAR) else "--database", default_directory())
    if args.fixes:
        _run_under_fixes(args.fixes)
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


def _with_model(args: argparse.Namespace, props: list[Any], *, explicit: bool) -> list[Any]:
    """The properties a campaign runs, given ``--model``: with it, the user-model properties
    drawn over that model (checked and described here, before any rank starts: a bad model is
    exit 2 naming what is wrong); without it, the suite's own (the user-model ones only where
    named, over the shipped example)."""
    import dataclasses
    import functools

    from fuzz.properties.user import NAMES

    if args.model is None:
        return props if explicit else [p for p in props if p.name not in NAMES]
    others = [p.name for p in props if p.name not in NAMES]
    if explicit and others:
        raise ShardfuzzError(f"--property {others[0]} does not take --model; a model runs {', '.join(NAMES)}")
    from fuzz.user_model import describe

    info = describe(args.model, "--model")
    chosen = props if explicit else [p for p in props if p.name in NAMES]
    return [dataclasses.replace(p, cases=functools.partial(p.cases, model=info)) for p in chosen]


def check_model_of(case: Any) -> None:
    """A case over a user's model: the model checked as explore checks it, before any rank starts."""
    spec = getattr(case.body, "model", None)
    if isinstance(spec, str):
        from fuzz.user_model import describe

        describe(spec, "the entry's model")


def _run_under_fixes(bug_ids: list[str]) -> None:
    """Set this process's environment (which its pools and ranks inherit) to run torch under the
    fixes of ``bug_ids`` (:func:`fuzz.patching.fix_env`); the fault file lives as long as the
    process."""
    import atexit
    import shutil
    import tempfile

    from fuzz.patching import fix_env

    directory = tempfile.mkdtemp(prefix="shardfuzz-fix-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    try:
        os.environ.update(fix_env(bug_ids, directory))
    except ShardfuzzError:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    print(f"explore: ranks run under the fixes of {', '.join(dict.fromkeys(bug_ids))}", file=sys.stderr)


def _torchrun_rank() -> tuple[int, int] | None:
    """(RANK, WORLD_SIZE) when torchrun (or another torchelastic launcher) started this process."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or "RANK" not in os.environ:
        return None
    return int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", "1"))


def _explore_one(args: argparse.Namespace, seed: int, props: list[Any]) -> int:
    from fuzz.database import default_directory, example_database
    from fuzz.explore import RERUNS, explore, grace, process_started
    from fuzz.pool import RankPool
    from fuzz.report import save_report
    from fuzz.status import StatusLine

    # The budget counts from this process's start (or its --pools parent's): README.md, "Budgets".
    started = args.started if args.started is not None else process_started()

    db_dir = None if args.no_database else (args.database if args.database is not None else default_directory())
    database = example_database(db_dir) if db_dir is not None else None
    status = StatusLine()
    last_report = time.monotonic()

    def show(progress: Any) -> None:
        nonlocal last_report
        status.show(progress.line)
        now = time.monotonic()
        if args.report is not None and now - last_report >= args.report_every:
            last_report = now
            save_report(args.report, progress.summary(seed=seed, backend=args.backend, world_size=args.world_size))

    # Where a failure goes when the corpus cannot take it (fuzz.explore.explore adds the temp dir).
    fallback = [args.report / "unsaved-corpus"] if args.report is not None else []
    torch_lines, env = None, None
    if args.torch_coverage:
        from fuzz.torch_coverage import ReachedLines, fresh_directory, rank_env

        coverage_dir = fresh_directory(args.report)
        torch_lines, env = ReachedLines([coverage_dir]), rank_env(coverage_dir)
        print(f"explore: torch coverage data in {coverage_dir}", file=sys.stderr)

    print(
        f"explore: {[p.name for p in props]} for {args.budget:.0f}s on {args.world_size} ranks ({args.backend}), "
        f"seed {seed}, corpus {args.corpus}, database {db_dir if db_dir is not None else 'none'}"
        + (f", only cases with a feature starting with {' or '.join(args.features)}" if args.features else ""),
        file=sys.stderr,
    )
    pool = RankPool(world_size=args.world_size, backend=args.backend, deadline=args.deadline, env=env)
    try:
        pool.start()
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
            fallback=fallback,
            on_note=status.note,
            started=started,
            torch_lines=torch_lines,
            line_signal=not args.no_coverage_signal,
            reruns=RERUNS if args.reruns is None else args.reruns,
            only=args.features,
        )
    finally:
        # Ending the ranks gets what the budget leaves of its teardown time (at least 2 s).
        left = started + args.budget + grace(args.budget) - time.monotonic()
        pool.close(timeout=min(10.0, max(2.0, left - 3.0)))
    status.end()
    print(progress.line(), file=sys.stderr)
    if progress.interrupted:
        print("explore: stopped early by a signal; what was found is saved", file=sys.stderr)
    for found in progress.found.values():
        where = f" -> {found.path}" if found.path else ""
        tag = "known" if found.known else (found.entry.status if found.entry else "unconfirmed")
        if found.known_as:
            tag = f"known (as {found.known_as})"
        if found.in_corpus and not found.known:
            tag = f"in corpus ({tag})"
        elif found.known and found.entry is not None and found.entry.upstream:
            tag = f"{tag}, upstream {found.entry.upstream}"
        repro = ""
        if found.entry and not found.known and not found.in_corpus:
            # what the campaign could not finish for it (its shrink, its re-runs) is said too
            done = [f"reproduced {found.entry.reproduced}/{found.entry.reruns}"] if found.entry.reruns else []
            repro = "".join(f", {part}" for part in done + found.unfinished)
        print(
            f"{tag}: {found.failure.signature} x{found.hits} (size {found.case.size}{repro}): "
            f"{found.failure.summary}{where}",
            file=sys.stderr,
        )
    if progress.corpus_fallback is not None:
        where = progress.corpus_fallback["directory"] or "nowhere"
        print(f"explore: {progress.corpus_fallback['reason']}; entries saved to {where}", file=sys.stderr)
    first_new = next((f for f in progress.new_failures if f.path is not None), None)
    if first_new is not None:
        from fuzz.report import next_commands

        print(f"explore: next: {'  or  '.join(next_commands(first_new.path or ''))}", file=sys.stderr)
    if torch_lines is not None:
        from fuzz.torch_coverage import one_line

        print(f"explore: {one_line(torch_lines)}", file=sys.stderr)
    if args.report is not None:
        html = save_report(args.report, progress.summary(seed=seed, backend=args.backend, world_size=args.world_size))
        print(f"explore: report {html}", file=sys.stderr)
    if progress.cases == 0 and not progress.interrupted:
        print(no_cases_line(args.budget), file=sys.stderr)
    return campaign_exit(new_failures=bool(progress.new_failures), cases=progress.cases, interrupted=progress.by_ctrl_c)


def check_directory(argument: str, path: Path) -> None:
    """Raise ShardfuzzError (exit 2), naming ``argument``, unless ``path`` is a directory this
    process can write files in, or one that can be created (missing parents included)."""
    try:
        if path.exists() and not path.is_dir():
            raise ShardfuzzError(f"{argument} {path}: exists and is not a directory")
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if existing != path and not existing.is_dir():
            raise ShardfuzzError(f"{argument} {path}: {existing} is not a directory")
    except OSError as e:
        raise ShardfuzzError(f"{argument} {path}: cannot be read: {e.strerror or e}") from None
    problem = _cannot_write_in(existing if str(existing) else Path("."))
    if problem is not None:
        where = "" if existing == path else f"cannot be created: {existing} is "
        raise ShardfuzzError(f"{argument} {path}: {where}not writable ({problem})")


def check_output_file(argument: str, path: Path) -> None:
    """Raise ShardfuzzError (exit 2), naming ``argument``, unless ``path`` can be written as a file."""
    parent = path.parent
    try:
        if path.is_dir():
            raise ShardfuzzError(f"{argument} {path}: is a directory; name a file")
        if not parent.exists():
            raise ShardfuzzError(f"{argument} {path}: directory {parent} does not exist")
        if not parent.is_dir():
            raise ShardfuzzError(f"{argument} {path}: {parent} is not a directory")
        if path.exists():
            os.close(os.open(path, os.O_WRONLY))  # opened, not truncated: the file stays as it is
            return
    except OSError as e:
        raise ShardfuzzError(f"{argument} {path}: not writable ({e.strerror or e})") from None
    problem = _cannot_write_in(parent)
    if problem is not None:
        raise ShardfuzzError(f"{argument} {path}: directory {parent} is not writable ({problem})")


def _cannot_write_in(directory: Path) -> str | None:
    """Why no file can be created in ``directory`` (None if one can). Found by creating and
    removing one: permission bits do not bind root, and a read-only filesystem does not show in them."""
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".shardfuzz-probe-")
    except OSError as e:
        return e.strerror or errno.errorcode.get(e.errno or 0, str(e))
    os.close(fd)
    os.unlink(probe)
    return None


def need_coverage_py(argument: str) -> None:
    try:
        import coverage  # noqa: F401
    except ImportError:
        raise ShardfuzzError(f"{argument} needs coverage.py, which is not installed: pip install coverage") from None
