"""Errors of the machine, not of torch (fuzz.verdict.ENVIRONMENT_ERRORS): a case whose rank met
one is run again instead of judged, and the campaign counts it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from fuzz.explore import ENVIRONMENT_RETRIES, Progress, _run_in_time
from fuzz.verdict import Outcome, OutcomeKind, RankReport, environment_fault

EADDRINUSE = (
    "torch.distributed.DistNetworkError",
    "The server socket has failed to listen on any local network address. port: 29871, useIpv6: false, "
    "code: -98, name: EADDRINUSE, message: address already in use",
)


def _raised(exc_type: str, message: str) -> Outcome:
    ranks = (RankReport(rank=0, exc_type=exc_type, message=message, traceback="..."), RankReport(rank=1))
    return Outcome(kind=OutcomeKind.EXCEPTION, ranks=ranks, seconds=0.1)


OK = Outcome(
    kind=OutcomeKind.OK, ranks=(RankReport(rank=0, observation={}), RankReport(rank=1, observation={})), seconds=0.1
)


def test_only_the_machines_errors_are_named() -> None:
    assert environment_fault(_raised(*EADDRINUSE)) == "port taken (EADDRINUSE)"
    assert (
        environment_fault(_raised("builtins.OSError", "[Errno 98] Address already in use")) == "port taken (EADDRINUSE)"
    )
    assert environment_fault(_raised("builtins.KeyError", "'param_groups.0.weight.lr'")) is None
    assert environment_fault(OK) is None


@dataclass
class _Pool:
    outcomes: list[Outcome]
    deadline: float = 30.0
    runs: int = 0

    def wait_ready(self, timeout: float) -> bool:
        return True

    def run(self, case: Any, **kwargs: Any) -> Outcome:
        self.runs += 1
        return self.outcomes.pop(0)


@dataclass
class _Prop:
    judged: list[Outcome] = field(default_factory=list)
    stall: Any = None

    def judge(self, case: Any, outcome: Outcome) -> Any:
        self.judged.append(outcome)
        return None if outcome.ok else "failure"


def test_a_case_is_run_again_after_an_error_of_the_machine() -> None:
    progress = Progress(started=time.monotonic(), budget=60.0)
    pool, prop = _Pool([_raised(*EADDRINUSE), OK]), _Prop()
    assert _run_in_time(pool, prop, object(), progress, 60.0) is None  # type: ignore[arg-type]
    assert pool.runs == 2 and prop.judged == [OK]
    assert progress.environment == {"port taken (EADDRINUSE)": 1}
    assert progress.summary(seed=1, backend="gloo", world_size=2)["environment_reruns"] == {
        "port taken (EADDRINUSE)": 1
    }


def test_an_error_of_the_machine_that_stays_is_judged() -> None:
    progress = Progress(started=time.monotonic(), budget=60.0)
    pool, prop = _Pool([_raised(*EADDRINUSE)] * (ENVIRONMENT_RETRIES + 1)), _Prop()
    assert _run_in_time(pool, prop, object(), progress, 60.0) == "failure"  # type: ignore[arg-type]
    assert (
        pool.runs == ENVIRONMENT_RETRIES + 1 and progress.environment["port taken (EADDRINUSE)"] == ENVIRONMENT_RETRIES
    )


def test_another_error_is_judged_at_once() -> None:
    progress = Progress(started=time.monotonic(), budget=60.0)
    pool, prop = _Pool([_raised("builtins.KeyError", "'x'")]), _Prop()
    assert _run_in_time(pool, prop, object(), progress, 60.0) == "failure"  # type: ignore[arg-type]
    assert pool.runs == 1 and not progress.environment
