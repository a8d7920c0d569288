"""Training properties: ``parity``, ``mixed_precision`` and ``metamorphic``.

- ``parity``: a composed model (fully_shard / replicate / checkpoint in any allowed order, 1D or
  HSDP meshes, DDP and FSDP1 wrappers) trains like the all-reduce reference: every rank's loss
  on every microbatch, the gradient norm and the gathered parameters after every step agree
  under the dtype's tolerance; plus the API contracts recorded on the way.
- ``mixed_precision``: fully_shard with MixedPrecisionPolicies (one per unit, FSDPModule knobs,
  tensor parallelism): the contracts (parameter dtype inside forward, output dtype, sharding
  state, the knobs'), and numerics against a reference that applies the policies' casts by hand.
- ``metamorphic``: two compositions that must not change numerics (checkpoint on or off,
  reshard_after_forward values, mesh shape, FSDP2 vs FSDP1 vs DDP) agree with each other.
"""

from __future__ import annotations

import math
from typing import Any

from fuzz import known
from fuzz.model import (
    AccumSync,
    Case,
    Compile,
    Composition,
    Layout,
    MetamorphicBody,
    ModuleTree,
    ParityBody,
    Training,
    Unit,
    Wrapper,
    has_params,
    has_repeat,
    mixed_precision_comparable,
    param_names,
    tree_features,
)
from fuzz.properties.spec import Property, strategy
from fuzz.signature import Failure, Signature, failure_from_outcome
from fuzz.tolerance import (
    Tolerance,
    after_updates,
    first_mismatch,
    judged_prefix,
    mixed_precision_tolerance,
    tolerance_for,
    update_gain,
)
from fuzz.verdict import Outcome


def mismatch_failure(prop: str, check: str, api: str, summary: str, **details: Any) -> Failure:
    """A numeric mismatch is charged to the property and the API family (not to the quantity
    that disagreed: one bug shows as a wrong loss, gradient or parameter case by case)."""
    if api:
        family, *tags = api.split(":")
        signature = Signature("mismatch", prop, where=family, tags=tuple(tags))
    else:
        signature = Signature("mismatch", prop, check)
    return Failure("mismatch", str(signature), summary, {"check": check, **details})


def api_of(
    comp: Composition, tree: ModuleTree | None = None, training: Training | None = None, world_size: int = 2
) -> str:
    """The API family a mismatch is charged to: fsdp2 (fully_shard and replicate; ``fsdp2+tp``
    with tensor parallelism, ``fsdp2+spmd`` with dp_mesh_dims), fsdp1 or ddp, with the tags of
    the degenerate setups the case meets, since known bugs live there
    (:func:`fuzz.known.mismatch_tags`)."""
    if comp.wrapper is Wrapper.DDP:
        name = "ddp"
    elif comp.wrapper is not Wrapper.NONE:
        name = "fsdp1"
    else:
        name = "fsdp2"
    if comp.tp:
        name += "+tp"
    if comp.spmd:
        name += "+spmd"
    return name + known.mismatch_tags(comp, tree, training, world_size)


def _judged_steps(observations: list[dict[str, Any]]) -> int:
    """The steps before the first one where the reference overflows on some rank, in its loss
    or in its parameters after the step (a float16 update that overflows): the plain model
    diverged there, and what follows says nothing of the distributed API
    (:func:`fuzz.tolerance.judged_prefix`). Before it, values must agree."""
    steps = min(len(obs["ref"]["losses"]) for obs in observations)
    for obs in observations:
        ref = obs["ref"]
        after = ref.get("params", [])
        for step, losses in enumerate(ref["losses"]):
            params = after[step].values() if step < len(after) else ()
            if judged_prefix(losses) < len(losses) or any(judged_prefix(p) < len(p) for p in params):
                steps = min(steps, step)
                break
    return steps


