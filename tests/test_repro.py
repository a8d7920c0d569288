"""Reproducer scripts (fuzz/repro/): every corpus entry renders into a script that carries the
rank side's own modules verbatim and imports nothing else of shardfuzz; under torchrun a script
observes exactly what the pool observes for the same case, judges it as the property does, and
exits 1 iff the entry's failure reproduces; bad input exits 2 with one line. The scripts stored
beside the entries (fuzz/repro/store.py) are current, reproduce under torchrun (a sample in CI,
all in the slow tier) and pass with their bug's fix; ``--reduce`` stores a printed one only once
it does, and refuses what it cannot store with one line, changing nothing."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from fuzz import known
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
from fuzz.patching import patch_env
from fuzz.properties import all_properties, get_property
from fuzz.repro import render_entry
from fuzz.repro.bench import bench_all
from fuzz.repro.issue import render_issue, without_header
from fuzz.repro.printed import is_printed, print_entry, printable
from fuzz.repro.script import ROOT as SOURCE_ROOT
from fuzz.repro.script import STUBS, carried_modules, code_lines, relative
from fuzz.repro.store import (
    PRINTED_HEADER,
    REDUCED_HEADER,
    entry_hash,
    is_current,
    passed,
    run_fixed,
    run_script,
    stored_path,
    why_not,
)
from tests.conftest import ROOT, missing_api, mutant_env, run_cli, sigint_as_from_a_terminal, torchrun, wait_gone

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
    entry = load_entry(path)
    assert printable(entry)  # a grouped unit, Shard(1), a frozen leaf: all printed from the case
    assert out.read_text() == print_entry(entry)
    assert f"--nproc-per-node 2 {out}" in result.stderr
    assert run_cli("repro", str(path)).stdout == out.read_text()
    full = run_cli("repro", str(path), "--full")
    assert full.returncode == 0 and full.stdout == render_entry(entry, source=str(path))


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


def test_repro_writes_the_stored_script_and_full_the_unreduced_one(tmp_path: Path) -> None:
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
    names = ["parity-mismatch-da0c9d4e06cd", "dcp-hang-96de59c34a50", *REDUCED[:1]]
    for name in names:
        for suffix in (".json", ".repro.py"):
            (corpus / f"{name}{suffix}").write_text((ROOT / "corpus" / f"{name}{suffix}").read_text())
    (corpus / "broken.json").write_text("{")
    lines: list[str] = []
    total = len(names) + 1
    with pytest.raises(ShardfuzzError, match=rf"1 of {total} entries unreadable: .*broken\.json"):
        bench_all(corpus, say=lines.append)  # the rest done first, then the unreadable one named
    assert f"rendered: {len(names)}/{total}" in lines
    assert f"printed from the case (NAME.repro.py): 2/{total}" in lines
    assert f"kept reduced (a current NAME.repro.py the printers do not write): {len(names) - 2}/{total}" in lines
    assert any(line.startswith("printed scripts' code lines: median ") for line in lines)
    assert any(line.startswith("time to store a printed script: median ") for line in lines)
    assert any(line.startswith("code lines: median ") for line in lines)
    result = run_cli("repro", "--all", str(corpus))
    assert result.returncode == 2 and "broken.json" in result.stderr.splitlines()[-1], result.stderr
    assert f"rendered: {len(names)}/{total}" in result.stdout
    (corpus / "broken.json").unlink()
    figures = bench_all(corpus, say=lines.append)
    assert figures["rendered"] == figures["total"] == len(names)
    assert figures["printed"] == 2 and figures["reduced"] == len(names) - 2


@pytest.mark.slow  # 25 s; storing a script runs it with its bug's fix already (fuzz/repro/store.py)
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


# -- stored scripts (fuzz/repro/store.py) --------------------------------------------------------

STORED = sorted((ROOT / "corpus").glob("*.repro.py"))
#: The stored scripts kept from the reducer that came before printing (the rest are printed).
REDUCED = [p.name.removesuffix(".repro.py") for p in STORED if not is_printed(p.read_text())]


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("path", STORED, ids=[p.name.removesuffix(".repro.py") for p in STORED])
def test_every_stored_script_is_current_and_parses_on_this_python(path: Path) -> None:
    """Store it again (``python -m fuzz repro ENTRY --reduce``) when this fails: the entry changed
    since. A printed script's header says so; a kept reduced one keeps the reducer's."""
    entry_path = path.with_name(path.name.removesuffix(".repro.py") + ".json")
    assert entry_path.exists(), f"{path.name} has no entry"
    text = path.read_text()
    assert is_current(text, load_entry(entry_path)), f"{path.name} is stale: run repro {entry_path.name} --reduce"
    header = PRINTED_HEADER if is_printed(text) else REDUCED_HEADER
    assert text.splitlines()[1].startswith(f"{header} entry="), text.splitlines()[1]
    compile(text, str(path), "exec")


def test_reduce_of_an_entry_the_printers_do_not_write_exits_2_naming_what(tmp_path: Path) -> None:
    """No script is stored for such an entry: one line names what the printers do not write yet."""
    tree = ModuleTree(width=2, root=Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.RMS_NORM))))
    composition = Composition(shards=(ShardSpec(path=""),))
    case = Case("parity", 2, 0, ParityBody(tree=tree, composition=composition, training=Training()))
    path, _ = save_entry(tmp_path, _entry(case))
    before = _snapshot(tmp_path)
    result = run_cli("repro", str(path), "--reduce", "-o", str(tmp_path / "r.py"))
    assert result.returncode == 2, result.stderr
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and "cannot print leaf kind rms_norm (at 1) yet" in errors[0], result.stderr
    assert _snapshot(tmp_path) == before


def test_reducing_an_entry_that_does_not_reproduce_exits_2_and_changes_nothing(tmp_path: Path) -> None:
    """dcp-exception-1638758deb73 is a GPU-only bug: on CPU its printed script does not reproduce."""
    path = tmp_path / "dcp-exception-1638758deb73.json"
    shutil.copy(ROOT / "corpus" / path.name, path)
    before = _snapshot(tmp_path)
    out = tmp_path / "r.py"
    result = run_cli("repro", str(path), "--reduce", "-o", str(out))
    assert result.returncode == 2, result.stderr
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and str(path) in errors[0] and "does not reproduce" in errors[0], result.stderr
    assert _snapshot(tmp_path) == before


def test_reduce_refuses_corrupt_and_newer_entries_with_one_line(tmp_path: Path) -> None:
    good = ROOT / "corpus" / "parity-mismatch-da0c9d4e06cd.json"
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


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_storing_stopped_by_a_signal_says_so_and_keeps_the_stored_script(tmp_path: Path, signum: int) -> None:
    """SIGTERM (a timeout, a scheduler) or Ctrl-C while ``--reduce`` runs the printed script: one
    line, no traceback, exit 128 + the signal, the stored script as it was, no process left."""
    name = "parity-mismatch-009298376223"
    shutil.copy(ROOT / "corpus" / f"{name}.json", tmp_path / f"{name}.json")
    kept = tmp_path / f"{name}.repro.py"
    kept.write_text((ROOT / "corpus" / f"{name}.repro.py").read_text() + "# not what printing gives\n")
    before = kept.read_text()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fuzz", "repro", str(tmp_path / f"{name}.json"), "--reduce"],
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
            time.sleep(0.5)  # until it runs the printed script under torchrun
            children = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        assert proc.poll() is None and children, "storing ended before it could be stopped"
        time.sleep(2)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()  # reaps it and closes the pipes
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].endswith(
        f"stopped by {signal.Signals(signum).name}"
    ), err
    assert kept.read_text() == before
    assert not wait_gone(children, timeout=30), "a process it started outlived it"


def _present_here(entry: Entry) -> bool:
    return bool(entry.bug) and known.present(known.get(entry.bug), torch.__version__)


def _reproduces_under_torchrun(path: Path) -> None:
    entry = load_entry(path.with_name(path.name.removesuffix(".repro.py") + ".json"))
    if not _present_here(entry):
        pytest.skip(f"{entry.bug} is not in this torch (its record's introduced_in, fixed_in)")
    if missing_api(entry.case):
        pytest.skip(f"{path.name} is {missing_api(entry.case)}")
    status, output, _ = run_script(path.read_text(), timeout=240, nproc=entry.case.world_size)
    assert status == 1, output[-3000:]
    if is_printed(path.read_text()):  # printed from the case: it names the tensor, or where torch raised
        said = r"^REPRODUCED: .+ where the .+ has " if entry.kind == "mismatch" else r"^REPRODUCED: rank \d+ "
        assert re.search(said, output, re.MULTILINE), output[-3000:]
        return
    assert any(f"REPRODUCED {s}" in output for s in entry.signatures), output[-3000:]  # a kept reduced one


#: Stored scripts run under torchrun in every CI run (a few seconds each): printed exceptions of
#: two body kinds, printed mismatches, and a kept reduced script where one of its bug is present.
SAMPLE = [
    "dcp-exception-d6daf354182c",
    "state_dict-exception-d75bbc271571",
    "parity-mismatch-da0c9d4e06cd",
    "parity-mismatch-009298376223",
    *[n for n in REDUCED if _present_here(load_entry(ROOT / "corpus" / f"{n}.json"))][:1],
]


@pytest.mark.parametrize("name", SAMPLE)
def test_sample_stored_scripts_reproduce_under_torchrun(name: str) -> None:
    _reproduces_under_torchrun(ROOT / "corpus" / f"{name}.repro.py")


@pytest.mark.slow  # 50 torchruns, 5 to 60 s each
@pytest.mark.parametrize("path", STORED, ids=[p.name.removesuffix(".repro.py") for p in STORED])
def test_every_stored_script_reproduces_under_torchrun_where_its_bug_is_present(path: Path) -> None:
    _reproduces_under_torchrun(path)


def _passes_with_the_fix(path: Path, tmp: Path) -> None:
    """The stored script exits 0 saying PASS on torch with its known bug's fix."""
    entry = load_entry(path.with_name(path.name.removesuffix(".repro.py") + ".json"))
    assert known.get(entry.bug or "").fix
    if missing_api(entry.case):
        pytest.skip(f"{path.name} is {missing_api(entry.case)}")
    ran = run_fixed(path.read_text(), entry, tmp)
    if ran is None:
        pytest.skip(f"the fix of {entry.bug} does not apply to this torch")
    assert ran == "passed", ran


