"""Printed training scripts of the features beyond the plain composition: replicate's options
(static_graph, a delayed all-reduce), tensor parallelism, SPMD programs, torch.compile, a block
run twice over (with an attention leaf), fully_shard's ignored_params and a unit of several
modules. Each entry's script makes the feature's call; a case of each observes what the pool
observes (the differential check of tests/test_repro_printed.py); one runs under torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fuzz.corpus import load_entry
from fuzz.model import (
    Block,
    Case,
    Compile,
    Composition,
    Leaf,
    LeafKind,
    ModuleTree,
    ParityBody,
    ReplicateOptions,
    ShardSpec,
    TpPair,
    Training,
)
from fuzz.repro.printed import print_case, print_entry, printable
from tests.conftest import ROOT
from tests.test_repro_printed import _OBSERVE

#: Per entry: what its printed script must call (the feature that made it unprintable before).
CALLS = {
    "parity-exception-86a14603f6de": ["param_to_hook_all_reduce=", "delay_all_reduce_named_params=["],
    "parity-mismatch-28f92215865a": ["static_graph=True", "delay_all_reduce_named_params=["],
    "parity-mismatch-f8abf11c38c5": [
        "distribute_tensor(p.detach(), mesh, [Replicate()])",
        'dp_mesh_dims=DataParallelMeshDims(shard="shard")',
        "F.mse_loss(out, target) * 2",
    ],
    "parity-exception-49c62d6cb7ad": ['mesh_dim_names=("shard", "tp")', '"0.2.weight": Shard(1)', "dp_mesh_dims="],
    "parity-exception-0c5058dcf8f5": ['torch.compile(model, backend="eager")', "hooks.pop().remove()"],
    "metamorphic-exception-f2b0e694e1b5": ['torch.compile(model, backend="eager")', "compose_variant"],
    "parity-exception-b2e07543b1f2": ["class Attention(nn.Module):", "for _ in range(2 if self.repeat else 1):"],
    "parity-mismatch-6176f16b4070": ["ignored_params={*", "p not in ignored", 'backend="aot_eager"'],
    "mixed_precision-exception-becbed954123": ['fully_shard([model.get_submodule("2"), model.get_submodule("0")], mp_'],
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_each_entry_prints_the_call_of_its_feature(name: str) -> None:
    entry = load_entry(ROOT / "corpus" / f"{name}.json")
    assert printable(entry)
    text = print_entry(entry)
    for call in CALLS[name]:
        assert call in text, (name, call)


def _tp_case(spmd: bool) -> Case:
    mlp = Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.GELU), Leaf(LeafKind.LINEAR)), residual=True)
    comp = Composition(shards=(ShardSpec(path=""),), tp=(TpPair(colwise="0.0", rowwise="0.2"),), tp_size=2, spmd=spmd)
    body = ParityBody(tree=ModuleTree(width=2, root=Block(children=(mlp,))), composition=comp, training=Training())
    return Case("parity", 4, 0, body)


def test_tensor_parallelism_without_spmd_is_parallelize_module_over_the_tp_dimension() -> None:
    text = print_case(_tp_case(spmd=False))
    assert 'parallelize_module(model, mesh["tp"], {"0.0": ColwiseParallel(), "0.2": RowwiseParallel()})' in text
    assert 'fully_shard(model, mesh=mesh["shard"], reshard_after_forward=True)' in text  # the root's, written out
    assert "[(rank // 2) * 2 :]" in text  # a tensor-parallel group shares its input


_LINEARS = ModuleTree(width=3, root=Block(children=(Leaf(LeafKind.LINEAR), Leaf(LeafKind.TANH), Leaf(LeafKind.LINEAR))))
#: Passing cases of each feature on 2 ranks (the pool's run and the printed one must agree). Not
#: an SPMD program: a pool rank that ran earlier cases can hand a new mesh's DTensors an equal
#: mesh of an earlier one, which fully_shard refuses (it wants the very object); under torchrun
#: each script has a process of its own.
_CASES = {
    "static_graph": Composition(replicates=("",), replicate_options=ReplicateOptions(static_graph=True)),
    "ignored_params": Composition(shards=(ShardSpec(path="", ignored=("0",)),)),
    "group": Composition(shards=(ShardSpec(path="0", group=("2",)), ShardSpec(path=""))),
}


@pytest.mark.parametrize("feature", sorted(_CASES))
def test_a_printed_feature_observes_what_the_pool_observes(rank_pool: Any, feature: str) -> None:
    """The composed run's losses on every rank and full parameters after every step, printed
    and in the pool, bit for bit."""
    if rank_pool.world_size != 2 or rank_pool.backend != "gloo":
        pytest.skip("compares with a 2-rank gloo pool")
    training = Training(steps=2, compile=Compile.EAGER if feature == "ignored_params" else Compile.NONE)
    case = Case("parity", 2, 1, ParityBody(tree=_LINEARS, composition=_CASES[feature], training=training))
    outcome = rank_pool.run(case)
    assert outcome.ok, outcome.kind
    ran = rank_pool.run_script(print_case(case) + _OBSERVE, function="observe", deadline=120)
    assert not ran.errors and not ran.missing, (ran.errors, ran.missing)
    for rank, observation in enumerate(outcome.observations):
        mine = json.loads(ran.verdicts[rank])
        assert json.dumps(mine["losses"]) == json.dumps(observation["losses"]), f"rank {rank}'s losses"
    assert json.dumps(json.loads(ran.verdicts[0])["params"]) == json.dumps(outcome.observations[0]["params"])


@pytest.mark.slow
def test_the_spmd_mse_loss_script_reproduces_under_torchrun(tmp_path: Path) -> None:
    """F.mse_loss of batch-sharded DTensors: the gradient twice the reference's on 2 ranks,
    named at run time, exit 1."""
    script = tmp_path / "repro.py"
    script.write_text(print_entry(load_entry(ROOT / "corpus" / "parity-mismatch-f8abf11c38c5.json")))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "REPRODUCED: gradient of 0.weight at step 0" in done.stdout and "2 times as much" in done.stdout
