"""Entry point of one rank: join the process group once, then run cases until told to stop.

Started by :class:`fuzz.pool.RankPool` as ``python -m fuzz._rank.worker`` with its settings in
``SHARDFUZZ_*`` environment variables and two inherited pipe descriptors (commands in, results
out). The rank never decides whether a case passed: it sends back plain observations.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import time
import traceback
from datetime import timedelta
from typing import IO, Any

from fuzz._protocol import CaseDone, Ready, RunCase, Stop, decode, encode

PR_SET_PDEATHSIG = 1
#: Collectives give up after this long; the driver's per-case deadline is far shorter, so a
#: hang is always seen (and ended) by the driver first.
PROCESS_GROUP_TIMEOUT = timedelta(minutes=30)


def _die_with_parent(parent_pid: int) -> None:
    """Make sure this rank never outlives the driver, even one killed with SIGKILL."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the command pipe's EOF still ends us
        pass
    if os.getppid() != parent_pid:  # the driver died before prctl took effect
        os._exit(1)


def _process_stats() -> dict[str, float]:
    """Resident memory, open descriptors and threads of this rank (for drift checks)."""
    stats: dict[str, float] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    stats["rss_mb"] = int(line.split()[1]) / 1024
                elif line.startswith("Threads:"):
                    stats["threads"] = int(line.split()[1])
        stats["fds"] = len(os.listdir("/proc/self/fd"))
    except OSError:
        pass
    return stats


def main() -> int:
    env = os.environ
    rank = int(env["SHARDFUZZ_RANK"])
    world_size = int(env["SHARDFUZZ_WORLD_SIZE"])
    backend = env["SHARDFUZZ_BACKEND"]
    device_name = env["SHARDFUZZ_DEVICE"]
    _die_with_parent(int(env["SHARDFUZZ_PARENT_PID"]))
    # Ctrl-C on a terminal reaches the whole foreground process group; the driver decides
    # when ranks end, in steps, so the ranks ignore it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stack_file = open(env["SHARDFUZZ_STACK_FILE"], "w")  # noqa: SIM115 - lives as long as the rank
    faulthandler.enable(file=stack_file, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True, chain=False)
    commands = os.fdopen(int(env["SHARDFUZZ_CMD_FD"]), "rb")
    results = os.fdopen(int(env["SHARDFUZZ_RES_FD"]), "wb", buffering=0)

    import torch
    import torch.distributed as dist

    from fuzz._rank.context import RankContext
    from fuzz._rank.programs import run_case

    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = dist.TCPStore(
        "127.0.0.1", int(env["SHARDFUZZ_STORE_PORT"]), world_size, False, timeout=timedelta(seconds=120)
    )
    pg_backend = "cpu:gloo,cuda:nccl" if backend == "nccl" else "gloo"
    dist.init_process_group(pg_backend, store=store, rank=rank, world_size=world_size, timeout=PROCESS_GROUP_TIMEOUT)
    ctx = RankContext(rank=rank, world_size=world_size, device=device, backend=backend)
    versions = {
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    _send(results, Ready(rank=rank, pid=os.getpid(), versions=versions))

    for line in commands:
        msg = decode(line)
        if isinstance(msg, Stop):
            break
        if isinstance(msg, RunCase):
            _send(results, _run_one(msg, ctx, run_case))
    try:
        dist.destroy_process_group()
    finally:
        stack_file.flush()
        os._exit(0)  # skip interpreter teardown: backend threads can block it


def _run_one(msg: RunCase, ctx: Any, run_case: Any) -> CaseDone:
    from fuzz.case import case_from_json

    start = time.perf_counter()
    try:
        case = case_from_json(msg.case)
        observation = run_case(case, ctx)
        ctx.end_case()
    except BaseException as e:
        return CaseDone(
            case_id=msg.case_id,
            rank=ctx.rank,
            seconds=time.perf_counter() - start,
            exc_type=f"{type(e).__module__}.{type(e).__qualname__}",
            message=str(e)[:4000],
            traceback=traceback.format_exc()[-20000:],
            stats=_process_stats(),
        )
    return CaseDone(
        case_id=msg.case_id,
        rank=ctx.rank,
        seconds=time.perf_counter() - start,
        observation=observation,
        stats=_process_stats(),
    )


def _send(out: IO[bytes], msg: Any) -> None:
    out.write(encode(msg))


if __name__ == "__main__":
    sys.exit(main())
