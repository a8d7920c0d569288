"""The user's own model (``--model FILE.py:NAME``, ``user_cases(factory)``): the driver's checks,
the strategies, the two properties on unmutated torch and under faults they must catch, the
command line's exit codes, and the pytest route."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from fuzz.errors import CaseError, InvalidArgument
from fuzz.model import Case, Composition, ShardSpec, Training, case_from_json, case_to_json
from fuzz.model.user import RoundTrip, UserParityBody, UserStateBody, composition_problem, parse_spec
from fuzz.properties import get_property
from fuzz.pytest_plugin import user_cases
from fuzz.user_model import describe, spec_of
from strategies import parity_cases
from strategies._user import user_compositions, user_parity_cases, user_state_cases
from tests.conftest import ROOT, fault_pool, run_cli

EXAMPLE = "examples/tiny_transformer.py:tiny_transformer"
#: Ranks decode user cases only where fuzz.model.case.BODY_MODULES names fuzz.model.user.
HARNESS = ROOT / "tests" / "faults" / "harness"

BAD_MODELS = """
import threading
import time
import torch
from torch import nn

def _fns():
    return (lambda n, g: (torch.randn(n, 4, generator=g), torch.randn(n, 4, generator=g)),
            lambda out, y: ((out - y) ** 2).mean())

def raises():
    raise RuntimeError("no weights here")

def no_params():
    return (nn.ReLU(), *_fns())

def wrong_shape():
    return (nn.Linear(3, 4), *_fns())

def not_a_tuple():
    return nn.Linear(4, 4)

class Locked(nn.Linear):
    def __init__(self):
        super().__init__(4, 4)
        self.lock = threading.Lock()

def not_copyable():
    return (Locked(), *_fns())

def vector_loss():
    batch, _ = _fns()
    return (nn.Linear(4, 4), batch, lambda out, y: (out - y) ** 2)

def unseeded():
    model = nn.Linear(4, 4)
    with torch.no_grad():
        model.weight.copy_(torch.randn(4, 4, generator=torch.Generator().manual_seed(time.time_ns())))
    return (model, *_fns())

def fine():
    return (nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4)), *_fns())
