"""The persistent rank pool: spawn N ranks once, run many cases in them, survive their failures.

The driver side of the controller/worker split (the rank side is :mod:`fuzz._rank.worker`). The
driver never enters a collective, so whatever the ranks do, it can see and end it:

- every case has a deadline; ranks that miss it get their Python stacks dumped (faulthandler on
  SIGUSR1) and the case ends as a ``hang``. Before that, the ranks' stack samples end a
  deadlock sooner: when every rank still in the case has waited in a blocking call of
  torch.distributed with its stack unchanged for :meth:`RankPool.hang_hold` seconds
  (:class:`HangWatch`), or when they show a deadlock that the property names (:class:`Stall`);
- a rank whose result pipe closes has died: the case ends as a ``crash`` with its exit status,
  the stack faulthandler wrote (on a fatal signal) and the tail of its output;
- a rank that raises reports its traceback; the others get a short grace period to report too,
  then their stacks are dumped and the case ends as an ``exception``.

After anything but ``ok`` the ranks are ended and a fresh set is spawned at once (a process group
that has seen an error is not trusted again); spawning overlaps with whatever the driver does
next. The TCP store that ranks rendezvous through lives in the driver on an OS-chosen loopback
port, so pools in several processes (pytest-xdist workers, parallel campaigns) never collide.
Ranks die with the driver (PR_SET_PDEATHSIG), ignore SIGINT, and are ended in steps (stop
message, SIGTERM, SIGKILL) under one deadline by :meth:`RankPool.close`.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from datetime import timedelta
from typing import IO, Any

from fuzz._files import read_from, size, tail
from fuzz._protocol import CaseDone, Ready, RunCase, RunScript, ScriptDone, Settle, Settled, Stop, decode, encode
from fuzz.errors import InvalidArgument, PoolError
from fuzz.model import Case, case_to_json
from fuzz.verdict import FAILURE_GRACE_S, Collect, HangWatch, Outcome, OutcomeKind, RankReport, Stall
from fuzz.zygote import ForkedRank, ZygoteError, zygote_for, zygotes_wanted

BACKENDS = ("gloo", "nccl")
#: How many times in a row a start is tried again after a rank was killed by a signal while
#: starting (RankPool._await_ready).
START_KILLS = 2
#: Seconds a rank whose pipe closed is given to be reaped, so its exit status is known.
DEATH_REAP_S = 2.0
STACK_DUMP_WAIT_S = 1.0
#: When the driver starts reading stack samples (the ranks sample from 2 s into a case).
HANG_LOOK_AFTER_S = 2.0
#: The generic hang rule (:class:`HangWatch`): every rank still in the case waits in a blocking
#: call, its sampled stack unchanged, for max(HANG_HOLD_MIN_S, HANG_HOLD_SLOWEST x the slowest
#: case of the property that ended ok on this pool so far).
HANG_HOLD_MIN_S = 4.0
HANG_HOLD_SLOWEST = 3.0

#: Environment every rank gets unless the caller's environment already says otherwise.
RANK_ENV_DEFAULTS = {
    "OMP_NUM_THREADS": "1",
    "GLOO_SOCKET_IFNAME": "lo",
    "NCCL_SOCKET_IFNAME": "lo",
    # NVLink multicast can put shared GPUs out of service; a fuzzer never needs it.
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
}


#: Seconds the ranks may take to check that they are in step after a script (:meth:`RankPool.run_script`).
SETTLE_TIMEOUT_S = 20.0


#: A rank is ended and a fresh one spawned, between cases, once it has this many OS threads.
#: Threads accumulate in a long-lived rank: a gloo process group starts threads that outlive
#: ``destroy_process_group`` (3 a group with torch 2.13, measured; known upstream as
#: pytorch/pytorch#107298 and #40400), and an integer
#: ``reshard_after_forward`` makes fully_shard create a group per call (pytorch/pytorch#153302).
#: Thousands of cases in one rank then end in ``RuntimeError: Resource temporarily unavailable``
#: (EAGAIN) when a group is created: the host's thread limit, not a torch failure.
MAX_RANK_THREADS = 512


def parse_status(text: str) -> dict[str, float]:
    """``rss_mib`` and ``threads`` from the text of ``/proc/<pid>/status``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if key == "VmRSS" and parts:
            # The kernel always writes kB here.
            out["rss_mib"] = int(parts[0]) / 1024
        elif key == "Threads" and parts:
            out["threads"] = int(parts[0])
    return out