def compare_runs(
    prop: str,
    observations: list[dict[str, Any]],
    tol: Tolerance,
    api: str = "",
    *,
    before_first_update: bool = False,
    gain: float = 0.0,
) -> Failure | None:
    """Composed run (top level of each observation) against ``obs["ref"]``, step by step, up to
    the step where the reference overflows (:func:`_judged_steps`); with ``before_first_update``
    only the first step's losses and gradient norms (no optimizer step has acted on them). The
    parameters after step k are judged by ``tol`` carried through k + 1 updates of the
    optimizer's ``gain`` (:func:`fuzz.tolerance.after_updates`)."""
    judged = min(_judged_steps(observations), 1) if before_first_update else _judged_steps(observations)
    for rank, obs in enumerate(observations):
        ref = obs["ref"]
        for step, (got, want) in enumerate(zip(obs["losses"][:judged], ref["losses"][:judged])):
            bad = first_mismatch(got, want, tol)
            if bad is not None:
                return mismatch_failure(
                    prop,
                    "loss",
                    api,
                    f"rank {rank} loss at step {step}, microbatch {bad.index}: {bad.actual!r}, "
                    f"expected {bad.expected!r} (error {bad.error:.3g} > allowed {bad.allowed:.3g})",
                    rank=rank,
                    step=step,
                    observed=obs["losses"],
                    expected=ref["losses"],
                )
        evals = zip(obs.get("eval_losses", [])[:judged], ref.get("eval_losses", [])[:judged])
        for step, (got_eval, want_eval) in enumerate(evals):
            bad = first_mismatch([got_eval], [want_eval], tol)
            if bad is not None:
                return mismatch_failure(
                    prop,
                    "eval-loss",
                    api,
                    f"rank {rank} loss of the eval / inference_mode forward after step {step}: {got_eval!r}, "
                    f"expected {want_eval!r} (error {bad.error:.3g} > allowed {bad.allowed:.3g})",
                    rank=rank,
                    step=step,
                )
        norms = [
            (i, g, w)
            for i, (g, w) in enumerate(zip(obs["grad_norms"][:judged], ref["grad_norms"][:judged]))
            if not (math.isnan(g) or math.isnan(w))
        ]
        for step, got_norm, want_norm in norms:
            bad = first_mismatch([got_norm], [want_norm], tol)
            if bad is not None:
                return mismatch_failure(
                    prop,
                    "grad",
                    api,
                    f"rank {rank} gradient norm at step {step} is {got_norm!r}, expected {want_norm!r}",
                    rank=rank,
                    step=step,
                )
    first = observations[0]
    updated = 0 if before_first_update else judged
    for step, (got_params, want_params) in enumerate(zip(first["params"][:updated], first["ref"]["params"][:updated])):
        if set(got_params) != set(want_params):
            return mismatch_failure(
                prop,
                "param-names",
                api,
                f"parameter names differ: {sorted(set(got_params) ^ set(want_params))}",
            )
        step_tol = after_updates(tol, step + 1, gain)
        for name, want in want_params.items():
            bad = first_mismatch(got_params[name], want, step_tol)
            if bad is not None:
                return mismatch_failure(
                    prop,
                    "param",
                    api,
                    f"{name}[{bad.index}] after step {step} is {bad.actual!r}, expected {bad.expected!r} "
                    f"(error {bad.error:.3g} > allowed {bad.allowed:.3g})",
                    param=name,
                    step=step,
                    observed=got_params[name],
                    expected=want,
                )
    return None


def check_replicas(prop: str, observations: list[dict[str, Any]]) -> Failure | None:
    """Parameters held whole on every rank (replicate, DDP) are bitwise equal across ranks."""
    base = observations[0]["local_params"]
    for rank, obs in enumerate(observations[1:], start=1):
        for name, values in base.items():
            if obs["local_params"].get(name) != values:
                return mismatch_failure(prop, "replicas", "", f"replica of {name} on rank {rank} differs from rank 0's")
    return None


