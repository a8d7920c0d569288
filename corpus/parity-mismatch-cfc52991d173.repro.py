#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=c531a05db6eeabd5 seconds=10.8
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: HSDP with set_requires_all_reduce(False): a unit unused on the last microbatch
# loses its accumulated gradient; upstream: none found.
# Trains the composed model and, as the reference, the same plain model on the same data with its
# gradients all-reduced and averaged.
# Run: torchrun --nproc-per-node 2 THIS_FILE.py. Exit 1 (REPRODUCED): a value differs from the
# reference (named at run time); 0 (PASS): every rank ran through; 2: it failed another way.
import os
import torch
import torch.distributed as dist
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


SKIPPED = []  # the modules left out of forward now


class Block(nn.Module):
    def __init__(self, children, width):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)

    def forward(self, x):
        y = x
        for child in self.children():
            y = y if child in SKIPPED else child(y)
        return y


def build():
    return Block([nn.Linear(4, 4), nn.Linear(4, 4)], 4)


def compose(model):
    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("replicate", "shard"))
    fully_shard(model.get_submodule("0"), mesh=mesh)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    return model


RTOL, ATOL = 1e-05, 1e-06  # the tolerance policy for float32
REFERENCE = 'the plain model with averaged gradients'


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


SKIPS = {(0, 1): ['0']}  # (step, microbatch): the modules left out of forward then


def train(rank, world_size, compose):
    torch.manual_seed(0)  # every rank builds the same weights
    model = build() if compose is None else compose(build())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    seen = {}  # every loss, gradient and parameter after the step, by name, in order
    for step in range(2):
        for micro in range(2):
            x, y = (torch.randn(world_size * 2, 4, generator=gen)[rank * 2 :][:2] for _ in range(2))
            SKIPPED[:] = [model.get_submodule(p) for p in SKIPS.get((step, micro), [])]
            if compose is not None:
                model.set_requires_all_reduce(micro == 1)
            loss = F.mse_loss(model(x), y)
            loss.backward()
            seen[f"loss at step {step}, microbatch {micro}"] = loss.detach()
        for p in [p for p in model.parameters() if compose is None and p.grad is not None]:
            dist.all_reduce(p.grad)  # a plain model, data-parallel by hand: gradients averaged
            p.grad /= dist.get_world_size()
        for n, p in model.named_parameters():  # no gradient counts as zeros
            seen[f"gradient of {n} at step {step}"] = full(p.grad) if p.grad is not None else torch.zeros(p.shape)
        opt.step()
        opt.zero_grad()
        seen.update({f"{n} after step {step}": full(p) for n, p in model.named_parameters()})
    return seen


def main(rank, world_size):  # what differs first, step by step: losses, gradients, parameters
    return differs(train(rank, world_size, compose), train(rank, world_size, None))


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
