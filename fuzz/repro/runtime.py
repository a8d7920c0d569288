"""What a reproducer script runs: the case on every rank under torchrun, judged on rank 0.

This module is carried into every script verbatim (``fuzz/repro/script.py`` reads it from its
file), beside the rank side's modules and the property's judge. It imports only the standard
library at module level; torch and the carried modules when it runs.

Each rank runs the body's rank program as a rank of the pool does (:func:`fuzz._rank.programs.run_case`,
then :meth:`fuzz._rank.context.RankContext.end_case`), with its :class:`~fuzz._rank.context.RankContext`
built from torchrun's environment, and writes what it did (an observation, or the exception
with its traceback) to a directory all ranks share. Rank 0 watches that directory from a
thread as the pool's driver watches its ranks (:mod:`fuzz.pool`): a rank that raised gives the
others :data:`fuzz.verdict.FAILURE_GRACE_S` to report; a rank that died (faulthandler's fatal-error text in
its stack file, or its process gone) makes the case a crash; ranks still in the case at the
deadline, or in the property's :class:`~fuzz.verdict.Stall` for its ``hold``, are stuck, and
write their main thread's stack (and every thread's, to stderr). Rank 0 then builds the
:class:`~fuzz.verdict.Outcome` the pool would have built and judges it with the property's own
judge. The exit status is 1 iff the judge's failure is the entry's: the same signature, or for
a ``known`` entry the same bug (:func:`fuzz.signature.same_bug`); 0 where the case passes; 2 for
bad input, a failure that is not the entry's, or a run that could not be judged.

Under torchrun the exit status of the whole run is 1 whenever any rank exits non-zero or dies.
``python FILE.py`` (not under torchrun) starts torchrun itself and exits with rank 0's status.
Every process ends with ``os._exit`` once rank 0 has judged: ranks stuck in a collective never
return from it, and backend threads can block an interpreter's teardown.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

#: The pool's default case deadline (``--deadline``).
DEFAULT_TIMEOUT_S = 60.0
#: How often rank 0 looks at the shared directory, and the other ranks for its verdict.
POLL_S = 0.05
#: How long rank 0 waits for stuck ranks to write their stacks.
DUMP_WAIT_S = 5.0
#: faulthandler's fatal errors and the signals behind them.
FATAL_SIGNALS = {
    "Segmentation fault": signal.SIGSEGV,
    "Aborted": signal.SIGABRT,
    "Bus error": signal.SIGBUS,
    "Floating-point exception": signal.SIGFPE,
    "Floating point exception": signal.SIGFPE,
    "Illegal instruction": signal.SIGILL,
}
#: The case number the ranks' stack samplers write (fuzz._rank.worker.Sampler).
CASE_ID = 1


def main(case_text: str, expected: dict[str, Any], argv: list[str] | None = None) -> int:
    """Run the script: ``case_text`` is the case as JSON, ``expected`` what the entry recorded
    (``signature``, ``signatures`` with its aliases, ``known``, ``property``, ``world_size``,
    ``judge``: the module that registers the property)."""
    parser = argparse.ArgumentParser(description="reproduce one shardfuzz corpus entry under torchrun")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=os.environ.get("REPRO_BACKEND", "gloo"))
    parser.add_argument(
        "--timeout",
        type=float,
        default=float(os.environ.get("REPRO_TIMEOUT", DEFAULT_TIMEOUT_S)),
        help=f"seconds before ranks still in the case are stuck: a hang (default {DEFAULT_TIMEOUT_S:g})",
    )
    args = parser.parse_args(argv)
    if os.environ.get("REPRO_JUDGE"):
        return judge_process(case_text, expected, os.environ["REPRO_JUDGE"], args.timeout)
    if "LOCAL_RANK" not in os.environ:
        # Bad input is refused here, once, before any rank starts: under torchrun the first
        # rank to refuse ends the others, and rank 0 may not get to report it.
        problem = _input_problem(case_text, args.backend)
        if problem is not None:
            print(f"repro: error: {problem}", file=sys.stderr)
            return 2
        return launch(int(expected["world_size"]), argv if argv is not None else sys.argv[1:])
    return run_rank(case_text, expected, args.backend)


def launch(world_size: int, argv: list[str]) -> int:
    """Not under torchrun: start it on this host and exit with rank 0's status."""
    with tempfile.TemporaryDirectory(prefix="shardfuzz-repro-") as tmp:
        status_file = os.path.join(tmp, "status")
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
        command += [str(world_size), os.path.abspath(sys.argv[0]), *argv]
        code = subprocess.call(command, env={**os.environ, "REPRO_STATUS_FILE": status_file})
        try:
            with open(status_file) as f:
                return int(f.read())
        except (OSError, ValueError):
            return code or 1


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _exit(code: int) -> None:
    """End this process now (see the module's docstring)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def _status(code: int) -> int:
    path = os.environ.get("REPRO_STATUS_FILE")
    if path:
        with open(path, "w") as f:
            f.write(str(code))
    return code


def _input_problem(case_text: str, backend: str) -> str | None:
    """Why the script cannot run its case on this host, or None."""
    try:
        decode(case_text)
    except ValueError as e:
        return f"the case does not decode: {_one_line(e)}"
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            return "--backend nccl needs CUDA, and torch.cuda.is_available() is False here"
    return None


def decode(case_text: str) -> Any:
    """The case; ValueError (json.JSONDecodeError, fuzz.errors.CaseError) if it does not decode."""
    from fuzz.model import case_from_json

    return case_from_json(json.loads(case_text))


def run_rank(case_text: str, expected: dict[str, Any], backend: str) -> int:
    """One rank under torchrun: run the case, write what it did, wait for the judge's verdict."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    needed = int(expected["world_size"])

    def refuse(message: str) -> int:
        if rank == 0:
            print(f"repro: error: {message}", file=sys.stderr)
            return _status(2)
        return 2

    if world_size != needed:
        return refuse(f"this case needs {needed} ranks (torchrun --nproc-per-node {needed}), not {world_size}")
    try:
        case = decode(case_text)
    except ValueError as e:
        return refuse(f"the case does not decode: {_one_line(e)}")
    import torch

    if backend == "nccl" and not torch.cuda.is_available():
        return refuse("--backend nccl needs CUDA, and torch.cuda.is_available() is False here")
    from datetime import timedelta

    import torch.distributed as dist

    from fuzz._rank.context import RankContext
    from fuzz._rank.programs import run_case
    from fuzz._rank.worker import Sampler

    shared: list[Any] = [None]
    if rank == 0:  # the judge: a process of its own, so that it outlives a rank that dies
        shared[0] = tempfile.mkdtemp(prefix="shardfuzz-repro-")
        print(_versions(torch, backend, world_size), flush=True)
        judge_proc = subprocess.Popen(
            [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]], env={**os.environ, "REPRO_JUDGE": shared[0]}
        )
        with open(os.path.join(shared[0], "judge-pid"), "w") as f:
            f.write(str(judge_proc.pid))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # As the pool's ranks (fuzz/_rank/worker.py): CPU tensors take part in collectives under nccl too.
    dist.init_process_group("cpu:gloo,cuda:nccl" if backend == "nccl" else "gloo", timeout=timedelta(minutes=30))
    ctx = RankContext(rank=rank, world_size=world_size, device=device, backend=backend)
    dist.broadcast_object_list(shared, src=0)
    run = Shared(str(shared[0]), world_size)
    stack_file = open(run.path("stack", rank), "w")  # noqa: SIM115 - lives as long as the rank
    faulthandler.enable(file=stack_file, all_threads=True)
    with open(run.path("pid", rank), "w") as f:
        f.write(str(os.getpid()))
    # torchrun ends the other ranks when one dies; they stay until the judge has judged.
    signal.signal(signal.SIGTERM, lambda *_: None)
    sampler = Sampler(run.path("sample", rank))
    sampler.start()
    threading.Thread(target=_watch, args=(run, rank), name="repro-watch", daemon=True).start()
    dist.barrier()  # every rank watched before the case starts
    if rank == 0:
        run.write("start", None, time.time())
    sampler.case = (CASE_ID, time.monotonic())
    began = time.perf_counter()
    report: dict[str, Any]
    try:
        observation = run_case(case, ctx)
        ctx.end_case()
        report = {"observation": observation}
    except BaseException as e:
        report = {
            "exc_type": f"{type(e).__module__}.{type(e).__qualname__}",
            "message": str(e)[:4000],
            "traceback": traceback.format_exc()[-20000:],
        }
    report["seconds"] = time.perf_counter() - began
    sampler.case = None
    run.write("report", rank, report)
    while True:  # this rank's watcher ends the process on the verdict
        time.sleep(3600)


