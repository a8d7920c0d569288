"""The specialization stage of reduced reproducers (fuzz/repro/flatten.py, fold.py, harness.py):
modules merged into one with their names kept apart, expressions folded to what an instrumented
run saw, and the case written as constructor calls. Fast: no torch in the processes they start."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.corpus import load_entry
from fuzz.repro.flatten import flatten
from fuzz.repro.fold import fold, instrument, read_records
from fuzz.repro.harness import case_expression
from tests.conftest import ROOT

ENTRIES = sorted((ROOT / "corpus").glob("*.json"))

A = """
from fuzz.b import helper as imported
from fuzz import b

LIMIT = 3


def helper(x):
    return x + LIMIT


def run():
    from fuzz.b import LIMIT as other
    return helper(1), imported(1), b.helper(2), other
"""

B = """
LIMIT = 10


def helper(x):
    return x * LIMIT
"""

MAIN = """
def main():
    from fuzz.a import run
    print(run())
"""


def test_flatten_keeps_names_of_different_modules_apart() -> None:
    tree, origins = flatten({"fuzz": "", "fuzz.a": A, "fuzz.b": B}, MAIN)
    code = ast.unparse(tree)
    assert "import" not in code.replace("from __future__ import annotations", "")
    namespace: dict[str, object] = {}
    exec(compile(code + "\nresult = run()\n", "flat", "exec"), namespace)
    assert namespace["result"] == (4, 10, 20, 10)
    assert {origins[name] for name in ("helper", "helper_b")} == {("fuzz.a", "helper"), ("fuzz.b", "helper")}


FOLDED = """
class Config:
    def __init__(self, steps, name):
        self.steps = steps
        self.name = name


def run(config, xs):
    total = 0
    if config.steps > 1:
        total += 100
    for x in xs:
        if x > 1:
            total += x
    return total, config.name


def main():
    print(run(Config(1, "a"), [1, 2, 3]))


main()
"""


def test_fold_replaces_what_the_run_saw_once_and_keeps_what_varied(tmp_path: Path) -> None:
    instrumented = instrument(FOLDED, {"Config"}, {"run", "Config"}, str(tmp_path))
    script = tmp_path / "s.py"
    script.write_text(instrumented)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "(5, 'a')", done.stderr
    code, count = fold(FOLDED, read_records(tmp_path), {"run", "Config"})
    namespace: dict[str, object] = {}
    exec(compile(code.replace("\nmain()\n", "\n"), "folded", "exec"), namespace)
    assert count >= 2
    assert "config.steps" not in code and "100" not in code  # the branch never taken is gone
    assert "'a'" in code  # config.name read once: its value
    assert "if x > 1" in code  # varied: kept


@pytest.mark.parametrize("path", ENTRIES, ids=[p.stem for p in ENTRIES])
def test_case_expression_builds_the_entrys_case(path: Path) -> None:
    entry = load_entry(path)
    expression, classes = case_expression(entry.case)
    namespace: dict[str, object] = {}
    for name, module in classes.items():
        exec(f"from {module} import {name}", namespace)
    assert eval(expression, namespace) == entry.case


CLEANED = """
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Failure:
    kind: str
    summary: str = ""
    details: dict = field(default_factory=dict)
    unread: int = 0

    def never_called(self):
        return 1


def run():
    step = 3
    None
    for name in ("a", "b"):
        continue
    return Failure("mismatch", "summary", {"check": "param"}).kind
