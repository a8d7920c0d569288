"""What ``python -m fuzz corpus`` prints: the corpus by entry, or by bug.

A maintainer's first question of a corpus is which torch bugs it holds and which of them have no
upstream issue yet; the view by bug answers it in one table (id, upstream or "none found",
entries, torch versions seen, title). On a terminal, tables fit its width: the last column (a
title, a file name) is cut, every other column is short; piped, nothing is cut.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from fuzz import known
from fuzz.corpus import Entry

#: What a new entry (no bug record, no upstream reference) shows in the upstream column.
NOT_TRIAGED = "not triaged"


def _upstream(entry: Entry) -> str:
    if entry.bug:
        return known.get(entry.bug).upstream
    return entry.upstream or (known.NONE_FOUND if entry.status == "known" else NOT_TRIAGED)


def _torch(entry: Entry) -> str:
    version = entry.versions.get("torch", "?")
    return version.split("+")[0]


def _width() -> int:
    return shutil.get_terminal_size((100, 24)).columns if sys.stdout.isatty() else 10**6


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> list[str]:
    """Left-aligned columns; the last one is cut so that each line fits ``width``."""
    widths = [max([len(header[i])] + [len(r[i]) for r in rows]) for i in range(len(header) - 1)]
    lines = []
    for row in (header, *rows):
        head = "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  "
        last = row[-1]
        room = max(12, width - len(head))
        lines.append(head + (last if len(last) <= room else last[: room - 3] + "..."))
    return lines


def by_entry(entries: Sequence[tuple[Path, Entry]], width: int | None = None) -> list[str]:
    """One line per entry: its file, status, size (nodes x steps), upstream state, and the bug
    record it stands for (or, for an entry no bug record names, its signature)."""
    rows = [
        (path.name, e.status, "{}x{}".format(*e.case.size), _upstream(e), e.bug or e.signature) for path, e in entries
    ]
    header = ("file", "status", "size", "upstream", "bug / signature")
    return _table(header, rows, width or _width())


def by_bug(entries: Sequence[tuple[Path, Entry]], width: int | None = None) -> list[str]:
    """One line per bug: the registry's record for entries that name one, else the entry's own
    upstream reference or signature; entries, torch versions seen, and the title."""
    groups: dict[str, list[Entry]] = {}
    for _, e in entries:
        groups.setdefault(e.bug or e.upstream or e.signature, []).append(e)
    rows = []
    for key, group in sorted(groups.items(), key=lambda kv: (_upstream(kv[1][0]) != known.NONE_FOUND, kv[0])):
        first = group[0]
        title = known.get(first.bug).title if first.bug else first.summary
        versions = ",".join(sorted({_torch(e) for e in group}))
        rows.append((key if first.bug else "-", _upstream(first), str(len(group)), versions, title))
    header = ("bug", "upstream", "entries", "torch", "title")
    return _table(header, rows, width or _width())


def bug_counts(entries: Sequence[tuple[Path, Entry]]) -> str:
    """One line: bugs, and how many of them have no upstream issue or pull request."""
    bugs = {e.bug or e.upstream or e.signature: _upstream(e) for _, e in entries}
    none = sum(1 for up in bugs.values() if up == known.NONE_FOUND)
    untriaged = sum(1 for up in bugs.values() if up == NOT_TRIAGED)
    return f"{len(entries)} entries, {len(bugs)} bugs: {none} with no upstream issue found, {untriaged} not triaged"