"""


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "models.py"
    path.write_text(textwrap.dedent(BAD_MODELS))
    return path


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("missing", "has no 'missing'"),
        ("torch", "is not callable"),
        ("raises", "the factory raised RuntimeError: no weights here"),
        ("no_params", "the model has no parameters"),
        ("wrong_shape", "the model cannot take batch_fn's inputs"),
        ("not_a_tuple", "return a tuple (model, batch_fn, loss_fn)"),
        ("not_copyable", "cannot be deep-copied for the reference"),
        ("vector_loss", "return a floating-point scalar tensor"),
        ("unseeded", "two builds under torch.manual_seed"),
    ],
)
def test_bad_models_are_refused_naming_what_is_wrong(bad_models: Path, name: str, says: str) -> None:
    with pytest.raises(InvalidArgument, match="--model") as info:
        describe(f"{bad_models}:{name}", "--model")
    assert says in str(info.value) and "\n" not in str(info.value)


def test_bad_specs_are_refused() -> None:
    for spec, says in [("model.py", "expected FILE.py:NAME"), ("a-b:c", "neither a .py file"), ("x.py:1", "expected")]:
        with pytest.raises(InvalidArgument, match=says):
            parse_spec(spec)
    with pytest.raises(InvalidArgument, match="does not exist"):
        describe("no/such/file.py:f", "--model")
    with pytest.raises(InvalidArgument, match="cannot import module 'no_such_module_xyz'"):
        describe("no_such_module_xyz:f", "--model")


def test_a_module_path_spec_describes_the_same_model() -> None:
    by_file, by_module = describe(EXAMPLE), describe("examples.tiny_transformer:tiny_transformer")
    assert by_file.digest == by_module.digest and by_file.modules == by_module.modules


def test_the_example_is_described() -> None:
    info = describe(EXAMPLE)
    kinds = {m.path: m.kind for m in info.modules}
    assert info.shared == (("embed", "output"),)  # the tied embedding and output projection
    assert kinds["layers"] == "ModuleList" and info.module("layers").calls == 0  # type: ignore[union-attr]
    assert kinds["layers.1.attn"] == "Attention" and info.float64


def test_spec_of_a_factory_names_its_file(bad_models: Path) -> None:
    from examples.tiny_transformer import tiny_transformer

    assert spec_of(tiny_transformer) == EXAMPLE
    with pytest.raises(InvalidArgument, match="module-level function"):
        spec_of(lambda: None)


@settings(max_examples=200, suppress_health_check=list(HealthCheck), deadline=None)
@given(st.data())
def test_compositions_keep_the_rules(data: st.DataObject) -> None:
    info = describe(EXAMPLE)
    world_size = data.draw(st.sampled_from([2, 4]))
    comp = data.draw(user_compositions(info, world_size=world_size))
    assert composition_problem(info, comp) is None
    members = [s.path for s in comp.shards] + list(comp.replicates)
    assert "" in members and "layers" not in members + list(comp.checkpoints)
    # the tied embedding and output projection stay in one unit: neither is a unit of its own
    assert not {"embed", "output"} & set(members)


def test_rules_refuse_what_is_not_drawn() -> None:
    info = describe(EXAMPLE)
    assert "share a parameter" in (
        composition_problem(info, Composition(shards=(ShardSpec(""), ShardSpec("embed")))) or ""
    )
    assert "under no fully_shard" in (composition_problem(info, Composition(shards=(ShardSpec("layers.0"),))) or "")
    assert "container" in (
        composition_problem(info, Composition(shards=(ShardSpec(""),), checkpoints=("layers",))) or ""
    )
    inside = tuple(ShardSpec(f"layers.0.attn.{p}") for p in "qkvo")
    attn = Composition(shards=(ShardSpec(""), *inside), replicates=("layers.0.attn",))
    assert "no trainable parameter" in (composition_problem(info, attn) or "")
    assert "both" in (composition_problem(info, Composition(shards=(ShardSpec(""),), replicates=("",))) or "")


def test_failures_shrink_to_the_fewest_wrapped_modules_and_steps() -> None:
    """What a failure needs (here: a checkpointed module and two steps) is all a shrunk case keeps."""
    minimal = find(
        user_parity_cases(EXAMPLE, world_size=2),
        lambda c: bool(c.body.composition.checkpoints) and c.body.training.steps >= 2,
        settings=settings(database=None, max_examples=2000, suppress_health_check=list(HealthCheck)),
    )
    assert minimal.size == (2, 2)  # the root's unit and one checkpoint; two steps
    assert minimal.body.composition.shards == (ShardSpec(""),) and minimal.seed == 0


def test_cases_are_json_and_refuse_what_the_rules_refuse() -> None:
    case = find(
        user_state_cases(EXAMPLE, world_size=4), lambda c: c.body.target is not None and bool(c.body.composition.mesh)
    )
    assert case_from_json(json.loads(json.dumps(case_to_json(case)))) == case
    with pytest.raises(CaseError, match="cpu_offload"):
        UserStateBody(model=EXAMPLE, composition=Composition(), full_state_dict=True, cpu_offload=True)
    with pytest.raises(CaseError, match="full_state_dict"):
        UserStateBody(model=EXAMPLE, composition=Composition(), mode=RoundTrip.DCP, full_state_dict=True)
    with pytest.raises(CaseError, match="another layout"):
        UserStateBody(model=EXAMPLE, composition=Composition(), target=Composition(replicates=("",)))


def _cases(strategy: st.SearchStrategy[Case], n: int) -> list[Case]:
    out: list[Case] = []

    @settings(max_examples=n, database=None, derandomize=True, suppress_health_check=list(HealthCheck), deadline=None)
    @given(strategy)
    def collect(case: Case) -> None:
        out.append(case)

    collect()
    return out


def test_drawn_cases_pass_on_unmutated_torch(rank_pool: object) -> None:
    from fuzz.explore import run_case

    for case in _cases(user_parity_cases(EXAMPLE, world_size=2), 4) + _cases(
        user_state_cases(EXAMPLE, world_size=2), 4
    ):
        failure = run_case(rank_pool, get_property(case.property), case)  # type: ignore[arg-type]
        assert failure is None, f"{failure.signature}: {failure.summary}"


OTHER_MODEL = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(4, 8)
        self.drop = nn.Dropout(0.3)
        self.heads = nn.ModuleDict({"a": nn.Linear(8, 2), "b": nn.Linear(8, 3)})
        self.spare = nn.Linear(8, 8)  # never used

    def forward(self, x, scale):
        h = self.drop(torch.tanh(self.enc(x))) * scale
        return {"a": self.heads["a"](h), "b": self.heads["b"](h)}, h

def batch(n, generator):
    return {"x": torch.randn(n, 4, generator=generator), "scale": 2.0}, torch.randn(n, 2, generator=generator)

def loss(out, y):
    heads, h = out
    return ((heads["a"] - y) ** 2).mean() + heads["b"].pow(2).mean() + 0.1 * h.mean()

def build():
    return Net(), batch, loss
"""


