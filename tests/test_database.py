"""The Hypothesis example database: a campaign's failures are replayed first by the next campaign
and by pytest tests that share the property's key (fuzz/database.py)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fuzz.corpus import CorpusIndex
from fuzz.database import campaign_examples, database_key, example_database, use_database_key
from fuzz.errors import InvalidArgument
from fuzz.explore import Clock, Progress, _run_chunk, explore
from fuzz.model import Case
from fuzz.pool import Outcome, RankPool
from fuzz.properties import get_property
from fuzz.verdict import OutcomeKind, RankReport
from tests.conftest import fault_pool, mutant_env, run_cli


class _Recording:
    """A pool that remembers every case it ran, in order (explore only calls ``run``)."""

    def __init__(self, pool: RankPool) -> None:
        self.pool = pool
        self.cases: list[Case] = []

    def run(self, case: Case, **kwargs: Any) -> Outcome:
        self.cases.append(case)
        return self.pool.run(case, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)


class _Stop(Exception):
    pass


def _first_case_drawn(db: Any, key: bytes) -> Case | None:
    """The first case a pytest-style test (``data.draw`` of the property strategy) replays from
    ``db`` under ``key``. The test fails on it, so Hypothesis keeps (does not prune) what it replayed."""
    seen: list[Case] = []

    @settings(
        database=db, phases=(Phase.reuse,), max_examples=1, derandomize=False, suppress_health_check=list(HealthCheck)
    )
    @given(data=st.data())
    def test(data: Any) -> None:
        seen.append(data.draw(get_property("parity").cases(world_size=2)))
        raise _Stop

    use_database_key(test, key)
    with contextlib.suppress(_Stop):
        test()
    return seen[0] if seen else None


def test_a_failure_saved_by_one_campaign_is_the_first_case_of_the_next(tmp_path: Path) -> None:
    prop = get_property("parity")
    db = example_database(tmp_path / "db")
    key = database_key("parity", 2)
    with fault_pool(mutant_env("P01_shard_dim_chunk"), world_size=2, deadline=30) as pool:
        first = _Recording(pool)
        found = explore(first, [prop], budget=60, max_examples=100, seed=3, database=db, reruns=0)
        assert found.new_failures, "the P01 fault was not found; the test needs a failure to save"
        saved = _first_case_drawn(db, key)
        assert saved is not None, f"campaign 1 saved nothing under {key!r}"
        assert saved in first.cases, "the saved example is not a case campaign 1 ran"
        assert prop.judge(saved, pool.run(saved)) is not None, "the saved example does not fail"

        second = _Recording(pool)
        explore(second, [prop], budget=60, max_examples=1, seed=2, database=db, reruns=0)
        control = _Recording(pool)
        explore(control, [prop], budget=60, max_examples=1, seed=2, database=None, reruns=0)
    assert second.cases[0] == saved
    assert control.cases[0] != saved, "without the database the same seed starts elsewhere"


class _FailsFirst:
    """A pool without ranks: the first case it runs fails (an exception on rank 0), any other passes."""

    world_size, backend, deadline, restarts, recycled = 2, "gloo", 30.0, 0, 0

    def __init__(self) -> None:
        self.cases: list[Case] = []

    def wait_ready(self, timeout: float) -> bool:
        return True

    def run(self, case: Case, **kwargs: Any) -> Outcome:
        self.cases.append(case)
        failing = len(self.cases) == 1
        ranks = (
            RankReport(rank=0, exc_type="builtins.RuntimeError", message="boom", traceback="...")
            if failing
            else RankReport(rank=0, observation={}),
            RankReport(rank=1, observation={}),
        )
        return Outcome(kind=OutcomeKind.EXCEPTION if failing else OutcomeKind.OK, ranks=ranks, seconds=0.0)


def test_a_case_the_budget_stops_is_not_saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hypothesis saves the choices of a test stopped by any exception but KeyboardInterrupt. A
    case the campaign's clock stops before it runs (the budget spent, or a shrink's allowance) is
    no failure: the next campaign must replay the failures, not a case that never ran."""
    prop, db, key = get_property("parity"), example_database(tmp_path / "db"), database_key("parity", 2)

    def chunk(pool: _FailsFirst, budget: float) -> list[Any]:
        progress = Progress(started=time.monotonic(), budget=budget)
        clock = Clock(started=progress.started, budget=budget)
        return _run_chunk(pool, prop, 50, 3, progress, CorpusIndex([]), clock, 0, None, database=db)  # type: ignore[arg-type]

    pool = _FailsFirst()
    assert chunk(pool, budget=0.0) == [] and pool.cases == []
    assert not list(db.fetch(key)), "a case that never ran was saved"

    monkeypatch.setattr(Clock, "shrink_allowance", lambda self: 0.0)  # the shrink stops at its first step
    found = chunk(pool, budget=60.0)
    assert [f.unfinished for f in found] == [["not fully shrunk: the campaign's time for its shrink ran out"]]
    assert len(pool.cases) == 1, "the shrink ran a case after its time was spent"
    assert len(list(db.fetch(key))) == 1
    assert _first_case_drawn(db, key) == pool.cases[0]


