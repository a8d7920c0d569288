"""pytest plugin (registered through the ``pytest11`` entry point): a rank pool for tests.

Options: ``--shardfuzz-backend`` (gloo | nccl), ``--shardfuzz-world-size``,
``--shardfuzz-deadline`` and ``--shardfuzz-corpus`` (a corpus whose ``known`` entries are
expected failures, beside the suite's own known torch bugs, which are always expected).
Fixtures: ``rank_pool`` (one pool per session, per xdist worker) and ``check_case`` (run a
case on it and fail the test with every rank's account if the property does not hold).
A user's own model: ``user_cases(factory)`` (a module-level function returning ``(model,
batch_fn, loss_fn)``, or its spec ``"FILE.py:NAME"``) draws cases of the ``user_parity`` and
``user_state`` properties over it, composable with the suite's strategies; ``check_case`` runs
them (docs/user_models.md)::

    from fuzz.pytest_plugin import user_cases

    @given(user_cases(my_model))
    def test_my_model(check_case, case):
        check_case(case)

Hypothesis profiles: ``ci`` (derandomized, no deadline, no database), ``dev`` (the default
outside CI) and ``overnight``; ``--hypothesis-profile`` picks one, otherwise ``ci`` is loaded
when the CI environment variable is set.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, currently_in_test_context, event, settings

from fuzz.model import Case, case_to_text

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    database=None,
    # 20 keeps a 2-core CI run of the whole suite under 20 minutes as the suite grows (25 took
    # 19 minutes before the reduction-in-the-pool and resharding tests); campaigns go deeper.
    max_examples=20,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "overnight",
    deadline=None,
    max_examples=5000,
    phases=tuple(Phase),
    suppress_health_check=[HealthCheck.too_slow],
)


def user_cases(model: Any, *, world_size: int = 2, max_steps: int = 3, max_units: int = 4) -> Any:
    """Cases over a user's model (:func:`strategies._user.user_cases`): ``model`` is a factory
    (module-level, returning ``(model, batch_fn, loss_fn)``) or its spec; checked and described
    at once (InvalidArgument naming what is wrong). ``world_size`` must be the pool's
    (``--shardfuzz-world-size``)."""
    from strategies._user import user_cases as cases

    return cases(model, world_size=world_size, max_steps=max_steps, max_units=max_units)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("shardfuzz")
    group.addoption("--shardfuzz-backend", choices=("gloo", "nccl"), default="gloo", help="backend of the test pool")
    group.addoption("--shardfuzz-world-size", type=int, default=2, help="ranks in the test pool (default 2)")
    group.addoption("--shardfuzz-deadline", type=float, default=60.0, help="seconds per case before a hang")
    group.addoption(
        "--shardfuzz-corpus",
        default=None,
        help="corpus directory (relative to the rootdir) whose 'known' entries are expected failures, beside the "
        "suite's own known torch bugs; default: the rootdir's corpus/ if there is one",
    )


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("hypothesis_profile", default=None):
        settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(scope="session")
def rank_pool(request: pytest.FixtureRequest) -> Iterator[Any]:
    from fuzz.pool import RankPool

    pool = RankPool(
        world_size=request.config.getoption("shardfuzz_world_size"),
        backend=request.config.getoption("shardfuzz_backend"),
        deadline=request.config.getoption("shardfuzz_deadline"),
    )
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def known_signatures(request: pytest.FixtureRequest) -> Mapping[str, str]:
    """Signatures of the corpus entries marked ``known`` (torch bugs), with their upstream issue;
    a lookup also takes a signature of the same bug met another way (fuzz.corpus.KnownBugs)."""
    from fuzz.corpus import KnownBugs, builtin_corpus, load_corpus

    entries = []
    own = builtin_corpus()
    if own is not None:
        entries += load_corpus(own)[0]
    given = request.config.getoption("shardfuzz_corpus")
    corpus = request.config.rootpath / (given or "corpus")
    if given and not corpus.is_dir():
        raise pytest.UsageError(f"--shardfuzz-corpus {given}: {corpus} is not a directory")
    if corpus.is_dir() and (own is None or corpus.resolve() != own.resolve()):
        entries += load_corpus(corpus)[0]
    return KnownBugs(entries)


class HistoryDependentCrash(UserWarning):
    """A rank died on a case that passed when run again at once on fresh ranks."""


@pytest.fixture(scope="session")
def check_case(rank_pool: Any, known_signatures: Mapping[str, str]) -> Callable[[Case], None]:
    """Run a case on the pool and fail, with every rank's account, if its property fails.

    A failure whose signature is a known torch bug in the corpus is expected: it is recorded
    as a Hypothesis event, and its own corpus entry is the (strict xfail) regression test.
    See :func:`make_checker` for crashes that the case does not repeat.
    """
    return make_checker(rank_pool, known_signatures)


def make_checker(pool: Any, known_signatures: Mapping[str, str]) -> Callable[[Case], None]:
    """``check_case``'s body, over any pool.

    A crash (a rank killed by a signal) is run again at once, on the fresh ranks the pool has
    respawned. If the case then passes, the crash depended on what the dead rank's process had
    run before (the session pool runs hundreds of cases per process), not on this case, and a
    test of this case cannot stand for it: it is reported as a ``HistoryDependentCrash``
    warning with every rank's account, which pytest lists in its summary, and the test goes
    on. A crash that repeats fails the test. Campaigns treat such crashes differently: they
    re-run every failure and save it as a ``flaky`` corpus entry (docs/corpus.md)."""
    from fuzz.explore import run_case
    from fuzz.properties import get_property

    def check(case: Case) -> None:
        prop = get_property(case.property)
        if currently_in_test_context():
            for feature in prop.features(case):
                event(feature)
        failure = run_case(pool, prop, case)
        if failure is not None and failure.kind == "crash" and failure.signature not in known_signatures:
            again = run_case(pool, prop, case)
            if again is None:
                warnings.warn(
                    HistoryDependentCrash(
                        f"{failure.signature}\n{failure.summary}\nThe case passed when run again on fresh ranks.\n"
                        f"case: {case_to_text(case)}\n{_describe(failure.details)}"
                    ),
                    stacklevel=2,
                )
                if currently_in_test_context():
                    event(f"history-dependent crash: {failure.signature}")
                return
        upstream = None if failure is None else _explain(known_signatures, failure.signature, case, failure.kind)
        if failure is not None and upstream is not None:
            if currently_in_test_context():
                event(f"known torch bug {upstream}: {failure.signature}")
            return
        if failure is not None:
            raise AssertionError(
                f"{failure.signature}\n{failure.summary}\ncase: {case_to_text(case)}\n{_describe(failure.details)}"
            )

    return check


def _explain(known: Mapping[str, str], signature: str, case: Case, kind: str) -> str | None:
    """The upstream issue of the known bug a failure is (fuzz.corpus.KnownBugs.explain), or None;
    a plain mapping of signatures (a test's own) is looked up by signature alone."""
    explain = getattr(known, "explain", None)
    if explain is not None:
        result: str | None = explain(signature, case, kind)
        return result
    return known.get(signature)


def _describe(details: dict[str, Any]) -> str:
    ranks = details.get("ranks")
    if not ranks:
        return ""
    out = []
    for r in ranks:
        out.append(f"--- rank {r['rank']}: {r['status']}")
        for key in ("traceback", "stack", "output_tail"):
            if r.get(key):
                out.append(r[key])
    return "\n".join(out)
