#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=14b13112cdb7665b seconds=24.0
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: torch.compile over FSDP1 (use_orig_params=True, sharded): a recompilation of
# the wrapped module's forward while its parameters hold sharded gradients (the suite's trees, a
# contract hook removed or a smaller last batch; not every recompilation: an nn.Sequential variant
# passes) raises InternalTorchDynamoError 'attempting to assign a gradient of size ...'; upstream:
# https://github.com/pytorch/pytorch/issues/111317.
# Runs the case's training under both compositions.
# Run: torchrun --nproc-per-node 4 THIS_FILE.py. Exit 1 (REPRODUCED): a rank raised the exception
# in RAISED (its type, in that function of torch); 0 (PASS): every rank ran through; 2: it failed
# another way.
import os
import re
import torch
import torch.distributed as dist
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed._composable import replicate
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
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


def build():
    return Block([Conv(1, 1, 1)], 1, buffer=True, residual=True)


def compose(model):
    replicate(model)
    return model


def compose_variant(model):
    return FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True,
                auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"))


def train(rank, world_size, compose):
    torch.manual_seed(5651)  # every rank builds the same weights
    model = compose(build())
    forward = torch.compile(model, backend="eager")
    hooks = [m.register_forward_pre_hook(lambda *_: None) for m in model.modules() if list(m.parameters(0))]
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(5651)
    for _ in range(3):
        x, y = (torch.randn(world_size * 3, 1, generator=gen)[0 :][:3] for _ in range(2))
        F.mse_loss(forward(x), y).backward()
        while hooks:  # removed after the first forward: the next one is compiled again
            hooks.pop().remove()
        opt.step()
        opt.zero_grad(set_to_none=False)


RAISED = {'InternalTorchDynamoError@torch/nn/modules/conv.py:_conv_forward'}


def main(rank, world_size):
    for composition in (compose, compose_variant):
        train(rank, world_size, composition)


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
