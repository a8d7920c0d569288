"""What each kind of case body does on a rank; returns a JSON-able observation."""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist

from fuzz._rank.context import RankContext
from fuzz.model import Case, FaultAction, FaultBody


def run_case(case: Case, ctx: RankContext) -> dict[str, Any]:
    if case.world_size != ctx.world_size:
        raise ValueError(f"case needs world_size={case.world_size}, this pool has {ctx.world_size}")
    module, function = case.body.PROGRAM.split(":")
    program = getattr(importlib.import_module(module), function)
    result: dict[str, Any] = program(case, case.body, ctx)
    return result


def run_fault(case: Case, body: FaultBody, ctx: RankContext) -> dict[str, Any]:
    """Inject one fault into one rank: the pool's own tests use these to exercise its paths."""
    me = ctx.rank == body.rank
    t = torch.tensor([float(ctx.rank + 1)], device=ctx.device)
    action = body.action
    if action is FaultAction.NONE:
        dist.all_reduce(t)
    elif action is FaultAction.HANG:
        if me:
            dist.all_reduce(t)  # the other ranks never join
    elif action is FaultAction.RAISE:
        if me:
            raise RuntimeError(f"injected fault on rank {ctx.rank}")
        dist.all_reduce(t)  # blocks: the raising rank never joins
    elif action is FaultAction.EXIT and me:
        os._exit(3)
    elif action is FaultAction.SIGKILL and me:
        os.kill(os.getpid(), signal.SIGKILL)
    elif action is FaultAction.SIGSEGV and me:
        ctypes.string_at(0)
    elif action is FaultAction.SLEEP:
        time.sleep(body.seconds)
    return {"value": t.item()}
