#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=e9797d40ebc65ba7 seconds=54.1
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients
# across replicas; upstream: https://github.com/pytorch/pytorch/issues/154888.
# Trains a model, takes its state through FSDP1's state_dict_type, FSDP.optim_state_dict and
# FSDP.optim_state_dict_to_load, loads it into a freshly built one in memory and trains both on.
# Run: torchrun --nproc-per-node 2 THIS_FILE.py. Exit 1 (REPRODUCED): a value differs from the
# reference (named at run time); 0 (PASS): every rank ran through; 2: it failed another way.
import copy
import os
import torch
import torch.distributed as dist
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp import StateDictType


class Block(nn.Module):
    def __init__(self, children, width, scale=False, buffer=False):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None
        self.register_buffer('shift', 0.1 * torch.randn(width) if buffer else None)

    def forward(self, x):
        y = x
        for child in self.children():
            y = child(y)
        y = y if self.scale is None else y * self.scale
        y = y if self.shift is None else y + self.shift
        return y


def build():
    return Block([
        nn.Linear(4, 4),
        Block([nn.Linear(4, 4), nn.Tanh(), nn.LayerNorm(4)], 4, scale=True),
        nn.Linear(4, 4, bias=False),
    ], 4, buffer=True)


def compose_source(model):
    return FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True,
                device_id=torch.device("cpu"))


def compose_target(model):
    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("replicate", "shard"))
    return FSDP(model, sharding_strategy=ShardingStrategy.HYBRID_SHARD, use_orig_params=True,
                device_mesh=mesh, device_id=torch.device("cpu"))


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


RTOL, ATOL = 1e-05, 1e-06  # the tolerance policy for float32
REFERENCE = 'the source'


def full(t):
    return t.detach().clone()


def differs(got, want, exact=False):
    for key, e in want.items():
        if key not in got:
            return f"{key} is missing"
        a, e = got[key].double(), e.double()
        bad = a != e if exact else ~torch.isclose(a, e, rtol=RTOL, atol=ATOL)
        if bad.any():
            i = int(bad.flatten().nonzero()[0])
            factor = [f"; {f:.3g} times as much" for f in (2, 3, 4, 1 / 2, 1 / 3, 1 / 4) if torch.allclose(a, f * e)]
            return (f"{key}: {float(a.flatten()[i]):.9g} where {REFERENCE} has {float(e.flatten()[i]):.9g} "
                    f"({int(bad.sum())} of {bad.numel()} elements differ{''.join(factor[:1])})")
    return None


def snapshot(model, opt=None):  # every parameter and buffer, each group's lr, in full
    with FSDP.summon_full_params(model):  # whole, by plain name
        out = {n: full(t) for n, t in [*model.named_parameters(), *model.named_buffers()]}
    out.update({f"lr of group {i}": torch.tensor(g["lr"]) for i, g in enumerate(opt.param_groups if opt else ())})
    return out


def main(rank, world_size):
    gen = torch.Generator().manual_seed(32)  # the global batches, the same on every rank
    batches = (torch.randn(world_size * 2, 4, generator=gen)[rank * 2 :][:2] for _ in range(2 * 3))
    data = [(x, next(batches)) for x in batches]  # (input, target) of each step
    torch.manual_seed(32)
    model = compose_source(build())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, opt, data[0:2])
    FSDP.set_state_dict_type(model, StateDictType.FULL_STATE_DICT)
    model_sd, optim_sd = model.state_dict(), FSDP.optim_state_dict(model, opt)
    model_sd, optim_sd = copy.deepcopy((model_sd, optim_sd))  # as a checkpoint read back would be
    saved = snapshot(model, opt)
    torch.manual_seed(32 + 0x5EED)  # other weights: a load that does nothing shows
    target = compose_target(build())
    target_opt = torch.optim.SGD(target.parameters(), lr=0.1 * 0.37, momentum=0.5)
    FSDP.set_state_dict_type(target, StateDictType.FULL_STATE_DICT)
    target.load_state_dict(model_sd)
    target_opt.load_state_dict(FSDP.optim_state_dict_to_load(target, target_opt, optim_sd))
    said = differs(snapshot(target, target_opt), saved, exact=True)  # right after the load
    train(model, opt, data[2:3])
    train(target, target_opt, data[2:3])
    return said or differs(snapshot(target), snapshot(model))  # after training on


if __name__ == "__main__":
    try:
        dist.init_process_group("gloo")
        said = [None] * dist.get_world_size()  # what each rank found to differ first
        dist.all_gather_object(said, main(dist.get_rank(), dist.get_world_size()))
    except BaseException:
        traceback.print_exc()
        os._exit(2)  # it failed another way
    said = next(filter(None, said), None)
    if dist.get_rank() == 0:
        print(f"REPRODUCED: {said}" if said else "PASS: every loss, gradient and parameter agrees", flush=True)
    os._exit(1 if said else 0)
