"""Verdict types: what a case did on every rank (:class:`Outcome`), and a deadlock seen in the
ranks' stacks before the deadline (:class:`Stall`, named by a property; :class:`HangWatch`, the
generic rule).

The pool produces these, the judges read them; neither side needs the other to do so. Imports
only the standard library.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


class OutcomeKind(str, enum.Enum):
    OK = "ok"
    EXCEPTION = "exception"
    HANG = "hang"
    CRASH = "crash"


@dataclass(frozen=True)
class RankReport:
    """What one rank did in one case."""

    rank: int
    observation: dict[str, Any] | None = None
    exc_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    #: Python stacks of every thread, when the rank was stuck or died on a fatal signal.
    stack: str | None = None
    #: Exit status when the rank died (negative: killed by that signal).
    exit_status: int | None = None
    output_tail: str | None = None
    seconds: float | None = None
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def status(self) -> str:
        if self.exit_status is not None:
            return "dead"
        if self.exc_type is not None:
            return "error"
        if self.observation is not None:
            return "ok"
        return "stuck"


@dataclass(frozen=True)
class Stall:
    """A deadlock that the ranks' stacks show before the case's deadline does.

    A rank still in a case after a few seconds samples its main thread's stack every second
    (fuzz/_rank/worker.py). From ``after`` seconds into the case the driver passes the latest
    samples to ``deadlocked``, one string per rank ("" for a rank that has finished the case or
    not been sampled yet); once it has said True for ``hold`` seconds without a break, the case
    ends as a hang (:attr:`Outcome.stalled` is ``name``), the ranks' stacks taken as at a deadline.
    """

    name: str
    deadlocked: Callable[[list[str]], bool]
    after: float = 10.0
    hold: float = 3.0


#: The name an :class:`Outcome` carries when :class:`HangWatch` ended the case.
WAITING_HANG = "every rank still in the case waits in a blocking call, its stack unchanged"

# A frame of a sampled stack (traceback.format_stack: outermost first), with its source line.
_SAMPLED_FRAME = re.compile(r'File "([^"]+)", line \d+, in ([^\n]+)\n(?:[ \t]+(?!File ")([^\n]*))?')
#: Files of torch.distributed whose every function is a collective, a barrier, a point-to-point
#: call or the logging wrapper around them.
_COLLECTIVE_FILES = ("/torch/distributed/distributed_c10d.py", "/torch/distributed/c10d_logger.py")
#: Source lines of torch.distributed that block in C++: a Work's or future's wait, a functional
#: collective's wait_tensor, a barrier, a store's get or wait.
_BLOCKING_LINE = re.compile(r"\.wait\(|\bwait_tensor\(|\bbarrier\(|store\w*\.(?:get|multi_get|wait)\(")


def blocking_call(stack: str) -> str | None:
    """Where a sampled main-thread stack waits, if its innermost frame is a blocking call of
    torch.distributed (``torch/distributed/distributed_c10d.py:all_reduce``), else None.

    A blocking call is a function of ``distributed_c10d.py`` (collectives, barriers, send and
    recv) or a line of ``torch/distributed/`` that waits: ``Work.wait``, a future's ``wait``,
    ``wait_tensor``, ``barrier``, a store's ``get`` or ``wait``. The innermost Python frame is
    the one that called into C++, where the wait happens."""
    frames = _SAMPLED_FRAME.findall(stack)
    if not frames:
        return None
    path, function, line = frames[-1]
    path = path.replace("\\", "/")
    at = path.rfind("/torch/distributed/")
    if at < 0:
        return None
    where = f"{path[at + 1 :]}:{function.strip()}"
    if path.endswith(_COLLECTIVE_FILES) or _BLOCKING_LINE.search(line):
        return where
    return None


class HangWatch:
    """The generic hang rule, fed the ranks' stack samples as the pool looks at them.

    :meth:`look` says True once every rank still in the case (a non-empty sample; "" stands for
    a rank that has finished the case or has not been sampled yet) has waited in a
    :func:`blocking_call` with its sampled stack unchanged for ``hold`` seconds. A rank that
    moves (another stack, a line further on) starts its wait again, so a slow case that makes
    progress is never a hang; a rank outside a blocking call (computing, sleeping, importing)
    keeps the rule from holding. A rank not sampled yet counts as outside: the rule needs every
    rank still in the case seen waiting.
    """

    def __init__(self, hold: float) -> None:
        self.hold = hold
        self._since: dict[int, tuple[str, float]] = {}

    def look(self, samples: Sequence[str | None], now: float) -> bool:
        """``samples``: one per rank, None for a rank no longer in the case (finished, or dead),
        "" for one not sampled yet."""
        waiting = True
        present = False
        for rank, stack in enumerate(samples):
            if stack is None:
                self._since.pop(rank, None)
                continue
            present = True
            if not stack or blocking_call(stack) is None:
                self._since.pop(rank, None)
                waiting = False
                continue
            seen = self._since.get(rank)
            if seen is None or seen[0] != stack:
                self._since[rank] = (stack, now)
                waiting = waiting and self.hold <= 0
            elif now - seen[1] < self.hold:
                waiting = False
        return present and waiting


@dataclass(frozen=True)
class Outcome:
    """The result of one case over all ranks."""

    kind: OutcomeKind
    ranks: tuple[RankReport, ...]
    seconds: float
    #: The :class:`Stall` that ended a hang before its deadline, by name; None otherwise.
    stalled: str | None = None

    @property
    def ok(self) -> bool:
        return self.kind is OutcomeKind.OK

    @property
    def observations(self) -> list[dict[str, Any]]:
        return [r.observation or {} for r in self.ranks]

    def describe(self) -> str:
        """A human-readable account of every rank, for failure messages and corpus entries."""
        parts = [f"{self.kind.value} after {self.seconds:.2f}s"]
        if self.stalled:
            parts[0] += f" (ended before the deadline: {self.stalled})"
        for r in self.ranks:
            head = f"--- rank {r.rank}: {r.status}"
            if r.exit_status is not None:
                head += f" (exit status {r.exit_status})"
            parts.append(head)
            if r.exc_type:
                parts.append(r.traceback or f"{r.exc_type}: {r.message}")
            if r.stack:
                parts.append("stack:\n" + r.stack)
            if r.exit_status is not None and r.output_tail:
                parts.append("last output:\n" + r.output_tail)
        return "\n".join(parts)


#: Errors a rank meets from the machine, not from the code under test, with the name a campaign
#: counts them under. ``EADDRINUSE``: a port picked as free was taken by another process before
#: the listener bound it (the process-based checkpointer's daemon, on a host busy with other
#: pools: docs/campaigns.md); the case is run again instead of judged.
ENVIRONMENT_ERRORS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("port taken (EADDRINUSE)", re.compile(r"\bEADDRINUSE\b|address already in use", re.IGNORECASE)),
)


def environment_fault(outcome: Outcome) -> str | None:
    """The name of the :data:`ENVIRONMENT_ERRORS` entry a rank of ``outcome`` raised, if any."""
    for report in outcome.ranks:
        if report.status != "error":
            continue
        text = f"{report.exc_type}: {report.message}"
        for name, pattern in ENVIRONMENT_ERRORS:
            if pattern.search(text):
                return name
    return None
