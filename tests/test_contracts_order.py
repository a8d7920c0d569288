"""The order contracts (fuzz/_rank/order.py): cases with the prefetch and reshard-after-backward
knobs pass on unmutated torch, and each contract notices the fault written for it
(tests/faults/C01-C03), which changes no number."""

from __future__ import annotations

from typing import Any

import pytest

from fuzz.explore import run_case
from fuzz.properties import get_property
from tests.conftest import fault_env, fault_pool
from tests.contract_cases import FAULT_CASES

#: fault -> words the failure's message must hold (the contract that noticed it)
ORDER = {
    "C01_forward_prefetch_not_issued": "set_modules_to_forward_prefetch on the root: '0' not all-gathered",
    "C02_backward_prefetch_not_issued": "backward_prefetch on '1': '0' not all-gathered before '1''s backward",
    "C03_reshard_after_backward_ignored": "set_reshard_after_backward(False) on",
    "C07_reduce_scatter_deferred_to_final_callback": "reduce-scatter order: '0' reduce-scattered before '1'",
    "C08_reshard_after_backward_deferred": "memory: at '1''s reduce-scatter, [\"'1'\"] hold",
}


def _needs_custom_comms() -> None:
    from torch.distributed.fsdp import FSDPModule

    if not hasattr(FSDPModule, "set_custom_all_gather"):
        pytest.skip("this torch has no custom comm interface: all-gathers are not observed")


@pytest.mark.parametrize("name", sorted(ORDER))
def test_order_cases_pass_on_unmutated_torch(check_case: Any, name: str) -> None:
    check_case(FAULT_CASES[name]())


@pytest.mark.parametrize("name", sorted(ORDER))
def test_each_order_contract_notices_its_fault(name: str) -> None:
    _needs_custom_comms()
    env = fault_env(name)
    case = FAULT_CASES[name]()
    with fault_pool(env, world_size=2, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is not None, name
    assert failure.kind == "mismatch", failure.summary
    assert "contract-knobs" in failure.signature
    assert ORDER[name] in failure.summary, failure.summary


def test_backward_prefetch_of_a_target_kept_unsharded_passes(check_case: Any) -> None:
    from tests.contract_cases import backward_prefetch_kept_unsharded

    check_case(backward_prefetch_kept_unsharded())


def test_recording_comm_delegates_and_notes_each_call() -> None:
    """The recording comm is the default comm plus a note: allocate and the call go to the
    comm it wraps, in the order made."""
    from fuzz._rank.order import RecordingComm

    calls: list[tuple[str, Any]] = []

    class Inner:
        def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
            calls.append(("allocate", size))
            return "buffer"

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            calls.append(("call", kwargs["group"]))
            return "work"

    class Recorder:
        def __init__(self) -> None:
            self.notes: list[tuple[str, str]] = []

        def note(self, kind: str, path: str) -> None:
            self.notes.append((kind, path))

    recorder = Recorder()
    comm = RecordingComm("all_gather", "1.0", recorder, Inner())  # type: ignore[arg-type]
    assert comm.allocate((4,), dtype="f", device="cpu") == "buffer"  # type: ignore[arg-type]
    assert comm(output_tensor=None, input_tensor=None, group="g", async_op=False) == "work"
    assert calls == [("allocate", (4,)), ("call", "g")]
    assert recorder.notes == [("all_gather", "1.0")]
