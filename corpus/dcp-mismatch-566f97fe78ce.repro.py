#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=f8717496fe4a5c07 seconds=27.0
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: set_optimizer_state_dict drops the saved optimizer state of a parameter frozen
# (requires_grad=False) when it is loaded: a parameter trained, then frozen, checkpointed and
# unfrozen after resuming restarts with fresh optimizer state (get_optimizer_state_dict saved it);
# upstream: https://github.com/pytorch/pytorch/issues/192202.
# Trains a model, saves its state with dcp.save into a fresh directory, loads it with dcp.load
# into a freshly built one and trains both on.
# Run: torchrun --nproc-per-node 2 THIS_FILE.py. Exit 1 (REPRODUCED): a value differs from the
# reference (named at run time); 0 (PASS): every rank ran through; 2: it failed another way.
import os
import tempfile
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict


def build():
    return nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        for p in [p for p in model.parameters() if p.grad is not None]:
            dist.all_reduce(p.grad)  # a plain model, data-parallel by hand: gradients averaged
            p.grad /= dist.get_world_size()
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


def snapshot(model, opt=None):  # every parameter and buffer (its optimizer state, each group's lr), in full
    out = {n: full(t) for n, t in [*model.named_parameters(), *model.named_buffers()]}
    for name, p in model.named_parameters() if opt is not None else ():
        out.update({f"{name} {k}": full(t) for k, t in opt.state.get(p, {}).items() if torch.is_tensor(t)})
    out.update({f"lr of group {i}": torch.tensor(g["lr"]) for i, g in enumerate(opt.param_groups if opt else ())})
    return out


def main(rank, world_size):
    gen = torch.Generator().manual_seed(0)  # the global batches, the same on every rank
    batches = (torch.randn(world_size, 2, generator=gen)[rank :][:1] for _ in range(2 * 3))
    data = [(x, next(batches)) for x in batches]  # (input, target) of each step
    path = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
    dist.broadcast_object_list(path)  # one fresh directory for every rank
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, opt, data[0:1])
    model.get_submodule("0").requires_grad_(False)  # before step 1
    train(model, opt, data[1:2])
    state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, opt)}
    dcp.save(state, checkpoint_id=path[0])
    saved = snapshot(model, opt)
    torch.manual_seed(0 + 0x5EED)  # other weights: a load that does nothing shows
    target = build()
    target_opt = torch.optim.SGD(target.parameters(), lr=0.1 * 0.37, momentum=0.5)
    target.get_submodule("0").requires_grad_(False)  # as the source is by now
    state = {"model": get_model_state_dict(target), "optimizer": get_optimizer_state_dict(target, target_opt)}
    dcp.load(state, checkpoint_id=path[0])  # in place
    set_model_state_dict(target, state["model"])
    set_optimizer_state_dict(target, target_opt, state["optimizer"])
    said = differs(snapshot(target, target_opt), saved, exact=True)  # right after the load
    train(model, opt, data[2:3])
    train(target, target_opt, data[2:3])
    said = said or differs(snapshot(target), snapshot(model))  # after training on
    return said


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
