"""``_fault``: the pool's self-test. Not a property of torch, so hidden from listings.

Its cases inject one fault into one rank (see :class:`fuzz.model.FaultAction`); the judge
passes ``none`` cases whose all-reduce summed correctly and fails everything else.

Campaigns draw ``none`` cases only, unless ``SHARDFUZZ_FAULT_ACTIONS`` names the actions to draw
(comma-separated :class:`~fuzz.model.FaultAction` values; ``SHARDFUZZ_FAULT_SECONDS`` sets how
long ``sleep`` sleeps): the campaign tests use this to have failures to save and busy ranks to
signal, without a fault in torch.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import strategies as st

from fuzz.errors import InvalidArgument
from fuzz.model import Case, FaultAction, FaultBody
from fuzz.properties.spec import Property
from fuzz.signature import Failure, failure_from_outcome
from fuzz.verdict import Outcome


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


def _actions() -> list[FaultAction]:
    names = os.environ.get("SHARDFUZZ_FAULT_ACTIONS", "none")
    try:
        return [FaultAction(n.strip()) for n in names.split(",") if n.strip()] or [FaultAction.NONE]
    except ValueError:
        choices = ", ".join(a.value for a in FaultAction)
        raise InvalidArgument(f"SHARDFUZZ_FAULT_ACTIONS={names!r}: each must be one of {choices}") from None


def _cases(*, world_size: int, **_: Any) -> Any:
    seconds = float(os.environ.get("SHARDFUZZ_FAULT_SECONDS", "0.5"))
    return st.builds(
        Case,
        property=st.just("_fault"),
        world_size=st.just(world_size),
        seed=st.just(0),
        body=st.builds(FaultBody, action=st.sampled_from(_actions()), seconds=st.just(seconds)),
    )


FAULT = Property(
    name="_fault",
    description="pool self-test: inject a fault into one rank",
    cases=_cases,
    judge=judge,
    features=lambda case: [f"fault:{getattr(case.body, 'action', None)}"],
    body=FaultBody,
    repro_refusal=(
        "fault cases are the rank pool's self-test (an injected fault), not a torch bug; nothing to reproduce"
    ),
)
#: The properties this module defines (collected by :mod:`fuzz.properties`).
PROPERTIES = (FAULT,)
