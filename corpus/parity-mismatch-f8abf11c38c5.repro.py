#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=61b5b77232a1be4c sources=cc7a627a8c860e1e seconds=8899.9
# Reproduces shardfuzz corpus entry parity-mismatch-f8abf11c38c5.json: mismatch:parity@fsdp2+spmd:mse-loss
# Known torch bug: F.mse_loss (mean) of a DTensor sharded on the batch dimension: the value is the
# global mean, but aten.mse_loss_backward has no sharding strategy, so DTensor takes one from its
# decomposition at the global shape and runs the op on each rank's shard, which divides by the
# shard's element count: every gradient is the true one times the number of shards of the batch;
# upstream: none found.
# Observed: rank 0 gradient norm at step 0 is 7.011754035949707, expected 3.5058770179748535
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank prints
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected: the
# property's judge finds nothing); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
import torch
from torch import nn
import torch.nn.functional as F
import torch.distributed as dist

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def attempt(rank, world_size):
    torch.manual_seed(0)
    model_ = PointwiseConv1d(1, 1, kernel_size=1, bias=False)
    from torch.distributed.device_mesh import init_device_mesh
    ctx__meshes_empty = init_device_mesh(torch.device('cpu').type, (2,), mesh_dim_names=('shard',))
    from torch.distributed.tensor import Replicate, distribute_tensor
    path_, module = next(model_.named_modules())
    name, p_ = next(module.named_parameters())
    setattr(module, name, nn.Parameter(distribute_tensor(p_, ctx__meshes_empty, [Replicate()] * ctx__meshes_empty.ndim)))
    from torch.distributed.fsdp import fully_shard, DataParallelMeshDims
    fully_shard(model_, mesh=ctx__meshes_empty, dp_mesh_dims=DataParallelMeshDims(shard='shard'))
    i, (x, y) = (0, (torch.randn(world_size, 1)[rank:rank + 1], torch.randn(world_size, 1)[rank:rank + 1]))
    from torch.distributed.tensor import DTensor, Shard
    x = DTensor.from_local(x, ctx__meshes_empty, [Shard(0) for name___ in ctx__meshes_empty.mesh_dim_names])
    out = model_(x)
    target = DTensor.from_local(y, ctx__meshes_empty, [Shard(0) for name____ in ctx__meshes_empty.mesh_dim_names])
    (F.mse_loss(out, target) * (target.numel() / y.numel())).backward()
    total = torch.zeros(())
    total += next(model_.parameters()).grad.full_tensor().sum()
    obs = {**{'grad_norms': [total]}}
    outs = [None, None]
    dist.all_gather_object(outs, obs)
    if rank != 0:
        return ''
    rank_, obs_ = [r for r in (o for r, o in enumerate(outs))]
    norms = [(i__, g, w) for i__, (g, w) in enumerate(zip(obs_['grad_norms'][:None], [-0.1879635602235794]))]
    step, got_norm, want_norm = next(iter(norms))
    actual = [got_norm]
    expected = [-0.1879635602235794]
    worst = None
    i_, (a, e) = next(enumerate(zip(actual, expected)))
    if not abs(a - e) <= 2.879635602235794e-06:
        worst = i_
    failure_ = f'rank {rank_} gradient norm at step {step} is {got_norm!r}, expected {want_norm!r}' if worst is not None else None
    if failure_ is not None:
        return f'REPRODUCED mismatch:parity@fsdp2+spmd:mse-loss: {failure_}'
    return f'PASS or another failure: {failure_ and failure_}'


def main():
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import sys
    if os.environ.get("WORLD_SIZE") != "2":
        print("run it with: torchrun --nproc-per-node 2 " + sys.argv[0], file=sys.stderr)
        sys.exit(2)
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    verdict = attempt(rank, world_size)
    if verdict and verdict not in ['PASS or another failure: None', 'PASS: every loss, gradient and parameter agrees', 'PASS: every rank finished', 'PASS: no rank died', 'PASS: no rank raised']:
        sys.stdout.write(verdict + "\n")  # one write: the ranks share torchrun's output
        sys.stdout.flush()
        os._exit(1 if verdict.startswith("REPRODUCED") else 2)
    if verdict:
        print(verdict, flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
