"""fully_shard(dp_mesh_dims): a composition as an SPMD program (:attr:`fuzz.model.Composition.spmd`).

Parameters and buffers are replicated DTensors on the mesh before fully_shard, which is told the
mesh's data-parallel dimension; each rank's batch is its part of a global batch, and backward
runs from the global mean loss, whose gradient is the reference's average over ranks. The rules
are checked without ranks; a hand-built case on the pool passes, the same case fails with a
fault in torch's SPMD gradient path, and the strategies draw the path where torch has it. State
moves between an SPMD program and other layouts through get/set_*_state_dict and DCP (its
buffers are DTensors too, so a sharded state dict in memory goes to another SPMD program only).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st

from fuzz.errors import CaseError
from fuzz.model import (
    Block,
    Case,
    Composition,
    DcpBody,
    DcpItem,
    Leaf,
    LeafKind,
    MetamorphicBody,
    ModuleTree,
    Optimizer,
    Options,
    ParityBody,
    ShardSpec,
    StateDictBody,
    TpPair,
    Training,
)
from fuzz.model.state_dict_rules import sharded_in_memory_problem, tensor_kind
from fuzz.model.training import Compile
from fuzz.pool import RankPool
from fuzz.properties.parity import composition_features, judge_parity
from fuzz.properties.state_dict import judge_state_dict
from strategies import dcp_cases, metamorphic_cases, metamorphic_variants, parity_cases, state_dict_cases
from strategies._cases import maybe_spmd, spmd_of
from strategies._options import has_dp_mesh_dims
from tests.conftest import fault_env, fault_pool

HAS_DP_MESH_DIMS = has_dp_mesh_dims()
needs_dp_mesh_dims = pytest.mark.skipif(not HAS_DP_MESH_DIMS, reason="this torch's fully_shard has no dp_mesh_dims")

TREE = ModuleTree(
    width=4,
    root=Block(
        children=(
            Leaf(LeafKind.LINEAR),
            Leaf(LeafKind.RELU),
            Block(children=(Leaf(LeafKind.LAYER_NORM), Leaf(LeafKind.CONV1D)), residual=True, scale=True, buffer=True),
            Leaf(LeafKind.LINEAR),
        )
    ),
)
SPMD = Composition(shards=(ShardSpec(path="2"), ShardSpec(path="")), checkpoints=("2",), spmd=True)
#: Settings of the draw tests: the first case found (no shrinking), as they ask whether one is drawn.
FIRST_FOUND = settings(
    max_examples=3000,
    database=None,
    deadline=None,
    derandomize=True,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def _case(comp: Composition = SPMD, training: Training | None = None) -> Case:
    body = ParityBody(tree=TREE, composition=comp, training=training or Training(steps=2, grad_accum=2))
    return Case(property="parity", world_size=2, seed=3, body=body)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"shards": (ShardSpec(path="2"),)}, "needs fully_shard on the root"),
        ({"replicates": ("0",), "shards": (ShardSpec(path=""),)}, "no replicate"),
        ({"shards": (ShardSpec(path="2", reshard_after_forward=2), ShardSpec(path=""))}, "int reshard_after_forward"),
        ({"meta_init": True}, "meta_init"),
    ],
)
def test_the_rules_refuse_what_dp_mesh_dims_or_the_suite_does_not_take(change: dict[str, object], message: str) -> None:
    with pytest.raises(CaseError, match=message):
        replace(SPMD, **change)


LINEAR_TREE = ModuleTree(
    width=4,
    root=Block(
        children=(
            Leaf(LeafKind.LINEAR),
            Leaf(LeafKind.RELU),
            Block(children=(Leaf(LeafKind.LAYER_NORM), Leaf(LeafKind.LINEAR)), residual=True, scale=True, buffer=True),
            Leaf(LeafKind.LINEAR),
        )
    ),
)


def test_an_hsdp_spmd_composition_takes_trees_without_conv1d() -> None:
    """On an HSDP mesh the batch is [Shard(0), Shard(0)], which DTensor's convolution refuses."""
    hsdp = Composition(shards=(ShardSpec(path="2"), ShardSpec(path="")), spmd=True, mesh=(1, 2))
    with pytest.raises(CaseError, match="without conv1d"):
        ParityBody(tree=TREE, composition=hsdp)
    ParityBody(tree=LINEAR_TREE, composition=hsdp)
    ParityBody(tree=TREE, composition=replace(hsdp, mesh=()))


