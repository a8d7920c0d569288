#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=627b92f9c75a2fc3 seconds=45.1
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: FSDP1 FULL_STATE_DICT with offload_to_cpu on CPU: state_dict() clones a freed
# buffer (SIGSEGV), optim_state_dict aliases the gathered states; upstream:
# https://github.com/pytorch/pytorch/issues/188989.
# Trains a model and takes its state through FSDP1's state_dict_type, FSDP.optim_state_dict and
# FSDP.optim_state_dict_to_load: the case fails there (what would follow is not printed).
# Run: torchrun --nproc-per-node 2 THIS_FILE.py. Each rank runs main in a child process. Exit 1
# (REPRODUCED): a child died as in DIED (the signal, in that function of torch); 0 (PASS): every
# child ran through; 2: it failed another way.
import copy
import faulthandler
import os
import re
import signal
import subprocess
import sys
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy


class Conv(nn.Conv1d):
    """A one-tap Conv1d over a (batch, width) activation, as a length-1 sequence."""

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)


def build():
    return nn.Sequential(Conv(1, 1, 1, bias=False), Conv(1, 1, 1, bias=False).requires_grad_(False))


def compose(model):
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
    torch.manual_seed(0)
    model = compose(build())
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
    train(model, opt, data[0:1])
    FSDP.set_state_dict_type(
        model,
        StateDictType.FULL_STATE_DICT,
        FullStateDictConfig(offload_to_cpu=True),
        FullOptimStateDictConfig(offload_to_cpu=True),
    )
    model_sd, optim_sd = model.state_dict(), FSDP.optim_state_dict(model, opt)
    model_sd, optim_sd = copy.deepcopy((model_sd, optim_sd))  # as a checkpoint read back would be


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
