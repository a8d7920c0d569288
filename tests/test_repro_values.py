"""Folding what plain Python computes in a reduced script (fuzz/repro/values.py): the values an
instrumented run saw become literals, but never a value torch computed (directly or through a
local that holds it), one that differs between ranks, one whose computation changed what it
read, or anything in the harness or a frozen definition. Fast: one Python process per test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.repro.values import fold, instrument, read_records

SCRIPT = """
import enum
import torch
from dataclasses import dataclass


class Kind(str, enum.Enum):
    A = 'a'


@dataclass
class Tree:
    width: object
    kids: object


def names():
    return ['weight', 'bias']


def paths(tree):
    return [str(i) for i, _ in enumerate(tree.kids)]


def judge(x):
    return sorted(x) == ['bias', 'weight']


def attempt(rank, world_size):
    import re
    try:
        tree = Tree(width=4, kids=(Kind.A, Kind.A))
        order = [(p, n) for p in paths(tree) for n in names()]
        lo = rank * 2
        total = world_size * 2
        model = torch.nn.Linear(4, tree.width)
        shape = list(model.weight.shape)
        twice = [d * 2 for d in shape]
        keys = sorted(model.state_dict())
        items = [1]
        popped = items.pop()
        ok = judge(keys)
        if tree.width > 3:
            raise RuntimeError(repr((order, lo, total, twice, keys, popped, ok)))
    except BaseException as e:
        found = str(e)
        if 'weight' in found:
            return 'REPRODUCED x: ' + found
        return 'FAIL'
    return 'PASS'


if __name__ == '__main__':
    print(attempt(0, 2))
    print(attempt(1, 2))
"""


def _folded(tmp_path: Path, code: str = SCRIPT, skip: frozenset[str] = frozenset()) -> str:
    script = tmp_path / "script.py"
    script.write_text(instrument(code, skip, str(tmp_path)))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("REPRODUCED x:") == 2  # the instrumented script does what it did
    out, count = fold(code, read_records(tmp_path), skip)
    assert count > 0
    return out


def _attempt(code: str) -> str:
    return code[code.index("def attempt") :]


@pytest.fixture(scope="module")
def folded(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _folded(tmp_path_factory.mktemp("values"))


def test_plain_values_become_literals(folded: str) -> None:
    out = _attempt(folded)
    assert "order = [('0', 'weight'), ('0', 'bias'), ('1', 'weight'), ('1', 'bias')]" in out
    assert "total = 4" in out
    assert "torch.nn.Linear(4, 4)" in out
    assert "if tree.width" not in out  # a test that became constant: its branch


def test_what_torch_computed_differs_by_rank_or_changed_state_is_left(folded: str) -> None:
    out = _attempt(folded)
    assert "lo = rank * 2" in out  # 0 on one rank, 2 on the other
    assert "shape = list(model.weight.shape)" in out
    assert "twice = [d * 2 for d in shape]" in out  # plain arithmetic on what torch returned
    assert "keys = sorted(model.state_dict())" in out
    assert "ok = judge(keys)" in out
    assert "popped = items.pop()" in out  # its value is plain, but computing it changed items
    assert "raise RuntimeError(repr((order, lo, total, twice, keys, popped, ok)))" in out


def test_the_harness_and_frozen_definitions_are_left(tmp_path: Path) -> None:
    out = _folded(tmp_path, skip=frozenset({"paths"}))
    assert "return [str(i) for i, _ in enumerate(tree.kids)]" in out
    assert "found = str(e)" in out and "if 'weight' in found:" in out
    assert "return 'REPRODUCED x: ' + found" in out


def test_the_folded_script_does_what_it_did(folded: str, tmp_path: Path) -> None:
    script = tmp_path / "folded.py"
    script.write_text(folded)
    before = tmp_path / "before.py"
    before.write_text(SCRIPT)
    runs = [
        subprocess.run([sys.executable, str(p)], capture_output=True, text=True, timeout=120) for p in (before, script)
    ]
    assert runs[0].stdout == runs[1].stdout and "REPRODUCED" in runs[1].stdout


def test_a_module_level_object_a_function_fills_from_torch_is_tainted() -> None:
    """TABLE['k'] = sorted(model.state_dict()) in one function taints TABLE where another reads
    it: a literal it holds came from torch."""
    import ast

    from fuzz.repro.values import _Taint

    code = """
import torch
TABLE = {}
NAMES = ['weight']
def record(m):
    TABLE['k'] = sorted(m.state_dict())
def attempt(rank, world_size):
    model = torch.nn.Linear(2, 2)
    record(model)
    keys = sorted(TABLE['k'])
    names = sorted(NAMES)
    return keys, names
"""
    taint = _Taint(ast.parse(code))
    attempt = next(fn for fn, _ in taint.functions if fn.name == "attempt")
    assert "TABLE" in taint.globals and "NAMES" not in taint.globals
    assert "keys" in taint.tainted[id(attempt)] and "names" not in taint.tainted[id(attempt)]
