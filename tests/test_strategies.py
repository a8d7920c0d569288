"""The strategies: every case they draw is valid and builds, the features that matter are drawn
often enough to matter, and bad arguments raise InvalidArgument naming the argument."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from torch import nn

import strategies._cases as strategies_cases
from fuzz._rank.models import Attention, Mlp, TreeBlock, TreeDict, TreeList, build_model, main_output, sample_batch
from fuzz.errors import InvalidArgument, ShardfuzzError
from fuzz.model import Block, Case, Leaf, LeafKind, Optimizer, ParityBody, Wrapper, case_from_json, case_to_json
from fuzz.properties.parity import features
from strategies import (
    compositions,
    metamorphic_cases,
    mixed_precision_cases,
    module_trees,
    parity_cases,
    reshard_values,
    trainings,
)

FAST = settings(
    max_examples=60,
    database=None,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)

_LEAF_TYPES = {
    LeafKind.LINEAR: nn.Linear,
    LeafKind.LAYER_NORM: nn.LayerNorm,
    LeafKind.RELU: nn.ReLU,
    LeafKind.TANH: nn.Tanh,
    LeafKind.GELU: nn.GELU,
    LeafKind.CONV1D: nn.Conv1d,
    LeafKind.DROPOUT: nn.Dropout,
    LeafKind.RMS_NORM: nn.RMSNorm,
    LeafKind.MLP: Mlp,
    LeafKind.ATTENTION: Attention,
    LeafKind.EMBEDDING: nn.Embedding,
    LeafKind.HEAD: nn.Linear,
}
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


# --------------------------------------------------------------------------------------------
# Every drawn case is valid and builds


def _check_case_builds(case: Case, world_size: int) -> None:
    assert case.property == "parity"
    assert case.world_size == world_size
    body = case.body
    assert isinstance(body, ParityBody)
    # validates again through the codec (the constructors already validated it once)
    assert case_from_json(json.loads(json.dumps(case_to_json(case)))) == case

    tree = body.tree
    model = build_model(tree, torch.device("cpu"))
    assert isinstance(model, TreeBlock)
    for path, node in tree.paths().items():
        module = model.get_submodule(path)
        if isinstance(node, Leaf):
            assert isinstance(module, _LEAF_TYPES[node.kind]), (path, node, module)
        else:
            assert isinstance(module, (TreeBlock, TreeList, TreeDict)), (path, node, module)  # containers too
            assert len(list(module.children())) == len(node.children)
    for spec in body.composition.shards:
        assert any(p.numel() for p in model.get_submodule(spec.path).parameters()), spec.path
    assert sum(p.numel() for p in model.parameters()) > 0

    dtype = _DTYPES[body.training.dtype.value]
    model = model.to(dtype)
    x, target = sample_batch(tree, 2, torch.Generator().manual_seed(case.seed), dtype)
    with torch.no_grad():
        y = main_output(model(x))  # a root returning a tuple or a dict: its first element
    lead = (2, tree.seq) if tree.seq else (2,)
    assert y.shape == (*lead, tree.vocab if tree.head is not None else tree.width)
    assert target.shape == (lead if tree.head is not None else y.shape)
    assert y.dtype == dtype
    assert torch.isfinite(y).all()
    if tree.tied is not None:
        embedding, head = (model.get_submodule(p) for p in tree.tied)
        assert head.weight is embedding.weight


@FAST
@given(parity_cases(world_size=2))
def test_parity_cases_world_size_2_validate_and_build(case: Case) -> None:
    _check_case_builds(case, 2)


@FAST
@given(parity_cases(world_size=4))
def test_parity_cases_world_size_4_validate_and_build(case: Case) -> None:
    _check_case_builds(case, 4)


@FAST
@given(parity_cases(world_size=1, max_depth=1, max_steps=1))
def test_parity_cases_respect_their_bounds(case: Case) -> None:
    _check_case_builds(case, 1)
    body = case.body
    assert isinstance(body, ParityBody)
    assert all(isinstance(c, Leaf) for c in body.tree.root.children)
    assert body.training.steps == 1
    assert all(isinstance(s.reshard_after_forward, bool) for s in body.composition.shards)


@FAST
@given(st.data())
def test_compositions_shard_children_before_ancestors_and_root_last(data: st.DataObject) -> None:
    tree = data.draw(module_trees(max_depth=4, max_children=3))
    comp = data.draw(compositions(tree, world_size=6))
    order = [p for api, p in comp.steps() if api == "fully_shard"]
    # The root is managed last: fully_shard on it, or replicate on it.
    assert (order and order[-1] == "") or comp.replicates == ("",)
    assert len(set(order)) == len(order)
    applied: list[str] = []
    for p in order:
        members = next(s.paths for s in comp.shards if s.path == p)
        for m in members:
            assert not any(a == "" or m.startswith(a + ".") for a in applied), f"{m} after an ancestor in {applied}"
        applied += members
    shard_size = comp.mesh[1] if comp.mesh else 6
    for s in comp.shards:
        assert s.reshard_after_forward in (True, False) or shard_size % s.reshard_after_forward == 0


@FAST
@given(trainings(max_steps=5, max_batch_per_rank=4))
def test_trainings_pair_adam_with_float64(training: Any) -> None:
    assert 1 <= training.steps <= 5
    assert 1 <= training.batch_per_rank <= 4
    assert training.eps >= 1e-4
    if training.optimizer is not Optimizer.SGD:
        assert training.dtype.value == "float64"
        assert training.momentum == 0.0


@pytest.mark.parametrize(("world_size", "values"), [(1, set()), (2, set()), (4, {2}), (6, {2, 3}), (12, {2, 3, 4, 6})])
def test_reshard_values_are_bools_and_proper_divisors(world_size: int, values: set[int]) -> None:
    seen: set[Any] = set()

    @FAST
    @given(reshard_values(world_size))
    def collect(v: bool | int) -> None:
        seen.add((type(v), v))

    collect()
    ints = {v for t, v in seen if t is int}
    assert ints <= values
    assert (bool, True) in seen
    assert (bool, False) in seen
    if values:
        assert ints, f"no int drawn for world_size={world_size}"


# --------------------------------------------------------------------------------------------
# Feature coverage

_N_FEATURE_EXAMPLES = 500
_MIN_RATE = 0.05


def _feature_counts(world_size: int, cases: Any = parity_cases) -> tuple[Counter[str], int]:
    counts, n = _derandomized_feature_counts(world_size, cases)
    return Counter(counts), n


@cache  # derandomized: the same sample every time, so several tests share one draw
def _derandomized_feature_counts(world_size: int, cases: Any) -> tuple[Counter[str], int]:
    counts: Counter[str] = Counter()
    n = 0

    # Derandomized: a rate is a statistic of the sample, and a test must not fail by chance.
    @settings(
        max_examples=_N_FEATURE_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(cases(world_size=world_size))
    def collect(case: Case) -> None:
        nonlocal n
        n += 1
        fs = set(features(case))
        # each leaf kind counts whether it has a bias or not
        fs |= {f.removesuffix(":no-bias") for f in fs if f.startswith("leaf:")}
        counts.update(fs)

    collect()
    return counts, n


def _assert_rates(counts: Counter[str], n: int, wanted: list[str]) -> None:
    assert n >= _N_FEATURE_EXAMPLES * 0.9, n
    rare = {f: counts[f] / n for f in wanted if counts[f] < _MIN_RATE * n}
    assert not rare, f"features drawn in under {_MIN_RATE:.0%} of {n} cases: {rare}; all: {dict(counts)}"


def test_features_are_generated_at_a_useful_rate() -> None:
    counts, n = _feature_counts(2)
    wanted = [
        *(f"leaf:{k.value}" for k in LeafKind),
        "block:residual",
        "shards:uneven",
        "shards:empty",
        "dtype:float32",
        "dtype:float64",
        *(f"optimizer:{o.value}" for o in Optimizer),
        "reshard_after_forward:True",
        "reshard_after_forward:False",
        "shard_placement_fn:Shard(1)",
        "param:frozen",
        "block:own-param",
        "block:buffer",
        "replicate:root",
        "checkpoint:before_fully_shard",
        "checkpoint:after_fully_shard",
        "mesh:2",
        "mesh:1x2",
        "mesh:2x1",
        "grad_accum:always",
        "grad_accum:no_grad_sync",
        "zero_grad:set_to_none=False",
        "input:same-on-every-rank",
        "param_groups:2",
        "sgd:momentum",
        "init:meta",
    ]
    _assert_rates(counts, n, wanted)
    # These need a particular tree shape (two parameter modules at one depth; a module left
    # over for replicate), so they come rarer; 2% is still dozens per minute of a campaign.
    scarce = {f: counts[f] / n for f in ("fully_shard:grouped", "replicate:sub") if counts[f] < 0.02 * n}
    assert not scarce, scarce
    # Wrappers are one case in five, spread over five kinds.
    wrappers = [f"wrapper:{w.value}" for w in Wrapper if w is not Wrapper.NONE]
    assert sum(counts[f] + counts[f + ":auto_wrap"] for f in wrappers) >= 0.1 * n
    # world_size=2 has no divisor other than 1 and itself
    assert counts["reshard_after_forward:int"] == 0


@pytest.mark.parametrize("wrapper", [w for w in Wrapper if w is not Wrapper.NONE], ids=lambda w: w.value)
def test_every_wrapper_kind_is_reachable(wrapper: Wrapper) -> None:
    # Hypothesis does not draw sampled_from uniformly, so a fixed-size sample may miss a kind;
    # reachability is what matters (a campaign runs thousands of cases).
    found = find(
        parity_cases(world_size=2),
        lambda c: isinstance(c.body, ParityBody) and c.body.composition.wrapper is wrapper,
        settings=settings(
            max_examples=2000, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
        ),
    )
    assert isinstance(found.body, ParityBody) and found.body.composition.wrapper is wrapper


def test_mixed_precision_fields_are_generated_at_a_useful_rate() -> None:
    counts, n = _feature_counts(2, mixed_precision_cases)
    wanted = [
        "mp:param_dtype:bfloat16",
        "mp:param_dtype:float16",
        "mp:reduce_dtype:float32",
        "mp:reduce_dtype:bfloat16",
        "mp:output_dtype:float32",
        "mp:output_dtype:bfloat16",
        "mp:no_cast_forward_inputs",
    ]
    _assert_rates(counts, n, wanted)


def test_metamorphic_variants_cover_every_change() -> None:
    counts, n = _feature_counts(2, metamorphic_cases)
    wanted = ["variant:mesh:2", "variant:mesh:2x1", "variant:checkpoint:before_fully_shard", "variant:mesh:1x2"]
    _assert_rates(counts, n, [*wanted, "variant:init:meta"])
    assert sum(v for k, v in counts.items() if k.startswith("variant:wrapper:")) >= _MIN_RATE * n


def test_int_reshard_after_forward_is_generated_at_a_useful_rate() -> None:
    counts, n = _feature_counts(4)
    _assert_rates(counts, n, ["reshard_after_forward:int", "reshard_after_forward:True", "reshard_after_forward:False"])


def test_features_of_a_hand_built_case() -> None:
    from fuzz.model import Composition, ModuleTree, ShardSpec, Training

    tree = ModuleTree(
        width=3,
        root=Block(children=(Block(children=(Leaf(LeafKind.LINEAR, bias=False), Leaf(LeafKind.GELU)), residual=True),)),
    )
    body = ParityBody(
        tree=tree,
        composition=Composition(shards=(ShardSpec(path="0", reshard_after_forward=2, shard_dim=1), ShardSpec(path=""))),
        training=Training(steps=2),
    )
    fs = features(Case(property="parity", world_size=4, seed=0, body=body))
    assert fs == sorted(fs)
    assert set(fs) == {
        "optimizer:sgd",
        "steps:2",
        "dtype:float32",
        "shards:uneven",
        "shards:empty",
        "leaf:linear:no-bias",
        "leaf:gelu",
        "block:residual",
        "reshard_after_forward:int",
        "reshard_after_forward:True",
        "shard_placement_fn:Shard(1)",
        "fully_shard:count:2",
        "mesh:4",
    }


# --------------------------------------------------------------------------------------------
# Bad arguments


def _draw_once(make: Callable[[], st.SearchStrategy[Any]]) -> None:
    """Build the strategy and draw from it inside a test, where lazy argument checks run.

    (``.example()`` would warn NonInteractiveExampleWarning, an error under this suite's
    filterwarnings.)
    """

    @settings(max_examples=1, database=None, deadline=None, phases=[Phase.generate])
    @given(st.data())
    def draw(data: st.DataObject) -> None:
        data.draw(make())

    draw()


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: module_trees(max_depth=0), "max_depth"),
        (lambda: module_trees(max_depth=99), "max_depth"),
        (lambda: module_trees(max_children=0), "max_children"),
        (lambda: parity_cases(world_size=0), "world_size"),
        (lambda: parity_cases(world_size=-3), "world_size"),
        (lambda: parity_cases(world_size=True), "world_size"),
        (lambda: parity_cases(world_size=2, max_depth=7), "max_depth"),
        (lambda: parity_cases(world_size=2, max_steps=0), "max_steps"),
        (lambda: trainings(max_steps=0), "max_steps"),
        (lambda: trainings(max_steps=17), "max_steps"),
        (lambda: trainings(max_steps=2.5), "max_steps"),  # type: ignore[arg-type]
        (lambda: trainings(max_batch_per_rank=0), "max_batch_per_rank"),
        (lambda: reshard_values(0), "world_size"),
        (lambda: reshard_values(-1), "world_size"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_arguments_raise_invalid_argument(make: Callable[[], st.SearchStrategy[Any]], name: str) -> None:
    with pytest.raises(InvalidArgument, match=name) as info:
        _draw_once(make)
    assert isinstance(info.value, ShardfuzzError)
    assert isinstance(info.value, ValueError)


def test_reshard_values_checks_eagerly() -> None:
    with pytest.raises(InvalidArgument, match=r"world_size=0"):
        reshard_values(0)


def test_compositions_bad_world_size() -> None:
    tree = module_trees()
    with pytest.raises(InvalidArgument, match="world_size"):
        _draw_once(lambda: tree.flatmap(lambda t: compositions(t, world_size=0)))


def test_world_size_above_the_case_maximum_is_an_invalid_argument() -> None:
    from fuzz.model import MAX_WORLD_SIZE

    with pytest.raises(InvalidArgument, match="world_size"):
        _draw_once(lambda: parity_cases(world_size=MAX_WORLD_SIZE + 1))


# --------------------------------------------------------------------------------------------
# Training schedules: unused parameters, parameters unfrozen later, torch.compile


def test_training_schedules_are_generated_at_a_useful_rate() -> None:
    for cases in (parity_cases, metamorphic_cases, mixed_precision_cases):
        counts, n = _feature_counts(2, cases)
        _assert_rates(counts, n, ["param:unused"])
        # Unfreezing needs a frozen leaf and a second step: rarer, still dozens a minute.
        assert counts["param:unfrozen_later"] >= 0.02 * n, (cases, dict(counts))
        # torch.compile costs ~0.5 s a case on CPU (Dynamo tracing; ~5x a small case): rare.
        compiled = counts["compile:eager"] + counts["compile:aot_eager"]
        assert compiled <= 0.06 * n, (cases, compiled)


def test_find_unused_parameters_meets_unused_parameters() -> None:
    """find_unused_parameters=True is drawn for DDP and replicate, and together with modules they
    manage left out of forward (what it exists for), in parity and metamorphic cases."""
    for cases in (parity_cases, metamorphic_cases):
        counts, n = _feature_counts(2, cases)
        on = counts["find_unused_parameters"] + counts["variant:find_unused_parameters"]
        assert on >= 0.05 * n, (cases, dict(counts))
    found: list[Case] = []

    @settings(max_examples=5000, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(parity_cases(world_size=2))
    def draw(case: Case) -> None:
        body = case.body
        assert isinstance(body, ParityBody)
        comp, paths = body.composition, body.tree.paths()
        skipped = [s for s in body.training.skips if _param_leaves(paths[s.path])]
        if comp.find_unused and skipped and (comp.wrapper.value == "ddp" or "" in comp.replicates):
            found.append(case)
            raise _Found

    with pytest.raises(_Found):
        draw()


@pytest.mark.parametrize("feature", ["compile:eager", "compile:aot_eager", "param:unused:some-microbatches"])
@pytest.mark.parametrize("cases", [parity_cases, metamorphic_cases, mixed_precision_cases], ids=lambda s: s.__name__)
def test_every_training_schedule_is_reachable(cases: Any, feature: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if cases is metamorphic_cases and feature.endswith("some-microbatches"):
        pytest.skip("metamorphic cases have one microbatch per step")
    # Reachability, not rate (test_training_schedules_are_generated_at_a_useful_rate bounds that):
    # compiling one case in 2 instead of COMPILE_ODDS finds a compiled case in tens of draws.
    monkeypatch.setattr(strategies_cases, "COMPILE_ODDS", 2)
    found: list[Case] = []

    # A plain draw loop: find() gave up early on rare features under some Hypothesis versions.
    @settings(max_examples=10_000, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(cases(world_size=2))
    def draw(case: Case) -> None:
        if feature in features(case):
            found.append(case)
            raise _Found

    with pytest.raises(_Found):
        draw()
    assert feature in features(found[0])


class _Found(Exception):
    pass


@FAST
@given(parity_cases(world_size=2))
def test_schedules_keep_to_the_api_rules(case: Case) -> None:
    """Skips leave a trainable parameter in every forward; none names the root; DDP sees an
    unused parameter of its own only with find_unused_parameters=True, FSDP1 never under an
    optimizer that tells zero from None; no leaf DDP manages is unfrozen later."""
    from fuzz.model import Optimizer, Wrapper

    body = case.body
    assert isinstance(body, ParityBody)
    t, comp, paths = body.training, body.composition, body.tree.paths()
    assert all(s.path in paths and s.path for s in t.skips)
    with_params = [s for s in t.skips if any(True for _ in _param_leaves(paths[s.path]))]
    if comp.wrapper is Wrapper.DDP:
        assert comp.find_unused or not with_params
        assert not t.unfreeze
    elif comp.wrapper is not Wrapper.NONE and with_params:
        assert t.optimizer is Optimizer.SGD and t.momentum == 0.0
    for u in t.unfreeze:
        leaf = paths[u.path]
        assert isinstance(leaf, Leaf) and leaf.frozen and 1 <= u.step < t.steps


def _param_leaves(node: Any) -> Any:
    from fuzz.model import PARAM_LEAVES, iter_paths

    if isinstance(node, Leaf):
        return [node] if node.kind in PARAM_LEAVES else []
    return [
        n for _, n in iter_paths(node) if (isinstance(n, Leaf) and n.kind in PARAM_LEAVES) or getattr(n, "scale", False)
    ]


_SCHEDULE_BUGS = (":unused-no-all-reduce", ":unfrozen-unresharded", ":unfrozen-frozen-unit")


def test_known_bugs_of_training_schedules_stay_rare() -> None:
    """The known bugs the schedules meet (fuzz.properties.parity.api_of) are drawn at about
    1 in KNOWN_BUG_ODDS of the cases that could meet them, not never."""
    from fuzz.properties.parity import api_of

    counts: Counter[str] = Counter()

    @settings(
        max_examples=1500,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(parity_cases(world_size=2))
    def collect(case: Case) -> None:
        body = case.body
        assert isinstance(body, ParityBody)
        api = api_of(body.composition, body.tree, body.training)
        counts.update(s for s in _SCHEDULE_BUGS if s in api)
        counts["all"] += 1

    collect()
    assert sum(counts[s] for s in _SCHEDULE_BUGS) <= 0.01 * counts["all"], counts


def test_cpu_offload_is_drawn_for_accelerator_pools_only() -> None:
    """CPUOffloadPolicy needs an accelerator: with ``accelerator=True`` the training strategies
    draw it (and the metamorphic variant that turns it on or off); on CPU never."""
    from strategies import metamorphic_cases, mixed_precision_cases, parity_cases

    quick = settings(max_examples=100, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))

    def offloaded(case: Any) -> bool:
        comps = [getattr(case.body, n, None) for n in ("composition", "variant")]
        return any(s.offload for c in comps if c is not None for s in c.shards)

    for strategy in (parity_cases, mixed_precision_cases, metamorphic_cases):
        assert offloaded(find(strategy(world_size=2, accelerator=True), offloaded, settings=quick))

        @quick
        @given(strategy(world_size=2))
        def never_on_cpu(case: Any) -> None:
            assert not offloaded(case)

        never_on_cpu()

    def toggles(case: Any) -> bool:
        base, variant = ({s.offload for s in c.shards} for c in (case.body.composition, case.body.variant))
        return bool(base) and bool(variant) and base != variant and len(variant) == 1

    # one variant kind in nine turns offload on or off: a wider search than the others
    wide = settings(quick, max_examples=500)
    assert toggles(find(metamorphic_cases(world_size=2, accelerator=True), toggles, settings=wide))


def test_dropping_unfrozen_leaves_keeps_the_skips_valid() -> None:
    """Keeping a known unfreeze bug rare drops the unfrozen leaves; a skip that relied on one of
    them for a trainable parameter must go too, or the draw raises CaseError (it did for the
    benchmark's parity cases at world size 1, seed 0, within 200 draws)."""
    from fuzz.bench import sample_cases

    assert len(sample_cases(1, 200, 0)) == 200


# --------------------------------------------------------------------------------------------
# mixed_precision: a policy per unit, FSDPModule knobs, tensor parallelism


@cache
def _mixed_precision_sample(world_size: int) -> tuple[Case, ...]:
    cases: list[Case] = []

    @settings(
        max_examples=_N_FEATURE_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(mixed_precision_cases(world_size=world_size))
    def collect(case: Case) -> None:
        cases.append(case)

    collect()
    return tuple(cases)


@pytest.mark.parametrize("world_size", [2, 4])
def test_mixed_precision_draws_per_unit_policies_knobs_and_tp_and_judges_them(world_size: int) -> None:
    """Each new dimension is drawn in a useful share of the cases, and in cases whose numerics
    are compared with the hand-cast reference (feature mp:numerics), not only their contracts."""
    cases = _mixed_precision_sample(world_size)
    n = len(cases)
    per_case = [set(features(c)) for c in cases]
    dimensions = {
        "per-unit policies": lambda fs: "mp:per_unit" in fs,
        "a float32 unit": lambda fs: "mp:param_dtype:float32" in fs,
        "knobs": lambda fs: any(f.startswith("knob:") for f in fs),
    }
    if world_size == 4:
        dimensions["tensor parallelism"] = lambda fs: "tp:size2" in fs
    for name, has in dimensions.items():
        drawn = sum(1 for fs in per_case if has(fs))
        judged = sum(1 for fs in per_case if has(fs) and "mp:numerics" in fs)
        assert drawn >= _MIN_RATE * n, (name, drawn, n)
        assert judged >= 0.4 * drawn, (name, judged, drawn)


@pytest.mark.parametrize("world_size", [2, 4])
def test_mixed_precision_policies_meet_the_dtypes_their_layers_run_in(world_size: int) -> None:
    """Every drawn composition keeps to the dtypes its units' inputs arrive in (fitting it
    changes nothing), and the plain model under its casts, as the hand-cast reference applies
    them, runs forward: no dtype mismatch by construction."""
    from fuzz._rank.parity import HandCast
    from strategies._compositions import fitted_precision

    for case in _mixed_precision_sample(world_size)[:150]:
        body = case.body
        assert isinstance(body, ParityBody)
        comp = body.composition
        assert fitted_precision(comp) == comp
        model = build_model(body.tree, torch.device("cpu"))
        x, _ = sample_batch(body.tree, 2, torch.Generator().manual_seed(case.seed), torch.float32)
        with torch.no_grad():
            HandCast(body.tree, comp, torch.float32).shadow(model)(x)


def test_fitted_precision_repairs_what_a_dropped_unit_or_a_group_breaks() -> None:
    from fuzz.model import Composition, Dtype, MixedPrecision, ShardSpec
    from strategies._compositions import fitted_precision

    bf16, fp32 = Dtype.BFLOAT16, Dtype.FLOAT32
    low = MixedPrecision(param_dtype=bf16)
    # '0.0' was drawn inside a float32 unit on '0'; without it, it sits in the root's bfloat16
    comp = Composition(
        shards=(ShardSpec(path="0.0", mixed_precision=MixedPrecision()), ShardSpec(path="", mixed_precision=low))
    )
    inner = fitted_precision(comp).shards[0].mixed_precision
    assert inner == MixedPrecision(param_dtype=bf16)  # computes in the dtype its input arrives in
    island = Composition(
        shards=(
            ShardSpec(path="0.0", mixed_precision=MixedPrecision(param_dtype=fp32, cast_forward_inputs=False)),
            ShardSpec(path="", mixed_precision=low),
        )
    )
    assert fitted_precision(island).shards[0].mixed_precision == MixedPrecision(
        param_dtype=fp32, output_dtype=bf16, cast_forward_inputs=True
    )
    # a group whose members sit in units of different compute dtypes is split
    group = Composition(
        shards=(
            ShardSpec(path="0.0", group=("1.0",), mixed_precision=MixedPrecision()),
            ShardSpec(path="0", mixed_precision=MixedPrecision(param_dtype=bf16, output_dtype=fp32)),
            ShardSpec(path=""),
        )
    )
    split = fitted_precision(group)
    assert [s.path for s in split.shards] == ["0.0", "1.0", "0", ""]
    assert split.shards[0].mixed_precision == MixedPrecision(param_dtype=bf16)
    assert split.shards[1].mixed_precision == MixedPrecision()
