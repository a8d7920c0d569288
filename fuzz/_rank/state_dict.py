"""State-dict round trips on a rank: train, take the state out, load it into a fresh model.

The building blocks here (build a side, train it, observe it) are shared with the DCP program
(:mod:`fuzz._rank.dcp`). Observations are taken without the API under test: parameters and
buffers are gathered with ``full_tensor()``, optimizer state is read from ``optimizer.state``
and gathered the same way, hyperparameters from ``optimizer.param_groups``, so a state-dict
bug cannot hide itself in its own observation. FSDP1 keeps optimizer state as flat local
shards that only FSDP.optim_state_dict gathers: an FSDP1 side reports each rank's local state,
and an FSDP1 source whose target is of another API reports what get_optimizer_state_dict took
from it (observe_state_dict_optimizer), which that target must hold in full after the load.

Two things every program here does on purpose:

- The state handed to ``set_*`` in memory is a deep copy. ``Optimizer.load_state_dict`` keeps
  the tensors it is given (a shallow copy by design, pytorch/pytorch#106082), so without the
  copy the source and target optimizers would share ``exp_avg`` / ``step`` tensors and corrupt
  each other when both train on. A checkpoint in practice comes from storage, which copies.
- Every collective runs in the same order on every rank: values are computed in a fixed order
  first and only then arranged in per-rank orders.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from fuzz._rank.compose import (
    TORCH_DTYPES,
    Composed,
    clean_name,
    compose,
    spmd_backward,
    spmd_part,
    spmd_replicated,
)
from fuzz._rank.context import RankContext
from fuzz._rank.models import build_model, fuse, leaf_parameters, main_output, sample_batch, tree_blocks, tree_loss
from fuzz._rank.parity import batches, make_optimizer
from fuzz.model import (
    DEFAULT_FQN_MODIFIERS,
    Api,
    Case,
    Composition,
    ModuleTree,
    Optimizer,
    Options,
    RequiresGrad,
    StateDictBody,
    Training,
    is_fsdp1,
    is_plain,
)

#: Rows of the fixed input every forward probe runs on (independent of the world size, so
#: that a checkpoint saved by N ranks and loaded by M can be compared).
PROBE_ROWS = 3
#: Seed offset of the fresh model, so that a load that does nothing is seen.
FRESH_SEED = 0x5EED


@dataclass
class Side:
    """One model with its optimizer, as built from a composition."""

    composed: Composed
    comp: Composition
    training: Training
    opt: torch.optim.Optimizer | None = None
    #: Parameter names by id, taken when the optimizer was built (see names()).
    param_names: dict[int, str] = field(default_factory=dict)
    #: The case's requires_grad schedule (fuzz.model.RequiresGrad), and the next step's index.
    schedule: tuple[RequiresGrad, ...] = ()
    step: int = 0

    @property
    def model(self) -> nn.Module:
        return self.composed.model

    @property
    def plain(self) -> bool:
        return is_plain(self.comp)

    @property
    def fsdp1(self) -> bool:
        return is_fsdp1(self.comp)

    def names(self) -> dict[int, str]:
        """Plain-model names of the parameters by id. With use_orig_params, FSDP1 can leave a
        parameter registered as a plain tensor view (a frozen one under NO_SHARD after
        backward, pytorch/pytorch#85831) and named_parameters() then skips it, so the names
        taken when the optimizer was built (before any forward) fill the gaps."""
        current = {id(p): clean_name(n) for n, p in self.model.named_parameters()}
        return {**self.param_names, **current}


def build_side(
    tree: ModuleTree,
    comp: Composition,
    training: Training,
    ctx: RankContext,
    *,
    seed: int,
    meta: bool = False,
    schedule: tuple[RequiresGrad, ...] = (),
    fused: tuple[str, ...] = (),
    fqn_modifiers: str = DEFAULT_FQN_MODIFIERS,
    constants_seed: int | None = None,
) -> Side:
    """Build the tree (on the meta device if ``meta``), with the leaves at ``fused`` as fused
    modules (:func:`fuzz._rank.models.fuse`), and apply ``comp``; no optimizer yet. With
    ``constants_seed`` its non-persistent buffers are those of the tree built from that seed
    (:func:`constants`; a meta-device model gets them after the load, :func:`set_constants`)."""
    values = constants(tree, training, constants_seed) if constants_seed is not None and not meta else {}
    torch.manual_seed(seed)
    device = torch.device("meta") if meta else ctx.device
    model = build_model(tree, device).to(TORCH_DTYPES[training.dtype])
    set_constants(model, values, ctx)
    fuse(model, fused, fqn_modifiers)
    composed = Composed(model) if is_plain(comp) else compose(model, comp, ctx)
    return Side(composed=composed, comp=comp, training=training, schedule=schedule)


def constants(tree: ModuleTree, training: Training, seed: int) -> dict[str, torch.Tensor]:
    """The non-persistent buffers of ``tree`` built from ``seed``, by name (on the CPU).

    No state dict holds a non-persistent buffer: a model's constructor computes it (a causal
    mask, rotary frequencies), the same in every fresh model. The trees draw it from the seed,
    so a target built from another seed gets the source's (``build_side(constants_seed=)``),
    as the same constructor would give it; a load that changed one would show in the forward
    probe and the resumed training."""
    torch.manual_seed(seed)
    model = build_model(tree, torch.device("cpu")).to(TORCH_DTYPES[training.dtype])
    out = {}
    for path, module in model.named_modules():
        for name in sorted(module._non_persistent_buffers_set):
            buf = module._buffers.get(name)
            if buf is not None:
                out[f"{path}.{name}" if path else name] = buf.detach().clone()
    return out


def set_constants(model: nn.Module, values: dict[str, torch.Tensor], ctx: RankContext) -> None:
    """Set ``model``'s non-persistent buffers to ``values`` (from :func:`constants`), on the
    rank's device, as a user initialises them after materialising a meta-device model (an
    assigning load leaves them on the meta device, ``to_empty`` uninitialised); a DTensor
    buffer (SPMD) is set to the value distributed with its placements."""
    if not values:
        return
    from torch.distributed.tensor import DTensor, distribute_tensor

    for path, module in model.named_modules():
        for name in sorted(module._non_persistent_buffers_set):
            buf = module._buffers.get(name)
            key = clean_name(f"{path}.{name}" if path else name)
            if buf is None or key not in values:
                continue
            value = values[key].to(device=ctx.device, dtype=buf.dtype)
            with torch.no_grad():
                if isinstance(buf, DTensor):
                    buf.copy_(distribute_tensor(value, buf.device_mesh, buf.placements))
                else:
                    module._buffers[name] = value


def change_requires_grad(side: Side, step: int) -> None:
    """Apply the schedule's changes made before step ``step`` (to the registered parameters:
    fully_shard's sharded ones, which it carries over to the unsharded ones)."""
    changes = [c for c in side.schedule if c.step == step]
    if not changes:
        return
    params = leaf_parameters(side.model, [c.path for c in changes])
    for c in changes:
        for p in params[c.path]:
            p.requires_grad_(c.trainable)