def sample_process(pid: int, *, proc: str = "/proc", fds: bool = True) -> dict[str, float]:
    """``rss_mib``, ``threads`` and (with ``fds``) ``fds`` of one live process; {} if it has gone."""
    try:
        with open(os.path.join(proc, str(pid), "status")) as f:
            out = parse_status(f.read())
        if fds:
            out["fds"] = len(os.listdir(os.path.join(proc, str(pid), "fd")))
    except (FileNotFoundError, ProcessLookupError):
        return {}
    return out


@dataclass
class ScriptOutcome:
    """What :meth:`RankPool.run_script` saw: per rank, the verdict line the script's function
    returned, or the exception it raised (``type: message`` and the traceback's last line), or
    why it has neither (``missing``: it died or missed the deadline)."""

    verdicts: dict[int, str]
    errors: dict[int, str]
    missing: dict[int, str]
    seconds: float
    #: Whether the ranks were ended and fresh ones spawned after it.
    respawned: bool
    #: The ranks that died in it: their exit status (-N for signal N) and what faulthandler
    #: wrote as they died.
    died: dict[int, tuple[int, str]] = field(default_factory=dict)
    #: The ranks that missed the deadline: their main thread's stack as last sampled.
    stuck: dict[int, str] = field(default_factory=dict)


@dataclass
class _Rank:
    rank: int
    proc: subprocess.Popen[bytes] | ForkedRank
    cmd: IO[bytes]
    res_fd: int
    stack_path: str
    log_path: str
    sample_path: str = ""
    buf: bytes = b""
    ready: Ready | None = None
    stack_offset: int = 0
    eof: bool = False


_live_pools: weakref.WeakSet[RankPool] = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    for pool in list(_live_pools):
        pool.close()


