"""Reproducer scripts (fuzz/repro.py): what they import, that they build what the ranks build,
that under torchrun they observe exactly what the pool observes, and that they refuse what they
cannot render."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fuzz import repro
from fuzz.case import (
    AccumSync,
    Block,
    Case,
    Composition,
    Dtype,
    FaultAction,
    FaultBody,
    Leaf,
    LeafKind,
    ModuleTree,
    Optimizer,
    ParityBody,
    ShardSpec,
    Training,
    Wrapper,
)
from fuzz.corpus import Entry, save_entry
from fuzz.errors import InvalidArgument
from fuzz.repro import check_supported, render_entry
from strategies import module_trees
from tests.conftest import mutant_env, run_cli


def _rich_case() -> Case:
    """Most of what the renderer supports in one case: a residual block with its own parameter and
    buffer, conv1d, dropout, a frozen leaf, a grouped fully_shard with Shard(1) (which P01 breaks),
    gradient accumulation without sync, two parameter groups, AdamW in float64."""
    inner = Block(
        children=(Leaf(LeafKind.CONV1D), Leaf(LeafKind.GELU), Leaf(LeafKind.DROPOUT)),
        residual=True,
        scale=True,
        buffer=True,
    )
    root = Block(
        children=(
            inner,
            Leaf(LeafKind.LINEAR, bias=False),
            Leaf(LeafKind.LAYER_NORM),
            Leaf(LeafKind.LINEAR, frozen=True),
        )
    )
    composition = Composition(
        shards=(
            ShardSpec(path="1", group=("3",), shard_dim=1),
            ShardSpec(path="0", reshard_after_forward=False),
            ShardSpec(path="", reshard_after_forward=False, shard_dim=1),
        )
    )
    training = Training(
        optimizer=Optimizer.ADAMW,
        lr=0.01,
        steps=2,
        dtype=Dtype.FLOAT64,
        grad_accum=2,
        accum_sync=AccumSync.NO_GRAD_SYNC,
        set_to_none=False,
        param_groups=2,
    )
    body = ParityBody(tree=ModuleTree(width=8, root=root), composition=composition, training=training)
    return Case(property="parity", world_size=2, seed=5, body=body)


def _entry(case: Case, *, check: str = "loss") -> Entry:
    return Entry(
        case=case,
        kind="mismatch",
        signature="mismatch:parity@fsdp2",
        summary="made up for the test",
        details={"check": check},
        versions={"torch": "2.13.0"},
        reruns=3,
        reproduced=3,
    )


def _torchrun(script: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # --standalone: a free rendezvous port, so parallel test workers never collide.
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
        cwd=script.parent,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=240,
    )


def _imported_modules(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import in a standalone script"
            names.add((node.module or "").split(".")[0])
    return names


@pytest.mark.parametrize(
    "summary", ["plain", 'odd: """ \\x \\N{oops} \\ \'\'\' \n "quoted"'], ids=["plain", "quotes-and-backslashes"]
)
def test_script_parses_and_imports_only_torch_and_the_standard_library(summary: str) -> None:
    entry = dataclasses.replace(_entry(_rich_case()), summary=summary)
    source = render_entry(entry, source="dir\\x.json")
    imported = _imported_modules(source)
    assert "torch" in imported
    assert imported - {"torch"} <= set(sys.stdlib_module_names), imported
    compile(source, "repro.py", "exec")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_scripts_build_the_model_the_ranks_build(data: Any) -> None:
    """The rendered module tree has the ranks' parameter and buffer names, shapes, values
    (same seed), requires_grad flags, and computes the same function."""
    import torch

    from fuzz._rank.models import build_model

    tree = data.draw(module_trees(), label="tree")
    root_only = Composition(shards=(ShardSpec(path=""),))
    case = Case("parity", 2, data.draw(st.integers(0, 2**32 - 1)), ParityBody(tree, root_only, Training()))
    try:
        check_supported(case)
    except InvalidArgument:
        assume(False)
    ns: dict[str, Any] = {"__name__": "repro"}  # not "__main__": define, do not run
    exec(compile(render_entry(_entry(case)), "repro.py", "exec"), ns)
    torch.manual_seed(case.seed)
    with torch.device("cpu"):
        rendered = ns["build_model"]()
    torch.manual_seed(case.seed)
    expected = build_model(tree, torch.device("cpu"))
    got_state, want_state = rendered.state_dict(), expected.state_dict()
    assert list(got_state) == list(want_state)
    for name, tensor in want_state.items():
        assert torch.equal(got_state[name], tensor), name
    assert [(n, p.requires_grad) for n, p in rendered.named_parameters()] == [
        (n, p.requires_grad) for n, p in expected.named_parameters()
    ]
    assert [n for n, _ in rendered.named_modules()] == [n for n, _ in expected.named_modules()]
    rendered.eval()
    expected.eval()
    x = torch.randn(3, tree.width)
    assert torch.equal(rendered(x), expected(x))


