"""Exploration campaigns: run properties under Hypothesis on a pool, for a time budget.

The campaign runs Hypothesis in chunks (a few dozen examples each, a fresh seed derived from
the campaign seed each time), round-robin over the chosen properties, until the budget or
``max_examples`` is spent. A failure is shrunk by Hypothesis, re-run to count how often it
reproduces, and saved to the corpus under its signature; a signature seen before in this
campaign or in the corpus is counted, not shrunk again.

Budget: no example starts after ``budget`` seconds, and the campaign's work (cases, shrinks,
re-runs) ends ``TEARDOWN_S`` before ``budget + grace(budget)``, so that a campaign, start-up and
teardown included, ends within that much wall time (:class:`Clock`). Every case's deadline is cut
to the time left; a case cut short that way is left unjudged, not taken for a hang. A failure's
shrink runs for at most ``max(SHRINK_MIN_S, SHRINK_SHARE x budget)`` and stops early enough to
leave time for its re-runs; a shrink cut short keeps the smallest failing case found so far, and
the entry says that it is not fully shrunk (and, where re-runs were cut, not confirmed).

With an example ``database`` (see :mod:`fuzz.database`), every failure Hypothesis shrinks is also
saved there under the property's key, and the first chunk of each property replays the saved
failures first (``Phase.reuse``, smallest first, up to the first that still fails), before
generating anything. Later chunks of the same campaign
do not replay: a re-hit of a signature already shrunk in this campaign is counted, not raised,
which Hypothesis would take as "no longer fails" and delete from the database. A replayed
failure whose signature is a known corpus entry is deleted from the database the same way.

Time goes where new behaviour still appears (:class:`Scheduler`, after HypoFuzz's idea): each
chunk of a property counts its *discoveries* (a feature, or a pair of features occurring in
one case, that this property had not produced before in the campaign, and each new failure
signature), and the next property is drawn with a probability that follows its recent
discoveries per second, with a floor so that no property starves. A property whose cases all
look alike gets less time; one still finding new combinations gets more. Where the campaign
measures torch coverage (``torch_lines``), the lines of torch a chunk reached first are a second
signal, which decides half of the time that follows the rates: a property still reaching
unreached torch code gets more time (as HypoFuzz follows new branches).

A failure whose signature has an entry in the corpus already (from an earlier campaign) is
counted against that entry, not shrunk again; with the example database, a restarted campaign
thus resumes where the last one stopped. So is a known torch bug met another way (through
another property, or in a case that meets its conditions and another's:
:func:`fuzz.signature.same_bug`); the report names the known entry it was counted against.

Stopping: Ctrl-C or SIGTERM ends the campaign early and what was found is saved. The stop is
also checked before every case (:mod:`fuzz.stop`), so a KeyboardInterrupt lost on its way still
ends the campaign as interrupted.
"""

from __future__ import annotations

import math
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, event, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Flaky, HypothesisException

from fuzz import known
from fuzz.corpus import CorpusIndex, Entry, entry_from_failure, load_corpus, save_entry
from fuzz.database import FailuresOnly, database_key, use_database_key
from fuzz.model import Case
from fuzz.pool import RankPool
from fuzz.properties import Property
from fuzz.report import first_check, next_commands, upstream_url
from fuzz.scheduler import Discoveries, Scheduler
from fuzz.signature import Failure
from fuzz.status import clip, clock, fit_line
from fuzz.stop import clear_stop, raise_if_stopped, stop_requested, stop_signal
from fuzz.torch_coverage import ReachedLines, module_figures, torch_summary
from fuzz.verdict import OutcomeKind, environment_fault

CHUNK_EXAMPLES = 25
RERUNS = 3
#: Times a case is run again after a rank met an error of the machine (fuzz.verdict.ENVIRONMENT_ERRORS);
#: after that the case is judged as it ran.
ENVIRONMENT_RETRIES = 2
#: A campaign ends within budget + max(GRACE_MIN_S, GRACE_SHARE x budget) seconds of wall time.
GRACE_MIN_S = 30.0
GRACE_SHARE = 0.05
#: Of that, the last TEARDOWN_S seconds are left for ending the ranks and writing the report.
TEARDOWN_S = 8.0
#: One failure's shrink runs for at most max(SHRINK_MIN_S, SHRINK_SHARE x budget) seconds.
SHRINK_MIN_S = 20.0
SHRINK_SHARE = 0.1
#: Samples of the campaign's progress kept for the report (at most this many, evenly spread).
TIMELINE_POINTS = 400
#: With torch coverage measured, the part of the scheduler's rate-driven time that follows the
#: torch lines each property reaches first (Scheduler, ``line_share``).
LINE_SHARE = 0.5