def check_contracts(prop: str, comp: Composition, tree: ModuleTree, contracts: dict[str, Any]) -> Failure | None:
    for spec in comp.shards:
        flags = contracts["sharded_after_forward"].get(spec.path, [])
        raf = comp.reshard_after_forward(spec)
        if isinstance(raf, bool) and flags and any(f != raf for f in flags):
            state = "sharded" if raf else "unsharded"
            return mismatch_failure(
                prop,
                "contract-reshard",
                "",
                f"fully_shard({spec.path!r}, reshard_after_forward={raf}): parameters not {state} after forward "
                f"({flags})",
            )
        mp = spec.mixed_precision
        if mp is not None and mp.output_dtype is not None:
            got = contracts["output_dtypes"].get(spec.path)
            if got is not None and got != mp.output_dtype.value:
                return mismatch_failure(
                    prop,
                    "contract-output-dtype",
                    "",
                    f"fully_shard({spec.path!r}) with output_dtype={mp.output_dtype.value} returned {got}",
                )
        if mp is not None and mp.param_dtype is not None:
            for leaf, dtype in contracts["leaf_dtypes"].items():
                if _unit_of(leaf, comp, tree) == spec.path and dtype != mp.param_dtype.value:
                    return mismatch_failure(
                        prop,
                        "contract-param-dtype",
                        "",
                        f"{leaf!r} ran forward with {dtype} parameters under param_dtype={mp.param_dtype.value}",
                    )
    delayed = contracts.get("delayed") or []
    if delayed:
        return mismatch_failure(prop, "contract-delay-all-reduce", "", delayed[0])
    ignored = contracts.get("ignored") or []
    if ignored:
        return mismatch_failure(
            prop, "contract-ignored", "", f"{ignored[0]} (ignored_modules and ignored_params stay plain and local)"
        )
    for path, names in contracts.get("replicate_params", {}).items():
        expected = sorted(_replicated_names(tree, comp, path))
        if names != expected:
            return mismatch_failure(
                prop,
                "contract-replicate",
                "",
                f"replicate({path!r}) manages {names}, expected exactly those fully_shard does not: {expected}",
            )
    return None


def check_knobs(prop: str, observations: list[dict[str, Any]]) -> Failure | None:
    """What the ranks saw of the FSDPModule knobs' documented behaviour (fuzz._rank.knobs):
    the state after an explicit unshard / reshard, the tensor an all-reduce hook gets."""
    for rank, obs in enumerate(observations):
        for run in (obs, obs.get("ref", {})):
            problems = run.get("knob_problems") or []
            if problems:
                return mismatch_failure(
                    prop, "contract-knobs", "", f"rank {rank}: {problems[0]}", problems=problems[:5]
                )
    return None


def _unit_of(module: str, comp: Composition, tree: ModuleTree) -> str | None:
    """The spec path of the innermost fully_shard unit containing ``module``."""
    member = Layout(tree, comp).member_of(module, api="fully_shard")
    return None if member is None else next(s.path for s in comp.shards if member in s.paths)


def _replicated_names(tree: ModuleTree, comp: Composition, path: str) -> list[str]:
    """Names (relative to ``path``) of parameters under ``path`` that no fully_shard or deeper
    replicate manages."""
    layout = Layout(tree, comp)
    names = []
    for sub in layout.owned_by(layout.unit_of(path) or Unit("replicate", -1, (path,)), path):
        node = layout.paths[sub]
        rel = sub[len(path) + 1 :] if path and sub != path else ("" if sub == path else sub)
        prefix = f"{rel}." if rel else ""
        names += [prefix + name for name in param_names(node)]
    return names


def _tolerance(training: Training) -> Tolerance:
    return tolerance_for(training.dtype.value)


def optimizer_gain(training: Training) -> float:
    """The gain of ``training``'s optimizer step (:func:`fuzz.tolerance.update_gain`)."""
    return update_gain(training.optimizer.value, training.lr, training.eps)


