"""A stop request that outlives the KeyboardInterrupt carrying it.

The command line handles SIGINT and SIGTERM with :func:`request_stop`: the request is recorded,
then KeyboardInterrupt unwinds as Ctrl-C does. Long loops (:func:`fuzz.explore.explore`) call
:func:`raise_if_stopped` before each step, so a KeyboardInterrupt lost on the way (raised inside a
finalizer, where Python prints and drops it, or turned into another exception by code it passes
through) still stops them.
"""

from __future__ import annotations

from typing import Any

_signum: list[int] = []


def request_stop(signum: int, frame: Any = None) -> None:
    """Signal handler: record the request, then raise KeyboardInterrupt."""
    if not _signum:
        _signum.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


def stop_requested() -> bool:
    return bool(_signum)


def stop_signal() -> int | None:
    """The signal of the recorded request, or None."""
    return _signum[0] if _signum else None


def raise_if_stopped() -> None:
    """Raise the recorded stop's KeyboardInterrupt again, if there is one."""
    if _signum:
        raise KeyboardInterrupt(f"signal {_signum[0]}")


def clear_stop() -> None:
    """Forget the request (once the loop that honoured it has stopped)."""
    _signum.clear()
