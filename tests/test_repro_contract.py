"""Contract failures' printed scripts (fuzz/repro/print_contract.py): printed from the case, they
record under torchrun what the rank recorder recorded, through torch's own observation points,
print it against what the composition and the docstring's rule document, and exit 1 with
``REPRODUCED:`` under the contract's fault (tests/faults/C*), 0 with ``PASS:`` without it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fuzz.corpus import Entry, entry_from_failure
from fuzz.explore import run_case
from fuzz.model import Knobs, MetamorphicBody
from fuzz.properties import get_property
from fuzz.repro.print_contract import (
    CONTRACTS,
    PASSED,
    NotPrintable,
    check_printable,
    failed_contract,
    print_entry,
)
from tests.conftest import fault_env, fault_pool, torchrun
from tests.contract_cases import FAULT_CASES

#: (fault, a contract its failure breaks): each script shown to reproduce under the fault
SCRIPTS = [
    ("C01_forward_prefetch_not_issued", "forward_prefetch"),
    ("C02_backward_prefetch_not_issued", "backward_prefetch"),
    ("C03_reshard_after_backward_ignored", "between_microbatches"),
    ("C04_reshard_keeps_unsharded_storage", "forward_bound"),
    ("C04_reshard_keeps_unsharded_storage", "after_forward"),
    ("C04_reshard_keeps_unsharded_storage", "after_backward"),
    ("C05_checkpoint_region_not_checkpointed", "saved_inside"),
    ("C06_sac_must_save_recomputed", "selective"),
    ("C07_reduce_scatter_deferred_to_final_callback", "reduce_scatter_order"),
    ("C08_reshard_after_backward_deferred", "freed_at_reduce_scatter"),
    ("C09_checkpoint_early_stop_ignored", "early_stop"),
    ("C11_checkpoint_rng_state_not_restored", "rng"),
]


def _entry(name: str, message: str) -> Entry:
    """A contract failure of the fault ``name``'s case whose recorder said ``message`` (the words
    of the recorder's message that name its contract, :data:`CONTRACTS`)."""
    case = FAULT_CASES[name]()
    return Entry(
        case=case,
        kind="mismatch",
        signature=f"mismatch:{case.property}:contract-knobs",
        summary=f"rank 0: {message}",
        details={"problems": [message]},
    )


def _contract(name: str) -> Any:
    return next(c for c in CONTRACTS if c.name == name)


def _run(script: str, tmp_path: Path, env: dict[str, str] | None = None) -> tuple[str, str]:
    """torchrun's 2 ranks on ``script``: the verdict ("REPRODUCED", "PASS" or "FAIL") and stdout."""
    path = tmp_path / "contract.repro.py"
    path.write_text(script)
    out = torchrun(path, env=env)
    verdicts = [line.split(":")[0] for line in out.stdout.splitlines() if line.startswith(("REPRODUCED:", "PASS:"))]
    failed_another_way = "exitcode  : 2" in out.stderr or "FAIL (" in out.stdout
    if failed_another_way or len(verdicts) != 1:
        return "FAIL", out.stdout + out.stderr[-3000:]
    if (verdicts[0] == "PASS") != (out.returncode == 0):  # PASS exits 0, REPRODUCED 1
        return "FAIL", out.stdout + out.stderr[-3000:]
    return verdicts[0], out.stdout


