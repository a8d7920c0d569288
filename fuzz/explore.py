"""Exploration campaigns: run properties under Hypothesis on a pool, for a time budget.

The campaign runs Hypothesis in chunks (a few dozen examples each, a fresh seed derived from
the campaign seed each time), round-robin over the chosen properties, until the budget or
``max_examples`` is spent. A failure is shrunk by Hypothesis, re-run to count how often it
reproduces, and saved to the corpus under its signature; a signature seen before in this
campaign or in the corpus is counted, not shrunk again. The budget is checked before each new
example; a shrink in progress may finish, within ``SHRINK_OVERRUN`` of the budget.

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
look alike gets less time; one still finding new combinations gets more.

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

import itertools
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, event, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Flaky, HypothesisException

from fuzz.case import Case
from fuzz.corpus import CorpusIndex, Entry, entry_from_failure, load_corpus, save_entry
from fuzz.database import database_key, use_database_key
from fuzz.pool import RankPool
from fuzz.properties import Property
from fuzz.signature import Failure
from fuzz.stop import clear_stop, raise_if_stopped, stop_requested

CHUNK_EXAMPLES = 25
SHRINK_OVERRUN = 0.25  # of the budget, at least 60 s
RERUNS = 3
#: Samples of the campaign's progress kept for the report (at most this many, evenly spread).
TIMELINE_POINTS = 400


class Scheduler:
    """Which property runs the next chunk: the ones still discovering get more of the time.

    Each property's rate is its discoveries per second over its recent chunks (an exponential
    moving sum, ``decay`` per chunk, so the estimate follows a property as it saturates), with a
    prior of half a discovery so that a property that found nothing yet keeps a chance. The
    share of time is ``floor / n`` for every property plus ``1 - floor`` split by rate. Every
    property runs once before any weighting, in the order given.
    """

    def __init__(self, names: Iterable[str], rng: random.Random, *, floor: float = 0.2, decay: float = 0.7) -> None:
        self.names = list(names)
        if not self.names:
            raise ValueError("a scheduler needs at least one property")
        self.rng = rng
        self.floor = floor
        self.decay = decay
        self.found: dict[str, float] = dict.fromkeys(self.names, 0.0)
        self.seconds: dict[str, float] = dict.fromkeys(self.names, 0.0)
        self.chunks: Counter[str] = Counter()

    def record(self, name: str, *, seconds: float, discoveries: int) -> None:
        self.found[name] = self.found[name] * self.decay + discoveries
        self.seconds[name] = self.seconds[name] * self.decay + max(seconds, 1e-3)
        self.chunks[name] += 1

    def rates(self) -> dict[str, float]:
        return {n: (self.found[n] + 0.5) / (self.seconds[n] + 1.0) for n in self.names}

    def weights(self) -> dict[str, float]:
        rates = self.rates()
        total = sum(rates.values())
        n = len(self.names)
        return {k: self.floor / n + (1 - self.floor) * r / total for k, r in rates.items()}

    def pick(self) -> str:
        for name in self.names:
            if not self.chunks[name]:
                return name
        weights = self.weights()
        return self.rng.choices(self.names, weights=[weights[n] for n in self.names])[0]


class Discoveries:
    """What each property has produced so far: features, feature pairs, failure signatures."""

    def __init__(self) -> None:
        self.seen: dict[str, set[str]] = {}
        self.total = 0

    def add(self, prop: str, features: Iterable[str]) -> int:
        """Record one case's features; returns how many features and pairs were new."""
        seen = self.seen.setdefault(prop, set())
        fs = sorted(set(features))
        keys = fs + [f"{a}&{b}" for a, b in itertools.combinations(fs, 2)]
        new = [k for k in keys if k not in seen]
        seen.update(new)
        self.total += len(new)
        return len(new)


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
    in_corpus: bool = False  # its signature had a (not known) corpus entry before this campaign

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
    per_property: Counter[str] = field(default_factory=Counter)
    seconds_per_property: dict[str, float] = field(default_factory=dict)
    features: Counter[str] = field(default_factory=Counter)
    features_per_property: dict[str, Counter[str]] = field(default_factory=dict)
    found: dict[str, Found] = field(default_factory=dict)
    restarts: int = 0
    interrupted: bool = False
    started_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    timeline: list[dict[str, Any]] = field(default_factory=list)
    weights: dict[str, float] = field(default_factory=dict)
    _sample_every: float = 1.0

    def sample(self, *, force: bool = False) -> None:
        """Add a point to the timeline (at most every few seconds; thinned to TIMELINE_POINTS)."""
        t = self.elapsed
        if not force and self.timeline and t - self.timeline[-1]["t"] < self._sample_every:
            return
        self.timeline.append(
            {
                "t": round(t, 2),
                "cases": self.cases,
                "distinct_failures": len(self.found),
                "per_property": dict(self.per_property),
            }
        )
        if len(self.timeline) > TIMELINE_POINTS:  # keep every other point, sample half as often
            self.timeline = [*self.timeline[:-1:2], self.timeline[-1]]
            self._sample_every *= 2

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def new_failures(self) -> list[Found]:
        return [f for f in self.found.values() if not f.known]

    def line(self) -> str:
        rate = self.cases / self.elapsed if self.elapsed > 0 else 0.0
        by_sig = ", ".join(f"{f.failure.signature} x{f.hits}" for f in self.found.values()) or "none"
        return (
            f"[{_clock(self.elapsed)} / {_clock(self.budget)}] cases {self.cases} ({rate:.1f}/s) "
            f"restarts {self.restarts} failures: {by_sig}"
        )

    def summary(self, *, seed: int, backend: str, world_size: int, pools: int = 1) -> dict[str, Any]:
        """The campaign as plain data (schema 1), for summary.json and the HTML report."""
        return {
            "schema": 1,
            "seed": seed,
            "started_at": self.started_at,
            "seconds": round(self.elapsed, 2),
            "budget": self.budget,
            "cases": self.cases,
            "interrupted": self.interrupted,
            "restarts": self.restarts,
            "backend": backend,
            "world_size": world_size,
            "pools": pools,
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
                    "in_corpus": f.in_corpus,
                    "summary": f.failure.summary,
                    "entry": str(f.path) if f.path else None,
                    "first_seen": round(f.first_seen, 2),
                }
                for f in self.found.values()
            ],
            "timeline": self.timeline,
            "weights": {k: round(v, 4) for k, v in self.weights.items()},
        }