@needs_dp_mesh_dims
@pytest.mark.parametrize("mesh", [(1, 2), (2, 1)])
def test_an_hsdp_spmd_case_trains_like_the_reference(check_case: Any, mesh: tuple[int, int]) -> None:
    comp = Composition(shards=(ShardSpec(path="2"), ShardSpec(path="")), checkpoints=("2",), spmd=True, mesh=mesh)
    body = ParityBody(tree=LINEAR_TREE, composition=comp, training=Training(steps=2, grad_accum=2))
    check_case(Case("parity", 2, 3, body))


TP_TREE = ModuleTree(
    width=4,
    root=Block(
        children=(
            Leaf(LeafKind.LINEAR),
            Leaf(LeafKind.RELU),
            Leaf(LeafKind.LINEAR),
            Block(children=(Leaf(LeafKind.LAYER_NORM), Leaf(LeafKind.LINEAR)), residual=True, scale=True, buffer=True),
        )
    ),
)


@needs_dp_mesh_dims
def test_an_spmd_program_with_tensor_parallelism_trains_like_the_reference() -> None:
    """4 ranks, a (shard, tp) mesh: the Linear pair's parameters are DTensors split on ``tp``
    from the start, fully_shard shards the ``shard`` dimension. The residual LayerNorm block
    after the pair makes DTensor shard the output's batch dimension over ``tp`` too, which is
    where F.mse_loss's backward went wrong (docs/known_bugs.md): the program's loss does not
    use it."""
    comp = Composition(
        shards=(ShardSpec(path="3"), ShardSpec(path="")),
        checkpoints=("3",),
        tp=(TpPair(colwise="0", rowwise="2"),),
        tp_size=2,
        spmd=True,
    )
    case = Case("parity", 4, 3, ParityBody(tree=TP_TREE, composition=comp, training=Training(steps=2, grad_accum=2)))
    with RankPool(world_size=4, deadline=120) as pool:
        outcome = pool.run(case)
    assert outcome.ok, outcome.describe()
    assert judge_parity(case, outcome) is None
    assert "fully_shard:dp_mesh_dims" in composition_features(comp, 4)


@needs_dp_mesh_dims
def test_tensor_parallel_parity_cases_draw_spmd_programs() -> None:
    found = find(
        parity_cases(world_size=4), lambda c: c.body.composition.tp and c.body.composition.spmd, settings=FIRST_FOUND
    )
    assert found.body.composition.tp_size == 2


def test_the_training_rules_refuse_compile_and_dropout() -> None:
    with pytest.raises(CaseError, match=r"torch\.compile"):
        _case(training=Training(compile=Compile.EAGER))
    dropout = ModuleTree(width=4, root=Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.DROPOUT))))
    with pytest.raises(CaseError, match="without dropout"):
        ParityBody(tree=dropout, composition=Composition(shards=(ShardSpec(path=""),), spmd=True))
    assert spmd_of(dropout, Composition(shards=(ShardSpec(path=""),))) is None


def test_spmd_of_makes_int_reshards_true_and_leaves_meta_init_out() -> None:
    comp = Composition(shards=(ShardSpec(path="2", reshard_after_forward=2), ShardSpec(path="")), meta_init=True)
    out = spmd_of(TREE, comp)
    if not HAS_DP_MESH_DIMS:
        assert out is None
        return
    assert out is not None and out.spmd and not out.meta_init
    assert [s.reshard_after_forward for s in out.shards] == [True, True]
    assert "fully_shard:dp_mesh_dims" in composition_features(out, 2)