@pytest.mark.parametrize(("name", "contract_name"), SCRIPTS)
def test_the_printed_text_carries_the_recorder_the_rule_and_the_observation_point(
    name: str, contract_name: str
) -> None:
    contract = _contract(contract_name)
    script = print_entry(_entry(name, f"{contract.mark}(the recorder's words)"))
    compile(script, "contract.repro.py", "exec")
    assert contract.recorder in script
    assert " ".join(contract.rule.split()[:6]) in " ".join(line.lstrip("# ") for line in script.splitlines())
    point = {
        "forward_prefetch": "set_custom_all_gather(",
        "backward_prefetch": "_training_state.name",
        "between_microbatches": "def judge_left",
        "reduce_scatter_order": "set_custom_reduce_scatter(",
        "freed_at_reduce_scatter": "set_custom_reduce_scatter(",
        "forward_bound": "full_bytes(UNIT[u]) for u in allowed",
        "after_forward": "unsharded_bytes(UNIT[path])",
        "after_backward": "def judge_freed",
        "saved_inside": "saved_tensors_hooks(",
        "early_stop": "RETURNED.add(path)",
        "rng": "rng_state() in STATES",
        "selective": "output_storage(path, saved=isinstance(sub, nn.Linear))",
    }[contract.name]
    assert point in script
    assert "import fuzz" not in script and "from fuzz" not in script  # torch only
    lint = [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "F,E,B,SIM", "--stdin-filename", "s.py"]
    if contract.name == "selective":  # the composition's checkpoint call with its context_fn runs past 120 characters
        lint += ["--extend-ignore", "E501"]
    out = subprocess.run([*lint, "-"], input=script, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout


def test_only_the_failed_contract_is_observed() -> None:
    """A failure with messages of several contracts gets the first printable one's observation
    alone."""
    name = "C04_reshard_keeps_unsharded_storage"
    entry = _entry(name, "after forward with reshard_after_forward=True, '0' still holds 80 bytes")
    entry.details["problems"].insert(0, "set_custom_all_gather on '0': the comm was never called")
    entry.details["problems"].append("memory: when '1''s forward starts, [\"'0'\"] hold unsharded parameters")
    contract, message = failed_contract(entry.case, entry)
    assert contract.name == "after_forward" and message.startswith("after forward")
    script = print_entry(entry)
    assert "unsharded_bytes(UNIT[path])" in script
    assert "set_custom_reduce_scatter" not in script and "saved_tensors_hooks" not in script
    assert "def at_forward" not in script  # the forward-start bound's


def test_what_it_does_not_print_is_named() -> None:
    name = "C10_sac_prefer_recompute_saved"  # early_stop=False, which the composition's calls do not write
    between = _entry(name, "selective checkpoint: '1.1''s ReLU (PREFER_RECOMPUTE) was not recomputed")
    with pytest.raises(NotPrintable, match="early_stop"):
        check_printable(between.case, between)
    unset = _entry("C07_reduce_scatter_deferred_to_final_callback", "set_modules_to_forward_prefetch on the root: '0'")
    with pytest.raises(NotPrintable, match="sets no forward_prefetch"):
        check_printable(unset.case, unset)
    unknown = _entry("C07_reduce_scatter_deferred_to_final_callback", "set_custom_all_gather on '0': never called")
    with pytest.raises(NotPrintable, match="the contract failure"):
        check_printable(unknown.case, unknown)
    other = _entry("C07_reduce_scatter_deferred_to_final_callback", "a parameter differs")
    other = dataclasses.replace(other, signature="mismatch:parity:parameters")
    with pytest.raises(NotPrintable, match="as a contract failure"):
        check_printable(other.case, other)
    entry = _entry("C01_forward_prefetch_not_issued", "set_modules_to_forward_prefetch on the root: '0'")
    parity: Any = entry.case.body
    body = MetamorphicBody(
        tree=parity.tree, composition=parity.composition, variant=parity.composition, training=parity.training
    )
    metamorphic = dataclasses.replace(entry.case, property="metamorphic", body=body)
    with pytest.raises(NotPrintable, match="a metamorphic contract failure"):
        check_printable(metamorphic, entry)
    comp = dataclasses.replace(parity.composition, knobs=Knobs(explicit_unshard=True))
    knobbed = dataclasses.replace(entry.case, body=dataclasses.replace(parity, composition=comp))
    with pytest.raises(NotPrintable, match="explicit_unshard"):
        check_printable(knobbed, entry)
    replicated = dataclasses.replace(parity.composition, shards=(), replicates=("",), knobs=Knobs())
    plain = dataclasses.replace(entry.case, body=dataclasses.replace(parity, composition=replicated))
    after = _entry("C04_reshard_keeps_unsharded_storage", "after forward with reshard_after_forward=True, '0'")
    with pytest.raises(NotPrintable, match="without fully_shard"):
        check_printable(plain, after)


def test_a_printed_order_script_reproduces_under_its_fault(tmp_path: Path) -> None:
    """The one torchrun run of the default tier: the reduce-scatter order's script, printed from
    an entry of C07's case, under C07 (torch called unchanged otherwise)."""
    name = "C07_reduce_scatter_deferred_to_final_callback"
    env = fault_env(name)
    contract = _contract("reduce_scatter_order")
    verdict, out = _run(print_entry(_entry(name, f"{contract.mark}'0' before '1'")), tmp_path, env)
    assert verdict == "REPRODUCED", out
    assert "documented: '1' before '0'" in out and "reduce-scatters in backward: ['', '0', '1']" in out, out


@pytest.mark.slow
@pytest.mark.parametrize(("name", "contract_name"), SCRIPTS)
def test_a_contract_failure_reproduces_under_its_fault_and_passes_without(
    name: str, contract_name: str, tmp_path: Path
) -> None:
    """The failing case run on the pool under the fault, the script of its entry (its messages
    of the contract alone) printed, then run under torchrun: REPRODUCED with the fault applied,
    PASS without it."""
    env = fault_env(name)
    case = FAULT_CASES[name]()
    with fault_pool(env, world_size=2, deadline=60) as pool:
        failure = run_case(pool, get_property(case.property), case)
    assert failure is not None and failure.signature.endswith(":contract-knobs"), failure
    entry = entry_from_failure(case, failure, versions={}, backend="gloo", device_kind="cpu", reruns=1, reproduced=1)
    contract = _contract(contract_name)
    problems = [p for p in entry.details["problems"] if contract.mark in p]
    if contract_name == "after_backward":  # the entry keeps the first five messages; these come later
        problems = problems or [f"{contract.mark}, '0' still holds its unsharded parameter storage"]
    assert problems, entry.details["problems"]
    entry = dataclasses.replace(entry, details={**entry.details, "problems": problems})
    assert failed_contract(case, entry)[0] is contract
    script = print_entry(entry)
    assert _run(script, tmp_path, env)[0] == "REPRODUCED"
    verdict, out = _run(script, tmp_path)
    assert verdict == "PASS" and PASSED in out, out


def _stored_contract_entries() -> list[Path]:
    """The corpus's contract failures of known torch bugs found on this torch."""
    import torch

    from fuzz.corpus import load_entry

    found = []
    for path in sorted((Path(__file__).parent.parent / "corpus").glob("parity-mismatch-*.json")):
        entry = load_entry(path)
        if (
            entry.signature.endswith(":contract-knobs")
            and entry.bug
            and entry.versions.get("torch") == torch.__version__
        ):
            found.append(path)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("path", _stored_contract_entries(), ids=lambda p: p.stem)
def test_a_stored_contract_failure_of_a_torch_bug_reproduces_on_unmutated_torch(path: Path, tmp_path: Path) -> None:
    """A contract failure the campaigns found in torch itself (a known bug, met on this torch):
    its printed script reproduces it with torch as installed."""
    from fuzz.corpus import load_entry

    entry = load_entry(path)
    verdict, out = _run(print_entry(entry), tmp_path)
    assert verdict == "REPRODUCED", out
