"""Campaigns under a known bug's fix (``explore --fix BUG``): the ranks run torch with the fix
of fuzz/fixes/BUG.json applied, and the registry takes the bug for absent, so that a path the
strategies keep rare while the bug is there can be soaked, and whatever still fails on it is
reported as new rather than charged to the bug."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz import known, patching
from fuzz.corpus import CorpusIndex, load_corpus, load_entry
from fuzz.errors import InvalidArgument
from fuzz.model import Composition, ShardSpec
from strategies._odds import keep_known
from strategies._options import has_dp_mesh_dims
from tests.conftest import ROOT, run_cli

MSE = known.DTENSOR_MSE_LOSS
#: The mse bug's minimal case: a one-step SPMD program whose loss is F.mse_loss of DTensors.
MSE_ENTRY = ROOT / "corpus" / "parity-mismatch-f8abf11c38c5.json"


@pytest.fixture
def under_mse_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(known.FIXED_ENV, MSE.id)


def test_a_bug_under_its_fix_is_met_by_no_case_and_tags_no_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    case = load_entry(MSE_ENTRY).case
    comp = case.body.composition  # type: ignore[union-attr]
    assert known.meets(case, MSE) and MSE in known.explains(case, "mismatch")
    assert known.mismatch_tags(comp).endswith(MSE.tag)
    monkeypatch.setenv(known.FIXED_ENV, f"{known.DIVIDE_FACTOR_TWICE.id},{MSE.id}")
    assert known.fixed() == {known.DIVIDE_FACTOR_TWICE.id, MSE.id}
    assert not known.meets(case, MSE)
    assert MSE not in known.explains(case, "mismatch")
    assert MSE.tag not in known.mismatch_tags(comp)


def test_the_shard1_setup_tag_stays_under_the_fsdp1_bug_s_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """``:shard1`` names a setup that other bugs' entries carry too (the divide factor's on a
    (2, 1) mesh): fixing FSDP1's shard-dim-1 bug must not rename their mismatches."""
    comp = Composition(shards=(ShardSpec(path=""),), mesh=(2, 1))
    assert known.mismatch_tags(comp) == known.FSDP1_HSDP_SHARD1.tag
    monkeypatch.setenv(known.FIXED_ENV, known.FSDP1_HSDP_SHARD1.id)
    assert known.mismatch_tags(comp) == known.FSDP1_HSDP_SHARD1.tag


def test_a_bug_under_its_fix_has_corpus_entries_that_take_no_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    entries, _ = load_corpus(ROOT / "corpus")
    entry = load_entry(MSE_ENTRY)
    index = CorpusIndex(entries)
    hit = index.match(entry.signature, entry.case, "mismatch")
    assert hit is not None and hit[1].bug == MSE.id
    monkeypatch.setenv(known.FIXED_ENV, MSE.id)
    for signature in entry.signatures:
        hit = index.match(signature, entry.case, "mismatch")
        assert hit is None or hit[1].bug != MSE.id, signature


def test_the_strategies_keep_a_bug_under_its_fix_every_time(under_mse_fix: None) -> None:
    @given(st.data())
    def always(data: st.DataObject) -> None:
        assert data.draw(st.composite(lambda draw: keep_known(draw, MSE))())

    always()


def test_without_the_fix_the_strategies_keep_the_bug_rare() -> None:
    kept = []

    @given(st.data())
    def sample(data: st.DataObject) -> None:
        kept.append(data.draw(st.composite(lambda draw: keep_known(draw, MSE))()))

    sample()
    assert False in kept


def _applies(bug: known.KnownBug) -> bool:
    return patching.fault_applies({"changes": [{"module": p.module, "old": p.old} for p in bug.fix]})


@pytest.mark.skipif(not _applies(MSE), reason="the fix is written against another torch's source")
def test_fix_env_writes_the_fix_and_names_the_bug(tmp_path: Path) -> None:
    env = patching.fix_env([MSE.id, MSE.id], str(tmp_path))
    assert env[known.FIXED_ENV] == MSE.id
    fault = json.loads(Path(env["SHARDFUZZ_FAULT"]).read_text())
    assert fault["changes"] == [{"module": p.module, "old": p.old, "new": p.new} for p in MSE.fix]
    assert str(ROOT / "tests" / "faults" / "harness") in env["PYTHONPATH"]


def test_fix_env_refuses_an_unknown_bug_one_without_a_fix_and_a_fix_this_torch_cannot_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InvalidArgument, match="no-such-bug: no known bug"):
        patching.fix_env(["no-such-bug"], str(tmp_path))
    unfixed = next(b for b in known.BUGS.values() if not b.fix)
    with pytest.raises(InvalidArgument, match=f"{unfixed.id}: the bug has no fix"):
        patching.fix_env([unfixed.id], str(tmp_path))
    monkeypatch.setattr(patching, "patch_env", lambda patches, directory: None)
    with pytest.raises(InvalidArgument, match="does not apply to torch"):
        patching.fix_env([MSE.id], str(tmp_path))


