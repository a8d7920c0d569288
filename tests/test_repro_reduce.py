"""Reduced reproducer scripts (fuzz/repro/reduce.py): a reduced script still reproduces its
entry under torchrun and is smaller; an entry that does not reproduce is refused with exit 2
and the corpus is left as it was; the reduced scripts kept in the corpus are current."""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fuzz import known
from fuzz.corpus import Entry, load_entry
from fuzz.pool import ScriptOutcome
from fuzz.repro import render_entry
from fuzz.repro.harness import HIDE_ACCELERATORS, is_plain
from fuzz.repro.portable import portable
from fuzz.repro.printed import is_printed
from fuzz.repro.reduce import (
    HEADER,
    RATE_RUNS,
    from_current_sources,
    header_fields,
    is_current,
    passed,
    reduce_and_store,
    reproduced,
    run_kept,
    run_script,
    stored_path,
    stored_script,
    why_not,
)
from fuzz.repro.script import code_lines
from tests.conftest import ROOT, missing_api, run_cli, torchrun

#: A small known entry (2 ranks, about 10 s a run on CPU).
SMALL = "parity-mismatch-da0c9d4e06cd"
#: A small known exception entry (composable checkpoint with debug=True raises on every rank).
EXCEPTION = "parity-exception-3e90c3cc368a"
STORED = sorted((ROOT / "corpus").glob("*.repro.py"))
#: The stored scripts the reducer made (the others are printed from the case: fuzz.repro.printed).
REDUCED = [p for p in STORED if not is_printed(p.read_text())]
#: An entry whose stored script is a reduced one.
KEPT = "parity-mismatch-6176f16b4070"


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# About two minutes on an idle 2-core machine (measured: 121 s, 5 torchruns, 4 of them also with the
# bug's fix, besides the traced runs), four under load. CI keeps the pieces: the flattening, the
# folding and the judge's rewrites are unit-tested (test_repro_specialize, test_repro_values,
# test_repro_simplify), every stored script is checked current and a sample runs under torchrun.
@pytest.mark.slow
def test_a_reduced_script_reproduces_its_entry_and_is_smaller(tmp_path: Path) -> None:
    """Trace passes only (no delta debugging), so that it costs a few runs of the script."""
    path = tmp_path / f"{SMALL}.json"
    shutil.copy(ROOT / "corpus" / path.name, path)
    entry = load_entry(path)
    text, result = reduce_and_store(path, entry, budget_s=0)
    assert result is not None
    assert stored_path(path).read_text() == text
    assert text.splitlines()[1].startswith(HEADER)
    assert is_current(text, entry) and stored_script(path, entry) == text
    assert code_lines(text) < code_lines(render_entry(entry)) // 2
    assert reduce_and_store(path, entry, budget_s=0) == (text, None)  # kept: returned as it is
    done = torchrun(stored_path(path), nproc=entry.case.world_size)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"REPRODUCED {entry.signature}" in done.stdout


@pytest.mark.slow  # about a minute: a traced run, three torchruns, the pool's start, the budget
def test_delta_debugging_in_the_pool_shortens_a_script_that_still_reproduces_under_torchrun(tmp_path: Path) -> None:
    """An exception entry: its attempts after flattening run in the pool, the folded and the
    final scripts are confirmed under torchrun."""
    path = tmp_path / f"{EXCEPTION}.json"
    shutil.copy(ROOT / "corpus" / path.name, path)
    entry = load_entry(path)
    said: list[str] = []
    text, result = reduce_and_store(path, entry, budget_s=15, say=said.append)
    assert result is not None
    # Under torchrun: the flattened script, the final one and its plain form, and the folded one where folding
    # kept a change (a fold the bug's fix rejects leaves the flattened script, confirmed already).
    refused = "does not pass with the bug's fix"
    folded_kept = not any(refused in a and "folded" in b for a, b in itertools.pairwise(said))
    # How many pooled attempts fit in 15 s depends on the machine's load (8 beside 4-rank torchruns
    # on 2 cores); that the pool ran them, and what they cut (below), does not.
    assert result.pool_attempts > 0 and result.torchrun_attempts == 3 + folded_kept, said  # and the plain form
    assert result.attempts == result.pool_attempts + result.torchrun_attempts
    assert any("statements cut" in line for line in said), said
    # Delta debugging cut the folded script (how far within 15 s depends on the machine's load).
    folded = [int(m[1]) for line in said if (m := re.match(r"\s*folded: (\d+) code lines", line))]
    assert len(folded) == 1 and code_lines(text) < folded[0], said
    # The kept script is the plain form: the exception propagates, its rule is read from outside.
    attempt = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "attempt")
    assert is_plain(text) and not any(isinstance(n, ast.Try) for n in attempt.body), text
    assert any("the plain form" in line for line in said), said
    status, output, _ = run_kept(stored_path(path).read_text(), entry, timeout=240)
    assert status == 1, output[-3000:]
    assert f"REPRODUCED {entry.signature}" in output


