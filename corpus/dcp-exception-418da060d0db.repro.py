#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=ddc9107588b830c3 seconds=37.2
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: a frozen fully_shard unit without resharding under a replicate'd root is never
# resharded: a leaf unfrozen later never trains (KeyError in get_optimizer_state_dict); upstream:
# none found.
# Trains a model, saves its state with dcp.save into a fresh directory, loads it with dcp.load
# into a freshly built one and trains both on.
# Run: torchrun --nproc-per-node 4 THIS_FILE.py. Exit 1 (REPRODUCED): a rank raised the exception
# in RAISED (its type, in that function of torch); 0 (PASS): every rank ran through; 2: it failed
# another way.
import os
import re
import tempfile
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed._composable import replicate
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class Conv(nn.Conv1d):
    """A one-tap Conv1d over a (batch, width) activation, as a length-1 sequence."""

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)


class Scalars:  # a Stateful holding Python scalars

    def __init__(self, values):
        self.values = dict(values)

    def state_dict(self):
        return dict(self.values)

    def load_state_dict(self, state_dict):
        self.values = dict(state_dict)


class Counter:  # a Stateful whose state_dict and load_state_dict all-reduce on every rank

    def __init__(self, value):
        self.value = torch.tensor([value], dtype=torch.float64)

    def state_dict(self):
        total = self.value.clone()
        dist.all_reduce(total)
        return {"value": self.value, "total": total}

    def load_state_dict(self, state_dict):
        self.value = state_dict["value"]
        dist.all_reduce(self.value.clone())


def build():
    return nn.Sequential(Conv(1, 1, 1, bias=False).requires_grad_(False), Conv(1, 1, 1, bias=False))


def compose_source(model):
    mesh = init_device_mesh("cpu", (4, 1), mesh_dim_names=("replicate", "shard"))
    fully_shard(model.get_submodule("0"), mesh=mesh, reshard_after_forward=False)
    replicate(model)
    return model


def compose_target(model):
    fully_shard(model, reshard_after_forward=False)
    return model


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)


RAISED = {'KeyError@torch/distributed/checkpoint/state_dict.py:_get_optim_state_dict'}


def main(rank, world_size):
    gen = torch.Generator().manual_seed(0)  # the global batches, the same on every rank
    batches = (torch.randn(world_size, 1, generator=gen)[rank :][:1] for _ in range(2 * 2))
    data = [(x, next(batches)) for x in batches]  # (input, target) of each step
    path = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
    dist.broadcast_object_list(path)  # one fresh directory for every rank
    scalars = {  # what the scalars entry saves
        'step': 1, 'loss': 0.0, 'tag': 'case-0', 'done': False, 'history': [0.0, -1.5, 1e-300],
    }
    torch.manual_seed(0)
    model = compose_source(build())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
    train(model, opt, data[0:1])
    state = {
        "model": model,  # its own state_dict / load_state_dict
        "optimizer": get_optimizer_state_dict(model, opt), "scalars": Scalars(scalars), "counter": Counter(0.5),
    }
    dcp.save(state, checkpoint_id=path[0])
    torch.manual_seed(0 + 0x5EED)  # other weights: a load that does nothing shows
    target = compose_target(build())
    target_opt = torch.optim.SGD(target.parameters(), lr=0.01, foreach=False)
    state = {
        "model": target,  # its own state_dict / load_state_dict
        "optimizer": get_optimizer_state_dict(target, target_opt),
        "scalars": Scalars({k: type(v)() for k, v in scalars.items()}), "counter": Counter(0.0),
    }
    dcp.load(state, checkpoint_id=path[0])  # in place
    set_optimizer_state_dict(target, target_opt, state["optimizer"])
    train(model, opt, data[1:2])
    train(target, target_opt, data[1:2])


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
