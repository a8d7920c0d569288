"""Every entry of a corpus as a script: ``python -m fuzz repro --all DIR [--run]``.

Prints, per entry, whether it rendered and its unreduced script's code lines (neither blank nor
comments); with ``--run``, each unreduced script's exit status under ``torchrun --standalone
--nproc-per-node N`` and how long it took. Then the figures: entries rendered / total, code
lines median and max (also of the part written for the entry, without the carried modules),
with ``--run`` the exit statuses (1: reproduced), and the stored scripts (:mod:`fuzz.repro.store`):
how many are printed from the case and how many are kept reduced ones, their code lines, and
the time storing a printed one took (``--reduce`` stores the printed script of every entry the
printers write whose stored one is not that). With ``--fixed``, each stored script whose known
bug has a fix written (:attr:`fuzz.known.KnownBug.fix`) runs on torch with that fix, and passes
if it exits 0 saying PASS: how many do, of how many scripts and of how many known bugs. A
benchmark, not a test: it prints and returns normally unless the directory cannot be read.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from fuzz import known
from fuzz.corpus import load_corpus
from fuzz.errors import ShardfuzzError
from fuzz.repro import render_entry
from fuzz.repro.printed import is_printed, printable
from fuzz.repro.script import code_lines, generated_lines
from fuzz.repro.store import header_fields, run_fixed, run_script, store_printed, stored_path, stored_script


def _spread(values: Sequence[float], unit: str = "") -> str:
    return f"median {statistics.median(values):g}{unit}, max {max(values):g}{unit}, min {min(values):g}{unit}"


def bench_all(
    corpus: Path,
    *,
    run: bool = False,
    reduce: bool = False,
    fixed: bool = False,
    say: Callable[[str], None] = print,
) -> dict[str, object]:
    """Render (and run) every entry under ``corpus``; print and return the figures. The scripts
    stored beside the entries (``NAME.repro.py``) that are current are counted too; with
    ``reduce``, the printed script of every entry the printers write is stored first where the
    stored one is not that (:func:`fuzz.repro.store.store_printed`). Unreadable entries are named
    as they are met and, once the rest is done, in the :class:`~fuzz.errors.ShardfuzzError`
    raised (``python -m fuzz repro --all`` exits 2, as ``python -m fuzz corpus`` does)."""
    if not corpus.is_dir():
        raise ShardfuzzError(f"--all {corpus}: {'is not a directory' if corpus.exists() else 'does not exist'}")
    entries, problems = load_corpus(corpus)
    for problem in problems:
        say(f"unreadable: {problem}")
    total = len(entries) + len(problems)
    lines: list[int] = []
    generated: list[int] = []
    statuses: dict[str, int | None] = {}
    printed_lines: list[int] = []  # stored scripts printed from the case (fuzz.repro.printed)
    store_seconds: list[float] = []
    reduced_lines: list[int] = []  # stored scripts kept from the reducer before printing
    stale_lines: list[int] = []
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
                status, _, seconds = run_script(script, nproc=entry.case.world_size)
                statuses[path.name] = status
                row += f", torchrun --nproc-per-node {entry.case.world_size}: " + (
                    f"exit {status}" if status is not None else "timed out"
                )
                row += f" in {seconds:.1f} s ({entry.status})"
            stored = stored_script(path, entry)
            if reduce and printable(entry):
                try:
                    stored = store_printed(path, entry)
                except ShardfuzzError as e:
                    row += f"; not stored: {e}"
            if stored is None and stored_path(path).exists():
                stale_lines.append(code_lines(stored_path(path).read_text(encoding="utf-8", errors="replace")))
                row += f"; stored script is stale: {stale_lines[-1]} code lines"
            elif stored is not None and is_printed(stored):
                printed_lines.append(code_lines(stored))
                took = header_fields(stored).get("seconds")
                if took is not None:
                    store_seconds.append(float(took))
                row += f"; printed from the case: {printed_lines[-1]} code lines" + (f" (in {took} s)" if took else "")
            elif stored is not None:
                reduced_lines.append(code_lines(stored))
                row += f"; kept reduced: {reduced_lines[-1]} code lines"
            if stored is not None and fixed:
                with tempfile.TemporaryDirectory(dir=tmp) as fix_dir:
                    ran = run_fixed(stored, entry, Path(fix_dir))
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
        say(f"code lines: {_spread(lines)}")
        figures.update(median_generated=statistics.median(generated), max_generated=max(generated))
        say(f"written for the entry (the rest is carried modules): {_spread(generated)}")
    say(f"printed from the case (NAME.repro.py): {len(printed_lines)}/{total}")
    if printed_lines:
        figures.update(median_printed_lines=statistics.median(printed_lines), max_printed_lines=max(printed_lines))
        say(f"printed scripts' code lines: {_spread(printed_lines)}")
    if store_seconds:
        figures.update(median_store_s=statistics.median(store_seconds), max_store_s=max(store_seconds))
        say(f"time to store a printed script: {_spread(store_seconds, ' s')} ({len(store_seconds)} entries)")
    say(f"kept reduced (a current NAME.repro.py the printers do not write): {len(reduced_lines)}/{total}")
    if reduced_lines:
        figures.update(median_reduced_lines=statistics.median(reduced_lines), max_reduced_lines=max(reduced_lines))
        say(f"kept reduced scripts' code lines: {_spread(reduced_lines)}")
    if stale_lines:
        figures.update(stale=len(stale_lines), median_stale_lines=statistics.median(stale_lines))
        say(f"stored but stale (the entry changed since): {len(stale_lines)}, code lines: {_spread(stale_lines)}")
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
