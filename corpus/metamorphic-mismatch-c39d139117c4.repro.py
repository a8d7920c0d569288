#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=c33cc422d730720c seconds=17.6
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: FSDP1 HYBRID_SHARD with a shard dimension of size 1 never averages gradients
# across replicas; upstream: https://github.com/pytorch/pytorch/issues/154888.
# Trains the model under one composition and under a variant that must not change the numerics.
# Run: torchrun --nproc-per-node 2 THIS_FILE.py. Exit 1 (REPRODUCED): a value differs from the
# reference (named at run time); 0 (PASS): every rank ran through; 2: it failed another way.
import os
import torch
import torch.distributed as dist
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


def build():
    return nn.Sequential(nn.Linear(2, 2, bias=False))


def compose(model):
    fully_shard(model, reshard_after_forward=True)
    return model


def compose_variant(model):
    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("replicate", "shard"))
    return FSDP(model, sharding_strategy=ShardingStrategy.HYBRID_SHARD, use_orig_params=True,
                device_mesh=mesh, device_id=torch.device("cpu"))


NAMES = ['0.weight']  # the plain model's parameters


def named(model):  # by plain name, off its module: FSDP1 leaves some out of named_parameters (#85831)
    modules = {".".join(c for c in n.split(".") if c != "_fsdp_wrapped_module"): m for n, m in model.named_modules()}
    return [(n, getattr(modules[n.rpartition(".")[0]], n.rpartition(".")[2])) for n in NAMES]


RTOL, ATOL = 1e-05, 1e-06  # the tolerance policy for float32
REFERENCE = 'the run with the variant composition'


def full(t):
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


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


def train(rank, world_size, compose):
    torch.manual_seed(1)  # every rank builds the same weights
    model = compose(build())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    seen = {}  # every loss, gradient and parameter after the step, by name, in order
    x, y = (torch.randn(world_size, 2, generator=gen)[rank :][:1] for _ in range(2))
    loss = F.mse_loss(model(x), y)
    loss.backward()
    seen["loss at step 0"] = loss.detach()
    with FSDP.summon_full_params(model, with_grads=True):  # whole, not this rank's shard
        for n, p in named(model):  # no gradient counts as zeros
            seen[f"gradient of {n} at step 0"] = full(p.grad) if p.grad is not None else torch.zeros(p.shape)
    opt.step()
    opt.zero_grad()
    with FSDP.summon_full_params(model):  # whole, not this rank's shard
        seen.update({f"{n} after step 0": full(p) for n, p in named(model)})
    return seen


def main(rank, world_size):  # what differs first, step by step: losses, gradients, parameters
    return differs(train(rank, world_size, compose), train(rank, world_size, compose_variant))


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
