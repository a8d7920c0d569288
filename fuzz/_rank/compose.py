"""Apply a :class:`fuzz.model.Composition` to a plain model on a rank.

Composable APIs (``checkpoint``, ``fully_shard``, ``replicate``) are applied in the order
``Composition.steps()`` gives; wrappers (DDP, FSDP1) wrap the whole model. Returns the model to
train (the wrapper, or the model itself) and what the training loop needs to know about it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fuzz._rank.context import RankContext
from fuzz._rank.knobs import KnobState
from fuzz._rank.models import FUSED_CHILD, build_model, own_parameters
from fuzz._rank.options import checkpoint_kwargs, replicate_kwargs
from fuzz.model import Composition, Dtype, Layout, MixedPrecision, ModuleTree, ShardSpec, Training, Wrapper, is_ancestor

TORCH_DTYPES = {
    Dtype.FLOAT32: torch.float32,
    Dtype.FLOAT64: torch.float64,
    Dtype.BFLOAT16: torch.bfloat16,
    Dtype.FLOAT16: torch.float16,
}

#: Prefixes wrappers add to parameter names; and a fused leaf's hidden child
#: (:class:`fuzz._rank.models.FusedLeaf`), which its state-dict keys leave out.
_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "module.", "_checkpoint_wrapped_module.", f"{FUSED_CHILD}.")


def clean_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def tp_mesh(comp: Composition, ctx: RankContext) -> Any:
    """The (shard, tp) mesh of a tensor-parallel composition."""
    return ctx.mesh((ctx.world_size // comp.tp_size, comp.tp_size), ("shard", "tp"))


def mesh_for(comp: Composition, ctx: RankContext) -> Any:
    """The mesh fully_shard (and FSDP1's HYBRID_SHARD) shards over."""
    if comp.tp:
        return tp_mesh(comp, ctx)["shard"]
    if comp.mesh:
        return ctx.mesh(tuple(comp.mesh), ("replicate", "shard"))
    return ctx.mesh((ctx.world_size,), ("shard",))


def _placement_fn(shard_dim: int, shard_size: int) -> Any:
    """Shard(shard_dim) where that dimension splits evenly, else the default Shard(0).

    FSDP2 documents uneven sharding as supported on dim 0 only (NotImplementedError
    otherwise), so this is how a user's placement function has to look.
    """
    from torch.distributed.tensor import Shard

    def fn(param: nn.Parameter) -> Any:
        if param.ndim > shard_dim and param.shape[shard_dim] % shard_size == 0:
            return Shard(shard_dim)
        return None

    return fn


def mp_policy(mp: MixedPrecision) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    def dt(d: Dtype | None) -> torch.dtype | None:
        return None if d is None else TORCH_DTYPES[d]

    return MixedPrecisionPolicy(
        param_dtype=dt(mp.param_dtype),
        reduce_dtype=dt(mp.reduce_dtype),
        output_dtype=dt(mp.output_dtype),
        cast_forward_inputs=mp.cast_forward_inputs,
    )


def as_spmd(model: nn.Module, mesh: Any, comp: Composition) -> None:
    """Every parameter and buffer of ``model`` made a DTensor on the whole ``mesh``
    (:attr:`fuzz.model.Composition.spmd`), in place: replicated on every data-parallel
    dimension; on a (shard, tp) mesh the tensor-parallel pairs' parameters are split on the
    ``tp`` dimension as ColwiseParallel / RowwiseParallel split them (a colwise weight and bias
    on dim 0, a rowwise weight on dim 1, a rowwise bias replicated), and DTensor's operators
    carry the activations' layouts between them."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    names = list(mesh.mesh_dim_names)
    split: dict[str, Any] = {}
    for pair in comp.tp:
        split.update({f"{pair.colwise}.weight": Shard(0), f"{pair.colwise}.bias": Shard(0)})
        split[f"{pair.rowwise}.weight"] = Shard(1)
    for path, module in model.named_modules():
        for name, p in list(module.named_parameters(recurse=False)):
            placements = [Replicate()] * mesh.ndim
            if f"{path}.{name}".lstrip(".") in split:
                placements[names.index("tp")] = split[f"{path}.{name}".lstrip(".")]
            dt = distribute_tensor(p.detach(), mesh, placements)
            setattr(module, name, nn.Parameter(dt, requires_grad=p.requires_grad))
        for name, b in list(module.named_buffers(recurse=False)):
            module.register_buffer(
                name,
                distribute_tensor(b, mesh, [Replicate()] * mesh.ndim),
                persistent=name not in module._non_persistent_buffers_set,
            )


def spmd_mesh(comp: Composition, ctx: RankContext) -> Any:
    """The whole mesh of an SPMD composition: fully_shard's mesh, with the ``tp`` dimension
    too under tensor parallelism."""
    return tp_mesh(comp, ctx) if comp.tp else mesh_for(comp, ctx)


def _batch_placements(mesh: Any) -> list[Any]:
    """A global batch's placements on an SPMD mesh: split on dim 0 over every data-parallel
    dimension, whole on the ``tp`` dimension (a tensor-parallel group shares its input)."""
    from torch.distributed.tensor import Replicate, Shard

    return [Replicate() if name == "tp" else Shard(0) for name in mesh.mesh_dim_names]


def spmd_part(t: torch.Tensor, mesh: Any) -> Any:
    """This rank's rows ``t`` as its part of the global batch: a DTensor sharded on dim 0 over
    every data-parallel dimension of the mesh (rank r's rows are the r-th block, as the
    reference's batches are: on an HSDP mesh rank r is replicate index r // shard size, shard
    index r % shard size; a tensor-parallel group's ranks share theirs)."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(t, mesh, _batch_placements(mesh))


def spmd_replicated(t: torch.Tensor, mesh: Any) -> Any:
    """``t``, the same on every rank, as an SPMD program's input replicated on the mesh (a
    probe every rank runs on the same rows)."""
    from torch.distributed.tensor import DTensor, Replicate

    return DTensor.from_local(t, mesh, [Replicate()] * mesh.ndim)


def spmd_backward(out: Any, y: torch.Tensor, mesh: Any, mse: bool = False) -> torch.Tensor:
    """Backward from the sum over data-parallel ranks of each rank's mean loss, ``out`` being an
    SPMD program's output on this rank's part of the batch (:func:`spmd_part`) and ``y`` this
    rank's targets; returns this rank's part's loss (detached): the loss a rank of the
    reference observes.

    fully_shard averages gradients over the data-parallel ranks (its gradient divide factor),
    so the loss whose gradient it averages is the sum of the ranks' mean losses: the squared
    error summed over the global batch (a DTensor reduction to a partial sum) over one rank's
    element count. Its average over ranks is the reference's. The loss is written out
    pointwise: ``F.mse_loss`` on a batch-sharded DTensor returns the global mean, but its
    backward on torch 2.13 scales the gradient by the number of shards (docs/known_bugs.md,
    "DTensor mse_loss backward"), which would only cancel fully_shard's averaging by accident.
    With ``mse`` (:attr:`fuzz.model.Composition.spmd_mse_loss`) the same loss is written as a
    user of DTensor writes it: ``F.mse_loss`` of the DTensors (the global mean) times the number
    of batch shards (global over local element count); its gradient must be the same."""
    target = spmd_part(y, mesh)
    if mse:
        (F.mse_loss(out.to(y.dtype), target) * (target.numel() / y.numel())).backward()
    else:
        err = out.to(y.dtype) - target
        (err * err).sum().div(y.numel()).backward()
    mine = out.detach()
    if tuple(mine.placements) != tuple(_batch_placements(mesh)):
        mine = mine.redistribute(mesh, _batch_placements(mesh))  # e.g. a rowwise output's partial sum
    return F.mse_loss(mine.to_local().to(y.dtype), y)


def apply_fully_shard(model: nn.Module, spec: ShardSpec, mesh: Any, spmd: bool = False) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": spec.reshard_after_forward}
    if spmd:
        from torch.distributed.fsdp import DataParallelMeshDims  # torch 2.13 and later

        # the mesh's data-parallel dimensions: shard, and HSDP's replicate (not tp)
        replicate = "replicate" if "replicate" in mesh.mesh_dim_names else None
        kwargs["dp_mesh_dims"] = DataParallelMeshDims(shard="shard", replicate=replicate)
    if spec.shard_dim:
        shard_size = mesh.size(mesh.mesh_dim_names.index("shard"))
        kwargs["shard_placement_fn"] = _placement_fn(spec.shard_dim, shard_size)
    if spec.mixed_precision is not None:
        kwargs["mp_policy"] = mp_policy(spec.mixed_precision)
    if spec.offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    if spec.ignored:
        kwargs["ignored_params"] = {p for path in spec.ignored for p in own_parameters(model.get_submodule(path))}
    modules = [model.get_submodule(p) for p in spec.paths]
    fully_shard(modules if spec.group else modules[0], **kwargs)


@dataclass
class Composed:
    model: nn.Module
    #: FSDP2 modules that are not inside another one (where gradient-sync switches go).
    fsdp_roots: list[nn.Module] = field(default_factory=list)
    wrapper: Wrapper = Wrapper.NONE
    #: Parameter names of the plain model, before any wrapper renamed them.
    param_names: list[str] = field(default_factory=list)
    #: The composition's FSDPModule knobs, applied (None without any).
    knobs: KnobState | None = None
    #: The mesh of an SPMD composition (:attr:`fuzz.model.Composition.spmd`), whose inputs
    #: are DTensors on it; None otherwise.
    spmd_mesh: Any = None
    #: The SPMD program's loss is F.mse_loss of the DTensors (:attr:`Composition.spmd_mse_loss`).
    spmd_mse_loss: bool = False

    def no_sync(self) -> Any:
        """Context for a microbatch whose gradients must not be reduced yet (wrappers)."""
        if self.wrapper is Wrapper.NONE:
            return nullcontext()
        return self.model.no_sync()  # type: ignore[operator]

    def set_sync(self, requires_gradient_sync: bool = True, requires_all_reduce: bool = True) -> None:
        for m in self.fsdp_roots:
            m.set_requires_gradient_sync(requires_gradient_sync)  # type: ignore[operator]
            m.set_requires_all_reduce(requires_all_reduce)  # type: ignore[operator]

    @contextmanager
    def full_parameters(self) -> Iterator[dict[str, torch.Tensor]]:
        """Every parameter, full size, by its plain-model name (a collective on every rank)."""
        from torch.distributed.tensor import DTensor

        if self.wrapper.value.startswith("fsdp1"):
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            # Read each parameter by the name it had before wrapping: with use_orig_params,
            # FSDP1 can leave a parameter registered as a plain tensor view (e.g. a frozen one
            # under NO_SHARD after backward; see pytorch/pytorch#85831), and named_parameters()
            # then skips it although the model still uses it.
            modules = {clean_name(n): m for n, m in self.model.named_modules()}
            with FSDP.summon_full_params(self.model):
                out = {}
                for name in self.param_names:
                    owner, _, attr = name.rpartition(".")
                    out[name] = getattr(modules[owner], attr).detach().clone()
                yield out
            return
        out = {}
        for n, p in self.model.named_parameters():
            out[clean_name(n)] = (p.full_tensor() if isinstance(p, DTensor) else p).detach()
        yield out


def compose(model: nn.Module, comp: Composition, ctx: RankContext, tree: ModuleTree | None = None) -> Composed:
    """Apply ``comp`` to ``model`` (built from ``tree``, which replicate's options need)."""
    from torch.distributed._composable import checkpoint, replicate

    ckpt_kwargs = checkpoint_kwargs(comp.checkpoint_options)
    if comp.wrapper is not Wrapper.NONE:
        names = [n for n, _ in model.named_parameters()]
        for path in comp.checkpoints:
            checkpoint(model.get_submodule(path), **ckpt_kwargs)
        return Composed(model=_wrap(model, comp, ctx), wrapper=comp.wrapper, param_names=names)
    if comp.tp and not comp.spmd:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        plan: dict[str, Any] = {}
        for pair in comp.tp:
            plan[pair.colwise] = ColwiseParallel()
            plan[pair.rowwise] = RowwiseParallel()
        parallelize_module(model, tp_mesh(comp, ctx)["tp"], plan)
    mesh = spmd_mesh(comp, ctx) if comp.spmd else mesh_for(comp, ctx)
    if comp.spmd:
        as_spmd(model, mesh, comp)
    specs = {s.path: s for s in comp.shards}
    for api, path in comp.steps():
        if api == "checkpoint":
            checkpoint(model.get_submodule(path), **ckpt_kwargs)
        elif api == "fully_shard":
            apply_fully_shard(model, specs[path], mesh, comp.spmd)
        else:
            replicate(model.get_submodule(path), **replicate_kwargs(model, tree, comp, path, ctx))
    sharded = comp.sharded_paths
    tops = [p for p in sharded if not any(is_ancestor(q, p) for q in sharded)]
    return Composed(
        model=model,
        fsdp_roots=[model.get_submodule(p) for p in tops],
        spmd_mesh=mesh if comp.spmd else None,
        spmd_mse_loss=comp.spmd_mse_loss,
    )


def desynchronize(model: nn.Module, paths: list[str], rank: int, buffers: bool) -> None:
    """On every rank but 0, shift the parameters (and with ``buffers`` the floating-point
    buffers) of the modules at ``paths`` by half the rank: values that a broadcast from rank 0
    must overwrite (:meth:`fuzz.model.Layout.synced_at_init`). A run whose broadcast went
    missing then trains from other weights than the reference, which every rank builds from the
    same seed."""
    if rank == 0:
        return
    with torch.no_grad():
        for path in paths:
            module = model.get_submodule(path)
            tensors = [*own_parameters(module), *(module.buffers(recurse=False) if buffers else ())]
            for t in tensors:
                if t.is_floating_point():
                    t.add_(0.5 * rank)


def build_composed(
    tree: ModuleTree,
    comp: Composition,
    dtype: torch.dtype,
    ctx: RankContext,
    *,
    seed: int,
    desync: Training | None = None,
) -> tuple[nn.Module, Composed]:
    """Build the tree with the RNG seeded by ``seed`` and apply ``comp``: the model as built
    (the wrapper's inner module) and the composed one. With ``desync`` (the training the model
    is built for), the values that DDP must broadcast from rank 0 differ on the other ranks
    before it does (:func:`desynchronize`).

    With ``comp.meta_init`` the model is built on the meta device and composed there; then
    ``to_empty`` gives it storage on the rank's device and the values a plain seeded build would
    have are copied in, each sharded parameter through ``distribute_tensor`` with its own mesh
    and placements. So the composed model starts from the same weights either way, and what
    differs is the path through FSDP2's meta-device support and its lazy init.
    """
    torch.manual_seed(seed)
    if not comp.meta_init:
        model = build_model(tree, ctx.device).to(dtype)
        if desync is not None:
            paths, buffers = Layout(tree, comp).synced_at_init(desync)
            desynchronize(model, paths, ctx.rank, buffers)
        return model, _with_knobs(model, compose(model, comp, ctx, tree), comp, tree)
    from torch.distributed.tensor import DTensor, distribute_tensor

    built = build_model(tree, ctx.device).to(dtype)
    # the state dict and the non-persistent buffers, which it leaves out
    values = {**built.state_dict(), **dict(built.named_buffers())}
    model = build_model(tree, torch.device("meta")).to(dtype)
    composed = compose(model, comp, ctx, tree)
    # CPUOffloadPolicy keeps the sharded parameters on the CPU, and fully_shard's lazy init
    # checks that they were materialized there; buffers stay on the rank's device.
    offload = any(s.offload for s in comp.shards)
    model.to_empty(device="cpu" if offload else ctx.device)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            src = values[clean_name(name)]
            if isinstance(t, DTensor) and offload:
                t.to_local().copy_(distribute_tensor(src, t.device_mesh, t.placements).to_local())
            elif isinstance(t, DTensor):
                t.copy_(distribute_tensor(src, t.device_mesh, t.placements))
            else:
                t.copy_(src)
        if offload:
            for module in model.modules():
                for key, buf in module._buffers.items():
                    if buf is not None:
                        module._buffers[key] = buf.to(ctx.device)
    return model, _with_knobs(model, composed, comp, tree)


def _with_knobs(model: nn.Module, composed: Composed, comp: Composition, tree: ModuleTree) -> Composed:
    if KnobState.wanted(comp):
        composed.knobs = KnobState(model, comp, tree, composed.fsdp_roots)
    return composed


def _wrap(model: nn.Module, comp: Composition, ctx: RankContext) -> nn.Module:
    if comp.wrapper is Wrapper.DDP:
        from torch.nn.parallel import DistributedDataParallel as DDP

        device_ids = None if ctx.device.type == "cpu" else [ctx.device]
        return DDP(model, device_ids=device_ids, find_unused_parameters=comp.find_unused)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from fuzz._rank.models import TreeBlock

    strategy = {
        Wrapper.FSDP1_FULL_SHARD: ShardingStrategy.FULL_SHARD,
        Wrapper.FSDP1_SHARD_GRAD_OP: ShardingStrategy.SHARD_GRAD_OP,
        Wrapper.FSDP1_NO_SHARD: ShardingStrategy.NO_SHARD,
        Wrapper.FSDP1_HYBRID_SHARD: ShardingStrategy.HYBRID_SHARD,
    }[comp.wrapper]
    kwargs: dict[str, Any] = {"sharding_strategy": strategy, "device_id": ctx.device, "use_orig_params": True}
    if comp.wrapper is Wrapper.FSDP1_HYBRID_SHARD:
        kwargs["device_mesh"] = mesh_for(comp, ctx)
    if comp.auto_wrap:
        kwargs["auto_wrap_policy"] = ModuleWrapPolicy({TreeBlock})
    return FSDP(model, **kwargs)