def catch_up(side: Side, steps: int) -> None:
    """Bring a side built fresh to where a run of ``steps`` steps left the schedule: the
    changes made before each of those steps, in order (a resumed target, after its optimizer
    was built over the same parameters as the source's)."""
    for step in range(side.step, steps):
        change_requires_grad(side, step)
    side.step = max(side.step, steps)


def requires_grad(side: Side) -> dict[str, bool]:
    """Every registered parameter's requires_grad, by its plain-model name (local)."""
    return {clean_name(n): p.requires_grad for n, p in side.model.named_parameters()}


def fresh_training(training: Training) -> Training:
    """Other hyperparameters than ``training``'s, for the fresh optimizer: a load must bring
    back the saved ones (lr of every group, momentum, eps).

    Momentum stays zero where it was zero: set_optimizer_state_dict with a full state dict
    merges the saved state into the optimizer's current state (torch's comment in
    ``_load_optim_state_dict``: "may result in optim having additional parameters"), and that
    current state is what its own zero-lr initialisation step made. A fresh SGD with momentum
    would keep momentum buffers that a saved SGD without momentum never had: a difference of
    set-up, not of the load.
    """
    momentum = 0.5 if training.optimizer is Optimizer.SGD and training.momentum else 0.0
    return replace(training, lr=training.lr * 0.37, momentum=momentum, eps=training.eps * 10)


