"""Killing the driver in the middle of a case leaves no rank process behind.

A small driver script starts a pool, runs one clean case (so the ranks are up), prints their pids
and then runs a case in which every rank sleeps for a minute. The test sends one signal to the
driver alone, then checks that the driver and every rank are gone, whichever mechanism ends
them: the pool's ``close()`` as ``KeyboardInterrupt`` unwinds ``with RankPool(...)`` (SIGINT),
or ``PR_SET_PDEATHSIG`` once the driver is dead (SIGTERM, SIGKILL: no Python code runs).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import kill_leftovers, pid_alive, wait_gone

ROOT = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 90.0
EXIT_TIMEOUT_S = 15.0

DRIVER = textwrap.dedent(
    """
    import json
    import os
    import signal
    import sys

    # A process started in the background by a shell without job control inherits SIGINT
    # ignored, and then Python installs no handler for it; put back what a terminal gives it.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

    from fuzz.model import Case, FaultAction, FaultBody
    from fuzz.pool import RankPool

    def case(action, seconds=0.0):
        body = FaultBody(action=action, rank=0, seconds=seconds)
        return Case(property="_fault", world_size=2, seed=0, body=body)

    with RankPool(world_size=2, backend="gloo", deadline=120.0) as pool:
        warmup = pool.run(case(FaultAction.NONE))
        assert warmup.ok, warmup.describe()
        print(json.dumps({"driver": os.getpid(), "ranks": pool.pids}), flush=True)
        pool.run(case(FaultAction.SLEEP, seconds=60.0))
    print("the sleep case finished: the driver was never interrupted", flush=True)
    sys.exit(5)
    """
)


def read_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    """One line of the driver's stdout, or b"" if it exits or stays silent for ``timeout``."""
    assert proc.stdout is not None
    buf = b""
    end = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in buf:
            remaining = end - time.monotonic()
            if remaining <= 0 or not sel.select(remaining):
                break
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
    return buf


@pytest.mark.parametrize(
    "sig",
    [
        # close() first waits for the busy ranks to take its stop message (6 s), then SIGTERMs them.
        pytest.param(signal.SIGINT, marks=pytest.mark.slow),
        signal.SIGTERM,
        signal.SIGKILL,
    ],
    ids=lambda s: s.name,
)
def test_killing_the_driver_mid_case_leaves_no_rank_behind(tmp_path: Path, sig: signal.Signals) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    stderr_path = tmp_path / "driver.stderr"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    rank_pids: list[int] = []
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(script)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            cwd=tmp_path,
            start_new_session=True,  # signals reach only what the test sends them to
        )
    try:
        line = read_line(proc, STARTUP_TIMEOUT_S)
        assert line, f"the driver printed no pids; stderr:\n{stderr_path.read_text(errors='replace')}"
        info = json.loads(line)
        assert info["driver"] == proc.pid
        rank_pids = info["ranks"]
        assert len(rank_pids) == 2 and proc.pid not in rank_pids

        time.sleep(0.5)  # the sleep case is now in flight on every rank
        assert proc.poll() is None, f"the driver ended early; stderr:\n{stderr_path.read_text(errors='replace')}"
        assert all(pid_alive(p) for p in rank_pids), "a rank died before the driver was signalled"

        sent = time.monotonic()
        os.kill(proc.pid, sig)
        try:
            status = proc.wait(EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the driver did not exit within {EXIT_TIMEOUT_S}s of {sig.name}")
        if sig is not signal.SIGINT:
            assert status == -sig  # the default action: no Python code ran
        assert status != 5, "the driver finished the sleep case instead of being interrupted"

        alive = wait_gone(rank_pids, max(EXIT_TIMEOUT_S - (time.monotonic() - sent), 0.0))
        assert not alive, (
            f"rank processes {alive} outlived the driver by {EXIT_TIMEOUT_S}s after {sig.name}; "
            f"driver stderr:\n{stderr_path.read_text(errors='replace')[-3000:]}"
        )
    finally:
        kill_leftovers(proc, rank_pids)
        if proc.stdout is not None:
            proc.stdout.close()
