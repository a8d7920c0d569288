"""The tolerance policy: |actual - expected| <= atol + rtol * |expected|, NaN never passes."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from fuzz.tolerance import POLICY, Tolerance, first_mismatch, tolerance_for

NAN = float("nan")
INF = float("inf")
DTYPES = sorted(POLICY)


def _allowed(tol: Tolerance, expected: float) -> float:
    return tol.atol + tol.rtol * abs(expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_identical_values_pass(dtype: str) -> None:
    values = [0.0, -1.5, 3.25, 1e6, -1e-9]
    assert first_mismatch(values, list(values), tolerance_for(dtype)) is None


def test_empty_sequences_pass() -> None:
    assert first_mismatch([], [], POLICY["float32"]) is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("expected", [0.0, 1.0, -2.5, 1000.0])
def test_just_inside_passes_just_outside_fails(dtype: str, expected: float) -> None:
    tol = tolerance_for(dtype)
    allowed = _allowed(tol, expected)
    for sign in (1.0, -1.0):
        assert first_mismatch([expected + sign * 0.99 * allowed], [expected], tol) is None
        bad = first_mismatch([expected + sign * 1.01 * allowed], [expected], tol)
        assert bad is not None
        assert bad.index == 0
        assert bad.expected == expected
        assert bad.actual == expected + sign * 1.01 * allowed
        assert bad.error > bad.allowed
        assert bad.allowed == pytest.approx(allowed)


def test_tolerance_is_relative_to_expected_not_actual() -> None:
    tol = Tolerance(rtol=0.1, atol=0.0)
    # |1.0 - 0.9| = 0.1 > 0.1 * 0.9: relative to expected=0.9 this fails ...
    assert first_mismatch([1.0], [0.9], tol) is not None
    # ... though relative to actual=1.0 it would have passed.
    assert first_mismatch([0.9], [1.0], tol) is None


def test_float32_concrete_numbers() -> None:
    tol = POLICY["float32"]
    assert first_mismatch([1.0 + 1e-6], [1.0], tol) is None
    assert first_mismatch([1.0 + 1e-4], [1.0], tol) is not None
    assert first_mismatch([1e-7], [0.0], tol) is None
    assert first_mismatch([1e-5], [0.0], tol) is not None


@settings(max_examples=200, database=None, deadline=None, phases=[Phase.generate])
@given(
    expected=st.floats(-1e6, 1e6, allow_nan=False),
    frac=st.floats(0.0, 0.98),
    dtype=st.sampled_from(DTYPES),
)
def test_anything_within_tolerance_passes(expected: float, frac: float, dtype: str) -> None:
    tol = tolerance_for(dtype)
    actual = expected + frac * _allowed(tol, expected)
    assert first_mismatch([actual], [expected], tol) is None


@settings(max_examples=200, database=None, deadline=None, phases=[Phase.generate])
@given(
    expected=st.floats(-1e6, 1e6, allow_nan=False),
    factor=st.floats(1.05, 1e6),
    dtype=st.sampled_from(DTYPES),
)
def test_anything_outside_tolerance_fails(expected: float, factor: float, dtype: str) -> None:
    tol = tolerance_for(dtype)
    actual = expected - factor * _allowed(tol, expected)
    bad = first_mismatch([0.0, actual], [0.0, expected], tol)
    assert bad is not None
    assert bad.index == 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("actual", "expected"), [(NAN, 1.0), (1.0, NAN), (NAN, NAN), (NAN, 0.0)])
def test_nan_never_passes(dtype: str, actual: float, expected: float) -> None:
    bad = first_mismatch([0.0, actual, 0.0], [0.0, expected, 0.0], tolerance_for(dtype))
    assert bad is not None
    assert bad.index == 1


def test_nan_even_under_a_huge_tolerance() -> None:
    tol = Tolerance(rtol=1e30, atol=1e30)
    assert first_mismatch([NAN], [NAN], tol) is not None
    assert first_mismatch([1.0], [1e20], tol) is None


def test_infinite_actual_fails() -> None:
    tol = POLICY["float64"]
    assert first_mismatch([INF], [1.0], tol) is not None
    assert first_mismatch([-INF], [0.0], tol) is not None


@pytest.mark.parametrize(("actual", "expected"), [(1.0, INF), (0.0, -INF), (-INF, INF), (INF, -INF)])
def test_infinite_expected_fails(actual: float, expected: float) -> None:
    assert first_mismatch([actual], [expected], POLICY["float64"]) is not None


def test_nan_is_reported_over_a_finite_violation() -> None:
    tol = POLICY["float32"]
    for actual in ([2.0, NAN], [NAN, 2.0]):
        bad = first_mismatch(actual, [1.0, 1.0], tol)
        assert bad is not None
        assert math.isnan(bad.actual)


@pytest.mark.parametrize(("actual", "expected"), [([1.0, 2.0], [1.0]), ([1.0], [1.0, 2.0]), ([], [0.0])])
def test_length_mismatch_fails(actual: list[float], expected: list[float]) -> None:
    bad = first_mismatch(actual, expected, POLICY["float64"])
    assert bad is not None
    assert bad.index == -1
    assert bad.actual == len(actual)
    assert bad.expected == len(expected)


def test_length_mismatch_fails_even_if_the_common_prefix_agrees() -> None:
    assert first_mismatch([1.0, 2.0, 3.0], [1.0, 2.0], Tolerance(rtol=1.0, atol=1.0)) is not None


def test_largest_violation_is_reported() -> None:
    tol = POLICY["float32"]
    expected = [1.0, 1.0, 1.0, 1.0, 1.0]
    actual = [1.1, 1.0, 3.0, 0.5, 1.0]
    bad = first_mismatch(actual, expected, tol)
    assert bad is not None
    assert bad.index == 2
    assert bad.actual == 3.0
    assert bad.expected == 1.0
    assert bad.error == pytest.approx(2.0)
    assert bad.allowed == pytest.approx(_allowed(tol, 1.0))


def test_largest_violation_is_measured_beyond_what_is_allowed() -> None:
    # allowed: 50 at index 0, 5 at index 1. The raw error is larger at index 0 in both cases;
    # what is reported is the element that exceeds its allowance by most.
    tol = Tolerance(rtol=0.5, atol=0.0)
    bad = first_mismatch([160.0, 20.0], [100.0, 10.0], tol)  # excess 10 vs 5
    assert bad is not None
    assert bad.index == 0
    bad = first_mismatch([155.0, 30.0], [100.0, 10.0], tol)  # excess 5 vs 15
    assert bad is not None
    assert bad.index == 1


def test_earlier_violation_wins_a_tie() -> None:
    bad = first_mismatch([2.0, 2.0], [1.0, 1.0], POLICY["float64"])
    assert bad is not None
    assert bad.index == 0


def test_unknown_dtype_names_the_known_ones() -> None:
    with pytest.raises(KeyError) as info:
        tolerance_for("int8")
    message = str(info.value)
    assert "int8" in message
    for dtype in POLICY:
        assert dtype in message


def test_policy_covers_the_case_dtypes() -> None:
    from fuzz.model import Dtype

    for dtype in Dtype:
        assert tolerance_for(dtype.value) == POLICY[dtype.value]


def test_float32_is_tighter_than_bfloat16() -> None:
    f32, bf16 = POLICY["float32"], POLICY["bfloat16"]
    assert f32.rtol < bf16.rtol
    assert f32.atol < bf16.atol
    # a bfloat16-sized error (a few units of an 8-bit mantissa) passes bfloat16, fails float32
    assert first_mismatch([1.01], [1.0], bf16) is None
    assert first_mismatch([1.01], [1.0], f32) is not None


def test_precisions_are_ordered() -> None:
    order = ["float64", "float32", "float16", "bfloat16"]
    for tighter, looser in itertools.pairwise(order):
        assert POLICY[tighter].rtol < POLICY[looser].rtol, (tighter, looser)
        assert POLICY[tighter].atol < POLICY[looser].atol, (tighter, looser)


def _observation(losses: list[list[float]], ref_losses: list[list[float]]) -> dict[str, object]:
    params = [{"w": [1.0]} for _ in losses]
    return {
        "losses": losses,
        "grad_norms": [1.0] * len(losses),
        "params": params,
        "ref": {"losses": ref_losses, "grad_norms": [1.0] * len(losses), "params": params},
    }


def test_training_is_judged_up_to_the_step_where_the_reference_overflows() -> None:
    """A plain model that diverges (the reference's loss overflows) says nothing of the
    distributed API from that step on; the steps before it are judged as ever."""
    from fuzz.properties.parity import compare_runs

    tol = tolerance_for("float32")
    ref = [[1.0], [1e30], [math.inf]]
    assert compare_runs("parity", [_observation([[1.0], [1e30], [math.inf]], ref)] * 2, tol) is None
    assert compare_runs("parity", [_observation([[1.0], [1e30], [3.0]], ref)] * 2, tol) is None
    failure = compare_runs("parity", [_observation([[1.0], [2e30], [math.inf]], ref)] * 2, tol)
    assert failure is not None and "step 1" in failure.summary
    # an overflow of the composed run alone is a mismatch
    failure = compare_runs("parity", [_observation([[1.0], [math.inf], [1.0]], [[1.0], [1e30], [1.0]])] * 2, tol)
    assert failure is not None and "step 1" in failure.summary


def test_judged_prefix_ends_at_the_reference_s_first_overflow() -> None:
    from fuzz.tolerance import judged_prefix

    assert judged_prefix([1.0, 2.0]) == 2
    assert judged_prefix([2761931.25, math.inf]) == 1
    assert judged_prefix([math.nan, 1.0]) == 0
    assert judged_prefix([]) == 0


def test_a_resume_is_judged_up_to_where_the_uninterrupted_run_overflows() -> None:
    """A diverging SGD run (float32, 4 ranks: loss 2.8e6, then inf on both sides) was reported
    as a resume mismatch, inf against inf; before the overflow the losses must still agree, and
    a resumed run that overflows where the uninterrupted one did not is still a mismatch."""
    from fuzz.model import Case, StateDictBody, Training
    from fuzz.properties.state_dict_checks import check_resume as _check_resume
    from tests.test_state_dict import TREE, fsdp

    case = Case("state_dict", 2, 1, StateDictBody(tree=TREE, source=fsdp("1"), target=fsdp(), training=Training()))
    params = {"0.weight": [1.0, 2.0]}

    def obs(target: list[float], source: list[float], final: dict[str, list[float]] = params) -> dict[str, object]:
        return {"losses_target": target, "losses_source": source, "final_target": final, "final_source": final}

    for same in (False, True):
        assert (
            _check_resume("state_dict", "combined", case, same, [obs([2761931.25, math.inf], [2761931.25, math.inf])])
            is None
        )
        assert _check_resume("state_dict", "combined", case, same, [obs([1.0, math.nan], [1.0, math.nan])]) is None
        late = _check_resume("state_dict", "combined", case, same, [obs([1.0, math.inf], [1.0, 2.0])])
        assert late is not None and late.signature == "mismatch:state_dict:resume_loss@combined"
        early = _check_resume("state_dict", "combined", case, same, [obs([1.5, math.inf], [1.0, math.inf])])
        assert early is not None and early.signature == "mismatch:state_dict:resume_loss@combined"
    overflowed = {"0.weight": [math.inf, 2.0]}
    assert _check_resume("state_dict", "combined", case, False, [obs([1.0], [1.0], overflowed)]) is None


def test_a_parameter_near_zero_takes_the_gradients_tolerance_through_adams_gain() -> None:
    """A bias whose gradient is zero but for rounding (a LayerNorm over one feature after it)
    moves by lr * noise / eps under AdamW: a torch 2.11 campaign met it 1.09e-12 off after three
    steps at lr 0.1, eps 1e-4 (float64, 1e-12 allowed). Carried through each update's gain, the
    gradients' absolute tolerance takes it; a wrong update (a step of lr/10) does not pass, and
    SGD, whose step does not amplify, keeps the policy as it is."""
    from fuzz.tolerance import after_updates, update_gain

    tol = tolerance_for("float64")
    got, want = [-2.348173476448777e-11], [-2.2396427859928648e-11]
    assert first_mismatch(got, want, tol) is not None
    gain = update_gain("adamw", 0.1, 1e-4)
    assert gain == pytest.approx(1e3) and update_gain("adam", 0.1, 1e-4) == gain
    assert first_mismatch(got, want, after_updates(tol, 3, gain)) is None
    assert first_mismatch([want[0] + 0.01], want, after_updates(tol, 3, gain)) is not None
    assert update_gain("sgd", 0.1, 1e-4) == 0.0
    assert after_updates(tol, 3, 0.0) == tol
    assert after_updates(tol, 1, gain).atol < after_updates(tol, 2, gain).atol


def test_the_adamw_bias_near_zero_case_is_not_a_failure(check_case: Any) -> None:
    """The campaign's case (float64, AdamW at lr 0.1 and eps 1e-4, LayerNorms over one feature,
    fully_shard on the root): torch is right; it passes under the rule above."""
    import json
    from pathlib import Path

    from fuzz.model import case_from_json

    path = Path(__file__).parent / "regressions" / "adamw-float64-bias-near-zero.json"
    check_case(case_from_json(json.loads(path.read_text())))
