"""The README is a five-minute read whose facts follow the code: its length, its table of
properties (the registry's names and descriptions), the options its command lines name, and the
files it points to."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fuzz.cli import build_parser
from fuzz.properties import all_properties

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()

#: About a five-minute read; measurements and fault tables live in docs/.
MAX_LINES = 150


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= MAX_LINES


def test_the_property_table_is_the_registry() -> None:
    rows = re.findall(r"^\| `([a-z_]+)` \| (.+) \|$", README, flags=re.M)
    assert rows == [(p.name, p.description) for p in all_properties()]


def _command_lines() -> list[list[str]]:
    block = README.split("## Command line", 1)[1].split("\n## ", 1)[0]
    commands = []
    for line in block.splitlines():
        if line.strip().startswith("python -m fuzz "):
            commands.append(line.split("#", 1)[0].split()[3:])
    return commands


def test_every_option_the_command_lines_name_exists() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.choices and "explore" in a.choices)  # type: ignore[operator]
    commands = _command_lines()
    assert {c[0] for c in commands} >= {"explore", "replay", "repro", "properties", "corpus", "coverage", "bench"}
    for command in commands:
        sub = subparsers.choices[command[0]]  # type: ignore[index]
        known = {opt for action in sub._actions for opt in action.option_strings}
        named = set(re.findall(r"--[a-z][a-z-]*", " ".join(command)))
        assert named <= known, f"{command[0]}: {sorted(named - known)} not options of the command line"


@pytest.mark.parametrize("path", sorted(set(re.findall(r"`((?:docs|scripts|examples|fuzz)/[\w./-]+)`", README))))
def test_every_file_the_readme_names_exists(path: str) -> None:
    assert (ROOT / path.split(":")[0]).exists(), path


def test_the_strategy_example_draws_50_valid_cases_with_no_reject() -> None:
    """The README's pytest example, its fixtures stood in for: every drawn case is built (a
        ParityBody validates itself: CaseError for what a composition cannot train), and no example
        is rejected on its way there by reject() or assume() (Hypothesis's own discarded draws, past
    the end of its buffer, are not rejections a user sees)."""
    from types import SimpleNamespace

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from hypothesis.errors import UnsatisfiedAssumption

    block = README.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(compile(block, "README.md", "exec"), namespace)
    example = namespace["test_my_compositions_train_like_the_reference"].hypothesis.inner_test  # type: ignore[attr-defined]
    pool = SimpleNamespace(world_size=2)
    rejected: list[str] = []
    cases: list[object] = []

    @settings(max_examples=50, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        try:
            example(pool, cases.append, data)
        except UnsatisfiedAssumption as e:  # reject() or assume() on the way: the user would have to know
            rejected.append(repr(e))
            raise

    run()
    assert not rejected and len(cases) == 50
