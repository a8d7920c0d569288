"""Training parity on a rank: the composed model against a plain reference, step by step.

Every rank trains the composed model on its slice of a global batch; rank 0 also trains an
identical plain model on the whole global batch. With the loss a mean over equal slices, the
averaged gradients of the composed model equal the reference's in exact arithmetic, so the
mean of the ranks' losses must follow the reference loss and the final parameters must agree.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fuzz._rank.context import RankContext
from fuzz._rank.models import build_model
from fuzz.case import Case, Optimizer, ParityBody, ShardSpec, Training


def make_optimizer(params: Any, training: Training) -> torch.optim.Optimizer:
    if training.optimizer is Optimizer.SGD:
        return torch.optim.SGD(params, lr=training.lr, momentum=training.momentum)
    if training.optimizer is Optimizer.ADAM:
        return torch.optim.Adam(params, lr=training.lr, eps=training.eps)
    return torch.optim.AdamW(params, lr=training.lr, eps=training.eps)


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


def apply_fully_shard(model: nn.Module, spec: ShardSpec, mesh: Any) -> None:
    from torch.distributed.fsdp import fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": spec.reshard_after_forward}
    if spec.shard_dim:
        kwargs["shard_placement_fn"] = _placement_fn(spec.shard_dim, mesh.size())
    fully_shard(model.get_submodule(spec.path), **kwargs)


def full_parameters(model: nn.Module) -> dict[str, list[float]]:
    """Every parameter as a flat list, gathered if sharded (a collective on every rank)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        out[name] = t.detach().double().cpu().flatten().tolist()
    return out


def run_parity(case: Case, body: ParityBody, ctx: RankContext) -> dict[str, Any]:
    training = body.training
    torch.manual_seed(case.seed)
    model = build_model(body.tree, ctx.device).to(getattr(torch, training.dtype.value))
    reference = copy.deepcopy(model) if ctx.rank == 0 else None
    mesh = ctx.mesh((ctx.world_size,), ("shard",))
    for spec in body.composition.shards:
        apply_fully_shard(model, spec, mesh)
    opt = make_optimizer(model.parameters(), training)
    ref_opt = make_optimizer(reference.parameters(), training) if reference is not None else None

    batch, width = training.batch_per_rank, body.tree.width
    lo, hi = ctx.rank * batch, (ctx.rank + 1) * batch
    data = torch.Generator().manual_seed(case.seed)
    losses, ref_losses = [], []
    for _ in range(training.steps):
        dtype = getattr(torch, training.dtype.value)
        x = torch.randn(ctx.world_size * batch, width, generator=data, dtype=dtype).to(ctx.device)
        y = torch.randn(ctx.world_size * batch, width, generator=data, dtype=dtype).to(ctx.device)
        loss = F.mse_loss(model(x[lo:hi]), y[lo:hi])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if reference is not None and ref_opt is not None:
            ref_loss = F.mse_loss(reference(x), y)
            ref_loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            ref_losses.append(ref_loss.item())

    params = full_parameters(model)
    observation: dict[str, Any] = {"losses": losses}
    if reference is not None:
        observation["params"] = params
        observation["ref_losses"] = ref_losses
        observation["ref_params"] = {
            n: p.detach().double().cpu().flatten().tolist() for n, p in reference.named_parameters()
        }
    return observation
