"""mixed_precision's numerics: training under a MixedPrecisionPolicy matches a reference that
applies the policy's casts by hand (fuzz/_rank/parity.py:HandCast), with every
microbatch reduced, with the ones before a step's last accumulated unreduced
(``set_requires_gradient_sync(False)``) or, on an HSDP mesh, reduce-scattered without the
all-reduce (``set_requires_all_reduce(False)``); the comparison notices a fault that reduces in
the wrong dtype (tests/faults/K07), one that accumulates unreduced gradients in the compute
dtype (tests/faults/K17) and one that keeps the partial reduction in it (tests/faults/K33).
Also with a policy per unit (the reference casts at each unit's boundary), with FSDPModule knobs
(the reference scales gradients as the knobs do) and with tensor parallelism."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fuzz.explore import run_case
from fuzz.model import (
    AccumSync,
    Block,
    Case,
    Composition,
    Dtype,
    Knobs,
    Layout,
    Leaf,
    LeafKind,
    MixedPrecision,
    ModuleTree,
    Optimizer,
    ParityBody,
    ShardSpec,
    Skip,
    TpPair,
    Training,
    case_from_json,
    mixed_precision_comparable,
)
from fuzz.pool import RankPool
from fuzz.properties import get_property
from fuzz.tolerance import mixed_precision_tolerance, tolerance_for
from tests.conftest import fault_env, fault_pool

FAULTS = Path(__file__).parent / "faults"
TREE = ModuleTree(
    width=6,
    root=Block(children=(Leaf(LeafKind.LINEAR), Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.GELU))))),
)


def _case(
    param: Dtype | None,
    reduce: Dtype | None,
    output: Dtype | None = None,
    world_size: int = 2,
    sync: AccumSync = AccumSync.ALWAYS,
    mesh: tuple[int, ...] = (),
) -> Case:
    inner = MixedPrecision(param_dtype=param, reduce_dtype=reduce)
    root = MixedPrecision(param_dtype=param, reduce_dtype=reduce, output_dtype=output, cast_forward_inputs=True)
    comp = Composition(
        shards=(ShardSpec(path="1", mixed_precision=inner), ShardSpec(path="", mixed_precision=root)), mesh=mesh
    )
    grad_accum = 2 if sync is AccumSync.ALWAYS else 3
    training = Training(
        optimizer=Optimizer.SGD, lr=0.1, steps=2, batch_per_rank=3, grad_accum=grad_accum, accum_sync=sync
    )
    body = ParityBody(tree=TREE, composition=comp, training=training)
    return Case(property="mixed_precision", world_size=world_size, seed=21, body=body)


POLICIES = [
    (Dtype.BFLOAT16, Dtype.FLOAT32, None),
    (Dtype.BFLOAT16, None, Dtype.FLOAT32),
    (Dtype.FLOAT16, Dtype.FLOAT16, None),
    (None, Dtype.BFLOAT16, None),
]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: "-".join(d.value if d else "none" for d in p))
def test_mixed_precision_matches_the_hand_cast_reference(check_case: Any, policy: Any) -> None:
    check_case(_case(*policy))


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: "-".join(d.value if d else "none" for d in p))
def test_unreduced_accumulation_matches_the_hand_cast_reference(check_case: Any, policy: Any) -> None:
    check_case(_case(*policy, sync=AccumSync.NO_GRAD_SYNC))


@pytest.mark.parametrize("mesh", [(2, 1), (1, 2)])
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: "-".join(d.value if d else "none" for d in p))
def test_partial_reduction_on_an_hsdp_mesh_matches_the_hand_cast_reference(
    check_case: Any, policy: Any, mesh: tuple[int, int]
) -> None:
    """set_requires_all_reduce(False): two microbatches of three reduce-scatter and keep the sum
    in the reduce dtype, the last all-reduces it. Over two ranks one stage is a single rank's,
    so the comparison is exact."""
    check_case(_case(*policy, sync=AccumSync.NO_ALL_REDUCE, mesh=mesh))


def test_partial_reduction_over_four_ranks_matches_the_hand_cast_reference() -> None:
    case = _case(Dtype.BFLOAT16, Dtype.FLOAT32, world_size=4, sync=AccumSync.NO_ALL_REDUCE, mesh=(2, 2))
    with RankPool(world_size=4, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is None, failure.summary


@pytest.mark.parametrize("mesh", [(2, 1), (1, 2)])
def test_the_partial_reduction_fault_is_noticed(mesh: tuple[int, int]) -> None:
    """bf16 compute, fp32 reduce on a 2-rank HSDP mesh: the partial sum kept in bf16 rounds
    (over (2, 1) the sum of two microbatches, over (1, 2) also the reduce-scatter)."""
    case = _case(Dtype.BFLOAT16, Dtype.FLOAT32, sync=AccumSync.NO_ALL_REDUCE, mesh=mesh)
    env = fault_env("K33_partial_reduction_in_compute_dtype")
    with fault_pool(env, world_size=2, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is not None and failure.kind == "mismatch", failure and failure.summary


def test_the_unreduced_accumulation_fault_is_noticed() -> None:
    """bf16 compute, fp32 reduce, two microbatches of three accumulated without reduction:
    FSDP2 documents the sum in the reduce dtype; summing in bf16 instead rounds it."""
    case = _case(Dtype.BFLOAT16, Dtype.FLOAT32, sync=AccumSync.NO_GRAD_SYNC)
    env = fault_env("K17_unsynced_accumulation_not_upcast")
    with fault_pool(env, world_size=2, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is not None and failure.kind == "mismatch", failure and failure.summary


def test_the_reduce_dtype_fault_is_noticed() -> None:
    """bf16 compute, fp32 reduce: reducing in bf16 instead rounds a two-term sum, which the
    float32 policy at two ranks notices."""
    case = _case(Dtype.BFLOAT16, Dtype.FLOAT32)
    env = fault_env("K07_reduce_dtype_ignored")
    with fault_pool(env, world_size=2, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is not None and failure.kind == "mismatch", failure and failure.summary


def test_which_cases_are_compared() -> None:
    comp = _case(Dtype.BFLOAT16, None).body.composition  # type: ignore[attr-defined]
    assert comp.hand_castable()
    no_root = Composition(shards=(ShardSpec(path="1", mixed_precision=MixedPrecision(param_dtype=Dtype.BFLOAT16)),))
    assert not no_root.hand_castable()  # a parameter under no unit, the input not cast by a root unit
    assert not replace(comp, shards=tuple(replace(s, mixed_precision=None) for s in comp.shards)).hand_castable()
    assert mixed_precision_comparable(Training(grad_accum=2, accum_sync=AccumSync.NO_GRAD_SYNC))
    assert mixed_precision_comparable(Training(grad_accum=2, accum_sync=AccumSync.NO_ALL_REDUCE))
    assert not mixed_precision_comparable(Training(steps=2, skips=(Skip(path="1", step=0),)))


def test_units_that_regroup_an_activations_gradient() -> None:
    case = case_from_json(json.loads((REGRESSIONS / "mp-residual-unit-regrouped-bf16.json").read_text()))
    body = case.body
    assert isinstance(body, ParityBody)
    assert Layout(body.tree, body.composition).regroups_input_gradients()
    plain = [s for s in body.composition.shards if s.path != "2.0"]  # the unit on the inner residual block
    assert not Layout(body.tree, replace(body.composition, shards=tuple(plain))).regroups_input_gradients()
    assert not Layout(TREE, _case(Dtype.BFLOAT16, None).body.composition).regroups_input_gradients()  # type: ignore[attr-defined]


def test_the_policy_is_full_precision_at_two_ranks() -> None:
    assert mixed_precision_tolerance("float32", ["bfloat16"], 2) == tolerance_for("float32")
    assert mixed_precision_tolerance("float32", ["bfloat16", "float16"], 4) == tolerance_for("bfloat16")


REGRESSIONS = Path(__file__).parent / "regressions"


@pytest.mark.parametrize(
    "name",
    [
        # bfloat16 reduced on a (2, 1) mesh: the two-stage reduction rounds apart from the
        # reference's one sum (torch is within bfloat16's rounding); judged as over more ranks
        "mp-hsdp-shard1-bf16-reduce.json",
        # float16 parameters: the reference's own update overflows to NaN in step 0, as the
        # composed run's does; from there on nothing is judged
        "mp-float16-update-overflows.json",
        # bfloat16 compute, a unit on a residual block that begins another residual block's
        # children: FSDP2 adds the unit's input-gradient terms first, the reference in
        # another order (a bfloat16 ulp in the first layer's gradient); judged as inexact
        "mp-residual-unit-regrouped-bf16.json",
        # the same in float16 with SGD: a parameter after an update differs by lr times an ulp
        # of its gradient, more than its own tolerance; judged before the first update
        "mp-residual-unit-regrouped-fp16-sgd.json",
    ],
)
def test_cases_torch_gets_right_are_not_failures(check_case: Any, name: str) -> None:
    """Cases a soak once reported as mismatches where torch was right (false alarms)."""
    check_case(case_from_json(json.loads((REGRESSIONS / name).read_text())))


@pytest.mark.parametrize(
    "name",
    [
        # SGD over 4 ranks in bfloat16, gradients near 12 (an ulp of 0.0625) and a parameter
        # near -0.018: the update rounds apart by lr x 0.0625, far over the parameter's tolerance
        "mp-sgd-four-ranks-bf16-large-gradient.json",
        # a (2, 2) mesh reducing in bfloat16, a LayerNorm over one feature (which divides
        # rounding noise by sqrt(eps)): the second step's gradient norm 4% apart
        "mp-hsdp-layer-norm-one-feature-bf16-reduce.json",
    ],
)
def test_inexact_four_rank_cases_are_judged_before_the_first_update(name: str) -> None:
    """False alarms of a 4-rank soak: an inexact low-precision reduction rounds the gradients
    apart by their own ulps, which an update carries into the parameters."""
    case = case_from_json(json.loads((REGRESSIONS / name).read_text()))
    assert case.world_size == 4
    with RankPool(world_size=4, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is None, failure.summary


def test_adam_over_an_inexact_reduction_is_judged_before_its_first_update() -> None:
    """bfloat16 reduced over 4 ranks rounds apart from the reference; Adam turned that into a
    sign flip of a near-zero gradient (a parameter 2 x lr off) in a soak: a false alarm."""
    case = case_from_json(json.loads((REGRESSIONS / "mp-adam-four-ranks-bf16.json").read_text()))
    assert case.world_size == 4
    with RankPool(world_size=4, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is None, failure.summary


# --------------------------------------------------------------------------------------------
# A policy per unit, FSDPModule knobs, tensor parallelism

BF16, FP16, FP32 = Dtype.BFLOAT16, Dtype.FLOAT16, Dtype.FLOAT32


def _per_unit_case(
    inner: MixedPrecision,
    root: MixedPrecision,
    sync: AccumSync = AccumSync.ALWAYS,
    knobs: Knobs | None = None,
) -> Case:
    comp = Composition(
        shards=(ShardSpec(path="1", mixed_precision=inner), ShardSpec(path="", mixed_precision=root)),
        knobs=knobs or Knobs(),
    )
    training = Training(optimizer=Optimizer.SGD, lr=0.1, steps=2, batch_per_rank=3, grad_accum=2, accum_sync=sync)
    body = ParityBody(tree=TREE, composition=comp, training=training)
    return Case(property="mixed_precision", world_size=2, seed=5, body=body)


PER_UNIT = [
    # a float32 island in a bfloat16 model: the unit casts its input up and its output back
    (MixedPrecision(param_dtype=FP32, output_dtype=BF16), MixedPrecision(param_dtype=BF16)),
    # a float16 unit reducing in float32 in a float32 model
    (MixedPrecision(param_dtype=FP16, reduce_dtype=FP32, output_dtype=FP32), MixedPrecision(output_dtype=BF16)),
    # a bfloat16 model whose inner unit reduces in float32 and leaves its input uncast
    (
        MixedPrecision(param_dtype=BF16, reduce_dtype=FP32, cast_forward_inputs=False),
        MixedPrecision(param_dtype=BF16, reduce_dtype=BF16),
    ),
]


@pytest.mark.parametrize("sync", [AccumSync.ALWAYS, AccumSync.NO_GRAD_SYNC], ids=lambda s: s.value)
@pytest.mark.parametrize("policies", PER_UNIT, ids=["fp32-island", "fp16-unit", "reduce-per-unit"])
def test_a_policy_per_unit_matches_the_hand_cast_reference(check_case: Any, policies: Any, sync: AccumSync) -> None:
    case = _per_unit_case(*policies, sync=sync)
    assert isinstance(case.body, ParityBody) and case.body.composition.hand_castable()
    check_case(case)


def test_a_reduce_dtype_of_one_unit_is_judged() -> None:
    """Only the inner unit reduces in float32 (its compute dtype bfloat16, the root's float32):
    reducing it in bfloat16 instead is noticed."""
    case = _per_unit_case(MixedPrecision(param_dtype=BF16, reduce_dtype=FP32, output_dtype=FP32), MixedPrecision())
    with fault_pool(fault_env("K07_reduce_dtype_ignored"), world_size=2, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is not None and failure.kind == "mismatch", failure and failure.summary


KNOBS = Knobs(forward_prefetch=1, backward_prefetch=1, explicit_unshard=True, all_reduce_hook_scale=2.0)


def test_knobs_under_a_policy_per_unit_match_the_hand_cast_reference(check_case: Any) -> None:
    check_case(_per_unit_case(*PER_UNIT[0], knobs=KNOBS))


def test_the_all_reduce_hook_under_mixed_precision_is_judged() -> None:
    """The reference scales the gradients by the hook's factor: a hook never called is noticed."""
    case = _per_unit_case(*PER_UNIT[0], knobs=KNOBS)
    with fault_pool(fault_env("K02_all_reduce_hook_skipped"), world_size=2, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is not None and failure.kind == "mismatch", failure and failure.summary


TP_TREE = ModuleTree(
    width=4,
    root=Block(
        children=(
            Leaf(LeafKind.LINEAR),
            Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.GELU), Leaf(LeafKind.LINEAR)), residual=True),
        )
    ),
)


