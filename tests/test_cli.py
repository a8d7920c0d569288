"""The command-line contract: exit codes, messages that name bad input, explore and replay."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

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
        (("explore", "--reruns", "-1"), "--reruns"),
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
    # The budget counts from the process's start, the ranks' start-up included, so a short budget
    # alone can end before the first case on a loaded machine: the case count ends this one.
    result = run_cli(
        "explore", "--max-examples", "2", "--budget", "90", "--seed", "3", "--no-database",
        "--corpus", str(corpus), "--report", str(tmp_path / "r"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["cases"] > 0
    assert all(f["known"] for f in summary["failures"]), summary["failures"]
    assert sum(summary["cases_per_property"].values()) == summary["cases"]
    assert {p.name for p in corpus.glob("*.json")} == before


def test_the_reruns_default_in_the_help_is_the_campaigns():
    from fuzz.explore import RERUNS

    result = run_cli("explore", "--help")
    assert result.returncode == 0, result.stderr
    assert f"(default {RERUNS};" in " ".join(result.stdout.split())


def test_a_feature_filter_goes_to_every_pool():
    from fuzz.campaign import _child_argv
    from fuzz.cli import build_parser

    args = build_parser().parse_args(["explore", "--pools", "2", "--feature", "knob:", "--feature", "writer:"])
    argv = _child_argv(args, 7, ["parity"], Path("r"))
    assert argv[argv.index("--feature") :][:4] == ["--feature", "knob:", "--feature", "writer:"]


@pytest.mark.slow  # a campaign end to end (35 s); the matching itself: tests/test_corpus.py, tests/test_known.py
def test_a_known_bug_met_through_another_property_is_not_new(tmp_path):
    """A known entry's exception met through another property is that known bug: reported as
    such (naming the entry), not saved again, exit 0. The pool self-test's raising rank stands
    in for the bug."""
    env = {"SHARDFUZZ_FAULT_ACTIONS": "raise"}
    corpus, report = tmp_path / "corpus", tmp_path / "r"
    args = ("explore", "--property", "_fault", "--max-examples", "2", "--seed", "1", "--no-database", "--reruns", "1")
    first = run_cli(*args, "--corpus", str(corpus), env=env)
    assert first.returncode == 1, first.stderr
    (path,) = corpus.glob("*.json")
    data = json.loads(path.read_text())
    kind, prop, detail = data["signature"].split(":", 2)
    assert (kind, prop) == ("exception", "_fault"), data["signature"]
    assert data["reruns"] == data["reproduced"] == 1  # --reruns 1
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


@pytest.mark.slow  # in CI, test_corpus_cli's campaign under the same fault covers this path and more
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


_ENTRY = "corpus/parity-mismatch-da0c9d4e06cd.json"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("explore", "--corpus", "README.md", "--no-database"), "--corpus README.md: exists and is not a directory"),
        (("explore", "--corpus", "README.md/sub"), "--corpus README.md/sub: README.md is not a directory"),
        (("explore", "--report", "README.md", "--no-database"), "--report README.md: exists and is not a directory"),
        (("explore", "--database", "README.md"), "--database README.md: exists and is not a directory"),
        (("repro", _ENTRY, "-o", "no/such/dir/r.py"), "-o no/such/dir/r.py: directory no/such/dir does not exist"),
        (("repro", _ENTRY, "-o", "corpus"), "-o corpus: is a directory; name a file"),
    ],
)
def test_a_bad_path_is_refused_before_the_campaign_starts(args, message):
    result = run_cli(*args, "--budget", "20") if args[0] == "explore" else run_cli(*args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [f"python -m fuzz {args[0]}: error: {message}"]


def _read_only(directory: Path) -> list[str] | None:
    """A command prefix under which ``directory`` cannot be written: none where its mode stops
    writes, a read-only bind mount in a private mount namespace where it does not (root), else
    None."""
    directory.chmod(0o555)
    try:
        fd, probe = tempfile.mkstemp(dir=directory)
    except OSError:
        return []
    os.close(fd)
    os.unlink(probe)
    if shutil.which("unshare") is None:
        return None
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    prefix = ["unshare", "--map-root-user", "--mount", "sh", "-c", script, str(directory)]
    works = subprocess.run([*prefix, "true"], capture_output=True).returncode == 0
    blocked = subprocess.run([*prefix, "touch", str(directory / "probe")], capture_output=True).returncode != 0
    return prefix if works and blocked and not (directory / "probe").exists() else None


def test_a_read_only_corpus_is_refused_before_the_campaign_starts(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    prefix = _read_only(corpus)
    if prefix is None:
        pytest.skip("running as root, where a directory's mode does not stop writes, and no mount namespace")
    try:
        result = subprocess.run(
            [*prefix, sys.executable, "-m", "fuzz", "explore", "--corpus", str(corpus), "--budget", "20",
             "--no-database"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        corpus.chmod(0o755)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"python -m fuzz explore: error: --corpus {corpus}: not writable ("), line


@pytest.mark.slow  # the benchmark run whole (28 s); hangs ended before the deadline: tests/test_pool.py
def test_bench_hang_prints_the_cost_of_each_planted_deadlock():
    """Not timed: the figures are the benchmark's output. Each plant deadlocks where it says and
    ends as a hang before the 60 s deadline."""
    result = run_cli("bench", "--hang", "--world-size", "2", timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for plant in ("all_reduce", "barrier"):
        assert re.search(rf"^hang cost: {plant}, gloo, 2 ranks: [0-9.]+s", out, re.M), out
    assert "rank 1 in torch/distributed/distributed_c10d.py:all_reduce" in out, out
    assert "rank 1 in torch/distributed/distributed_c10d.py:barrier" in out, out
    assert "ended by: deadline" not in out, out
