"""Entry point of one rank: join the process group once, then run cases until told to stop.

Started by :class:`fuzz.pool.RankPool` as ``python -m fuzz._rank.worker``, or forked by a
:mod:`fuzz._rank.zygote` that has imported torch already, with its settings in
``SHARDFUZZ_*`` environment variables and two inherited pipe descriptors (commands in, results
out). The rank never decides whether a case passed: it sends back plain observations.

Besides cases, a rank runs scripts for the reducer (:class:`~fuzz._protocol.RunScript`): the
script's code is executed as a fresh module and its ``attempt(rank, world_size)`` called in
this rank's process group; the verdict line it returns goes back as is. Then, once every rank
has answered, :class:`~fuzz._protocol.Settle` checks that the ranks are still in step and
frees what the script left behind (:func:`_settle`).
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import IO, Any

from fuzz._protocol import CaseDone, Ready, RunCase, RunScript, ScriptDone, Settle, Settled, Stop, decode, encode

PR_SET_PDEATHSIG = 1
#: Collectives give up after this long; the driver's per-case deadline is far shorter, so a
#: hang is always seen (and ended) by the driver first.
PROCESS_GROUP_TIMEOUT = timedelta(minutes=30)
#: A rank still in a case after SAMPLE_AFTER_S writes its main thread's stack to
#: SHARDFUZZ_SAMPLE_FILE every SAMPLE_EVERY_S, for the driver's stall checks (fuzz.pool.Stall).
SAMPLE_AFTER_S = 2.0
SAMPLE_EVERY_S = 1.0


class Sampler(threading.Thread):
    """Writes ``<case id>\n<main thread's stack>`` to ``path`` (replaced whole) while a case runs
    long. A thread of Python: it runs while the main thread waits in a collective, which releases
    the GIL; a main thread that holds the GIL simply goes unsampled."""

    def __init__(self, path: str) -> None:
        super().__init__(name="shardfuzz-sampler", daemon=True)
        self.path = path
        self.main = threading.main_thread().ident
        self.case: tuple[int, float] | None = None  # (case id, time.monotonic() at its start)

    def run(self) -> None:
        while True:
            time.sleep(SAMPLE_EVERY_S)
            current = self.case
            if current is None or time.monotonic() - current[1] < SAMPLE_AFTER_S:
                continue
            frame = sys._current_frames().get(self.main) if self.main is not None else None
            if frame is None:
                continue
            text = f"{current[0]}\n" + "".join(traceback.format_stack(frame))
            del frame
            if self.case is not current:  # the case ended meanwhile
                continue
            try:
                with open(self.path + ".tmp", "w", encoding="utf-8") as f:
                    f.write(text)
                os.replace(self.path + ".tmp", self.path)
            except OSError:
                pass


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


def main(parent_pid: int | None = None) -> int:
    """Run the rank; ``parent_pid``: the process it dies with, when that is not the driver (a
    rank forked by :mod:`fuzz._rank.zygote`)."""
    env = os.environ
    rank = int(env["SHARDFUZZ_RANK"])
    world_size = int(env["SHARDFUZZ_WORLD_SIZE"])
    backend = env["SHARDFUZZ_BACKEND"]
    device_name = env["SHARDFUZZ_DEVICE"]
    _die_with_parent(parent_pid if parent_pid is not None else int(env["SHARDFUZZ_PARENT_PID"]))
    # Ctrl-C on a terminal reaches the whole foreground process group; the driver decides
    # when ranks end, in steps, so the ranks ignore it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stack_file = open(env["SHARDFUZZ_STACK_FILE"], "w")  # noqa: SIM115 - lives as long as the rank
    faulthandler.enable(file=stack_file, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True, chain=False)
    commands = os.fdopen(int(env["SHARDFUZZ_CMD_FD"]), "rb")
    results = os.fdopen(int(env["SHARDFUZZ_RES_FD"]), "wb", buffering=0)
    # Torch coverage (fuzz._rank.torch_coverage), started before torch is imported. Imported by
    # name: reproducer scripts carry the modules that the worker's import statements name
    # (fuzz.repro.script) and never measure coverage.
    recorder = None
    if env.get("SHARDFUZZ_TORCH_COVERAGE"):
        recorder = importlib.import_module("fuzz._rank.torch_coverage").start(env, rank)

    import torch
    import torch.distributed as dist

    from fuzz._rank.context import RankContext
    from fuzz._rank.programs import run_case

    # The seed torch started this process with: each script starts from it (_run_script).
    fresh_seed = torch.initial_seed()
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
    if recorder is not None:
        recorder.started()  # what start-up reaches, saved before the first case
    _send(results, Ready(rank=rank, pid=os.getpid(), versions=versions))

    sampler = Sampler(env["SHARDFUZZ_SAMPLE_FILE"])
    sampler.start()
    groups: set[Any] = set()  # the process groups there were before the latest script
    for line in commands:
        msg = decode(line)
        if isinstance(msg, Stop):
            break
        if isinstance(msg, RunScript):
            groups = _process_groups()
            sampler.case = (msg.case_id, time.monotonic())  # a hang's attempt is judged by its stack
            script_done = _run_script(msg, ctx, fresh_seed)
            sampler.case = None
            _send(results, script_done)
        elif isinstance(msg, Settle):
            _send(results, Settled(case_id=msg.case_id, rank=ctx.rank, error=_settle(ctx, groups)))
        elif isinstance(msg, RunCase):
            sampler.case = (msg.case_id, time.monotonic())
            done = _run_one(msg, ctx, run_case)
            sampler.case = None
            if recorder is not None:
                recorder.save()  # before the result: after a failure the pool kills its ranks
            _send(results, done)
    try:
        dist.destroy_process_group()
    finally:
        stack_file.flush()
        os._exit(0)  # skip interpreter teardown: backend threads can block it


def _run_one(msg: RunCase, ctx: Any, run_case: Any) -> CaseDone:
    from fuzz.model import case_from_json

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


def _run_script(msg: RunScript, ctx: Any, fresh_seed: int) -> ScriptDone:
    """Run ``msg.code`` as a module of its own (registered in ``sys.modules`` while it runs, so
    that dataclasses and pickle find it; not ``__main__``, so its ``main`` does not run) and
    call its ``msg.function(rank, world_size)``. Torch's random generators are seeded as this
    process started (``fresh_seed``), as a script under torchrun finds them: what the scripts
    before it drew does not decide what this one draws."""
    import types

    import torch

    torch.manual_seed(fresh_seed)

    name = f"_shardfuzz_script_{msg.case_id}"
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    sys.modules[name] = module
    start = time.perf_counter()
    try:
        exec(compile(msg.code, module.__file__, "exec"), module.__dict__)
        verdict = module.__dict__[msg.function](ctx.rank, ctx.world_size)
    except BaseException as e:
        return ScriptDone(
            case_id=msg.case_id,
            rank=ctx.rank,
            seconds=time.perf_counter() - start,
            exc_type=f"{type(e).__module__}.{type(e).__qualname__}",
            message=str(e)[:4000],
            traceback=traceback.format_exc()[-20000:],
        )
    finally:
        sys.modules.pop(name, None)
    return ScriptDone(case_id=msg.case_id, rank=ctx.rank, seconds=time.perf_counter() - start, verdict=str(verdict))


def _process_groups() -> set[Any]:
    from torch.distributed import distributed_c10d

    return set(distributed_c10d._world.pg_map)


def _settle(ctx: Any, before: set[Any]) -> str | None:
    """After a script on every rank: None if this rank can run another, else why not. The ranks
    must have issued as many collectives on the default group (gloo pairs them by order: see
    :meth:`~fuzz._rank.context.RankContext.end_case`); the process groups the script made
    (its meshes) are destroyed, none of them is used again; dynamo's caches are reset."""
    import torch.distributed as dist

    try:
        ctx.end_case()
        for group in _process_groups() - before:
            dist.destroy_process_group(group)
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None:
            dynamo.reset()
    except BaseException as e:
        return f"{type(e).__module__}.{type(e).__qualname__}: {str(e)[:2000]}"
    return None


def _send(out: IO[bytes], msg: Any) -> None:
    out.write(encode(msg))


if __name__ == "__main__":
    sys.exit(main())
