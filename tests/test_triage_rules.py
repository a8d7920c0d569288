"""Validity rules added when triaging campaign failures that were the suite's, not torch's."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from fuzz.errors import CaseError
from fuzz.model import Block, Composition, Leaf, LeafKind, ModuleTree, ShardSpec, check_composition
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
