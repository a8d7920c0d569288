#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=9ff801546b7cc4d4 seconds=50.9
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: DTensor convolution runs the local op on its inputs as they are, not
# redistributed to the placements its sharding propagation chose (convolution_handler ignores
# needs_redistribute): a Partial input (a rowwise-parallel output) gives a local partial result
# labelled Replicate (wrong values, no error) and backward raises 'Can not redistribute from R to
# P(sum)'; a [Shard(0), Partial] input raises ValueError 'Tensor dim 0 is already sharded on mesh
# dim 0' (dim_map of the chosen [Shard(0), Shard(0)]); a channel-sharded input (Shard(1)) raises
# the local conv's RuntimeError 'expected input[...] to have 2 channels, but got 1'; upstream:
# https://github.com/pytorch/pytorch/issues/186129.
# Runs the case's training.
# Run: torchrun --nproc-per-node 4 THIS_FILE.py. Exit 1 (REPRODUCED): a rank raised the exception
# in RAISED (its type, in that function of torch); 0 (PASS): every rank ran through; 2: it failed
# another way.
import os
import re
import torch
import torch.distributed as dist
import traceback
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import DataParallelMeshDims
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


class Block(nn.Module):
    def __init__(self, children, width, scale=False, residual=False):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None
        self.residual = residual

    def forward(self, x):
        y = x
        for child in self.children():
            y = child(y)
        y = y if self.scale is None else y * self.scale
        return x + y if self.residual else y


class Conv(nn.Conv1d):
    """A one-tap Conv1d over a (batch, width) activation, as a length-1 sequence."""

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)


def main(rank, world_size):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("shard", "tp"))
    torch.manual_seed(0)  # every rank builds the same weights
    model = Block([
        Block([nn.Linear(2, 2, bias=False), nn.GELU(), nn.Linear(2, 2)], 2, scale=True, residual=True),
        Block([nn.Linear(2, 2), nn.GELU(), nn.Linear(2, 2)], 2, residual=True),
        Conv(2, 2, 1),
    ], 2, residual=True).to(torch.float64)
    split = {"0.0.weight": Shard(0), "0.2.weight": Shard(1), "1.0.weight": Shard(0),
             "1.0.bias": Shard(0), "1.2.weight": Shard(1)}  # on tp: colwise (dim 0), rowwise (dim 1)
    for name, p in list(model.named_parameters()):  # an SPMD program: DTensors on the whole mesh
        holder, _, attr = name.rpartition(".")
        dt = distribute_tensor(p.detach(), mesh, [Replicate(), split.get(name, Replicate())])
        setattr(model.get_submodule(holder), attr, nn.Parameter(dt, requires_grad=p.requires_grad))
    fully_shard(model.get_submodule("0.0"), mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="shard"))
    fully_shard(model.get_submodule("0.2"), mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="shard"))
    fully_shard(model, mesh=mesh, reshard_after_forward=False, dp_mesh_dims=DataParallelMeshDims(shard="shard"))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, eps=0.0001)
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(world_size, 2, generator=gen, dtype=torch.float64)[(rank // 2) :][:1] for _ in range(2))
    out = model(DTensor.from_local(x, mesh, [Shard(0), Replicate()]))  # this rank's rows of the global batch
    err = out - DTensor.from_local(y, mesh, [Shard(0), Replicate()])
    (err * err).sum().div(y.numel()).backward()  # the sum of the ranks' mean losses
    opt.step()
    opt.zero_grad(set_to_none=False)


RAISED = {
    'RuntimeError@torch/_ops.py:__call__',
    'RuntimeError@torch/distributed/tensor/_api.py:redistribute',
    'ValueError@torch/distributed/tensor/_dtensor_spec.py:dim_map',
}


if __name__ == "__main__":
    try:
        dist.init_process_group("gloo")
        main(dist.get_rank(), dist.get_world_size())
        dist.barrier()
    except BaseException as e:  # DCP's CheckpointException is one; its text has the ranks' tracebacks
        text = traceback.format_exc()
        frames = re.findall(r'File "[^"]*/(torch/[^"-]+)", line \d+, in (?!<\w+comp>)(\S+)', text)  # torch's own
        raised = f"{type(e).__name__}@{':'.join(frames[-1]) if frames else '?'}"
        said = "REPRODUCED" if raised in RAISED else "FAIL (another failure)"
        print(f"{text}{said}: rank {os.environ.get('RANK')} raised {raised}", flush=True)
        os._exit(1 if raised in RAISED else 2)
    print("PASS: no rank raised", flush=True)
    os._exit(0)