def _observations(outcome: Any) -> list[dict[str, Any]]:
    return [
        {
            "losses": obs["losses"],
            "grad_norms": obs["grad_norms"],
            "params": obs.get("params", []),
            "ref": {k: obs["ref"].get(k, []) for k in ("losses", "grad_norms", "params")},
        }
        for obs in outcome.observations
    ]


def test_script_observes_what_the_pool_observes_and_passes(rank_pool: Any, tmp_path: Path) -> None:
    """On unmutated torch: exit 0, and every loss, gradient norm and parameter equals the pool's
    for the same case, on every rank, bit for bit."""
    if rank_pool.world_size != 2 or rank_pool.backend != "gloo":
        pytest.skip("compares with a 2-rank gloo pool (the default --shardfuzz-world-size / --shardfuzz-backend)")
    case = _rich_case()
    outcome = rank_pool.run(case)
    assert outcome.ok, outcome
    script = tmp_path / "repro.py"
    script.write_text(render_entry(_entry(case)))
    result = _torchrun(script, {"REPRO_OBSERVATIONS": str(tmp_path / "obs.json")})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout
    runs = json.loads((tmp_path / "obs.json").read_text())
    from_script = [{**composed, "ref": reference} for composed, reference in runs]
    for rank, (got, want) in enumerate(zip(from_script, _observations(outcome))):
        for key in ("losses", "grad_norms", "params"):
            assert got[key] == want[key], f"rank {rank} {key}"
            assert got["ref"][key] == want["ref"][key], f"rank {rank} reference {key}"


def test_script_fails_under_a_real_fault(tmp_path: Path) -> None:
    """The same script exits non-zero when torch chunks reduce-scatter gradients on dim 0 (P01)."""
    script = tmp_path / "repro.py"
    script.write_text(render_entry(_entry(_rich_case())))
    result = _torchrun(script, mutant_env("P01_shard_dim_chunk"))
    assert result.returncode != 0, result.stdout + result.stderr
    assert "REPRODUCED mismatch:parity@fsdp2" in result.stdout or "FAIL (" in result.stdout, result.stdout


