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
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, Verbosity, event, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Flaky, HypothesisException

from fuzz.case import Case
from fuzz.corpus import Entry, entry_from_failure, load_corpus, save_entry
from fuzz.database import database_key, use_database_key
from fuzz.pool import RankPool
from fuzz.properties import Property
from fuzz.signature import Failure

CHUNK_EXAMPLES = 25
SHRINK_OVERRUN = 0.25  # of the budget, at least 60 s
RERUNS = 3


@dataclass
class Found:
    """One distinct failure of a campaign."""

    case: Case
    failure: Failure
    hits: int = 1
    known: bool = False
    entry: Entry | None = None
    path: Path | None = None


@dataclass
class Progress:
    started: float
    budget: float
    cases: int = 0
    per_property: Counter[str] = field(default_factory=Counter)
    seconds_per_property: dict[str, float] = field(default_factory=dict)
    features: Counter[str] = field(default_factory=Counter)
    found: dict[str, Found] = field(default_factory=dict)
    restarts: int = 0
    interrupted: bool = False

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
            f"[{self.elapsed:6.0f}s / {self.budget:.0f}s] cases {self.cases} ({rate:.1f}/s) "
            f"restarts {self.restarts} failures: {by_sig}"
        )


class _Failed(Exception):
    """Raised inside the Hypothesis test so that it shrinks the case."""


class _BudgetSpent(BaseException):
    """Ends a chunk at once. Not an Exception, so Hypothesis passes it through unshrunk."""


def run_case(pool: RankPool, prop: Property, case: Case) -> Failure | None:
    """Run one case on the pool and judge it: the single step pytest and the CLI share."""
    return prop.judge(case, pool.run(case))


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
    known: dict[str, Entry] = {}
    if corpus is not None:
        entries, _problems = load_corpus(corpus)
        known = {e.signature: e for _, e in entries if e.status == "known"}
    rng = random.Random(seed)
    hard_stop = budget + max(60.0, SHRINK_OVERRUN * budget)
    replayed: set[str] = set()
    try:
        while progress.elapsed < budget and (max_examples is None or progress.cases < max_examples):
            for prop in properties:
                if progress.elapsed >= budget or (max_examples is not None and progress.cases >= max_examples):
                    break
                chunk = CHUNK_EXAMPLES if max_examples is None else min(CHUNK_EXAMPLES, max_examples - progress.cases)
                reuse = database is not None and prop.name not in replayed
                replayed.add(prop.name)
                pending = _run_chunk(
                    pool,
                    prop,
                    chunk,
                    rng.getrandbits(64),
                    progress,
                    known,
                    budget,
                    hard_stop,
                    on_case,
                    database=database,
                    reuse=reuse,
                )
                for found in pending:
                    _confirm_and_save(pool, prop, found, progress, corpus, reruns)
    except KeyboardInterrupt:
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
    progress.restarts = pool.restarts
    return progress


def _run_chunk(
    pool: RankPool,
    prop: Property,
    n: int,
    chunk_seed: int,
    progress: Progress,
    known: dict[str, Entry],
    budget: float,
    hard_stop: float,
    on_case: Callable[[Progress], None] | None,
    *,
    database: ExampleDatabase | None = None,
    reuse: bool = False,
) -> list[Found]:
    """Run up to ``n`` examples of ``prop``; returns the failures new to this campaign.

    With ``reuse``, the failures saved in ``database`` for this property run first.
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
        if progress.elapsed >= (hard_stop if shrinking else budget):
            raise _BudgetSpent
        for feature in prop.features(case):
            event(feature)
            progress.features[feature] += 1
        start = time.monotonic()
        failure = run_case(pool, prop, case)
        progress.cases += 1
        progress.per_property[prop.name] += 1
        progress.seconds_per_property[prop.name] = (
            progress.seconds_per_property.get(prop.name, 0.0) + time.monotonic() - start
        )
        progress.restarts = pool.restarts
        if on_case is not None:
            on_case(progress)
        if failure is None:
            return
        sig = failure.signature
        seen = progress.found.get(sig)
        if seen is not None and sig not in new:
            seen.hits += 1  # found and shrunk earlier in this campaign: count it only
            return
        if sig in known and sig not in new:
            progress.found[sig] = Found(case, failure, known=True, entry=known[sig])
            return
        if seen is None:
            progress.found[sig] = new[sig] = Found(case, failure)
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
