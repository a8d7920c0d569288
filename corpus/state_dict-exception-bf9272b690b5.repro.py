#!/usr/bin/env python3
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: fully_shard with an int reshard_after_forward and Shard(1) placements:
# IndexError in foreach_all_gather_copy_out, or (a dim-1 size the post-forward mesh splits
# unevenly) as_strided out of bounds in to_sharded_post_forward; upstream: none found.
# Trains a model, moves its state into a freshly built one in memory through
# get/set_model_state_dict and get/set_optimizer_state_dict, and trains both on.
# Run: torchrun --nproc-per-node 4 THIS_FILE.py. Exit 1 (REPRODUCED): a rank raised the exception
# named below in the same torch function; 0 (PASS): every rank ran through; 2: it failed another
# way.
import copy
import os
import re
import torch
import torch.distributed as dist
import torch.nn.functional as F
import traceback
from functools import partial
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard


def build():
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))


def on_dim1(p):  # Shard(1) where it splits evenly, else Shard(0) (uneven sharding: dim 0 only)
    return Shard(1) if p.ndim > 1 and p.shape[1] % 4 == 0 else None


def compose_source(model):
    fully_shard(model.get_submodule("1"), reshard_after_forward=2, shard_placement_fn=on_dim1)
    fully_shard(model)
    return model


def compose_target(model):
    fully_shard(model.get_submodule("1"), reshard_after_forward=2, shard_placement_fn=on_dim1)
    fully_shard(model)
    return model


def optimizer(model, lr, momentum):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def main(rank, world_size):
    gen = torch.Generator().manual_seed(0)  # the global batches, the same on every rank
    draw = partial(torch.randn, world_size, 4, generator=gen)
    rows = slice(rank, rank + 1)
    data = [(draw()[rows], draw()[rows]) for _ in range(1)]
    torch.manual_seed(0)
    model = compose_source(build())
    opt = optimizer(model, 0.1, 0.9)
    train(model, opt, data[0:1])
    model_sd = get_model_state_dict(model)
    optim_sd = get_optimizer_state_dict(model, opt)
    model_sd, optim_sd = copy.deepcopy((model_sd, optim_sd))  # as a checkpoint read back would be
    torch.manual_seed(0 + 0x5EED)  # other weights: a load that does nothing shows
    target = compose_target(build())
    target_opt = optimizer(target, 0.1 * 0.37, 0.5)  # other hyperparameters, which the load restores
    set_model_state_dict(target, model_sd)
    set_optimizer_state_dict(target, target_opt, optim_sd)


RAISED = {  # the entry's exception: its type, raised in this function of torch
    'builtins.IndexError@torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:foreach_all_gather_copy_out',
}


def torch_frame(path, function):  # fuzz.signature.torch_frame: a frame of torch's own code
    at = path.rfind("/torch/")
    inner = path[at + 1 :]
    if at < 0 or "/fuzz/" in path or "-packages/" in inner or function in ("<listcomp>", "<dictcomp>", "<setcomp>"):
        return None
    return f"{inner}:{function}"


if __name__ == "__main__":
    try:
        dist.init_process_group("gloo")
        if dist.get_world_size() != 4:
            raise SystemExit("run it with: torchrun --nproc-per-node 4 THIS_FILE.py")
        main(dist.get_rank(), dist.get_world_size())
        dist.barrier()  # every rank ran through
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        text = traceback.format_exc()
        frames = [torch_frame(p, f) for p, f in re.findall(r'File "([^"]+)", line \d+, in (\S+)', text)]
        raised = f"{type(e).__module__}.{type(e).__qualname__}@{([f for f in frames if f] or ['?'])[-1]}"
        verdict = "REPRODUCED" if raised in RAISED else "FAIL (another failure)"
        print(f"{text}{verdict}: rank {os.environ.get('RANK')} raised {raised}", flush=True)
        os._exit(1 if raised in RAISED else 2)
    if dist.get_rank() == 0:
        print("PASS: no rank raised", flush=True)
    os._exit(0)
