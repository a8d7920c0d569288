"""Validity rules and known-bug conditions added when triaging campaign failures: those that were
the suite's (a rule), and those of a known torch bug met another way (its condition)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from fuzz import known
from fuzz.errors import CaseError
from fuzz.model import (
    Block,
    Case,
    Composition,
    Leaf,
    LeafKind,
    ModuleTree,
    ParityBody,
    ShardSpec,
    Training,
    check_composition,
)
from fuzz.model.tree import contains
from strategies import metamorphic_variants

TREE = ModuleTree(
    width=4,
    root=Block(
        children=(
            Leaf(LeafKind.LINEAR),
            Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.RELU), Leaf(LeafKind.LINEAR)), scale=True),
            Leaf(LeafKind.LINEAR),
        ),
    ),
)
#: replicate on "1", fully_shard on "0" and the root (the metamorphic campaign's entry had
#: this layout, with checkpoint on the root as its variant)
REPLICATED = Composition(shards=(ShardSpec("0"), ShardSpec("2"), ShardSpec("")), replicates=("1",))


@pytest.mark.parametrize("region", ["", "1"])
def test_a_checkpoint_holding_a_replicate_is_refused(region: str) -> None:
    # Its recomputation in backward would run DDP's forward again mid-backward ("Expected to
    # have finished reduction in the prior iteration", raised on every rank).
    with pytest.raises(CaseError, match="holds replicate"):
        check_composition(TREE, Composition(**{**REPLICATED.__dict__, "checkpoints": (region,)}))


@pytest.mark.parametrize("region", ["1.0", "2"])
def test_a_checkpoint_inside_or_beside_a_replicate_is_taken(region: str) -> None:
    check_composition(TREE, Composition(**{**REPLICATED.__dict__, "checkpoints": (region,)}))


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(metamorphic_variants(TREE, REPLICATED, world_size=2))
def test_metamorphic_variants_checkpoint_no_replicate(variant: Composition) -> None:
    check_composition(TREE, variant, "variant")
    assert not any(contains(c, r) for c in variant.checkpoints for r in variant.replicates)


def _int_reshard_case(eval_forward: bool) -> Case:
    """The parity campaign's case: an embedding of 5 rows over 4 ranks, fully_shard on the root
    with reshard_after_forward=2, and an inference forward after the step."""
    tree = ModuleTree(
        width=1, vocab=5, root=Block(children=(Leaf(LeafKind.EMBEDDING), Leaf(LeafKind.LAYER_NORM, bias=False)))
    )
    comp = Composition(shards=(ShardSpec("", reshard_after_forward=2),))
    body = ParityBody(tree=tree, composition=comp, training=Training(steps=1, eval_forward=eval_forward))
    return Case(property="parity", world_size=4, seed=0, body=body)


def test_an_inference_forward_after_an_int_reshard_is_the_frozen_int_reshard_bug() -> None:
    # The inference forward leaves the unit post-forward, whose DTensor's full_tensor() is wrong
    # under uneven sharding (docs/known_bugs.md); without it the case passes on torch 2.13.
    assert known.FROZEN_INT_RESHARD in known.explains(_int_reshard_case(eval_forward=True), "mismatch")
    assert known.FROZEN_INT_RESHARD not in known.explains(_int_reshard_case(eval_forward=False), "mismatch")
    body = _int_reshard_case(eval_forward=True).body
    assert isinstance(body, ParityBody)
    tag = known.FROZEN_INT_RESHARD.tag
    assert tag in known.mismatch_tags(body.composition, body.tree, body.training, 4)
    assert tag in known.base_tags(body.composition, body.tree, body.training, 4, "@fsdp1")