#: The stored scripts of known bugs that have a fix written (fuzz.known.KnownBug.fix).
FIXED = [
    p
    for p in STORED
    if (bug := load_entry(p.with_name(p.name.removesuffix(".repro.py") + ".json")).bug) and known.get(bug).fix
]


@pytest.mark.parametrize("name", ["state_dict-exception-d4322b68deab", "parity-mismatch-da0c9d4e06cd"])
def test_a_stored_script_passes_on_torch_with_its_bug_fixed(name: str, tmp_path: Path) -> None:
    """The second oracle, on an exception's script and a mismatch's, in every CI run: the bug's
    fix turns the failure off."""
    path = ROOT / "corpus" / f"{name}.repro.py"
    assert path in FIXED
    _passes_with_the_fix(path, tmp_path)


@pytest.mark.slow  # a torchrun each
@pytest.mark.parametrize("path", FIXED, ids=[p.name.removesuffix(".repro.py") for p in FIXED])
def test_every_stored_script_passes_on_torch_with_its_bug_fixed(path: Path, tmp_path: Path) -> None:
    _passes_with_the_fix(path, tmp_path)


def test_fixes_are_written_for_bugs_of_this_torch() -> None:
    assert len([b for b in known.BUGS.values() if b.fix and known.present(b, torch.__version__)]) >= 3