def add_optimizer(
    side: Side, training: Training, *, frozen_in_optimizer: bool = False, empty_group: bool = False
) -> torch.optim.Optimizer:
    """The case's optimizer (fuzz._rank.parity.make_optimizer), with the frozen parameters
    handed to it too if ``frozen_in_optimizer`` (no gradient reaches them, so they get no
    state), and a param group without parameters and with its own lr if ``empty_group``."""
    params = list(side.model.parameters())
    frozen = [p for p in params if not p.requires_grad] if frozen_in_optimizer else []
    side.opt = make_optimizer(params, training, later=frozen)
    if empty_group:
        side.opt.add_param_group({"params": [], "lr": training.lr / 4})
    side.param_names = {id(p): clean_name(n) for n, p in side.model.named_parameters()}
    return side.opt


def body_optimizer(side: Side, training: Training, body: Any) -> torch.optim.Optimizer:
    """add_optimizer with the body's optimizer options (StateDictBody, DcpBody)."""
    return add_optimizer(side, training, frozen_in_optimizer=body.frozen_in_optimizer, empty_group=body.empty_group)


def seed_segment(case: Case, ctx: RankContext, segment: int) -> None:
    """Reseed before a stretch of training or a probe (dropout): the same on both runs that
    must agree, different per rank and per segment."""
    torch.manual_seed((case.seed * 7919 + segment * 104729 + ctx.rank + 1) % 2**63)


def all_batches(case: Case, training: Training, steps: int, tree: ModuleTree, ctx: RankContext) -> list[Any]:
    """This rank's (input, target) for ``steps`` steps: the parity programs' data."""
    return [step[0] for step in batches(case, replace(training, steps=steps), tree, ctx)]


def train_steps(side: Side, data: list[Any], ctx: RankContext) -> list[float]:
    """One optimizer step per batch; a plain model averages its gradients over the ranks."""
    assert side.opt is not None
    losses = []
    blocks = tree_blocks(side.model)
    for x, y in data:
        change_requires_grad(side, side.step)
        side.step += 1
        mesh = side.composed.spmd_mesh
        if mesh is not None:
            loss = spmd_backward(side.model(spmd_part(x, mesh)), y, mesh, side.composed.spmd_mse_loss)
        else:
            # the tree's loss: its output's, and a stashed intermediate's (Block.stash)
            loss = tree_loss(side.model(x), y, TORCH_DTYPES[side.training.dtype], blocks)
            loss.backward()
        if side.plain:
            for p in side.model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= ctx.world_size
        side.opt.step()
        side.opt.zero_grad(set_to_none=side.training.set_to_none)
        losses.append(loss.item())
    return losses


def _flat(t: Any) -> list[float]:
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.full_tensor()
    return [float(v) for v in t.detach().double().cpu().flatten().tolist()]


def observe_model(side: Side) -> dict[str, list[float]]:
    """Every parameter and persistent buffer (what a state dict holds; a non-persistent one is
    the same in both models by construction, :func:`constants`, and the forward probe reads
    it), full size, by its plain-model name (collective)."""
    with side.composed.full_parameters() as params:
        out = {n: [float(v) for v in t.double().cpu().flatten().tolist()] for n, t in params.items()}
    for path, module in side.model.named_modules():
        for name, b in module.named_buffers(recurse=False):
            if b is not None and name not in module._non_persistent_buffers_set:
                out[clean_name(f"{path}.{name}" if path else name)] = _flat(b)
    return out


