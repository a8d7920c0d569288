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

from fuzz.verdict import Outcome, OutcomeKind

# Tracebacks: 'File "/x/torch/a/b.py", line 12, in fn'; faulthandler: 'File "/x/torch/a/b.py", line 12 in fn'.
_FRAME = re.compile(r'File "([^"]+)", line \d+,? in (\S+)')


@dataclass(frozen=True)
class Signature:
    """A failure signature, as parts: ``kind:property[:check][@where][:tag...]``.

    - exception: ``check`` is the exception type, ``where`` the innermost torch frame;
    - crash: ``check`` is the fatal signal or exit status, ``where`` the frame it died in;
    - hang: ``where`` is the frame a stuck rank waits in (or a named deadlock);
    - mismatch: either ``check`` alone (the check that disagreed), or ``where``, the API family
      it is charged to (``fsdp2``, ``save``), with ``tags``: the degenerate setups of known bugs
      the case meets (``shard1``, :func:`fuzz.known.mismatch_tags`); the state-dict judges also
      write both (``optimizer@save``).

    Corpus entries and the report keep the text (``str(signature)``); code that compares
    signatures reads the parts (:meth:`parse`)."""

    kind: str
    property: str
    check: str = ""
    where: str = ""
    tags: tuple[str, ...] = ()

    def is_contract(self) -> bool:
        """Whether this is a violated contract: a mismatch charged to a ``contract-*`` check
        alone (a documented state or dtype checked on the rank, no value wrong)."""
        return self.kind == "mismatch" and self.check.startswith("contract-") and not self.where

    def __str__(self) -> str:
        text = f"{self.kind}:{self.property}"
        if self.check:
            text += f":{self.check}"
        if self.where:
            text += f"@{self.where}"
        return text + "".join(f":{t}" for t in self.tags)

    @classmethod
    def parse(cls, text: str) -> Signature | None:
        """The parts of a signature this module wrote; None for other text. A frame (``where``
        of an exception, crash or hang) keeps its own colons; only a mismatch's API family has
        tags after it."""
        kind, sep, rest = text.partition(":")
        if not sep or kind not in ("mismatch", "exception", "crash", "hang"):
            return None
        head, at, where = rest.partition("@")
        prop, _, check = head.partition(":")
        if not prop or (at and not where):
            return None
        if kind == "mismatch" and at and not check:
            family, *tags = where.split(":")
            return cls(kind, prop, "", family, tuple(tags))
        if kind in ("exception", "crash") and not (at and check):
            return None
        if not (check or where):
            return None
        return cls(kind, prop, check, where)


@dataclass(frozen=True)
class Failure:
    """A property's verdict on a failing case."""

    kind: str  # "mismatch" | "exception" | "hang" | "crash"
    signature: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)


def torch_frame(path: str, function: str) -> str | None:
    """``torch/x/y.py:function`` for a frame of torch's own code, else None: the one rule of
    "a frame inside torch", which :func:`location` and :func:`entry_point` read tracebacks by
    and the kept reduced reproducer scripts carry verbatim (this function's source, so it reads
    nothing outside itself). The last
    "/torch/" is the package itself, wherever it is installed (".../torch/.venv/lib/.../
    site-packages/torch/distributed/x.py"), unless another package lies below it (".../torch/
    .venv/lib/.../site-packages/tqdm/_monitor.py") or the file is shardfuzz's (a path with
    "/fuzz/"). Frames of comprehensions, which Python 3.12 inlines into the function around
    them (PEP 709), count as no frame, so one bug keeps one signature on every Python."""
    at = path.rfind("/torch/")
    inner = path[at + 1 :]
    if at < 0 or "/fuzz/" in path or "-packages/" in inner or function in ("<listcomp>", "<dictcomp>", "<setcomp>"):
        return None
    return f"{inner}:{function}"


def location(text: str | None) -> str:
    """The innermost frame inside torch (``torch/x/y.py:function``, :func:`torch_frame`), else the
    innermost frame; comprehensions count as the function they are written in."""
    frames = [(path, fn) for path, fn in _FRAME.findall(_current_thread(text or "")) if not fn.endswith("comp>")]
    if not frames:
        return "?"
    # faulthandler prints most recent call first, tracebacks last: normalise to innermost first.
    if text and "most recent call first" in text:
        ordered = frames
    else:
        ordered = list(reversed(frames))
    for path, fn in ordered:
        inside = torch_frame(path, fn)
        if inside is not None:
            return inside
    path, fn = ordered[0]
    return f"{path.rsplit('/', 1)[-1]}:{fn}"


def entry_point(text: str | None) -> str | None:
    """The outermost frame inside torch of a Python traceback (``torch/x/y.py:function``): the
    torch API the failing call entered by; None where the traceback has no torch frame."""
    for path, fn in _FRAME.findall(text or ""):
        inside = torch_frame(path, fn)
        if inside is not None:
            return inside
    return None


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
        signature = Signature("crash", prop, cause, where)
        return Failure("crash", str(signature), f"rank {dead.rank} died ({cause})", details)
    if outcome.kind is OutcomeKind.EXCEPTION:
        first = next(r for r in outcome.ranks if r.exc_type)
        where = location(first.traceback)
        summary = f"rank {first.rank} raised {first.exc_type}: {shorten(first.message or '', 300)}"
        return Failure("exception", str(Signature("exception", prop, first.exc_type or "?", where)), summary, details)
    if outcome.kind is OutcomeKind.HANG:
        stuck = [r for r in outcome.ranks if r.status == "stuck"]
        where = location(stuck[0].stack)
        ranks = ", ".join(str(r.rank) for r in stuck)
        summary = (
            f"rank(s) {ranks} stuck in {where}: {outcome.stalled}"
            if outcome.stalled
            else f"rank(s) {ranks} missed the deadline in {where}"
        )
        return Failure("hang", str(Signature("hang", prop, where=where)), summary, details)
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


def shorten(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at a word boundary, with an ellipsis."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip() + "…"


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
      family and matches only itself (a violated contract met through another property is the
      same bug only where a conditional bug's condition says so:
      :meth:`fuzz.corpus.CorpusIndex.match`).
    """
    if entry == found:
        return True
    a, b = Signature.parse(entry), Signature.parse(found)
    if a is None or b is None or a.kind != b.kind:
        return False
    if a.kind != "mismatch":
        return (a.check, a.where) == (b.check, b.where)
    if a.check or b.check or not (a.where and b.where):
        return False
    return a.where == b.where and bool(a.tags) and set(a.tags) <= set(b.tags)
