"""Scripts printed from the case (fuzz/repro/printed.py and its print_* modules): what they
observe is what the pool observes (losses and parameters, or the exception and where torch
raised it), they refuse by name what they cannot print, the stored ones are current, clean and
compute every value they compare, and a bad entry changes nothing."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, reject, settings
from hypothesis import strategies as st

from fuzz.corpus import load_entry
from fuzz.errors import CaseError
from fuzz.model import (
    AccumSync,
    Block,
    Case,
    Composition,
    Dtype,
    Leaf,
    LeafKind,
    ModuleTree,
    Optimizer,
    ParityBody,
    ShardSpec,
    Training,
    Wrapper,
)
from fuzz.repro import print_contract
from fuzz.repro.print_check import FRAME
from fuzz.repro.printed import NotPrintable, is_printed, print_case, print_entry, printable
from fuzz.signature import location
from tests.conftest import ROOT

#: What the test adds to a printed mismatch script to read its composed run as the pool's
#: observations (each step's losses, and its parameters after the step).
_OBSERVE = """

def observe(rank, world_size):
    import json
    seen = train(rank, world_size, compose)
    steps = sorted({int(k.split()[3].rstrip(",")) for k in seen if k.startswith("loss at step ")})
    losses = [[float(v) for k, v in seen.items() if k.split(",")[0] == f"loss at step {s}"] for s in steps]
    params = [{k.split()[0]: v.double().flatten().tolist() for k, v in seen.items() if k.endswith(f" after step {s}")}
              for s in steps]
    return json.dumps({"losses": losses, "params": params})
"""

#: What the test adds to a printed exception script: the exception its ``main`` raises on this
#: rank as the script names it (Type@innermost torch frame, read with the script's FRAME), or "ok".
_RAISED = f"""

def raised(rank, world_size):
    try:
        main(rank, world_size)
    except Exception as e:
        frames = re.findall(r'{FRAME}', traceback.format_exc())
        return f"{{type(e).__name__}}@{{':'.join(frames[-1]) if frames else '?'}}"
    return "ok"