def with_tied_names(model: dict[str, list[float]], tree: ModuleTree) -> dict[str, list[float]]:
    """``model`` (observe_model's) with a tied weight under each of its names, as the state
    dict holds it (``state_dict`` and ``get_model_state_dict`` keep both keys of a tied pair;
    named_parameters, which observe_model reads, names it once). A name observed already (a
    load that untied the pair registers the head's own Parameter) keeps its own value."""
    if tree.tied is None:
        return model
    first, *others = [f"{path}.weight" for path in tree.tied]
    out = dict(model)
    for name in others:
        if first in out:
            out.setdefault(name, out[first])
    return out


def jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _flat(value)
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return repr(value)


def observe_groups(side: Side) -> list[dict[str, Any]]:
    """Every param group's hyperparameters, and its parameters by name (local, no collective)."""
    if side.opt is None:
        return []
    names = side.names()
    out = []
    for group in side.opt.param_groups:
        item = {k: jsonable(v) for k, v in sorted(group.items()) if k != "params"}
        item["params"] = [names.get(id(p), "?") for p in group["params"]]
        out.append(item)
    return out


def observe_optimizer(side: Side) -> dict[str, dict[str, list[float]]]:
    """Every optimizer state entry (exp_avg, exp_avg_sq, step, momentum_buffer, ...), full
    size, by parameter name (collective: the same params and keys in the same order on every
    rank, or the mismatch shows as a hang). Under FSDP1 the entries are this rank's flat
    local shards (no collective): only FSDP.optim_state_dict, the API under test, gathers them."""
    if side.opt is None:
        return {}
    names = side.names()
    out: dict[str, dict[str, list[float]]] = {}
    for group in side.opt.param_groups:
        for p in group["params"]:
            state = side.opt.state.get(p, {})
            entry = {key: jsonable(state[key]) for key in sorted(state)}
            if entry:
                out[names.get(id(p), "?")] = entry
    return out


