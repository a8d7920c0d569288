"""The command-line contract: exit codes, messages that name bad input, explore and replay."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import ROOT, mutant_env, run_cli


def test_properties_lists_parity_and_hides_the_self_test():
    result = run_cli("properties")
    assert result.returncode == 0
    names = [line.split()[0] for line in result.stdout.splitlines()]
    assert "parity" in names
    assert "_fault" not in names


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("explore", "--budget", "soon"), "soon"),
        (("explore", "--world-size", "0"), "--world-size"),
        (("explore", "--property", "no-such-property", "--budget", "1"), "no-such-property"),
        (("replay", "does/not/exist.json"), "does/not/exist.json"),
        (("frobnicate",), "frobnicate"),
    ],
)
def test_bad_input_exits_2_with_a_message_naming_it(args, named):
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    assert named in result.stderr


def test_replay_of_a_newer_schema_entry_exits_2(tmp_path):
    entry = tmp_path / "future.json"
    entry.write_text(json.dumps({"schema": 99, "case": {}}))
    result = run_cli("replay", str(entry))
    assert result.returncode == 2
    assert "newer" in result.stderr and str(entry) in result.stderr


def _corpus_with_known_bugs(tmp_path):
    """A scratch corpus holding the project's known torch bugs, so hitting them is not new."""
    corpus = tmp_path / "corpus"
    shutil.copytree(ROOT / "corpus", corpus)
    return corpus, {p.name for p in corpus.glob("*.json")}


def test_short_campaign_on_unmutated_torch_exits_0_and_reports(tmp_path):
    corpus, before = _corpus_with_known_bugs(tmp_path)
    result = run_cli(
        "explore", "--budget", "8", "--seed", "3", "--no-database",
        "--corpus", str(corpus), "--report", str(tmp_path / "r"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["cases"] > 0
    assert all(f["known"] for f in summary["failures"]), summary["failures"]
    assert sum(summary["cases_per_property"].values()) == summary["cases"]
    assert {p.name for p in corpus.glob("*.json")} == before


def test_a_known_bug_met_through_another_property_is_not_new(tmp_path):
    """A known entry's exception met through another property is that known bug: reported as
    such (naming the entry), not saved again, exit 0. The pool self-test's raising rank stands
    in for the bug."""
    env = {"SHARDFUZZ_FAULT_ACTIONS": "raise"}
    corpus, report = tmp_path / "corpus", tmp_path / "r"
    args = ("explore", "--property", "_fault", "--max-examples", "2", "--seed", "1", "--no-database")
    first = run_cli(*args, "--corpus", str(corpus), env=env)
    assert first.returncode == 1, first.stderr
    (path,) = corpus.glob("*.json")
    data = json.loads(path.read_text())
    kind, prop, detail = data["signature"].split(":", 2)
    assert (kind, prop) == ("exception", "_fault"), data["signature"]
    elsewhere = f"exception:parity:{detail}"
    data.update(signature=elsewhere, status="known", upstream="pytorch/pytorch#1")
    path.write_text(json.dumps(data))

    again = run_cli(*args, "--corpus", str(corpus), "--report", str(report), env=env)
    assert again.returncode == 0, again.stderr
    (failure,) = json.loads((report / "summary.json").read_text())["failures"]
    assert failure["known"] and failure["known_as"] == elsewhere
    assert failure["signature"] == f"exception:_fault:{detail}"
    assert f"known (as {elsewhere})" in again.stderr
    assert list(corpus.glob("*.json")) == [path]


def test_campaign_under_a_fault_saves_an_entry_that_replays(tmp_path):
    env = mutant_env("P01_shard_dim_chunk")
    corpus, before = _corpus_with_known_bugs(tmp_path)
    result = run_cli(
        "explore", "--budget", "30", "--seed", "1", "--property", "parity", "--no-database",
        "--corpus", str(corpus), env=env,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    new = [corpus / n for n in sorted({p.name for p in corpus.glob("*.json")} - before)]
    entries = [p for p in new if json.loads(p.read_text())["signature"] == "mismatch:parity@fsdp2"]
    assert entries, result.stderr
    data = json.loads(entries[0].read_text())
    assert data["kind"] == "mismatch"
    assert data["status"] == "new"
    assert data["reproduced"] == data["reruns"] > 0
    assert data["versions"]["torch"]

    assert run_cli("replay", str(entries[0]), env=env).returncode == 1
    fixed = run_cli("replay", str(entries[0]))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "passes now" in fixed.stdout
