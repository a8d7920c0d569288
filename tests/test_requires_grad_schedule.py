"""requires_grad schedules carried through state dicts, DCP and resuming: leaves frozen after
training and unfrozen later (``fuzz.model.RequiresGrad``), before or after the state is taken.

The source trains on its schedule; the target is built fresh, its optimizer over the same
parameters, the changes made before the save replayed, the state loaded, and both train on
under the rest of the schedule. The existing oracles judge it (the whole optimizer state
compared exactly after the load, losses and parameters after resuming), plus the load's
documented contract that it keeps every parameter's requires_grad. Each oracle is shown able to
fail on a tampered observation.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz import known
from fuzz.errors import CaseError
from fuzz.model import (
    Api,
    Case,
    Composition,
    DcpBody,
    DcpItem,
    Options,
    RequiresGrad,
    StateDictBody,
    Wrapper,
    case_from_json,
    case_to_json,
    trained_then_frozen,
)
from fuzz.pool import RankPool
from fuzz.properties.state_dict import features_dcp, features_state_dict, judge_dcp, judge_state_dict
from fuzz.verdict import Outcome
from strategies import dcp_cases, state_dict_cases
from tests.test_dcp_options import FROZEN_TREE
from tests.test_state_dict import ADAM, SGD, TREE, fsdp

#: 3 steps, the save, 2 more. Leaf "0" frozen before any step (no optimizer state) and unfrozen
#: after the save; "1.0" frozen after the save; "2" frozen for step 1 only.
SCHEDULE = (
    RequiresGrad(path="0", step=0, trainable=False),
    RequiresGrad(path="0", step=4, trainable=True),
    RequiresGrad(path="1.0", step=3, trainable=False),
    RequiresGrad(path="2", step=1, trainable=False),
    RequiresGrad(path="2", step=2, trainable=True),
)
#: Leaf "0" trains on step 0, is frozen before step 1 and so when the state is taken, and is
#: unfrozen after the load: set_optimizer_state_dict drops its saved state (a known torch bug).
TRAINED_THEN_FROZEN = (
    RequiresGrad(path="0", step=1, trainable=False),
    RequiresGrad(path="0", step=4, trainable=True),
)
SCHEDULED_ADAM = dataclasses.replace(ADAM, steps=3)


def _state_dict(**kw: Any) -> StateDictBody:
    base: dict[str, Any] = {
        "tree": TREE,
        "source": fsdp("1"),
        "target": fsdp("0", "2"),
        "training": SCHEDULED_ADAM,
        "steps_after": 2,
        "requires_grad": SCHEDULE,
    }
    return StateDictBody(**{**base, **kw})


def _dcp(**kw: Any) -> DcpBody:
    base: dict[str, Any] = {
        "tree": TREE,
        "source": fsdp("1"),
        "target": Composition(),
        "entries": (DcpItem.MODEL, DcpItem.OPTIMIZER),
        "training": SCHEDULED_ADAM,
        "steps_after": 2,
        "requires_grad": SCHEDULE,
    }
    return DcpBody(**{**base, **kw})


def _two_ranks(pool: RankPool) -> RankPool:
    if pool.world_size != 2:
        pytest.skip("hand-built cases for 2 ranks")
    return pool


def _tampered(outcome: Outcome, change: Any) -> Outcome:
    ranks = [dataclasses.replace(r, observation=copy.deepcopy(r.observation)) for r in outcome.ranks]
    tampered = dataclasses.replace(outcome, ranks=ranks)
    change(tampered.observations)
    return tampered


def test_rules() -> None:
    body = _state_dict()
    assert case_from_json(case_to_json(Case("state_dict", 2, 1, body))).body == body
    with pytest.raises(CaseError, match="already"):
        _state_dict(requires_grad=(RequiresGrad("0", 1, True),))  # trainable already
    with pytest.raises(CaseError, match="outside"):
        _state_dict(requires_grad=(RequiresGrad("0", 5, False),))  # 3 + 2 steps: 0..4
    with pytest.raises(CaseError, match="no leaf"):
        _state_dict(requires_grad=(RequiresGrad("1.1", 1, False),))  # a Tanh
    with pytest.raises(CaseError, match="plain and fully_shard"):
        _state_dict(target=Composition(wrapper=Wrapper.DDP))
    with pytest.raises(CaseError, match="set_to_none"):
        _state_dict(training=dataclasses.replace(SCHEDULED_ADAM, set_to_none=False))
    every = tuple(RequiresGrad(p, 1, False) for p in ("0", "1.0", "1.2", "2"))
    # TREE's block "1" has a scale parameter: a step still trains something
    _state_dict(requires_grad=every)
    with pytest.raises(CaseError, match="ignore_frozen_params"):
        _state_dict(
            api=Api.SPLIT,
            save=Options(ignore_frozen_params=True),
            load=Options(strict=False),
        )


@pytest.mark.parametrize("kind", ["state_dict", "dcp"])
def test_scheduled_round_trip_passes_and_its_oracles_can_fail(rank_pool: RankPool, kind: str) -> None:
    pool = _two_ranks(rank_pool)
    body = _state_dict() if kind == "state_dict" else _dcp()
    judge = judge_state_dict if kind == "state_dict" else judge_dcp
    case = Case(kind, 2, 5, body)
    outcome = pool.run(case)
    assert outcome.ok, outcome.describe()
    assert judge(case, outcome) is None
    first = outcome.observations[0]
    # leaf "0" was frozen when the state was taken; the load kept that
    assert first["requires_grad"]["after"]["0.weight"] is False
    assert first["requires_grad"]["after"]["1.0.weight"] is True
    # "0" never trained before the save; "2" did, and came back with its Adam state
    assert "0.weight" not in first["saved"]["optimizer"] and "2.weight" in first["loaded"]["optimizer"]
    # unfrozen after the load, "0" trained on both runs
    assert first["final_target"]["0.weight"] == first["final_source"]["0.weight"]

    def flip(obs: list[dict[str, Any]]) -> None:
        obs[1]["requires_grad"]["after"]["0.weight"] = True

    failure = judge(case, _tampered(outcome, flip))
    assert failure is not None and failure.details["check"] == "requires_grad"

    def resumed_wrong(obs: list[dict[str, Any]]) -> None:
        obs[0]["final_target"]["0.weight"][0] += 1.0

    failure = judge(case, _tampered(outcome, resumed_wrong))
    assert failure is not None and failure.details["check"] == "resume_params"


@pytest.mark.parametrize("kind", ["state_dict", "dcp"])
def test_trained_then_frozen_state_is_the_known_bug(rank_pool: RankPool, kind: str) -> None:
    """A parameter trained, frozen when the state is taken: set_optimizer_state_dict leaves its
    saved momentum out (pytorch/pytorch#192202); the failure is named by the known bug."""
    pool = _two_ranks(rank_pool)
    training = dataclasses.replace(SGD, steps=3)
    body = (_state_dict if kind == "state_dict" else _dcp)(training=training, requires_grad=TRAINED_THEN_FROZEN)
    assert known.frozen_state_dropped(body) and trained_then_frozen(body) == ["0"]
    assert known.FROZEN_OPTIM_STATE_DROPPED in known.bugs_met(Case(kind, 2, 9, body))
    case = Case(kind, 2, 9, body)
    outcome = pool.run(case)
    assert outcome.ok, outcome.describe()
    first = outcome.observations[0]
    assert "momentum_buffer" in first["saved"]["optimizer"]["0.weight"]
    failure = (judge_state_dict if kind == "state_dict" else judge_dcp)(case, outcome)
    if "0.weight" in first["loaded"]["optimizer"]:
        pytest.xfail("this torch keeps a frozen parameter's optimizer state: the known bug is fixed here")
    assert failure is not None and failure.details["check"] == "optimizer"
    assert failure.signature == f"mismatch:{kind}@set_optimizer_state_dict:frozen-optimizer-state-dropped"
    # the same case without the stateful optimizer meets no known bug
    assert not known.frozen_state_dropped(dataclasses.replace(body, training=dataclasses.replace(training, momentum=0)))


def test_frozen_state_is_compared_exactly(rank_pool: RankPool) -> None:
    """A parameter trained and frozen between steps keeps its momentum; tampering with the loaded
    momentum fails the optimizer check."""
    pool = _two_ranks(rank_pool)
    body = _state_dict(training=dataclasses.replace(SGD, steps=3))
    case = Case("state_dict", 2, 9, body)
    outcome = pool.run(case)
    assert outcome.ok, outcome.describe()
    assert judge_state_dict(case, outcome) is None

    def wrong(obs: list[dict[str, Any]]) -> None:
        obs[0]["loaded"]["optimizer"]["2.weight"]["momentum_buffer"][0] += 0.5

    failure = judge_state_dict(case, _tampered(outcome, wrong))
    assert failure is not None and failure.details["check"] == "optimizer"


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_strategies_draw_schedules(data: st.DataObject) -> None:
    """Every drawn schedule is valid (the body was built) and round-trips through JSON."""
    name = data.draw(st.sampled_from(["state_dict", "dcp"]))
    case = data.draw(state_dict_cases(world_size=2) if name == "state_dict" else dcp_cases(world_size=2))
    if case.body.requires_grad:
        assert case_from_json(case_to_json(case)) == case
        features = features_state_dict(case) if name == "state_dict" else features_dcp(case)
        assert any(f.startswith("requires_grad:") for f in features)


def test_strategies_reach_freeze_and_unfreeze_around_the_save() -> None:
    """On a body that can take a schedule, the strategy reaches freezes and unfreezes before and
    after the save, and keeps the known bug's schedules (trained, then frozen at the load)."""
    from hypothesis import find

    from strategies._state_dict import _requires_grad_schedule

    base = _dcp(requires_grad=(), frozen_in_optimizer=True, tree=FROZEN_TREE, source=fsdp("2"))
    schedules = st.composite(lambda draw: _requires_grad_schedule(draw, base))()
    fast = settings(max_examples=2000, database=None, suppress_health_check=list(HealthCheck))
    for trainable in (False, True):
        for before in (False, True):
            find(
                schedules,
                lambda b, on=trainable, early=before: any(
                    c.trainable is on and (c.step < b.training.steps) is early for c in b.requires_grad
                ),
                settings=fast,
            )
    find(schedules, known.frozen_state_dropped, settings=fast)
