#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=4b45c2168641062c seconds=35.7
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: FSDP1 NO_SHARD with an auto-wrapped unit of frozen parameters: state_dict()
# after training raises 'FSDP assumes ... is in the state_dict'; upstream:
# https://github.com/pytorch/pytorch/issues/85831.
# Trains a model and saves its state with dcp.save into a fresh directory: the case fails there
# (what would follow is not printed).
# Run: torchrun --nproc-per-node 2 THIS_FILE.py. Exit 1 (REPRODUCED): a rank raised the exception
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
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp import StateDictType
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


class Block(nn.Module):
    def __init__(self, children, width, buffer=False, residual=False):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.register_buffer('shift', 0.1 * torch.randn(width) if buffer else None)
        self.residual = residual

    def forward(self, x):
        y = x
        for child in self.children():
            y = child(y)
        y = y if self.shift is None else y + self.shift
        return x + y if self.residual else y


class Conv(nn.Conv1d):
    """A one-tap Conv1d over a (batch, width) activation, as a length-1 sequence."""

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)


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


ORDERS = [  # each rank's order of the top-level dict
    ["model", "counter", "optimizer"],
    ["optimizer", "counter", "model"],
]


def build():
    return Block([
        Conv(4, 4, 1).requires_grad_(False),
        Block([
            Conv(4, 4, 1, bias=False),
            Block([
                Conv(4, 4, 1, bias=False),
                Conv(4, 4, 1, bias=False),
                nn.LayerNorm(4, bias=False),
            ], 4, residual=True),
        ], 4, buffer=True),
    ], 4).to(torch.float64)


def compose_source(model):
    return FSDP(model, sharding_strategy=ShardingStrategy.NO_SHARD, use_orig_params=True,
                auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"))


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)


RAISED = {'KeyError@torch/distributed/fsdp/_optim_utils.py:_unflatten_param_groups'}


def main(rank, world_size):
    gen = torch.Generator().manual_seed(501)  # the global batches, the same on every rank
    batches = (torch.randn(world_size, 4, generator=gen, dtype=torch.float64)[0 :][:1] for _ in range(2 * 5))
    data = [(x, next(batches)) for x in batches]  # (input, target) of each step
    path = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
    dist.broadcast_object_list(path)  # one fresh directory for every rank
    torch.manual_seed(501)
    model = compose_source(build())
    params = list(model.parameters())
    params = [{"params": params[0::2]}, {"params": params[1::2], "lr": 0.05 / 2}]
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    train(model, opt, data[0:1])
    FSDP.set_state_dict_type(model, StateDictType.SHARDED_STATE_DICT)
    group = dist.new_group(backend="gloo")  # the saves' collectives run beside the training's
    saves = [os.path.join(path[0], f"early-{i}") for i in range(2)] + [path[0]]  # the last into the checkpoint's
    for k, where in enumerate(saves):
        values = {
            "counter": Counter(501.5), "optimizer": FSDP.optim_state_dict(model, opt), "model": model.state_dict(),
        }
        state = {k: values[k] for k in ORDERS[rank] if k in values}  # in this rank's order
        future = dcp.async_save(state, checkpoint_id=where, process_group=group)
        train(model, opt, data[1 + k : 2 + k] if k < 2 else data[3:5])  # on while it is written
        future.result()  # written


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