"""

_LEAVES = st.sampled_from([LeafKind.LINEAR, LeafKind.LAYER_NORM, LeafKind.CONV1D, LeafKind.TANH, LeafKind.RELU])
_WEIGHTED = (LeafKind.LINEAR, LeafKind.LAYER_NORM, LeafKind.CONV1D)
_COMPOSITIONS = [
    Composition(shards=(ShardSpec(path=""),)),
    Composition(shards=(ShardSpec(path="0", reshard_after_forward=False), ShardSpec(path=""))),
    Composition(shards=(ShardSpec(path="0"), ShardSpec(path="")), mesh=(1, 2)),
    Composition(shards=(ShardSpec(path=""),), mesh=(2, 1)),
    Composition(replicates=("",), shards=(ShardSpec(path="0"),)),
    Composition(wrapper=Wrapper.FSDP1_NO_SHARD, auto_wrap=True),
    Composition(wrapper=Wrapper.FSDP1_FULL_SHARD, auto_wrap=True),
    Composition(wrapper=Wrapper.FSDP1_HYBRID_SHARD, mesh=(1, 2)),
]


@st.composite
def printable_parity_cases(draw: st.DrawFn) -> Case:
    """Parity cases of what fuzz.repro.printed writes: Linear, LayerNorm, one-tap Conv and
    activation leaves in blocks with a scale, a buffer or a residual, fully_shard (nested, HSDP)
    or replicate over fully_shard, or FSDP1 (NO_SHARD, FULL_SHARD, HYBRID_SHARD, whose parameters
    are read whole); SGD or Adam, foreach or not (foreach
    over replicate and fully_shard raises on torch 2.13), microbatches with a gradient-sync
    switch."""
    kinds = draw(st.lists(_LEAVES, min_size=0, max_size=2))
    leaves = [Leaf(k, bias=(k in _WEIGHTED and draw(st.booleans())) or k not in _WEIGHTED) for k in kinds]
    inner = Block(children=(Leaf(LeafKind.LINEAR), *leaves[:1]), scale=draw(st.booleans()))
    root = Block(children=(inner, Leaf(LeafKind.LINEAR), *leaves[1:]), buffer=draw(st.booleans()))
    adam = draw(st.booleans())
    accum = draw(st.integers(1, 2))
    try:
        training = Training(
            optimizer=Optimizer.ADAM if adam else Optimizer.SGD,
            dtype=Dtype.FLOAT64 if adam else Dtype.FLOAT32,
            steps=draw(st.integers(1, 2)),
            grad_accum=accum,
            accum_sync=draw(st.sampled_from([AccumSync.ALWAYS, AccumSync.NO_GRAD_SYNC]))
            if accum > 1
            else AccumSync.ALWAYS,
            foreach=draw(st.sampled_from([None, True])),
        )
        body = ParityBody(
            tree=ModuleTree(width=draw(st.sampled_from([2, 3, 5])), root=root),
            composition=draw(st.sampled_from(_COMPOSITIONS)),
            training=training,
        )
        return Case(property="parity", world_size=2, seed=draw(st.integers(0, 3)), body=body)
    except CaseError:
        reject()


_FSDP1 = Case(
    "parity",
    2,
    1,
    ParityBody(
        tree=ModuleTree(width=3, root=Block(children=(Block(children=(Leaf(LeafKind.LINEAR),)), Leaf(LeafKind.TANH)))),
        composition=_COMPOSITIONS[-2],
        training=Training(steps=2),
    ),
)


_FOREACH = load_entry(ROOT / "corpus" / "parity-exception-f2ce67efc316.json").case


def _found(report: Any) -> str:
    """What a rank of the pool raised, as a printed script names it."""
    return f"{report.exc_type.rpartition('.')[2]}@{location(report.traceback)}"


@settings(max_examples=4, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@example(case=_FSDP1)
@example(case=_FOREACH)
@given(case=printable_parity_cases())
def test_a_printed_script_observes_what_the_pool_observes(rank_pool: Any, case: Case) -> None:
    """Differential: where the pool's run of a case passes, the printed mismatch program's
    composed run (its losses on every rank, its full parameters after every step) equals it bit
    for bit, and the printed exception program raises nowhere; where a rank of the pool raises,
    the exception program raises the same type in the same innermost torch frame there."""
    if rank_pool.world_size != 2 or rank_pool.backend != "gloo":
        pytest.skip("compares with a 2-rank gloo pool")
    try:
        code = print_case(case, ["Exception@torch/?"])
    except NotPrintable:
        reject()
    outcome = rank_pool.run(case)
    raised = rank_pool.run_script(code + _RAISED, function="raised", deadline=120)
    assert not raised.errors and not raised.missing, (raised.errors, raised.missing)
    if not outcome.ok:
        pool = {r.rank: _found(r) for r in outcome.ranks if r.exc_type}
        assert pool, outcome.kind
        assert {rank: raised.verdicts[rank] for rank in pool} == pool
        return
    assert set(raised.verdicts.values()) == {"ok"}
    ran = rank_pool.run_script(print_case(case) + _OBSERVE, function="observe", deadline=120)
    assert not ran.errors and not ran.missing, (ran.errors, ran.missing)
    for rank, observation in enumerate(outcome.observations):
        mine = json.loads(ran.verdicts[rank])
        assert json.dumps(mine["losses"]) == json.dumps(observation["losses"]), f"rank {rank}'s losses"
    assert json.dumps(json.loads(ran.verdicts[0])["params"]) == json.dumps(outcome.observations[0]["params"])


def test_what_cannot_be_printed_yet_is_refused_by_name() -> None:
    tree = ModuleTree(width=2, root=Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.RMS_NORM))))
    case = Case("parity", 2, 0, ParityBody(tree=tree, composition=_COMPOSITIONS[0]))
    with pytest.raises(NotPrintable, match=r"cannot print leaf kind rms_norm \(at 1\) yet"):
        print_case(case)
    plain = ModuleTree(width=2, root=Block(children=(Leaf(LeafKind.LINEAR),)))
    unused = Case("parity", 2, 0, ParityBody(tree=plain, composition=Composition(replicates=("",), find_unused=True)))
    with pytest.raises(NotPrintable, match=r"cannot print composition\.find_unused=True yet"):
        print_case(unused)
    # a contract's failure is printed by the contract printer (the observation, not a comparison)
    contract = load_entry(ROOT / "corpus" / "parity-mismatch-565dd6c849aa.json")
    assert printable(contract) and print_contract.PASSED in print_entry(contract)


def _stored_printed() -> list[Path]:
    return [p for p in sorted((ROOT / "corpus").glob("*.repro.py")) if is_printed(p.read_text())]


def test_stored_printed_scripts_are_current_clean_and_compute_what_they_compare() -> None:
    """Each stored printed script is what printing its entry gives now; ruff finds nothing in it
    (F, E, B, SIM); no float in it is a value to compare against (only the tolerance policy,
    the optimizer's options, the knobs' values, the weights' own initialisation, dropout's
    probability and the factors named); an exception's reads its frames with FRAME."""
    stored = [p for p in _stored_printed() if p.name.startswith(("parity-", "metamorphic-", "mixed_precision-"))]
    assert len(stored) >= 6
    for path in stored:
        text = path.read_text()
        entry = load_entry(path.with_name(path.name.removesuffix(".repro.py") + ".json"))
        assert text.split("\n", 2)[2] == print_entry(entry).split("\n", 1)[1], path.name
        training = entry.case.body.training  # type: ignore[attr-defined]
        factor = entry.case.body.composition.knobs.gradient_divide_factor  # type: ignore[attr-defined]
        allowed = {1e-05, 1e-06, 1e-09, 1e-12, training.lr, training.momentum, training.eps, 0.1, 0.5, 1.0, factor}
        floats = {n.value for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Constant) and type(n.value) is float}
        assert floats <= allowed, (path.name, floats - allowed)
        assert (FRAME in text) == (entry.kind == "exception"), path.name
    lint = [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "F,E,B,SIM", *map(str, stored)]
    done = subprocess.run(lint, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_a_script_names_the_entrys_exception_as_the_signature_does() -> None:
    """What a printed script matches (its exception's type @ the innermost frame of torch's own
    code, read off the traceback's text with FRAME) is fuzz.signature's reading of the same
    traceback, for every rank's traceback of every exception entry."""
    checked = 0
    for path in sorted((ROOT / "corpus").glob("*-exception-*.json")):
        entry = load_entry(path)
        for rank in entry.details.get("ranks", []):
            text = rank.get("traceback")
            if not text or not rank.get("exc_type"):
                continue
            frames = re.findall(FRAME, text)
            assert (frames[-1][0] + ":" + frames[-1][1] if frames else "?") == location(text), (path.name, rank["rank"])
            checked += 1
    assert checked >= 20


def test_an_exception_script_reproduces_under_torchrun_and_says_so(tmp_path: Path) -> None:
    """A stored exception script, run as a reader runs it: exit 1, REPRODUCED naming the entry's
    exception on the ranks that raise it, no PASS."""
    path = ROOT / "corpus" / "parity-exception-f2ce67efc316.repro.py"
    if not is_printed(path.read_text()):
        pytest.skip("its stored script is not printed")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(path)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    said = [line for line in done.stdout.splitlines() if line.startswith(("REPRODUCED", "PASS", "FAIL"))]
    assert done.returncode == 1 and said, done.stdout + done.stderr
    assert all(line.startswith("REPRODUCED: rank") and "torch/optim/sgd.py:_multi_tensor_sgd" in line for line in said)


def test_a_printed_script_outside_torchrun_fails_another_way(tmp_path: Path) -> None:
    """Without torchrun's process group to join, a script exits 2 (not 1: it reproduced nothing)."""
    for name in ("parity-mismatch-009298376223", "parity-exception-f2ce67efc316"):
        entry = load_entry(ROOT / "corpus" / f"{name}.json")
        script = tmp_path / "repro.py"
        script.write_text(print_entry(entry))
        env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR")}
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "REPRODUCED" not in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("bad", ["corrupt", "newer schema"])
def test_a_bad_entry_gets_one_line_and_exit_2_and_changes_nothing(tmp_path: Path, bad: str) -> None:
    source = ROOT / "corpus" / "parity-exception-f2ce67efc316.json"
    entry = tmp_path / source.name
    if bad == "corrupt":
        entry.write_text(source.read_text()[:200])
    else:
        data = json.loads(source.read_text())
        data["schema"] += 1
        entry.write_text(json.dumps(data))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    out = tmp_path / "out.py"
    done = subprocess.run(
        [sys.executable, "-m", "fuzz", "repro", str(entry), "-o", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and str(entry) in done.stderr, done.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