class RankPool:
    """N ranks in one process group, reused across cases.

    >>> with RankPool(world_size=2) as pool:
    ...     outcome = pool.run(case)

    ``backend`` is ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank, plus gloo for CPU tensors).
    ``gpus`` picks the GPUs for NCCL; by default the pool takes free ones, locking each so that
    other pools, in this process or any other, get disjoint GPUs. ``deadline`` is the default
    number of seconds a case may take. ``max_rank_threads``: after a case that ended ok, ranks
    are replaced by fresh ones once one of them has this many OS threads
    (:data:`MAX_RANK_THREADS`; ``None``: never, for the health check that measures the growth).
    ``hash_seed_per_rank``: each rank is forked from a zygote of its own slot (:mod:`fuzz.zygote`),
    so that the ranks hash strings differently, as processes started by torchrun do (iteration
    orders of sets of names then differ between ranks, as they would); False forks every rank
    from one zygote, one import of torch instead of ``world_size``, for a pool whose question
    does not depend on that (whether a check notices an injected fault).
    """

    def __init__(
        self,
        world_size: int = 2,
        backend: str = "gloo",
        *,
        gpus: list[int] | None = None,
        deadline: float = 60.0,
        start_timeout: float = 180.0,
        env: dict[str, str] | None = None,
        max_rank_threads: int | None = MAX_RANK_THREADS,
        hash_seed_per_rank: bool = True,
    ) -> None:
        if backend not in BACKENDS:
            raise InvalidArgument(f"backend={backend!r} is not one of {BACKENDS}")
        if not isinstance(world_size, int) or world_size < 1:
            raise InvalidArgument(f"world_size={world_size!r} must be a positive integer")
        if deadline <= 0:
            raise InvalidArgument(f"deadline={deadline!r} must be positive (seconds)")
        self.world_size = world_size
        self.backend = backend
        self.deadline = deadline
        self.start_timeout = start_timeout
        self.max_rank_threads = max_rank_threads
        self.hash_seed_per_rank = hash_seed_per_rank
        #: Fresh ranks spawned after a failure (``restarts``) and after ranks grew too many
        #: threads (``recycled``); ``_generation`` counts both.
        self.restarts = 0
        self.recycled = 0
        self._generation = 0
        self.cases_run = 0
        self.versions: dict[str, str] = {}
        self._extra_env = dict(env or {})
        self._ranks: list[_Rank] = []
        self._store: Any = None
        self._tmp = tempfile.mkdtemp(prefix="shardfuzz-pool-")
        self._gpu_locks: list[IO[bytes]] = []
        self._closed = False
        self._busy = False  # a case is in flight (the driver was interrupted inside run())
        self._case_id = 0
        #: Seconds of the slowest case of each property that ended ok on this pool.
        self.slowest: dict[str, float] = {}
        self.devices = self._pick_devices(gpus)
        _live_pools.add(self)

    # ----------------------------------------------------------------------------- lifecycle

    def __enter__(self) -> RankPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Spawn the ranks (if not running) without waiting for them to join."""
        if self._closed:
            raise PoolError("this pool is closed; make a new RankPool")
        if not self._ranks:
            self._spawn()

    def close(self, timeout: float = 10.0) -> None:
        """End every rank: ask them to stop, then SIGTERM, then SIGKILL, within ``timeout``."""
        if self._closed:
            return
        try:
            self._shutdown(timeout)
        except BaseException:  # a second Ctrl-C mid-shutdown: still end every rank
            self._kill_all()
            raise
        finally:
            self._closed = True
            for lock in self._gpu_locks:
                lock.close()
            self._gpu_locks = []
            shutil.rmtree(self._tmp, ignore_errors=True)
            _live_pools.discard(self)

    @property
    def pids(self) -> list[int]:
        return [r.proc.pid for r in self._ranks]

    # ----------------------------------------------------------------------------- running

    def hang_hold(self, prop: str) -> float:
        """Seconds every rank still in a case of ``prop`` must wait, unchanged, in a blocking call
        before the case is a hang: max(HANG_HOLD_MIN_S, HANG_HOLD_SLOWEST x the slowest case of
        ``prop`` that ended ok on this pool so far)."""
        return max(HANG_HOLD_MIN_S, HANG_HOLD_SLOWEST * self.slowest.get(prop, 0.0))

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the ranks to join; whether they have. Unlike
        :meth:`run`, a short wait neither raises nor ends ranks that are still starting."""
        self.start()
        if all(r.ready is not None for r in self._ranks):
            return True
        if timeout >= self.start_timeout:
            self._await_ready()
            return True
        end = time.monotonic() + max(0.0, timeout)
        while True:
            for r in self._ranks:
                if r.ready is None and (r.eof or r.proc.poll() is not None):
                    # a rank that exited while starting: PoolError with its output, or (killed by
                    # a signal) a fresh set of ranks started and waited for whole
                    self._await_ready()
                    return True
                for m in self._read(r):
                    if isinstance(m, Ready):
                        r.ready = m
                        self.versions = m.versions
            if all(r.ready is not None for r in self._ranks):
                return True
            left = end - time.monotonic()
            if left <= 0:
                return False
            sel = selectors.DefaultSelector()
            for r in self._ranks:
                if r.ready is None:
                    sel.register(r.res_fd, selectors.EVENT_READ)
            sel.select(min(left, 0.5))
            sel.close()

    def run(self, case: Case, *, deadline: float | None = None, stall: Stall | None = None) -> Outcome:
        """Run one case on every rank; never raises for anything the ranks do.

        ``stall``: a deadlock to recognise from the ranks' stacks before the deadline, besides
        the generic rule (:meth:`hang_hold`); a hang that both see carries the stall's name.
        """
        if case.world_size != self.world_size:
            raise InvalidArgument(
                f"case.world_size={case.world_size} does not match this pool's world_size={self.world_size}"
            )
        self.start()
        self._await_ready()
        limit = self.deadline if deadline is None else deadline
        self._case_id += 1
        msg = RunCase(case_id=self._case_id, case=case_to_json(case))
        start = time.monotonic()
        self._busy = True
        for r in self._ranks:
            r.stack_offset = size(r.stack_path)
            self._send(r, msg)
        watch = HangWatch(self.hang_hold(case.property))
        done, dead, stalled = self._collect(self._case_id, start, start + limit, stall, watch)
        self._busy = False
        outcome = self._judge_outcome(done, dead, time.monotonic() - start, stalled)
        self.cases_run += 1
        if outcome.ok:
            self.slowest[case.property] = max(self.slowest.get(case.property, 0.0), outcome.seconds)
            self._recycle_if_grown()
        else:
            self.respawn()
        return outcome

    def run_script(self, code: str, *, function: str = "attempt", deadline: float | None = None) -> ScriptOutcome:
        """Run a script's ``function(rank, world_size)`` on every rank (the printed scripts'
        differential tests, tests/test_repro_printed.py); never raises for anything the script does.

        ``code`` is executed on each rank as a module of its own, in the pool's process group.
        Once one rank has answered with a verdict or an exception, the others get
        :data:`FAILURE_GRACE_S` to answer too (under torchrun, a rank that exits ends the
        others' collectives; here it would wait in the next one). If every rank answered, they
        check that they are still in step and free the script's process groups (``Settle``);
        otherwise, or if that check fails, the ranks are ended and fresh ones spawned.
        """
        self.start()
        self._await_ready()
        limit = self.deadline if deadline is None else deadline
        self._case_id += 1
        case_id = self._case_id
        start = time.monotonic()
        self._busy = True
        for r in self._ranks:
            r.stack_offset = size(r.stack_path)
            self._send(r, RunScript(case_id=case_id, code=code, function=function))
        done = self._gather(ScriptDone, case_id, start + limit, grace=True)
        seconds = time.monotonic() - start
        healthy = len(done) == self.world_size
        if healthy:
            for r in self._ranks:
                self._send(r, Settle(case_id=case_id))
            settled = self._gather(Settled, case_id, time.monotonic() + SETTLE_TIMEOUT_S, grace=False)
            healthy = len(settled) == self.world_size and not any(m.error for m in settled.values())
        self._busy = False
        verdicts = {rank: m.verdict for rank, m in done.items() if m.verdict is not None}
        errors = {}
        for rank, m in done.items():
            if m.exc_type is not None:
                last = (m.traceback or "").strip().splitlines()[-1:] or [""]
                errors[rank] = f"{m.exc_type}: {m.message} ({last[0][:300]})"
        missing = {}
        died: dict[int, tuple[int, str]] = {}
        stuck: dict[int, str] = {}
        for r in self._ranks:
            if r.rank not in done:
                status = r.proc.poll()
                if status is None and r.eof:  # its pipe closed as it died: reap it
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        status = r.proc.wait(DEATH_REAP_S)
                missing[r.rank] = f"died with status {status}" if status is not None else "missed the deadline"
                if status is not None:
                    died[r.rank] = (status, read_from(r.stack_path, r.stack_offset))
                else:
                    stuck[r.rank] = self._sample(r, case_id)
        if not healthy:
            self.respawn()
        else:
            self._recycle_if_grown()
        self.cases_run += 1
        return ScriptOutcome(verdicts, errors, missing, seconds, respawned=not healthy, died=died, stuck=stuck)

    def _gather(self, kind: type, case_id: int, deadline: float, *, grace: bool) -> dict[int, Any]:
        """The messages of type ``kind`` for ``case_id`` from the ranks, by rank, until every rank
        sent one, died, or ``deadline`` passed (with ``grace``: or :data:`FAILURE_GRACE_S` after
        the first answer that is a verdict line or an exception, or the first rank's death: the
        others would wait for it in their next collective)."""
        got: dict[int, Any] = {}
        until = deadline
        sel = selectors.DefaultSelector()
        for r in self._ranks:
            if not r.eof:
                sel.register(r.res_fd, selectors.EVENT_READ, r)
        try:
            while len(got) < self.world_size and sel.get_map():
                now = time.monotonic()
                if now >= until:
                    break
                for key, _ in sel.select(until - now):
                    r = key.data
                    for m in self._read(r):
                        if isinstance(m, kind) and getattr(m, "case_id", None) == case_id:
                            got[r.rank] = m
                            if grace and (getattr(m, "verdict", None) or getattr(m, "exc_type", None)):
                                until = min(until, time.monotonic() + FAILURE_GRACE_S)
                    if r.eof:
                        sel.unregister(r.res_fd)
                        if grace and r.rank not in got:
                            until = min(until, time.monotonic() + FAILURE_GRACE_S)
        finally:
            sel.close()
        return got

    def _collect(
        self, case_id: int, start: float, deadline: float, stall: Stall | None, watch: HangWatch | None = None
    ) -> tuple[dict[int, CaseDone], set[int], str | None]:
        """The ranks' answers to case ``case_id`` by rank, the ranks that died, and the stall that
        ended the case, by :class:`fuzz.verdict.Collect`'s rule over the ranks' pipes."""
        done: dict[int, CaseDone] = {}
        rule = Collect(self.world_size, start, deadline, stall, watch, HANG_LOOK_AFTER_S)
        sel = selectors.DefaultSelector()
        for r in self._ranks:
            sel.register(r.res_fd, selectors.EVENT_READ, r)
        try:
            while rule.waiting(now := time.monotonic()):
                if rule.wants_samples(now):
                    samples = [None if rule.over(r.rank) else self._sample(r, case_id) for r in self._ranks]
                    if rule.look(samples, now) is not None:
                        break
                for key, _ in sel.select(max(0.0, rule.wake(now) - now)):
                    r = key.data
                    for m in self._read(r):
                        if isinstance(m, CaseDone) and m.case_id == case_id:
                            done[r.rank] = m
                            rule.report(r.rank, m.exc_type is not None, time.monotonic())
                    if r.eof:
                        sel.unregister(r.res_fd)
                        if r.rank not in done:
                            rule.death(r.rank, time.monotonic())
        finally:
            sel.close()
        return done, rule.dead, rule.stalled

    def _sample(self, r: _Rank, case_id: int) -> str:
        """The latest main-thread stack that rank ``r`` sampled in case ``case_id`` ("" if none)."""
        try:
            with open(r.sample_path, encoding="utf-8", errors="replace") as f:
                head, _, stack = f.read().partition("\n")
        except OSError:
            return ""
        return stack if head == str(case_id) else ""

    def _judge_outcome(
        self, done: dict[int, CaseDone], dead: set[int], seconds: float, stalled: str | None = None
    ) -> Outcome:
        stuck = [r for r in self._ranks if r.rank not in done and r.rank not in dead]
        if stuck:
            self._dump_stacks(stuck)
        if dead or stuck:
            self._kill_all()  # a dead rank's exit status is known only once it is reaped
        reports = []
        for r in self._ranks:
            m = done.get(r.rank)
            stack = read_from(r.stack_path, r.stack_offset) or None
            if m is not None:
                reports.append(
                    RankReport(
                        rank=r.rank,
                        observation=m.observation,
                        exc_type=m.exc_type,
                        message=m.message,
                        traceback=m.traceback,
                        stack=stack,
                        seconds=m.seconds,
                        stats=m.stats,
                    )
                )
            else:
                status = r.proc.returncode if r.rank in dead else None
                reports.append(RankReport(rank=r.rank, stack=stack, exit_status=status, output_tail=tail(r.log_path)))
        if dead:
            kind = OutcomeKind.CRASH
        elif any(m.exc_type for m in done.values()):
            kind = OutcomeKind.EXCEPTION
        elif stuck:
            kind = OutcomeKind.HANG
        else:
            kind = OutcomeKind.OK
        return Outcome(kind=kind, ranks=tuple(reports), seconds=seconds, stalled=stalled if stuck else None)

    # ----------------------------------------------------------------------------- internals

    def _pick_devices(self, gpus: list[int] | None) -> list[str]:
        if self.backend == "gloo":
            if gpus:
                raise InvalidArgument(f"gpus={gpus!r} only applies to backend='nccl'")
            return ["cpu"] * self.world_size
        import torch

        count = torch.cuda.device_count()
        if count == 0:
            raise InvalidArgument("backend='nccl' needs CUDA GPUs and this host has none; use backend='gloo'")
        if gpus is not None:
            if len(gpus) != self.world_size or any(not 0 <= g < count for g in gpus):
                raise InvalidArgument(f"gpus={gpus!r} must name {self.world_size} distinct GPUs among 0..{count - 1}")
            chosen = list(gpus)
        else:
            chosen = self._lock_free_gpus(count)
        return [f"cuda:{g}" for g in chosen]

    def _lock_free_gpus(self, count: int) -> list[int]:
        lock_dir = os.path.join(tempfile.gettempdir(), "shardfuzz-gpu-locks")
        os.makedirs(lock_dir, exist_ok=True)
        chosen: list[int] = []
        for g in range(count):
            f: IO[bytes] = open(os.path.join(lock_dir, f"gpu{g}.lock"), "wb")  # noqa: SIM115 - held while the pool lives
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                continue
            self._gpu_locks.append(f)
            chosen.append(g)
            if len(chosen) == self.world_size:
                return chosen
        for f in self._gpu_locks:
            f.close()
        self._gpu_locks = []
        raise PoolError(
            f"world_size={self.world_size} needs {self.world_size} free GPUs; {len(chosen)} of {count} are free "
            "(other pools hold the rest); run fewer pools at once or a smaller world size"
        )

    def _spawn(self) -> None:
        from torch.distributed import TCPStore

        self._store = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=120), wait_for_workers=False)
        env = {**RANK_ENV_DEFAULTS, **os.environ, **self._extra_env}
        # The rank must import this very checkout of fuzz, also when it is not installed.
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        generation = self._generation
        # Forked from this process's zygotes (fuzz.zygote), all asked for before the first fork
        # so that they import torch side by side; started from scratch where that cannot be.
        zygotes = None
        if zygotes_wanted(env):
            slots = range(self.world_size) if self.hash_seed_per_rank else [0] * self.world_size
            zygotes = [zygote_for(slot, env, usual=not self._extra_env) for slot in slots]
        for rank in range(self.world_size):
            cmd_r, cmd_w = os.pipe()
            res_r, res_w = os.pipe()
            stack_path = os.path.join(self._tmp, f"rank{rank}.g{generation}.stack")
            log_path = os.path.join(self._tmp, f"rank{rank}.g{generation}.log")
            sample_path = os.path.join(self._tmp, f"rank{rank}.g{generation}.sample")
            rank_env = {
                **env,
                "SHARDFUZZ_RANK": str(rank),
                "SHARDFUZZ_WORLD_SIZE": str(self.world_size),
                "SHARDFUZZ_BACKEND": self.backend,
                "SHARDFUZZ_DEVICE": self.devices[rank],
                "SHARDFUZZ_STORE_PORT": str(self._store.port),
                "SHARDFUZZ_PARENT_PID": str(os.getpid()),
                "SHARDFUZZ_STACK_FILE": stack_path,
                "SHARDFUZZ_SAMPLE_FILE": sample_path,
                "SHARDFUZZ_CMD_FD": str(cmd_r),
                "SHARDFUZZ_RES_FD": str(res_w),
            }
            with open(log_path, "wb") as log:
                proc: subprocess.Popen[bytes] | ForkedRank | None = None
                if zygotes is not None:
                    try:
                        proc = zygotes[rank].fork(rank_env, (cmd_r, res_w, log.fileno()))
                    except ZygoteError as e:
                        zygotes = None
                        print(f"shardfuzz: ranks start from scratch: {e}", file=sys.stderr)
                if proc is None:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "fuzz._rank.worker"],
                        env=rank_env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        pass_fds=(cmd_r, res_w),
                    )
            os.close(cmd_r)
            os.close(res_w)
            os.set_blocking(res_r, False)
            self._ranks.append(
                _Rank(rank, proc, os.fdopen(cmd_w, "wb", buffering=0), res_r, stack_path, log_path, sample_path)
            )

    def _await_ready(self) -> None:
        """Wait for every rank to join. A rank killed by a signal while starting (from outside the
        pool: an operator's kill, the OOM killer; seen in tests that signal the ranks of a campaign
        whose pool respawns often) is replaced by a fresh set, up to :data:`START_KILLS` times in a
        row; a rank that exits with a status of its own ends the start at once (it would again)."""
        for kills_left in range(START_KILLS, -1, -1):
            died = self._await_ready_once()
            if died is None:
                return
            status, message = died
            if status >= 0 or kills_left == 0:
                raise PoolError(message)
            self.respawn()

    def _await_ready_once(self) -> tuple[int, str] | None:
        """None once every rank has joined; else the exit status of a rank that died while
        starting, with the error to raise (the other ranks are ended)."""
        deadline = time.monotonic() + self.start_timeout
        for r in self._ranks:
            while r.ready is None:
                if r.eof or r.proc.poll() is not None:
                    status = r.proc.wait()
                    message = (
                        f"rank {r.rank} exited with status {status} while starting; its output:\n{tail(r.log_path)}"
                    )
                    self._kill_all()
                    return status, message
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._kill_all()
                    raise PoolError(f"rank {r.rank} did not join the process group within {self.start_timeout}s")
                sel = selectors.DefaultSelector()
                sel.register(r.res_fd, selectors.EVENT_READ)
                sel.select(min(remaining, 0.5))
                sel.close()
                for m in self._read(r):
                    if isinstance(m, Ready):
                        r.ready = m
                        self.versions = m.versions
        return None

    def _read(self, r: _Rank) -> list[Any]:
        """Read what is available from one rank's result pipe and parse whole lines."""
        if r.eof:
            return []
        try:
            data = os.read(r.res_fd, 1 << 20)
        except BlockingIOError:
            return []
        if not data:
            r.eof = True
            return []
        r.buf += data
        *lines, r.buf = r.buf.split(b"\n")
        out = []
        for line in lines:
            try:
                out.append(decode(line))
            except ValueError:  # garbage on the result pipe: treat the rank as broken
                r.eof = True
                r.proc.kill()
        return out

    def _send(self, r: _Rank, msg: Any) -> None:
        try:
            r.cmd.write(encode(msg))
        except (OSError, ValueError):  # ValueError: the pipe was closed on our side
            r.eof = True  # it died; _collect will see the closed result pipe

    def _dump_stacks(self, ranks: list[_Rank]) -> None:
        for r in ranks:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGUSR1)
        end = time.monotonic() + STACK_DUMP_WAIT_S
        sizes: dict[int, int] = {}
        while time.monotonic() < end:  # wait until every dump has started and stopped growing
            time.sleep(0.05)
            now = {r.rank: size(r.stack_path) for r in ranks}
            if now == sizes and all(now[r.rank] > r.stack_offset for r in ranks):
                break
            sizes = now

    def _kill_all(self) -> None:
        for r in self._ranks:
            if r.proc.poll() is None:
                r.proc.kill()
        for r in self._ranks:
            r.proc.wait()

    def respawn(self) -> None:
        """End the ranks and spawn fresh ones (what a script left behind in torch goes with them)."""
        self.restarts += 1
        self._replace_ranks(kill=True, timeout=0)

    def rank_threads(self) -> list[int | None]:
        """OS threads of each rank now (``/proc``), None where that cannot be read."""
        out: list[int | None] = []
        for r in self._ranks:
            threads = sample_process(r.proc.pid, fds=False).get("threads") if r.proc.poll() is None else None
            out.append(None if threads is None else int(threads))
        return out

    def _recycle_if_grown(self) -> None:
        """Between cases: stop the ranks and spawn fresh ones if one has
        :attr:`max_rank_threads` threads or more (:data:`MAX_RANK_THREADS` says why)."""
        if self.max_rank_threads is None:
            return
        if not any(n is not None and n >= self.max_rank_threads for n in self.rank_threads()):
            return
        self.recycled += 1
        self._replace_ranks(kill=False, timeout=10.0)

    def _replace_ranks(self, *, kill: bool, timeout: float) -> None:
        """End the ranks (:meth:`_teardown_ranks`) and spawn a new generation of them."""
        self._teardown_ranks(kill=kill, timeout=timeout)
        self._generation += 1
        self._spawn()

    def _shutdown(self, timeout: float) -> None:
        self._teardown_ranks(kill=False, timeout=timeout)

    def _teardown_ranks(self, *, kill: bool, timeout: float) -> None:
        end = time.monotonic() + timeout
        if kill:
            self._kill_all()
        else:
            # A rank still starting has nothing to finish: it is ended at once, not after it has
            # joined the process group only to read the stop message (seconds of imports).
            for r in self._ranks:
                if r.ready is None and r.proc.poll() is None:
                    r.proc.kill()
            if not self._busy:  # ranks in the middle of a case would not read the stop message
                for r in self._ranks:
                    if r.ready is not None:
                        self._send(r, Stop())
                _wait_all([r.proc for r in self._ranks], end - 0.4 * timeout)
            for r in self._ranks:
                if r.proc.poll() is None:
                    r.proc.terminate()
            _wait_all([r.proc for r in self._ranks], end)
            self._kill_all()
        # Forget the ranks before closing their pipes: a teardown interrupted here and run again
        # by close() must not close the descriptors twice (by then they may be someone else's).
        ranks, self._ranks, self._store = self._ranks, [], None
        for r in ranks:
            r.cmd.close()
            os.close(r.res_fd)


def _wait_all(procs: list[subprocess.Popen[bytes] | ForkedRank], until: float) -> None:
    for p in procs:
        remaining = until - time.monotonic()
        if remaining <= 0:
            return
        try:
            p.wait(remaining)
        except subprocess.TimeoutExpired:
            return
