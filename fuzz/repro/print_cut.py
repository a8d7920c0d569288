"""Two cuts of a printed round trip script (:mod:`fuzz.repro.print_parts`), made as it is printed,
never by running it:

- :func:`cut_main`: an exception's, hang's or crash's ``main`` ends with the phase of the round
  trip its failure happened in (the source's training, taking or saving its state, loading it
  into the target, both training on), read off the entry's tracebacks and stacks by the rank
  side's functions they pass through (:mod:`fuzz._rank.state_dict`, :mod:`fuzz._rank.dcp`): what
  would follow never ran. A mismatch's runs whole (its comparisons need every phase).
- :func:`prune`: the top-level definitions and imported names that nothing left names.

The script stored from it is still run under torchrun before it is kept (it must reproduce).
"""

from __future__ import annotations

import ast
import re
from typing import Any

#: The phases of a round trip, in the order it runs them; ``main`` marks where each starts with a
#: line holding only :func:`mark`.
PHASES = ("train", "save", "load", "resume")
#: The rank side's functions, by the phase they run in (a frame of none of them says nothing;
#: ``train_steps`` inside another is that one's: the training between async saves, or resuming).
_PHASE_OF = {
    "train_steps": "train",
    "_take": "save",
    "_save": "save",
    "_save_over": "save",
    "_save_in_flight": "save",
    "_saves_in_flight": "save",
    "_earlier_checkpoint": "save",
    "torch_save": "save",
    "_put": "load",
    "_load": "load",
    "load_with_absent": "load",
    "_finish_load": "load",
    "_finish_fsdp1_load": "load",
    "fsdp1_load_optimizer": "load",
    "resume_both": "resume",
    "resume_source": "resume",
}
#: A frame of the rank side's code, as tracebacks (``line N, in f``) and faulthandler (``line N in f``) write it.
_RANK_FRAME = re.compile(r'File "[^"]*/fuzz/_rank/\w+\.py", line \d+,? in (\w+)')
#: Each kind's failing ranks, by the status the pool gave them.
_FAILING = {"exception": "error", "crash": "dead", "hang": "stuck"}


def mark(phase: str) -> str:
    """The line of ``main`` before which ``phase`` starts."""
    return f"@{phase}"


def failed_phase(entry: Any) -> str | None:
    """The latest phase a failing rank of ``entry`` (an exception's raising, a crash's dead, a
    hang's stuck ranks) was in, or None where no frame says (and for a mismatch)."""
    if entry is None or entry.kind not in _FAILING or not isinstance(entry.details, dict):
        return None
    found = []
    for rank in entry.details.get("ranks", []):
        if rank.get("status") != _FAILING[entry.kind]:
            continue
        text = (rank.get("traceback") or "") + (rank.get("stack") or "")
        phases = [_PHASE_OF[f] for f in _RANK_FRAME.findall(text) if f in _PHASE_OF]
        if phases:
            found.append(max(phases, key=PHASES.index))
    return max(found, key=PHASES.index) if found else None


def cut_main(lines: list[str], entry: Any) -> tuple[list[str], bool]:
    """``main``'s lines up to the end of the phase ``entry`` failed in, without the marks; and
    whether anything was cut."""
    phase = failed_phase(entry)
    later = {mark(p) for p in PHASES[PHASES.index(phase) + 1 :]} if phase else set()
    out: list[str] = []
    for line in lines:
        if line in later:
            return out, True
        if not line.startswith("@"):
            out.append(line)
    return out, False


def _defined(part: str) -> set[str]:
    """The names a top-level part binds (``def f``, ``class C``, ``NAME = ...``)."""
    names: set[str] = set()
    for node in ast.parse(part).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _used(text: str) -> set[str]:
    """The names ``text`` reads (in f-strings too)."""
    return {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def prune(head: list[str], parts: list[str], kept: list[str]) -> tuple[list[str], list[str]]:
    """``head`` (import lines) and ``parts`` (top-level definitions) without the parts none of
    whose names the other parts or ``kept`` (``main``, the ``__main__`` block) read, and without
    the imported names nothing left reads."""
    parts = list(parts)
    while True:
        used = [_used(p) for p in parts]
        outside = _used("\n\n".join(kept))
        unused = [
            i
            for i, part in enumerate(parts)
            if (names := _defined(part)) and not names & outside.union(*(u for j, u in enumerate(used) if j != i))
        ]
        if not unused:
            break
        parts = [p for i, p in enumerate(parts) if i not in unused]
    reads = _used("\n\n".join([*parts, *kept]))
    lines = [line for h in head for line in h.splitlines()]
    return [line for line in (_used_import(line, reads) for line in lines) if line], parts


def _used_import(line: str, reads: set[str]) -> str:
    """``line`` with only the names in ``reads`` ('' where none)."""
    plain = re.fullmatch(r"import ([\w.]+)(?: as (\w+))?", line)
    if plain:
        return line if (plain.group(2) or plain.group(1).split(".")[0]) in reads else ""
    source, _, names = line.partition(" import ")
    used = [n for n in names.split(", ") if n.rpartition(" as ")[2] in reads]
    return f"{source} import {', '.join(used)}" if used else ""
