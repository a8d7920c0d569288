"""A preloaded parent of ranks: imports torch and the rank side once, then forks ranks on request.

Started by :mod:`fuzz.zygote` (the driver side, which says when and why) as
``python -m fuzz._rank.zygote`` with one end of a ``SOCK_SEQPACKET`` socket pair in
``SHARDFUZZ_ZYGOTE_FD``. Messages are one JSON object each:

- driver to zygote: ``{"op": "fork", "id": N, "env": {...}}`` with three descriptors attached
  (the rank's command pipe, its result pipe, its log file). The child takes ``env`` as its whole
  environment, the log as stdout and stderr, and runs :func:`fuzz._rank.worker.main`.
- zygote to driver: ``{"op": "forked", "id": N, "pid": P}`` (or ``"failed"`` with ``error``),
  and ``{"op": "exit", "pid": P, "status": S}`` once a child is reaped, ``S`` in
  :class:`subprocess.Popen`'s convention (``-signal`` for a signal).

The zygote ends when the driver's end of the socket closes (the driver exited or was killed);
its children die with it (``PR_SET_PDEATHSIG``, set by the worker). It ignores SIGINT as ranks do.

A forked child starts as a fresh process would, as far as the ranks can tell: Python's and
torch's random generators are seeded anew (torch only where this torch seeds each process at
random), it has its own name (``/proc/PID/comm``: ``shardfuzz-rankN``), and only its main
thread. Its string hash seed is the zygote's: each rank slot of a pool has a zygote of its own,
so the ranks of one pool still hash differently from each other.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import select
import signal
import socket
import sys
import traceback

PR_SET_NAME = 15
#: torch's seed of a process it does not seed at random (c10's default_rng_seed_val).
TORCH_DEFAULT_SEED = 67280421310721
MAX_MESSAGE = 1 << 20


#: What torch imports lazily on a rank's first case, imported here once: a fork of a zygote
#: without them spent about 2.4 s of CPU on its first fully_shard forward and backward (Dynamo,
#: SymPy, FSDP, DTensor: about 900 modules), with them 0.07 s (this 2-core CPU machine, torch
#: 2.13). Importing them starts no thread and initializes no accelerator: forks stay safe.
LAZY_TORCH_MODULES = (
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
    "torch._dynamo",
)


def _preload() -> bool:
    """Import what every rank imports; whether this torch seeds each process at random."""
    import importlib

    import torch
    import torch.distributed

    import fuzz._rank.context
    import fuzz._rank.programs
    import fuzz._rank.worker  # noqa: F401

    for name in LAZY_TORCH_MODULES:
        # one that fails here (a fault under test can break it) fails again in the rank that needs it,
        # which reports it as a rank does
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    return torch.initial_seed() != TORCH_DEFAULT_SEED


def _status(wait_status: int) -> int:
    return -os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else os.WEXITSTATUS(wait_status)


def _send(sock: socket.socket, msg: dict[str, object]) -> None:
    with contextlib.suppress(OSError):  # the driver is gone: the next recv says so
        sock.send(json.dumps(msg).encode())


def _child(sock: socket.socket, wake: tuple[int, int], env: dict[str, str], fds: list[int], reseed_torch: bool) -> None:
    """In the forked child: become the rank. Never returns."""
    status = 1
    try:
        sock.close()
        signal.set_wakeup_fd(-1)
        for fd in wake:
            os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        cmd_fd, res_fd, log_fd = fds
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(devnull)
        os.close(log_fd)
        os.environ.clear()
        os.environ.update(env)
        os.environ["SHARDFUZZ_CMD_FD"] = str(cmd_fd)
        os.environ["SHARDFUZZ_RES_FD"] = str(res_fd)
        random.seed()
        if reseed_torch:
            import torch

            torch.seed()
        with contextlib.suppress(OSError, AttributeError):
            name = f"shardfuzz-rank{env.get('SHARDFUZZ_RANK', '')}".encode()[:15]
            ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
        from fuzz._rank import worker

        status = worker.main(parent_pid=os.getppid())
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
            sys.stderr.flush()
    finally:
        os._exit(status)


def main() -> int:
    sock = socket.socket(fileno=int(os.environ.pop("SHARDFUZZ_ZYGOTE_FD")))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    reseed_torch = _preload()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    children: set[int] = set()
    _send(sock, {"op": "ready"})
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
        for pid in list(children):
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                _send(sock, {"op": "exit", "pid": pid, "status": _status(wait_status)})
        if sock.fileno() not in readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 3)
        except OSError:
            data, fds = b"", []
        if not data:  # the driver is gone; the children die with this process
            return 0
        msg = json.loads(data)
        try:
            if msg.get("op") != "fork" or len(fds) != 3:
                raise ValueError(f"not a fork request with three descriptors: {msg.get('op')!r}, {len(fds)}")
            pid = os.fork()
        except (OSError, ValueError) as e:
            for fd in fds:
                os.close(fd)
            _send(sock, {"op": "failed", "id": msg.get("id"), "error": str(e)})
            continue
        if pid == 0:
            _child(sock, (wake_r, wake_w), msg["env"], fds, reseed_torch)
        for fd in fds:
            os.close(fd)
        children.add(pid)
        _send(sock, {"op": "forked", "id": msg["id"], "pid": pid})


if __name__ == "__main__":
    sys.exit(main())
