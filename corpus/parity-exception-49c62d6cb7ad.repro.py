#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=9ff801546b7cc4d4 sources=417b1273247da170 seconds=6954.3
# Reproduces shardfuzz corpus entry parity-exception-49c62d6cb7ad.json: exception:parity:builtins.RuntimeError@torch/distributed/tensor/_api.py:redistribute
# Known torch bug: DTensor convolution runs the local op on its inputs as they are, not
# redistributed to the placements its sharding propagation chose (convolution_handler ignores
# needs_redistribute): a Partial input (a rowwise-parallel output) gives a local partial result
# labelled Replicate (wrong values, no error) and backward raises 'Can not redistribute from R to
# P(sum)'; a [Shard(0), Partial] input raises ValueError 'Tensor dim 0 is already sharded on mesh
# dim 0' (dim_map of the chosen [Shard(0), Shard(0)]); a channel-sharded input (Shard(1)) raises
# the local conv's RuntimeError 'expected input[...] to have 2 channels, but got 1'; upstream:
# https://github.com/pytorch/pytorch/issues/186129.
# Observed: DTensor convolution of a Partial input (an SPMD program with tensor parallelism: a
# conv1d leaf after a rowwise pair): forward runs, backward raises 'Can not redistribute from ...
# Run: torchrun --nproc-per-node 4 THIS_FILE.py: while the failure is there a rank raises
# builtins.RuntimeError in torch/distributed/tensor/_api.py:redistribute, prints its traceback and
# REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0 (expected: no
# rank raises); a rank exits 2 where the script cannot run (not under torchrun, another world
# size) or the case fails another way (it prints FAIL). torchrun's own status is 1 whenever a
# rank's is not 0.

from __future__ import annotations
import torch
import enum
from dataclasses import dataclass, field
from torch import nn
import torch.nn.functional as F

@dataclass
class RankContext:
    rank: object
    device: object
    _meshes: object = field(default_factory=dict)

def RankContext_mesh(self, shape, names):
    from torch.distributed.device_mesh import init_device_mesh
    key = ()
    self._meshes[key] = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
    return self._meshes[key]

class LeafKind(str, enum.Enum):
    LINEAR = 'linear'
    CONV1D = 'conv1d'
    GELU = 'gelu'

@dataclass()
class Leaf:
    kind: object
    bias: object = True

@dataclass()
class ShardSpec:
    path: object

@dataclass()
class TpPair:
    colwise: object
    rowwise: object

@dataclass()
class Composition:
    shards: object = ()
    tp: object = ()

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x):
        return super().forward(_one_shard_per_dim(x).unsqueeze(-1)).squeeze(-1)

def _one_shard_per_dim(x):
    return x

def _build_leaf(leaf):
    if leaf.kind is LeafKind.LINEAR:
        return nn.Linear(2, 2)
    if leaf.kind is LeafKind.CONV1D:
        return PointwiseConv1d(2, 2, kernel_size=1)
    return nn.GELU()

def mesh_for():
    pass

def spmd_part(t, mesh):
    from torch.distributed.tensor import DTensor
    return DTensor.from_local(t, mesh, None)

class _Contracts:

    def __init__(self, model, comp):
        self.comp = comp
        self.leaf_dtypes: dict[str, str] = {}
        self.output_dtypes: dict[str, str] = {}
        name, mod = next(iter(model.named_modules()))

    def after_forward(self, skipped):
        return {'leaf_dtypes': self.leaf_dtypes, 'output_dtypes': self.output_dtypes}

