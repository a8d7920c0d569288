"""The training properties end to end on the session's rank pool, and their sensitivity to
real faults in torch (../shared/mutants)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fuzz.case import (
    Block,
    Case,
    Composition,
    Dtype,
    Leaf,
    LeafKind,
    MetamorphicBody,
    MixedPrecision,
    ModuleTree,
    Optimizer,
    ParityBody,
    ShardSpec,
    Training,
)
from fuzz.explore import run_case
from fuzz.pool import RankPool
from fuzz.properties import get_property
from strategies import invalid_cases, metamorphic_cases, mixed_precision_cases, parity_cases
from tests.conftest import mutant_env


@given(data=st.data())
def test_composed_models_train_like_the_reference(rank_pool, check_case, data):
    check_case(data.draw(parity_cases(world_size=rank_pool.world_size), label="case"))


@given(data=st.data())
def test_mixed_precision_contracts(rank_pool, check_case, data):
    check_case(data.draw(mixed_precision_cases(world_size=rank_pool.world_size), label="case"))


@given(data=st.data())
def test_metamorphic_variants_agree(rank_pool, check_case, data):
    check_case(data.draw(metamorphic_cases(world_size=rank_pool.world_size), label="case"))


@given(data=st.data())
def test_misuses_raise_on_every_rank(rank_pool, check_case, data):
    check_case(data.draw(invalid_cases(world_size=rank_pool.world_size), label="case"))


def _linear_tree(width: int = 8) -> ModuleTree:
    return ModuleTree(width=width, root=Block(children=(Leaf(LeafKind.LINEAR, bias=False),)))


def _shard_dim_1_case() -> Case:
    """One Linear whose weight is sharded on dim 1 (P01's minimal case)."""
    body = ParityBody(
        tree=_linear_tree(),
        composition=Composition(shards=(ShardSpec(path="", reshard_after_forward=False, shard_dim=1),)),
        training=Training(optimizer=Optimizer.SGD, lr=0.05, steps=1, batch_per_rank=3),
    )
    return Case(property="parity", world_size=2, seed=104, body=body)


def _checkpoint_dropout_case() -> Case:
    """Dropout under activation checkpointing, against the same model without it (P02)."""
    tree = ModuleTree(width=4, root=Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.DROPOUT))))
    body = MetamorphicBody(
        tree=tree,
        composition=Composition(shards=(ShardSpec(path=""),), checkpoints=("",)),
        variant=Composition(shards=(ShardSpec(path=""),)),
        training=Training(steps=1, batch_per_rank=4),
    )
    return Case(property="metamorphic", world_size=2, seed=3, body=body)


def _output_dtype_case() -> Case:
    """bf16 parameters, float32 output requested (P03)."""
    policy = MixedPrecision(param_dtype=Dtype.BFLOAT16, output_dtype=Dtype.FLOAT32)
    body = ParityBody(
        tree=_linear_tree(4),
        composition=Composition(shards=(ShardSpec(path="", mixed_precision=policy),)),
        training=Training(steps=1),
    )
    return Case(property="mixed_precision", world_size=2, seed=0, body=body)


FAULTS = [
    ("P01_shard_dim_chunk", _shard_dim_1_case),
    ("P02_ac_rng_not_preserved", _checkpoint_dropout_case),
    ("P03_output_dtype_cast", _output_dtype_case),
]


def test_the_fault_cases_pass_on_unmutated_torch(check_case):
    for _, make in FAULTS:
        check_case(make())


def test_properties_notice_real_faults_in_torch():
    """Each injected fault makes its case fail with a mismatch (the same cases pass above)."""
    for mutant, make in FAULTS:
        case = make()
        with RankPool(world_size=2, env=mutant_env(mutant), deadline=30) as pool:
            failure = run_case(pool, get_property(case.property), case)
        assert failure is not None, mutant
        assert failure.kind == "mismatch", (mutant, failure.summary)


def _meta_case(mesh: tuple[int, ...], shard_dim: int, world_size: int) -> Case:
    """A tree built on the meta device: nested fully_shard (one Shard(1), one uneven), a buffer,
    a block's own parameter and a checkpoint, then to_empty and FSDP2's lazy init."""
    tree = ModuleTree(
        width=5,
        root=Block(
            children=(
                Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.TANH)), scale=True, buffer=True),
                Leaf(LeafKind.LAYER_NORM),
                Leaf(LeafKind.LINEAR),
            ),
            residual=True,
        ),
    )
    comp = Composition(
        shards=(
            ShardSpec(path="0", shard_dim=shard_dim),
            ShardSpec(path="2", reshard_after_forward=False),
            ShardSpec(path=""),
        ),
        checkpoints=("1",),
        mesh=mesh,
        meta_init=True,
    )
    training = Training(optimizer=Optimizer.ADAM, lr=0.01, steps=2, batch_per_rank=2, dtype=Dtype.FLOAT64)
    return Case(
        property="parity",
        world_size=world_size,
        seed=5,
        body=ParityBody(tree=tree, composition=comp, training=training),
    )


def test_models_built_on_the_meta_device_train_like_the_reference(rank_pool, check_case):
    ws = rank_pool.world_size
    check_case(_meta_case((), 1, ws))
    check_case(_meta_case((ws, 1), 0, ws))
    check_case(_meta_case((1, ws), 1, ws))
    variant = Composition(**{**_meta_case((), 0, ws).body.composition.__dict__, "meta_init": False})
    meta = _meta_case((), 0, ws).body
    check_case(
        Case(
            property="metamorphic",
            world_size=ws,
            seed=3,
            body=MetamorphicBody(tree=meta.tree, composition=meta.composition, variant=variant, training=meta.training),
        )
    )


def test_mismatches_of_frozen_units_with_an_int_reshard_get_their_own_signature():
    from fuzz.properties.parity import api_of

    tree = ModuleTree(width=2, root=Block(children=(Leaf(LeafKind.CONV1D, bias=False, frozen=True),), scale=True))
    comp = Composition(shards=(ShardSpec(path="0", reshard_after_forward=2),), replicates=("",))
    assert api_of(comp, tree) == "fsdp2:frozen-int-reshard"
    # trainable, a bool reshard, or the frozen leaf inside a unit that also owns a trainable
    # parameter: the plain family
    trainable = ModuleTree(width=2, root=Block(children=(Leaf(LeafKind.CONV1D, bias=False),), scale=True))
    assert api_of(comp, trainable) == "fsdp2"
    assert (
        api_of(Composition(shards=(ShardSpec(path="0", reshard_after_forward=True),), replicates=("",)), tree)
        == "fsdp2"
    )
    assert api_of(Composition(shards=(ShardSpec(path="", reshard_after_forward=2),)), tree) == "fsdp2"
