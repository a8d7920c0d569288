"""``_fault``: the pool's self-test. Not a property of torch, so hidden from listings.

Its cases inject one fault into one rank (see :class:`fuzz.case.FaultAction`); the judge
passes ``none`` cases whose all-reduce summed correctly and fails everything else.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from fuzz.case import Case, FaultAction, FaultBody
from fuzz.pool import Outcome
from fuzz.properties import Property, register
from fuzz.signature import Failure, failure_from_outcome


def judge(case: Case, outcome: Outcome) -> Failure | None:
    if not outcome.ok:
        return failure_from_outcome(case.property, outcome)
    assert isinstance(case.body, FaultBody)
    if case.body.action is FaultAction.NONE:
        expected = case.world_size * (case.world_size + 1) / 2
        values = [obs["value"] for obs in outcome.observations]
        if any(v != expected for v in values):
            return Failure("mismatch", "mismatch:_fault:sum", f"all-reduce gave {values}, expected {expected}")
    return None


def _cases(*, world_size: int, **_: Any) -> Any:
    return st.builds(
        Case,
        property=st.just("_fault"),
        world_size=st.just(world_size),
        seed=st.just(0),
        body=st.builds(FaultBody, action=st.just(FaultAction.NONE)),
    )


FAULT = register(
    Property(
        name="_fault",
        description="pool self-test: inject a fault into one rank",
        cases=_cases,
        judge=judge,
        features=lambda case: [f"fault:{getattr(case.body, 'action', None)}"],
    )
)
