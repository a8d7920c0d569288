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


#: Frames of comprehensions, which Python 3.12 inlines into the function around them (PEP 709):
#: a location names that function on every Python, so one bug keeps one signature.
_INLINED = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>"})


def location(text: str | None) -> str:
    """The innermost frame inside torch (``torch/x/y.py:function``), else the innermost frame;
    comprehensions count as the function they are written in."""
    frames = [(path, fn) for path, fn in _FRAME.findall(_current_thread(text or "")) if fn not in _INLINED]
    if not frames:
        return "?"
    # faulthandler prints most recent call first, tracebacks last: normalise to innermost first.
    if text and "most recent call first" in text:
        ordered = frames
    else:
        ordered = list(reversed(frames))
    for path, fn in ordered:
        # The last "/torch/" is the package itself, wherever it is installed
        # (".../torch/.venv/lib/.../site-packages/torch/distributed/x.py"), unless another
        # package lies below it (".../torch/.venv/lib/.../site-packages/tqdm/_monitor.py").
        at = path.rfind("/torch/")
        inner = path[at + 1 :]
        if at >= 0 and "/fuzz/" not in path and "-packages/" not in inner:
            return f"{inner}:{fn}"
    path, fn = ordered[0]
    return f"{path.rsplit('/', 1)[-1]}:{fn}"


def _current_thread(text: str) -> str:
    """faulthandler's block of the thread that faulted or was signalled ("Current thread ..."),
    where it has frames: the other threads it lists (a tqdm monitor, a compile worker) say
    nothing about where the rank died. Else the whole text (a traceback)."""
    at = text.find("Current thread ")
    if at < 0:
        return text
    block = re.split(r"\n\s*\n", text[at:], maxsplit=1)[0]
    return block if _FRAME.search(block) else text


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
        summary = (
            f"rank(s) {ranks} stuck in {where}: {outcome.stalled}"
            if outcome.stalled
            else f"rank(s) {ranks} missed the deadline in {where}"
        )
        return Failure("hang", f"hang:{prop}@{where}", summary, details)
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


# ------------------------------------------------------------------- one bug, several signatures


def _parts(signature: str) -> tuple[str, str, str] | None:
    """(kind, property, detail) of a signature; None for one this module did not write."""
    kind, sep, rest = signature.partition(":")
    if not sep:
        return None
    if kind in ("mismatch", "hang"):
        cut = min((i for i in (rest.find("@"), rest.find(":")) if i >= 0), default=-1)
    else:
        cut = rest.find(":")
    if cut <= 0:
        return None
    return kind, rest[:cut], rest[cut:]


def same_bug(entry: str, found: str) -> bool:
    """Whether a failure signed ``found`` is the bug a corpus entry signed ``entry`` stands for.

    Equal signatures are one bug. Beyond that, two rules, both independent of the property the
    bug was met through (a property is a scenario; the bug lives in torch):

    - an exception, crash or hang with the same detail (exception type or signal, and the
      innermost torch frame) met through another property;
    - a mismatch charged to the same API family (``@fsdp2``, ``@save``, ...) whose tags (the
      degenerate setups of known bugs that :func:`fuzz.properties.parity.api_of` and the
      state-dict judges append, such as ``:shard1`` or ``:unfrozen-unresharded``) include all of
      the entry's, which must have at least one: the case meets that bug's conditions, and
      possibly another's too. A mismatch charged to a check (``mismatch:prop:check``) has no
      family and matches only itself.
    """
    if entry == found:
        return True
    a, b = _parts(entry), _parts(found)
    if a is None or b is None or a[0] != b[0]:
        return False
    kind, detail_a, detail_b = a[0], a[2], b[2]
    if kind != "mismatch":
        return detail_a == detail_b
    if not (detail_a.startswith("@") and detail_b.startswith("@")):
        return False
    head_a, *tags_a = detail_a[1:].split(":")
    head_b, *tags_b = detail_b[1:].split(":")
    return head_a == head_b and bool(tags_a) and set(tags_a) <= set(tags_b)
