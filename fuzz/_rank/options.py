"""The keyword arguments of ``replicate`` and ``checkpoint`` calls, from a composition's
:class:`fuzz.model.ReplicateOptions` and :class:`fuzz.model.CheckpointOptions`.

Only options that differ from torch's defaults are passed, so a composition without options
calls both exactly as before (and a torch that lacks an option is never handed it).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from fuzz._rank.context import RankContext
from fuzz.model import CheckpointOptions, Composition, ContextFn, Layout, ModuleTree, ReplicateGroup


def replicate_kwargs(
    model: nn.Module, tree: ModuleTree | None, comp: Composition, path: str, ctx: RankContext
) -> dict[str, Any]:
    """What the replicate call on the module at ``path`` is given besides the module (``tree``,
    the one the model was built from, is needed where options are set)."""
    opts = comp.replicate_options
    kwargs: dict[str, Any] = {"find_unused_parameters": comp.find_unused}
    if opts.device_id:
        # replicate's own spelling: a torch.device, which it turns into device_ids (None on the CPU)
        kwargs["device_id"] = ctx.device
    else:
        kwargs["device_ids"] = None if ctx.device.type == "cpu" else [ctx.device]
    if not opts.is_set:
        return kwargs
    if tree is None:
        raise ValueError("replicate options need the tree the model was built from")
    if opts.bucket_cap_mb is not None:
        kwargs["bucket_cap_mb"] = opts.bucket_cap_mb
    if opts.bucket_cap_mb_list:
        kwargs["bucket_cap_mb_list"] = list(opts.bucket_cap_mb_list)
    for name in ("gradient_as_bucket_view", "static_graph", "batched_grad_copy", "skip_all_reduce_unused_params"):
        if getattr(opts, name):
            kwargs[name] = True
    if not opts.init_sync:
        kwargs["init_sync"] = False
    if opts.dim:
        kwargs["dim"] = opts.dim
    if opts.forward_sync_buffers is not None:
        kwargs["forward_sync_buffers"] = opts.forward_sync_buffers
    if opts.group is ReplicateGroup.PROCESS_GROUP:
        kwargs["process_group"] = ctx.group("replicate")
    elif opts.group is ReplicateGroup.DEVICE_MESH:
        kwargs["device_mesh"] = ctx.mesh((ctx.world_size,), ("replicate",))
    layout = Layout(tree, comp)
    ignored = layout.ignored_by(path)
    if ignored:
        kwargs["ignored_modules"] = [model.get_submodule(p) for p in ignored]
    plan = layout.delay_plan(path) if opts.delay_all_reduce else None
    if plan is not None:
        hook, delayed = plan
        # replicate hands DDP an nn.ParameterList of the parameters it manages: DDP's names
        # for them are their indices there.
        order = layout.replicated_params(path)
        kwargs["param_to_hook_all_reduce"] = model.get_submodule(hook).get_parameter(
            next(name for p, name in order if p == hook)
        )
        kwargs["delay_all_reduce_named_params"] = [
            (str(i), model.get_submodule(p).get_parameter(name)) for i, (p, name) in enumerate(order) if p in delayed
        ]
    return kwargs


def delay_problems(model: nn.Module, comp: Composition) -> list[str]:
    """What is wrong with the delayed all-reduce, after a forward: documented, the parameters of
    ``delay_all_reduce_named_params`` are all-reduced when ``param_to_hook_all_reduce``'s
    gradient is ready, so DDP's reducer (its buckets) must not hold them as well."""
    from torch.distributed._composable import replicate

    problems = []
    for member in comp.replicates:
        ddp = getattr(replicate.state(model.get_submodule(member)), "_ddp", None)
        if ddp is None:
            continue
        # the parameters DDP hands its reducer (recomputed: a pure function of the module and
        # the names DDP was told to leave out)
        reduced = {id(p) for p in ddp._build_params_for_reducer()[0]}
        held = [i for i, p in enumerate(ddp._delay_all_reduce_params) if id(p) in reduced]
        if held:
            problems.append(
                f"replicate({member!r}): {len(held)} of {len(ddp._delay_all_reduce_params)} delayed parameters are "
                "also in DDP's reducer (all-reduced twice)"
            )
    return problems


def ignored_problems(model: nn.Module, tree: ModuleTree, comp: Composition) -> list[str]:
    """What is wrong with the parameters replicate or fully_shard was told to ignore, after a
    forward (when each replicate call has built its DistributedDataParallel): each must be a
    plain tensor (no DTensor: not sharded) that replicate does not collect and DDP neither
    manages nor delays."""
    from torch.distributed._composable import replicate
    from torch.distributed.tensor import DTensor

    layout = Layout(tree, comp)
    local = {
        id(p): f"{path}.{name}" if path else name
        for path in layout.local()
        for name, p in model.get_submodule(path).named_parameters(recurse=False)
    }
    problems = []
    for _, p in model.named_parameters():
        if id(p) in local and isinstance(p, DTensor):
            problems.append(f"ignored parameter {local[id(p)]} is a DTensor")
    for member in comp.replicates:
        state = replicate.state(model.get_submodule(member))
        ddp = getattr(state, "_ddp", None)  # built at the replicated module's first forward
        held = [*getattr(state, "_param_list", [])]
        if ddp is not None:
            held += [*ddp._module_parameters, *ddp._delay_all_reduce_params]
        for p in held:
            if id(p) in local:
                problems.append(f"replicate({member!r}) manages ignored parameter {local[id(p)]}")
    return sorted(set(problems))


#: The matmuls a selective checkpoint saves (``CheckpointPolicy.MUST_SAVE``); every other op is
#: recomputed (``PREFER_RECOMPUTE``). A Linear runs as ``addmm`` (``mm`` without bias).
def _matmuls() -> list[Any]:
    aten = torch.ops.aten
    return [aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default]


def _save_matmuls_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _matmuls() else CheckpointPolicy.PREFER_RECOMPUTE


def checkpoint_kwargs(opts: CheckpointOptions) -> dict[str, Any]:
    """What every checkpoint call is given besides the module."""
    kwargs: dict[str, Any] = {}
    if not opts.is_set:
        return kwargs
    if not opts.preserve_rng_state:
        kwargs["preserve_rng_state"] = False
    if opts.context_fn is not ContextFn.NONE:
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        policy: Any = _save_matmuls_policy if opts.context_fn is ContextFn.SAVE_MATMULS else _matmuls()
        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, policy)
    if opts.determinism_check is not None:
        kwargs["determinism_check"] = opts.determinism_check.value
    if opts.debug:
        kwargs["debug"] = True
    if opts.early_stop is not None:
        kwargs["early_stop"] = opts.early_stop
    return kwargs