def test_the_fixes_go_to_every_pool() -> None:
    from fuzz.campaign import _child_argv
    from fuzz.cli import build_parser

    args = build_parser().parse_args(["explore", "--pools", "2", "--fix", MSE.id])
    argv = _child_argv(args, 7, ["parity"], Path("r"))
    assert argv[argv.index("--fix") :][:2] == ["--fix", MSE.id]


def test_explore_refuses_an_unknown_bug_with_exit_2() -> None:
    result = run_cli("explore", "--fix", "no-such-bug", "--budget", "1", "--no-database")
    assert result.returncode == 2, result.stderr
    assert "no-such-bug" in result.stderr and "Traceback" not in result.stderr


NEEDS_SPMD = pytest.mark.skipif(
    not has_dp_mesh_dims(), reason="the mse path is an SPMD program's (fully_shard dp_mesh_dims)"
)


@NEEDS_SPMD
def test_a_campaign_under_the_mse_fix_soaks_its_path_and_finds_nothing(tmp_path: Path) -> None:
    """Under the fix, every case the feature filter keeps is one the bug met, and none fails;
    the summary names the fix."""
    corpus = tmp_path / "corpus"
    shutil.copytree(ROOT / "corpus", corpus)
    result = run_cli(
        "explore", "--fix", MSE.id, "--property", "parity", "--feature", "loss:F.mse_loss",
        "--max-examples", "3", "--seed", "5", "--no-database", "--reruns", "0",
        "--corpus", str(corpus), "--report", str(tmp_path / "r"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"under the fixes of {MSE.id}" in result.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["fixes"] == [MSE.id]
    assert summary["cases"] == 3 and summary["features"].get("loss:F.mse_loss(DTensor)") == 3, summary["features"]
    assert summary["failures"] == [], summary["failures"]


@NEEDS_SPMD
def test_the_same_campaign_with_the_bug_there_reports_its_mismatch_as_new(tmp_path: Path) -> None:
    """The registry told the bug is fixed while the ranks run without the fix: the mismatch is
    not charged to the bug's entry, so the campaign reports it as new (exit 1). This is what a
    fix that does not fix would show."""
    corpus = tmp_path / "corpus"
    shutil.copytree(ROOT / "corpus", corpus)
    result = run_cli(
        "explore", "--property", "parity", "--feature", "loss:F.mse_loss",
        "--max-examples", "3", "--seed", "5", "--no-database", "--reruns", "0",
        "--corpus", str(corpus), "--report", str(tmp_path / "r"),
        env={known.FIXED_ENV: MSE.id},
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    new = [f for f in summary["failures"] if not f["known"]]
    assert new and all(f["kind"] == "mismatch" and f["bug"] != MSE.id for f in new), new


def test_a_training_only_bug_accounts_for_a_resume_into_another_layout_only() -> None:
    """The mse bug doubles the gradient of an SPMD program with F.mse_loss: a resume from it into
    another layout trains differently (its mismatch is the bug), a resume into the same
    composition meets it alike on both sides, and a round trip carries values, not gradients."""
    from fuzz.model import Case, DcpBody, DcpItem, Training

    spmd = replace(load_entry(MSE_ENTRY).case.body.composition, spmd_mse_loss=True)  # type: ignore[union-attr]
    tree = load_entry(MSE_ENTRY).case.body.tree  # type: ignore[union-attr]
    other = Composition(shards=(ShardSpec(path=""),))
    entries = (DcpItem.MODEL, DcpItem.OPTIMIZER)

    def dcp(target: Composition) -> Case:
        return Case("dcp", 2, 1, DcpBody(tree=tree, source=spmd, target=target, entries=entries, training=Training()))

    assert MSE.training_only
    assert MSE in known.explains(dcp(other), "mismatch", known.RESUME_PARAMS)
    assert MSE in known.explains(dcp(other), "mismatch", known.RESUME_LOSS)
    assert MSE not in known.explains(dcp(spmd), "mismatch", known.RESUME_PARAMS)
    assert MSE not in known.explains(dcp(other), "mismatch", "model")
    assert MSE not in known.explains(dcp(other), "mismatch", "optimizer")
    index = CorpusIndex(load_corpus(ROOT / "corpus")[0])
    hit = index.match("mismatch:dcp:resume_params@async_save", dcp(other), "mismatch")
    assert hit is not None and hit[1].bug == MSE.id
    assert index.match("mismatch:dcp:resume_params@async_save", dcp(spmd), "mismatch") is None
