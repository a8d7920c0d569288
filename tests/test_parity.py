"""The parity property end to end on the session's rank pool, and its sensitivity to a real fault."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fuzz.case import Block, Case, Composition, Leaf, LeafKind, ModuleTree, Optimizer, ParityBody, ShardSpec, Training
from fuzz.explore import run_case
from fuzz.pool import RankPool
from fuzz.properties import get_property
from strategies import parity_cases
from tests.conftest import mutant_env


@given(data=st.data())
def test_fully_shard_trains_like_the_reference(rank_pool, check_case, data):
    case = data.draw(parity_cases(world_size=rank_pool.world_size), label="case")
    check_case(case)


def _shard_dim_1_case() -> Case:
    """The minimal case the suite shrank P01 to: one Linear whose weight is sharded on dim 1."""
    tree = ModuleTree(width=8, root=Block(children=(Leaf(LeafKind.LINEAR, bias=False),)))
    body = ParityBody(
        tree=tree,
        composition=Composition(shards=(ShardSpec(path="", reshard_after_forward=False, shard_dim=1),)),
        training=Training(optimizer=Optimizer.SGD, lr=0.05, steps=1, batch_per_rank=3),
    )
    return Case(property="parity", world_size=2, seed=104, body=body)


def test_parity_holds_for_the_shard_dim_1_case_on_unmutated_torch(check_case):
    check_case(_shard_dim_1_case())


def test_parity_notices_gradients_reduced_on_the_wrong_dim():
    """Under a real fault in torch (reduce-scatter chunks on dim 0 whatever the shard dim), the
    property fails with a parameter mismatch; the same case passes on unmutated torch above."""
    case = _shard_dim_1_case()
    with RankPool(world_size=2, env=mutant_env("P01_shard_dim_chunk"), deadline=30) as pool:
        failure = run_case(pool, get_property("parity"), case)
    assert failure is not None
    assert failure.kind == "mismatch"
    assert failure.signature == "mismatch:parity:param"
    assert "0.weight" in failure.summary
