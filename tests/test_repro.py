"""Reproducer scripts (fuzz/repro/): every corpus entry renders into a script that carries the
rank side's own modules verbatim and imports nothing else of shardfuzz; under torchrun a script
observes exactly what the pool observes for the same case, judges it as the property does, and
exits 1 iff the entry's failure reproduces; bad input exits 2 with one line."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from fuzz.corpus import Entry, load_entry, save_entry
from fuzz.errors import InvalidArgument, ShardfuzzError
from fuzz.model import (
    AccumSync,
    Block,
    Case,
    Composition,
    Dtype,
    FaultAction,
    FaultBody,
    InvalidBody,
    Leaf,
    LeafKind,
    MetamorphicBody,
    Misuse,
    ModuleTree,
    Optimizer,
    ParityBody,
    ShardSpec,
    Training,
)
from fuzz.properties import all_properties, get_property
from fuzz.repro import render_entry
from fuzz.repro.bench import bench_all
from fuzz.repro.issue import render_issue, without_header
from fuzz.repro.reduce import stored_path
from fuzz.repro.script import ROOT as SOURCE_ROOT
from fuzz.repro.script import STUBS, carried_modules, code_lines, relative
from tests.conftest import ROOT, mutant_env, run_cli, sigint_as_from_a_terminal, torchrun, wait_gone

CORPUS = sorted((ROOT / "corpus").glob("*.json"))


def _rich_case() -> Case:
    """A residual block with its own parameter and buffer, conv1d, dropout, a frozen leaf, a
    grouped fully_shard with Shard(1) (which P01 breaks), gradient accumulation without sync,
    two parameter groups, AdamW in float64."""
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


def _checkpoint_dropout_metamorphic_case() -> Case:
    """fully_shard on the root, against the same with checkpoint on a block that holds dropout
    between two Linears: recomputation must draw the same dropout masks."""
    dropout = Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.DROPOUT), Leaf(LeafKind.LINEAR)))
    tree = ModuleTree(width=4, root=Block(children=(Leaf(LeafKind.LINEAR), dropout)))
    comp = Composition(shards=(ShardSpec(""),))
    variant = dataclasses.replace(comp, checkpoints=("1",))
    return Case("metamorphic", 2, 3, MetamorphicBody(tree, comp, variant, Training(steps=2)))


def _invalid_case() -> Case:
    tree = ModuleTree(width=5, root=Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.RELU))))
    return Case("invalid", 2, 1, InvalidBody(tree, Misuse.REPLICATE_AFTER_FULLY_SHARD, path="0"))


def _entry(case: Case, *, signature: str = "mismatch:parity@fsdp2", check: str = "loss") -> Entry:
    return Entry(
        case=case,
        kind=signature.split(":")[0],
        signature=signature,
        summary="made up for the test",
        details={"check": check},
        versions={"torch": "2.13.0"},
        reruns=3,
        reproduced=3,
    )


def _corpus_entry(name: str) -> Entry:
    return load_entry(ROOT / "corpus" / f"{name}.json")


def _script_namespace(script: str) -> dict[str, Any]:
    """The script's top level, run without running its main."""
    namespace: dict[str, Any] = {"__name__": "repro_under_test"}
    exec(compile(script, "repro.py", "exec"), namespace)
    return namespace


# -- rendering -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_every_corpus_entry_renders_carrying_the_current_sources(path: Path) -> None:
    """Every entry renders; the script carries each module it names verbatim from its file (so
    it cannot drift from what the pool runs), imports only the standard library itself, and
    carries the body's rank program and the property's judge."""
    entry = load_entry(path)
    script = render_entry(entry, source=str(path))
    tree = ast.parse(script)
    top = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module or "" for n in tree.body if isinstance(n, ast.ImportFrom)}
    assert top <= {"importlib.abc", "importlib.util", "linecache", "sys"}, top
    namespace = _script_namespace(script)
    for file, text in namespace["SOURCES"].items():
        if file.removesuffix("/__init__.py").replace("/", ".") in STUBS:
            continue
        assert text == (SOURCE_ROOT / file).read_text(), f"{file} is not carried verbatim"
    modules = namespace["MODULES"]
    assert entry.case.body.PROGRAM.split(":")[0] in modules
    assert get_property(entry.case.property).judge.__module__ in modules
    assert not any(m.startswith(("fuzz.pool", "fuzz.explore", "fuzz.corpus", "fuzz.cli")) for m in modules)
    assert json.loads(namespace["CASE"]) == json.loads(json.dumps(entry.to_json()["case"]))
    assert namespace["EXPECTED"]["signatures"] == sorted(entry.signatures)


