#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=63e5b277ec033028 seconds=39.6
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
from torch.distributed.fsdp import StateDictType


class Conv(nn.Conv1d):
    """A one-tap Conv1d over a (batch, width) activation, as a length-1 sequence."""

    def forward(self, x):
        return super().forward(x.unsqueeze(-1)).squeeze(-1)


def build():
    return nn.Sequential(Conv(2, 2, 1, bias=False)).to(torch.float64)


def compose(model):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    return FSDP(model, sharding_strategy=ShardingStrategy.HYBRID_SHARD, use_orig_params=True,
                device_mesh=mesh, device_id=torch.device("cpu"))


def train(model, opt, batches):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)


RTOL, ATOL = 1e-09, 1e-12  # the tolerance policy for float64
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
    batches = (torch.randn(world_size, 2, generator=gen, dtype=torch.float64)[rank :][:1] for _ in range(2 * 2))
    data = [(x, next(batches)) for x in batches]  # (input, target) of each step
    path = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
    dist.broadcast_object_list(path)  # one fresh directory for every rank
    torch.manual_seed(0)
    model = compose(build())
    opt = torch.optim.Adam(model.parameters(), lr=0.01, eps=0.0001)
    train(model, opt, data[0:1])
    FSDP.set_state_dict_type(model, StateDictType.SHARDED_STATE_DICT)
    state = {"model": model.state_dict(), "optimizer": FSDP.optim_state_dict(model, opt)}
    dcp.save(state, checkpoint_id=path[0])
    saved = snapshot(model, opt)
    torch.manual_seed(0 + 0x5EED)  # other weights: a load that does nothing shows
    target = compose(build())
    target_opt = torch.optim.Adam(target.parameters(), lr=0.01 * 0.37, eps=0.0001 * 10)
    FSDP.set_state_dict_type(target, StateDictType.SHARDED_STATE_DICT)
    state = {"model": target.state_dict()}
    dcp.load(state, checkpoint_id=path[0])  # in place
    target.load_state_dict(state["model"])
    loaded = load_sharded_optimizer_state_dict(
        target.state_dict(), "optimizer", storage_reader=dcp.FileSystemReader(path[0])
    )
    target_opt.load_state_dict(FSDP.optim_state_dict_to_load(target, target_opt, loaded["optimizer"]))
    said = differs(snapshot(target, target_opt), saved, exact=True)  # right after the load
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
