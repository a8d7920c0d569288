"""mixed_precision false alarms. Where an attention leaf's q, k and v read a fully_shard unit's
input: FSDP2's backward hook at the unit's boundary adds those three terms of the input's
gradient first, the reference adds them with the residual's term in another order, and in
bfloat16 / float16 the sums round apart (a gradient norm 6e-4 apart in bfloat16, 2e-5 in
float16, at two ranks). Layout.regroups_input_gradients names such units, and the judge then
applies the low precision's policy (fuzz.tolerance). Where a unit casts its output
(output_dtype), the backward-prefetch contract's watch sat behind the cast (below)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

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
    MixedPrecision,
    ModuleTree,
    ParityBody,
    ShardSpec,
    Training,
    case_from_json,
    case_to_json,
)
from fuzz.properties import get_property
from tests.conftest import fault_env, fault_pool

REGRESSIONS = Path(__file__).parent / "regressions"
NAMES = ["mp-attention-unit-regrouped-bf16.json", "mp-attention-unit-regrouped-fp16.json"]


def _body(name: str) -> ParityBody:
    body = case_from_json(json.loads((REGRESSIONS / name).read_text())).body
    assert isinstance(body, ParityBody)
    return body


@pytest.mark.parametrize("name", NAMES)
def test_a_unit_whose_attention_reads_its_input_regroups(name: str) -> None:
    body = _body(name)
    assert Layout(body.tree, body.composition).regroups_input_gradients()


def test_without_the_inner_unit_or_the_attention_nothing_regroups() -> None:
    name = "mp-attention-unit-regrouped-bf16.json"
    body = _body(name)
    outer = [s for s in body.composition.shards if s.path != "1.0"]  # the unit whose first leaf is the attention
    assert not Layout(body.tree, replace(body.composition, shards=tuple(outer))).regroups_input_gradients()
    raw = case_to_json(case_from_json(json.loads((REGRESSIONS / name).read_text())))
    raw["body"]["tree"]["root"]["children"][1]["children"][0]["children"][0]["kind"] = LeafKind.MLP.value
    mlp = case_from_json(raw).body
    assert isinstance(mlp, ParityBody)
    assert not Layout(mlp.tree, mlp.composition).regroups_input_gradients()  # an MLP reads its input once


@pytest.mark.parametrize("name", NAMES)
def test_cases_torch_gets_right_are_not_failures(check_case: Any, name: str) -> None:
    """Two campaign cases at two ranks (fully_shard with param_dtype bfloat16 / float16 around
    an attention leaf inside a residual block) that the float32 policy reported as mismatches."""
    check_case(case_from_json(json.loads((REGRESSIONS / name).read_text())))


# A fully_shard unit's output_dtype cast follows its pre-backward hook (FSDP2 registers that hook
# on the uncast output): the backward-prefetch contract watches the uncast output's node, so it
# runs right after the pre-backward hook, also where a policy per unit casts an output.

PREFETCH_TREE = ModuleTree(
    width=4, root=Block(children=(Leaf(LeafKind.LINEAR), Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.GELU)))))
)


def _prefetch_case() -> Case:
    cast = MixedPrecision(param_dtype=Dtype.BFLOAT16, output_dtype=Dtype.FLOAT32)
    comp = Composition(
        shards=(
            ShardSpec(path="0", mixed_precision=cast),
            ShardSpec(path="1", mixed_precision=cast),
            ShardSpec(path="", mixed_precision=MixedPrecision()),
        ),
        knobs=Knobs(backward_prefetch=1),
    )
    body = ParityBody(tree=PREFETCH_TREE, composition=comp, training=Training(steps=1, batch_per_rank=2))
    return Case(property="mixed_precision", world_size=2, seed=7, body=body)


def test_backward_prefetch_behind_an_output_cast_is_checked() -> None:
    """Unit '1' prefetches unit '0' in backward, both casting their outputs to float32: a
    prefetch that issues nothing (tests/faults/C02) is noticed (it was not: the check ran
    before the pre-backward hook, found the unit not in backward yet and stopped)."""
    case = _prefetch_case()
    with fault_pool(fault_env("C02_backward_prefetch_not_issued"), world_size=2, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is not None and "set_modules_to_backward_prefetch" in failure.summary, failure and failure.summary


def test_backward_prefetch_behind_an_output_cast_is_not_a_failure(check_case: Any) -> None:
    """A campaign case (a grouped unit whose members cast their outputs, backward_prefetch=2):
    the check ran late, at the second member's gradient, after the target's own backward had
    resharded it (a false alarm)."""
    check_case(_prefetch_case())
    check_case(case_from_json(json.loads((REGRESSIONS / "mp-backward-prefetch-output-cast.json").read_text())))
