#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=87e3671b7d30ca95 seconds=76.3
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: set_state_dict(broadcast_from_rank0=True) deadlocks when ranks other than 0
# pass an empty model state dict; upstream: https://github.com/pytorch/pytorch/issues/157781.
# Trains a model, saves its state with dcp.save into a fresh directory, loads it with dcp.load
# into a freshly built one and trains both on.
# Run: torchrun --nproc-per-node 2 THIS_FILE.py. Exit 1 (REPRODUCED): a rank was still running
# after 60 s (its stacks are printed); 0 (PASS): every rank ran through; 2: it failed another way.
import faulthandler
import os
import tempfile
import threading
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.checkpoint.state_dict import set_state_dict
from torch.distributed.fsdp import fully_shard


class App:  # a Stateful over the model and its optimizer, as DCP's recipe writes it

    def __init__(self, model, opt, get, put):
        self.model, self.opt, self.get, self.put = model, opt, get, put

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.model, self.opt, options=self.get)
        return {"model": model_sd, "optimizer": optim_sd}

    def load_state_dict(self, state_dict):
        model_sd, optim_sd = state_dict["model"], state_dict["optimizer"]
        set_state_dict(self.model, self.opt, model_state_dict=model_sd, optim_state_dict=optim_sd, options=self.put)


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
    path = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
    dist.broadcast_object_list(path)  # one fresh directory for every rank
    torch.manual_seed(0)
    model = compose(build())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, opt, data[0:1])
    state = {"app": App(model, opt, None, None)}
    dcp.save(state, checkpoint_id=path[0])
    torch.manual_seed(0 + 0x5EED)  # other weights: a load that does nothing shows
    target = compose(build())
    target_opt = torch.optim.SGD(target.parameters(), lr=0.1, momentum=0.9)
    template = StateDictOptions(full_state_dict=True, cpu_offload=True)
    load = StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=True)
    state = {"app": App(target, target_opt, template, load)}
    dcp.load(state, checkpoint_id=path[0])  # in place


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
