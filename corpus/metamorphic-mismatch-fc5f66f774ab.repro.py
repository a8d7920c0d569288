#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=67f5178c0d26f153 sources=55a8b7c3a20f8188 seconds=24.4
# Known torch bug: FSDP1 NO_SHARD, a unit all frozen at wrapping: a leaf unfrozen later never
# trains; upstream: https://github.com/pytorch/pytorch/issues/85831.
# Trains the model under one composition and under a variant that must not change the numerics,
# and names the first loss, gradient or parameter that differs (the tolerance policy below).
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: rank 0 prints REPRODUCED and every rank exits 1
# while the bug is there; rank 0 prints PASS and they exit 0 once it is gone; a rank exits 2 where
# the case fails another way.
# Outside torchrun --nproc-per-node 2 the script prints how to run it and exits 2.
# Printed from the case by shardfuzz (python -m fuzz repro).

import os
import sys
import torch
import torch.distributed as dist
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.tensor import DTensor


class Block(nn.Sequential):  # a class of its own, for FSDP1's wrap policy
    pass


class Conv(nn.Conv1d):
    """A one-tap Conv1d over a (batch, width) activation, as a length-1 sequence."""

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)


def build():
    return Block(Conv(1, 1, 1, bias=False).requires_grad_(False), Block(Conv(1, 1, 1, bias=False)))


def compose(model):
    fully_shard(model, reshard_after_forward=False)
    return model


def compose_variant(model):
    return FSDP(model, sharding_strategy=ShardingStrategy.NO_SHARD, use_orig_params=True,
                auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"))


NAMES = ['0.weight', '1.0.weight']  # the plain model's parameters


def named(model):
    """Every parameter by its plain name (NAMES), read off its module through FSDP1's wrappers,
    which leave some out of named_parameters() (pytorch/pytorch#85831)."""
    modules = {".".join(c for c in n.split(".") if c != "_fsdp_wrapped_module"): m for n, m in model.named_modules()}
    return [(n, getattr(modules[n.rpartition(".")[0]], n.rpartition(".")[2])) for n in NAMES]


def full(t):  # whole: gathered where fully_shard shards it
    return None if t is None else (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def train(rank, world_size, compose):
    torch.manual_seed(0)  # every rank builds the same weights
    model = compose(build())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)
    seen = {}  # every loss, gradient and parameter after the step, by name, in order
    later = {"0": [q for n, q in named(model) if n.rpartition(".")[0] == "0"]}  # frozen now, unfrozen later
    for step in range(2):
        if step == 1:
            for p in later["0"]:
                p.requires_grad_(True)
        for micro in range(1):
            x, y = (torch.randn(world_size, 1, generator=gen)[rank :][:1] for _ in range(2))
            loss = F.mse_loss(model(x), y)
            loss.backward()
            seen[f"loss at step {step}, microbatch {micro}"] = loss.detach()
        seen.update({f"gradient of {n} at step {step}": full(p.grad) for n, p in named(model)})
        opt.step()
        opt.zero_grad(set_to_none=False)
        seen.update({f"{n} after step {step}": full(p) for n, p in named(model)})
    return seen


RTOL, ATOL = 1e-05, 1e-06  # the tolerance policy for float32
REFERENCE = 'the run with the variant composition'


def differences(got, want, rank):
    """What differs from REFERENCE beyond the tolerance, first to last (no gradient counts as zeros)."""
    for what, e in want.items():
        a = got[what]
        if a is None and e is None:
            continue
        a = (torch.zeros_like(e) if a is None else a).double()
        e = (torch.zeros_like(a) if e is None else e).double()
        bad = ~torch.isclose(a, e, rtol=RTOL, atol=ATOL)
        if bad.any():
            i = int(bad.flatten().nonzero()[0])
            ratio = [f"; {f:.4g} times as much" for f in (2, 3, 4, 1 / 2, 1 / 3, 1 / 4) if torch.allclose(a, f * e)]
            yield (f"rank {rank}'s {what}: {float(a.flatten()[i]):.9g} where {REFERENCE} has "
                   f"{float(e.flatten()[i]):.9g} ({int(bad.sum())} of {bad.numel()} elements outside "
                   f"rtol={RTOL}, atol={ATOL}{''.join(ratio[:1])})")


if __name__ == "__main__":
    if os.environ.get("WORLD_SIZE") != "2":
        print("run it with: torchrun --nproc-per-node 2 " + sys.argv[0], file=sys.stderr)
        sys.exit(2)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    try:
        got, want = train(rank, world_size, compose), train(rank, world_size, compose_variant)
        verdicts = [None] * world_size
        dist.all_gather_object(verdicts, next(differences(got, want, rank), None))
    except Exception as e:
        traceback.print_exc()
        print(f"FAIL (the case failed another way): rank {rank} raised {type(e).__name__}: {e}", flush=True)
        os._exit(2)
    said = next(filter(None, verdicts), None)
    if rank == 0:
        print(f"REPRODUCED: {said}" if said else "PASS: every loss, gradient and parameter agrees", flush=True)
    os._exit(1 if said else 0)
