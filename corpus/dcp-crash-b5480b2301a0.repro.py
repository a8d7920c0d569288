#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=4da2f48d2fa30bb5 seconds=26.4
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: FSDP1 FULL_STATE_DICT with offload_to_cpu on CPU: state_dict() clones a freed
# buffer (SIGSEGV), optim_state_dict aliases the gathered states; upstream:
# https://github.com/pytorch/pytorch/issues/188989.
# Trains a model, saves its state with dcp.save into a fresh directory and loads it with dcp.load
# into a freshly built one: the case fails there (what would follow is not printed).
# Run: torchrun --nproc-per-node 2 THIS_FILE.py. Each rank runs main in a child process. Exit 1
# (REPRODUCED): a child died as in DIED (the signal, in that function of torch); 0 (PASS): every
# child ran through; 2: it failed another way.
import faulthandler
import os
import re
import signal
import subprocess
import sys
import tempfile
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, _patch_model_state_dict
from torch.distributed.checkpoint.state_dict import _patch_optimizer_state_dict
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, children, width, scale=False):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None

    def forward(self, x):
        y = x
        for child in self.children():
            y = child(y)
        y = y if self.scale is None else y * self.scale
        return y


def build():
    return Block([nn.ReLU()], 1, scale=True)


def compose_source(model):
    fully_shard(model, reshard_after_forward=False)
    return model


def compose_target(model):
    return FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True,
                device_id=torch.device("cpu"))


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)


DIED = {'signal SIGSEGV@torch/distributed/fsdp/_state_dict_utils.py:param_hook'}


def main(rank, world_size):
    gen = torch.Generator().manual_seed(0)  # the global batches, the same on every rank
    batches = (torch.randn(world_size, 1, generator=gen)[rank :][:1] for _ in range(2 * 2))
    data = [(x, next(batches)) for x in batches]  # (input, target) of each step
    path = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
    dist.broadcast_object_list(path)  # one fresh directory for every rank
    torch.manual_seed(0)
    model = compose_source(build())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    _patch_model_state_dict(model)
    _patch_optimizer_state_dict(model, optimizers=(opt,))
    train(model, opt, data[0:1])
    state = {"model": model, "optimizer": opt}
    dcp.save(state, checkpoint_id=path[0])
    torch.manual_seed(0 + 0x5EED)  # other weights: a load that does nothing shows
    target = compose_target(build())
    target_opt = torch.optim.SGD(target.parameters(), lr=0.01)
    load = StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=True)
    _patch_model_state_dict(target, options=load)
    _patch_optimizer_state_dict(target, optimizers=(target_opt,), options=load)
    state = {"model": target, "optimizer": target_opt}
    dcp.load(state, checkpoint_id=path[0])  # in place


if __name__ == "__main__":
    if os.environ.get("CHILD"):  # the rank's work, in a process that may die
        faulthandler.enable(all_threads=False)  # the stack, innermost call first
        dist.init_process_group("gloo")
        main(dist.get_rank(), dist.get_world_size())
        os._exit(0)
    rank = os.environ.get("RANK")
    env = {**os.environ, "CHILD": "1"}
    child = subprocess.run([sys.executable, __file__], env=env, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(child.stderr)
    if child.returncode < 0:  # killed by a signal
        stack = child.stderr.partition("most recent call first")[2]
        frames = re.findall(r'File "[^"]*/(torch/[^"-]+)", line \d+ in (?!<\w+comp>)(\S+)', stack)
        died = f"signal {signal.Signals(-child.returncode).name}@{':'.join(frames[0]) if frames else '?'}"
        said = "REPRODUCED" if died in DIED else "FAIL (another failure)"
        print(f"{said}: rank {rank}'s child died: {died}", flush=True)
        os._exit(1 if died in DIED else 2)
    if child.returncode:
        print(f"FAIL (another failure): rank {rank}'s child exited {child.returncode}", flush=True)
        os._exit(2)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store.set(f"finished {rank}", "1")
    store.wait([f"finished {r}" for r in range(int(os.environ["WORLD_SIZE"]))])
    print("PASS: no rank died", flush=True)
    os._exit(0)