def test_reducing_an_entry_that_does_not_reproduce_exits_2_and_changes_nothing(tmp_path: Path) -> None:
    """dcp-exception-1638758deb73 is a GPU-only bug: on CPU its script prints FAIL and exits 0."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    path = corpus / "dcp-exception-1638758deb73.json"
    shutil.copy(ROOT / "corpus" / path.name, path)
    before = _snapshot(corpus)
    out = tmp_path / "r.py"
    result = run_cli("repro", str(path), "--reduce", "-o", str(out))
    assert result.returncode == 2, result.stderr
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and str(path) in errors[0] and "does not reproduce" in errors[0], result.stderr
    assert _snapshot(corpus) == before
    assert not out.exists()


def test_reduce_refuses_corrupt_and_newer_entries_with_one_line(tmp_path: Path) -> None:
    good = ROOT / "corpus" / f"{SMALL}.json"
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text(good.read_text()[:200])
    newer = tmp_path / "newer.json"
    data = json.loads(good.read_text())
    data["case"]["schema"] = 99
    newer.write_text(json.dumps(data))
    before = _snapshot(tmp_path)
    for bad in (corrupt, newer):
        result = run_cli("repro", str(bad), "--reduce")
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and str(bad) in result.stderr, result.stderr
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("path", STORED, ids=[p.name.removesuffix(".repro.py") for p in STORED])
def test_every_stored_reduced_script_is_current(path: Path) -> None:
    """Reduce again (``python -m fuzz repro ENTRY --reduce``) when this fails: the entry changed
    since the script was reduced."""
    entry_path = path.with_name(path.name.removesuffix(".repro.py") + ".json")
    assert entry_path.exists(), f"{path.name} has no entry"
    entry = load_entry(entry_path)
    assert is_current(path.read_text(), entry), f"{path.name} is stale: run repro {entry_path.name} --reduce"


@pytest.mark.parametrize("path", STORED, ids=[p.name.removesuffix(".repro.py") for p in STORED])
def test_every_stored_reduced_script_parses_on_this_python(path: Path) -> None:
    """A script reduced under a newer Python (whose f-strings may reuse their quotes) must still
    run on the oldest one the suite supports (fuzz.repro.portable)."""
    compile(path.read_text(), str(path), "exec")


@pytest.mark.parametrize("path", REDUCED, ids=[p.name.removesuffix(".repro.py") for p in REDUCED])
def test_every_stored_reduced_script_hides_the_accelerators_before_torch_starts(path: Path) -> None:
    """A reduced script is a CPU program; a cut may have dropped what pinned a tensor or mesh to
    the CPU (``fully_shard`` without ``mesh=`` takes the GPU mesh where there is one), so on a
    GPU host its ``main`` hides the GPUs before anything else (fuzz.repro.harness)."""
    text = path.read_text()
    tree = ast.parse(text)
    main = next(
        n
        for n in tree.body
        if (isinstance(n, ast.FunctionDef) and n.name == "main") or (isinstance(n, ast.If) and is_plain(text))
    )
    statements = [ast.unparse(s) for s in main.body]
    assert HIDE_ACCELERATORS in statements, statements[:4]
    assert statements.index(HIDE_ACCELERATORS) <= 1 and statements[0] == "import os", statements[:4]


def test_portable_requotes_f_strings_only_where_the_code_is_unchanged() -> None:
    reused = "x = f'{p.rpartition(" + "'/t/'" + ")[2]}:{n}'\ny = 'f{a}'\n"
    fixed = portable(reused)
    assert fixed.splitlines()[0] == "x = f'{p.rpartition(\"/t/\")[2]}:{n}'"
    assert fixed.splitlines()[1] == "y = 'f{a}'"


class _TorchrunStub:
    """An oracle whose pool kept scripts that torchrun confirms only up to ``last_good``."""

    def __init__(self, last_good: int, kind: str = "exception", pool: object = True) -> None:
        self.pool, self.last_good, self.runs, self.said = pool, last_good, 0, ""
        self.quick_hang = kind == "hang"
        self.full: list[bool] = []

    def torchrun(self, code: str, full: bool = False) -> bool:
        self.runs += 1
        self.full.append(full)
        return int(code) <= self.last_good

    def say(self, text: str) -> None:
        self.said = text


@pytest.mark.parametrize("last_good", [-1, 0, 17, 98])
def test_a_final_script_torchrun_refuses_falls_back_to_the_last_kept_one_it_confirms(last_good: int) -> None:
    from fuzz.repro.reduce import BISECTIONS, _confirmed

    kept = [str(i) for i in range(100)]  # script i reproduces under torchrun while i <= last_good
    stub = _TorchrunStub(last_good)
    out = _confirmed("99", "folded", stub, "delta-debugged", kept)  # type: ignore[arg-type]
    assert out == (str(last_good) if last_good >= 0 else "folded")
    assert stub.runs <= 1 + BISECTIONS


def test_a_hang_script_reduced_with_the_short_wait_is_confirmed_with_the_full_one() -> None:
    from fuzz.repro.reduce import QUICK_HANG_AFTER_S, _confirmed, quick_hang

    # The hang entries' stored scripts are printed now; this is the last one the reducer kept.
    stored = (ROOT / "tests" / "regressions" / "state_dict-hang-dff6a54ad235.reduced.txt").read_text()
    quick = quick_hang(stored)
    assert f"time.sleep({QUICK_HANG_AFTER_S})" in quick
    assert "time.sleep(20)" not in quick and "time.sleep(20)" in stored
    compile(quick, "quick", "exec")
    # No pool (a hang's attempts all run under torchrun): the final script still runs once more,
    # with the full wait, and an earlier kept one is taken where it does not reproduce so.
    stub = _TorchrunStub(5, kind="hang", pool=None)
    assert _confirmed("9", "folded", stub, "delta-debugged", [str(i) for i in range(10)]) == "5"  # type: ignore[arg-type]
    assert stub.full and all(stub.full)
    plain = _TorchrunStub(5, kind="exception", pool=None)
    assert _confirmed("9", "folded", plain, "delta-debugged", []) == "9" and plain.runs == 0  # type: ignore[arg-type]


def _tiny(entry_name: str, body: str) -> tuple[str, object]:
    """The harness of ``entry_name``'s kind around an ``attempt`` of ``body``."""
    from fuzz.repro.harness import main_of

    entry = load_entry(ROOT / "corpus" / f"{entry_name}.json")
    code = f"def attempt(rank, world_size):\n{body}\n\n" + main_of(entry, entry.signature)
    return code + '\nif __name__ == "__main__":\n    main()\n', entry


