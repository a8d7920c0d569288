"""The tolerance policy: how far a composed run may drift from its reference, per dtype.

One policy for the whole suite, written down here, never a number bumped until green.
Values are compared elementwise as ``|actual - expected| <= atol + rtol * |expected|``.

- float32 is tight. A composed run differs from its reference only in summation order
  (gradients are averaged across ranks by a reduce-scatter or all-reduce instead of summed in
  one matmul over the global batch), which costs a few ulps per operation. Small models, few
  steps and SGD, whose update is linear in the gradient, keep that under 1e-5 relative; a
  wrong gradient (a shard reduced on the wrong dimension, a missing reduction, a dropped rank)
  is off by O(1).
- float64 carries the cases whose numerics amplify rounding noise: Adam and AdamW have gain
  1/eps near a zero gradient (see :class:`fuzz.model.Training`), and a LayerNorm over one
  feature divides by sqrt(eps). Noise at 1e-16 stays far under 1e-9 after such gains, where at
  1e-7 (float32) it does not; the strategies pair those optimizers with float64. That holds for
  values of ordinary size, judged by ``rtol``; a parameter that stays near zero (its gradient
  zero but for rounding, as a LayerNorm over one feature gives the module before it) is judged
  by ``atol``, and each update carries the gradients' own absolute tolerance into it through
  the optimizer's gain (:func:`update_gain`, :func:`after_updates`): a torch 2.11 campaign met a
  bias 1.09e-12 off after three AdamW steps at lr 0.1 and eps 1e-4, where 1e-12 was allowed.
- Tensor parallelism moves forward values by ulps, not only the gradients' reduction: a rowwise
  pair adds its ranks' partial products where the reference's matmul sums the whole inner
  dimension in one kernel. A LayerNorm amplifies a difference of its inputs by up to
  1/sqrt(eps) (316 at torch's default eps 1e-5, when its width's values lie close), forward
  and backward: a 4-rank SPMD campaign with tensor parallelism over a width-2 LayerNorm found
  float32 gradient norms 2.4e-5 apart, and the same case in float64 within its policy. Cases
  with tensor parallelism and a LayerNorm leaf therefore train in float64 (the strategies'
  ``_tp_layer_norm_in_float64``); data parallelism alone leaves each sample's forward as the
  reference computes it, and float32 keeps them.
- bfloat16 and float16 are compared against a reference that applies the same casts, so only
  rounding of the low-precision operands differs: a few units of their 8- and 11-bit mantissas.
- Mixed precision (:func:`mixed_precision_tolerance`): the reference applies the policies'
  casts by hand, unit by unit (fuzz/_rank/parity.py:HandCast). Over at most two data-parallel
  ranks both runs then perform the same low-precision operations on the same values: the
  reduction is one addition and a halving, exact in any order, so nothing but a bug separates
  them, and the policy is that of the full-precision dtype the parameters and the optimizer
  keep (float32: measured, 0.0 difference in losses over 40 cases of 13 dtype combinations).
  Over more ranks a low-precision sum of three or more terms depends on its order, and the
  policy of the least precise dtype a judged value went through applies: the rule is the
  lowest precision among every dtype of every unit's policy (param, reduce, output), since a
  loss, a gradient norm and the parameters after an update each pass through every unit's
  forward and gradient reduction. So it does where the backward itself adds three or more
  terms in another order: a fully_shard unit
  that splits the uses of an activation across its boundary (a residual, or an attention's q, k
  and v, inside it and a residual around it), whose terms FSDP2's backward hook adds first
  (bfloat16: a difference of one ulp in the first layer's gradient, measured; with an
  attention at two ranks, gradient norms 6e-4 apart in bfloat16 and 2e-5 in float16, measured;
  :meth:`fuzz.model.Layout.regroups_input_gradients`),
  a two-stage (replicate, shard) reduction over more than two ranks (over two, one stage
  is a single rank's), tensor parallelism (a rowwise pair adds its ranks' partial products
  in the compute dtype, the reference's matmul rounds the whole sum once) and a gradient
  divide factor (FSDP2 divides in the reduce dtype, the reference scales in full precision)
  (``fuzz.properties.parity._mixed_precision_exact``).
  Where the sums are inexact, only what comes before the first update is compared (the first
  step's losses and gradient norms): an update moves a parameter by the learning rate times a
  gradient rounded apart by an ulp of the gradient, which no tolerance relative to the
  parameter bounds (bfloat16, 4 ranks, SGD: 0.006 apart where 0.0016 was allowed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


POLICY: dict[str, Tolerance] = {
    "float64": Tolerance(rtol=1e-9, atol=1e-12),
    "float32": Tolerance(rtol=1e-5, atol=1e-6),
    "bfloat16": Tolerance(rtol=3.2e-2, atol=1e-3),
    "float16": Tolerance(rtol=4e-3, atol=1e-4),
}


def update_gain(optimizer: str, lr: float, eps: float) -> float:
    """How much one optimizer step can amplify an absolute difference of a gradient on its way
    into the parameter, beyond what the gradient's own tolerance covers: Adam and AdamW divide
    the gradient by sqrt(v) + eps, which is about eps where the gradient is about zero, so a
    difference d moves the parameter by lr * d / eps; SGD moves it by lr * d, with lr <= 1 no
    more than the gradient's tolerance already allows (0.0)."""
    return lr / eps if optimizer in ("adam", "adamw") else 0.0