def attempt(rank, world_size):
    ctx = RankContext(rank=rank, device=torch.device('cpu'))
    comp = Composition(shards=(ShardSpec(path='0.2'), ShardSpec(path='0.0'), ShardSpec(path='')), tp=(TpPair(colwise='0.0', rowwise='0.2'), TpPair(colwise='1.0', rowwise='1.2')))
    model__ = nn.Sequential(nn.Sequential(_build_leaf(Leaf(kind=LeafKind.LINEAR, bias=False)), _build_leaf(Leaf(kind=LeafKind.GELU)), _build_leaf(Leaf(kind=LeafKind.LINEAR))), nn.Sequential(_build_leaf(Leaf(kind=LeafKind.LINEAR)), _build_leaf(Leaf(kind=LeafKind.GELU)), _build_leaf(Leaf(kind=LeafKind.LINEAR))), _build_leaf(Leaf(kind=LeafKind.CONV1D))).to(torch.float64)
    mesh = RankContext_mesh(ctx, (2, 2), ('shard', 'tp')) if (TpPair(colwise='0.0', rowwise='0.2'), TpPair(colwise='1.0', rowwise='1.2')) else mesh_for()
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    names = list(mesh.mesh_dim_names)
    split = {}
    for pair in (TpPair(colwise='0.0', rowwise='0.2'), TpPair(colwise='1.0', rowwise='1.2')):
        split[f'{pair.rowwise}.weight'] = Shard(1)
    for path_, module in model__.named_modules():
        for name_, p____ in list(module.named_parameters(recurse=False)):
            placements = [Replicate()] * mesh.ndim
            if f'{path_}.{name_}'.lstrip('.') in split:
                placements[names.index('tp')] = split[f'{path_}.{name_}'.lstrip('.')]
            dt = distribute_tensor(p____.detach(), mesh, placements)
            setattr(module, name_, nn.Parameter(dt, requires_grad=p____.requires_grad))
    contracts = _Contracts(model__, comp)
    gen = torch.Generator().manual_seed(0)
    lo = rank // 2
    step_ = []
    x_ = torch.randn(world_size, 2, generator=gen, dtype=torch.float64)
    y_ = torch.randn(world_size, 2, generator=gen, dtype=torch.float64)
    step_.append((x_[lo:lo + 1].to(torch.device('cpu')), y_[lo:lo + 1].to(torch.device('cpu'))))
    i, (x, y) = next(iter(enumerate(step_)))
    x = spmd_part(x, mesh)
    out = model__(x)
    obs = {'contracts': contracts.after_forward(None)}
    err = out.to(y.dtype) - spmd_part(y, mesh)
    (err * err).sum().div(y.numel()).backward()
    mine = out.detach()
    loss = F.mse_loss(mine.to_local().to(y.dtype), y)

def torch_frame(path: str, function: str) -> str | None:
    at = path.rfind('/torch/')
    inner = path[at + 1:]
    if at < 0 or '/fuzz/' in path or '-packages/' in inner or (function in ('<listcomp>', '<dictcomp>', '<setcomp>')):
        return None
    return f'{inner}:{function}'


if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import sys
    import time
    if os.environ.get("WORLD_SIZE") != "4":
        print("run it with: torchrun --nproc-per-node 4 " + sys.argv[0], file=sys.stderr)
        sys.exit(2)
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    import re
    import traceback
    try:
        attempt(rank, world_size)
    except BaseException as e:  # torch's CheckpointException is a BaseException
        text = traceback.format_exc()
        sys.stderr.write("".join(f"[rank{rank}]: {line}\n" for line in text.splitlines()))
        frames = [f for f in (torch_frame(p, f) for p, f in re.findall(r'File "([^"]+)", line \d+,? in (\S+)', text)) if f]
        found = f"{type(e).__module__}.{type(e).__qualname__}@{(frames or ['torch/?:?'])[-1]}"
        if found in ['builtins.RuntimeError@torch/_ops.py:__call__', 'builtins.RuntimeError@torch/distributed/tensor/_api.py:redistribute', 'builtins.ValueError@torch/distributed/tensor/_dtensor_spec.py:dim_map']:
            print(f"REPRODUCED exception:parity:builtins.RuntimeError@torch/distributed/tensor/_api.py:redistribute: rank {rank} raised {found}", flush=True)
            os._exit(1)
        print(f"FAIL (not the entry's failure): rank {rank} raised {found}", flush=True)
        os._exit(2)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store.add("repro-passed", 1)
    until = time.monotonic() + 60
    while store.add("repro-passed", 0) < world_size:
        if time.monotonic() > until:
            print(f"FAIL (not the entry's failure): rank {rank} finished, another rank did not", flush=True)
            os._exit(2)
        time.sleep(0.05)
    if rank == 0:
        print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