def test_a_hang_script_that_passes_ends_once_every_rank_has_finished_and_says_pass_once() -> None:
    from fuzz.repro.reduce import run_script

    code, _ = _tiny("state_dict-hang-dff6a54ad235", "    import time\n    time.sleep(0.5 * rank)")
    status, output, seconds = run_script(code, timeout=60, nproc=2)
    assert status == 0 and output.count("PASS: every rank finished") == 1, output
    assert seconds < 15  # not the watcher's 20 s


def test_a_script_refuses_to_run_outside_torchrun_with_exit_2(tmp_path: Path) -> None:
    code, _ = _tiny("state_dict-hang-dff6a54ad235", "    pass")
    (tmp_path / "repro.py").write_text(code)
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    done = subprocess.run([sys.executable, str(tmp_path / "repro.py")], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "run it with: torchrun --nproc-per-node 2" in done.stderr


def test_a_pooled_script_whose_case_fails_another_way_exits_2_and_no_rank_says_pass() -> None:
    from fuzz.repro.reduce import run_script

    failed = "FAIL (not the entry's failure): rank 1 raised X"
    body = f"    if rank == 1:\n        return {failed!r}\n    return 'PASS: no rank raised'"
    code, _ = _tiny("state_dict-exception-6b7f874c0c8d", body)
    status, output, _ = run_script(code, timeout=60, nproc=2)
    assert status == 1 and "FAIL (not the entry's failure): rank 1" in output  # torchrun's own status
    assert "exitcode  : 2" in output and "PASS" not in output, output


class _StalePool:
    """A pool whose ranks hold a destroyed process group until they are respawned."""

    def __init__(self) -> None:
        self.stale, self.respawned, self.runs = True, 0, 0

    def run_script(self, code: str, *, function: str, deadline: float) -> object:
        from fuzz.pool import ScriptOutcome
        from fuzz.repro.reduce import STALE_GROUP

        self.runs += 1
        if self.stale:
            return ScriptOutcome({}, {0: f"builtins.RuntimeError: {STALE_GROUP} 3"}, {}, 0.1, False)
        return ScriptOutcome({0: "REPRODUCED exception:parity:x.Y@torch/a.py:f: boom"}, {}, {}, 0.1, False)

    def respawn(self) -> None:
        self.stale = False
        self.respawned += 1


def test_an_attempt_that_meets_a_destroyed_process_group_runs_again_on_fresh_ranks() -> None:
    from fuzz.repro.reduce import _Oracle

    entry = load_entry(ROOT / "corpus" / f"{EXCEPTION}.json")
    oracle = _Oracle(entry, "", "exception:parity:x.Y@torch/a.py:f", 60.0, lambda _: None)
    pool = _StalePool()
    oracle.pool = pool  # type: ignore[assignment]
    assert oracle.in_pool("def attempt(rank, world_size):\n    pass\n")
    # the first candidate runs twice, then RATE_RUNS times more: all on the respawned ranks
    assert (pool.respawned, pool.runs, oracle.respawns) == (1, 2 + RATE_RUNS, 1) and not oracle.fresh_each
    assert oracle.votes == 1
    assert oracle.in_pool("def attempt(rank, world_size):\n    pass\n") and pool.respawned == 1


def test_a_mismatch_judge_is_cut_only_where_the_bugs_fix_is_checked() -> None:
    """Without the fix, a mismatch candidate must observe exactly what the first one did (a cut
    judge or reference could make the mismatch); with the fix checked, passing there is what
    keeps the judge honest, and the observations may change."""
    from fuzz.repro.reduce import _Oracle

    entry = load_entry(ROOT / "corpus" / f"{SMALL}.json")
    assert entry.kind == "mismatch" and known.get(entry.bug or "").fix
    oracle = _Oracle(entry, "", entry.signature, 60.0, lambda _: None)
    first, other = (f"REPRODUCED {entry.signature}: observations {d}: x" for d in ("0123abcd", "ffff0000"))
    assert not oracle.judge_free
    assert oracle._same_observations(first) and not oracle._same_observations(other)
    oracle.fix_env = {"SHARDFUZZ_FAULT": "x"}
    assert oracle.judge_free and oracle._same_observations(other)
    # A kept script whose check is signature-free prints no observations: while its fix is
    # ready and not refused (the pool's first run comes before the fix is opened), that passes;
    # once the fix is refused, nothing without the first observations does.
    free = f"REPRODUCED {entry.signature}: x"
    waiting = _Oracle(entry, "", entry.signature, 60.0, lambda _: None)
    waiting._fix_ready = {"SHARDFUZZ_FAULT": "x"}
    assert not waiting.judge_free and waiting._same_observations(free)
    waiting._fix_ready = None
    assert not waiting._same_observations(free)
    exception = load_entry(ROOT / "corpus" / f"{EXCEPTION}.json")
    checked = _Oracle(exception, "", exception.signature, 60.0, lambda _: None)
    checked.fix_env = {"SHARDFUZZ_FAULT": "x"}
    assert not checked.judge_free


def test_a_script_reduced_from_older_sources_stays_current_until_refreshed(tmp_path: Path) -> None:
    """A change to the carried sources leaves a stored script current (it needs only torch);
    ``--refresh`` asks for it to be reduced again."""
    path = tmp_path / f"{SMALL}.json"
    shutil.copy(ROOT / "corpus" / path.name, path)
    entry = load_entry(path)
    text = stored_path(ROOT / "corpus" / path.name).read_text()
    fields = header_fields(text)
    older = text.replace(f"sources={fields['sources']}", "sources=0000000000000000", 1)
    stored_path(path).write_text(older)
    assert is_current(older, entry) and not from_current_sources(older, entry)
    assert stored_script(path, entry) == older
    assert stored_script(path, entry, refresh=True) is None
    edited = older.replace(f"entry={fields['entry']}", "entry=0000000000000000", 1)
    stored_path(path).write_text(edited)
    assert stored_script(path, entry) is None


def test_refresh_goes_with_reduce() -> None:
    result = run_cli("repro", "--all", "corpus", "--refresh")
    assert result.returncode == 2 and "--refresh goes with --reduce" in result.stderr, result.stderr


def _present_here(entry_path: Path) -> bool:
    import torch

    bug = load_entry(entry_path).bug
    return bool(bug) and known.present(known.get(bug), torch.__version__)


def _reproduces_under_torchrun(path: Path) -> None:
    entry_path = path.with_name(path.name.removesuffix(".repro.py") + ".json")
    entry = load_entry(entry_path)
    if not _present_here(entry_path):
        pytest.skip(f"{entry.bug} is not in this torch (its record's introduced_in, fixed_in)")
    if missing_api(entry.case):
        pytest.skip(f"{entry_path.name} is {missing_api(entry.case)}")
    status, output, _ = run_kept(path.read_text(), entry, timeout=240)
    assert status == 1, output[-3000:]
    if is_printed(path.read_text()):  # printed from the case: it names the tensor, or where torch raised
        said = r"^REPRODUCED: .+ where the .+ has " if entry.kind == "mismatch" else r"^REPRODUCED: rank \d+ raised "
        assert re.search(said, output, re.MULTILINE), output[-3000:]
        return
    assert reproduced(status, output) in (entry.signature, *entry.aliases), output[-3000:]


#: Stored scripts run under torchrun in every CI run (a few seconds each): one exception of
#: each body kind that has a small one, and a mismatch whose judge was cut down where its bug's
#: fix was checked (docs/repro.md; the test below runs it with the fix too).
SAMPLE = [
    "dcp-exception-d6daf354182c",
    "state_dict-exception-d75bbc271571",
    "parity-mismatch-da0c9d4e06cd",
    "parity-mismatch-009298376223",  # printed from the case (fuzz/repro/printed.py)
]


@pytest.mark.parametrize("name", SAMPLE)
def test_sample_stored_scripts_reproduce_under_torchrun(name: str) -> None:
    _reproduces_under_torchrun(ROOT / "corpus" / f"{name}.repro.py")


@pytest.mark.slow  # 46 torchruns, 5 to 60 s each
@pytest.mark.parametrize("path", STORED, ids=[p.name.removesuffix(".repro.py") for p in STORED])
def test_every_stored_script_reproduces_under_torchrun_where_its_bug_is_present(path: Path) -> None:
    _reproduces_under_torchrun(path)


def _passes_with_the_fix(path: Path, tmp: Path) -> None:
    """The stored script exits 0 on torch with its known bug's fix (fuzz.known.KnownBug.fix)."""
    from fuzz.patching import patch_env

    entry = load_entry(path.with_name(path.name.removesuffix(".repro.py") + ".json"))
    bug = known.get(entry.bug or "")
    assert bug.fix
    if missing_api(entry.case):
        pytest.skip(f"{path.name} is {missing_api(entry.case)}")
    env = patch_env(bug.fix, str(tmp))
    if env is None:
        pytest.skip(f"the fix of {bug.id} does not apply to this torch")
    done = torchrun(path, env=env, nproc=entry.case.world_size)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert passed(done.stdout), done.stdout[-2000:]  # PASS, not another failure


#: The stored scripts of known bugs that have a fix written (fuzz.known.KnownBug.fix).
FIXED = [
    p
    for p in STORED
    if (bug := load_entry(p.with_name(p.name.removesuffix(".repro.py") + ".json")).bug) and known.get(bug).fix
]


@pytest.mark.parametrize("name", ["state_dict-exception-d4322b68deab", "parity-mismatch-da0c9d4e06cd"])
def test_a_stored_script_passes_on_torch_with_its_bug_fixed(name: str, tmp_path: Path) -> None:
    """The second oracle, on an exception's script and a mismatch's (whose judge was cut down
    against it) in every CI run: the bug's fix turns the failure off."""
    path = ROOT / "corpus" / f"{name}.repro.py"
    assert path in FIXED
    _passes_with_the_fix(path, tmp_path)


@pytest.mark.slow  # a torchrun each
@pytest.mark.parametrize("path", FIXED, ids=[p.name.removesuffix(".repro.py") for p in FIXED])
def test_every_stored_script_passes_on_torch_with_its_bug_fixed(path: Path, tmp_path: Path) -> None:
    _passes_with_the_fix(path, tmp_path)


def test_fixes_are_written_for_bugs_of_this_torch() -> None:
    import torch

    assert len([b for b in known.BUGS.values() if b.fix and known.present(b, torch.__version__)]) >= 3


@pytest.mark.parametrize("bug", [b for b in known.BUGS.values() if b.fix], ids=lambda b: b.id)
def test_every_written_fix_applies_to_this_torch_where_its_bug_is_present(bug: known.KnownBug, tmp_path: Path) -> None:
    """A fix is written against one torch's code: where the bug is present here, its text must
    be there to replace (else the second oracle would go unchecked without a word). A fix
    written against one release's source only says so (``written_for``) and is skipped, with
    that word, on another."""
    import torch

    from fuzz.patching import patch_env

    if not known.present(bug, torch.__version__):
        pytest.skip(f"{bug.id} is not in torch {torch.__version__}")
    if patch_env(bug.fix, str(tmp_path)) is not None:
        return
    written_for = known.fix_written_for(bug.id)
    if written_for and known.release(written_for) != known.release(torch.__version__):
        pytest.skip(
            f"the fix is written against torch {written_for}'s source: on {torch.__version__} its entries' "
            "check with the fix in place does not run"
        )
    pytest.fail(f"the fix of {bug.id} does not apply to torch {torch.__version__}")


def test_the_reproduced_signature_is_read_whole_where_it_holds_a_space() -> None:
    crash = "crash:dcp:signal SIGSEGV@torch/distributed/fsdp/_state_dict_utils.py:param_hook"
    assert reproduced(1, f"REPRODUCED {crash}: rank 0 died: signal -11@torch/x.py:f\n") == crash
    assert reproduced(1, "REPRODUCED mismatch:parity@fsdp2:x: observations 0a: summary") == "mismatch:parity@fsdp2:x"
    assert reproduced(0, f"REPRODUCED {crash}: rank 0 died") is None
    unreduced = "REPRODUCED mismatch:parity@fsdp1:shard1 (param): 0.weight[1] after step 0"
    assert reproduced(1, unreduced) == "mismatch:parity@fsdp1:shard1"


def test_the_entry_hash_ignores_counters_and_fields_at_their_defaults() -> None:
    """A campaign that meets the entry again (its count), or a field the model gains later with
    a default, leaves the stored script current; a change to the case does not."""
    from dataclasses import replace

    from fuzz.model import to_jsonable
    from fuzz.repro.reduce import entry_hash

    entry = load_entry(ROOT / "corpus" / f"{SMALL}.json")
    assert entry_hash(replace(entry, count=entry.count + 7, reproduced=0)) == entry_hash(entry)
    sparse = to_jsonable(entry.case, sparse=True)
    assert "knobs" not in sparse["body"]["composition"]  # every knob at its default
    other = replace(entry, case=replace(entry.case, seed=entry.case.seed + 1))
    assert entry_hash(other) != entry_hash(entry)


def test_a_refresh_that_is_no_shorter_keeps_the_stored_script(tmp_path: Path, monkeypatch: Any) -> None:
    from fuzz.repro import reduce as reduce_module

    path = tmp_path / f"{KEPT}.json"
    shutil.copy(ROOT / "corpus" / path.name, path)
    entry = load_entry(path)
    text = stored_path(ROOT / "corpus" / path.name).read_text()
    older = text.replace(f"sources={header_fields(text)['sources']}", "sources=0000000000000000", 1)
    stored_path(path).write_text(older)
    longer = text + "\n".join(f"x{i} = {i}" for i in range(5)) + "\n"
    shorter = "\n".join(line for line in text.splitlines() if "REPRODUCED" not in line) + "\n"

    def fake(script: str) -> Any:
        def reduce_entry(entry: Entry, source: str = "", **_: Any) -> reduce_module.Reduction:
            lines = code_lines(script)
            return reduce_module.Reduction(script, lines, lines, 1.0, 1, "s")

        return reduce_entry

    said: list[str] = []
    with_fix: list[str] = []
    monkeypatch.setattr(
        "fuzz.repro.bench.run_fixed", lambda script, entry, directory: with_fix.append(script) or "passed"
    )
    monkeypatch.setattr(reduce_module, "reduce_entry", fake(longer))
    kept, _ = reduce_module.reduce_and_store(path, entry, refresh=True, say=said.append)
    assert kept == older and stored_path(path).read_text() == older and "kept the stored script" in said[-1]
    assert with_fix == [older]  # the stored script was run with its bug's fix, and passed
    # A stored script that does not pass with its bug's fix (reduced before the fix was
    # written) is replaced by the new reduction, which was checked with it, though longer.
    monkeypatch.setattr("fuzz.repro.bench.run_fixed", lambda script, entry, directory: "exit 1 in 9.0 s: REPRODUCED")
    replaced, _ = reduce_module.reduce_and_store(path, entry, refresh=True, say=said.append)
    assert replaced != older and stored_path(path).read_text() == replaced and "does not pass with" in said[-1]
    assert code_lines(replaced) > code_lines(older)
    stored_path(path).write_text(older)
    monkeypatch.setattr(reduce_module, "reduce_entry", fake(shorter))
    new, _ = reduce_module.reduce_and_store(path, entry, refresh=True)
    assert new != older and stored_path(path).read_text() == new and code_lines(new) < code_lines(older)


def test_an_exception_check_wants_the_entry_point_and_message_of_the_entry() -> None:
    """A reduced script whose exception has the entry's type and innermost frame but is another
    failure is not the entry's: nn.Module.__getattr__'s AttributeError, the entry's, is also what
    a module built without ``super().__init__()`` raises, outside the API the entry entered
    torch by or inside it with another message (two cuts the reducer once kept). The entry's own
    failure, met the same way as in the entry, reproduces."""
    from fuzz.repro.harness import main_source
    from fuzz.signature import entry_point

    entry = load_entry(ROOT / "corpus" / "state_dict-exception-d4322b68deab.json")
    tracebacks = [r.get("traceback") for r in entry.details["ranks"]]
    assert entry_point(tracebacks[0]) == "torch/distributed/checkpoint/state_dict.py:get_model_state_dict"
    source, _ = main_source(entry, entry.signature)
    call = "run_state_dict(case, case.body, ctx)"
    assert call in source
    prelude = (
        "from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict\n"
        "        from fuzz._rank.models import fuse\n"
        "        class Broken(torch.nn.Module):\n"
        "            def __init__(self): pass\n        "
    )
    verdicts = {}
    for name, body in {
        "outside": "Broken().to('cpu')",
        "inside": "get_model_state_dict(Broken())",
        "genuine": "m = torch.nn.Sequential(torch.nn.Linear(2, 2))\n        fuse(m, ('0',), 'hidden_children')\n"
        "        get_model_state_dict(m, options=StateDictOptions(dsd_fqn_modifiers='hidden_children'))",
    }.items():
        namespace: dict[str, Any] = {}
        exec(source.replace(call, prelude + body), namespace)
        verdicts[name] = namespace["attempt"](0, 2)
    for name in ("outside", "inside"):
        assert verdicts[name].startswith("FAIL (not the entry's failure)"), verdicts
        assert "module.py:__getattr__" in verdicts[name], verdicts
    assert verdicts["genuine"].startswith("REPRODUCED"), verdicts


def test_a_script_passes_only_when_every_verdict_says_so() -> None:
    assert passed("PASS: no rank raised\nPASS: no rank raised\n")
    assert passed("noise\nPASS or another failure: None\n")
    assert not passed("PASS: no rank raised\nFAIL (not the entry's failure): rank 1 raised KeyError@torch/x.py:f\n")
    assert not passed("PASS or another failure: mismatch:parity@fsdp2\n")
    assert not passed("REPRODUCED exception:x: rank 0 raised ...\n")
    assert not passed("")  # a script that said nothing did not pass


def test_a_fix_of_several_changes_is_applied_whole_at_import(tmp_path: Path) -> None:
    """A known bug's fix may change several places (fuzz.known.KnownBug.fix): the patch harness
    applies every change, in each module it names, and refuses a change whose text is not there
    exactly once."""
    import subprocess
    import sys

    from fuzz.patching import patch_env

    probe = (
        "import torch.distributed.checkpoint.state_dict as sd, torch.optim.sgd as sgd;"
        "print(sd.FIX_A, sd.FIX_B, sgd.FIX_C)"
    )
    patches = (
        known.Patch(
            "torch.distributed.checkpoint.state_dict", "\nimport contextlib\n", "\nimport contextlib\nFIX_A = 1\n"
        ),
        known.Patch(
            "torch.distributed.checkpoint.state_dict", "\nimport functools\n", "\nimport functools\nFIX_B = 2\n"
        ),
        known.Patch("torch.optim.sgd", "\nimport torch\n", "\nimport torch\nFIX_C = 3\n"),
    )
    env = patch_env(patches, str(tmp_path))
    assert env is not None
    done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **env}, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.split() == ["1", "2", "3"], done.stderr[-2000:]
    absent = known.Patch("torch.optim.sgd", "no such text in sgd.py", "x")
    assert patch_env((*patches, absent), str(tmp_path)) is None
    assert patch_env((), str(tmp_path)) is None