@needs_dp_mesh_dims
def test_an_spmd_case_passes_and_a_fault_in_its_gradient_path_is_caught() -> None:
    """The same case on torch, then with the data-parallel dimensions' partial gradients
    all-reduced before FSDP's reduce-scatter (tests/faults/K39): the judge must say so."""
    case = _case()
    with RankPool(world_size=2, deadline=60) as pool:
        outcome = pool.run(case)
        assert outcome.ok, outcome.describe()
        assert judge_parity(case, outcome) is None
    with fault_pool(fault_env("K39_spmd_grad_reduced_twice"), world_size=2, deadline=60) as pool:
        failure = judge_parity(case, pool.run(case))
    assert failure is not None and failure.signature.startswith("mismatch:parity@fsdp2+spmd"), failure


@needs_dp_mesh_dims
def test_the_strategies_draw_spmd_compositions_and_variants() -> None:
    """Where torch has dp_mesh_dims, parity cases (one SPMD composition in SPMD_ODDS of those
    that can be one) and metamorphic variants (one change of several) draw the path."""
    parity = find(parity_cases(world_size=2), lambda c: c.body.composition.spmd, settings=FIRST_FOUND)
    assert isinstance(parity.body, ParityBody) and "" in parity.body.composition.sharded_paths
    base = Composition(shards=(ShardSpec(path="2", reshard_after_forward=2), ShardSpec(path="")))
    variant = find(metamorphic_variants(TREE, base, world_size=2), lambda v: v.spmd, settings=FIRST_FOUND)
    assert variant == spmd_of(TREE, base)
    case = find(metamorphic_cases(world_size=2), lambda c: c.body.variant.spmd, settings=FIRST_FOUND)
    assert isinstance(case.body, MetamorphicBody) and not case.body.composition.spmd


def test_a_placement_that_splits_the_tensor_is_sharded_strided_too() -> None:
    """The contracts' test of a sharded parameter reads the shard dimension's placement: a
    replicated DTensor (an SPMD unsharded parameter) is not sharded; FSDP's _StridedShard over
    tensor parallelism's shard of the same dimension is, though its is_shard() is False."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    from fuzz._rank.knobs import _splits

    assert _splits(Shard(0)) and _splits(Shard(1)) and _splits(_StridedShard(0, split_factor=2))
    assert not _splits(Replicate()) and not _splits(Partial())


PLAIN_FSDP = Composition(shards=(ShardSpec(path="2"), ShardSpec(path="")), checkpoints=("2",))
ADAM = Training(steps=2, optimizer=Optimizer.ADAM)
FULL = Options(full_state_dict=True)
MOVES = {
    "sharded-spmd-to-spmd": StateDictBody(tree=TREE, source=SPMD, target=SPMD, training=ADAM),
    "full-spmd-to-plain": StateDictBody(
        tree=TREE, source=SPMD, target=Composition(), training=ADAM, save=FULL, load=FULL
    ),
    "broadcast-fully-shard-to-spmd": StateDictBody(
        tree=TREE,
        source=PLAIN_FSDP,
        target=SPMD,
        training=ADAM,
        save=FULL,
        load=Options(full_state_dict=True, broadcast_from_rank0=True),
    ),
    "dcp-spmd-to-fully-shard": DcpBody(
        tree=TREE, source=SPMD, target=PLAIN_FSDP, training=ADAM, entries=(DcpItem.MODEL, DcpItem.OPTIMIZER)
    ),
    "dcp-plain-to-spmd": DcpBody(tree=TREE, source=Composition(), target=SPMD, training=ADAM, entries=(DcpItem.APP,)),
}


def test_an_spmd_state_dict_holds_dtensor_buffers_so_sharded_moves_stay_between_spmd_programs() -> None:
    assert tensor_kind(SPMD) == "spmd" and tensor_kind(PLAIN_FSDP) == "dtensor"
    assert sharded_in_memory_problem(SPMD, SPMD) is None
    assert sharded_in_memory_problem(SPMD, PLAIN_FSDP) and sharded_in_memory_problem(PLAIN_FSDP, SPMD)
    with pytest.raises(CaseError, match="meta device"):
        StateDictBody(
            tree=TREE, source=PLAIN_FSDP, target=SPMD, training=ADAM, save=FULL, load=FULL, target_meta_init=True
        )


@needs_dp_mesh_dims
@pytest.mark.parametrize("name", sorted(MOVES))
def test_state_moves_between_spmd_programs_and_other_layouts(check_case: Any, name: str) -> None:
    body = MOVES[name]
    check_case(Case(body.KIND, 2, 5, body))


@needs_dp_mesh_dims
def test_a_fault_in_the_spmd_gradient_path_shows_when_a_state_dict_case_resumes() -> None:
    """K39 on the SPMD source: its training on after the load differs from the plain target's."""
    body = MOVES["full-spmd-to-plain"]
    case = Case(body.KIND, 2, 5, body)
    with fault_pool(fault_env("K39_spmd_grad_reduced_twice"), world_size=2, deadline=60) as pool:
        failure = judge_state_dict(case, pool.run(case))
    assert failure is not None and failure.signature.startswith("mismatch:state_dict:resume"), failure


