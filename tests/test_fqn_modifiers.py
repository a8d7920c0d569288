"""Fused modules (a leaf held under a child its state dict hides) through get/set_*_state_dict,
with the method that says so under torch's default name or the one
``StateDictOptions(dsd_fqn_modifiers=...)`` gives.

The rules and the module itself are checked here without ranks; hand-built cases on the pool
show a fused model's state round-trips and is judged (the keys get_model_state_dict returns,
every value after the load), that the added check can fail, that each of the three torch bugs
found this way is met where its condition says and named by it, and that the strategies draw
fused leaves.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from torch import nn

from fuzz import known
from fuzz._rank.compose import clean_name
from fuzz._rank.models import FUSED_CHILD, FusedLeaf, fuse
from fuzz.errors import CaseError
from fuzz.model import (
    CUSTOM_FQN_MODIFIERS,
    DEFAULT_FQN_MODIFIERS,
    Api,
    Block,
    Case,
    Composition,
    Dtype,
    Leaf,
    LeafKind,
    ModuleTree,
    Optimizer,
    Options,
    ShardSpec,
    StateDictBody,
    Training,
    Wrapper,
)
from fuzz.pool import RankPool
from fuzz.properties.state_dict import features_state_dict, judge_state_dict
from strategies import state_dict_cases
from tests.conftest import fault_env, fault_pool
from tests.test_dcp_options import _run, _tampered

#: Leaf "0" trains, leaf "1.0" is frozen in the tree (the optimizer does not hold it).
TREE = ModuleTree(
    width=3,
    root=Block(
        children=(
            Leaf(LeafKind.LINEAR),
            Block(children=(Leaf(LeafKind.LINEAR, frozen=True), Leaf(LeafKind.TANH)), scale=True),
            Leaf(LeafKind.LAYER_NORM),
        ),
        buffer=True,
    ),
)
ADAM = Training(optimizer=Optimizer.ADAM, lr=0.05, dtype=Dtype.FLOAT64, steps=2)
FSDP = Composition(shards=(ShardSpec("1.0"), ShardSpec("")))


def _body(**changes: Any) -> StateDictBody:
    fields: dict[str, Any] = {
        "tree": TREE,
        "source": Composition(),
        "target": FSDP,
        "training": ADAM,
        "api": Api.SPLIT,
        "save": Options(full_state_dict=True),
        "load": Options(full_state_dict=True),
        "fused": ("1.0",),
    }
    return StateDictBody(**{**fields, **changes})


# ------------------------------------------------------------------------------ rules, module


def test_rules_refuse_what_a_fused_leaf_cannot_be() -> None:
    with pytest.raises(CaseError, match="not a parameter leaf"):
        _body(fused=("1.1",))  # the tanh
    with pytest.raises(CaseError, match="not a parameter leaf"):
        _body(fused=("1",))  # a block
    with pytest.raises(CaseError, match="distinct and sorted"):
        _body(fused=("1.0", "0"))
    with pytest.raises(CaseError, match="FSDP1"):
        _body(target=Composition(wrapper=Wrapper.FSDP1_FULL_SHARD))
    with pytest.raises(CaseError, match="needs fused leaves"):
        _body(fused=(), fqn_modifiers=CUSTOM_FQN_MODIFIERS)
    with pytest.raises(CaseError, match="is not one of"):
        _body(fqn_modifiers="other")
    with pytest.raises(CaseError, match="own parameters"):
        _body(target=Composition(shards=(ShardSpec("1", ignored=("1.0",)), ShardSpec(""))))
    assert _body().fused == ("1.0",)  # and the default needs no option


def test_a_fused_leaf_hides_its_child_from_the_state_dict_and_keeps_its_values() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.LayerNorm(2)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fuse(model, ("0", "1.0"), CUSTOM_FQN_MODIFIERS)
    assert isinstance(model[0], FusedLeaf)
    assert next(n for n, _ in model.named_parameters()) == f"0.{FUSED_CHILD}.weight"
    assert sorted(model.state_dict()) == sorted(before)  # the keys of the model before fusing
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert getattr(model[0], CUSTOM_FQN_MODIFIERS)() == {"weight": FUSED_CHILD, "bias": FUSED_CHILD}
    assert not hasattr(model[0], DEFAULT_FQN_MODIFIERS)  # only the name the case gives
    shifted = {k: v + 1 for k, v in before.items()}
    assert not model.load_state_dict(shifted).missing_keys
    assert torch.equal(model.get_parameter(f"0.{FUSED_CHILD}.weight"), shifted["0.weight"])
    assert clean_name(f"0.{FUSED_CHILD}.weight") == "0.weight"


def test_known_bug_conditions() -> None:
    trained = _body(fused=("0",))
    assert known.fused_in_optimizer(trained)
    assert not known.fused_in_optimizer(_body())  # a frozen leaf the optimizer does not hold
    assert known.fused_in_optimizer(_body(frozen_in_optimizer=True))
    custom = _body(fqn_modifiers=CUSTOM_FQN_MODIFIERS)
    assert known.fused_custom_name(custom)
    assert not known.fused_custom_name(_body())
    frozen = _body(
        save=Options(full_state_dict=True, ignore_frozen_params=True), load=Options(full_state_dict=True, strict=False)
    )
    assert known.fused_ignore_frozen(frozen) and not known.fused_ignore_frozen(_body())


# ----------------------------------------------------------------------------------- on ranks


@pytest.mark.parametrize(
    ("method", "api"),
    # get_model_state_dict with the other name meets known.FUSED_CUSTOM_NAME (tested below)
    [(DEFAULT_FQN_MODIFIERS, Api.SPLIT), (DEFAULT_FQN_MODIFIERS, Api.MODULE), (CUSTOM_FQN_MODIFIERS, Api.MODULE)],
)
def test_a_fused_frozen_leaf_round_trips(rank_pool: RankPool, check_case: Any, method: str, api: Api) -> None:
    """Plain to fully_shard (full state dicts) and fully_shard to fully_shard through FSDP2's own
    state_dict (sharded): the fused leaf's values come back, the keys taken are the model's."""
    if api is Api.MODULE:
        body = _body(source=FSDP, api=api, save=Options(), load=Options(), fqn_modifiers=method)
    else:
        body = _body(fqn_modifiers=method)
    case = Case("state_dict", rank_pool.world_size, 21, body)
    assert not known.bugs_met(case)
    check_case(case)
    outcome = _run(rank_pool, case)
    assert judge_state_dict(case, outcome) is None
    first = outcome.observations[0]
    assert "1.0.weight" in first["loaded"]["model"] and "1.0.fused.weight" not in first["loaded"]["model"]
    if api is Api.SPLIT:
        keys = first["model_keys"]
        assert keys["keys"] == keys["expected"] and "1.0.weight" in keys["keys"]
        # The added check can fail: a key the model's state dict does not have.
        bad = _tampered(outcome, lambda obs: obs[0]["model_keys"]["keys"].append("1.0.fused.weight"))
        failure = judge_state_dict(case, bad)
        assert failure is not None and failure.signature == "mismatch:state_dict:dsd_fqn_modifiers@split", failure
    feature = "fused" if method == DEFAULT_FQN_MODIFIERS else "fused:dsd_fqn_modifiers"
    assert feature in features_state_dict(case)


@pytest.mark.parametrize(
    ("bug", "changes", "signature"),
    [
        (
            known.FUSED_OPTIM_KEYS,
            {"fused": ("0",)},
            "exception:state_dict:builtins.RuntimeError@torch/distributed/checkpoint/state_dict.py:_split_optim_state_dict",
        ),
        (
            known.FUSED_CUSTOM_NAME,
            {"fqn_modifiers": CUSTOM_FQN_MODIFIERS},
            "exception:state_dict:builtins.AttributeError@torch/nn/modules/module.py:__getattr__",
        ),
        (
            known.FUSED_IGNORE_FROZEN,
            {
                "save": Options(full_state_dict=True, ignore_frozen_params=True),
                "load": Options(full_state_dict=True, strict=False),
            },
            "exception:state_dict:builtins.KeyError@torch/distributed/checkpoint/state_dict.py:_get_model_state_dict",
        ),
    ],
    ids=["optimizer-keys", "custom-name", "ignore-frozen"],
)
def test_each_known_bug_is_met_where_its_condition_says(
    rank_pool: RankPool, bug: known.KnownBug, changes: dict[str, Any], signature: str
) -> None:
    if not known.present(bug, torch.__version__):
        pytest.skip(f"{bug.id} is fixed in this torch")
    case = Case("state_dict", rank_pool.world_size, 22, _body(**changes))
    assert known.meets(case, bug)
    failure = judge_state_dict(case, rank_pool.run(case))
    assert failure is not None and failure.signature == signature, failure


def test_a_fault_that_stops_following_the_modifiers_is_caught() -> None:
    """tests/faults/K38: _get_fqns no longer follows a module's fqn modifiers."""
    env = fault_env("K38_fqn_modifiers_not_followed")
    case = Case("state_dict", 2, 21, _body())
    with fault_pool(env, world_size=2, deadline=30) as pool:
        failure = judge_state_dict(case, pool.run(case))
    assert not known.bugs_met(case)  # so the failure is the fault's, not a known bug's
    assert failure is not None and failure.kind == "exception", failure
    assert failure.signature.endswith("@torch/nn/modules/module.py:__getattr__"), failure


# --------------------------------------------------------------------------------- drawn


def test_fused_leaves_are_drawn_and_mostly_clear_of_the_known_bugs() -> None:
    """Fused leaves are drawn, and most distinct cases with them meet none of the three known
    bugs, so the model's side is judged."""
    fused: set[str] = set()
    clear: set[str] = set()

    @settings(
        max_examples=400,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(state_dict_cases(world_size=2))
    def collect(case: Case) -> None:
        body = case.body
        assert isinstance(body, StateDictBody)
        if body.fused:
            assert {"fused", "fused:dsd_fqn_modifiers"} & set(features_state_dict(case))
            fused.add(repr(case))
            if not any(b.id.startswith("dsd-fqn-modifiers") for b in known.bugs_met(case)):
                clear.add(repr(case))

    collect()
    assert len(fused) >= 8 and len(clear) >= len(fused) / 2, (len(fused), len(clear))