"""


def test_clean_drops_what_nothing_reads_and_keeps_positional_fields() -> None:
    from fuzz.repro.fold import clean

    code = clean(CLEANED)
    namespace: dict[str, object] = {}
    exec(compile(code, "cleaned", "exec"), namespace)
    assert namespace["run"]() == "mismatch"  # type: ignore[operator]
    assert "details" in code and "summary" in code  # passed by position
    assert "unread" not in code and "never_called" not in code
    assert "step" not in code and "for name" not in code and "None" not in code


def test_clean_keeps_the_methods_torch_calls_on_a_stateful_object() -> None:
    """DCP saves and loads any object with ``state_dict`` / ``load_state_dict`` (the Stateful
    protocol) through them, though the script never names them: they are not idle."""
    from fuzz.repro.fold import clean

    code = clean(
        "class App:\n"
        "    def state_dict(self):\n"
        "        return {'step': 1}\n"
        "    def load_state_dict(self, state_dict):\n"
        "        pass\n"
        "    def never_called(self):\n"
        "        pass\n"
        "state = {'app': App()}\n"
    )
    assert "def state_dict" in code and "def load_state_dict" in code
    assert "never_called" not in code


def test_clean_drops_an_import_repeated_at_the_top_level_unless_the_name_is_bound_otherwise() -> None:
    from fuzz.repro.fold import clean

    code = clean(
        "from dataclasses import dataclass, field\n"
        "import os\n"
        "from dataclasses import dataclass\n"
        "from dataclasses import dataclass, field, replace\n"
        "import os\n"
        "import os.path\n"
        "def f():\n"
        "    import os\n"
        "    return os, dataclass, field, replace\n"
    )
    tops = [line for line in code.splitlines() if line.startswith(("import", "from"))]
    assert tops == [
        "from dataclasses import dataclass, field",
        "import os",
        "from dataclasses import replace",
        "import os.path",
    ]
    assert "    import os" in code  # a function's own import is its own
    rebound = clean("import os\nos = None\nimport os\nprint(os)\n")
    assert rebound.count("import os") == 2  # the second import undoes the assignment


def test_a_function_nothing_names_goes_though_a_field_or_attribute_shares_its_name() -> None:
    from fuzz.repro.fold import drop_unnamed_functions

    source = (
        "def param_names(node):\n"
        "    pass\n"
        "def called():\n"
        "    return 1\n"
        "def by_name():\n"
        "    return 2\n"
        "def only_itself(n):\n"
        "    return only_itself(n - 1) if n else 0\n"
        "class Side:\n"
        "    param_names = ()\n"
        "    def __init__(self):\n"
        "        self.param_names = [called()]\n"
        "PROGRAM = 'module:by_name'\n"
        "print(Side().param_names, PROGRAM)\n"
    )
    code = ast.unparse(drop_unnamed_functions(ast.parse(source)))
    assert "def param_names" not in code and "def only_itself" not in code
    assert "def called" in code and "def by_name" in code  # read, and named by a string


def test_a_judges_case_functions_become_their_value_for_the_case() -> None:
    from fuzz.properties.parity import api_of
    from fuzz.repro.specialize import fold_case_functions

    entry = load_entry(ROOT / "corpus" / "parity-mismatch-da0c9d4e06cd.json")
    body = entry.case.body
    code = (
        "def judge_parity(case):\n"
        "    body = case.body\n"
        "    api = api_of(body.composition, body.tree, body.training, 2)\n"
        "    other = api_of(local_only)\n"
        "    return api\n"
    )
    out = fold_case_functions(code, entry, {"api_of": ("fuzz.properties.parity", "api_of")})
    assert out is not None
    want = api_of(body.composition, body.tree, body.training, 2)  # type: ignore[attr-defined]
    assert f"api = {want!r}" in out
    assert "api_of(local_only)" in out  # an argument the case does not give: left as it is
    assert fold_case_functions(code, entry, {}) is None


def test_a_mismatch_freezes_its_judge_and_what_it_names_not_the_tags_it_is_charged() -> None:
    from collections import Counter

    from fuzz.repro.fold import WORD
    from fuzz.repro.harness import main_source
    from fuzz.repro.reduce import _judge_side, prune, unreduced_modules
    from fuzz.repro.specialize import fold_case_functions, initial

    entry = load_entry(ROOT / "corpus" / "parity-mismatch-da0c9d4e06cd.json")
    signature = "mismatch:parity@fsdp1:shard1"
    main, roots = main_source(entry, signature)
    pruned = prune(unreduced_modules(entry), {}, roots, Counter(WORD.findall(main)), set())
    code, origins = initial(entry, pruned, signature)
    folded = fold_case_functions(code, entry, origins)
    assert folded is not None
    frozen = _judge_side(folded, entry, origins)
    assert {"judge_parity", "compare_runs", "first_mismatch"} <= frozen
    assert not {"mismatch_tags", "api_of"} & frozen
    rank_side = {flat for flat, (module, _) in origins.items() if module.startswith(("fuzz._rank", "fuzz.model"))}
    assert not {"train", "build_model"} & frozen and {"train", "build_model"} <= rank_side
