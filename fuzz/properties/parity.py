"""Training properties: ``parity``, ``mixed_precision`` and ``metamorphic``.

- ``parity``: a composed model (fully_shard / replicate / checkpoint in any allowed order, 1D or
  HSDP meshes, DDP and FSDP1 wrappers) trains like the all-reduce reference: every rank's loss
  on every microbatch, the gradient norm and the gathered parameters after every step agree
  under the dtype's tolerance; plus the API contracts recorded on the way.
- ``mixed_precision``: fully_shard with MixedPrecisionPolicy: the contracts (parameter dtype
  inside forward, output dtype, sharding state), not numerics against a full-precision
  reference.
- ``metamorphic``: two compositions that must not change numerics (checkpoint on or off,
  reshard_after_forward values, mesh shape, FSDP2 vs FSDP1 vs DDP) agree with each other.
"""

from __future__ import annotations

import math
from typing import Any

from fuzz.case import (
    PARAM_LEAVES,
    AccumSync,
    Block,
    Case,
    Compile,
    Composition,
    Leaf,
    MetamorphicBody,
    ModuleTree,
    Node,
    ParityBody,
    Training,
    Wrapper,
    has_params,
    iter_paths,
    owns_params,
)
from fuzz.pool import Outcome
from fuzz.properties import Property, register, strategy
from fuzz.signature import Failure, failure_from_outcome
from fuzz.tolerance import Tolerance, first_mismatch, tolerance_for


def _mismatch(prop: str, check: str, api: str, summary: str, **details: Any) -> Failure:
    """A numeric mismatch is charged to the property and the API family (not to the quantity
    that disagreed: one bug shows as a wrong loss, gradient or parameter case by case)."""
    where = f"@{api}" if api else f":{check}"
    return Failure("mismatch", f"mismatch:{prop}{where}", summary, {"check": check, **details})


def api_of(comp: Composition, tree: ModuleTree | None = None, training: Training | None = None) -> str:
    """The API family a mismatch is charged to: fsdp2 (fully_shard and replicate; ``fsdp2+tp``
    with tensor parallelism), fsdp1 or ddp. Degenerate setups that take their own code paths
    are named, since known bugs live there:

    - ``:shard1``: a shard dimension of size 1 (an FSDP1 bug).
    - ``:frozen-int-reshard``: a fully_shard unit with an int ``reshard_after_forward`` whose
      parameters are all frozen (an FSDP2 bug: such a unit can stay in its post-forward state
      after backward).
    - ``:unused-no-all-reduce``: a module with parameters left out of some microbatches of a
      step under set_requires_all_reduce(False) (an FSDP2 bug: the partial reduce-scatter output
      of a unit is kept for the parameters that had gradients on earlier microbatches, so it is
      dropped when the unit is unused on the last microbatch, and fails to add up when the set
      changes).
    - ``:unfrozen-frozen-unit``: a leaf unfrozen later in an FSDP1 NO_SHARD unit whose
      parameters are all frozen at wrapping (an FSDP1 bug, :func:`fsdp1_unfrozen_in_frozen_unit`).
    """
    if comp.wrapper is Wrapper.DDP:
        name = "ddp"
    elif comp.wrapper is not Wrapper.NONE:
        name = "fsdp1"
    else:
        name = "fsdp2"
    if comp.tp:
        name += "+tp"
    if comp.mesh and comp.mesh[1] == 1:
        name += ":shard1"
    if tree is not None and frozen_int_reshard_unit(tree, comp):
        name += ":frozen-int-reshard"
    if tree is not None and training is not None and unfrozen_unresharded_unit(tree, comp, training):
        name += ":unfrozen-unresharded"
    if (
        tree is not None
        and training is not None
        and comp.shards
        and training.accum_sync is AccumSync.NO_ALL_REDUCE
        and training.unused_on_some_microbatches(tree)
    ):
        name += ":unused-no-all-reduce"
    if tree is not None and training is not None and fsdp1_unfrozen_in_frozen_unit(tree, comp, training):
        name += ":unfrozen-frozen-unit"
    return name