def judge_parity(case: Case, outcome: Outcome) -> Failure | None:
    if not outcome.ok:
        return failure_from_outcome(case.property, outcome)
    body = case.body
    assert isinstance(body, ParityBody)
    obs = outcome.observations
    api = api_of(body.composition, body.tree, body.training, case.world_size)
    # The contracts first: they check a cause, the same in every run, where the numbers may
    # show it only when a race goes one way (a delayed all-reduce that also runs in DDP's
    # reducer); judged after the numbers, one case would fail under two signatures by turns.
    contracts = obs[0].get("contracts")
    return (
        (check_contracts(case.property, body.composition, body.tree, contracts) if contracts is not None else None)
        or check_knobs(case.property, obs)
        or compare_runs(case.property, obs, _tolerance(body.training), api, gain=optimizer_gain(body.training))
        or check_replicas(case.property, obs)
    )


def _mixed_precision_exact(case: Case, body: ParityBody) -> bool:
    """Whether the composed run and the hand-cast reference do the same low-precision operations
    on the same values (fuzz.tolerance: then nothing but a bug separates them). fuzz.tolerance
    holds the reduction over at most two data-parallel ranks exact: one sum of two values,
    rounded as the reference's is. Not so:

    - a (replicate, shard) mesh over more ranks, which reduces in two stages (a reduce-scatter
      over the shard dimension, an all-reduce over the replicas, each with its own division)
      that round apart from the reference's one sum; over two ranks one stage is a single
      rank's, so the other is the one sum of two values; with set_requires_all_reduce(False)
      the reference keeps the partial sums as FSDP2 does (fuzz/_rank/parity.py:_two_stage);
    - a unit that splits the uses of an activation across its boundary: FSDP2's backward adds
      that activation's gradient terms in another order than the reference
      (fuzz.model.Layout.regroups_input_gradients);
    - tensor parallelism: a rowwise pair adds its ranks' partial products in the compute dtype,
      where the reference's matmul rounds the whole sum once;
    - a gradient divide factor: FSDP2 divides the sum by it in the reduce dtype, where the
      reference scales the average in full precision (a power of two, as the all-reduce hook's
      scale, is exact either way; a divide factor of 3 is not)."""
    comp = body.composition
    ranks = case.world_size // comp.tp_size
    regrouped = Layout(body.tree, comp).regroups_input_gradients()
    return ranks <= 2 and not regrouped and not comp.tp and comp.knobs.gradient_divide_factor is None


def judge_mixed_precision(case: Case, outcome: Outcome) -> Failure | None:
    if not outcome.ok:
        return failure_from_outcome(case.property, outcome)
    body = case.body
    assert isinstance(body, ParityBody)
    comp = body.composition
    for obs in outcome.observations:
        failure = check_contracts(case.property, comp, body.tree, obs["contracts"])
        if failure is not None:
            return failure
    failure = check_knobs(case.property, outcome.observations)
    if failure is not None or not comp.hand_castable() or "ref" not in outcome.observations[0]:
        return failure
    # Numerics against the reference that applies the policies' casts by hand, unit by unit
    # (fuzz/_rank/parity.py:HandCast), under fuzz.tolerance's written policy: every judged value
    # (a loss, a gradient norm, a parameter) has gone through every unit's forward or gradient
    # reduction, so the dtypes of every unit's policy count.
    low = sorted(
        {
            d.value
            for s in comp.shards
            if s.mixed_precision is not None
            for d in (s.mixed_precision.param_dtype, s.mixed_precision.reduce_dtype, s.mixed_precision.output_dtype)
            if d is not None
        }
    )
    exact = _mixed_precision_exact(case, body)
    ranks = case.world_size // comp.tp_size
    tol = mixed_precision_tolerance(body.training.dtype.value, low, ranks if exact else max(ranks, 3))
    api = api_of(comp, body.tree, body.training, case.world_size)
    # Where the low-precision sums are inexact, an update moves a parameter by the learning rate
    # times a gradient rounded apart by an ulp of that gradient, not of the parameter: with SGD
    # over large gradients that is many times the parameter's own tolerance (bfloat16, 4 ranks:
    # a gradient near 12 rounded apart by 0.0625 moved a parameter of -0.018 by 0.006, where
    # 0.0016 was allowed), and Adam and AdamW, which divide by each gradient's running
    # magnitude, can flip a near-zero gradient's sign and move its parameter by twice the
    # learning rate. There only what comes before the first update is compared: the first
    # step's losses and gradient norms.
    gain = optimizer_gain(body.training)
    return compare_runs(case.property, outcome.observations, tol, api, before_first_update=not exact, gain=gain)