class _CachingPool:
    """A pool whose ranks keep what an attempt leaves in torch (a process-wide cache): an
    attempt reproduces only in ranks that have run none before."""

    def __init__(self) -> None:
        self.warm, self.respawned, self.runs = False, 0, 0

    def run_script(self, code: str, *, function: str, deadline: float) -> object:
        from fuzz.pool import ScriptOutcome

        self.runs += 1
        verdict = "PASS: no rank raised" if self.warm else "REPRODUCED exception:parity:x.Y@torch/a.py:f: boom"
        self.warm = True
        return ScriptOutcome({0: verdict}, {}, {}, 0.1, False)

    def respawn(self) -> None:
        self.warm = False
        self.respawned += 1


def test_attempts_run_on_fresh_ranks_where_the_first_does_not_reproduce_twice_in_the_same_ones() -> None:
    from fuzz.repro.reduce import _Oracle

    entry = load_entry(ROOT / "corpus" / f"{EXCEPTION}.json")
    said: list[str] = []
    oracle = _Oracle(entry, "", "exception:parity:x.Y@torch/a.py:f", 60.0, said.append)
    pool = _CachingPool()
    oracle.pool = pool  # type: ignore[assignment]
    code = "def attempt(rank, world_size):\n    pass\n"
    assert oracle.in_pool(code) and oracle.fresh_each and any("fresh ranks" in s for s in said)
    # again in the same ranks, then on fresh ones, RATE_RUNS times each
    assert (pool.respawned, pool.runs) == (RATE_RUNS, 1 + 2 * RATE_RUNS)
    assert oracle.in_pool(code) and oracle.in_pool(code)  # each on ranks of its own
    assert (pool.respawned, pool.runs) == (RATE_RUNS + 2, 3 + 2 * RATE_RUNS) and oracle.votes == 1
    # ranks that keep nothing: the pool stays warm
    steady = _Oracle(entry, "", "exception:parity:x.Y@torch/a.py:f", 60.0, lambda _: None)
    steady.pool = _StalePool()  # type: ignore[assignment]
    steady.pool.stale = False  # type: ignore[attr-defined]
    assert steady.in_pool(code) and steady.in_pool(code) and not steady.fresh_each
    assert steady.pool.respawned == 0  # type: ignore[attr-defined]


