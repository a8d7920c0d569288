#!/usr/bin/env python3
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: set_optimizer_state_dict drops the saved optimizer state of a parameter frozen
# (requires_grad=False) when it is loaded: a parameter trained, then frozen, checkpointed and
# unfrozen after resuming restarts with fresh optimizer state (get_optimizer_state_dict saved it);
# upstream: https://github.com/pytorch/pytorch/issues/192202.
# Trains a model, saves its state with dcp.save into a fresh directory, loads it with dcp.load
# into a freshly built one and trains both on.
# Run: torchrun --nproc-per-node 2 THIS_FILE.py. Exit 1 (REPRODUCED): a value differs (named at
# run time); 0 (PASS): every rank ran through; 2: it failed another way.
import os
import re
import tempfile
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
import traceback
from functools import partial
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict


def build():
    return nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))


def optimizer(model, lr, momentum):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        for p in model.parameters():  # a plain model: data-parallel by hand
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
        opt.step()
        opt.zero_grad()


def gathered(t):
    return t.detach().clone()


def full(model, opt=None):
    """Every parameter and buffer (and its optimizer state, each group's lr), in full, by name."""
    out = {n: gathered(t) for n, t in [*model.named_parameters(), *model.named_buffers()]}
    for name, p in model.named_parameters() if opt is not None else ():
        out.update({f"{name} {k}": gathered(t) for k, t in opt.state.get(p, {}).items() if torch.is_tensor(t)})
    out.update({f"lr of group {i}": torch.tensor(g["lr"]) for i, g in enumerate(opt.param_groups if opt else ())})
    return out


def differs(what, got, want, exact):
    """The first value of ``want`` that ``got`` lacks or differs in: exactly, or within the
    tolerance policy for float32 (rtol=1e-05, atol=1e-06)."""
    for key, value in want.items():
        mine = got.get(key)
        if mine is None:
            return f"{key} is missing {what}"
        if not (torch.equal if exact else partial(torch.allclose, rtol=1e-05, atol=1e-06))(mine, value):
            return f"{key} {what}: {mine.flatten().tolist()[:4]} where {value.flatten().tolist()[:4]} was expected"
    return None


def main(rank, world_size):
    gen = torch.Generator().manual_seed(0)  # the global batches, the same on every rank
    draw = partial(torch.randn, world_size, 2, generator=gen)
    rows = slice(rank, rank + 1)
    data = [(draw()[rows], draw()[rows]) for _ in range(3)]
    path = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
    dist.broadcast_object_list(path)  # one fresh directory for every rank
    torch.manual_seed(0)
    model = build()
    opt = optimizer(model, 0.1, 0.9)
    train(model, opt, data[0:1])
    model.get_submodule("0").requires_grad_(False)  # before step 1
    train(model, opt, data[1:2])
    state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, opt)}
    dcp.save(state, checkpoint_id=path[0])
    saved = full(model, opt)
    torch.manual_seed(0 + 0x5EED)  # other weights: a load that does nothing shows
    target = build()
    target_opt = optimizer(target, 0.1 * 0.37, 0.5)  # other hyperparameters, which the load restores
    target.get_submodule("0").requires_grad_(False)  # as the source is by now
    state = {"model": get_model_state_dict(target), "optimizer": get_optimizer_state_dict(target, target_opt)}
    dcp.load(state, checkpoint_id=path[0])  # in place
    set_model_state_dict(target, state["model"])
    set_optimizer_state_dict(target, target_opt, state["optimizer"])
    said = differs("after the load", full(target, target_opt), saved, exact=True)
    train(model, opt, data[2:3])
    train(target, target_opt, data[2:3])
    said = said or differs("after training on", full(target), full(model), exact=False)
    return said


def torch_frame(path, function):  # fuzz.signature.torch_frame: a frame of torch's own code
    at = path.rfind("/torch/")
    inner = path[at + 1 :]
    if at < 0 or "/fuzz/" in path or "-packages/" in inner or function in ("<listcomp>", "<dictcomp>", "<setcomp>"):
        return None
    return f"{inner}:{function}"


if __name__ == "__main__":
    try:
        dist.init_process_group("gloo")
        if dist.get_world_size() != 2:
            raise SystemExit("run it with: torchrun --nproc-per-node 2 THIS_FILE.py")
        said = [None] * dist.get_world_size()  # what each rank found to differ
        dist.all_gather_object(said, main(dist.get_rank(), dist.get_world_size()))
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        text = traceback.format_exc()
        frames = [torch_frame(p, f) for p, f in re.findall(r'File "([^"]+)", line \d+, in (\S+)', text)]
        raised = f"{type(e).__module__}.{type(e).__qualname__}@{([f for f in frames if f] or ['?'])[-1]}"
        print(f"{text}FAIL (another failure): rank {os.environ.get('RANK')} raised {raised}", flush=True)
        os._exit(2)
    if any(said):
        print(f"REPRODUCED: {next(filter(None, said))}", flush=True)
        os._exit(1)
    if dist.get_rank() == 0:
        print("PASS: every loss, gradient and parameter agrees", flush=True)
    os._exit(0)
