#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=61b5b77232a1be4c sources=cc7a627a8c860e1e seconds=8744.8
# Reproduces shardfuzz corpus entry parity-mismatch-f8abf11c38c5.json: mismatch:parity@fsdp2+spmd:mse-loss
# Known torch bug: F.mse_loss (mean) of a DTensor sharded on the batch dimension: the value is the
# global mean, but aten.mse_loss_backward has no sharding strategy, so DTensor takes one from its
# decomposition at the global shape and runs the op on each rank's shard, which divides by the
# shard's element count: every gradient is the true one times the number of shards of the batch;
# upstream: none found.
# Observed: rank 0 gradient norm at step 0 is 7.011754035949707, expected 3.5058770179748535
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: prints REPRODUCED and exits 1 while the failure
# is there, else exits 0 (expected: the property's judge finds nothing).

from __future__ import annotations
from dataclasses import dataclass, field
import torch
from torch import nn
import torch.nn.functional as F
import torch.distributed as dist
import math

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    _meshes: object = field(default_factory=dict)

    def mesh(self, shape, names):
        from torch.distributed.device_mesh import init_device_mesh
        key = ()
        self._meshes[key] = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
        return self._meshes[key]

@dataclass()
class Composition:
    pass

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def spmd_mesh(comp, ctx):
    return ctx.mesh((ctx.world_size,), ('shard',))

@dataclass()
class Tolerance:
    rtol: object
    atol: object
POLICY = {'float32': Tolerance(rtol=1e-05, atol=1e-06)}

def compare_runs(observations, tol):
    rank, obs = next(iter(enumerate(observations)))
    norms = [(i, g, w) for i, (g, w) in enumerate(zip(obs['grad_norms'][:None], [-0.1879635602235794])) if not math.isnan(w)]
    step, got_norm, want_norm = next(iter(norms))
    actual = [got_norm]
    expected = [-0.1879635602235794]
    worst = None
    i_, (a, e) = next(iter(enumerate(zip(actual, expected))))
    err = abs(a - e)
    if not err <= 2.879635602235794e-06:
        worst = i_
    bad = worst
    if bad is not None:
        summary = f'rank {rank} gradient norm at step {step} is {got_norm!r}, expected {want_norm!r}'
        return summary

def attempt(rank, world_size):
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'))
    import json
    comp = Composition()
    torch.manual_seed(0)
    model_ = PointwiseConv1d(1, 1, kernel_size=1, bias=False)
    mesh = spmd_mesh(comp, ctx)
    from torch.distributed.tensor import Replicate, distribute_tensor
    path_, module = next(iter(model_.named_modules()))
    name, p_ = next(iter(list(module.named_parameters())))
    placements = [Replicate()] * mesh.ndim
    dt = distribute_tensor(p_, mesh, placements)
    setattr(module, name, nn.Parameter(dt))
    from torch.distributed.fsdp import fully_shard, DataParallelMeshDims
    fully_shard(model_, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard='shard'))
    lo = ctx.rank
    x_ = torch.randn(ctx.world_size, 1)
    y_ = torch.randn(ctx.world_size, 1)
    step_ = [(x_[lo:lo + 1], y_[lo:lo + 1])]
    i, (x, y) = next(iter(enumerate(step_)))
    from torch.distributed.tensor import DTensor as DTensor_, Shard
    batch_placements_out = [Shard(0) for name___ in mesh.mesh_dim_names]
    x = DTensor_.from_local(x, mesh, batch_placements_out)
    out = model_(x)
    if mesh is not None:
        from torch.distributed.tensor import DTensor as DTensor__, Shard as Shard_
        batch_placements_out_ = [Shard_(0) for name____ in mesh.mesh_dim_names]
        target = DTensor__.from_local(y, mesh, batch_placements_out_)
        (F.mse_loss(out, target) * (target.numel() / y.numel())).backward()
    else:
        pass
    from torch.distributed.tensor import DTensor
    total = torch.zeros(())
    p______ = next(iter(model_.parameters()))
    g = p______.grad.full_tensor() if isinstance(p______.grad, DTensor) else p______.grad
    total += g.sum()
    grad_norm_out = float(total)
    grad_norms = [grad_norm_out]
    obs__ = {'grad_norms': grad_norms}
    run_parity_out = {**obs__}
    obs = json.loads(json.dumps(run_parity_out))
    outs = [None] * world_size
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    reports = tuple((o for r, o in enumerate(outs)))
    obs_ = [r for r in reports]
    failure_ = compare_runs(obs_, POLICY['float32'])
    if failure_ is not None:
        return f'REPRODUCED mismatch:parity@fsdp2+spmd:mse-loss: {failure_}'
    return f'PASS or another failure: {failure_ and failure_}'

def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import sys
    import torch.distributed as dist
    dist.init_process_group('gloo')
    verdict = attempt(dist.get_rank(), dist.get_world_size())
    if verdict:
        sys.stdout.write(verdict + '\n')
        sys.stdout.flush()
    os._exit(1 if verdict.startswith('REPRODUCED') else 0)
if __name__ == '__main__':
    main()