def test_a_script_carries_only_what_its_case_runs() -> None:
    """An invalid case carries no training, state-dict or DCP code; a DCP case carries them."""
    invalid = carried_modules(["fuzz.repro.runtime", "fuzz._rank.invalid", "fuzz.properties.invalid"])
    assert "fuzz._rank.parity" not in invalid and "fuzz._rank.dcp" not in invalid
    properties = {n for n in invalid if n.startswith("fuzz.properties.")}
    assert properties == {"fuzz.properties.invalid", "fuzz.properties.spec"}
    dcp = carried_modules(["fuzz._rank.dcp"])
    assert {"fuzz._rank.state_dict", "fuzz._rank.parity", "fuzz._rank.compose"} <= set(dcp)
    assert relative("fuzz.repro") == "fuzz/repro/__init__.py"


def test_every_property_renders_or_says_why_not() -> None:
    for prop in all_properties():
        assert (prop.repro is None) == (prop.repro_refusal is not None), prop.name
    fault = Case(property="_fault", world_size=2, seed=0, body=FaultBody(action=FaultAction.HANG))
    with pytest.raises(InvalidArgument, match="self-test"):
        render_entry(_entry(fault, signature="hang:_fault@x"))


@pytest.mark.parametrize(
    "summary", ["plain", 'odd: """ \\x \\N{oops} \\ \'\'\' \n "quoted"'], ids=["plain", "quotes-and-backslashes"]
)
def test_odd_summaries_render_into_a_script_that_parses(summary: str) -> None:
    script = render_entry(dataclasses.replace(_entry(_rich_case()), summary=summary))
    ast.parse(script)
    assert code_lines(script) > 0


# -- under torchrun ------------------------------------------------------------------------------


def _run_script(tmp_path: Path, entry: Entry, env: dict[str, str] | None = None) -> tuple[Any, Any]:
    script = tmp_path / "repro.py"
    script.write_text(render_entry(entry))
    observed = tmp_path / "obs.json"
    result = torchrun(script, {"REPRO_OBSERVATIONS": str(observed), **(env or {})}, nproc=entry.case.world_size)
    data = json.loads(observed.read_text()) if observed.exists() else None
    assert data is not None, result.stdout + result.stderr
    # Every shardfuzz module came from the script, and neither Hypothesis nor the strategies loaded.
    foreign = {name: origin for name, origin in data["modules"].items() if not str(origin).startswith("shardfuzz/")}
    assert not foreign, foreign
    assert not {"hypothesis", "strategies"} & set(data["top_level"]), data["top_level"]
    return result, data


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON: floats bit for bit (repr round-trips), NaN equal to NaN."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.parametrize(
    "name", ["parity-rich", "metamorphic-checkpoint", "invalid", "state_dict-mismatch-7b9a97d5e646"]
)
def test_script_observes_what_the_pool_observes(rank_pool: Any, tmp_path: Path, name: str) -> None:
    """Every rank's observation (losses, gradient norms, parameters, contracts, state) equals the
    pool's for the same case, bit for bit, and the script's verdict is the judge's."""
    if rank_pool.world_size != 2 or rank_pool.backend != "gloo":
        pytest.skip("compares with a 2-rank gloo pool (the default --shardfuzz-world-size / --shardfuzz-backend)")
    cases = {
        "parity-rich": lambda: _entry(_rich_case()),
        "metamorphic-checkpoint": lambda: _entry(_checkpoint_dropout_metamorphic_case()),
        "invalid": lambda: _entry(_invalid_case(), signature="mismatch:invalid:replicate_after_fully_shard:no-error"),
    }
    entry = cases[name]() if name in cases else _corpus_entry(name)
    outcome = rank_pool.run(entry.case)
    assert outcome.ok, outcome.describe()
    failure = get_property(entry.case.property).judge(entry.case, outcome)
    result, data = _run_script(tmp_path, entry)
    assert data["kind"] == "ok"
    for rank, (mine, theirs) in enumerate(zip(data["observations"], outcome.observations)):
        assert _same(mine, theirs), f"rank {rank} observed otherwise than the pool"
    assert data["signature"] == (failure.signature if failure else None)
    if failure is None:
        assert result.returncode == 0 and "PASS" in result.stdout, result.stdout + result.stderr
    else:
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"REPRODUCED {entry.signature}" in result.stdout