def test_nccl_without_cuda_is_a_usage_error(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    script = tmp_path / "repro.py"
    script.write_text(render_entry(_entry(_rich_case())))
    result = subprocess.run(
        [sys.executable, str(script), "--backend", "nccl"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert "--backend nccl needs CUDA" in result.stderr


def test_cli_writes_the_script(tmp_path: Path) -> None:
    path, _ = save_entry(tmp_path, _entry(_rich_case()))
    out = tmp_path / "repro.py"
    result = run_cli("repro", str(path), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_text() == render_entry(_entry(_rich_case()), source=str(path))
    assert f"--nproc-per-node 2 {out}" in result.stderr
    printed = run_cli("repro", str(path))
    assert printed.stdout == out.read_text()


# -- refusals ------------------------------------------------------------------------------------


def _with(case: Case, **changes: Any) -> Case:
    body = case.body
    assert isinstance(body, ParityBody)
    return dataclasses.replace(case, body=dataclasses.replace(body, **changes))


def test_unrendered_features_are_refused_naming_the_field() -> None:
    case = _with(
        _rich_case(),
        composition=Composition(shards=(ShardSpec(path=""),), replicates=("1",), checkpoints=("0",)),
        training=Training(),
    )
    with pytest.raises(InvalidArgument) as e:
        render_entry(_entry(case), source="corpus/x.json")
    message = str(e.value)
    assert message.startswith("corpus/x.json: ")
    assert "case.body.composition.replicates" in message and "case.body.composition.checkpoints" in message


def test_a_wrapper_case_is_refused() -> None:
    case = _with(_rich_case(), composition=Composition(wrapper=Wrapper.DDP))
    with pytest.raises(InvalidArgument, match=r"case\.body\.composition\.wrapper: \"ddp\""):
        render_entry(_entry(case))


def test_a_new_field_is_refused_unless_it_holds_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stands for a field added to the case model after the renderer: here ShardSpec.shard_dim,
    taken out of what the renderer knows."""
    known = {**repro.KNOWN_FIELDS, ShardSpec: repro.KNOWN_FIELDS[ShardSpec] - {"shard_dim"}}
    monkeypatch.setattr(repro, "KNOWN_FIELDS", known)
    with pytest.raises(InvalidArgument, match=r"case\.body\.composition\.shards\[0\]\.shard_dim: 1 .*default 0"):
        render_entry(_entry(_rich_case()))
    plain = _with(_rich_case(), composition=Composition(shards=(ShardSpec(path=""),)))
    assert "fully_shard(model, mesh=mesh" in render_entry(_entry(plain))


def test_a_new_enum_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    known = {**repro.KNOWN_VALUES, LeafKind: repro.KNOWN_VALUES[LeafKind] - {LeafKind.DROPOUT}}
    monkeypatch.setattr(repro, "KNOWN_VALUES", known)
    with pytest.raises(InvalidArgument, match=r"children\[2\]\.kind: LeafKind\.DROPOUT"):
        render_entry(_entry(_rich_case()))


def test_a_renderer_out_of_date_with_the_case_model_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    known = {**repro.KNOWN_FIELDS, Leaf: repro.KNOWN_FIELDS[Leaf] | {"no_such_field"}}
    monkeypatch.setattr(repro, "KNOWN_FIELDS", known)
    with pytest.raises(InvalidArgument, match=r"out of date.*no_such_field"):
        render_entry(_entry(_rich_case()))


def test_other_properties_of_parity_bodies_are_refused() -> None:
    case = dataclasses.replace(_rich_case(), property="mixed_precision")
    with pytest.raises(InvalidArgument, match="'mixed_precision'"):
        render_entry(_entry(case))


def test_cli_refuses_a_fault_case_with_exit_2(tmp_path: Path) -> None:
    case = Case(property="_fault", world_size=2, seed=0, body=FaultBody(action=FaultAction.HANG))
    path, _ = save_entry(tmp_path, dataclasses.replace(_entry(case), signature="hang:_fault@x", kind="hang"))
    result = run_cli("repro", str(path), "-o", str(tmp_path / "r.py"))
    assert result.returncode == 2
    assert str(path) in result.stderr and "self-test" in result.stderr
    assert not (tmp_path / "r.py").exists()


def test_cli_names_an_unwritable_output(tmp_path: Path) -> None:
    path, _ = save_entry(tmp_path, _entry(_rich_case()))
    target = tmp_path / "no" / "such" / "dir" / "r.py"
    result = run_cli("repro", str(path), "-o", str(target))
    assert result.returncode == 2
    assert str(target) in result.stderr