def grace(budget: float) -> float:
    """Seconds past ``budget`` within which a campaign ends: max(GRACE_MIN_S, GRACE_SHARE x budget)."""
    return max(GRACE_MIN_S, GRACE_SHARE * budget)


def process_started() -> float:
    """``time.monotonic()`` at the start of this process (Linux: from /proc), else now: a
    campaign's clock includes the interpreter's start-up and imports."""
    now = time.monotonic()
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - min(max(age, 0.0), 600.0)


@dataclass(frozen=True)
class Clock:
    """A campaign's time: ``started`` (``time.monotonic()``) and its ``budget`` in seconds.

    No example starts after ``budget``; all work (cases, shrinks, re-runs) ends by :attr:`work_end`,
    which leaves TEARDOWN_S of :attr:`wall_limit` for ending the ranks and writing the report."""

    started: float
    budget: float

    @property
    def wall_limit(self) -> float:
        """Seconds after ``started`` by which the campaign has ended."""
        return self.budget + grace(self.budget)

    @property
    def work_end(self) -> float:
        return self.wall_limit - TEARDOWN_S

    def shrink_allowance(self) -> float:
        return max(SHRINK_MIN_S, SHRINK_SHARE * self.budget)


@dataclass
class Found:
    """One distinct failure of a campaign."""

    case: Case
    failure: Failure
    hits: int = 1
    known: bool = False
    entry: Entry | None = None
    path: Path | None = None
    first_seen: float = 0.0  # seconds into the campaign
    in_corpus: bool = False  # counted against a corpus entry (known or not) that predates this campaign
    #: Saved to a fallback directory because the corpus could not be written.
    fallback: bool = False
    #: Hypothesis finished shrinking it (False: the budget or a stop cut the shrink short, and
    #: ``case`` is the smallest failing case found until then).
    shrunk: bool = False
    #: The features of ``case`` (the property's ``features``), for grouping failures by cause.
    features: tuple[str, ...] = ()
    #: Seconds its latest failing run took (what a re-run is expected to cost).
    seconds: float = 0.0
    #: What the campaign could not finish for it, in words ("not fully shrunk: ...", "not
    #: confirmed: ..."); also in its entry's ``details["unfinished"]``.
    unfinished: list[str] = field(default_factory=list)

    @property
    def known_as(self) -> str | None:
        """The known entry's own signature, where this failure was counted against it as the
        same bug met another way (fuzz.signature.same_bug)."""
        if self.known and self.entry is not None and self.entry.signature != self.failure.signature:
            return self.entry.signature
        return None