@pytest.mark.parametrize(
    "name",
    [
        "parity-mismatch-da0c9d4e06cd",  # FSDP1 HYBRID_SHARD with shard groups of one rank (pytorch/pytorch#154888)
        pytest.param(  # a state_dict body's full script runs in CI too: test_script_observes_what_the_pool_observes
            "state_dict-exception-d75bbc271571",  # set_optimizer_state_dict, full, no optimizer state
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "dcp-exception-5bdb13d18d5c",  # FileSystemWriter(cache_staged_state_dict=True) without an accelerator
            marks=pytest.mark.skipif(
                torch.cuda.is_available(), reason="the cached staging's bug needs a host without an accelerator"
            ),
        ),
    ],
)
def test_sample_scripts_reproduce_their_known_entries(tmp_path: Path, name: str) -> None:
    entry = _corpus_entry(name)
    assert entry.status == "known"
    result, data = _run_script(tmp_path, entry)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"REPRODUCED {entry.signature}" in result.stdout, result.stdout
    assert data["signature"] == entry.signature


def test_a_script_fails_under_a_real_fault(tmp_path: Path) -> None:
    """Under P01 (reduce-scatter chunks Shard(1) gradients on dim 0) the rich case's fully_shard
    parameters depart from the reference: the script says so and exits 1; without it, 0."""
    script = tmp_path / "repro.py"
    script.write_text(render_entry(_entry(_rich_case(), check="param")))
    env = _env(mutant_env("P01_shard_dim_chunk"))
    broken = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "REPRODUCED mismatch:parity@fsdp2" in broken.stdout, broken.stdout


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, **(extra or {})}


# -- bad input -----------------------------------------------------------------------------------


def _python(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python FILE.py``: the script starts torchrun itself and exits with rank 0's status."""
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=script.parent, env=_env(), capture_output=True, text=True, timeout=240
    )


def test_a_script_whose_case_does_not_decode_exits_2_with_one_line(tmp_path: Path) -> None:
    script = tmp_path / "repro.py"
    text = render_entry(_entry(_invalid_case(), signature="mismatch:invalid:x:no-error"))
    script.write_text(re.sub(r'"schema": \d+,', '"schema": 99,', text, count=1))
    result = _python(script)
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("repro: error:")]
    assert len(errors) == 1 and "newer" in errors[0] and "upgrade shardfuzz" in errors[0], result.stderr