def judge_metamorphic(case: Case, outcome: Outcome) -> Failure | None:
    if not outcome.ok:
        return failure_from_outcome(case.property, outcome)
    body = case.body
    assert isinstance(body, MetamorphicBody)
    # The base composition is always composable (fully_shard / replicate); the variant is what
    # changed, so the mismatch is charged to it.
    api = api_of(body.variant, body.tree, body.training, case.world_size)
    # bugs met through the base composition tag the variant's mismatch too (KnownBug.tags_through_base)
    api += known.base_tags(body.composition, body.tree, body.training, case.world_size, api)
    return check_knobs(case.property, outcome.observations) or compare_runs(
        case.property, outcome.observations, _tolerance(body.training), api, gain=optimizer_gain(body.training)
    )


#: The feature of an SPMD composition (fully_shard's dp_mesh_dims), in any property's cases.
SPMD_FEATURE = "fully_shard:dp_mesh_dims"


def composition_features(comp: Composition, world_size: int, prefix: str = "") -> list[str]:
    out = []
    if comp.wrapper is not Wrapper.NONE:
        out.append(f"{prefix}wrapper:{comp.wrapper.value}" + (":auto_wrap" if comp.auto_wrap else ""))
    out.append(f"{prefix}mesh:{'x'.join(map(str, comp.mesh)) if comp.mesh else world_size // comp.tp_size}")
    if comp.tp:
        out.append(f"{prefix}tp:size{comp.tp_size}")
        out.append(f"{prefix}tp:pairs:{len(comp.tp)}")
    for spec in comp.shards:
        raf = spec.reshard_after_forward
        out.append(f"{prefix}reshard_after_forward:{'int' if not isinstance(raf, bool) else raf}")
        if spec.shard_dim:
            out.append(f"{prefix}shard_placement_fn:Shard({spec.shard_dim})")
        if spec.group:
            out.append(f"{prefix}fully_shard:grouped")
        if spec.ignored:
            out.append(f"{prefix}fully_shard:ignored_params")
        if spec.offload:
            out.append(f"{prefix}offload")
        mp = spec.mixed_precision
        if mp is not None:
            for name in ("param_dtype", "reduce_dtype", "output_dtype"):
                value = getattr(mp, name)
                if value is not None:
                    out.append(f"{prefix}mp:{name}:{value.value}")
            if not mp.cast_forward_inputs:
                out.append(f"{prefix}mp:no_cast_forward_inputs")
    if len({s.mixed_precision for s in comp.shards if s.mixed_precision is not None}) > 1:
        out.append(f"{prefix}mp:per_unit")  # units with different policies
    if comp.replicates:
        out.append(f"{prefix}replicate" + (":root" if "" in comp.replicates else ":sub"))
    if comp.find_unused:
        out.append(f"{prefix}find_unused_parameters")
    out += [f"{prefix}replicate_opt:{name}" for name in comp.replicate_options.names()]
    out += [f"{prefix}checkpoint_opt:{name}" for name in comp.checkpoint_options.names()]
    if comp.checkpoints:
        out.append(f"{prefix}checkpoint:" + ("before" if comp.checkpoint_first else "after") + "_fully_shard")
    if comp.meta_init:
        out.append(f"{prefix}init:meta")
    if comp.spmd:
        out.append(prefix + SPMD_FEATURE)
    if comp.spmd_mse_loss:
        out.append(f"{prefix}loss:F.mse_loss(DTensor)")
    out += [f"{prefix}knob:{name}" for name in comp.knobs.names()]
    out.append(f"{prefix}fully_shard:count:{min(len(comp.shards), 4)}")
    return out