@dataclass
class Progress:
    started: float
    budget: float
    cases: int = 0
    #: Seconds from the campaign's start (the process's) to the end of its first case: the
    #: start-up a user waits through (ranks importing torch, the process group). None before.
    first_case_s: float | None = None
    #: What the campaign waits for while no case has run yet, for the status line.
    waiting: str = ""
    per_property: Counter[str] = field(default_factory=Counter)
    seconds_per_property: dict[str, float] = field(default_factory=dict)
    features: Counter[str] = field(default_factory=Counter)
    features_per_property: dict[str, Counter[str]] = field(default_factory=dict)
    found: dict[str, Found] = field(default_factory=dict)
    restarts: int = 0
    #: Times the ranks were replaced between cases for their thread count (RankPool.recycled).
    recycled: int = 0
    #: Cases run again because a rank met an error of the machine, by its name
    #: (fuzz.verdict.ENVIRONMENT_ERRORS).
    environment: Counter[str] = field(default_factory=Counter)
    interrupted: bool = False
    #: Interrupted by Ctrl-C (SIGINT), not SIGTERM: the command line exits 130 (fuzz.exitcodes).
    by_ctrl_c: bool = False
    started_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    timeline: list[dict[str, Any]] = field(default_factory=list)
    weights: dict[str, float] = field(default_factory=dict)
    #: Where entries went when the corpus could not be written: {"directory": ..., "reason": ...}.
    corpus_fallback: dict[str, str] | None = None
    #: The torch lines the ranks reached, where the campaign measures them (--torch-coverage).
    torch: ReachedLines | None = None
    #: Whether the scheduler followed the new torch lines (Scheduler, ``line_share``).
    torch_signal: bool = False
    #: Torch lines that each property's chunks reached first in the campaign.
    new_lines_per_property: Counter[str] = field(default_factory=Counter)
    _sample_every: float = 1.0

    def sample(self, *, force: bool = False) -> None:
        """Add a point to the timeline (at most every few seconds; thinned to TIMELINE_POINTS)."""
        t = self.elapsed
        if not force and self.timeline and t - self.timeline[-1]["t"] < self._sample_every:
            return
        point: dict[str, Any] = {
            "t": round(t, 2),
            "cases": self.cases,
            "distinct_failures": len(self.found),
            "per_property": dict(self.per_property),
        }
        if self.torch is not None:
            point["torch_lines"] = self.torch.total
        self.timeline.append(point)
        if len(self.timeline) > TIMELINE_POINTS:  # keep every other point, sample half as often
            self.timeline = [*self.timeline[:-1:2], self.timeline[-1]]
            self._sample_every *= 2

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def new_failures(self) -> list[Found]:
        return [f for f in self.found.values() if not f.known]

    def line(self, width: int | None = None) -> str:
        """The status line; with ``width``, fitted to that many columns (:func:`fit_line`)."""
        rate = self.cases / self.elapsed if self.elapsed > 0 else 0.0
        if self.waiting and not self.cases:
            line = f"[{clock(self.elapsed)} / {clock(self.budget)}] {self.waiting}"
            return line if width is None else clip(line, width)
        return fit_line(
            f"[{clock(self.elapsed)} / {clock(self.budget)}] cases {self.cases}",
            [f"({rate:.1f}/s)", f"restarts {self.restarts}"]
            + ([f"re-run for the machine {sum(self.environment.values())}"] if self.environment else []),
            [f"{f.failure.signature} x{f.hits}" for f in self.found.values()],
            width,
        )

    def summary(self, *, seed: int, backend: str, world_size: int, pools: int = 1) -> dict[str, Any]:
        """The campaign as plain data (schema 1), for summary.json and the HTML report."""
        return {
            "schema": 1,
            "seed": seed,
            "started_at": self.started_at,
            "seconds": round(self.elapsed, 2),
            "budget": self.budget,
            "wall_limit": round(self.budget + grace(self.budget), 2) if math.isfinite(self.budget) else None,
            "cases": self.cases,
            "first_case_s": self.first_case_s,
            "interrupted": self.interrupted,
            "restarts": self.restarts,
            "recycled": self.recycled,
            "environment_reruns": dict(sorted(self.environment.items())),
            "backend": backend,
            "world_size": world_size,
            "pools": pools,
            # the known bugs whose fixes the ranks ran under (explore --fix): absent from this run
            "fixes": sorted(known.fixed()),
            "properties": sorted(self.weights or self.per_property),
            "cases_per_property": dict(self.per_property),
            "seconds_per_property": {k: round(v, 3) for k, v in self.seconds_per_property.items()},
            "features": dict(self.features),
            "features_per_property": {k: dict(v) for k, v in self.features_per_property.items()},
            "failures": [
                {
                    "signature": f.failure.signature,
                    "kind": f.failure.kind,
                    "property": f.case.property,
                    "hits": f.hits,
                    "known": f.known,
                    "known_as": f.known_as,
                    "bug": f.entry.bug if f.entry is not None else None,
                    "check": first_check(f.failure.signature, f.failure.details),
                    "features": list(f.features),
                    # for an entry this campaign made: whether its shrink and its re-runs finished
                    "shrunk": None if f.in_corpus else f.shrunk,
                    "unfinished": list(f.unfinished),
                    "reruns": f.entry.reruns if f.entry is not None and not f.in_corpus else None,
                    "reproduced": f.entry.reproduced if f.entry is not None and not f.in_corpus else None,
                    # an entry file in the corpus holds it (it was there before, or this campaign saved it)
                    "in_corpus": f.path is not None and not f.fallback,
                    "seen_before": f.in_corpus,
                    "status": f.entry.status if f.entry is not None else None,
                    "upstream": f.entry.upstream if f.entry is not None else None,
                    "upstream_url": upstream_url(f.entry.upstream) if f.entry is not None else None,
                    "entry_summary": f.entry.summary if f.entry is not None else None,
                    "summary": f.failure.summary,
                    "entry": str(f.path) if f.path else None,
                    "entry_fallback": f.fallback,
                    "commands": next_commands(f.path) if f.path else [],
                    "first_seen": round(f.first_seen, 2),
                }
                for f in self.found.values()
            ],
            "corpus_fallback": self.corpus_fallback,
            "timeline": self.timeline,
            "weights": {k: round(v, 4) for k, v in self.weights.items()},
            **self._torch_summary(),
        }

    def _torch_summary(self) -> dict[str, Any]:
        if self.torch is None:
            return {}
        per_property = {name: self.new_lines_per_property.get(name, 0) for name in self.weights or self.per_property}
        return {"torch_coverage": torch_summary(self.torch, per_property=per_property, signal=self.torch_signal)}


