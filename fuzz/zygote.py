"""Ranks forked from a preloaded parent instead of started from scratch.

A rank started as ``python -m fuzz._rank.worker`` spends about 2 s of CPU importing torch before
it can join its process group, and a pool starts fresh ranks after every failure. A zygote
(:mod:`fuzz._rank.zygote`) imports torch and the rank side once; each later rank is a ``fork`` of
it, ready in milliseconds.

This process keeps one zygote per rank slot and environment (:func:`zygote_for`), shared by every
pool it opens, for as long as it lives: one per slot so that the ranks of a pool keep string
hash seeds of their own, as processes started from scratch have. :class:`ForkedRank` stands in
for the rank's :class:`subprocess.Popen`: the zygote is the rank's parent, reaps it, and reports
its exit status, which this side reads on ``poll`` and ``wait``.

Not used (:func:`zygotes_wanted`) where the rank must start from scratch: under torch coverage
(it starts before torch is imported), with ``SHARDFUZZ_ZYGOTE=0``, or where the platform
cannot pass descriptors between processes.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping

from fuzz._files import tail

#: Seconds a zygote may take to import torch and fork a rank before a fork request fails.
FORK_TIMEOUT_S = 120.0
#: Variables that change while a process runs and that no import reads: not part of a zygote's
#: key (the rank gets their values of the moment with the rest of its environment).
VOLATILE = frozenset({"PYTEST_CURRENT_TEST"})
#: A process keeps at most this many zygotes (about 300 MB each, torch imported); past it, the
#: least recently used ones without ranks are ended first (:func:`zygote_for`).
MAX_ZYGOTES = 6


class ZygoteError(Exception):
    """A zygote could not fork a rank (it failed to start, died, or refused)."""


def zygotes_wanted(env: Mapping[str, str]) -> bool:
    """Whether ranks with environment ``env`` are forked from a zygote."""
    return (
        env.get("SHARDFUZZ_ZYGOTE", "1") != "0"
        and not env.get("SHARDFUZZ_TORCH_COVERAGE")
        and sys.platform == "linux"
        and hasattr(socket, "send_fds")
    )


class Zygote:
    """One zygote process and this side of its socket."""

    def __init__(self, env: Mapping[str, str], log_path: str) -> None:
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fuzz._rank.zygote"],
                env={**env, "SHARDFUZZ_ZYGOTE_FD": str(theirs.fileno())},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(theirs.fileno(),),
            )
        theirs.close()
        self.log_path = log_path
        self.exits: dict[int, int] = {}  # pid -> status, of children reaped and not yet asked about
        self.children: set[int] = set()
        #: Asked for by a pool without an environment of its own (set by :func:`zygote_for`).
        self.usual = False
        self.alive = True
        self._replies: dict[int, dict[str, object]] = {}
        self._next_id = 0
        self._lock = threading.Lock()

    def fork(self, env: Mapping[str, str], fds: tuple[int, int, int]) -> ForkedRank:
        """A rank with environment ``env`` and descriptors (commands, results, log)."""
        with self._lock:
            if not self.alive:
                raise ZygoteError("the zygote has exited")
            self._next_id += 1
            request = self._next_id
            try:
                socket.send_fds(self._sock, [json.dumps({"op": "fork", "id": request, "env": dict(env)}).encode()], fds)
            except OSError as e:
                self._gone()
                raise ZygoteError(f"the zygote cannot be reached: {e}") from e
            end = time.monotonic() + FORK_TIMEOUT_S
            while request not in self._replies:
                remaining = end - time.monotonic()
                if not self.alive or remaining <= 0:
                    what = "exited" if not self.alive else f"did not fork within {FORK_TIMEOUT_S}s"
                    raise ZygoteError(f"the zygote {what}; its output:\n{self.output()}")
                self._pump_locked(remaining)
            reply = self._replies.pop(request)
        if reply.get("op") != "forked":
            raise ZygoteError(f"the zygote could not fork: {reply.get('error')}")
        pid = int(str(reply["pid"]))
        self.children.add(pid)
        return ForkedRank(self, pid)

    def idle(self) -> bool:
        """Whether no rank forked by this zygote is still running."""
        self.pump()
        return self.children <= self.exits.keys()

    def output(self) -> str:
        """The end of what the zygote wrote (its import errors, say)."""
        return tail(self.log_path)

    def pump(self, timeout: float = 0.0) -> None:
        """Read what the zygote has said, waiting up to ``timeout`` seconds for a first message."""
        with self._lock:
            self._pump_locked(timeout)

    def _pump_locked(self, timeout: float) -> None:
        wait = timeout
        while self.alive:
            readable, _, _ = select.select([self._sock], [], [], wait)
            if not readable:
                return
            wait = 0.0
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                self._gone()
                return
            msg = json.loads(data)
            if msg.get("op") == "exit":
                self.exits[int(msg["pid"])] = int(msg["status"])
            elif msg.get("op") in ("forked", "failed"):
                self._replies[int(msg["id"])] = msg

    def _gone(self) -> None:
        """The zygote has exited: its children die with it (PR_SET_PDEATHSIG, SIGKILL)."""
        self.alive = False
        for pid in self.children:
            self.exits.setdefault(pid, -signal.SIGKILL)
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5.0)

    def close(self) -> None:
        """End the zygote (its children die with it)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()
        self.alive = False
        try:
            self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ForkedRank:
    """A rank forked by a :class:`Zygote`, with the parts of :class:`subprocess.Popen` a pool uses."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None
        self.args = [sys.executable, "-m", "fuzz._rank.zygote", f"(fork {pid})"]
        # A descriptor of this process, not of its pid: signals never reach a later process that
        # got the pid after this one was reaped.
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote.pump()
            self._take_exit()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            remaining = 0.5 if end is None else min(0.5, end - time.monotonic())
            if remaining <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout if timeout is not None else 0.0)
            self.zygote.pump(remaining)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _take_exit(self) -> None:
        status = self.zygote.exits.pop(self.pid, None)
        if status is None:
            return
        self.returncode = status
        self.zygote.children.discard(self.pid)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def __del__(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)


_zygotes: dict[tuple[int, tuple[tuple[str, str], ...]], Zygote] = {}
_registry_lock = threading.Lock()


_log_dir: str | None = None
_started = itertools.count()  # numbers the zygotes' logs in _log_dir


def zygote_for(slot: int, env: Mapping[str, str], *, usual: bool = True) -> Zygote:
    """This process's zygote for rank ``slot`` of pools whose ranks share the environment ``env``
    (each rank's own settings come with its fork request), started if there is none or the last
    one has exited. Past :data:`MAX_ZYGOTES`, zygotes without ranks are ended, the least recently
    used first, and those asked for with ``usual`` False (pools with an environment of their own:
    an injected fault, a fix) before the process's usual ones, which its next pool will want."""
    key = (slot, tuple(sorted((k, v) for k, v in env.items() if k not in VOLATILE)))
    global _log_dir
    with _registry_lock:
        zygote = _zygotes.pop(key, None)  # put back last: the dict's order is the order of use
        if zygote is None or not zygote.alive:
            for old_key in [k for k, z in _zygotes.items() if not z.alive]:
                del _zygotes[old_key]
            # least recently used first (the dict's order), unusual ones before usual ones
            for old_key in sorted(_zygotes, key=lambda k: _zygotes[k].usual):
                if len(_zygotes) < MAX_ZYGOTES:
                    break
                if _zygotes[old_key].idle():
                    _zygotes.pop(old_key).close()
            if _log_dir is None:
                _log_dir = tempfile.mkdtemp(prefix="shardfuzz-zygotes-")
            log_path = os.path.join(_log_dir, f"zygote{next(_started)}-rank{slot}.log")
            zygote = Zygote(env, log_path)
        zygote.usual = zygote.usual or usual
        _zygotes[key] = zygote
        return zygote


@atexit.register
def close_zygotes() -> None:
    """End every zygote of this process (each one also ends once this process has exited)."""
    with _registry_lock:
        zygotes = list(_zygotes.values())
        _zygotes.clear()
    for zygote in zygotes:
        zygote.close()
    if _log_dir is not None:
        shutil.rmtree(_log_dir, ignore_errors=True)