def _save_a_failure(db: Any, key: bytes) -> Case:
    """Shrink a made-up failure (a wide tree with two fully_shard calls) into ``db`` under ``key``,
    the way a campaign chunk does; returns the shrunk case. Not the first case Hypothesis would
    generate, so replaying it is observable."""
    failing: list[Case] = []

    @settings(database=db, max_examples=200, phases=(Phase.generate, Phase.shrink), derandomize=False)
    @given(get_property("parity").cases(world_size=2))
    def campaign_like(case: Case) -> None:
        if case.body.tree.width >= 5 and len(case.body.composition.shards) >= 2:  # type: ignore[attr-defined]
            failing.append(case)
            raise _Stop

    use_database_key(campaign_like, key)
    with pytest.raises(_Stop):
        campaign_like()
    return failing[-1]


def test_a_pytest_style_test_with_the_property_key_replays_a_saved_failure_first(tmp_path: Path) -> None:
    """No pool needed: a failure saved by one @given test under the shared key is the first case of
    another, differently written one (strategy argument vs data.draw), as between explore and pytest."""
    db = example_database(tmp_path / "db")
    shrunk = _save_a_failure(db, database_key("parity", 2))
    assert _first_case_drawn(db, database_key("parity", 2)) == shrunk
    assert not list(db.fetch(database_key("parity", 4))), "another world size shares the key"


def test_campaign_examples_follows_the_profile(tmp_path: Path) -> None:
    """With a database in the profile the decorator points the test at the shared directory; under
    a profile without one (ci) it sets only the key, so nothing is replayed."""
    db = example_database(tmp_path / "db")
    key = database_key("parity", 2)
    shrunk = _save_a_failure(db, key)
    settings.register_profile("_shardfuzz_restore", parent=settings.default)
    try:
        for profile, expect_replay in (("_with_db", True), ("_without_db", False)):
            settings.register_profile(
                profile,
                database=example_database(tmp_path / "unused") if expect_replay else None,
                derandomize=False,
                max_examples=1,
                phases=(Phase.reuse, Phase.generate),
                suppress_health_check=list(HealthCheck),
            )
            settings.load_profile(profile)
            assert (_first_case_of_a_decorated_test(tmp_path / "db") == shrunk) is expect_replay, profile
    finally:
        settings.load_profile("_shardfuzz_restore")


def _first_case_of_a_decorated_test(directory: Path) -> Case:
    """Defined under the profile loaded now, as pytest defines test functions at import."""
    seen: list[Case] = []

    @campaign_examples("parity", world_size=2, directory=directory)
    @given(data=st.data())
    def test(data: Any) -> None:
        seen.append(data.draw(get_property("parity").cases(world_size=2)))
        raise _Stop

    with pytest.raises(_Stop):
        test()
    return seen[0]


def test_keys_differ_by_property_and_world_size() -> None:
    keys = {database_key(p, w) for p in ("parity", "metamorphic") for w in (2, 4)}
    assert len(keys) == 4


@pytest.mark.parametrize(("name", "world_size"), [("", 2), ("parity", 0), ("parity", True)])
def test_bad_key_arguments_are_named(name: str, world_size: Any) -> None:
    with pytest.raises(InvalidArgument, match=repr(world_size)):
        database_key(name, world_size)


def test_use_database_key_needs_a_hypothesis_test() -> None:
    def plain() -> None:
        pass

    with pytest.raises(InvalidArgument, match="plain"):
        use_database_key(plain, b"k")


def test_a_file_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises(InvalidArgument, match="not a directory"):
        example_database(path)
    result = run_cli("explore", "--budget", "1", "--database", str(path), "--corpus", str(tmp_path / "c"))
    assert result.returncode == 2
    assert str(path) in result.stderr