def observe_state_dict_optimizer(osd: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """The state of an optimizer state dict that get_optimizer_state_dict took from an FSDP1
    model, keyed by FQN, in observe_optimizer's form (collective where it holds DTensors:
    every rank calls it in the same order). FSDP1's own optimizer state is flat local shards
    that only FSDP.optim_state_dict gathers, so this, the API's output, is what a target of
    another API must hold in full after loading it; whether it is FSDP1's true state is
    judged by resuming (steps_after >= 1 for FSDP1). On ranks other than 0 it may be empty
    (full_state_dict with cpu_offload)."""
    out: dict[str, dict[str, list[float]]] = {}
    for fqn, state in sorted(osd.get("state", {}).items()):
        entry = {key: jsonable(state[key]) for key in sorted(state)}
        if entry:
            out[clean_name(fqn)] = entry
    return out


def probe(side: Side, case: Case, tree: ModuleTree, ctx: RankContext) -> list[float]:
    """The model's output on a fixed input (a forward on every rank)."""
    gen = torch.Generator().manual_seed(case.seed + 1)
    x = sample_batch(tree, PROBE_ROWS, gen, TORCH_DTYPES[side.training.dtype])[0].to(ctx.device)
    seed_segment(case, ctx, 99)
    if side.composed.spmd_mesh is not None:
        x = spmd_replicated(x, side.composed.spmd_mesh)
    with torch.no_grad():
        out = _flat(main_output(side.model(x)))  # a tuple or dict output's activation
    reshard(side.model)
    return out


def reshard(model: nn.Module) -> None:
    """Register the sharded parameters again after a forward. With reshard_after_forward
    False (or an int) a forward leaves the unsharded (or partly sharded) parameters
    registered, and fully_shard documents that "to modify the parameters ... the registered
    parameters must be the sharded parameters ... done by manually resharding via reshard()";
    set_model_state_dict reads the registered parameters before FSDP2's load hook reshards."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def observe(side: Side, case: Case, tree: ModuleTree, ctx: RankContext, *, model: bool = True) -> dict[str, Any]:
    """Model, optimizer, groups and a probe; the big parts on rank 0 only. FSDP1's optimizer
    state is this rank's local shards (``optimizer_local``, on every rank)."""
    obs: dict[str, Any] = {"groups": observe_groups(side)}
    if model:
        params = with_tied_names(observe_model(side), tree)
        optim = observe_optimizer(side)
        out = probe(side, case, tree, ctx)
        if side.fsdp1:
            obs["optimizer_local"] = optim
        if ctx.rank == 0:
            obs.update(model=params, probe=out)
            if not side.fsdp1:
                obs["optimizer"] = optim
    return obs


def model_keys(side: Side) -> list[str]:
    """The model's state-dict keys (parameters and persistent buffers), sorted."""
    return sorted(clean_name(k) for k in side.model.state_dict())


def keyed_apart(tree: ModuleTree) -> bool:
    """Whether the tree's state-dict keys are not simply its parameters and buffers: a tied
    weight (two keys, one parameter) or a non-persistent buffer (no key)."""
    return tree.tied is not None or any(not getattr(n, "persistent", True) for n in tree.paths().values())


def plain_keys(tree: ModuleTree) -> list[str]:
    """The state-dict keys of the plain model built from ``tree`` (on the meta device: no
    values, no draws from the CPU generator), sorted."""
    return sorted(build_model(tree, torch.device("meta")).state_dict())


def dropped_keys(side: Side, drop: tuple[int, ...], tree: ModuleTree) -> list[str]:
    """The state-dict keys left out of the load: those at the positions ``drop`` (modulo the
    number of keys), with the other names of a tied weight: a tied pair's two keys
    (``get_model_state_dict`` keeps both, as ``state_dict`` does) load one Parameter, so
    leaving out one name alone leaves nothing out."""
    if not drop:
        return []
    keys = model_keys(side)
    if not keys:
        return []
    chosen = {keys[i % len(keys)] for i in drop}
    if tree.tied is not None:
        aliases = {f"{path}.weight" for path in tree.tied}
        if chosen & aliases:
            chosen |= aliases & set(keys)
    return sorted(chosen)


def fsdp1_state_dict_type(side: Side, *, full: bool, offload: bool, rank0_only: bool = False) -> None:
    """FSDP.set_state_dict_type on an FSDP1 model: FULL_STATE_DICT (on every rank, or with
    ``rank0_only`` on rank 0 alone) or SHARDED_STATE_DICT, with ``offload`` as the model's and
    the optimizer's offload_to_cpu."""
    from torch.distributed.fsdp import (
        FullOptimStateDictConfig,
        FullStateDictConfig,
        ShardedOptimStateDictConfig,
        ShardedStateDictConfig,
        StateDictType,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if full:
        FSDP.set_state_dict_type(
            side.model,
            StateDictType.FULL_STATE_DICT,
            FullStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only),
            FullOptimStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only),
        )
    else:
        FSDP.set_state_dict_type(
            side.model,
            StateDictType.SHARDED_STATE_DICT,
            ShardedStateDictConfig(offload_to_cpu=offload),
            ShardedOptimStateDictConfig(offload_to_cpu=offload),
        )


def fsdp1_optim_state_dict(side: Side) -> dict[str, Any]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    assert side.opt is not None
    osd: dict[str, Any] = FSDP.optim_state_dict(side.model, side.opt)
    return osd


def fsdp1_load_optimizer(side: Side, osd: dict[str, Any]) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    assert side.opt is not None
    side.opt.load_state_dict(FSDP.optim_state_dict_to_load(side.model, side.opt, osd))