class _VaryingPool(_CachingPool):
    """A case that reproduces on its first run only, on whatever ranks: no state of the ranks'."""

    def run_script(self, code: str, *, function: str, deadline: float) -> object:
        self.warm = self.runs > 0
        return super().run_script(code, function=function, deadline=deadline)


def test_a_case_that_varies_from_run_to_run_keeps_the_pool_warm() -> None:
    from fuzz.repro.reduce import _Oracle

    entry = load_entry(ROOT / "corpus" / f"{EXCEPTION}.json")
    said: list[str] = []
    oracle = _Oracle(entry, "", "exception:parity:x.Y@torch/a.py:f", 60.0, said.append)
    pool = _VaryingPool()
    oracle.pool = pool  # type: ignore[assignment]
    assert oracle.in_pool("def attempt(rank, world_size):\n    pass\n")
    assert not oracle.fresh_each and any("varies from run to run" in s for s in said)
    assert (pool.respawned, pool.runs) == (RATE_RUNS, 1 + 2 * RATE_RUNS) and oracle.votes == 1


class _RacingPool(_CachingPool):
    """A racing case: whether a run reproduces follows ``pattern`` (R or P), on whatever ranks."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = pattern

    def run_script(self, code: str, *, function: str, deadline: float) -> object:
        self.warm = self.pattern[self.runs % len(self.pattern)] == "P"
        return super().run_script(code, function=function, deadline=deadline)


def test_a_racing_failure_keeps_a_candidate_only_if_it_reproduces_every_time_of_several() -> None:
    """A failure that reproduces now and then (a collective racing a hook): one lucky attempt of
    a candidate that reproduces less often must not keep it."""
    from fuzz.repro.reduce import RACE_VOTES, _Oracle

    entry = load_entry(ROOT / "corpus" / f"{EXCEPTION}.json")
    said: list[str] = []
    oracle = _Oracle(entry, "", "exception:parity:x.Y@torch/a.py:f", 60.0, said.append)
    # first attempt, RATE_RUNS in the same ranks (one passes), RATE_RUNS on fresh ones (one passes)
    pool = _RacingPool("RRPR" + "R" * (RATE_RUNS - 2) + "P" + "R" * (RATE_RUNS - 1))
    oracle.pool = pool  # type: ignore[assignment]
    code = "def attempt(rank, world_size):\n    pass\n"
    assert oracle.in_pool(code) and oracle.votes == RACE_VOTES and any("races" in s for s in said)
    runs = pool.runs
    pool.pattern, pool.runs = "R" * (RACE_VOTES - 1) + "P", 0  # passes at the last vote
    assert not oracle.in_pool(code) and pool.runs == RACE_VOTES
    pool.pattern, pool.runs = "R", 0
    assert oracle.in_pool(code) and pool.runs == RACE_VOTES
    assert runs == 1 + 2 * RATE_RUNS


@pytest.mark.parametrize("name", ["state_dict-hang-dff6a54ad235", "dcp-crash-b5480b2301a0"])
def test_a_hang_or_crash_script_runs_its_case_in_attempt_where_delta_may_cut_it(name: str) -> None:
    """``main`` (its watcher, its child process) is left as it is by delta debugging; the case
    is in ``attempt``, whose statements may all be cut."""
    from fuzz.repro.delta import units
    from fuzz.repro.harness import main_source

    entry = load_entry(ROOT / "corpus" / f"{name}.json")
    source, _ = main_source(entry, entry.signature)
    tree = ast.parse(source)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert set(functions) == {"attempt", "torch_frame", "main"}
    main_reads = {n.id for n in ast.walk(functions["main"]) if isinstance(n, ast.Name)}
    assert not main_reads & {"case", "ctx"} and "attempt" in main_reads
    cuttable = {ast.unparse(node).partition(" =")[0] for node, _ in units(tree)}
    assert {"case", "ctx"} <= cuttable


_OLD_SHAPE = """\
def main():
    import os
    case = 'the case'
    rank, world_size = (0, 1)
    ctx = dict(rank=rank)

    def watch():
        print(f'rank {ctx.rank} is stuck')
    run_case(case, ctx)
    finished.set()
