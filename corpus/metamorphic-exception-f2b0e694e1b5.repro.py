#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=14b13112cdb7665b sources=ca590eb54ff975c7 seconds=4228.7
# Reproduces shardfuzz corpus entry metamorphic-exception-f2b0e694e1b5.json: exception:metamorphic:torch._dynamo.exc.InternalTorchDynamoError@torch/nn/modules/conv.py:_conv_forward
# Known torch bug: torch.compile over FSDP1 (use_orig_params=True, sharded): a recompilation of
# the wrapped module's forward while its parameters hold sharded gradients (the suite's trees, a
# contract hook removed or a smaller last batch; not every recompilation: an nn.Sequential variant
# passes) raises InternalTorchDynamoError 'attempting to assign a gradient of size ...'; upstream:
# https://github.com/pytorch/pytorch/issues/111317.
# Observed: torch.compile over FSDP1 (use_orig_params=True, sharded): Dynamo recompiles the
# wrapped module's forward while its parameters hold sharded gradients and fails ...
# Run: torchrun --nproc-per-node 4 THIS_FILE.py: while the failure is there a rank raises
# torch._dynamo.exc.InternalTorchDynamoError in torch/nn/modules/conv.py:_conv_forward, prints its
# traceback and REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank exits 0
# (expected: no rank raises); a rank exits 2 where the script cannot run (not under torchrun,
# another world size) or the case fails another way (it prints FAIL). torchrun's own status is 1
# whenever a rank's is not 0.

from __future__ import annotations
from dataclasses import dataclass, field
import torch
import enum
from typing import Any, Union
from torch import nn
import torch.nn.functional as F

@dataclass
class RankContext:
    rank: object
    world_size: object
    device: object
    backend: object

class LeafKind(str, enum.Enum):
    CONV1D = 'conv1d'

@dataclass()
class Leaf:
    kind: object

@dataclass()
class Block:
    children: object
    residual: object = False
Node = Union[Block,]

@dataclass()
class ModuleTree:
    width: object
    root: object

class Wrapper(str, enum.Enum):
    NONE = 'none'
    FSDP1_FULL_SHARD = 'fsdp1_full_shard'

@dataclass()
class Composition:
    replicates: object = ()
    checkpoint_first: object = True
    mesh: object = ()

class TreeBlock(nn.Module):

    def __init__(self, children: list[nn.Module]) -> None:
        super().__init__()
        i, child = next(iter(enumerate(children)))
        self.add_module(str(i), child)
        self.residual = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        name, child = next(iter(self.named_children()))
        y = child(y)
        return x + y if self.residual else y

class PointwiseConv1d(nn.Conv1d):

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.unsqueeze(-1)).squeeze(-1)

def build_node(node: Node, width: int) -> nn.Module:
    if isinstance(node, Leaf):
        module = PointwiseConv1d(width, width, kernel_size=1)
        return module
    return TreeBlock([build_node(c, width) for c in node.children])

@dataclass
class Composed:
    model: object
    wrapper: object = Wrapper.NONE
    param_names: object = field(default_factory=list)

class _Contracts:

    def __init__(self, model: nn.Module, comp: Composition) -> None:
        self.handles: list[Any] = []
        for name, mod in model.named_modules():
            self.handles.append(mod.register_forward_pre_hook(self._on_leaf(name)))

    def _on_leaf(self, name: str) -> Any:

        def hook(module: nn.Module, args: Any) -> None:
            pass
        return hook

def attempt(rank, world_size):
    ctx = RankContext(rank=rank, world_size=world_size, device=torch.device('cpu'), backend='gloo')
    tree = ModuleTree(width=1, root=Block(children=(Leaf(kind=LeafKind.CONV1D),)))
    comp = Composition(replicates=('',), checkpoint_first=False, mesh=(1, 4))
    model_ = build_node(tree.root, 1).to(torch.float32)
    names = [n for n, __ in model_.named_parameters()]
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = ShardingStrategy.FULL_SHARD
    wrap_out = FSDP(model_, sharding_strategy=strategy, device_id=ctx.device, use_orig_params=True, auto_wrap_policy=ModuleWrapPolicy({TreeBlock}))
    compose_out = Composed(model=wrap_out, wrapper=Wrapper.FSDP1_FULL_SHARD, param_names=names)
    contracts = _Contracts(model_, comp)
    forward = torch.compile(wrap_out, backend='eager')
    gen = torch.Generator().manual_seed(5651)
    out_ = []
    for _ in range(3):
        x_ = torch.randn(12, 1, generator=gen, dtype=torch.float32)
        y_ = torch.randn(12, 1, generator=gen, dtype=torch.float32)
        step_ = [(x_[0:3].to(torch.device('cpu')), y_[0:3].to(torch.device('cpu')))]
        out_.append(step_)
    for s, step in enumerate(out_):
        i, (x, y) = next(iter(enumerate(step)))
        out = forward(x)
        for h in contracts.handles:
            h.remove()
        loss = F.mse_loss(out.to(y.dtype), y)
        loss.backward()

def torch_frame(path: str, function: str) -> str | None:
    at = path.rfind('/torch/')
    inner = path[at + 1:]
    if at < 0 or '/fuzz/' in path or '-packages/' in inner or (function in ('<listcomp>', '<dictcomp>', '<setcomp>')):
        return None
    return f'{inner}:{function}'


if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import sys
    import time
    if os.environ.get("WORLD_SIZE") != "4":
        print("run it with: torchrun --nproc-per-node 4 " + sys.argv[0], file=sys.stderr)
        sys.exit(2)
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    import re
    import traceback
    try:
        attempt(rank, world_size)
    except BaseException as e:  # torch's CheckpointException is a BaseException
        text = traceback.format_exc()
        sys.stderr.write("".join(f"[rank{rank}]: {line}\n" for line in text.splitlines()))
        frames = [f for f in (torch_frame(p, f) for p, f in re.findall(r'File "([^"]+)", line \d+,? in (\S+)', text)) if f]
        found = f"{type(e).__module__}.{type(e).__qualname__}@{(frames or ['torch/?:?'])[-1]}"
        if found in ['torch._dynamo.exc.InternalTorchDynamoError@torch/nn/modules/conv.py:_conv_forward']:
            print(f"REPRODUCED exception:metamorphic:torch._dynamo.exc.InternalTorchDynamoError@torch/nn/modules/conv.py:_conv_forward: rank {rank} raised {found}", flush=True)
            os._exit(1)
        print(f"FAIL (not the entry's failure): rank {rank} raised {found}", flush=True)
        os._exit(2)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store.add("repro-passed", 1)
    until = time.monotonic() + 60
    while store.add("repro-passed", 0) < world_size:
        if time.monotonic() > until:
            print(f"FAIL (not the entry's failure): rank {rank} finished, another rank did not", flush=True)
            os._exit(2)
        time.sleep(0.05)
    if rank == 0:
        print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
