"""Torch coverage on one rank: coverage.py over the torch packages a campaign measures.

:mod:`fuzz._rank.worker` calls :func:`start` before it imports torch, when the driver has set
``SHARDFUZZ_TORCH_COVERAGE`` (the directory the data goes to) and
``SHARDFUZZ_TORCH_COVERAGE_PACKAGES`` (comma-separated packages of torch, e.g.
``torch.distributed.fsdp``); see :mod:`fuzz.torch_coverage`, the driver side that merges and
reads the data. Started before torch, the lines that run at import (``def``, ``class``) count as
reached, as in any coverage.py report.

Each rank process writes one data file, ``coverage.rank<R>.pid<PID>`` in that directory (a pool
respawns its ranks after a failure: every process has its own file). The rank saves after
start-up and after every case, before it reports the case: a pool kills its ranks after any
failure and on a hang, so only what a killed rank ran since its last save is lost (the case that
hung or crashed). Saving a case's new lines costs a few milliseconds; a case that reached
nothing new, well under one. At start-up the rank imports the measured packages before its first
save (:meth:`Recorder.started`), so that the lines their imports run are not credited to a case.

Measurement is limited to the files under the packages' directories (``include`` patterns, not
``source``: coverage.py would walk the directories for unexecuted files at every save); the
driver reads the packages' files itself. Python 3.12 and later use coverage.py's
``sys.monitoring`` core (``sysmon``) unless ``COVERAGE_CORE`` says otherwise; 3.11 and earlier its
C tracer. A rank whose coverage cannot start goes on unmeasured, and a save that fails is tried
again after the next case: the cases matter more than their coverage.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from typing import Any

ENV_DIRECTORY = "SHARDFUZZ_TORCH_COVERAGE"
ENV_PACKAGES = "SHARDFUZZ_TORCH_COVERAGE_PACKAGES"
#: Name of the data files, before their ``.rank<R>.pid<PID>`` suffix.
DATA_BASENAME = "coverage"


class Recorder:
    """A running coverage.py measurement; :meth:`save` writes what it has measured so far."""

    def __init__(self, cov: Any, packages: list[str]) -> None:
        self.cov = cov
        self.packages = packages
        self.failed_saves = 0

    def started(self) -> None:
        """Import the measured packages and save: what every rank process runs at start-up (their
        imports, mostly) is measured before the first case, so no case is credited with it."""
        for package in self.packages:
            try:
                importlib.import_module(package)
            except Exception as e:  # measured all the same, where a case imports it
                print(f"shardfuzz rank: torch coverage: import {package}: {e}", file=sys.stderr, flush=True)
        self.save()

    def save(self) -> None:
        try:
            self.cov.save()
        except Exception as e:  # a full disk, a removed directory: the cases go on, the next save tries again
            self.failed_saves += 1
            if self.failed_saves == 1:
                print(f"shardfuzz rank: torch coverage not saved: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def include_patterns(packages: list[str]) -> list[str]:
    """coverage.py ``include`` patterns for the files of ``packages`` (dotted names under torch),
    found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("torch is not installed")
    root = next(iter(spec.submodule_search_locations))
    patterns = []
    for package in packages:
        parts = package.split(".")
        if parts[0] != "torch":
            raise ValueError(f"package {package!r} is not under torch")
        patterns.append(os.path.join(root, *parts[1:], "*"))
    return patterns


def start(env: Mapping[str, str], rank: int) -> Recorder | None:
    """Start measuring where ``env`` asks for it (None where it does not)."""
    directory = env.get(ENV_DIRECTORY)
    if not directory:
        return None
    packages = [p for p in env.get(ENV_PACKAGES, "").split(",") if p]
    if sys.version_info >= (3, 12) and not os.environ.get("COVERAGE_CORE"):
        # coverage.py's sys.monitoring core, cheaper than a trace function; the variable, unlike
        # the later `core` setting, is read by every coverage.py that has that core (7.4 on).
        os.environ["COVERAGE_CORE"] = "sysmon"
    try:
        import coverage

        os.makedirs(directory, exist_ok=True)
        cov = coverage.Coverage(
            data_file=os.path.join(directory, DATA_BASENAME),
            data_suffix=f"rank{rank}.pid{os.getpid()}",
            include=include_patterns(packages),
            config_file=False,
            auto_data=False,
        )
        cov.start()
    except Exception as e:
        print(f"shardfuzz rank: torch coverage does not start: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return None
    return Recorder(cov, packages)
