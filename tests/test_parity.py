"""The training properties end to end on the session's rank pool, and their sensitivity to
real faults in torch (../shared/mutants)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

import strategies._cases as strategies_cases
from fuzz.errors import CaseError
from fuzz.explore import run_case
from fuzz.known import never_run_under_no_sync, unfrozen_in_frozen_mp_unit
from fuzz.model import (
    AccumSync,
    Block,
    Case,
    Compile,
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
    Skip,
    Training,
    Unfreeze,
    Wrapper,
)
from fuzz.properties import get_property
from strategies import invalid_cases, metamorphic_cases, mixed_precision_cases, parity_cases
from tests.conftest import fault_pool, mutant_env


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
        with fault_pool(mutant_env(mutant), world_size=2, deadline=30) as pool:
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


# -- training schedules: unused parameters, parameters unfrozen later, torch.compile -------------

_KNOWN_SCHEDULE_BUGS = (":unused-no-all-reduce", ":unfrozen-unresharded", ":unfrozen-frozen-unit")


def _generated_with(strategy: Any, feature: str, world_size: int) -> Case:
    """The first case the strategy draws (derandomized) with ``feature`` and none of the known
    FSDP2 bugs the schedules meet (those have their own tests below)."""
    from fuzz.properties.parity import api_of, features

    def wanted(case: Case) -> bool:
        body = case.body
        assert isinstance(body, (ParityBody, MetamorphicBody))
        comps = [body.composition] + ([body.variant] if isinstance(body, MetamorphicBody) else [])
        apis = [api_of(c, body.tree, body.training) for c in comps]
        known = any(k in a for a in apis for k in _KNOWN_SCHEDULE_BUGS)
        known |= never_run_under_no_sync(body.tree, body.composition, body.training)
        known |= unfrozen_in_frozen_mp_unit(body.tree, body.composition, body.training)
        return feature in features(case) and not known

    search = settings(
        max_examples=3000,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    return find(strategy(world_size=world_size), wanted, settings=search)


@pytest.mark.parametrize(
    "feature",
    ["param:unused", "param:unused:some-microbatches", "param:unfrozen_later", "compile:eager", "compile:aot_eager"],
)
@pytest.mark.parametrize("strategy", [parity_cases, metamorphic_cases, mixed_precision_cases], ids=lambda s: s.__name__)
def test_generated_training_schedules_hold(rank_pool, check_case, strategy, feature, monkeypatch):
    if strategy is metamorphic_cases and feature.endswith("some-microbatches"):
        pytest.skip("metamorphic cases have one microbatch per step")
    # Campaigns compile one case in COMPILE_ODDS (its rate is tested in test_strategies); here
    # only the first compiled case counts, so the search asks for it more often.
    monkeypatch.setattr(strategies_cases, "COMPILE_ODDS", 2)
    check_case(_generated_with(strategy, feature, rank_pool.world_size))


@given(data=st.data())
def test_composed_models_with_unused_parameters_train_like_the_reference(rank_pool, check_case, data):
    case = data.draw(
        parity_cases(world_size=rank_pool.world_size).filter(lambda c: bool(c.body.training.skips)), label="case"
    )
    check_case(case)


def _skip_tree() -> ModuleTree:
    return ModuleTree(width=4, root=Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.TANH), Leaf(LeafKind.LINEAR))))


@pytest.mark.parametrize(
    ("composition", "training", "field", "reason"),
    [
        (Composition(wrapper=Wrapper.DDP), Training(skips=(Skip("0", 0),)), "skips[0]", "find_unused_parameters"),
        (
            Composition(shards=(ShardSpec("0"),), replicates=("",)),
            Training(skips=(Skip("2", 0),)),
            "skips[0]",
            "find_unused",
        ),
        (
            Composition(wrapper=Wrapper.FSDP1_FULL_SHARD),
            Training(momentum=0.9, skips=(Skip("0", 0),)),
            "skips[0]",
            "zero gradients",
        ),
        (
            Composition(wrapper=Wrapper.FSDP1_NO_SHARD),
            Training(grad_accum=2, accum_sync=AccumSync.NO_GRAD_SYNC, skips=(Skip("0", 0, 1),)),
            "skips[0]",
            "no_sync",
        ),
        (Composition(shards=(ShardSpec(""),)), Training(skips=(Skip("", 0),)), "skips[0].path", "below the root"),
        (
            Composition(shards=(ShardSpec(""),)),
            Training(skips=(Skip("0", 0), Skip("2", 0))),
            "skips[0]",
            "no trainable",
        ),
        (
            Composition(shards=(ShardSpec(""),)),
            Training(steps=2, unfreeze=(Unfreeze("0", 1),)),
            "unfreeze[0].path",
            "frozen leaf",
        ),
        (
            Composition(shards=(ShardSpec(""),), checkpoints=("0",)),
            Training(compile=Compile.AOT_EAGER),
            "compile",
            "aot_eager",
        ),
    ],
)
def test_schedules_the_apis_do_not_support_are_refused(composition, training, field, reason):
    with pytest.raises(CaseError, match=rf"training\.{re.escape(field)}: .*{reason}"):
        ParityBody(tree=_skip_tree(), composition=composition, training=training)


def test_training_refuses_schedules_outside_its_steps():
    with pytest.raises(CaseError, match=r"skips\[0\]\.step: step=2 is outside 0\.\.1"):
        Training(steps=2, skips=(Skip("0", 2),))
    with pytest.raises(CaseError, match=r"skips\[0\]\.microbatch"):
        Training(skips=(Skip("0", 0, 1),))
    with pytest.raises(CaseError, match=r"unfreeze\[0\]\.step: step=0"):
        Training(steps=2, unfreeze=(Unfreeze("0", 0),))
    # a replicated module left out of forward as a whole is fine (DDP never prepared a backward)
    tree = ModuleTree(width=4, root=Block(children=(Block(children=(Leaf(LeafKind.LINEAR),)), Leaf(LeafKind.LINEAR))))
    ParityBody(tree, Composition(shards=(ShardSpec(""),), replicates=("0",)), Training(skips=(Skip("0", 0),)))


def _no_all_reduce_case(world_size: int) -> Case:
    """HSDP, reduce-scatter only on the first of two microbatches (set_requires_all_reduce(False)),
    the fully_shard unit "0" unused on the last one."""
    tree = ModuleTree(width=4, root=Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.LINEAR))))
    comp = Composition(shards=(ShardSpec("0"), ShardSpec("")), mesh=(1, world_size))
    training = Training(grad_accum=2, accum_sync=AccumSync.NO_ALL_REDUCE, skips=(Skip("0", 0, 1),))
    return Case("parity", world_size, 0, ParityBody(tree, comp, training))


def _unfrozen_unresharded_case(world_size: int) -> Case:
    """A frozen fully_shard unit with reshard_after_forward=False under a replicate'd root,
    unfrozen before step 1."""
    tree = ModuleTree(width=4, root=Block(children=(Leaf(LeafKind.LINEAR, frozen=True), Leaf(LeafKind.LINEAR))))
    comp = Composition(shards=(ShardSpec("0", reshard_after_forward=False),), replicates=("",))
    return Case("parity", world_size, 1, ParityBody(tree, comp, Training(steps=2, unfreeze=(Unfreeze("0", 1),))))


def _unfrozen_frozen_fsdp1_unit_case(world_size: int, wrapper: Wrapper = Wrapper.FSDP1_NO_SHARD) -> Case:
    """FSDP1 auto-wrapping every block: the root's unit holds only a frozen leaf, unfrozen before
    step 1; the inner block is a unit of its own."""
    inner = Block(children=(Leaf(LeafKind.LINEAR),))
    tree = ModuleTree(width=4, root=Block(children=(Leaf(LeafKind.LINEAR, frozen=True), inner)))
    comp = Composition(wrapper=wrapper, auto_wrap=True)
    return Case("parity", world_size, 0, ParityBody(tree, comp, Training(steps=2, unfreeze=(Unfreeze("0", 1),))))


@pytest.mark.parametrize(
    ("make", "signature"),
    [
        (_no_all_reduce_case, "mismatch:parity@fsdp2:unused-no-all-reduce"),
        (_unfrozen_unresharded_case, "mismatch:parity@fsdp2:unfrozen-unresharded"),
        (_unfrozen_frozen_fsdp1_unit_case, "mismatch:parity@fsdp1:unfrozen-frozen-unit"),
    ],
    ids=["unused-no-all-reduce", "unfrozen-unresharded", "unfrozen-frozen-unit"],
)
def test_known_bugs_of_training_schedules_fail_with_their_own_signature(rank_pool, make, signature):
    """Two FSDP2 bugs and an FSDP1 bug the schedules found (docs/design.md, docs/known_bugs.md):
    the cases fail on torch 2.13 with signatures of their own. When torch fixes one, this test
    fails: retire it."""
    case = make(rank_pool.world_size)
    failure = run_case(rank_pool, get_property("parity"), case)
    assert failure is not None, f"torch fixed {signature}: retire this test and the odds in strategies/_cases.py"
    assert failure.signature == signature, failure


def test_unfreezing_in_a_frozen_fsdp1_unit_passes_when_sharded(check_case, rank_pool):
    """The control of the FSDP1 bug above: FULL_SHARD instead of NO_SHARD trains the unfrozen leaf."""
    check_case(_unfrozen_frozen_fsdp1_unit_case(rank_pool.world_size, Wrapper.FSDP1_FULL_SHARD))


def test_the_same_schedules_with_set_requires_gradient_sync_pass(check_case, rank_pool):
    """The controls of the two bugs above: no_grad_sync instead of no_all_reduce; reshard_after_forward=True."""
    case = _no_all_reduce_case(rank_pool.world_size)
    body = case.body
    assert isinstance(body, ParityBody)
    training = Training(**{**body.training.__dict__, "accum_sync": AccumSync.NO_GRAD_SYNC})
    check_case(Case("parity", case.world_size, 0, ParityBody(body.tree, body.composition, training)))
    case = _unfrozen_unresharded_case(rank_pool.world_size)
    body = case.body
    assert isinstance(body, ParityBody)
    comp = Composition(shards=(ShardSpec("0"),), replicates=("",))
    check_case(Case("parity", case.world_size, 1, ParityBody(body.tree, comp, body.training)))


def _find_unused_cases(world_size: int) -> list[Case]:
    """DDP and replicate built with find_unused_parameters=True, with a parameter-holding module
    left out of forward on some steps and microbatches: under DDP's no_sync() (the unused
    parameter accumulated a gradient on the microbatch without sync, and none on the one that
    syncs), under SGD with momentum and under Adam (a parameter without a gradient gets no
    update at all), and under a replicate'd root with a fully_shard unit."""
    tree = _skip_tree()
    accum = Training(
        steps=2,
        grad_accum=2,
        accum_sync=AccumSync.NO_GRAD_SYNC,
        optimizer=Optimizer.SGD,
        momentum=0.9,
        skips=(Skip("0", 0, 1), Skip("2", 1, 0)),
    )
    adam = Training(steps=3, optimizer=Optimizer.ADAM, skips=(Skip("0", 1),), set_to_none=False)
    ddp = Composition(wrapper=Wrapper.DDP, find_unused=True)
    mixed = Composition(shards=(ShardSpec("2"),), replicates=("",), find_unused=True)
    sub = Composition(shards=(ShardSpec(""),), replicates=("0",), find_unused=True)
    bodies = [(ddp, accum), (ddp, adam), (mixed, adam), (mixed, Training(steps=2, skips=(Skip("0", 1),)))]
    bodies.append((sub, Training(steps=2, skips=(Skip("0", 0),))))
    return [Case("parity", world_size, i, ParityBody(tree, c, t)) for i, (c, t) in enumerate(bodies)]


def test_find_unused_parameters_lets_ddp_and_replicate_skip_modules(rank_pool, check_case):
    for case in _find_unused_cases(rank_pool.world_size):
        check_case(case)


def test_find_unused_applies_to_ddp_and_replicate_only():
    with pytest.raises(CaseError, match=r"find_unused: .*DDP and replicate only"):
        Composition(shards=(ShardSpec(""),), find_unused=True)
    with pytest.raises(CaseError, match=r"find_unused: .*DDP and replicate only"):
        Composition(wrapper=Wrapper.FSDP1_FULL_SHARD, find_unused=True)
