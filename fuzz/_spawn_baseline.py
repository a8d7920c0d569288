"""The baseline that ``python -m fuzz bench`` compares the pool against: fresh ranks per case.

This is how PyTorch's own distributed tests run (MultiProcessTestCase): for every test, spawn
``world_size`` processes with multiprocessing's ``spawn`` start method, let each import torch
and join a new process group through a FileStore, run the test, destroy the group, and join the
processes. The same rank-side code runs the case as in the pool, so only the harness differs.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import tempfile
from typing import Any

from fuzz.errors import PoolError
from fuzz.model import Case, case_to_json
from fuzz.pool import RANK_ENV_DEFAULTS


def _child(rank: int, world_size: int, backend: str, device: str, init_file: str, case: dict[str, Any], q: Any) -> None:
    import torch
    import torch.distributed as dist

    from fuzz._rank.context import RankContext
    from fuzz._rank.programs import run_case
    from fuzz.model import case_from_json

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(
        "cpu:gloo,cuda:nccl" if backend == "nccl" else "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
    )
    try:
        ctx = RankContext(rank=rank, world_size=world_size, device=dev, backend=backend)
        q.put((rank, run_case(case_from_json(case), ctx)))
    finally:
        dist.destroy_process_group()


def run_spawned(case: Case, *, backend: str, devices: list[str], timeout: float = 300.0) -> list[dict[str, Any]]:
    """Run ``case`` on freshly spawned ranks; returns every rank's observation."""
    for k, v in RANK_ENV_DEFAULTS.items():
        os.environ.setdefault(k, v)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    fd, init_file = tempfile.mkstemp(prefix="shardfuzz-filestore-")
    os.close(fd)
    os.unlink(init_file)  # FileStore creates it; a stale file would confuse the rendezvous
    procs = [
        ctx.Process(
            target=_child,
            args=(r, case.world_size, backend, devices[r], init_file, case_to_json(case), q),
            daemon=True,
        )
        for r in range(case.world_size)
    ]
    try:
        for p in procs:
            p.start()
        results: dict[int, dict[str, Any]] = {}
        while len(results) < case.world_size:
            try:
                rank, obs = q.get(timeout=timeout)
            except queue.Empty:
                raise PoolError(f"spawned ranks did not finish within {timeout}s") from None
            results[rank] = obs
        for p in procs:
            p.join(timeout)
        return [results[r] for r in range(case.world_size)]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        if os.path.exists(init_file):
            os.unlink(init_file)