def training_features(t: Training) -> list[str]:
    out = [f"optimizer:{t.optimizer.value}", f"steps:{t.steps}", f"dtype:{t.dtype.value}"]
    if t.grad_accum > 1:
        out.append(f"grad_accum:{t.accum_sync.value}")
    if not t.set_to_none:
        out.append("zero_grad:set_to_none=False")
    if t.same_input:
        out.append("input:same-on-every-rank")
    if t.param_groups > 1:
        out.append("param_groups:2")
    if t.optimizer.value == "sgd" and t.momentum:
        out.append("sgd:momentum")
    if t.foreach is not None:
        out.append(f"optimizer:foreach={t.foreach}")
    if t.clip_grad_norm is not None:
        out.append("training:clip_grad_norm")
    if t.eval_forward:
        out.append("training:eval:inference_mode")
    if t.forwards > 1:
        out.append(f"training:forwards:{t.forwards}")
    out += sorted({f"training:reinit:{r.how.value}" for r in t.reinit})
    return out


def schedule_features(tree: ModuleTree, t: Training) -> list[str]:
    """Modules left out of forward (``param:unused`` where they hold parameters), leaves unfrozen
    later, torch.compile."""
    out = []
    paths = tree.paths()
    if any(has_params(paths[s.path]) for s in t.skips):
        out.append("param:unused")
        if t.unused_on_some_microbatches(tree):
            out.append("param:unused:some-microbatches")
    elif t.skips:
        out.append("skip:no-params")
    if t.unfreeze:
        out.append("param:unfrozen_later")
    if t.compile is not Compile.NONE:
        out.append(f"compile:{t.compile.value}")
    return out


def features(case: Case) -> list[str]:
    body = case.body
    if isinstance(body, ParityBody):
        comp = composition_features(body.composition, case.world_size)
        training = training_features(body.training) + schedule_features(body.tree, body.training)
        if (
            body.composition.hand_castable()
            and mixed_precision_comparable(body.training)
            and not has_repeat(body.tree)  # fuzz._rank.parity.run_parity: not compared yet
        ):
            training.append("mp:numerics")  # compared with the hand-cast reference
            if body.training.grad_accum > 1 and body.training.accum_sync is AccumSync.NO_GRAD_SYNC:
                training.append("mp:numerics:unreduced_accumulation")
            if body.training.grad_accum > 1 and body.training.accum_sync is AccumSync.NO_ALL_REDUCE:
                training.append("mp:numerics:partial_reduction")
        return sorted(set(tree_features(body.tree, case.world_size) + comp + training))
    assert isinstance(body, MetamorphicBody)
    return sorted(
        set(
            tree_features(body.tree, case.world_size)
            + composition_features(body.composition, case.world_size)
            + composition_features(body.variant, case.world_size, "variant:")
            + training_features(body.training)
            + schedule_features(body.tree, body.training)
        )
    )


PARITY = Property(
    name="parity",
    description="composed models (fully_shard, replicate, checkpoint, HSDP, DDP, FSDP1) train like "
    "the all-reduce reference, step by step; API contracts hold",
    cases=strategy("parity_cases"),
    judge=judge_parity,
    features=features,
    body=ParityBody,
    repro="fuzz.repro.script:render",
)
MIXED_PRECISION = Property(
    name="mixed_precision",
    description=(
        "fully_shard's MixedPrecisionPolicy, per unit, with knobs and FSDP + TP: dtypes in forward, "
        "output dtype, sharding, training against a hand-cast reference"
    ),
    cases=strategy("mixed_precision_cases"),
    judge=judge_mixed_precision,
    features=features,
    body=ParityBody,
    repro="fuzz.repro.script:render",
)
METAMORPHIC = Property(
    name="metamorphic",
    description="meta-device init, checkpoint on/off, reshard_after_forward, mesh shape, FSDP2/FSDP1/DDP do not "
    "change numerics",
    cases=strategy("metamorphic_cases"),
    judge=judge_metamorphic,
    features=features,
    body=MetamorphicBody,
    repro="fuzz.repro.script:render",
)
#: The properties this module defines (collected by :mod:`fuzz.properties`).
PROPERTIES = (PARITY, MIXED_PRECISION, METAMORPHIC)
