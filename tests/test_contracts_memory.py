"""The memory contracts (fuzz/_rank/memory.py): a case passes on unmutated torch, and the
contracts notice a reshard that registers the sharded parameters but keeps the unsharded storage
(tests/faults/C04), which changes no number."""

from __future__ import annotations

from typing import Any

import pytest

from fuzz.explore import run_case
from fuzz.properties import get_property
from tests.conftest import fault_env, fault_pool
from tests.contract_cases import FAULT_CASES


def test_memory_case_passes_on_unmutated_torch(check_case: Any) -> None:
    check_case(FAULT_CASES["C04_reshard_keeps_unsharded_storage"]())


def test_memory_contract_notices_storage_kept_after_reshard() -> None:
    name = "C04_reshard_keeps_unsharded_storage"
    case = FAULT_CASES[name]()
    with fault_pool(fault_env(name), world_size=2, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is not None
    assert failure.kind == "mismatch", failure.summary
    problems = " | ".join(failure.details.get("problems", [failure.summary]))
    # the first contract to see it: at '1''s forward, '0' (resharded after its forward) holds
    # its 80 bytes beyond the bound of the root's and '1''s
    assert "memory: when '1''s forward starts, [\"'0'\"] hold unsharded parameters" in failure.summary, problems
    assert "the composition allows 160 bytes" in failure.summary


@pytest.mark.parametrize(
    ("path", "expected"),
    [("", "the root"), ("1.0", "'1.0'")],
)
def test_unit_names_in_messages(path: str, expected: str) -> None:
    from fuzz._rank.memory import name

    assert name(path) == expected