@pytest.mark.parametrize("bug", [b for b in known.BUGS.values() if b.fix], ids=lambda b: b.id)
def test_every_written_fix_applies_to_this_torch_where_its_bug_is_present(bug: known.KnownBug, tmp_path: Path) -> None:
    """A fix is written against one torch's code: where the bug is present here, its text must
    be there to replace (else the second oracle would go unchecked without a word). A fix
    written against one release's source only says so (``written_for``) and is skipped, with
    that word, on another."""
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


def test_a_fix_of_several_changes_is_applied_whole_at_import(tmp_path: Path) -> None:
    """A known bug's fix may change several places (fuzz.known.KnownBug.fix): the patch harness
    applies every change, in each module it names, and refuses a change whose text is not there
    exactly once."""
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


def test_the_entry_hash_ignores_counters_and_fields_at_their_defaults() -> None:
    """A campaign that meets the entry again (its count) leaves its stored script current; a
    change to its case does not."""
    entry = _corpus_entry("parity-mismatch-da0c9d4e06cd")
    counted = dataclasses.replace(entry, count=entry.count + 5, reruns=9, reproduced=9)
    assert entry_hash(counted) == entry_hash(entry)
    moved = dataclasses.replace(entry, case=dataclasses.replace(entry.case, seed=entry.case.seed + 1))
    assert entry_hash(moved) != entry_hash(entry)


def test_a_script_passes_only_when_every_verdict_says_so() -> None:
    assert passed("PASS: no rank raised\nPASS: no rank raised\n")
    assert passed("noise\nPASS: every loss, gradient and parameter agrees\n")
    assert passed("PASS: no rank raisedPASS: no rank raised\n")  # two ranks' prints on one line
    assert not passed("PASS: no rank raised\nFAIL (another failure): rank 1 raised KeyError@torch/x.py:f\n")
    assert not passed("PASS or another failure: mismatch:parity@fsdp2\n")
    assert not passed("REPRODUCED: rank 0 raised ...\n")
    assert not passed("")  # a script that said nothing did not pass


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


def test_a_stop_whose_keyboard_interrupt_was_lost_ends_storing_at_its_next_run(tmp_path: Path) -> None:
    """SIGINT or SIGTERM is recorded (fuzz.stop) before its KeyboardInterrupt unwinds; where that
    KeyboardInterrupt is lost on its way, the next run raises it again instead of starting."""
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
    """A script that reads what an earlier run left in the temporary directory finds nothing."""
    script = (
        "import os, sys, tempfile\n"
        "mark = os.path.join(tempfile.gettempdir(), 'left-by-an-earlier-run')\n"
        "seen = os.path.exists(mark)\n"
        "open(mark, 'w').close()\n"
        "sys.exit(3 if seen else 0)\n"
    )
    assert [run_script(script, timeout=60)[0] for _ in range(2)] == [0, 0]
