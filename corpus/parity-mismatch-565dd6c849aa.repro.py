#!/usr/bin/env python3
# shardfuzz printed reproducer: entry=ef9d78ce2377cd6d seconds=4.7
# Printed from the case by shardfuzz (python -m fuzz repro).
# Known torch bug: a fully_shard unit of frozen parameters that runs twice in one forward inside a
# checkpointed region stays unsharded after backward although reshard_after_backward is True;
# unfrozen later (through the sharded parameter), its registered unsharded parameters keep
# requires_grad=False in the next forward and the recomputation raises CheckpointError 'Recomputed
# values ... different metadata'; so does, without unfreezing, a second forward before one
# backward (the region recomputed twice in it); upstream: none found.
# Contract: set_reshard_after_backward(True), the default: "Sets if the module should reshard
# parameters after backward" (docs/contracts.md; recorder: fuzz/_rank/memory.py).
# The recorder saw: after backward with reshard_after_backward=True, '1.0.0' still holds 80 bytes
# of unsharded parameter storage
# Observes the unsharded bytes each unit of a root whose backward ran holds (the storage of its
# all-gather outputs) after each backward that reshards, read before the next forward; prints each
# point against what the composition and that rule document there.
# Run: torchrun --nproc-per-node 2 THIS_FILE.py. Exit 1 (REPRODUCED): the contract is broken (the
# first point named); 0 (PASS): it holds at every point observed; 2: it failed another way.
import os
import torch
import torch.distributed as dist
import torch.nn.functional as F
import traceback
from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, children, width, scale=False, repeat=False):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None
        self.repeat = repeat  # its children run twice over

    def forward(self, x):
        y = x
        for _ in range(2 if self.repeat else 1):
            for child in self.children():
                y = child(y)
        y = y if self.scale is None else y * self.scale
        return y


def build():
    return Block([
        nn.Linear(4, 4).requires_grad_(False),
        Block([Block([nn.Linear(4, 4).requires_grad_(False)], 4, scale=True)], 4, repeat=True),
    ], 4)


def compose(model):
    fully_shard(model.get_submodule("1.0.0"), reshard_after_forward=False)
    checkpoint(model.get_submodule("1.0"))
    fully_shard(model, reshard_after_forward=False)
    return model


ROOTS = [['', '1.0.0']]  # the fully_shard units of each FSDP root, in the order their forwards start


SEEN = []  # (broken, what was observed against what is documented), in the order observed


def in_backward():  # whether the autograd engine runs a backward on this thread
    return torch._C._current_graph_task_id() != -1


def tensors(value):  # the tensors of a module's arguments or output
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [t for v in value for t in tensors(v)] if isinstance(value, (list, tuple)) else []


def groups(unit):  # FSDP2's parameter groups of a fully_shard unit (read, never changed)
    state = unit._get_fsdp_state()
    found = getattr(state, "_fsdp_param_groups", None)
    if found is None:
        found = [g for g in [getattr(state, "_fsdp_param_group", None)] if g is not None]
    return list(found)


def unsharded_bytes(unit):  # the storage its all-gathers wrote the unsharded parameters into (freed: size 0)
    params = [p for g in groups(unit) for p in g.fsdp_params]
    return sum(t.untyped_storage().size() for p in params for t in [*p.all_gather_outputs, *p._unsharded_inner_tensors])


def full_bytes(unit):  # what its parameters take unsharded, in the dtype it all-gathers them in
    params = [p for g in groups(unit) for p in g.fsdp_params]
    return sum(p.sharded_param.numel() * (p.param_dtype or p.orig_dtype).itemsize for p in params)


MICROBATCHES = 1  # a step's backwards: the last reshards (all where this is 1)


CALLS, REACHED = [0], set()  # boundaries passed; units of the roots whose backward ran this microbatch


def reached(units):  # a root's forward hook: its output's gradient means its backward runs
    def hook(module, args, output):
        if not in_backward() and torch.is_grad_enabled():
            for t in [t for t in tensors(output) if t.requires_grad]:
                t.register_hook(lambda grad: REACHED.update(units))

    return hook


def judge_freed():  # the microbatch just done, where its backward resharded
    if CALLS[0] and (CALLS[0] - 1) % MICROBATCHES == MICROBATCHES - 1:
        for path in [u for u in UNIT if u in REACHED]:
            held = unsharded_bytes(UNIT[path])
            SEEN.append((held > 0, f"after a backward with set_reshard_after_backward(True), {path!r} holds "
                                   f"{held} unsharded bytes; documented: 0 (freed)"))
    CALLS[0] += 1
    REACHED.clear()


UNIT = {}  # path -> fully_shard unit, once composed


def microbatch_done():  # judge the microbatch that ended, forget it
    judge_freed()


def observed(model):  # the composition, then the observation points
    model = compose(model)
    UNIT.update({path: model.get_submodule(path) for path in ['', '1.0.0']})  # the fully_shard units
    for units in ROOTS:
        UNIT[units[0]].register_forward_hook(reached(units))
    model.register_forward_pre_hook(lambda *_: None if in_backward() else microbatch_done(), prepend=True)
    return model


def train(rank, world_size, compose):
    torch.manual_seed(0)  # every rank builds the same weights
    model = compose(build())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        x, y = (torch.randn(world_size * 2, 4, generator=gen)[rank * 2 :][:2] for _ in range(2))
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def main(rank, world_size):
    train(rank, world_size, observed)
    microbatch_done()  # the last microbatch
    return SEEN


if __name__ == "__main__":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a CPU program: fully_shard without a mesh takes an accelerator's
    try:
        dist.init_process_group("gloo")
        said = [None] * dist.get_world_size()  # what each rank observed, against what is documented
        dist.all_gather_object(said, main(dist.get_rank(), dist.get_world_size()))
    except BaseException:
        traceback.print_exc()
        os._exit(2)  # it failed another way
    broken = [f"rank {r}: {line}" for r, seen in enumerate(said) for bad, line in seen if bad]
    if dist.get_rank() == 0:
        for bad, line in said[0]:
            print(("broken: " if bad else "holds:  ") + line)
        if not any(said):
            print("FAIL (the contract's points were never reached)", flush=True)
            os._exit(2)
        print(f"after_backward: {sum(map(len, said))} points observed on {len(said)} ranks")
        print(f"REPRODUCED: {broken[0]}" if broken else "PASS: the contract holds at every point observed", flush=True)
    os._exit(1 if broken else 0 if any(said) else 2)