def _tp_case(reduce: Dtype) -> Case:
    inner = MixedPrecision(param_dtype=BF16, reduce_dtype=reduce, output_dtype=FP32)
    comp = Composition(
        shards=(ShardSpec(path="1", mixed_precision=inner), ShardSpec(path="", mixed_precision=MixedPrecision())),
        tp=(TpPair("1.0", "1.2"),),
        tp_size=2,
    )
    training = Training(optimizer=Optimizer.SGD, lr=0.1, steps=2, batch_per_rank=2)
    body = ParityBody(tree=TP_TREE, composition=comp, training=training)
    return Case(property="mixed_precision", world_size=4, seed=3, body=body)


def test_tensor_parallelism_under_a_policy_matches_the_hand_cast_reference() -> None:
    case = _tp_case(FP32)
    assert isinstance(case.body, ParityBody) and case.body.composition.hand_castable()
    with RankPool(world_size=4, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is None, failure.summary


def test_tensor_parallelism_under_a_policy_is_judged() -> None:
    """float16 reduced over the two data-parallel ranks, divided twice by a fault: noticed at
    the float16 policy that tensor parallelism's inexact sums bring."""
    case = _tp_case(FP16)
    with fault_pool(fault_env("K16_fp16_postdivide_whole_factor"), world_size=4, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is not None and failure.kind == "mismatch", failure and failure.summary
