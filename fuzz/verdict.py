"""Verdict types: what a case did on every rank (:class:`Outcome`), and a deadlock seen in the
ranks' stacks before the deadline (:class:`Stall`, named by a property; :class:`HangWatch`, the
generic rule).

The pool produces these, the judges read them; neither side needs the other to do so. Imports
only the standard library.
"""

from __future__ import annotations

import enum
import math
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


#: How long the other ranks may take to report once one rank has failed (raised or died), before
#: their stacks are taken. Long enough for gloo to notice a closed peer, short against any case
#: deadline.
FAILURE_GRACE_S = 3.0
#: How often the ranks' stack samples are read while a stall or a hang is looked for.
STALL_LOOK_EVERY_S = 0.5


class Collect:
    """The collect rule: when to stop waiting for the ranks of one case, and why. One home for
    the pool's driver (:meth:`fuzz.pool.RankPool.run`, reading pipes) and an unreduced script's
    judge (:mod:`fuzz.repro.runtime`, reading a shared directory); each feeds it what it sees.

    - Every rank reports (:meth:`report`) or dies (:meth:`death`): the case is over.
    - A rank fails (raises, or dies): the others get :data:`FAILURE_GRACE_S` more, and the
      samples are not looked at again.
    - From ``stall.after`` seconds into the case, the samples go to the :class:`Stall`'s
      predicate every :data:`STALL_LOOK_EVERY_S`; once it has held for ``stall.hold`` the case
      ends as that stall (:attr:`stalled`). From ``watch_after`` seconds they also go to the
      generic :class:`HangWatch`; a deadlock the stall names keeps its name, whichever saw it
      first.
    - Else the deadline ends it; the ranks still in the case are stuck.
    """

    def __init__(
        self,
        world_size: int,
        start: float,
        deadline: float,
        stall: Stall | None = None,
        watch: HangWatch | None = None,
        watch_after: float = 0.0,
    ) -> None:
        self.world_size = world_size
        self.deadline = deadline
        self.stall = stall
        self.watch = watch
        self.done: set[int] = set()
        self.dead: set[int] = set()
        self.stalled: str | None = None
        self._first_failure: float | None = None
        self._named_from = start + stall.after if stall is not None else math.inf
        self._next_look = min(self._named_from, start + watch_after if watch is not None else math.inf)
        self._held_since: float | None = None

    def report(self, rank: int, failed: bool, now: float) -> None:
        """Rank ``rank`` reported (``failed``: it raised)."""
        self.done.add(rank)
        if failed and self._first_failure is None:
            self._first_failure = now

    def death(self, rank: int, now: float) -> None:
        """Rank ``rank`` died without reporting."""
        self.dead.add(rank)
        if self._first_failure is None:
            self._first_failure = now

    def over(self, rank: int) -> bool:
        return rank in self.done or rank in self.dead

    def until(self) -> float:
        """When waiting ends: the deadline, or the grace after the first failure."""
        if self._first_failure is None:
            return self.deadline
        return min(self.deadline, self._first_failure + FAILURE_GRACE_S)

    def waiting(self, now: float) -> bool:
        """Whether to wait on: ranks still in the case, no stall, time left."""
        return len(self.done) + len(self.dead) < self.world_size and self.stalled is None and now < self.until()

    def wants_samples(self, now: float) -> bool:
        return self._first_failure is None and now >= self._next_look

    def wake(self, now: float) -> float:
        """When to look again at the latest: the next look at the samples, or :meth:`until`."""
        return min(self.until(), self._next_look) if self._first_failure is None else self.until()

    def look(self, samples: Sequence[str | None], now: float) -> str | None:
        """Feed the latest samples (one per rank: None for a rank no longer in the case, "" for
        one not sampled yet); the stall that ends the case, or None."""
        self._next_look = now + STALL_LOOK_EVERY_S
        stacks = [s or "" for s in samples]
        stall = self.stall
        if stall is not None and now >= self._named_from:
            if not stall.deadlocked(stacks):
                self._held_since = None
            elif self._held_since is None:
                self._held_since = now
            elif now - self._held_since >= stall.hold:
                self.stalled = stall.name
        if self.stalled is None and self.watch is not None and self.watch.look(samples, now):
            named = stall is not None and stall.deadlocked(stacks)
            self.stalled = stall.name if named and stall is not None else WAITING_HANG
        return self.stalled


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