class _Failed(Exception):
    """Raised inside the Hypothesis test so that it shrinks the case."""


class _BudgetSpent(BaseException):
    """Ends a chunk at once. Not an Exception, so Hypothesis passes it through unshrunk."""


def run_case(pool: RankPool, prop: Property, case: Case) -> Failure | None:
    """Run one case on the pool and judge it: the single step pytest and the CLI share."""
    return prop.judge(case, pool.run(case, stall=prop.stall))


class _Cut:
    """A case that the campaign's time ran out on: not judged (see :func:`_run_in_time`)."""


CUT = _Cut()


def _run_in_time(pool: RankPool, prop: Property, case: Case, progress: Progress, until: float) -> Failure | _Cut | None:
    """:func:`run_case` within ``until`` seconds of the campaign's clock: waiting for the ranks
    to join and the case's deadline are both cut to the time left. A case that reaches a
    deadline shorter than the pool's own because of that is :data:`CUT`, not a hang: it was
    not given the time a case is promised. A hang that the stack samples show (a stall, or
    the generic rule) is a hang whatever the deadline."""
    left = until - progress.elapsed
    if left <= 0 or not pool.wait_ready(left):
        return CUT
    left = until - progress.elapsed
    if left <= 0:
        return CUT
    limit = min(pool.deadline, left)
    outcome = pool.run(case, deadline=limit, stall=prop.stall)
    for _ in range(ENVIRONMENT_RETRIES):
        fault = environment_fault(outcome)
        if fault is None or until - progress.elapsed <= 0:
            break
        # The machine's fault, not torch's (fuzz.verdict.ENVIRONMENT_ERRORS): run it again.
        progress.environment[fault] += 1
        limit = min(pool.deadline, until - progress.elapsed)
        outcome = pool.run(case, deadline=limit, stall=prop.stall)
    if outcome.kind is OutcomeKind.HANG and outcome.stalled is None and limit < pool.deadline:
        return CUT
    return prop.judge(case, outcome)


