"""fully_shard(ignored_params=...): the model's rule (Layout), the validity rules, and the
documented contract on real ranks ("They will not be sharded, nor moved to the device during
init, nor have their gradients reduced in backward")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fuzz.errors import CaseError
from fuzz.model import (
    Block,
    Case,
    Composition,
    Knobs,
    Layout,
    Leaf,
    LeafKind,
    ModuleTree,
    Optimizer,
    ParityBody,
    ShardSpec,
    Training,
    case_from_json,
    case_to_json,
    check_composition,
)
from fuzz.properties import get_property
from fuzz.properties.parity import features

TREE = ModuleTree(
    width=4,
    root=Block(
        children=(
            Leaf(LeafKind.LINEAR),
            Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.RELU), Leaf(LeafKind.LINEAR))),
            Leaf(LeafKind.LINEAR),
        ),
        scale=True,
    ),
)
TRAINING = Training(optimizer=Optimizer.SGD, lr=0.05, momentum=0.9, steps=2, batch_per_rank=2, grad_accum=2)
IGNORING = Composition(shards=(ShardSpec("1"), ShardSpec("", ignored=("0", ""))))


def test_ignored_modules_are_local_and_managed_by_no_unit() -> None:
    layout = Layout(TREE, IGNORING)
    assert sorted(layout.local()) == ["", "0"]
    assert layout.member_of("0") is None and layout.member_of("2") == ""
    root = next(u for u in layout.units if u.members == ("",))
    assert layout.owned_by(root) == ["2"]
    assert layout.unmanaged() == []  # local by design, not forgotten
    check_composition(TREE, IGNORING)


def test_rules_refuse_what_the_contract_does_not_decide() -> None:
    with pytest.raises(CaseError, match="not this fully_shard call's"):  # "1.0" belongs to fully_shard("1")
        check_composition(TREE, Composition(shards=(ShardSpec("1"), ShardSpec("", ignored=("1.0",)))))
    with pytest.raises(CaseError, match="no parameter to shard"):
        check_composition(TREE, Composition(shards=(ShardSpec("1"), ShardSpec("", ignored=("", "0", "2")))))
    with pytest.raises(CaseError, match="parameters of its own"):
        check_composition(TREE, Composition(shards=(ShardSpec("", ignored=("1.1",)),)))
    with pytest.raises(CaseError, match="knobs"):
        check_composition(TREE, replace(IGNORING, knobs=Knobs(forward_prefetch=1)))
    with pytest.raises(CaseError, match="replicate"):
        check_composition(TREE, Composition(shards=(ShardSpec("1", ignored=("1.0",)),), replicates=("",)))


def test_ignored_round_trips_through_json_and_names_a_feature() -> None:
    case = Case("parity", 2, 0, ParityBody(tree=TREE, composition=IGNORING, training=TRAINING))
    assert case_from_json(case_to_json(case)) == case
    assert "fully_shard:ignored_params" in features(case)


def test_ignored_params_stay_plain_and_local_on_real_ranks(check_case) -> None:  # type: ignore[no-untyped-def]
    """Each rank trains the ignored parameters on its own data (the reference does not average
    them), and they are plain tensors after forward (the contract); the rest is sharded."""
    case = Case("parity", 2, 0, ParityBody(tree=TREE, composition=IGNORING, training=TRAINING))
    assert get_property("parity").name == case.property
    check_case(case)