def test_nccl_without_cuda_is_a_usage_error(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    script = tmp_path / "repro.py"
    script.write_text(render_entry(_entry(_invalid_case(), signature="mismatch:invalid:x:no-error")))
    result = _python(script, "--backend", "nccl")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--backend nccl needs CUDA" in result.stderr


def test_cli_refuses_corrupt_and_newer_entries_with_one_line(tmp_path: Path) -> None:
    good = ROOT / "corpus" / "parity-mismatch-da0c9d4e06cd.json"
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text(good.read_text()[:200])
    newer = tmp_path / "newer.json"
    data = json.loads(good.read_text())
    data["case"]["schema"] = 99
    newer.write_text(json.dumps(data))
    for bad in (corrupt, newer):
        result = run_cli("repro", str(bad), "-o", str(tmp_path / "r.py"))
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and str(bad) in result.stderr, result.stderr
        assert not (tmp_path / "r.py").exists()


def test_cli_refuses_a_fault_case_with_exit_2(tmp_path: Path) -> None:
    case = Case(property="_fault", world_size=2, seed=0, body=FaultBody(action=FaultAction.HANG))
    path, _ = save_entry(tmp_path, dataclasses.replace(_entry(case), signature="hang:_fault@x", kind="hang"))
    result = run_cli("repro", str(path), "-o", str(tmp_path / "r.py"))
    assert result.returncode == 2
    assert str(path) in result.stderr and "self-test" in result.stderr
    assert not (tmp_path / "r.py").exists()


# -- command line, issue, figures ----------------------------------------------------------------


def test_cli_writes_the_script(tmp_path: Path) -> None:
    path, _ = save_entry(tmp_path, _entry(_rich_case()))
    out = tmp_path / "repro.py"
    result = run_cli("repro", str(path), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_text() == render_entry(load_entry(path), source=str(path))
    assert f"--nproc-per-node 2 {out}" in result.stderr
    assert run_cli("repro", str(path)).stdout == out.read_text()


def test_issue_markdown_is_pasted_upstream_as_it_is(tmp_path: Path) -> None:
    """``--issue``: a short title in the API's words, the versions, the script and the command,
    Observed from running that very script here, Expected in a sentence or two, the upstream
    link; nothing that points into shardfuzz."""
    path = ROOT / "corpus" / "state_dict-exception-d75bbc271571.json"
    out = tmp_path / "issue.md"
    result = run_cli("repro", str(path), "--issue", "-o", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    title = text.splitlines()[0]
    assert title == "# set_optimizer_state_dict: AssertionError in _load_optim_state_dict" and len(title) < 82
    for heading in ("## Observed", "## Expected", "## Upstream"):
        assert f"\n{heading}\n" in text, heading
    assert "| 2.13.0+cpu | 3.11.7 | gloo | 2 |" in text
    assert "torchrun --nproc-per-node 2 repro.py" in text
    assert "https://github.com/pytorch/pytorch/issues/133415" in text
    kept = stored_path(path).read_text()
    assert without_header(kept) in text and "#!/usr/bin/env python3" in text
    for inside in ("shardfuzz", "corpus", "docs/", "fuzz/_", "fuzz.", ".json"):
        assert inside not in text, inside
    observed = text.split("## Observed")[1].split("## Expected")[0]
    assert "AssertionError: Expected device to be set" in observed and "REPRODUCED" in observed
    assert "(torchrun: exit status 1)" in observed
    expected = text.split("## Expected")[1].split("## Upstream")[0].strip()
    assert 0 < expected.count(". ") + 1 <= 2, expected


_OUTPUT = """W1203 12:00:00.000 1 site-packages/torch/distributed/run.py:1] OMP_NUM_THREADS
[rank1]: Traceback (most recent call last):
[rank1]:   File "/tmp/repro.py", line 9, in attempt
[rank1]:     set_optimizer_state_dict(model, opt, osd)
[rank1]:   File "/venv/torch/distributed/checkpoint/state_dict.py", line 700, in _load_optim_state_dict
[rank1]: AssertionError: Expected device to be set
REPRODUCED exception:state_dict:builtins.AssertionError@x: rank 1 raised builtins.AssertionError@x
"""


def test_issue_observed_is_the_run_s_traceback_and_verdict_without_torchrun_s_noise() -> None:
    entry = _corpus_entry("state_dict-exception-d75bbc271571")
    text = render_issue(entry, "#!/usr/bin/env python3\n# corpus entry\nprint(1)\n", run=(1, _OUTPUT))
    observed = text.split("## Observed")[1].split("## Expected")[0]
    assert "rank 1:\nTraceback (most recent call last):" in observed
    assert "AssertionError: Expected device to be set" in observed and "_load_optim_state_dict" in observed
    assert "REPRODUCED exception" in observed and "OMP_NUM_THREADS" not in observed
    assert "# corpus entry" not in text and "print(1)" in text


def test_repro_writes_the_kept_reduced_script_and_full_the_unreduced_one(tmp_path: Path) -> None:
    path = ROOT / "corpus" / "parity-mismatch-009298376223.json"
    entry = load_entry(path)
    out = tmp_path / "r.py"
    result = run_cli("repro", str(path), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_text() == stored_path(path).read_text()
    assert ", kept beside the entry;" in result.stderr
    result = run_cli("repro", str(path), "--full", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_text() == render_entry(entry, source=str(path))
    assert "(unreduced;" in result.stderr
    refused = run_cli("repro", str(path), "--full", "--reduce")
    assert refused.returncode == 2 and "--full and --reduce" in refused.stderr


def test_all_prints_the_figures(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("parity-mismatch-da0c9d4e06cd", "dcp-hang-96de59c34a50", "parity-exception-86a14603f6de"):
        for suffix in (".json", ".repro.py"):
            (corpus / f"{name}{suffix}").write_text((ROOT / "corpus" / f"{name}{suffix}").read_text())
    (corpus / "broken.json").write_text("{")
    lines: list[str] = []
    with pytest.raises(ShardfuzzError, match=r"1 of 4 entries unreadable: .*broken\.json"):
        bench_all(corpus, say=lines.append)  # the rest done first, then the unreadable one named
    assert "rendered: 3/4" in lines
    assert "printed from the case (NAME.repro.py): 2/4" in lines
    assert "reduced (a current NAME.repro.py): 1/4" in lines
    assert "in the plain form (the exception left to propagate): 1 of the reduced exception scripts" in lines
    assert any(line.startswith("printed scripts' code lines: median ") for line in lines)
    assert any(line.startswith("code lines: median ") for line in lines)
    result = run_cli("repro", "--all", str(corpus))
    assert result.returncode == 2 and "broken.json" in result.stderr.splitlines()[-1], result.stderr
    assert "rendered: 3/4" in result.stdout
    (corpus / "broken.json").unlink()
    figures = bench_all(corpus, say=lines.append)
    assert figures["rendered"] == 3 and figures["total"] == 3 and figures["plain_forms"] == 1
    assert figures["printed"] == 2 and figures["reduced"] == 1


def test_all_fixed_runs_each_stored_script_on_torch_with_its_bugs_fix(tmp_path: Path) -> None:
    """``--fixed``: a stored script whose bug has a fix written passes on torch with it; one
    that fails there anyway (here made to exit 1 whatever it finds) is counted as not passing."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("state_dict-exception-d4322b68deab", "state_dict-exception-67e354131411"):
        for suffix in (".json", ".repro.py"):
            (corpus / f"{name}{suffix}").write_text((ROOT / "corpus" / f"{name}{suffix}").read_text())
    spoilt = corpus / "state_dict-exception-67e354131411.repro.py"
    text = spoilt.read_text()
    assert text.rstrip().endswith("os._exit(0)")  # where a script that ran through ends
    spoilt.write_text(text.rstrip().removesuffix("os._exit(0)") + "os._exit(1)\n")
    lines: list[str] = []
    figures = bench_all(corpus, fixed=True, say=lines.append)
    assert figures["fixed_run"] == 2 and figures["fixed_passed"] == 1, lines
    assert figures["bugs_with_fix"] == figures["bugs"] == 2
    assert any("d4322b68deab" in line and "with its bug's fix: passed" in line for line in lines), lines
    assert any("67e354131411" in line and "with its bug's fix: exit 1" in line for line in lines), lines


def test_again_refuses_bad_input_with_exit_2_and_changes_nothing(tmp_path: Path) -> None:
    """--again goes with --reduce, not with --refresh; it needs a kept script, and one that
    reproduces here (the compile bug's is of torch 2.11 only: on a later torch it passes)."""
    import shutil

    name = "parity-mismatch-6176f16b4070"
    shutil.copy(ROOT / "corpus" / f"{name}.json", tmp_path / f"{name}.json")
    entry = tmp_path / f"{name}.json"
    for args, said in (
        (("--again",), "--again goes with --reduce"),
        (("--reduce", "--again", "--refresh"), "exclude each other"),
        (("--reduce", "--again"), "no current reduced script is kept beside it"),
    ):
        result = run_cli("repro", str(entry), *args)
        assert result.returncode == 2 and said in result.stderr, (args, result.stderr)
    kept = tmp_path / f"{name}.repro.py"
    shutil.copy(ROOT / "corpus" / f"{name}.repro.py", kept)
    before = kept.read_text()
    from fuzz import known

    if known.present(known.BUGS[load_entry(entry).bug or ""], torch.__version__):
        pytest.skip("the compile bug is in this torch: its kept script reproduces")
    result = run_cli("repro", str(entry), "--reduce", "--again", "--budget", "5")
    assert result.returncode == 2 and "its kept script does not reproduce the failure here" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and kept.read_text() == before


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_reduction_stopped_by_a_signal_says_so_and_keeps_its_script(tmp_path: Path, signum: int) -> None:
    """SIGTERM (a timeout, a scheduler) or Ctrl-C in the middle of ``--reduce --again``: one line,
    no traceback, exit 128 + the signal, the kept script as it was, and no process left behind."""
    import shutil

    name = "parity-exception-3e90c3cc368a"
    for suffix in (".json", ".repro.py"):
        shutil.copy(ROOT / "corpus" / f"{name}{suffix}", tmp_path / f"{name}{suffix}")
    kept = tmp_path / f"{name}.repro.py"
    before = kept.read_text()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fuzz", "repro", str(tmp_path / f"{name}.json"), "--reduce", "--again"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_from_a_terminal,
    )
    try:
        deadline = time.monotonic() + 120
        children: list[int] = []
        while time.monotonic() < deadline and proc.poll() is None and not children:
            time.sleep(0.5)  # until the reduction runs something (the traced script, the pool)
            children = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        assert proc.poll() is None and children, "the reduction ended before it could be stopped"
        time.sleep(2)
        proc.send_signal(signum)
        # Ending the pools takes up to 10 s each (fuzz.pool.RankPool.close); on a machine loaded
        # beyond its cores the whole unwinding once took over a minute.
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()  # reaps it and closes the pipes
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].endswith(
        f"stopped by {signal.Signals(signum).name}"
    ), err
    assert kept.read_text() == before
    assert not wait_gone(children, timeout=30), "a process of the reduction outlived it"


@pytest.mark.parametrize("name", ["state_dict-exception-d4322b68deab", "state_dict-hang-dff6a54ad235"])
def test_a_reduced_script_s_main_hides_the_accelerators_first(name: str) -> None:
    from fuzz.repro.harness import HIDE_ACCELERATORS, main_source

    entry = load_entry(ROOT / "corpus" / f"{name}.json")
    source, _ = main_source(entry, entry.signature)
    main = source[source.index("def main():") :].splitlines()
    assert main[1:3] == ["    import os", f"    {HIDE_ACCELERATORS}"], main[:4]


def test_every_stored_script_has_the_current_harness() -> None:
    """The reducer never cuts ``main``: a kept script's harness (exit codes, the torch-frame
    rule, rank 0's PASS) and its run comments are rewritten as they are now
    (fuzz.repro.specialize.current), and every stored one is."""
    from fuzz.repro.specialize import current

    def code(text: str) -> str:  # the comments follow the registry's wording, which others edit
        return "\n".join(line for line in text.splitlines() if not line.startswith("#"))

    for path in sorted((ROOT / "corpus").glob("*.repro.py")):
        source = path.with_name(path.name.removesuffix(".repro.py") + ".json")
        text = path.read_text()
        assert code(current(text, load_entry(source), str(source))) == code(text), path.name