def explore(
    pool: RankPool,
    properties: list[Property],
    *,
    budget: float,
    max_examples: int | None = None,
    seed: int = 0,
    corpus: Path | None = None,
    on_case: Callable[[Progress], None] | None = None,
    reruns: int = RERUNS,
    database: ExampleDatabase | None = None,
    fallback: Sequence[Path] = (),
    on_note: Callable[[str], None] | None = None,
    started: float | None = None,
    torch_lines: ReachedLines | None = None,
    line_signal: bool = True,
    only: Sequence[str] = (),
) -> Progress:
    """Explore ``properties`` on ``pool`` for ``budget`` seconds; returns what was seen.

    ``started``: the ``time.monotonic()`` the campaign's clock starts from (default: now); the
    command line passes its process's start, so that the budget covers start-up. The work ends
    ``TEARDOWN_S`` before ``budget + grace(budget)`` (:class:`Clock`).

    ``database``: a Hypothesis example database that failures are saved to and replayed from
    (each property's first chunk replays it first); None for none.

    ``fallback``: directories tried in turn, then one under the system's temporary directory,
    for an entry that cannot be written to ``corpus`` (disk full, directory removed or made
    read-only during the campaign): the failure is kept there, ``on_note`` (default: a line on
    stderr) says where, and the campaign goes on. A corpus entry met again is counted in this
    campaign's summary (``hits``), never in its file: a campaign that finds nothing new leaves
    the corpus, which is under version control, as it was.

    ``torch_lines``: the torch lines the pool's ranks reach, where they measure them (the pool
    was made with :func:`fuzz.torch_coverage.rank_env`); read after every chunk, credited to the
    chunk's property, and, with ``line_signal``, followed by the scheduler (:class:`Scheduler`,
    ``line_share`` :data:`LINE_SHARE`).

    ``only``: feature prefixes (``knob:``, ``writer:thread_count``); where given, only cases with
    a feature (:attr:`Property.features`) that starts with one of them run, the others are
    rejected as they are drawn (a soak of one path; shrinking keeps to such cases too).

    Ctrl-C (KeyboardInterrupt) ends the campaign early; what was found is kept and saved.
    """
    clock = Clock(started=time.monotonic() if started is None else started, budget=budget)
    progress = Progress(started=clock.started, budget=budget)
    progress._sample_every = max(1.0, budget / TIMELINE_POINTS) if math.isfinite(budget) else 1.0
    progress.sample(force=True)
    corpus_entries = CorpusIndex(load_corpus(corpus)[0] if corpus is not None else [])
    rng = random.Random(seed)
    by_name = {p.name: p for p in properties}
    follow_lines = torch_lines is not None and line_signal
    scheduler = Scheduler(by_name, rng, line_share=LINE_SHARE if follow_lines else 0.0)
    progress.torch, progress.torch_signal = torch_lines, follow_lines
    discoveries = Discoveries()
    replayed: set[str] = set()
    note = on_note if on_note is not None else _note_on_stderr
    fallbacks = [*fallback, Path(tempfile.gettempdir()) / "shardfuzz-unsaved-corpus"]

    def save(found: Found, entry: Entry) -> None:
        assert corpus is not None
        found.path, found.entry = _save(corpus, entry, fallbacks, progress, note)
        found.fallback = found.path is not None and found.path.parent != corpus

    def spent() -> bool:
        raise_if_stopped()
        return progress.elapsed >= budget or (max_examples is not None and progress.cases >= max_examples)

    try:
        if torch_lines is not None:
            module_figures({})  # reads the installed torch's modules once, while the ranks start
            # What the ranks reach starting up (imports, the process group) is no property's discovery.
            if pool.wait_ready(max(0.0, clock.work_end - progress.elapsed)):
                torch_lines.update()
        # The ranks' start-up (importing torch and its distributed modules, joining the process
        # group) takes seconds: say so on the status line rather than show a frozen "cases 0".
        progress.waiting = STARTING_RANKS
        while not spent() and not pool.wait_ready(min(STATUS_EVERY_S, max(0.0, clock.work_end - progress.elapsed))):
            if on_case is not None:
                on_case(progress)
        progress.waiting = ""
        while not spent():
            prop = by_name[scheduler.pick()]
            chunk = CHUNK_EXAMPLES if max_examples is None else min(CHUNK_EXAMPLES, max_examples - progress.cases)
            reuse = database is not None and prop.name not in replayed
            replayed.add(prop.name)
            started, signatures, behaviours = time.monotonic(), len(progress.found), discoveries.total
            pending = _run_chunk(
                pool,
                prop,
                chunk,
                rng.getrandbits(64),
                progress,
                corpus_entries,
                clock,
                reruns,
                on_case,
                database=database,
                reuse=reuse,
                discoveries=discoveries,
                only=only,
            )
            for found in pending:
                _confirm_and_save(pool, prop, found, corpus, reruns, save, progress, clock.work_end)
            new_lines = torch_lines.update() if torch_lines is not None else 0
            progress.new_lines_per_property[prop.name] += new_lines
            scheduler.record(
                prop.name,
                seconds=time.monotonic() - started,
                discoveries=discoveries.total - behaviours + len(progress.found) - signatures,
                new_lines=new_lines,
            )
            progress.weights = scheduler.weights()
            progress.sample()
    except BaseException as e:
        # After a stop request, whatever unwound the loop is the stop (see the module docstring).
        if not isinstance(e, KeyboardInterrupt) and not stop_requested():
            raise
        progress.interrupted = True
        for found in progress.found.values():  # keep what was found, unconfirmed
            if found.entry is None and corpus is not None and not found.known:
                if not found.shrunk:
                    found.unfinished.append("not fully shrunk: the campaign was stopped first")
                if reruns:
                    why = f"not confirmed: re-run 0 of {reruns} times, the campaign was stopped first"
                    found.unfinished.append(why)
                save(found, _entry(pool, found, reruns=0, reproduced=0))
    if torch_lines is not None:
        torch_lines.update()  # a chunk cut short by a stop: its lines count in the figures, for no property
    progress.interrupted = progress.interrupted or stop_requested()
    # SIGTERM (a scheduler, the pools parent's backstop) ends a campaign as its budget would;
    # Ctrl-C, or a KeyboardInterrupt without a recorded signal, is an interruption (exit 130).
    progress.by_ctrl_c = progress.interrupted and stop_signal() in (None, signal.SIGINT)
    clear_stop()
    progress.restarts = pool.restarts
    progress.recycled = pool.recycled
    progress.weights = scheduler.weights()
    progress.sample(force=True)
    return progress


