"""replicate's and checkpoint's options (fuzz.model.ReplicateOptions, CheckpointOptions): hand-
built cases pass on unmutated torch with the oracle each option's documentation implies, the
rules refuse what the documentation restricts, and the strategies draw every option."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fuzz import known
from fuzz.errors import CaseError
from fuzz.explore import run_case
from fuzz.model import (
    Block,
    Case,
    CheckpointOptions,
    Composition,
    ContextFn,
    DeterminismCheck,
    InvalidBody,
    Layout,
    Leaf,
    LeafKind,
    MetamorphicBody,
    Misuse,
    ModuleTree,
    Optimizer,
    ParityBody,
    ReplicateGroup,
    ReplicateOptions,
    ShardSpec,
    Skip,
    Training,
    Wrapper,
    case_from_json,
    case_to_json,
    check_training,
)
from fuzz.properties import get_property
from fuzz.properties.invalid import features as invalid_features
from fuzz.properties.parity import features
from strategies import invalid_cases, metamorphic_cases, parity_cases
from strategies._options import checkpoint_takes, replicate_takes
from tests.conftest import fault_env, fault_pool

#: Root block: a Linear, a block of two Linears (and dropout-free activations), a Linear.
TREE = ModuleTree(
    width=5,
    root=Block(
        children=(
            Leaf(LeafKind.LINEAR),
            Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.TANH), Leaf(LeafKind.LINEAR, bias=False))),
            Leaf(LeafKind.LAYER_NORM),
        ),
        scale=True,
    ),
)
TRAINING = Training(optimizer=Optimizer.SGD, lr=0.05, momentum=0.9, steps=2, batch_per_rank=2, grad_accum=2)


def _parity(comp: Composition, training: Training = TRAINING) -> Case:
    return Case("parity", world_size=2, seed=5, body=ParityBody(tree=TREE, composition=comp, training=training))


def _needs(*options: str) -> None:
    missing = [o for o in options if not replicate_takes(o)]
    if missing:
        pytest.skip(f"this torch's replicate takes no {missing}")


# --------------------------------------------------------------------------------------------
# The model: which parameters stay local, what is delayed, what the rules refuse


def test_ignored_modules_keep_their_parameters_local() -> None:
    comp = Composition(replicates=("",), replicate_options=ReplicateOptions(ignored_modules=("1",)))
    layout = Layout(TREE, comp)
    assert layout.local() == ["1.0", "1.2"]
    assert layout.unit_of("1.0") is None and layout.unmanaged() == []
    assert layout.ignored_by("") == ["1"]
    # replicate collects the root's own scale first, then its children depth first
    assert layout.replicated_params("") == [
        ("", "scale"),
        ("0", "weight"),
        ("0", "bias"),
        ("2", "weight"),
        ("2", "bias"),
    ]


def test_delay_plan_hooks_the_first_trainable_module_in_forward_order() -> None:
    comp = Composition(replicates=("",), replicate_options=ReplicateOptions(delay_all_reduce=True))
    # the root's scale runs after its children: last in forward order
    assert Layout(TREE, comp).delay_plan("") == ("0", ("1.0", "1.2", "2", ""))


def test_rules_refuse_what_the_documentation_restricts() -> None:
    with pytest.raises(CaseError, match="replicate calls"):
        Composition(replicate_options=ReplicateOptions(static_graph=True))
    with pytest.raises(CaseError, match="checkpoint calls"):
        Composition(checkpoint_options=CheckpointOptions(debug=True))
    with pytest.raises(CaseError, match="ignored_modules"):  # the root itself is not under replicate("")
        _parity(Composition(replicates=("",), replicate_options=ReplicateOptions(ignored_modules=("",))))
    with pytest.raises(CaseError, match="no trainable parameter"):  # both of replicate("1")'s Linears ignored
        _parity(
            Composition(
                replicates=("1",),
                shards=(ShardSpec(""),),
                replicate_options=ReplicateOptions(ignored_modules=("1.0", "1.2")),
            )
        )
    dropout = ModuleTree(width=3, root=Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.DROPOUT))))
    with pytest.raises(CaseError, match="dropout"):
        ParityBody(
            tree=dropout,
            composition=Composition(
                shards=(ShardSpec(""),),
                checkpoints=("",),
                checkpoint_options=CheckpointOptions(preserve_rng_state=False),
            ),
        )
    # static_graph: the modules left out must not change over training; a fixed set is fine
    static = Composition(replicates=("",), replicate_options=ReplicateOptions(static_graph=True))
    with pytest.raises(CaseError, match="static_graph"):
        check_training(TREE, (static,), replace(TRAINING, skips=(Skip("1.0", step=0, microbatch=0),)))
    fixed = tuple(Skip("1.0", step=s, microbatch=m) for s in range(2) for m in range(2))
    check_training(TREE, (static,), replace(TRAINING, skips=fixed))  # no find_unused needed
    with pytest.raises(CaseError, match="compile"):
        from fuzz.model import Compile

        check_training(TREE, (static,), replace(TRAINING, compile=Compile.EAGER))


def test_options_round_trip_and_old_json_decodes() -> None:
    comp = Composition(
        replicates=("1",),
        shards=(ShardSpec(""),),
        checkpoints=("0",),
        replicate_options=ReplicateOptions(bucket_cap_mb_list=(0.0, 0.0001), group=ReplicateGroup.DEVICE_MESH),
        checkpoint_options=CheckpointOptions(
            context_fn=ContextFn.SAVE_MATMULS, determinism_check=DeterminismCheck.NONE
        ),
    )
    case = _parity(comp)
    data = case_to_json(case)
    assert case_from_json(data) == case
    composition = data["body"]["composition"]
    del composition["replicate_options"], composition["checkpoint_options"]
    assert case_from_json(data).body.composition == replace(  # type: ignore[attr-defined]
        comp, replicate_options=ReplicateOptions(), checkpoint_options=CheckpointOptions()
    )


# --------------------------------------------------------------------------------------------
# Cases on the pool


def test_ignored_modules_train_locally(rank_pool: Any, check_case: Any) -> None:
    """The reference leaves the ignored modules' gradients local and agrees (with the contract
    that they are plain tensors replicate does not manage); the same training with them
    averaged (replicate without ignored_modules) must then differ: they are not averaged."""
    ignored = Composition(replicates=("",), replicate_options=ReplicateOptions(ignored_modules=("1",)))
    check_case(_parity(ignored))
    body = MetamorphicBody(
        tree=TREE,
        composition=replace(ignored, replicate_options=ReplicateOptions()),
        variant=ignored,
        training=replace(TRAINING, grad_accum=1),
    )
    failure = run_case(rank_pool, get_property("metamorphic"), Case("metamorphic", 2, 5, body))
    assert failure is not None and failure.kind == "mismatch", failure


def test_the_modules_synced_at_init_are_those_ddp_manages() -> None:
    replicated = Composition(replicates=("", "1"), shards=(ShardSpec("1.0"),))
    assert sorted(Layout(TREE, replicated).synced_at_init(TRAINING)[0]) == ["", "0", "1.2", "2"]  # "1.0": fully_shard
    assert not Layout(TREE, replicated).synced_at_init(TRAINING)[1]  # replicate hands DDP parameters only
    ignoring = Composition(replicates=("",), replicate_options=ReplicateOptions(ignored_modules=("1",)))
    assert sorted(Layout(TREE, ignoring).synced_at_init(TRAINING)[0]) == ["", "0", "2"]
    unsynced = replace(replicated, replicate_options=ReplicateOptions(init_sync=False))
    assert Layout(TREE, unsynced).synced_at_init(TRAINING) == ([], False)
    # a replicated member left out of every microbatch never builds its DDP
    never = replace(TRAINING, skips=tuple(Skip("1", step=s, microbatch=m) for s in range(2) for m in range(2)))
    assert sorted(Layout(TREE, replicated).synced_at_init(never)[0]) == ["", "0", "2"]
    ddp = Composition(wrapper=Wrapper.DDP)
    assert sorted(Layout(TREE, ddp).synced_at_init(TRAINING)[0]) == ["", "0", "1.0", "1.2", "2"]
    assert Layout(TREE, ddp).synced_at_init(TRAINING)[1]
    assert Layout(TREE, Composition(wrapper=Wrapper.FSDP1_FULL_SHARD)).synced_at_init(TRAINING) == ([], False)


def test_init_sync_broadcasts_what_rank_0_built(check_case: Any) -> None:
    """DistributedDataParallel documents ``init_sync``: the parameters and buffers are broadcast
    from rank 0 so that every replica starts from the same values. The other ranks shift what
    replicate manages before the call (fuzz._rank.compose.desynchronize), so parity with the
    reference holds only where that broadcast happened: under K12 (the broadcast skipped with
    ``forward_sync_buffers=False``) the same case is a mismatch."""
    _needs("forward_sync_buffers")
    comp = Composition(replicates=("",), replicate_options=ReplicateOptions(forward_sync_buffers=False))
    case = _parity(comp)
    check_case(case)
    check_case(_parity(Composition(wrapper=Wrapper.DDP)))
    with fault_pool(fault_env("K12_init_sync_gated_on_buffers"), world_size=2, deadline=60) as pool:
        failure = run_case(pool, get_property("parity"), case)
    assert failure is not None and failure.kind == "mismatch", failure and failure.summary


def test_static_graph_with_gradient_as_bucket_view(check_case: Any) -> None:
    opts = ReplicateOptions(static_graph=True, gradient_as_bucket_view=True, bucket_cap_mb=0.0001)
    fixed = tuple(Skip("1.0", step=s, microbatch=m) for s in range(2) for m in range(2))
    # replicate on a submodule beside fully_shard, the unused module the same on every microbatch
    comp = Composition(replicates=("1",), shards=(ShardSpec(""),), replicate_options=opts)
    check_case(_parity(comp, replace(TRAINING, skips=fixed)))


def test_more_replicate_options(check_case: Any) -> None:
    _needs("batched_grad_copy", "forward_sync_buffers", "bucket_cap_mb_list")
    opts = ReplicateOptions(
        bucket_cap_mb_list=(0.0, 0.0001),
        init_sync=False,
        dim=1,
        group=ReplicateGroup.PROCESS_GROUP,
        device_id=True,
        forward_sync_buffers=False,
    )
    check_case(_parity(Composition(replicates=("",), replicate_options=opts)))
    batched = ReplicateOptions(batched_grad_copy=True, gradient_as_bucket_view=True, bucket_cap_mb=0.0001)
    check_case(_parity(Composition(replicates=("",), replicate_options=batched)))
    mesh = ReplicateOptions(group=ReplicateGroup.DEVICE_MESH, skip_all_reduce_unused_params=True)
    fixed = tuple(Skip("1", step=s, microbatch=m) for s in range(2) for m in range(2))
    comp = Composition(replicates=("",), find_unused=True, replicate_options=mesh)
    check_case(_parity(comp, replace(TRAINING, skips=fixed)))


@pytest.mark.parametrize("context_fn", [ContextFn.SAVE_MATMULS, ContextFn.SAVE_MATMULS_LIST], ids=lambda c: c.value)
def test_selective_checkpoint_trains_like_the_reference(check_case: Any, context_fn: ContextFn) -> None:
    if not checkpoint_takes("context_fn"):
        pytest.skip("this torch's checkpoint takes no context_fn")
    opts = CheckpointOptions(context_fn=context_fn, determinism_check=DeterminismCheck.DEFAULT, early_stop=True)
    # regions inside fully_shard units (none inside a region: see fuzz.model.Composition)
    comp = Composition(shards=(ShardSpec(""), ShardSpec("1")), checkpoints=("1.0", "2"), checkpoint_options=opts)
    check_case(_parity(comp))
    # beside replicate
    replicated = Composition(replicates=("1",), shards=(ShardSpec(""),), checkpoints=("0",), checkpoint_options=opts)
    check_case(_parity(replicated))


def test_checkpoint_without_rng_state_or_early_stop(check_case: Any) -> None:
    opts = CheckpointOptions(preserve_rng_state=False, early_stop=False, determinism_check=DeterminismCheck.NONE)
    comp = Composition(shards=(ShardSpec(""),), checkpoints=("1",), checkpoint_first=False, checkpoint_options=opts)
    check_case(_parity(comp))


def test_checkpoint_use_reentrant_is_refused(rank_pool: Any, check_case: Any) -> None:
    if not checkpoint_takes("use_reentrant"):
        pytest.skip("this torch's checkpoint reads no use_reentrant")
    case = Case("invalid", 2, 3, InvalidBody(tree=TREE, misuse=Misuse.CHECKPOINT_USE_REENTRANT, path="1"))
    check_case(case)
    assert invalid_features(case)[0] == "misuse:checkpoint_use_reentrant"
    outcome = rank_pool.run(case)
    assert [o["raised"]["type"] for o in outcome.observations] == ["builtins.NotImplementedError"] * 2


# --------------------------------------------------------------------------------------------
# The strategies draw every option


_WIDE = settings(
    max_examples=3000, database=None, deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
)


class _Found(Exception):
    pass


def _reach(cases: Any, wanted: set[str]) -> set[str]:
    """The names of ``wanted`` that some drawn case's features include (a plain draw loop that
    stops once all are seen)."""
    seen: set[str] = set()

    @_WIDE
    @given(cases)
    def draw(case: Case) -> None:
        names = set(invalid_features(case) if case.property == "invalid" else features(case))
        seen.update(names & wanted)
        if seen == wanted:
            raise _Found

    with contextlib.suppress(_Found):
        draw()
    return seen


def test_strategies_draw_every_option() -> None:
    names = [
        *(
            f"replicate_opt:{n}"
            for n in ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "init_sync:False")
        ),
        *(f"replicate_opt:{n}" for n in ("dim", "group:process_group", "group:device_mesh", "device_id")),
        *(f"replicate_opt:{n}" for n in ("ignored_modules", "skip_all_reduce_unused_params")),
        *(f"checkpoint_opt:{n}" for n in ("preserve_rng_state:False", "early_stop:False", "early_stop:True")),
        *(f"checkpoint_opt:{n}" for n in ("context_fn:save_matmuls", "context_fn:save_matmuls_list")),
        *(f"checkpoint_opt:determinism_check:{v}" for v in ("default", "none")),
    ]
    if replicate_takes("batched_grad_copy"):  # torch 2.13
        names += ["replicate_opt:batched_grad_copy", "replicate_opt:bucket_cap_mb_list"]
        names += ["replicate_opt:forward_sync_buffers:True", "replicate_opt:forward_sync_buffers:False"]
    wanted = set(names)
    assert _reach(parity_cases(world_size=2), wanted) == wanted
    variants = {"variant:replicate_opt:static_graph", "variant:checkpoint_opt:context_fn:save_matmuls"}
    assert _reach(metamorphic_cases(world_size=2), variants) == variants
    assert _reach(invalid_cases(world_size=2), {"misuse:checkpoint_use_reentrant"})


@settings(max_examples=40, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_metamorphic_variants_keep_gradients_averaged(data: st.DataObject) -> None:
    case = data.draw(metamorphic_cases(world_size=2))
    body = case.body
    assert isinstance(body, MetamorphicBody)
    assert body.variant.replicate_options.neutral and body.composition.replicate_options.neutral


def test_torch_bugs_of_the_options_are_conditions_of_the_registry() -> None:
    """Selective checkpointing over a fully_shard unit, debug=True and delayed all-reduce are
    valid cases that meet known torch bugs (fuzz.known), not rules of the model."""
    sac = Composition(
        shards=(ShardSpec(""), ShardSpec("1.0")),
        checkpoints=("1",),
        checkpoint_options=CheckpointOptions(context_fn=ContextFn.SAVE_MATMULS),
    )
    debug = Composition(shards=(ShardSpec(""),), checkpoints=("1",), checkpoint_options=CheckpointOptions(debug=True))
    delay = Composition(replicates=("",), replicate_options=ReplicateOptions(delay_all_reduce=True))
    plain = Composition(shards=(ShardSpec(""), ShardSpec("1.0")), checkpoints=("2",))
    assert known.selective_over_unit(sac) and not known.selective_over_unit(plain)
    fsdp1 = Composition(
        wrapper=Wrapper.FSDP1_SHARD_GRAD_OP,
        auto_wrap=True,
        checkpoints=("0",),
        checkpoint_options=CheckpointOptions(context_fn=ContextFn.SAVE_MATMULS),
    )
    assert known.selective_over_unit(fsdp1)  # FSDP1's auto-wrapped blocks are units inside the region
    assert not known.selective_over_unit(replace(fsdp1, auto_wrap=False))
    assert known.checkpoint_debug(debug) and not known.checkpoint_debug(plain)
    assert known.delayed_all_reduce(delay) and not known.delayed_all_reduce(plain)
    assert known.mismatch_tags(delay) == known.DELAY_ALL_REDUCE_ROOT.tag
    for comp, bug in (
        (sac, known.SAC_OVER_FSDP_UNIT),
        (debug, known.CHECKPOINT_DEBUG),
        (delay, known.DELAY_ALL_REDUCE_ROOT),
    ):
        case = Case("parity", 2, 0, ParityBody(tree=TREE, composition=comp, training=TRAINING))
        assert bug in known.bugs_met(case)
