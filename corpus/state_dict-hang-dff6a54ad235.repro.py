#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=905c6279a12f4664 seconds=69.6
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: set_state_dict(broadcast_from_rank0=True) deadlocks when ranks other than 0
# pass an empty model state dict; upstream: https://github.com/pytorch/pytorch/issues/157781.
# Trains a model, takes its state through get_state_dict / set_state_dict and loads it into a
# freshly built one in memory: the case fails there (what would follow is not printed).
# Run: torchrun --nproc-per-node 2 THIS_FILE.py. Exit 1 (REPRODUCED): a rank was still running
# after 60 s (its stacks are printed); 0 (PASS): every rank ran through; 2: it failed another way.
import copy
import faulthandler
import os
import threading
import torch
import torch.distributed as dist
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.checkpoint.state_dict import set_state_dict
from torch.distributed.fsdp import fully_shard


def build():
    return nn.Sequential(nn.Linear(2, 2))


def compose(model):
    fully_shard(model, reshard_after_forward=True)
    return model


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def main(rank, world_size):
    gen = torch.Generator().manual_seed(0)  # the global batches, the same on every rank
    batches = (torch.randn(world_size, 2, generator=gen)[rank :][:1] for _ in range(2 * 1))
    data = [(x, next(batches)) for x in batches]  # (input, target) of each step
    torch.manual_seed(0)
    model = compose(build())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, opt, data[0:1])
    save = StateDictOptions(full_state_dict=True)
    model_sd, optim_sd = get_state_dict(model, opt, options=save)
    model_sd, optim_sd = copy.deepcopy((model_sd, optim_sd))  # as a checkpoint read back would be
    torch.manual_seed(0 + 0x5EED)  # other weights: a load that does nothing shows
    target = compose(build())
    target_opt = torch.optim.SGD(target.parameters(), lr=0.1, momentum=0.9)
    if rank != 0:
        model_sd, optim_sd = {}, {}  # broadcast_from_rank0: rank 0 alone holds the state
    load = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_state_dict(target, target_opt, model_state_dict=model_sd, optim_state_dict=optim_sd, options=load)


if __name__ == "__main__":
    def watchdog():  # still running: every thread's stack, exit 1
        print(f"REPRODUCED: rank {os.environ.get('RANK')} still running after 60 s", flush=True)
        faulthandler.dump_traceback()
        os._exit(1)

    timer = threading.Timer(60, watchdog)
    timer.start()
    try:
        dist.init_process_group("gloo")
        main(dist.get_rank(), dist.get_world_size())
        timer.cancel()
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        store.set(f"finished {dist.get_rank()}", "1")
        store.wait([f"finished {r}" for r in range(dist.get_world_size())])
    except BaseException:
        traceback.print_exc()
        os._exit(2)  # it failed another way
    print("PASS: every rank finished", flush=True)
    os._exit(0)
