"""The corpus from the command line: a fault found by explore becomes an entry that replays and
a repro script that reproduces it under torchrun; `corpus` lists entries and names bad ones;
committed entries run as regression tests (tests/test_corpus_entries.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from fuzz.corpus import Entry, save_entry
from fuzz.model import Block, Case, Composition, Leaf, LeafKind, ModuleTree, ParityBody, ShardSpec, Training
from tests.conftest import ROOT, mutant_env, run_cli, torchrun


def test_a_fault_found_by_explore_replays_and_reproduces_from_a_script(tmp_path: Path) -> None:
    fault = mutant_env("P01_shard_dim_chunk")
    corpus, database = tmp_path / "corpus", tmp_path / "db"
    # The project's known torch bugs are known here too, so the campaign does not stop at them.
    shutil.copytree(ROOT / "corpus", corpus)
    before = set(corpus.glob("*.json"))
    found = run_cli(
        "explore",
        "--property",
        "parity",
        "--max-examples",
        "150",
        "--seed",
        "2",
        "--corpus",
        str(corpus),
        "--database",
        str(database),
        env=fault,
    )
    assert found.returncode == 1, found.stderr
    # Under this fault the parity property fails as a fully_shard mismatch, charged to plain
    # fully_shard (and, where the campaign also drew SPMD compositions, to `fsdp2+spmd` as a second
    # entry); a campaign may also meet a known torch bug on the way; those are not the subject here.
    new = sorted(set(corpus.glob("*.json")) - before)
    signatures = {p: json.loads(p.read_text())["signature"] for p in new}
    plain = [p for p, signature in signatures.items() if re.search(r"@fsdp2(?![+\w])", signature)]
    assert plain, f"no plain fully_shard entry among {sorted(signatures.values())}"
    entry = plain[0]
    assert any(database.rglob("*")), "explore saved nothing to the Hypothesis database"
    listing = run_cli("corpus", "--corpus", str(corpus))
    assert listing.returncode == 0, listing.stderr
    assert entry.name in listing.stdout and json.loads(entry.read_text())["signature"] in listing.stdout

    assert run_cli("replay", str(entry), env=fault).returncode == 1
    script = tmp_path / "repro.py"
    written = run_cli("repro", str(entry), "-o", str(script))
    assert written.returncode == 0, written.stderr
    broken = torchrun(script, fault)
    assert broken.returncode != 0, broken.stdout + broken.stderr
    assert "REPRODUCED" in broken.stdout, broken.stdout

    fixed = run_cli("replay", str(entry))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    passing = torchrun(script)
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert "PASS" in passing.stdout


def _passing_case(world_size: int = 2) -> Case:
    """One Linear sharded on dim 1: passes on unmutated torch."""
    tree = ModuleTree(width=8, root=Block(children=(Leaf(LeafKind.LINEAR, bias=False),)))
    body = ParityBody(
        tree=tree,
        composition=Composition(shards=(ShardSpec(path="", reshard_after_forward=False, shard_dim=1),)),
        training=Training(lr=0.05, steps=1, batch_per_rank=3),
    )
    return Case(property="parity", world_size=world_size, seed=104, body=body)


def _entry(case: Case, signature: str, **fields: object) -> Entry:
    return Entry(case=case, kind="mismatch", signature=signature, summary="made up for the test", **fields)  # type: ignore[arg-type]


def _mixed_corpus(directory: Path) -> tuple[Path, Path, Path]:
    """A readable entry, a corrupted one and one of a newer schema, side by side."""
    good, _ = save_entry(directory, _entry(_passing_case(), "mismatch:parity@fsdp2", count=3))
    corrupted = directory / "parity-mismatch-corrupted.json"
    corrupted.write_text(good.read_text()[:40])
    newer = directory / "parity-mismatch-from-the-future.json"
    newer.write_text(json.dumps({**json.loads(good.read_text()), "schema": 99}))
    return good, corrupted, newer


def test_corpus_lists_what_it_can_read_and_names_what_it_cannot(tmp_path: Path) -> None:
    good, corrupted, newer = _mixed_corpus(tmp_path)
    result = run_cli("corpus", "--corpus", str(tmp_path))
    assert result.returncode == 2
    header, *rows, counts = result.stdout.splitlines()
    assert header.split() == ["file", "status", "size", "upstream", "bug", "/", "signature"]
    assert len(rows) == 1
    assert rows[0].split() == [good.name, "new", "2x1", "not", "triaged", "mismatch:parity@fsdp2"]
    assert counts == "1 entries, 1 bugs: 0 with no upstream issue found, 1 not triaged"
    errors = result.stderr.splitlines()
    assert any(str(corrupted) in line and "cannot read" in line for line in errors), result.stderr
    assert any(str(newer) in line and "newer" in line and "upgrade" in line for line in errors), result.stderr


def test_bad_entries_are_refused_by_name_and_the_rest_still_replays(tmp_path: Path) -> None:
    good, corrupted, newer = _mixed_corpus(tmp_path)
    for bad in (corrupted, newer):
        for command in ("replay", "repro"):
            result = run_cli(command, str(bad))
            assert result.returncode == 2, (command, bad, result.stderr)
            assert str(bad) in result.stderr
    replayed = run_cli("replay", str(good))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "passes now" in replayed.stdout
    assert run_cli("repro", str(good)).returncode == 0


def test_corpus_of_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    result = run_cli("corpus", "--corpus", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert str(tmp_path / "nowhere") in result.stderr


def test_corpus_entries_run_as_regression_tests(tmp_path: Path) -> None:
    """tests/test_corpus_entries.py over a corpus of each kind: a fixed bug passes, a known bug
    that no longer fails breaks the (strict xfail) run, another world size is skipped with the
    option that runs it, an unreadable file fails naming itself."""
    corpus = tmp_path / "corpus"
    fixed, _ = save_entry(corpus, _entry(_passing_case(), "mismatch:parity@fsdp2"))
    known, _ = save_entry(
        corpus, _entry(_passing_case(), "mismatch:parity:loss", status="known", upstream="pytorch/pytorch#1")
    )
    elsewhere, _ = save_entry(corpus, _entry(_passing_case(world_size=4), "mismatch:parity:param"))
    broken = corpus / "parity-mismatch-broken.json"
    broken.write_text("{")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/test_corpus_entries.py",
            f"--shardfuzz-corpus={corpus}",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-rA",
            "-q",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    outcomes = {
        name: outcome
        for outcome, name in re.findall(
            r"^(PASSED|FAILED|XFAIL|XPASS|ERROR) \S*test_corpus\[([^\]]+)\]", result.stdout, re.M
        )
    }
    skipped = re.findall(r"^SKIPPED \[1\] .*", result.stdout, re.M)
    assert outcomes.get("directory") == "PASSED", result.stdout
    assert outcomes.get(fixed.name) == "PASSED", result.stdout
    assert outcomes.get(known.name) == "FAILED", result.stdout  # [XPASS(strict)]
    assert "XPASS(strict)" in result.stdout and "pytorch/pytorch#1" in result.stdout
    assert outcomes.get(broken.name) == "FAILED", result.stdout
    assert f"{broken}: cannot read corpus entry" in result.stdout
    assert any("--shardfuzz-world-size 4" in line and elsewhere.name in line for line in skipped), result.stdout
    assert result.returncode == 1


def test_the_view_by_bug_names_each_bug_once_with_its_upstream_state(tmp_path: Path) -> None:
    from fuzz import known

    bug = next(b for b in known.BUGS.values() if b.upstream == known.NONE_FOUND)
    case = _passing_case()
    save_entry(tmp_path, _entry(case, "mismatch:parity@a", status="known", bug=bug.id))
    save_entry(tmp_path, _entry(case, "mismatch:parity@b", status="known", bug=bug.id))
    save_entry(tmp_path, _entry(case, "mismatch:parity@c"))
    result = run_cli("corpus", "--corpus", str(tmp_path), "--by-bug")
    assert result.returncode == 0, result.stderr
    header, *rows, counts = result.stdout.splitlines()
    assert header.split() == ["bug", "upstream", "entries", "torch", "title"]
    (line,) = [r for r in rows if r.startswith(bug.id)]
    assert line.split()[1:4] == ["none", "found", "2"] and line.endswith(bug.title)
    assert counts == "3 entries, 2 bugs: 1 with no upstream issue found, 1 not triaged"