#: The status line while the ranks start.
STARTING_RANKS = "starting ranks: importing torch, joining the process group"
#: Seconds between status updates while the ranks start.
STATUS_EVERY_S = 0.5


def _run_chunk(
    pool: RankPool,
    prop: Property,
    n: int,
    chunk_seed: int,
    progress: Progress,
    corpus_entries: CorpusIndex,
    clock: Clock,
    reruns: int,
    on_case: Callable[[Progress], None] | None,
    *,
    database: ExampleDatabase | None = None,
    reuse: bool = False,
    discoveries: Discoveries | None = None,
    only: Sequence[str] = (),
) -> list[Found]:
    """Run up to ``n`` examples of ``prop``; returns the failures new to this campaign and corpus.

    With ``reuse``, the failures saved in ``database`` for this property run first.
    ``discoveries`` records each case's features; ``only`` rejects the cases without a feature
    that starts with one of its prefixes (:func:`explore`). No example starts after the budget; once a
    failure is being shrunk, none starts after its shrink allowance (:meth:`Clock.shrink_allowance`)
    or once only the time its re-runs need is left; a shrink cut short leaves its failures
    marked as not fully shrunk (:attr:`Found.shrunk`).
    """
    new: dict[str, Found] = {}
    shrinking = False
    shrink_until = math.inf
    phases = (Phase.reuse, Phase.generate, Phase.shrink) if reuse else (Phase.generate, Phase.shrink)
    saves = None if database is None else FailuresOnly(database)

    def budget_spent() -> _BudgetSpent:
        if saves is not None:
            saves.stopping = True  # the case it stops did not run: it is no failure to replay
        return _BudgetSpent()

    @settings(
        max_examples=n,
        deadline=None,
        database=saves,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        verbosity=Verbosity.quiet,
    )
    @hypothesis_seed(chunk_seed)
    @given(prop.cases(world_size=pool.world_size, accelerator=pool.backend == "nccl"))
    def test(case: Case) -> None:
        nonlocal shrinking, shrink_until
        raise_if_stopped()
        if progress.elapsed >= (shrink_until if shrinking else clock.budget):
            raise budget_spent()
        features = prop.features(case)
        if only and not any(f.startswith(prefix) for f in features for prefix in only):
            reject()
        per_property = progress.features_per_property.setdefault(prop.name, Counter())
        for feature in features:
            event(feature)
            progress.features[feature] += 1
            per_property[feature] += 1
        if discoveries is not None:
            discoveries.add(prop.name, features)
        start = time.monotonic()
        failure = _run_in_time(pool, prop, case, progress, clock.work_end)
        if isinstance(failure, _Cut):
            raise budget_spent()
        seconds = time.monotonic() - start
        progress.cases += 1
        if progress.first_case_s is None:
            progress.first_case_s = round(progress.elapsed, 2)
        progress.per_property[prop.name] += 1
        progress.seconds_per_property[prop.name] = progress.seconds_per_property.get(prop.name, 0.0) + seconds
        progress.restarts = pool.restarts
        progress.recycled = pool.recycled
        progress.sample()
        if on_case is not None:
            on_case(progress)
        if failure is None:
            return
        sig = failure.signature
        seen = progress.found.get(sig)
        if seen is not None and sig not in new:
            seen.hits += 1  # found and shrunk earlier in this campaign: count it only
            return
        hit = corpus_entries.match(sig, case, failure.kind) if sig not in new else None
        if hit is not None:
            # Shrunk by an earlier campaign, or a known bug met another way: count it against
            # its entry, do not shrink again.
            path, entry = hit
            known = entry.status == "known"
            progress.found[sig] = Found(
                case,
                failure,
                known=known,
                entry=entry,
                path=path,
                first_seen=progress.elapsed,
                in_corpus=True,
                features=tuple(sorted(set(features))),
                seconds=seconds,
            )
            return
        if seen is None:
            progress.found[sig] = new[sig] = Found(
                case, failure, first_seen=progress.elapsed, features=tuple(sorted(set(features))), seconds=seconds
            )
        else:
            seen.hits += 1
            # Hypothesis only moves to cases it judges smaller, and replays its final, minimal
            # case last: the latest failing case of a signature is the one to keep.
            seen.case, seen.failure = case, failure
            seen.features, seen.seconds = tuple(sorted(set(features))), seconds
        if not shrinking:
            # The shrink's share of the time, less what the re-runs will need (about as long as
            # this run took, each), at most half of what is left after the budget.
            confirm = min(reruns * (seconds + 1.0), max(0.0, clock.work_end - max(clock.budget, progress.elapsed)) / 2)
            shrink_until = min(progress.elapsed + clock.shrink_allowance(), clock.work_end - confirm)
        shrinking = True
        raise _Failed(sig)

    if database is not None:
        use_database_key(test, database_key(prop.name, pool.world_size))
    try:
        test()
    except (_Failed, Flaky):
        for found in new.values():
            found.shrunk = True
    except _BudgetSpent:
        for found in new.values():
            found.unfinished.append("not fully shrunk: the campaign's time for its shrink ran out")
    except HypothesisException:
        pass  # e.g. Unsatisfiable when the budget ran out before any example ran
    return list(new.values())


