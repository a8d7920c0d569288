"""``parity``: a model under fully_shard trains like a plain model on the global batch.

Each step, the mean of the ranks' losses must match the reference loss, and after the last
step every parameter (gathered to full) must match the reference's, under the float32 policy
of :mod:`fuzz.tolerance`.
"""

from __future__ import annotations

from statistics import fmean
from typing import Any

from fuzz.case import Block, Case, Leaf, ParityBody
from fuzz.pool import Outcome
from fuzz.properties import Property, register
from fuzz.signature import Failure, failure_from_outcome
from fuzz.tolerance import first_mismatch, tolerance_for


def judge(case: Case, outcome: Outcome) -> Failure | None:
    if not outcome.ok:
        return failure_from_outcome(case.property, outcome)
    assert isinstance(case.body, ParityBody)
    tol = tolerance_for(case.body.training.dtype.value)
    per_rank = [obs["losses"] for obs in outcome.observations]
    losses = [fmean(step) for step in zip(*per_rank)]
    ref = outcome.observations[0]
    bad = first_mismatch(losses, ref["ref_losses"], tol)
    if bad is not None:
        return Failure(
            "mismatch",
            f"mismatch:{case.property}:loss",
            f"loss at step {bad.index} is {bad.actual!r}, reference {bad.expected!r} "
            f"(error {bad.error:.3g} > allowed {bad.allowed:.3g})",
            {"check": "loss", "observed": losses, "expected": ref["ref_losses"], "per_rank": per_rank},
        )
    for name, expected in ref["ref_params"].items():
        actual = ref["params"].get(name)
        if actual is None:
            return Failure("mismatch", f"mismatch:{case.property}:param-missing", f"parameter {name} is missing", {})
        bad = first_mismatch(actual, expected, tol)
        if bad is not None:
            return Failure(
                "mismatch",
                f"mismatch:{case.property}:param",
                f"{name}[{bad.index}] is {bad.actual!r} after {len(losses)} step(s), reference {bad.expected!r} "
                f"(error {bad.error:.3g} > allowed {bad.allowed:.3g})",
                {"check": "param", "param": name, "observed": actual, "expected": expected},
            )
    return None


def features(case: Case) -> list[str]:
    body = case.body
    assert isinstance(body, ParityBody)
    out = [
        f"optimizer:{body.training.optimizer.value}",
        f"steps:{body.training.steps}",
        f"dtype:{body.training.dtype.value}",
    ]
    width = body.tree.width
    out.append("shards:uneven" if width % case.world_size else "shards:even")
    if width < case.world_size:
        out.append("shards:empty")
    for node in body.tree.paths().values():
        if isinstance(node, Leaf):
            out.append(f"leaf:{node.kind.value}" + ("" if node.bias else ":no-bias"))
        elif isinstance(node, Block) and node.residual:
            out.append("block:residual")
    for spec in body.composition.shards:
        raf = spec.reshard_after_forward
        out.append(f"reshard_after_forward:{'int' if not isinstance(raf, bool) else raf}")
        if spec.shard_dim:
            out.append(f"shard_placement_fn:Shard({spec.shard_dim})")
    out.append(f"fully_shard:count:{min(len(body.composition.shards), 4)}")
    return sorted(set(out))


def _cases(*, world_size: int, **kwargs: Any) -> Any:
    from strategies import parity_cases

    return parity_cases(world_size=world_size, **kwargs)


PARITY = register(
    Property(
        name="parity",
        description="fully_shard at random levels trains like a plain model on the global batch",
        cases=_cases,
        judge=judge,
        features=features,
    )
)
