"""Failure signatures: what makes two failures "the same bug".

A signature is ``<kind>:<property>:<detail>`` where the detail is the exception type and the
innermost torch frame it came from (exceptions), the innermost torch frame a stuck rank was in
(hangs), the fatal signal or exit status (crashes), or the check that disagreed (mismatches).
Line numbers are left out so a signature survives unrelated edits to torch.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import Any

from fuzz.pool import Outcome, OutcomeKind

# Tracebacks: 'File "/x/torch/a/b.py", line 12, in fn'; faulthandler: 'File "/x/torch/a/b.py", line 12 in fn'.
_FRAME = re.compile(r'File "([^"]+)", line \d+,? in (\S+)')


@dataclass(frozen=True)
class Failure:
    """A property's verdict on a failing case."""

    kind: str  # "mismatch" | "exception" | "hang" | "crash"
    signature: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)


def location(text: str | None) -> str:
    """The innermost frame inside torch (``torch/x/y.py:function``), else the innermost frame."""
    frames = _FRAME.findall(text or "")
    if not frames:
        return "?"
    # faulthandler prints most recent call first, tracebacks last: normalise to innermost first.
    if text and "most recent call first" in text:
        ordered = frames
    else:
        ordered = list(reversed(frames))
    for path, fn in ordered:
        # The last "/torch/" is the package itself, wherever it is installed
        # (".../torch/.venv/lib/.../site-packages/torch/distributed/x.py").
        at = path.rfind("/torch/")
        if at >= 0 and "/fuzz/" not in path:
            return f"{path[at + 1 :]}:{fn}"
    path, fn = ordered[0]
    return f"{path.rsplit('/', 1)[-1]}:{fn}"


def failure_from_outcome(prop: str, outcome: Outcome) -> Failure:
    """The failure for an outcome that is not ``ok``, with every rank's account attached."""
    details = {"ranks": [_rank_details(r) for r in outcome.ranks], "seconds": outcome.seconds}
    if outcome.kind is OutcomeKind.CRASH:
        dead = next(r for r in outcome.ranks if r.exit_status is not None)
        status = dead.exit_status
        cause = (
            f"signal {signal.Signals(-status).name}" if status is not None and status < 0 else f"exit status {status}"
        )
        where = location(dead.stack) if dead.stack else "?"
        return Failure("crash", f"crash:{prop}:{cause}@{where}", f"rank {dead.rank} died ({cause})", details)
    if outcome.kind is OutcomeKind.EXCEPTION:
        first = next(r for r in outcome.ranks if r.exc_type)
        where = location(first.traceback)
        summary = f"rank {first.rank} raised {first.exc_type}: {(first.message or '')[:300]}"
        return Failure("exception", f"exception:{prop}:{first.exc_type}@{where}", summary, details)
    if outcome.kind is OutcomeKind.HANG:
        stuck = [r for r in outcome.ranks if r.status == "stuck"]
        where = location(stuck[0].stack)
        ranks = ", ".join(str(r.rank) for r in stuck)
        return Failure("hang", f"hang:{prop}@{where}", f"rank(s) {ranks} missed the deadline in {where}", details)
    raise ValueError("an ok outcome is not a failure")


def _rank_details(r: Any) -> dict[str, Any]:
    return {
        "rank": r.rank,
        "status": r.status,
        "exc_type": r.exc_type,
        "message": r.message,
        "traceback": r.traceback,
        "stack": r.stack,
        "exit_status": r.exit_status,
        "output_tail": r.output_tail,
    }