def fsdp1_unfrozen_in_frozen_unit(tree: ModuleTree, comp: Composition, training: Training) -> bool:
    """True if a leaf unfrozen later belongs to an FSDP1 NO_SHARD unit whose parameters are all
    frozen at wrapping (fuzz.case_state.fsdp1_frozen_unit: auto-wrapping makes every block a
    unit of its own). After the first backward such a unit leaves its parameters registered as
    plain tensor views (the pytorch/pytorch#85831 family), so requires_grad_(True) on the
    Parameter the optimizer holds never reaches what forward uses: the leaf is never trained.
    (Unfreezing the module's attribute instead fails FSDP1's post-backward assertion on
    ``_post_backward_hook_state``.) docs/known_bugs.md has a torch-only reproducer."""
    if comp.wrapper is not Wrapper.FSDP1_NO_SHARD or not comp.auto_wrap or not training.unfreeze:
        return False
    paths = tree.paths()
    for later in training.unfreeze:
        unit = paths[later.path.rpartition(".")[0]]
        if not isinstance(unit, Block) or unit.scale:
            continue
        leaves = [c for c in unit.children if isinstance(c, Leaf) and c.kind in PARAM_LEAVES]
        if leaves and all(c.frozen for c in leaves):
            return True
    return False


def frozen_int_reshard_unit(tree: ModuleTree, comp: Composition) -> bool:
    """True if a fully_shard unit with an int reshard_after_forward manages only frozen
    parameters (modules inside a nested unit or a replicate are not its own)."""
    paths = tree.paths()
    others = comp.sharded_paths + list(comp.replicates)
    for spec in comp.shards:
        if isinstance(spec.reshard_after_forward, bool):
            continue
        owned: list[Node] = []
        for member in spec.paths:
            node = paths[member]
            subtree = list(iter_paths(node, member)) if isinstance(node, Block) else [(member, node)]
            owned += [n for sub, n in subtree if owns_params(n) and not _inside_other(sub, member, others)]
        if owned and all(isinstance(n, Leaf) and n.frozen for n in owned):
            return True
    return False


def unfrozen_unresharded_unit(tree: ModuleTree, comp: Composition, training: Training) -> bool:
    """True if a leaf unfrozen later lies in a fully_shard unit whose reshard_after_forward is not
    True, inside an outermost fully_shard unit (one no other encloses) that holds only frozen
    parameters at the start. Such an outermost unit (under a replicate'd root) is an FSDP2 root
    whose output needs no gradient, so FSDP2 never queues its post-backward callback: its units
    keep their unsharded parameters registered after backward, and requires_grad_(True) on a
    sharded parameter (the one the optimizer holds) never reaches them (a known FSDP2 bug, like
    ``:frozen-int-reshard``)."""
    if not training.unfreeze:
        return False
    paths = tree.paths()
    sharded = comp.sharded_paths
    others = sharded + list(comp.replicates)
    unfrozen = {u.path for u in training.unfreeze}

    def inside(path: str, unit: str) -> bool:
        return path == unit or unit == "" or path.startswith(unit + ".")

    for top in comp.shards:
        if any(o not in top.paths and any(inside(m, o) for m in top.paths) for o in sharded):
            continue  # not outermost
        subtree = [(p, n) for p, n in paths.items() if owns_params(n) and any(inside(p, m) for m in top.paths)]
        if not subtree or not all(isinstance(n, Leaf) and n.frozen for _, n in subtree):
            continue
        for spec in comp.shards:
            if spec.reshard_after_forward is True or not any(inside(m, t) for m in spec.paths for t in top.paths):
                continue
            for member in spec.paths:
                owned = [p for p, _ in subtree if inside(p, member) and not _inside_other(p, member, others)]
                if any(p in unfrozen for p in owned):
                    return True
    return False


def _inside_other(sub: str, unit: str, others: list[str]) -> bool:
    return any(
        o != unit and (unit == "" or o.startswith(unit + ".")) and (sub == o or sub.startswith(o + ".")) for o in others
    )