def _confirm_and_save(
    pool: RankPool,
    prop: Property,
    found: Found,
    corpus: Path | None,
    reruns: int,
    save: Callable[[Found, Entry], None],
    progress: Progress,
    until: float,
) -> None:
    """Re-run ``found`` up to ``reruns`` times, as long as the campaign's clock leaves about the
    time its failing run took (and each run is cut at ``until``), then make and save its entry."""
    done = reproduced = 0
    for _ in range(reruns):
        raise_if_stopped()
        if until - progress.elapsed < found.seconds:
            break
        failure = _run_in_time(pool, prop, found.case, progress, until)
        if isinstance(failure, _Cut):
            break
        done += 1
        if failure is not None and failure.signature == found.failure.signature:
            reproduced += 1
    if done < reruns:
        what = "not confirmed" if done == 0 else "not fully confirmed"
        found.unfinished.append(f"{what}: re-run {done} of {reruns} times before the campaign's time ran out")
    entry = _entry(pool, found, reruns=done, reproduced=reproduced)
    found.entry = entry
    if corpus is not None:
        save(found, entry)


def _entry(pool: RankPool, found: Found, *, reruns: int, reproduced: int) -> Entry:
    """The corpus entry for ``found``; what the campaign could not finish for it is in its
    details (``unfinished``)."""
    failure = found.failure
    if found.unfinished:
        details = {**failure.details, "unfinished": list(found.unfinished)}
        failure = Failure(failure.kind, failure.signature, failure.summary, details)
    return entry_from_failure(
        found.case,
        failure,
        versions=pool.versions,
        backend=pool.backend,
        device_kind=_device_kind(pool),
        reruns=reruns,
        reproduced=reproduced,
    )


def _save(
    corpus: Path, entry: Entry, fallbacks: Sequence[Path], progress: Progress, note: Callable[[str], None]
) -> tuple[Path | None, Entry]:
    """Save ``entry`` to ``corpus``, else to the first fallback directory that takes it."""
    try:
        return save_entry(corpus, entry)
    except OSError as e:
        reason = f"{e.strerror or e}"
    for directory in fallbacks:
        try:
            path, saved = save_entry(directory, entry)
        except OSError:
            continue
        progress.corpus_fallback = {"directory": str(directory), "reason": f"--corpus {corpus}: {reason}"}
        note(f"explore: cannot write to --corpus {corpus} ({reason}); {entry.signature} saved to {path} instead")
        return path, saved
    progress.corpus_fallback = {"directory": "", "reason": f"--corpus {corpus}: {reason}"}
    note(f"explore: cannot write to --corpus {corpus} ({reason}) nor to any fallback; {entry.signature} is not saved")
    return None, entry


def _note_on_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _device_kind(pool: RankPool) -> str:
    return pool.versions.get("device", pool.backend)
