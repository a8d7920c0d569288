#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=8fe6d7b1f8b8192a seconds=33.0
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: load_sharded_optimizer_state_dict chunks optimizer state over the whole world:
# wrong Adam state in FSDP1 HYBRID_SHARD over a 2-D mesh; upstream: none found.
# Trains a model, saves its state with dcp.save into a fresh directory, loads it with dcp.load
# into a freshly built one and trains both on.
# Run: torchrun --nproc-per-node 4 THIS_FILE.py. Exit 1 (REPRODUCED): a value differs from the
# reference (named at run time); 0 (PASS): every rank ran through; 2: it failed another way.
import os
import tempfile
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp import ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType


class Block(nn.Module):
    def __init__(self, children, width, scale=False, buffer=False, residual=False):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None
        self.register_buffer('shift', 0.1 * torch.randn(width) if buffer else None)
        self.residual = residual

    def forward(self, x):
        y = x
        for child in self.children():
            y = child(y)
        y = y if self.scale is None else y * self.scale
        y = y if self.shift is None else y + self.shift
        return x + y if self.residual else y


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


ORDERS = [  # each rank's order of the top-level dict
    ["model", "scalars", "optimizer", "extra", "counter"],
    ["model", "extra", "counter", "scalars", "optimizer"],
    ["model", "extra", "counter", "optimizer", "scalars"],
    ["model", "counter", "optimizer", "scalars", "extra"],
]


def build():
    return Block([
        Block([
            nn.ReLU(),
            Block([nn.ReLU(), Conv(12, 12, 1).requires_grad_(False)], 12, scale=True),
        ], 12, buffer=True),
        Conv(12, 12, 1, bias=False).requires_grad_(False),
        Block([nn.ReLU()], 12, buffer=True, residual=True),
    ], 12)


def compose_source(model):
    return FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True,
                device_id=torch.device("cpu"))


def compose_target(model):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    return FSDP(model, sharding_strategy=ShardingStrategy.HYBRID_SHARD, use_orig_params=True,
                device_mesh=mesh, device_id=torch.device("cpu"))


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)


RTOL, ATOL = 1e-05, 1e-06  # the tolerance policy for float32
REFERENCE = 'the source'


def full(t):
    return t.detach().clone()


def differs(got, want, exact=False):
    for key, e in want.items():
        if key not in got:
            return f"{key} is missing"
        a, e = got[key].double(), e.double()
        bad = a != e if exact else ~torch.isclose(a, e, rtol=RTOL, atol=ATOL)
        if bad.any():
            i = int(bad.flatten().nonzero()[0])
            factor = [f"; {f:.3g} times as much" for f in (2, 3, 4, 1 / 2, 1 / 3, 1 / 4) if torch.allclose(a, f * e)]
            return (f"{key}: {float(a.flatten()[i]):.9g} where {REFERENCE} has {float(e.flatten()[i]):.9g} "
                    f"({int(bad.sum())} of {bad.numel()} elements differ{''.join(factor[:1])})")
    return None


def snapshot(model, opt=None):  # every parameter and buffer, each group's lr, in full
    with FSDP.summon_full_params(model):  # whole, by plain name
        out = {n: full(t) for n, t in [*model.named_parameters(), *model.named_buffers()]}
    out.update({f"lr of group {i}": torch.tensor(g["lr"]) for i, g in enumerate(opt.param_groups if opt else ())})
    return out


def main(rank, world_size):
    gen = torch.Generator().manual_seed(0)  # the global batches, the same on every rank
    batches = (torch.randn(world_size * 2, 12, generator=gen)[rank * 2 :][:2] for _ in range(2 * 2))
    data = [(x, next(batches)) for x in batches]  # (input, target) of each step
    path = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
    dist.broadcast_object_list(path)  # one fresh directory for every rank
    scalars = {  # what the scalars entry saves
        'step': 1, 'loss': 0.0, 'tag': 'case-0', 'done': False, 'history': [0.0, -1.5, 1e-300],
    }
    extra = torch.arange(5, dtype=torch.float64) * 0.25  # what the extra entry saves
    offload = ShardedStateDictConfig(offload_to_cpu=True), ShardedOptimStateDictConfig(offload_to_cpu=True)
    torch.manual_seed(0)
    model = compose_source(build())
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01, momentum=0.9)
    torch.manual_seed(0 + 2 * 0x5EED)  # an earlier checkpoint in the directory
    decoy = compose_source(build())
    FSDP.set_state_dict_type(decoy, StateDictType.SHARDED_STATE_DICT, *offload)
    values = {
        "model": decoy.state_dict(), "counter": Counter(0.0),
        "scalars": Scalars({k: type(v)() for k, v in scalars.items()}),
        "extra": torch.zeros(5, dtype=torch.float64),
    }
    state = {k: values[k] for k in ORDERS[rank] if k in values}  # in this rank's order
    dcp.save(state, checkpoint_id=path[0])
    train(model, opt, data[0:1])
    FSDP.set_state_dict_type(model, StateDictType.SHARDED_STATE_DICT, *offload)
    values = {
        "model": model.state_dict(), "optimizer": FSDP.optim_state_dict(model, opt), "counter": Counter(0.5),
        "scalars": Scalars(scalars), "extra": extra,
    }
    state = {k: values[k] for k in ORDERS[rank] if k in values}  # in this rank's order
    dcp.async_save(state, storage_writer=dcp.FileSystemWriter(path[0], overwrite=True)).result()  # written
    saved = {**snapshot(model, opt), "extra": extra}
    torch.manual_seed(0 + 0x5EED)  # other weights: a load that does nothing shows
    target = compose_target(build())
    target_opt = torch.optim.SGD([p for p in target.parameters() if p.requires_grad], lr=0.01 * 0.37, momentum=0.5)
    FSDP.set_state_dict_type(target, StateDictType.SHARDED_STATE_DICT, *offload)
    values = {
        "model": target.state_dict(), "counter": Counter(0.0),
        "scalars": Scalars({k: type(v)() for k, v in scalars.items()}),
        "extra": torch.zeros(5, dtype=torch.float64),
    }
    state = {k: values[k] for k in ORDERS[rank] if k in values}  # in this rank's order
    dcp.load(state, storage_reader=dcp.FileSystemReader(path[0]))  # in place
    target.load_state_dict(state["model"])
    loaded = load_sharded_optimizer_state_dict(
        target.state_dict(), "optimizer", storage_reader=dcp.FileSystemReader(path[0])
    )
    target_opt.load_state_dict(FSDP.optim_state_dict_to_load(target, target_opt, loaded["optimizer"]))
    said = differs({**snapshot(target, target_opt), "extra": state["extra"]}, saved, exact=True)  # right after the load
    train(model, opt, data[1:2])
    train(target, target_opt, data[1:2])
    said = said or differs(snapshot(target), snapshot(model))  # after training on
    return said


if __name__ == "__main__":
    try:
        dist.init_process_group("gloo")
        said = [None] * dist.get_world_size()  # what each rank found to differ first
        dist.all_gather_object(said, main(dist.get_rank(), dist.get_world_size()))
    except BaseException:
        traceback.print_exc()
        os._exit(2)  # it failed another way
    said = next(filter(None, said), None)
    if dist.get_rank() == 0:
        print(f"REPRODUCED: {said}" if said else "PASS: every loss, gradient and parameter agrees", flush=True)
    os._exit(1 if said else 0)