def torch_kwargs(fn: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for ``fn``, checked against this torch's signature of it. The cases pass an
    option only where it differs from its default, and the strategies draw only options the
    installed torch has; a case from a newer torch (a corpus entry) that names an option this
    one lacks fails here, saying so, rather than silently running without it."""
    params = inspect.signature(fn).parameters
    missing = sorted(k for k in kwargs if k not in params)
    if missing:
        name = getattr(fn, "__qualname__", repr(fn))
        raise NotImplementedError(f"{name} of torch {torch.__version__} has no parameter(s) {missing}")
    return kwargs


def state_dict_options(o: Options, fqn_modifiers: str = DEFAULT_FQN_MODIFIERS) -> Any:
    """``o`` as StateDictOptions; ``fqn_modifiers`` is the name of the method fused modules
    say which children their state dicts hide with (:class:`fuzz._rank.models.FusedLeaf`)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    extra: dict[str, Any] = {
        n: True for n in ("ignore_frozen_params", "flatten_optimizer_state_dict") if getattr(o, n)
    }  # passed only when set: older torch may lack them (torch_kwargs)
    if fqn_modifiers != DEFAULT_FQN_MODIFIERS:
        extra["dsd_fqn_modifiers"] = fqn_modifiers
    return StateDictOptions(
        full_state_dict=o.full_state_dict,
        cpu_offload=o.cpu_offload,
        broadcast_from_rank0=o.broadcast_from_rank0,
        strict=o.strict,
        **torch_kwargs(StateDictOptions, extra),
    )


def frozen_names(side: Side) -> list[str]:
    """The frozen parameters' names (``requires_grad`` False), as state-dict keys."""
    return sorted(clean_name(n) for n, p in side.model.named_parameters() if not p.requires_grad)


def observe_flat_optimizer(body: StateDictBody, side: Side, flat: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """With flatten_optimizer_state_dict: the flat optimizer state dict that was taken, and the
    nested one get_optimizer_state_dict takes with the same options otherwise (returned too),
    both as JSON (collective where they hold DTensors: keys in sorted order on every rank)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    assert side.opt is not None
    nested: dict[str, Any] = get_optimizer_state_dict(
        side.model,
        side.opt,
        options=state_dict_options(replace(body.save, flatten_optimizer_state_dict=False), body.fqn_modifiers),
    )
    obs = {
        "flat": {k: jsonable(flat[k]) for k in sorted(flat)},
        "nested": {
            "state": {
                fqn: {k: jsonable(v) for k, v in sorted(st.items())}
                for fqn, st in sorted(nested.get("state", {}).items())
            },
            "param_groups": [{k: jsonable(v) for k, v in sorted(g.items())} for g in nested.get("param_groups", [])],
        },
    }
    return obs, nested


def _take(body: StateDictBody, side: Side) -> tuple[dict[str, Any], dict[str, Any]]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict, get_state_dict

    options = state_dict_options(body.save, body.fqn_modifiers)
    assert side.opt is not None
    if body.api is Api.FSDP1:
        only0 = body.load.broadcast_from_rank0
        fsdp1_state_dict_type(side, full=body.save.full_state_dict, offload=body.save.cpu_offload, rank0_only=only0)
        return side.model.state_dict(), fsdp1_optim_state_dict(side)
    if body.api is Api.COMBINED:
        return get_state_dict(side.model, side.opt, options=options)
    if body.api is Api.MODULE:
        msd = side.model.state_dict()
    else:
        msd = get_model_state_dict(side.model, options=options)
    return msd, get_optimizer_state_dict(side.model, side.opt, options=options)


def _put(
    body: StateDictBody, side: Side, msd: dict[str, Any], osd: dict[str, Any], ctx: RankContext, seed: int
) -> tuple[Any, dict[str, bool]]:
    """Load into ``side``; builds its optimizer after the model load for a meta-device target
    (and then replays the requires_grad schedule, before the optimizer load, as for any other
    target). Returns what the model load reported (missing and unexpected keys), and every
    parameter's requires_grad right after the model load."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict, set_state_dict

    options = state_dict_options(body.load, body.fqn_modifiers)
    fresh = fresh_training(body.training)
    if body.api is Api.FSDP1:
        only0 = body.load.broadcast_from_rank0
        fsdp1_state_dict_type(side, full=body.load.full_state_dict, offload=body.load.cpu_offload, rank0_only=only0)
        result = side.model.load_state_dict(msd)
        flags = requires_grad(side)
        fsdp1_load_optimizer(side, osd)
        return result, flags
    if body.api is Api.COMBINED:
        assert side.opt is not None
        result = set_state_dict(side.model, side.opt, model_state_dict=msd, optim_state_dict=osd, options=options)
        return result, requires_grad(side)
    if body.target_meta_init and (not body.load.full_state_dict or ctx.device.type != "cpu"):
        # A sharded state dict is copied into the parameters, so they need storage first. A
        # full one is assigned (set_model_state_dict detects the meta device) on the device
        # torch takes for the process group's default, which is the CPU for the ranks'
        # "cpu:gloo,cuda:nccl" group: parameters and buffers of a meta model would end up on
        # the CPU, nothing in the API names another device. So off the CPU the target gets
        # storage first too (docs/state_dict.md); on the CPU the assigning path is exercised.
        side.model.to_empty(device=ctx.device)
    if body.api is Api.MODULE:
        result = side.model.load_state_dict(msd, strict=body.load.strict)
    else:
        result = set_model_state_dict(side.model, msd, options=options)
    if body.target_meta_init:
        set_constants(side.model, constants(body.tree, body.training, seed), ctx)  # see meta_target_problem
    flags = requires_grad(side)
    opt = side.opt if side.opt is not None else body_optimizer(side, fresh, body)
    catch_up(side, body.training.steps)
    set_optimizer_state_dict(side.model, opt, osd, options=options)
    return result, flags


def incompatible(result: Any) -> dict[str, list[str]]:
    missing = getattr(result, "missing_keys", []) or []
    unexpected = getattr(result, "unexpected_keys", []) or []
    return {"missing": sorted(clean_name(k) for k in missing), "unexpected": sorted(clean_name(k) for k in unexpected)}


def from_rank0(state: dict[str, Any], ctx: RankContext) -> dict[str, Any]:
    """Rank 0's ``state`` on every rank (on the CPU), as if rank 0 had saved it to a shared file
    that every rank then reads."""
    mine = [{k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in state.items()} if ctx.rank == 0 else None]
    dist.broadcast_object_list(mine, src=0)
    got = mine[0]
    assert isinstance(got, dict)
    return got


def run_state_dict(case: Case, body: StateDictBody, ctx: RankContext) -> dict[str, Any]:
    t = body.training
    data = all_batches(case, t, t.steps + body.steps_after, body.tree, ctx)
    fused: dict[str, Any] = {"fused": body.fused, "fqn_modifiers": body.fqn_modifiers}
    src = build_side(body.tree, body.source, t, ctx, seed=case.seed, schedule=body.requires_grad, **fused)
    body_optimizer(src, t, body)
    seed_segment(case, ctx, 0)
    obs: dict[str, Any] = {"losses_before": train_steps(src, data[: t.steps], ctx)}

    msd, osd = _take(body, src)
    nested_osd = osd
    ignored: list[str] = []
    if body.save.ignore_frozen_params:
        # get_model_state_dict must leave out exactly the frozen parameters; they are left
        # out of the load too, so they keep their fresh values (as dropped keys do).
        ignored = frozen_names(src)
    if body.save.ignore_frozen_params or body.fused or keyed_apart(body.tree):
        # The keys taken are the model's own state-dict keys (those its hooks make, for fused
        # leaves), less the frozen parameters with ignore_frozen_params; without fused leaves
        # those of the plain model built from the tree (nn.Module's contract: a tied weight
        # under each name, persistent buffers only), which the wrapped model must keep.
        every = model_keys(src) if body.fused else plain_keys(body.tree)  # model_keys gathers (FSDP1)
        if ctx.rank == 0:
            obs["model_keys"] = {
                "keys": sorted(clean_name(k) for k in msd),
                "expected": sorted(set(every) - set(ignored)),
            }
    if body.save.flatten_optimizer_state_dict:
        flat_obs, nested_osd = observe_flat_optimizer(body, src, osd)
        if ctx.rank == 0:
            obs["flat_optimizer"] = flat_obs
    if not src.fsdp1:
        # What get_optimizer_state_dict returned, before anything loads it: the documented
        # contract is the optimizer's whole state by FQN (judged against ``saved``).
        taken = observe_state_dict_optimizer(nested_osd)
        if ctx.rank == 0:
            obs["taken_optimizer"] = taken
    msd, osd = copy.deepcopy((msd, osd))  # see the module docstring
    obs["saved"] = observe(src, case, body.tree, ctx)
    if src.fsdp1 and not is_fsdp1(body.target):
        # What the target must hold in full after the load (see observe_state_dict_optimizer).
        saved_optim = observe_state_dict_optimizer(nested_osd)
        if ctx.rank == 0:
            obs["saved"]["optimizer"] = saved_optim

    tgt = build_side(
        body.tree,
        body.target,
        t,
        ctx,
        seed=case.seed + FRESH_SEED,
        meta=body.target_meta_init,
        schedule=body.requires_grad,
        constants_seed=case.seed,
        **fused,
    )
    if not body.target_meta_init:
        body_optimizer(tgt, fresh_training(t), body)
        catch_up(tgt, t.steps)
    dropped = sorted(set(dropped_keys(src, body.drop, body.tree)) | set(ignored))
    obs["dropped"] = dropped
    if dropped:
        obs["fresh"] = observe(tgt, case, body.tree, ctx)
        msd = {k: v for k, v in msd.items() if k not in dropped}
    if body.api is Api.FSDP1 and body.load.broadcast_from_rank0:
        # rank0_only: FSDP1's load_state_dict wants the full model state on every rank, which
        # users read from rank 0's file; optim_state_dict_to_load broadcasts rank 0's itself.
        msd = from_rank0(msd, ctx)
    elif body.load.broadcast_from_rank0 and ctx.rank != 0:
        msd, osd = {}, {}  # the documented use: only rank 0 holds the full state
    before = requires_grad(tgt)
    result, after = _put(body, tgt, msd, osd, ctx, case.seed)
    obs["load_result"] = incompatible(result)
    obs["requires_grad"] = {"before": before, "after": after}
    obs["loaded"] = observe(tgt, case, body.tree, ctx)

    if body.steps_after:
        obs.update(resume_both(case, src, tgt, data[t.steps :], ctx))
    return obs


def resume_source(case: Case, src: Side, data: list[Any], ctx: RankContext) -> tuple[list[float], dict[str, Any]]:
    """Train the source on (uninterrupted): its losses and final model."""
    seed_segment(case, ctx, 1)
    losses = train_steps(src, data, ctx)
    return losses, observe_model(src)


def resume_both(
    case: Case,
    src: Side,
    tgt: Side,
    data: list[Any],
    ctx: RankContext,
    source_done: tuple[list[float], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Train on the source (uninterrupted) and the target (resumed) from one RNG state over the
    same batches: their losses, and (rank 0) their final models. ``source_done`` is what
    resume_source gave if the source trained on already (while its checkpoint was in flight)."""
    obs: dict[str, Any] = {}
    losses_src, final_src = source_done if source_done is not None else resume_source(case, src, data, ctx)
    obs["losses_source"] = losses_src
    seed_segment(case, ctx, 1)
    obs["losses_target"] = train_steps(tgt, data, ctx)
    final_tgt = observe_model(tgt)
    if ctx.rank == 0:
        obs["final_source"], obs["final_target"] = final_src, final_tgt
    return obs
