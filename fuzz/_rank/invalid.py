"""Documented misuses of the composable APIs, applied on every rank.

Every rank must raise the documented error. The error is caught and reported as the
observation; a barrier afterwards shows that no rank went on into collectives the others
never join (that would end as a hang).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from fuzz._rank.context import RankContext
from fuzz._rank.models import build_model, loss_of, sample_batch
from fuzz.model import Case, InvalidBody, Misuse


def run_invalid(case: Case, body: InvalidBody, ctx: RankContext) -> dict[str, Any]:
    from torch.distributed._composable import checkpoint, replicate
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    torch.manual_seed(case.seed)
    model = build_model(body.tree, ctx.device)
    mesh = ctx.mesh((ctx.world_size,), ("shard",))
    target = model.get_submodule(body.path)
    raised: dict[str, str] | None = None
    try:
        if body.misuse in (Misuse.TIED_ACROSS_UNITS, Misuse.SCALAR_UNDER_FULLY_SHARD, Misuse.CONTAINER_UNIT):
            # the other module of a tied pair stays in the root's unit; a scalar raises at the call
            fully_shard(target, mesh=mesh)
        elif body.misuse is Misuse.REPLICATE_AFTER_FULLY_SHARD:
            fully_shard(target, mesh=mesh)
            replicate(target)
        elif body.misuse is Misuse.UNEVEN_SHARD_DIM_1:
            fully_shard(target, mesh=mesh, shard_placement_fn=lambda p: Shard(1) if p.ndim > 1 else None)
        elif body.misuse is Misuse.CHECKPOINT_USE_REENTRANT:
            checkpoint(target, use_reentrant=True)
        if body.path:
            fully_shard(model, mesh=mesh)
        x, y = sample_batch(body.tree, 2, torch.Generator().manual_seed(case.seed), torch.float32)
        loss_of(model(x.to(ctx.device)), y.to(ctx.device), torch.float32).backward()
    except Exception as e:
        raised = {"type": f"{type(e).__module__}.{type(e).__qualname__}", "message": str(e)[:500]}
    dist.barrier()
    return {"raised": raised}
