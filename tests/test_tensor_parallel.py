"""FSDP + tensor parallelism: Colwise- / RowwiseParallel pairs on a (shard, tp) mesh, with
fully_shard over the shard dimension. What the strategies draw, what a case may hold, and
hand-built cases trained against the reference on four ranks.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from fuzz.errors import CaseError, InvalidArgument
from fuzz.explore import run_case
from fuzz.model import (
    AccumSync,
    Block,
    Case,
    Composition,
    Dtype,
    Leaf,
    LeafKind,
    ModuleTree,
    Optimizer,
    ParityBody,
    ShardSpec,
    Skip,
    TpPair,
    Training,
    check_mesh,
    has_leaf,
)
from fuzz.pool import RankPool
from fuzz.properties import get_property
from fuzz.properties.parity import api_of, features
from strategies import parity_cases
from strategies._compositions import tensor_parallel, tp_candidates

LINEAR, RELU, NORM = Leaf(LeafKind.LINEAR), Leaf(LeafKind.RELU), Leaf(LeafKind.LAYER_NORM)


def _tree(width: int = 4) -> ModuleTree:
    mlp = Block(children=(Leaf(LeafKind.LINEAR, bias=False), Leaf(LeafKind.GELU), LINEAR), residual=True, scale=True)
    return ModuleTree(width=width, root=Block(children=(LINEAR, RELU, LINEAR, NORM, mlp), residual=True, buffer=True))


def _comp(*pairs: TpPair, raf: bool = True, checkpoints: tuple[str, ...] = (), inner: bool = False) -> Composition:
    shards = (ShardSpec(path="4", reshard_after_forward=raf),) if inner else ()
    return Composition(
        shards=(*shards, ShardSpec(path="", reshard_after_forward=raf)),
        checkpoints=checkpoints,
        tp=pairs or (TpPair("0", "2"), TpPair("4.0", "4.2")),
        tp_size=2,
    )


# ----------------------------------------------------------------------------------- strategies


def test_tp_candidates_are_linear_pairs_with_only_activations_between() -> None:
    assert tp_candidates(_tree()) == [TpPair("0", "2"), TpPair("4.0", "4.2")]
    frozen = ModuleTree(width=4, root=Block(children=(Leaf(LeafKind.LINEAR, frozen=True), LINEAR)))
    assert tp_candidates(frozen) == []
    normed = ModuleTree(width=4, root=Block(children=(LINEAR, NORM, LINEAR)))
    assert tp_candidates(normed) == []
    three = ModuleTree(width=4, root=Block(children=(LINEAR, LINEAR, LINEAR)))
    assert tp_candidates(three) == [TpPair("0", "1")]  # disjoint pairs, left to right


_DRAWS = settings(max_examples=300, database=None, deadline=None, suppress_health_check=list(HealthCheck))


def test_tp_is_drawn_on_four_ranks_at_a_useful_rate_and_never_on_two() -> None:
    counts: Counter[str] = Counter()

    @_DRAWS
    @given(parity_cases(world_size=4))
    def four(case: Case) -> None:
        counts["cases"] += 1
        assert isinstance(case.body, ParityBody)
        comp = case.body.composition
        if comp.tp:
            counts["tp"] += 1
            counts[f"pairs:{len(comp.tp)}"] += 1
            counts["checkpoint"] += bool(comp.checkpoints)
            counts["nested"] += len(comp.shards) > 1
            assert any(f.startswith("tp:") for f in features(case))
            assert api_of(comp).startswith("fsdp2+tp")
            if has_leaf(case.body.tree.root, LeafKind.LAYER_NORM):  # fuzz.tolerance: TP moves values by ulps
                counts["layer_norm"] += 1
                assert case.body.training.dtype is Dtype.FLOAT64

    @_DRAWS
    @given(parity_cases(world_size=2))
    def two(case: Case) -> None:
        assert isinstance(case.body, ParityBody) and not case.body.composition.tp

    four()
    two()
    assert counts["tp"] >= 0.1 * counts["cases"], counts
    # Two pairs come in about 17% of TP cases (1,500 random draws), checkpoint and nesting in
    # more: at least 5% of some 80 TP draws leaves room for a sample's spread (two pairs was
    # 8 of 84 once, under a bound of 10% that random draws missed now and then).
    for feature in ("pairs:2", "checkpoint", "nested"):
        assert counts[feature] >= 0.05 * counts["tp"], (feature, counts)


def test_tensor_parallel_refuses_a_world_without_a_shard_dimension() -> None:
    @settings(max_examples=1, database=None)
    @given(tensor_parallel(_tree(), world_size=2))
    def draw(comp: Composition) -> None:
        pass

    with pytest.raises(InvalidArgument, match="world_size=2"):
        draw()


# ------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("tree", "comp", "match"),
    [
        (_tree(width=3), _comp(), "does not split evenly"),
        (_tree(), _comp(TpPair("0", "3")), "no trainable linear leaf"),
        (_tree(), _comp(TpPair("2", "0")), "not a later sibling"),
        (_tree(), _comp(TpPair("0", "4.0")), "not a later sibling"),
        (ModuleTree(width=4, root=Block(children=(LINEAR, NORM, LINEAR))), _comp(TpPair("0", "2")), "only activations"),
        (_tree(), _comp(TpPair("0", "2"), TpPair("2", "4.0")), "in two pairs"),
    ],
)
def test_invalid_tp_pairs_are_refused(tree: ModuleTree, comp: Composition, match: str) -> None:
    with pytest.raises(CaseError, match=match):
        ParityBody(tree=tree, composition=comp)


def test_tp_composes_with_root_fully_shard_and_checkpoint_only() -> None:
    with pytest.raises(CaseError, match="both or neither"):
        Composition(shards=(ShardSpec(path=""),), tp_size=2)
    with pytest.raises(CaseError, match="fully_shard on the root"):
        Composition(shards=(ShardSpec(path="4"),), tp=(TpPair("0", "2"),), tp_size=2)
    with pytest.raises(CaseError, match="checkpoint only"):
        Composition(shards=(ShardSpec(path=""),), replicates=("4",), tp=(TpPair("0", "2"),), tp_size=2)
    with pytest.raises(CaseError, match="does not divide"):
        check_mesh(Composition(shards=(ShardSpec(path=""),), tp=(TpPair("0", "2"),), tp_size=4), world_size=6)
    with pytest.raises(CaseError, match="without skips"):
        ParityBody(tree=_tree(), composition=_comp(), training=Training(steps=2, skips=(Skip("1", 0),)))


# ------------------------------------------------------------------------------------ on 4 ranks


def _case(comp: Composition, training: Training, seed: int = 3) -> Case:
    return Case(
        property="parity", world_size=4, seed=seed, body=ParityBody(tree=_tree(), composition=comp, training=training)
    )


_SGD = Training(optimizer=Optimizer.SGD, lr=0.05, momentum=0.9, steps=2, dtype=Dtype.FLOAT64)
_ADAM_ACCUM = Training(
    optimizer=Optimizer.ADAM, lr=0.05, steps=2, dtype=Dtype.FLOAT64, grad_accum=2, accum_sync=AccumSync.NO_GRAD_SYNC
)


@pytest.fixture(scope="module")
def pool4() -> Any:
    with RankPool(world_size=4, deadline=120) as pool:
        yield pool


@pytest.mark.parametrize(
    ("comp", "training"),
    [
        (_comp(), _SGD),
        (_comp(raf=False, inner=True), _ADAM_ACCUM),
        (_comp(TpPair("4.0", "4.2"), checkpoints=("4",), inner=True), _SGD),
        (_comp(TpPair("0", "2"), checkpoints=("0",)), _ADAM_ACCUM),
    ],
    ids=["root", "nested-no-reshard-accum", "checkpointed-mlp", "checkpointed-colwise"],
)
def test_fsdp_with_tensor_parallel_trains_like_the_reference(
    pool4: RankPool, comp: Composition, training: Training
) -> None:
    case = _case(comp, training)
    outcome = pool4.run(case)
    assert outcome.ok, outcome.describe()
    failure = get_property("parity").judge(case, outcome)
    assert failure is None, f"{failure.signature}\n{failure.summary}"
    # The checks had something to compare: every rank's losses, rank 0's parameters per step.
    first = outcome.observations[0]
    assert len(first["params"]) == training.steps and first["ref"]["params"]
    assert all(len(o["losses"]) == training.steps for o in outcome.observations)
    # Each tensor-parallel group (ranks 0-1, 2-3) trained on one input; the groups on others.
    losses = [o["losses"] for o in outcome.observations]
    assert losses[0] == losses[1] and losses[2] == losses[3] and losses[0] != losses[2]
    assert run_case(pool4, get_property("parity"), case) is None


# ------------------------------------------------------------- on the session pool (2 ranks)


@pytest.mark.parametrize(
    ("comp", "training"),
    [(_comp(), _SGD), (_comp(raf=False, inner=True), _ADAM_ACCUM)],
    ids=["root", "nested-no-reshard-accum"],
)
def test_tensor_parallel_over_every_rank_trains_like_the_reference(
    rank_pool: RankPool, comp: Composition, training: Training
) -> None:
    """A (1, 2) mesh: every rank in the one tp group, fully_shard over a shard dimension of one.
    Not drawn (the strategies want a shard dimension of more than one rank), but it runs the
    tensor-parallel path on the session pool's backend: NCCL on a host with two GPUs."""
    if rank_pool.world_size != 2:
        pytest.skip("a (1, 2) mesh needs a pool of 2 ranks")
    case = dataclasses.replace(_case(comp, training), world_size=2)
    outcome = rank_pool.run(case)
    assert outcome.ok, outcome.describe()
    failure = get_property("parity").judge(case, outcome)
    assert failure is None, f"{failure.signature}\n{failure.summary}"
    losses = [o["losses"] for o in outcome.observations]
    assert losses[0] == losses[1] and len(losses[0]) == training.steps  # one tp group, one input
