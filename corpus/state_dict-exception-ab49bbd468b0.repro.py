#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=8a961ec26fda3260 seconds=45.8
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: FSDP1 NO_SHARD with an auto-wrapped unit of frozen parameters: state_dict()
# after training raises 'FSDP assumes ... is in the state_dict'; upstream:
# https://github.com/pytorch/pytorch/issues/85831.
# Trains a model and takes its state through FSDP1's state_dict_type, FSDP.optim_state_dict and
# FSDP.optim_state_dict_to_load: the case fails there (what would follow is not printed).
# Run: torchrun --nproc-per-node 2 THIS_FILE.py. Exit 1 (REPRODUCED): a rank raised the exception
# in RAISED (its type, in that function of torch); 0 (PASS): every rank ran through; 2: it failed
# another way.
import copy
import os
import re
import torch
import torch.distributed as dist
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp import StateDictType
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


class Block(nn.Sequential):  # a class of its own, for FSDP1's wrap policy
    pass


def build():
    return Block(nn.Linear(2, 2).requires_grad_(False), Block(nn.Linear(2, 2)))


def compose_source(model):
    return FSDP(model, sharding_strategy=ShardingStrategy.NO_SHARD, use_orig_params=True,
                auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"))


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


RAISED = {'AssertionError@torch/distributed/fsdp/_state_dict_utils.py:_common_unshard_post_state_dict_hook'}


def main(rank, world_size):
    gen = torch.Generator().manual_seed(37)  # the global batches, the same on every rank
    batches = (torch.randn(world_size * 2, 2, generator=gen)[rank * 2 :][:2] for _ in range(2 * 3))
    data = [(x, next(batches)) for x in batches]  # (input, target) of each step
    torch.manual_seed(37)
    model = compose_source(build())
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    train(model, opt, data[0:2])
    FSDP.set_state_dict_type(model, StateDictType.FULL_STATE_DICT)
    model_sd, optim_sd = model.state_dict(), FSDP.optim_state_dict(model, opt)
    model_sd, optim_sd = copy.deepcopy((model_sd, optim_sd))  # as a checkpoint read back would be


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
