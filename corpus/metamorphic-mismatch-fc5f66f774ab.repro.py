#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=67f5178c0d26f153 sources=160bdd6cfe3e23e0 seconds=34.3
# Known torch bug: FSDP1 NO_SHARD, a unit all frozen at wrapping: a leaf unfrozen later never
# trains; upstream: https://github.com/pytorch/pytorch/issues/85831.
# Trains the model under one composition and under a variant that must not change the numerics,
# and names the first loss, gradient or parameter that differs (the tolerance policy below).
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: rank 0 prints REPRODUCED and every rank exits 1
# while the bug is there; rank 0 prints PASS and they exit 0 once it is gone; a rank exits 2 where
# the script cannot run (not under torchrun, another world size) or the case fails another way.

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


RTOL, ATOL = 1e-05, 1e-06  # the tolerance policy for float32
REFERENCE = 'the run with the variant composition'


class Block(nn.Module):
    def __init__(self, children, width):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)

    def forward(self, x):
        y = x
        for child in self.children():
            y = child(y)
        return y


class Conv(nn.Conv1d):
    """A one-tap Conv1d over a (batch, width) activation, as a length-1 sequence."""

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)


def build():
    return Block([Conv(1, 1, 1, bias=False).requires_grad_(False), Block([Conv(1, 1, 1, bias=False)], 1)], 1)


def compose(model):
    fully_shard(model, reshard_after_forward=False)
    return model


def compose_variant(model):
    return FSDP(
        model,
        sharding_strategy=ShardingStrategy.NO_SHARD,
        use_orig_params=True,
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        device_id=torch.device("cpu"),
    )


NAMES = ['0.weight', '1.0.weight']  # the plain model's parameters


def named(model):
    """Every parameter by its plain name (NAMES), read off its module through FSDP1's wrappers,
    which leave some out of named_parameters() (pytorch/pytorch#85831)."""
    modules = {".".join(c for c in n.split(".") if c != "_fsdp_wrapped_module"): m for n, m in model.named_modules()}
    return {n: getattr(modules[n.rpartition(".")[0]], n.rpartition(".")[2]) for n in NAMES}


def full(t):  # gathered where fully_shard shards it
    return None if t is None else (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def train(model, rank, world_size, composed):
    # frozen now, unfrozen later: the optimizer holds them
    later = {"0": [q for n, q in named(model).items() if n.rpartition(".")[0] == "0"]}
    held = [q for ps in later.values() for q in ps]
    params = [p for p in model.parameters() if p.requires_grad or any(p is q for q in held)]
    opt = torch.optim.SGD(params, lr=0.01)
    gen = torch.Generator().manual_seed(0)
    seen = []
    for step in range(2):
        if step == 1:
            for p in later["0"]:
                p.requires_grad_(True)
        losses = []
        for _ in range(1):
            x = torch.randn(world_size * 1, 1, generator=gen)[rank * 1 :][:1]
            y = torch.randn(world_size * 1, 1, generator=gen)[rank * 1 :][:1]
            loss = F.mse_loss(model(x), y)
            loss.backward()
            losses.append(loss.item())
        grads = {n: full(p.grad) for n, p in named(model).items()}
        opt.step()
        opt.zero_grad(set_to_none=False)
        seen.append((losses, grads, {n: full(p) for n, p in named(model).items()}))
    return seen


def run(rank, world_size, compose=None):
    torch.manual_seed(0)  # every rank builds the same weights
    model = build()
    if compose is not None:
        model = compose(model)
    return train(model, rank, world_size, composed=True)


def differs(what, got, want):
    """Why ``got`` is not ``want`` within the tolerance, or None (no gradient counts as zeros)."""
    if got is None and want is None:
        return None
    got = (torch.zeros_like(want) if got is None else got).double()
    want = (torch.zeros_like(got) if want is None else want).double()
    over = (got - want).abs() - (ATOL + RTOL * want.abs())
    if not bool((over > 0).any()):
        return None
    i = int(over.flatten().argmax())
    said = f"{what}: {float(got.flatten()[i]):.9g} where {REFERENCE} has {float(want.flatten()[i]):.9g}"
    said += f" (element {i}; {int((over > 0).sum())} of {over.numel()} outside rtol={RTOL}, atol={ATOL})"
    factors = [f for f in (2, 3, 4, 1 / 2, 1 / 3, 1 / 4) if torch.allclose(got, f * want, rtol=1e-4, atol=ATOL)]
    return said + "".join(f": {f:.4g} times {REFERENCE}'s" for f in factors[:1])


def compared(got, want, losses):
    """(what, value, reference) in the order training computes them: every rank's losses, then each
    parameter's gradient, then each parameter after the step, step by step."""
    for step, ((_, got_grads, got_params), (_, grads, params)) in enumerate(zip(got, want, strict=True)):
        for rank, (mine, theirs) in enumerate(losses):
            for micro, (a, e) in enumerate(zip(mine[step], theirs[step], strict=True)):
                yield f"loss of rank {rank} at step {step}, microbatch {micro}", torch.tensor([a]), torch.tensor([e])
        yield from ((f"gradient of {n} at step {step}", got_grads[n], grads[n]) for n in grads)
        yield from ((f"{n} after step {step}", got_params[n], params[n]) for n in params)


def main():
    import os
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import sys
    import traceback
    if os.environ.get("WORLD_SIZE") != "2":
        print("run it with: torchrun --nproc-per-node 2 " + sys.argv[0], file=sys.stderr)
        sys.exit(2)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    try:
        got, want = run(rank, world_size, compose), run(rank, world_size, compose_variant)
        losses = [None] * world_size
        dist.all_gather_object(losses, ([s[0] for s in got], [s[0] for s in want]))
        verdict = [next(filter(None, (differs(*c) for c in compared(got, want, losses))), None)]
        dist.broadcast_object_list(verdict, src=0)
    except Exception as e:
        traceback.print_exc()
        print(f"FAIL (the case failed another way): rank {rank} raised {type(e).__name__}: {e}", flush=True)
        os._exit(2)
    if rank == 0:
        print(f"REPRODUCED: {verdict[0]}" if verdict[0] else "PASS: every loss, gradient and parameter agrees")
    sys.stdout.flush()
    os._exit(1 if verdict[0] else 0)


if __name__ == "__main__":
    main()