def _versions(torch: Any, backend: str, world_size: int) -> str:
    device = torch.cuda.get_device_name(0) if backend == "nccl" else "cpu"
    python = sys.version.split()[0]
    return f"torch {torch.__version__}, Python {python}, backend {backend}, {world_size} ranks, device {device}"


class Shared:
    """The directory the ranks of one run share: per rank its pid, its faulthandler output
    (``stack``), its stack samples, its report, and its stack when stuck; rank 0's ``dump``
    request and ``verdict``."""

    def __init__(self, root: str, world_size: int) -> None:
        self.root = root
        self.world_size = world_size

    def path(self, what: str, rank: int | None = None) -> str:
        return os.path.join(self.root, what if rank is None else f"{what}-{rank}")

    def write(self, what: str, rank: int | None, value: Any) -> None:
        path = self.path(what, rank)
        with open(path + ".tmp", "w") as f:
            json.dump(value, f)
        os.replace(path + ".tmp", path)

    def read(self, what: str, rank: int | None = None) -> Any:
        try:
            with open(self.path(what, rank)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def text(self, what: str, rank: int) -> str:
        try:
            with open(self.path(what, rank), encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def sample(self, rank: int) -> str:
        """The latest main-thread stack that ``rank`` sampled ("" if none), as fuzz.pool reads it."""
        head, _, stack = self.text("sample", rank).partition("\n")
        return stack if head == str(CASE_ID) else ""

    def died(self, rank: int) -> int | None:
        """The exit status of a rank that died (negative: the signal), else None."""
        text = self.text("stack", rank)
        for name, sig in FATAL_SIGNALS.items():
            if f"Fatal Python error: {name}" in text:
                return -int(sig)
        pid = self.read("pid", rank)
        if isinstance(pid, int) and not _alive(pid):
            return 1  # gone without a fatal signal faulthandler saw: its status is torchrun's to know
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def main_thread_stack() -> str:
    """The main thread's Python stack in faulthandler's format, as the pool's ranks write it on
    SIGUSR1 (the main thread is then faulthandler's current thread)."""
    main = threading.main_thread()
    frame = sys._current_frames().get(main.ident or 0)
    lines = [f"Current thread 0x{main.ident or 0:016x} (most recent call first):"]
    while frame is not None:
        lines.append(f'  File "{frame.f_code.co_filename}", line {frame.f_lineno} in {frame.f_code.co_name}')
        frame = frame.f_back
    return "\n".join(lines) + "\n"


def _watch(run: Shared, rank: int) -> None:
    """Every rank: on the judge's ``dump`` request, a rank still in the case writes its main
    thread's stack (and every thread's to stderr); on the verdict the process ends, rank 0's
    with the verdict's status. A judge gone without a verdict ends it with 1."""
    dumped = False
    judge_pid = run.read("judge-pid")
    while True:
        time.sleep(POLL_S)
        verdict = run.read("verdict")
        if verdict is not None or not os.path.isdir(run.root):
            if rank == 0:
                from fuzz.model import dcp_root

                shutil.rmtree(dcp_root(os.environ.get("SHARDFUZZ_PARENT_PID", os.getppid())), ignore_errors=True)
            _exit(int(verdict) if rank == 0 and isinstance(verdict, int) else 0)
        if isinstance(judge_pid, int) and not _alive(judge_pid) and run.read("verdict") is None:
            print(f"repro: error: rank {rank}: the judge process ended without a verdict", file=sys.stderr)
            _exit(2)
        if not dumped and os.path.exists(run.path("dump")):
            dumped = True
            if not os.path.exists(run.path("report", rank)):
                run.write("stuck", rank, {"stack": main_thread_stack()})
                print(f"--- rank {rank} is still in the case; its threads:", file=sys.stderr, flush=True)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def judge_process(case_text: str, expected: dict[str, Any], root: str, timeout: float) -> int:
    """The judge, a child of rank 0: wait for the case to start and end on every rank, judge it,
    say what happened, and hand the verdict to the ranks."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # torchrun signals rank 0's process group
    run = Shared(root, int(expected["world_size"]))
    code = 2
    try:
        case = decode(case_text)
        until = time.monotonic() + timeout
        while run.read("start") is None:
            if time.monotonic() >= until or run.died(0) is not None:
                print("repro: error: the ranks never started the case", file=sys.stderr)
                raise SystemExit(2)
            time.sleep(POLL_S)
        code = judge(run, case, expected, time.monotonic(), timeout)
    except SystemExit as e:
        code = int(e.code or 0)
    except BaseException:
        traceback.print_exc()
        print("repro: error: the script could not judge the case (above)", file=sys.stderr)
    _status(code)
    sys.stdout.flush()
    run.write("verdict", None, code)
    time.sleep(1.0)  # the ranks see the verdict, then the directory goes
    shutil.rmtree(run.root, ignore_errors=True)
    return code


def collect(
    run: Shared, start: float, deadline: float, stall: Any
) -> tuple[dict[int, dict[str, Any]], dict[int, int], str | None]:
    """Reports by rank, dead ranks with their exit status, and the stall that ended the case, by
    :class:`fuzz.verdict.Collect`'s rule (the pool's) over the shared directory."""
    from fuzz.verdict import Collect

    done: dict[int, dict[str, Any]] = {}
    dead: dict[int, int] = {}
    rule = Collect(run.world_size, start, deadline, stall)
    while rule.waiting(now := time.monotonic()):
        if rule.wants_samples(now):
            samples = [None if rule.over(r) else run.sample(r) for r in range(run.world_size)]
            if rule.look(samples, now) is not None:
                break
        for r in range(run.world_size):
            if rule.over(r):
                continue
            report = run.read("report", r)
            status = None if report is not None else run.died(r)
            if report is not None:
                done[r] = report
                rule.report(r, bool(report.get("exc_type")), time.monotonic())
            elif status is not None:
                dead[r] = status
                rule.death(r, time.monotonic())
        time.sleep(POLL_S)
    return done, dead, rule.stalled


def outcome_of(run: Shared, start: float, timeout: float, stall: Any) -> Any:
    """The :class:`~fuzz.verdict.Outcome` the pool builds (fuzz.pool.RankPool._judge_outcome)."""
    from fuzz.verdict import Outcome, OutcomeKind, RankReport

    done, dead, stalled = collect(run, start, start + timeout, stall)
    stuck = [r for r in range(run.world_size) if r not in done and r not in dead]
    stacks: dict[int, str] = {}
    if stuck:
        run.write("dump", None, stuck)
        until = time.monotonic() + DUMP_WAIT_S
        while time.monotonic() < until and any(run.read("stuck", r) is None for r in stuck):
            time.sleep(POLL_S)
        for r in stuck:
            written = run.read("stuck", r)
            stacks[r] = written["stack"] if written else ""
    reports = []
    for r in range(run.world_size):
        m = done.get(r)
        fatal = run.text("stack", r) or None
        if m is not None:
            reports.append(
                RankReport(
                    rank=r,
                    observation=m.get("observation"),
                    exc_type=m.get("exc_type"),
                    message=m.get("message"),
                    traceback=m.get("traceback"),
                    stack=fatal,
                    seconds=m.get("seconds"),
                )
            )
        elif r in dead:
            reports.append(RankReport(rank=r, stack=fatal, exit_status=dead[r]))
        else:
            reports.append(RankReport(rank=r, stack=stacks.get(r) or fatal))
    if dead:
        kind = OutcomeKind.CRASH
    elif any(m.get("exc_type") for m in done.values()):
        kind = OutcomeKind.EXCEPTION
    elif stuck:
        kind = OutcomeKind.HANG
    else:
        kind = OutcomeKind.OK
    seconds = time.monotonic() - start
    return Outcome(kind=kind, ranks=tuple(reports), seconds=seconds, stalled=stalled if stuck else None)


def reproduces(expected: dict[str, Any], signature: str) -> bool:
    """Whether a failure signed ``signature`` is the entry's: one of its signatures, or for a
    ``known`` entry the same bug met another way (fuzz.corpus matches entries so)."""
    from fuzz.signature import same_bug

    signatures = list(expected["signatures"])
    if signature in signatures:
        return True
    return bool(expected.get("known")) and any(same_bug(s, signature) for s in signatures)


def judge(run: Shared, case: Any, expected: dict[str, Any], start: float, timeout: float) -> int:
    """Rank 0: wait for the case on every rank, judge it as the property does, say what happened."""
    import importlib

    defined = importlib.import_module(expected["judge"]).PROPERTIES  # only the case's property module
    prop = next(p for p in defined if p.name == case.property)
    outcome = outcome_of(run, start, timeout, prop.stall)
    failure = prop.judge(case, outcome)
    _save_observations(outcome, failure)
    print(f"outcome: {outcome.kind.value} after {outcome.seconds:.1f} s")
    if failure is None:
        print(f"PASS: the case passes here; the entry's failure ({expected['signature']}) did not reproduce")
        return 0
    if failure.kind != "mismatch":
        print(outcome.describe()[-6000:])
    check = failure.details.get("check") if isinstance(failure.details, dict) else None
    said = f"{failure.signature}{f' ({check})' if check else ''}: {failure.summary}"
    if reproduces(expected, failure.signature):
        print(f"REPRODUCED {said}")
        return 1
    print(f"FAIL (not the entry's failure, {expected['signature']}): {said}")
    return 2


def _save_observations(outcome: Any, failure: Any) -> None:
    """For shardfuzz's own tests (REPRO_OBSERVATIONS=FILE): every rank's observation, the
    outcome, the failure, and where each shardfuzz module in this process came from."""
    path = os.environ.get("REPRO_OBSERVATIONS")
    if not path:
        return
    modules = {
        name: getattr(getattr(module, "__spec__", None), "origin", None)
        for name, module in list(sys.modules.items())
        if name == "fuzz" or name.startswith("fuzz.")
    }
    data = {
        "observations": outcome.observations,
        "kind": outcome.kind.value,
        "signature": failure.signature if failure is not None else None,
        "modules": modules,
        "top_level": sorted({name.split(".")[0] for name in sys.modules}),
    }
    with open(path, "w") as f:
        json.dump(data, f)