def _clock(seconds: float) -> str:
    if math.isinf(seconds):
        return "inf"
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class _Failed(Exception):
    """Raised inside the Hypothesis test so that it shrinks the case."""


class _BudgetSpent(BaseException):
    """Ends a chunk at once. Not an Exception, so Hypothesis passes it through unshrunk."""


def run_case(pool: RankPool, prop: Property, case: Case) -> Failure | None:
    """Run one case on the pool and judge it: the single step pytest and the CLI share."""
    return prop.judge(case, pool.run(case, stall=prop.stall))


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
) -> Progress:
    """Explore ``properties`` on ``pool`` for ``budget`` seconds; returns what was seen.

    ``database``: a Hypothesis example database that failures are saved to and replayed from
    (each property's first chunk replays it first); None for none.

    Ctrl-C (KeyboardInterrupt) ends the campaign early; what was found is kept and saved.
    """
    progress = Progress(started=time.monotonic(), budget=budget)
    progress._sample_every = max(1.0, budget / TIMELINE_POINTS) if math.isfinite(budget) else 1.0
    progress.sample(force=True)
    corpus_entries = CorpusIndex(load_corpus(corpus)[0] if corpus is not None else [])
    rng = random.Random(seed)
    by_name = {p.name: p for p in properties}
    scheduler = Scheduler(by_name, rng)
    discoveries = Discoveries()
    hard_stop = budget + max(60.0, SHRINK_OVERRUN * budget)
    replayed: set[str] = set()

    def spent() -> bool:
        raise_if_stopped()
        return progress.elapsed >= budget or (max_examples is not None and progress.cases >= max_examples)

    try:
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
                budget,
                hard_stop,
                on_case,
                database=database,
                reuse=reuse,
                discoveries=discoveries,
            )
            for found in pending:
                _confirm_and_save(pool, prop, found, progress, corpus, reruns)
            scheduler.record(
                prop.name,
                seconds=time.monotonic() - started,
                discoveries=discoveries.total - behaviours + len(progress.found) - signatures,
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
                entry = entry_from_failure(
                    found.case,
                    found.failure,
                    versions=pool.versions,
                    backend=pool.backend,
                    device_kind=_device_kind(pool),
                    reruns=0,
                    reproduced=0,
                )
                found.path, found.entry = save_entry(corpus, entry)
    progress.interrupted = progress.interrupted or stop_requested()
    clear_stop()
    progress.restarts = pool.restarts
    progress.weights = scheduler.weights()
    progress.sample(force=True)
    return progress


def _run_chunk(
    pool: RankPool,
    prop: Property,
    n: int,
    chunk_seed: int,
    progress: Progress,
    corpus_entries: CorpusIndex,
    budget: float,
    hard_stop: float,
    on_case: Callable[[Progress], None] | None,
    *,
    database: ExampleDatabase | None = None,
    reuse: bool = False,
    discoveries: Discoveries | None = None,
) -> list[Found]:
    """Run up to ``n`` examples of ``prop``; returns the failures new to this campaign and corpus.

    With ``reuse``, the failures saved in ``database`` for this property run first.
    ``discoveries`` records each case's features.
    """
    new: dict[str, Found] = {}
    shrinking = False
    phases = (Phase.reuse, Phase.generate, Phase.shrink) if reuse else (Phase.generate, Phase.shrink)

    @settings(
        max_examples=n,
        deadline=None,
        database=database,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        verbosity=Verbosity.quiet,
    )
    @hypothesis_seed(chunk_seed)
    @given(prop.cases(world_size=pool.world_size))
    def test(case: Case) -> None:
        nonlocal shrinking
        raise_if_stopped()
        if progress.elapsed >= (hard_stop if shrinking else budget):
            raise _BudgetSpent
        features = prop.features(case)
        per_property = progress.features_per_property.setdefault(prop.name, Counter())
        for feature in features:
            event(feature)
            progress.features[feature] += 1
            per_property[feature] += 1
        if discoveries is not None:
            discoveries.add(prop.name, features)
        start = time.monotonic()
        failure = run_case(pool, prop, case)
        progress.cases += 1
        progress.per_property[prop.name] += 1
        progress.seconds_per_property[prop.name] = (
            progress.seconds_per_property.get(prop.name, 0.0) + time.monotonic() - start
        )
        progress.restarts = pool.restarts
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
        hit = corpus_entries.match(sig) if sig not in new else None
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
                in_corpus=not known,
            )
            return
        if seen is None:
            progress.found[sig] = new[sig] = Found(case, failure, first_seen=progress.elapsed)
        else:
            seen.hits += 1
            # Hypothesis only moves to cases it judges smaller, and replays its final, minimal
            # case last: the latest failing case of a signature is the one to keep.
            seen.case, seen.failure = case, failure
        shrinking = True
        raise _Failed(sig)

    if database is not None:
        use_database_key(test, database_key(prop.name, pool.world_size))
    try:
        test()
    except (_Failed, Flaky, _BudgetSpent):
        pass
    except HypothesisException:
        pass  # e.g. Unsatisfiable when the budget ran out before any example ran
    return list(new.values())


def _confirm_and_save(
    pool: RankPool, prop: Property, found: Found, progress: Progress, corpus: Path | None, reruns: int
) -> None:
    reproduced = 0
    for _ in range(reruns):
        raise_if_stopped()
        failure = run_case(pool, prop, found.case)
        if failure is not None and failure.signature == found.failure.signature:
            reproduced += 1
    entry = entry_from_failure(
        found.case,
        found.failure,
        versions=pool.versions,
        backend=pool.backend,
        device_kind=_device_kind(pool),
        reruns=reruns,
        reproduced=reproduced,
    )
    found.entry = entry
    if corpus is not None:
        found.path, found.entry = save_entry(corpus, entry)


def _device_kind(pool: RankPool) -> str:
    return pool.versions.get("device", pool.backend)
