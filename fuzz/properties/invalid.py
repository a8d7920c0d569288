"""``invalid``: documented misuses raise the documented error on every rank, and never hang."""

from __future__ import annotations

import re
from typing import Any

from fuzz.model import Case, InvalidBody, Misuse, tree_features
from fuzz.properties.spec import Property
from fuzz.signature import Failure, failure_from_outcome
from fuzz.verdict import Outcome

#: The documented error of each misuse: exception type and a pattern its message matches.
EXPECTED: dict[Misuse, tuple[str, str]] = {
    Misuse.REPLICATE_AFTER_FULLY_SHARD: ("builtins.RuntimeError", r"Cannot apply `?replicate\(\)`?"),
    Misuse.UNEVEN_SHARD_DIM_1: ("builtins.NotImplementedError", r"uneven sharding on dim 1"),
    Misuse.CHECKPOINT_USE_REENTRANT: ("builtins.NotImplementedError", r"use_reentrant=True is not supported"),
    Misuse.TIED_ACROSS_UNITS: (
        "builtins.ValueError",
        r"is shared with a parameter already managed by another FSDP group",
    ),
    Misuse.SCALAR_UNDER_FULLY_SHARD: ("builtins.ValueError", r"fully_shard doesn't support scalar parameters"),
    Misuse.CONTAINER_UNIT: ("builtins.ValueError", r"does not support containers that do not implement forward"),
}


def judge(case: Case, outcome: Outcome) -> Failure | None:
    if not outcome.ok:
        return failure_from_outcome(case.property, outcome)
    body = case.body
    assert isinstance(body, InvalidBody)
    exc_type, pattern = EXPECTED[body.misuse]
    for rank, obs in enumerate(outcome.observations):
        raised = obs["raised"]
        if raised is None:
            return Failure(
                "mismatch",
                f"mismatch:invalid:{body.misuse.value}:no-error",
                f"rank {rank} accepted {body.misuse.value} on {body.path!r}; expected {exc_type}",
            )
        if raised["type"] != exc_type or not re.search(pattern, raised["message"]):
            return Failure(
                "mismatch",
                f"mismatch:invalid:{body.misuse.value}:wrong-error",
                f"rank {rank} raised {raised['type']}: {raised['message'][:200]}; expected {exc_type} /{pattern}/",
            )
    return None


def features(case: Case) -> list[str]:
    body = case.body
    assert isinstance(body, InvalidBody)
    where = "misuse:on-root" if body.path == "" else "misuse:on-submodule"
    tree = sorted(set(tree_features(body.tree, case.world_size)))
    return [f"misuse:{body.misuse.value}", where, *tree]


def _cases(*, world_size: int, **kwargs: Any) -> Any:
    from strategies import invalid_cases

    return invalid_cases(world_size=world_size, **kwargs)


INVALID = Property(
    name="invalid",
    description="documented misuses of composable APIs raise the documented error on every rank, no hang",
    cases=_cases,
    judge=judge,
    features=features,
    body=InvalidBody,
    repro="fuzz.repro.script:render",
)
#: The properties this module defines (collected by :mod:`fuzz.properties`).
PROPERTIES = (INVALID,)