def compare_runs(prop: str, observations: list[dict[str, Any]], tol: Tolerance, api: str = "") -> Failure | None:
    """Composed run (top level of each observation) against ``obs["ref"]``, step by step."""
    for rank, obs in enumerate(observations):
        ref = obs["ref"]
        for step, (got, want) in enumerate(zip(obs["losses"], ref["losses"])):
            bad = first_mismatch(got, want, tol)
            if bad is not None:
                return _mismatch(
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
        norms = [
            (i, g, w)
            for i, (g, w) in enumerate(zip(obs["grad_norms"], ref["grad_norms"]))
            if not (math.isnan(g) or math.isnan(w))
        ]
        for step, got_norm, want_norm in norms:
            bad = first_mismatch([got_norm], [want_norm], tol)
            if bad is not None:
                return _mismatch(
                    prop,
                    "grad",
                    api,
                    f"rank {rank} gradient norm at step {step} is {got_norm!r}, expected {want_norm!r}",
                    rank=rank,
                    step=step,
                )
    first = observations[0]
    for step, (got_params, want_params) in enumerate(zip(first["params"], first["ref"]["params"])):
        if set(got_params) != set(want_params):
            return _mismatch(
                prop,
                "param-names",
                api,
                f"parameter names differ: {sorted(set(got_params) ^ set(want_params))}",
            )
        for name, want in want_params.items():
            bad = first_mismatch(got_params[name], want, tol)
            if bad is not None:
                return _mismatch(
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
                return _mismatch(prop, "replicas", "", f"replica of {name} on rank {rank} differs from rank 0's")
    return None


def check_contracts(prop: str, comp: Composition, tree: ModuleTree, contracts: dict[str, Any]) -> Failure | None:
    for spec in comp.shards:
        flags = contracts["sharded_after_forward"].get(spec.path, [])
        raf = spec.reshard_after_forward
        if isinstance(raf, bool) and flags and any(f != raf for f in flags):
            state = "sharded" if raf else "unsharded"
            return _mismatch(
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
                return _mismatch(
                    prop,
                    "contract-output-dtype",
                    "",
                    f"fully_shard({spec.path!r}) with output_dtype={mp.output_dtype.value} returned {got}",
                )
        if mp is not None and mp.param_dtype is not None:
            for leaf, dtype in contracts["leaf_dtypes"].items():
                if _unit_of(leaf, comp) == spec.path and dtype != mp.param_dtype.value:
                    return _mismatch(
                        prop,
                        "contract-param-dtype",
                        "",
                        f"{leaf!r} ran forward with {dtype} parameters under param_dtype={mp.param_dtype.value}",
                    )
    for path, names in contracts.get("replicate_params", {}).items():
        expected = sorted(_replicated_names(tree, comp, path))
        if names != expected:
            return _mismatch(
                prop,
                "contract-replicate",
                "",
                f"replicate({path!r}) manages {names}, expected exactly those fully_shard does not: {expected}",
            )
    return None


def _unit_of(module: str, comp: Composition) -> str | None:
    """The spec path of the innermost fully_shard unit containing ``module``."""
    best: tuple[int, str] | None = None
    for spec in comp.shards:
        for p in spec.paths:
            if p == module or p == "" or module.startswith(p + "."):
                depth = p.count(".") + (p != "")
                if best is None or depth > best[0]:
                    best = (depth, spec.path)
    return None if best is None else best[1]


def _replicated_names(tree: ModuleTree, comp: Composition, path: str) -> list[str]:
    """Names (relative to ``path``) of parameters under ``path`` that no fully_shard or deeper
    replicate manages."""
    others = [p for p in comp.sharded_paths + list(comp.replicates) if p != path]
    names = []
    for sub, node in tree.paths().items():
        if not (sub == path or path == "" or sub.startswith(path + ".")):
            continue
        if any(o == sub or (o != "" and sub.startswith(o + ".")) for o in others if _inside(o, path)):
            continue
        rel = sub[len(path) + 1 :] if path and sub != path else ("" if sub == path else sub)
        prefix = f"{rel}." if rel else ""
        if isinstance(node, Leaf) and node.kind.value in ("linear", "layer_norm", "conv1d"):
            names.append(prefix + "weight")
            if node.bias:
                names.append(prefix + "bias")
        elif isinstance(node, Block) and node.scale:
            names.append(prefix + "scale")
    return names


def _inside(other: str, path: str) -> bool:
    return path == "" or other.startswith(path + ".")


def _tolerance(training: Training) -> Tolerance:
    return tolerance_for(training.dtype.value)


def judge_parity(case: Case, outcome: Outcome) -> Failure | None:
    if not outcome.ok:
        return failure_from_outcome(case.property, outcome)
    body = case.body
    assert isinstance(body, ParityBody)
    obs = outcome.observations
    api = api_of(body.composition, body.tree, body.training)
    failure = compare_runs(case.property, obs, _tolerance(body.training), api) or check_replicas(case.property, obs)
    if failure is None and "contracts" in obs[0]:
        failure = check_contracts(case.property, body.composition, body.tree, obs[0]["contracts"])
    return failure


def judge_mixed_precision(case: Case, outcome: Outcome) -> Failure | None:
    if not outcome.ok:
        return failure_from_outcome(case.property, outcome)
    body = case.body
    assert isinstance(body, ParityBody)
    for obs in outcome.observations:
        failure = check_contracts(case.property, body.composition, body.tree, obs["contracts"])
        if failure is not None:
            return failure
    return None


def judge_metamorphic(case: Case, outcome: Outcome) -> Failure | None:
    if not outcome.ok:
        return failure_from_outcome(case.property, outcome)
    body = case.body
    assert isinstance(body, MetamorphicBody)
    # The base composition is always composable (fully_shard / replicate); the variant is what
    # changed, so the mismatch is charged to it.
    api = api_of(body.variant, body.tree, body.training)
    if not api.endswith(":frozen-int-reshard") and frozen_int_reshard_unit(body.tree, body.composition):
        api += ":frozen-int-reshard"
    if ":unfrozen-unresharded" not in api and unfrozen_unresharded_unit(body.tree, body.composition, body.training):
        api += ":unfrozen-unresharded"
    return compare_runs(case.property, outcome.observations, _tolerance(body.training), api)


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
    if comp.replicates:
        out.append(f"{prefix}replicate" + (":root" if "" in comp.replicates else ":sub"))
    if comp.find_unused:
        out.append(f"{prefix}find_unused_parameters")
    if comp.checkpoints:
        out.append(f"{prefix}checkpoint:" + ("before" if comp.checkpoint_first else "after") + "_fully_shard")
    if comp.meta_init:
        out.append(f"{prefix}init:meta")
    out.append(f"{prefix}fully_shard:count:{min(len(comp.shards), 4)}")
    return out


def tree_features(tree: ModuleTree, world_size: int) -> list[str]:
    out = ["shards:uneven" if tree.width % world_size else "shards:even"]
    if tree.width < world_size:
        out.append("shards:empty")
    for node in tree.paths().values():
        if isinstance(node, Leaf):
            out.append(f"leaf:{node.kind.value}" + ("" if node.bias else ":no-bias"))
            if node.frozen:
                out.append("param:frozen")
        elif isinstance(node, Block):
            if node.residual:
                out.append("block:residual")
            if node.scale:
                out.append("block:own-param")
            if node.buffer:
                out.append("block:buffer")
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


PARITY = register(
    Property(
        name="parity",
        description="composed models (fully_shard, replicate, checkpoint, HSDP, DDP, FSDP1) train like "
        "the all-reduce reference, step by step; API contracts hold",
        cases=strategy("parity_cases"),
        judge=judge_parity,
        features=features,
    )
)
MIXED_PRECISION = register(
    Property(
        name="mixed_precision",
        description="fully_shard's MixedPrecisionPolicy: parameter dtype in forward, output dtype, sharding",
        cases=strategy("mixed_precision_cases"),
        judge=judge_mixed_precision,
        features=features,
    )
)
METAMORPHIC = register(
    Property(
        name="metamorphic",
        description="meta-device init, checkpoint on/off, reshard_after_forward, mesh shape, FSDP2/FSDP1/DDP do not "
        "change numerics",
        cases=strategy("metamorphic_cases"),
        judge=judge_metamorphic,
        features=features,
    )
)