@needs_dp_mesh_dims
def test_a_full_load_that_skips_replicated_dtensors_is_caught_on_an_spmd_target() -> None:
    """K40: set_model_state_dict's full load leaves an all-Replicate DTensor (an SPMD program's
    buffer) as the fresh target held it; the model check compares every buffer after the load."""
    body = StateDictBody(tree=TREE, source=PLAIN_FSDP, target=SPMD, training=ADAM, save=FULL, load=FULL)
    case = Case(body.KIND, 2, 5, body)
    with fault_pool(fault_env("K40_full_load_skips_replicated_dtensors"), world_size=2, deadline=60) as pool:
        failure = judge_state_dict(case, pool.run(case))
    assert failure is not None and failure.signature == "mismatch:state_dict:model@split", failure
    assert "2.shift" in failure.summary, failure.summary


@needs_dp_mesh_dims
def test_state_dict_and_dcp_cases_draw_spmd_sides() -> None:
    for strategy in (state_dict_cases, dcp_cases):
        found = find(
            strategy(world_size=2), lambda c: c.body.source.spmd and not c.body.target.spmd, settings=FIRST_FOUND
        )
        assert found.body.source.spmd


def test_f_mse_loss_of_dtensors_is_an_spmd_programs_loss_only() -> None:
    with pytest.raises(CaseError, match="SPMD program only"):
        Composition(shards=(ShardSpec(path=""),), spmd_mse_loss=True)
    assert "loss:F.mse_loss(DTensor)" in composition_features(replace(SPMD, spmd_mse_loss=True), 2)
    assert "loss:F.mse_loss(DTensor)" not in composition_features(SPMD, 2)


@needs_dp_mesh_dims
def test_the_strategies_draw_f_mse_loss_of_dtensors_rarely() -> None:
    """F.mse_loss's backward on a batch-sharded DTensor is wrong (known.DTENSOR_MSE_LOSS): kept
    rare, not excluded, so a campaign notices when torch fixes it."""
    base = replace(SPMD, spmd=False)

    @st.composite
    def compositions(draw: st.DrawFn) -> Composition:
        return maybe_spmd(draw, TREE, base)  # as parity, state_dict and dcp cases draw theirs

    found = find(compositions(), lambda c: c.spmd_mse_loss, settings=FIRST_FOUND)
    assert found == replace(SPMD, spmd_mse_loss=True)