def after_updates(tol: Tolerance, updates: int, gain: float) -> Tolerance:
    """The policy for a parameter after ``updates`` optimizer steps of ``gain``
    (:func:`update_gain`): the gradients' absolute tolerance carried through each step."""
    return Tolerance(rtol=tol.rtol, atol=tol.atol * (1.0 + updates * gain))


def tolerance_for(dtype: str) -> Tolerance:
    try:
        return POLICY[dtype]
    except KeyError:
        raise KeyError(f"no tolerance policy for dtype {dtype!r}; known: {sorted(POLICY)}") from None


@dataclass(frozen=True)
class Mismatch:
    index: int
    actual: float
    expected: float
    error: float
    allowed: float


def first_mismatch(actual: Sequence[float], expected: Sequence[float], tol: Tolerance) -> Mismatch | None:
    """The element with the largest violation of the policy, or None if all are within it.

    Lengths must agree; NaN and infinities never pass (not even against themselves: a
    reference that overflowed is a broken case, not agreement).
    """
    if len(actual) != len(expected):
        return Mismatch(
            index=-1, actual=float(len(actual)), expected=float(len(expected)), error=float("inf"), allowed=0.0
        )
    worst: Mismatch | None = None
    for i, (a, e) in enumerate(zip(actual, expected)):
        allowed = tol.atol + tol.rtol * abs(e)
        err = abs(a - e)
        if not err <= allowed or not math.isfinite(e):  # also catches NaN
            excess = err - allowed if err == err else float("inf")
            if worst is None or excess > worst.error - worst.allowed:
                worst = Mismatch(index=i, actual=a, expected=e, error=err, allowed=allowed)
    return worst


def judged_prefix(expected: Sequence[float]) -> int:
    """How many leading values of a reference run come before its first NaN or infinity. Where
    the reference overflowed, the plain training diverged (a large learning rate over a chain of
    scale parameters, say) and what follows says nothing of the API under test; the values
    before must agree (:func:`first_mismatch` passes no non-finite value)."""
    return next((i for i, v in enumerate(expected) if not math.isfinite(v)), len(expected))


def mixed_precision_tolerance(full: str, low: Sequence[str], data_parallel: int) -> Tolerance:
    """The policy for a run under MixedPrecisionPolicies against its hand-cast reference:
    ``full`` is the parameters' dtype, ``low`` the dtypes of every unit's policy (param, reduce,
    output), ``data_parallel`` the ranks a gradient is reduced over (more than two where the
    sums are inexact for another reason: ``fuzz.properties.parity._mixed_precision_exact``)."""
    if data_parallel <= 2 or not low:
        return tolerance_for(full)
    return max((tolerance_for(d) for d in (full, *low)), key=lambda t: t.rtol)