"""


def test_a_kept_hang_or_crash_script_of_the_old_shape_has_its_case_lifted_into_attempt() -> None:
    from fuzz.repro.harness import lift_attempt

    hang = load_entry(ROOT / "corpus" / "state_dict-hang-dff6a54ad235.json")
    lifted = lift_attempt(_OLD_SHAPE, hang)
    assert lifted is not None
    tree = ast.parse(lifted)
    attempt, main = tree.body
    assert isinstance(attempt, ast.FunctionDef) and attempt.name == "attempt"
    assert [ast.unparse(s) for s in attempt.body[1:]] == [
        "case = 'the case'",
        "ctx = dict(rank=rank)",
        "run_case(case, ctx)",
    ]
    assert "attempt(rank, world_size)" in ast.unparse(main) and "{rank}" in ast.unparse(main)
    assert "ctx" not in ast.unparse(main) and "case" not in ast.unparse(main)
    assert lift_attempt(lifted, hang) is None  # lifted already
    exception = load_entry(ROOT / "corpus" / f"{EXCEPTION}.json")
    assert lift_attempt(_OLD_SHAPE, exception) is None  # an exception's case is in attempt already
    # main still reading the case elsewhere: left as it is
    assert lift_attempt(_OLD_SHAPE.replace("finished.set()", "print(case)"), hang) is None


class _FakePool:
    """A pool that starts at once and counts the fresh ranks it is asked for."""

    def __init__(self, **_: object) -> None:
        self.respawned = 0
        self.closed = False

    def start(self) -> None:
        pass

    def respawn(self) -> None:
        self.respawned += 1

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(("outcomes", "pooled"), [([False, True], True), ([False, False], False), ([True], True)])
def test_the_pool_is_taken_if_the_script_reproduces_on_its_ranks_or_on_fresh_ones(
    monkeypatch: pytest.MonkeyPatch, outcomes: list[bool], pooled: bool
) -> None:
    """Each rank draws from the seed its process started with, as under torchrun: a failure
    that one set of seeds misses gets a second set before every attempt goes to torchrun."""
    from fuzz.repro import reduce

    monkeypatch.setattr(reduce, "RankPool", _FakePool)
    entry = load_entry(ROOT / "corpus" / f"{EXCEPTION}.json")
    said: list[str] = []
    oracle = reduce._Oracle(entry, "", entry.signature, 60.0, said.append)
    left = list(outcomes)
    monkeypatch.setattr(oracle, "in_pool", lambda code: left.pop(0))
    oracle.open_pool("def attempt(rank, world_size):\n    pass\n")
    assert not left  # each outcome asked for, no more
    assert (oracle.pool is not None) == pooled
    assert any("every attempt runs under torchrun" in s for s in said) != pooled


_FAULTHANDLER = (
    "Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n"
    '  File "/site/torch/distributed/fsdp/_state_dict_utils.py", line 300 in param_hook\n'
)
_STUCK = '  File "/site/torch/distributed/_state_dict_utils.py", line 662, in _broadcast_state_dict\n'


@pytest.mark.parametrize(
    ("name", "outcome", "reproduces"),
    [
        (
            "state_dict-crash-81ffab405f7f",
            ScriptOutcome({}, {}, {1: "died"}, 1.0, True, died={1: (-11, _FAULTHANDLER)}),
            True,
        ),
        (
            "state_dict-crash-81ffab405f7f",
            ScriptOutcome({}, {}, {1: "died"}, 1.0, True, died={1: (-6, _FAULTHANDLER)}),
            False,
        ),
        ("state_dict-crash-81ffab405f7f", ScriptOutcome({0: "None"}, {}, {}, 1.0, False), False),
        ("dcp-hang-96de59c34a50", ScriptOutcome({}, {}, {0: "late"}, 20.0, True, stuck={0: _STUCK}), True),
        ("dcp-hang-96de59c34a50", ScriptOutcome({}, {}, {0: "late"}, 20.0, True, stuck={0: "elsewhere"}), False),
        # under torchrun a rank that raises ends the others before their watcher looks
        ("dcp-hang-96de59c34a50", ScriptOutcome({}, {1: "boom"}, {0: "late"}, 20.0, True, stuck={0: _STUCK}), False),
    ],
)
def test_a_crash_s_or_a_hang_s_pooled_attempt_is_judged_by_its_script_s_rule(
    name: str, outcome: ScriptOutcome, reproduces: bool
) -> None:
    from fuzz.repro import reduce

    entry = load_entry(ROOT / "corpus" / f"{name}.json")
    oracle = reduce._Oracle(entry, "", entry.signature, 60.0, lambda _: None)
    assert oracle._reproduced_in(outcome) == reproduces


@pytest.mark.parametrize(("missing", "passes"), [({}, True), ({0: "late"}, False)])
def test_a_hang_passes_with_its_fix_when_every_rank_finishes_the_case(
    monkeypatch: pytest.MonkeyPatch, missing: dict[int, str], passes: bool
) -> None:
    """A hang's attempt returns no verdict (its main's watcher checks it): with the bug's fix it
    passes when every rank finishes."""
    from fuzz.repro import reduce

    entry = load_entry(ROOT / "corpus" / "dcp-hang-96de59c34a50.json")
    oracle = reduce._Oracle(entry, "", entry.signature, 60.0, lambda _: None)
    oracle.fixed = _FakePool()  # type: ignore[assignment]
    monkeypatch.setattr(oracle, "_attempt", lambda pool, code: ScriptOutcome({}, {}, missing, 1.0, bool(missing)))
    assert oracle._passes_fixed("") == passes


def test_why_a_run_did_not_reproduce_is_said_in_words() -> None:
    """torchrun ends a failed run with a rule of ``=`` signs: the error names the exception (or
    the verdict) instead."""
    torchrun_tail = (
        'Traceback (most recent call last):\n  File "r.py", line 3, in <module>\n'
        "RuntimeError: Expected all tensors to be on the same device\n"
        "E1129 torch/distributed/elastic/multiprocessing/api.py: failed (exitcode: 1)\n"
        "Traceback (most recent call last):\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\n"
    )
    assert why_not(1, torchrun_tail) == "exit 1: RuntimeError: Expected all tensors to be on the same device"
    assert why_not(0, "PASS: no rank raised\n") == "exit 0: PASS: no rank raised"
    assert why_not(None, "") == "timed out: no output"
    assert why_not(1, "warming up\n=====\n") == "exit 1: warming up"


def test_a_stop_whose_keyboard_interrupt_was_lost_ends_the_reduction_at_its_next_run(tmp_path: Path) -> None:
    """SIGINT or SIGTERM is recorded (fuzz.stop) before its KeyboardInterrupt unwinds; where that
    KeyboardInterrupt is lost on its way, the reduction's next run raises it again instead of
    starting anything."""
    from fuzz.stop import clear_stop, request_stop

    marker = tmp_path / "ran"
    with pytest.raises(KeyboardInterrupt):
        request_stop(signal.SIGTERM)  # what the handler does: record, then raise
    try:
        with pytest.raises(KeyboardInterrupt, match=f"signal {int(signal.SIGTERM)}"):
            run_script(f"open({str(marker)!r}, 'w').close()\n", timeout=60)
    finally:
        clear_stop()
    assert not marker.exists()
    assert run_script(f"open({str(marker)!r}, 'w').close()\n", timeout=60)[0] == 0 and marker.exists()


def test_each_run_of_a_script_has_a_temporary_directory_of_its_own() -> None:
    """A candidate cut down to read what an earlier run left in the temporary directory (a
    checkpoint loaded from ``tempfile.gettempdir()`` that it no longer saves) finds nothing."""
    script = (
        "import os, sys, tempfile\n"
        "mark = os.path.join(tempfile.gettempdir(), 'left-by-an-earlier-run')\n"
        "seen = os.path.exists(mark)\n"
        "open(mark, 'w').close()\n"
        "sys.exit(3 if seen else 0)\n"
    )
    assert [run_script(script, timeout=60)[0] for _ in range(2)] == [0, 0]


def test_a_known_bug_that_races_starts_its_reduction_with_votes_on_fresh_ranks() -> None:
    """The delayed all-reduce's record says its failure races (fuzz.known.KnownBug.races): its
    entry's candidates must reproduce RACE_VOTES times in a row, each on fresh ranks; an
    entry whose bug does not race starts with one attempt in warm ranks."""
    from fuzz.repro.reduce import RACE_VOTES, _Oracle

    racing = load_entry(ROOT / "corpus" / "parity-mismatch-28f92215865a.json")
    assert known.get(racing.bug or "").races
    oracle = _Oracle(racing, "", racing.signature, 60.0, lambda _: None)
    assert (oracle.votes, oracle.fresh_each) == (RACE_VOTES, True)
    steady = load_entry(ROOT / "corpus" / f"{EXCEPTION}.json")
    assert not known.get(steady.bug or "").races
    oracle = _Oracle(steady, "", steady.signature, 60.0, lambda _: None)
    assert (oracle.votes, oracle.fresh_each) == (1, False)
