"""Reading the files that processes write beside the driver (a rank's log and stacks, a zygote's
log): their size, what was added after an offset, their end. A file that is gone reads as empty."""

from __future__ import annotations

import os

#: Bytes of a process's output kept for a report (the end of its log).
TAIL_BYTES = 4000


def size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def tail(path: str, limit: int = TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``path``, decoded."""
    return read_from(path, max(0, size(path) - limit))
