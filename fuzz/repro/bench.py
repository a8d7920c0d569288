"""Every entry of a corpus as a script: ``python -m fuzz repro --all DIR [--run]``.

Prints, per entry, whether it rendered and its script's code lines (neither blank nor
comments); with ``--run``, each script's exit status under ``torchrun --standalone
--nproc-per-node N`` and how long it took. Then the figures: entries rendered / total, code
lines median and max (also of the part written for the entry, without the carried modules),
with ``--run`` the exit statuses (1: reproduced), and the reduced scripts' code lines and
times to reduce (``--reduce`` reduces the entries that have no current reduced script). With
``--fixed``, each reduced script whose known bug has a fix written (:attr:`fuzz.known.KnownBug.fix`)
runs on torch with that fix, and passes if it exits 0 saying PASS: how many do, of how many
scripts and of how many known bugs. A benchmark, not a test: it prints and returns normally
unless the directory cannot be read.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fuzz import known
from fuzz.corpus import Entry, load_corpus
from fuzz.errors import ShardfuzzError
from fuzz.repro import render_entry
from fuzz.repro.harness import is_plain
from fuzz.repro.printed import is_printed
from fuzz.repro.script import code_lines, generated_lines

#: Seconds a script may run under --run before it counts as timed out.
RUN_TIMEOUT_S = 300


def run_script(script: Path, world_size: int, timeout: float = RUN_TIMEOUT_S) -> tuple[int | None, float]:
    """(torchrun's exit status or None on a timeout, seconds) of ``script``."""
    start = time.monotonic()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world_size)]
    try:
        done = subprocess.run(
            [*command, str(script)], cwd=script.parent, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - start
    return done.returncode, time.monotonic() - start


def run_fixed(script: str, entry: Entry, directory: Path) -> str | None:
    """How the reduced ``script`` of ``entry`` ran on torch with its known bug's fix (``passed``
    or what it did instead), or None where the bug has no fix written or it does not apply to
    this torch."""
    from fuzz.patching import patch_env
    from fuzz.repro import reduce

    bug = known.BUGS.get(entry.bug or "")
    env = patch_env(bug.fix, str(directory)) if bug is not None and bug.fix else None
    if env is None:
        return None
    status, output, seconds = reduce.run_script(script, timeout=RUN_TIMEOUT_S, env=env, nproc=entry.case.world_size)
    if status == 0 and reduce.passed(output):
        return "passed"
    said = [line for line in output.splitlines() if line.startswith(reduce.VERDICT_WORDS)] or output.splitlines()
    last = said[-1].strip()[:200] if said else "no output"
    return f"{'timed out' if status is None else f'exit {status}'} in {seconds:.1f} s: {last}"


def bench_all(
    corpus: Path,
    *,
    run: bool = False,
    reduce: bool = False,
    refresh: bool = False,
    again: bool = False,
    budget_s: float | None = None,
    fixed: bool = False,
    say: Callable[[str], None] = print,
) -> dict[str, object]:
    """Render (and run) every entry under ``corpus``; print and return the figures. The reduced
    scripts kept beside the entries (``NAME.repro.py``) that are current are counted too; with
    ``reduce``, every entry without one is reduced first (:mod:`fuzz.repro.reduce`), and with
    ``refresh`` also every entry whose script was reduced from older carried sources, and with
    ``again`` every kept script is reduced further (:func:`fuzz.repro.reduce.reduce_kept_again`).
    Unreadable entries are named as they are met and, once the rest is done, in the
    :class:`~fuzz.errors.ShardfuzzError` raised (``python -m fuzz repro --all`` exits 2, as
    ``python -m fuzz corpus`` does)."""
    from fuzz.repro.reduce import (
        DEFAULT_BUDGET_S,
        from_current_sources,
        header_fields,
        reduce_and_store,
        reduce_kept_again,
        stored_path,
        stored_script,
    )

    if not corpus.is_dir():
        raise ShardfuzzError(f"--all {corpus}: {'is not a directory' if corpus.exists() else 'does not exist'}")
    entries, problems = load_corpus(corpus)
    for problem in problems:
        say(f"unreadable: {problem}")
    total = len(entries) + len(problems)
    lines: list[int] = []
    generated: list[int] = []
    statuses: dict[str, int | None] = {}
    reduced_lines: list[int] = []
    reduce_seconds: list[float] = []
    stale_lines: list[int] = []
    stale_seconds: list[float] = []
    older_sources = 0
    printed_lines: list[int] = []  # scripts printed from the case (fuzz.repro.printed)
    plain_forms = 0  # exceptions' scripts in their plain form (fuzz.repro.harness.plain)
    with_fix: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="shardfuzz-repro-all-") as tmp:
        for path, entry in entries:
            try:
                script = render_entry(entry, source=str(path))
            except ShardfuzzError as e:
                say(f"{path.name}: refused: {e}")
                continue
            lines.append(code_lines(script))
            generated.append(generated_lines(script))
            row = f"{path.name}: {lines[-1]} code lines ({generated[-1]} written for the entry)"
            if run:
                file = Path(tmp) / f"{path.stem.replace('-', '_')}.py"
                file.write_text(script)
                status, seconds = run_script(file, entry.case.world_size)
                statuses[path.name] = status
                row += f", torchrun --nproc-per-node {entry.case.world_size}: " + (
                    f"exit {status}" if status is not None else "timed out"
                )
                row += f" in {seconds:.1f} s ({entry.status})"
            reduced = stored_script(path, entry, refresh=refresh)
            if reduced is not None and reduce and again:
                try:
                    reduced, result = reduce_kept_again(
                        path, entry, budget_s=DEFAULT_BUDGET_S if budget_s is None else budget_s
                    )
                    row += f"; reduced again: {result.lines_before} -> {code_lines(reduced)} code lines"
                except ShardfuzzError as e:
                    row += f"; not reduced again: {e}"
            if reduced is None and reduce:
                try:
                    reduced, _ = reduce_and_store(
                        path, entry, budget_s=DEFAULT_BUDGET_S if budget_s is None else budget_s, refresh=refresh
                    )
                except ShardfuzzError as e:
                    row += f"; not reduced: {e}"
            if reduced is None and refresh:
                reduced = stored_script(path, entry)  # a failed refresh leaves the current one
            kept = stored_path(path)
            if reduced is None and kept.exists():
                text = kept.read_text(encoding="utf-8", errors="replace")
                stale_lines.append(code_lines(text))
                took = header_fields(text).get("seconds")
                if took is not None:
                    stale_seconds.append(float(took))
                row += f"; kept reduced script is stale: {stale_lines[-1]} code lines"
            if reduced is not None and is_printed(reduced):
                printed_lines.append(code_lines(reduced))
                row += f"; printed from the case: {printed_lines[-1]} code lines"
            elif reduced is not None:
                if not from_current_sources(reduced, entry):
                    older_sources += 1
                    row += "; reduced from older carried sources"
                reduced_lines.append(code_lines(reduced))
                plain_forms += is_plain(reduced)
                took = header_fields(reduced).get("seconds")
                if took is not None:
                    reduce_seconds.append(float(took))
                row += f"; reduced: {reduced_lines[-1]} code lines" + (f" (reduced in {took} s)" if took else "")
            if reduced is not None and fixed:
                with tempfile.TemporaryDirectory(dir=tmp) as fix_dir:
                    ran = run_fixed(reduced, entry, Path(fix_dir))
                if ran is not None:
                    with_fix[path.name] = ran
                    row += f"; with its bug's fix: {ran}"
            say(row)
    figures: dict[str, object] = {
        "rendered": len(lines),
        "total": total,
        "printed": len(printed_lines),
        "reduced": len(reduced_lines),
    }
    say(f"rendered: {len(lines)}/{total}")
    if lines:
        figures.update(median_lines=statistics.median(lines), max_lines=max(lines))
        say(f"code lines: median {statistics.median(lines):g}, max {max(lines)}, min {min(lines)}")
        figures.update(median_generated=statistics.median(generated), max_generated=max(generated))
        say(
            f"written for the entry (the rest is carried modules): median {statistics.median(generated):g}, "
            f"max {max(generated)}"
        )
    say(f"printed from the case (NAME.repro.py): {len(printed_lines)}/{total}")
    if printed_lines:
        figures.update(median_printed_lines=statistics.median(printed_lines), max_printed_lines=max(printed_lines))
        say(
            f"printed scripts' code lines: median {statistics.median(printed_lines):g}, max {max(printed_lines)}, "
            f"min {min(printed_lines)}"
        )
    say(f"reduced (a current NAME.repro.py): {len(reduced_lines)}/{total}")
    if reduced_lines:
        figures.update(
            median_reduced_lines=statistics.median(reduced_lines),
            max_reduced_lines=max(reduced_lines),
            older_sources=older_sources,
            plain_forms=plain_forms,
        )
        say(
            f"reduced scripts' code lines: median {statistics.median(reduced_lines):g}, max {max(reduced_lines)}, "
            f"min {min(reduced_lines)}"
        )
        say(f"in the plain form (the exception left to propagate): {plain_forms} of the reduced exception scripts")
        say(
            f"reduced from older carried sources (still standalone; --reduce --refresh reduces them again): "
            f"{older_sources}/{len(reduced_lines)}"
        )
    if reduce_seconds:
        figures.update(median_reduce_s=statistics.median(reduce_seconds), max_reduce_s=max(reduce_seconds))
        say(
            f"time to reduce: median {statistics.median(reduce_seconds):.1f} s, max {max(reduce_seconds):.1f} s "
            f"({len(reduce_seconds)} entries)"
        )
    if stale_lines:
        figures.update(stale=len(stale_lines), median_stale_lines=statistics.median(stale_lines))
        say(
            f"kept but stale (the entry changed since): {len(stale_lines)}, code lines: "
            f"median {statistics.median(stale_lines):g}, max {max(stale_lines)}"
            + (
                f"; time to reduce: median {statistics.median(stale_seconds):.1f} s, max {max(stale_seconds):.1f} s"
                if stale_seconds
                else ""
            )
        )
    if fixed:
        bugs = {e.bug for _, e in entries if e.bug in known.BUGS}
        written = sorted(b for b in bugs if known.BUGS[b].fix)
        good = sum(ran == "passed" for ran in with_fix.values())
        figures.update(fixed_passed=good, fixed_run=len(with_fix), bugs_with_fix=len(written), bugs=len(bugs))
        say(
            f"with their bug's fix: {good}/{len(with_fix)} stored scripts pass (exit 0, PASS); "
            f"fixes written for {len(written)} of the {len(bugs)} known bugs with entries here"
        )
    if run:
        exits: dict[str, int] = {}
        for status in statuses.values():
            key = "timed out" if status is None else f"exit {status}"
            exits[key] = exits.get(key, 0) + 1
        figures["exits"] = exits
        say("torchrun: " + ", ".join(f"{k}: {v}" for k, v in sorted(exits.items())))
    if problems:  # as ``python -m fuzz corpus``: the rest done, then exit 2 naming them
        figures["unreadable"] = len(problems)
        raise ShardfuzzError(f"{len(problems)} of {total} entries unreadable: " + "; ".join(problems))
    return figures
