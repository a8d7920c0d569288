"""FSDPModule knobs (fuzz.model.Knobs): cases with each knob pass on unmutated torch, and each
knob's oracle notices an injected fault of the code behind it (tests/faults)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from fuzz import known
from fuzz._rank.knobs import by_root
from fuzz.errors import CaseError
from fuzz.explore import run_case
from fuzz.model import (
    Block,
    Case,
    Composition,
    Dtype,
    Knobs,
    Layout,
    Leaf,
    LeafKind,
    MetamorphicBody,
    ModuleTree,
    Optimizer,
    ParityBody,
    ShardSpec,
    Skip,
    Training,
    case_from_json,
    check_composition,
    check_training,
)
from fuzz.pool import RankPool
from fuzz.properties import get_property
from strategies import parity_cases
from tests.conftest import fault_env, fault_pool

FAULTS = Path(__file__).parent / "faults"

#: A root block and a nested one, each holding a Linear: two fully_shard units under one root.
TREE = ModuleTree(
    width=4,
    root=Block(children=(Leaf(LeafKind.LINEAR), Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.RELU))))),
)
SHARDS = (ShardSpec(path="", reshard_after_forward=True), ShardSpec(path="1", reshard_after_forward=False))
TRAINING = Training(optimizer=Optimizer.SGD, lr=0.05, steps=2, batch_per_rank=2, grad_accum=2)


def _parity(knobs: Knobs, mesh: tuple[int, ...] = ()) -> Case:
    comp = Composition(shards=SHARDS, mesh=mesh, knobs=knobs)
    return Case(
        property="parity", world_size=2, seed=11, body=ParityBody(tree=TREE, composition=comp, training=TRAINING)
    )


def _metamorphic(knobs: Knobs) -> Case:
    comp = Composition(shards=SHARDS)
    body = MetamorphicBody(tree=TREE, composition=comp, variant=replace(comp, knobs=knobs), training=TRAINING)
    return Case(property="metamorphic", world_size=2, seed=12, body=body)


def _unneeded_in_backward(knobs: Knobs) -> Case:
    """A unit of its own for the first Linear in forward, resharded after forward."""
    shards = (*SHARDS, ShardSpec(path="0", reshard_after_forward=True))
    comp = Composition(shards=shards, knobs=knobs)
    return Case(
        property="parity", world_size=2, seed=13, body=ParityBody(tree=TREE, composition=comp, training=TRAINING)
    )


#: fault file -> a case whose knob's oracle must notice it.
CASES: dict[str, Case] = {
    "K01_divide_factor_ignored": _parity(Knobs(gradient_divide_factor=1.0, force_sum_reduction=True)),
    "K02_all_reduce_hook_skipped": _parity(Knobs(all_reduce_hook_scale=2.0)),
    "K03_reshard_noop": _parity(Knobs(explicit_unshard=True)),
    "K04_force_sum_no_postdivide": _parity(Knobs(force_sum_reduction=True)),
    "K05_late_reshard_not_recursive": _parity(Knobs(late_reshard_after_forward=True)),
    "K06_unshard_wait_noop": _metamorphic(Knobs(explicit_unshard=True)),
    "K31_reset_iter_state_no_reshard": _parity(Knobs(abort_and_reset=True)),
    "K32_unshard_in_backward_ignored": _unneeded_in_backward(Knobs(no_unshard_in_backward=True, backward_prefetch=1)),
    "K35_custom_all_gather_ignored": _parity(Knobs(custom_all_gather=True, forward_prefetch=1)),
    "K36_reduce_output_not_from_comm": _parity(Knobs(custom_reduce_scatter=True)),
    "K37_separate_reduce_scatter_group_ignored": _parity(
        Knobs(custom_all_gather=True, custom_reduce_scatter=True, separate_rs_group=True)
    ),
}

#: Knobs that change no numbers, as metamorphic variants.
NEUTRAL = [
    Knobs(forward_prefetch=1, backward_prefetch=1),
    Knobs(forward_prefetch=2, backward_prefetch=2),
    Knobs(reshard_after_backward_last=True),
    Knobs(late_reshard_after_forward=False),
    Knobs(explicit_unshard=True, force_sum_reduction=True),
    Knobs(abort_and_reset=True, forward_prefetch=1),
    Knobs(custom_all_gather=True, custom_reduce_scatter=True, backward_prefetch=1),
    Knobs(separate_rs_group=True, forward_prefetch=1),
]


def _skip_without_reset(knobs: Knobs) -> None:
    """reset_iter_state is newer than torch 2.11."""
    from torch.distributed.fsdp import FSDPModule

    if knobs.abort_and_reset and not hasattr(FSDPModule, "reset_iter_state"):
        pytest.skip("this torch's FSDPModule has no reset_iter_state")
    if knobs.no_unshard_in_backward and not hasattr(FSDPModule, "set_unshard_in_backward"):
        pytest.skip("this torch's FSDPModule has no set_unshard_in_backward")
    if (knobs.custom_all_gather or knobs.custom_reduce_scatter) and not hasattr(FSDPModule, "set_custom_all_gather"):
        pytest.skip("this torch's FSDPModule has no set_custom_all_gather")
    if knobs.separate_rs_group and not hasattr(FSDPModule, "set_separate_reduce_scatter_group"):
        pytest.skip("this torch's FSDPModule has no set_separate_reduce_scatter_group")


@pytest.mark.parametrize("name", sorted(CASES))
def test_knob_cases_pass_on_unmutated_torch(check_case: Any, name: str) -> None:
    body = CASES[name].body
    _skip_without_reset(body.composition.knobs if isinstance(body, ParityBody) else body.variant.knobs)
    check_case(CASES[name])


@pytest.mark.parametrize("knobs", NEUTRAL, ids=lambda k: "+".join(k.names()))
def test_neutral_knobs_train_like_without_them(check_case: Any, knobs: Knobs) -> None:
    _skip_without_reset(knobs)
    check_case(_metamorphic(knobs))


def test_scaling_knobs_on_hsdp(check_case: Any) -> None:
    """On a (1, 2) mesh (HSDP, one replica) the hook and the divide factor scale as on 1D."""
    check_case(_parity(Knobs(all_reduce_hook_scale=0.5, gradient_divide_factor=4.0, force_sum_reduction=True), (1, 2)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_knob_oracle_notices_its_fault(name: str) -> None:
    """Under the fault (applied in every rank by tests/faults/harness) the same case fails."""
    env = fault_env(name)
    case = CASES[name]
    with fault_pool(env, world_size=2, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is not None, name
    assert failure.kind == "mismatch", (name, failure.summary)


def test_gradient_scale_follows_the_layout() -> None:
    comp = Composition(
        shards=(ShardSpec(path="1"),),
        replicates=("",),
        knobs=Knobs(all_reduce_hook_scale=2.0, gradient_divide_factor=1.0, force_sum_reduction=True),
    )
    layout = Layout(TREE, comp)
    assert layout.gradient_scale("1.0", world_size=4) == 8.0  # hook 2, sum over 4 divided by 1
    assert layout.gradient_scale("0", world_size=4) == 1.0  # replicate's own: no knobs


def test_prefetch_stays_within_each_root() -> None:
    comp = Composition(shards=(ShardSpec("1"), ShardSpec("0"), ShardSpec("1.0")), replicates=("",))
    assert [[s.path for s in g] for g in by_root(comp)] == [["0"], ["1", "1.0"]]


def test_units_whose_parameters_backward_does_not_need() -> None:
    comp = _unneeded_in_backward(Knobs()).body.composition  # type: ignore[attr-defined]
    assert Layout(TREE, comp).unneeded_in_backward() == ["0"]
    assert Layout(TREE, replace(comp, checkpoints=("0",))).unneeded_in_backward() == []  # recomputed in backward
    assert Layout(TREE, Composition(shards=SHARDS)).unneeded_in_backward() == []  # "0" is in the root's unit
    with pytest.raises(CaseError, match="no_unshard_in_backward"):
        check_composition(TREE, Composition(shards=SHARDS, knobs=Knobs(no_unshard_in_backward=True)))


def test_custom_comms_on_hsdp(check_case: Any) -> None:
    """On a (2, 1) mesh the shard group is one rank's (nothing to all-gather or reduce-scatter);
    on (1, 2) the comms get the shard group of two."""
    for mesh in ((2, 1), (1, 2)):
        knobs = Knobs(custom_all_gather=True, custom_reduce_scatter=True, separate_rs_group=True)
        _skip_without_reset(knobs)
        check_case(_parity(knobs, mesh))


REGRESSIONS = Path(__file__).parent / "regressions"


@pytest.mark.parametrize("name", ["parity", "metamorphic"])
def test_custom_all_gather_after_an_integer_reshard_is_no_failure(name: str) -> None:
    """A soak at 4 ranks once reported these (false alarms): with reshard_after_forward=2 the
    backward all-gathers over the 2 ranks it resharded to, not the shard group of 4."""
    case = case_from_json(json.loads((REGRESSIONS / f"knobs-custom-all-gather-int-reshard-{name}.json").read_text()))
    _skip_without_reset(case.body.composition.knobs if name == "parity" else case.body.variant.knobs)  # type: ignore[union-attr]
    with RankPool(world_size=4, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is None, failure.summary


def test_knob_rules() -> None:
    with pytest.raises(CaseError, match="knobs"):
        Composition(knobs=Knobs(forward_prefetch=1))  # no fully_shard unit
    with pytest.raises(CaseError, match="late_reshard"):
        Composition(shards=(ShardSpec("", reshard_after_forward=2),), knobs=Knobs(late_reshard_after_forward=True))
    with pytest.raises(CaseError, match=r"0\.5 or 2\.0"):
        Knobs(all_reduce_hook_scale=3.0)
    with pytest.raises(CaseError, match="pg_allocator"):
        Knobs(pg_allocator=True, custom_reduce_scatter=True)  # documented: not together
    comp = Composition(shards=SHARDS, knobs=Knobs(forward_prefetch=1))
    with pytest.raises(CaseError, match="skips"):
        check_training(TREE, (comp,), replace(TRAINING, skips=(Skip(path="1", step=0),)))


def test_divide_factor_twice_condition() -> None:
    comp = Composition(shards=SHARDS, mesh=(2, 1), knobs=Knobs(gradient_divide_factor=2.0))
    assert not known.divide_factor_twice(comp, TRAINING, 2)  # float32, no force-sum: right
    assert known.divide_factor_twice(comp, replace(TRAINING, dtype=Dtype.FLOAT64), 2)
    forced = replace(comp, knobs=replace(comp.knobs, force_sum_reduction=True))
    assert known.divide_factor_twice(forced, TRAINING, 2)
    assert not known.divide_factor_twice(replace(forced, mesh=()), TRAINING, 2)  # shard group of 2


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(case=parity_cases(world_size=2))
def test_drawn_knobs_are_valid_for_their_training(case: Case) -> None:
    body = case.body
    assert isinstance(body, ParityBody)
    check_training(body.tree, (body.composition,), body.training)