def test_keyword_inputs_dict_outputs_dropout_and_an_unused_layer(tmp_path: Path, rank_pool: object) -> None:
    """Inputs as keyword arguments (a float among them), a dict and a tuple as outputs, dropout
    under checkpoint, a layer forward never calls (replicate then needs find_unused).

    A round trip of such a model's state meets a torch bug (2.13; pytorch/pytorch#192202, fix
    in review #192307): get_state_dict saves no optimizer state for a trainable parameter that
    never had a gradient while others have state, and the load then refuses the checkpoint
    (set_state_dict: "Missing optimizer state for parameter 'spare.weight'", DCP: a missing key)."""
    from fuzz.explore import run_case

    path = tmp_path / "other_model.py"
    path.write_text(OTHER_MODEL)
    info = describe(f"{path}:build")
    assert info.module("spare").unused and not info.module("enc").unused  # type: ignore[union-attr]
    spec = f"{path}:build"
    drawn = _cases(user_parity_cases(spec, world_size=2), 3) + _cases(user_state_cases(spec, world_size=2), 2)
    assert any(c.body.composition.replicates and c.body.composition.find_unused for c in drawn)
    for case in drawn:
        failure = run_case(rank_pool, get_property(case.property), case)  # type: ignore[arg-type]
        if case.property == "user_state":
            assert failure is not None and "RuntimeError" in failure.signature, case
            assert "spare.weight" in json.dumps(failure.details), failure.summary
            continue
        assert failure is None, f"{failure.signature}: {failure.summary}"


def _fault(tmp_path: Path, module: str, old: str, new: str) -> dict[str, str]:
    # one file per fault: a pool's zygote is kept per environment, and would keep an earlier fault
    path = tmp_path / f"fault-{abs(hash((module, old, new)))}.json"
    path.write_text(json.dumps({"module": module, "old": old, "new": new}))
    return {
        "SHARDFUZZ_FAULT": str(path),
        "PYTHONPATH": os.pathsep.join([str(HARNESS), os.environ.get("PYTHONPATH", "")]),
    }


#: fully_shard's reduce-scatter sums the gradients instead of averaging them.
SUMMED = (
    "torch.distributed.fsdp._fully_shard._fsdp_collectives",
    "            return None, None, ReduceOp.AVG, ReduceOp.AVG\n",
    "            return None, None, ReduceOp.SUM, ReduceOp.SUM\n",
)
#: set_state_dict loads the model but not the optimizer.
NO_OPTIM_LOAD = (
    "torch.distributed.checkpoint.state_dict",
    "        _verify_state_dict(model_state_dict, optim_state_dict, info)\n"
    "        _load_optim_state_dict(model, optimizers, optim_state_dict, info)\n        return _load_model_state_dict(",
    "        _verify_state_dict(model_state_dict, optim_state_dict, info)\n        return _load_model_state_dict(",
)


def test_faults_are_caught(tmp_path: Path) -> None:
    parity = Case(
        "user_parity",
        2,
        0,
        UserParityBody(model=EXAMPLE, composition=Composition(shards=(ShardSpec(""),)), training=Training(steps=1)),
    )
    state = Case(
        "user_state",
        2,
        0,
        UserStateBody(model=EXAMPLE, composition=Composition(shards=(ShardSpec(""),)), training=Training(momentum=0.9)),
    )
    for case, fault, check in (
        (parity, SUMMED, "mismatch:user_parity@fsdp2"),
        (state, NO_OPTIM_LOAD, "mismatch:user_state"),
    ):
        prop = get_property(case.property)
        with fault_pool(_fault(tmp_path, *fault)) as pool:
            failure = prop.judge(case, pool.run(case))
        assert failure is not None and failure.signature.startswith(check), failure
        if case is state:
            assert "optim.state" in failure.summary, failure.summary


def test_explore_with_a_bad_model_exits_2_with_one_line(bad_models: Path) -> None:
    result = run_cli("explore", "--model", f"{bad_models}:no_params", "--budget", "5", "--no-database")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--model" in result.stderr and "no parameters" in result.stderr


@pytest.mark.slow
def test_a_failure_is_saved_replayed_and_rendered(tmp_path: Path) -> None:
    """Under the summing fault a campaign over the example saves a shrunk user_parity failure;
    replay reproduces it, repro writes a script that loads the user's file."""
    env = _fault(tmp_path, *SUMMED)
    corpus = tmp_path / "corpus"
    args = ("explore", "--model", EXAMPLE, "--property", "user_parity", "--budget", "60", "--seed", "1")
    result = run_cli(*args, "--corpus", str(corpus), "--no-database", "--reruns", "1", env=env)
    assert result.returncode == 1, result.stderr
    (entry,) = corpus.glob("*.json")
    data = json.loads(entry.read_text())
    assert data["case"]["body"]["model"] == EXAMPLE
    assert data["case"]["body"]["training"].get("steps", 2) == 1  # shrunk to one step
    assert run_cli("replay", str(entry), env=env).returncode == 1
    assert run_cli("replay", str(entry)).returncode == 0
    script = tmp_path / "repro.py"
    assert run_cli("repro", str(entry), "-o", str(script)).returncode == 0
    assert EXAMPLE in script.read_text()


@settings(max_examples=3, derandomize=True, suppress_health_check=list(HealthCheck), deadline=None, database=None)
@given(case=user_cases(EXAMPLE) | parity_cases(world_size=2))
def test_pytest_route_checks_user_cases_beside_the_suites_own(check_case: object, case: Case) -> None:
    """``user_cases(factory)`` composes with the suite's strategies; ``check_case`` runs either."""
    check_case(case)  # type: ignore[operator]
