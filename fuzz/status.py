"""The campaign's live status line on stderr, and fitting a line to a terminal's width."""

from __future__ import annotations

import math
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any


def fit_line(head: str, extras: Sequence[str], failures: Sequence[str], width: int | None) -> str:
    """``head`` (always kept), then ``extras`` (most important first), then the failures.

    Without ``width``, all of it. Within ``width`` columns, what is least important goes first:
    the list of failure signatures is cut (their number stays), then the extras from the last,
    and at last the line itself.
    """
    listed = "failures: " + (", ".join(failures) or "none")
    line = " ".join([head, *extras, listed])
    if width is None or len(line) <= width:
        return line
    count = f"failures: {len(failures)}" if failures else "failures: none"
    for keep in range(len(extras), -1, -1):
        short = " ".join([head, *extras[:keep], count])
        if len(short) <= width:
            room = width - len(short) - 3  # " (" and ")"
            if failures and room >= 8:
                short += f" ({clip(', '.join(failures), room)})"
            return short
    return clip(" ".join([head, count]), width)


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 3, 0)] + "..."[: max(width, 0)]


class StatusLine:
    """The live progress line on stderr.

    On a terminal it is redrawn in place (carriage return, erase line) at most every
    ``every_tty`` seconds and fitted to the terminal's width less one column, so it never wraps
    (a wrapped line is not erased by the next redraw, and copies would stack up). Elsewhere (a
    log file, CI) the whole line is printed as a plain line at most every ``every_plain``
    seconds. :meth:`note` prints a message on a line of its own without breaking the redraw.
    """

    def __init__(
        self, stream: Any = None, *, tty: bool | None = None, every_tty: float = 0.5, every_plain: float = 10.0
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every = every_tty if self.tty else every_plain
        self.last = -math.inf
        self.drawn = False

    def width(self) -> int:
        return max(shutil.get_terminal_size().columns - 1, 20)

    def show(self, make: Callable[[int | None], str], *, force: bool = False) -> bool:
        """Draw ``make(width)`` (``width`` None off a terminal) if it is time; returns whether it drew."""
        now = time.monotonic()
        if not force and now - self.last < self.every:
            return False
        self.last = now
        if self.tty:
            self.stream.write("\r\x1b[K" + make(self.width()))
            self.drawn = True
        else:
            self.stream.write(make(None) + "\n")
        self.stream.flush()
        return True

    def note(self, message: str) -> None:
        """``message`` on its own line; the status line is redrawn by the next :meth:`show`."""
        self.stream.write(("\r\x1b[K" if self.drawn else "") + message + "\n")
        self.stream.flush()
        self.drawn = False
        self.last = -math.inf

    def end(self) -> None:
        """Leave the line that was redrawn in place, so that what follows starts on a fresh one."""
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
        self.drawn = False


def clock(seconds: float) -> str:
    if math.isinf(seconds):
        return "inf"
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
