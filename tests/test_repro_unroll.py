"""Partial evaluation of a builder called on a literal (fuzz/repro/unroll.py): the model is
written out as what the tree builds, and the script does what it did."""

from __future__ import annotations

import sys
import types

from fuzz.repro import unroll

SCRIPT = """
import enum
from dataclasses import dataclass


class Kind(str, enum.Enum):
    A = 'a'
    B = 'b'


@dataclass(frozen=True)
class Leaf:
    kind: object
    frozen: object = False


@dataclass(frozen=True)
class Block:
    children: object
    scale: object = False


class Node:
    def __init__(self, children, scale):
        self.children, self.scale = list(children), scale

    def __repr__(self):
        return f"Node({self.children!r}, {self.scale!r})"


class Thing:
    def __init__(self, kind, width):
        self.kind, self.width, self.frozen = kind, width, False

    def __repr__(self):
        return f"Thing({self.kind!r}, {self.width}, {self.frozen})"


def build(node, width):
    if isinstance(node, Leaf):
        thing = Thing(node.kind.value, width)
        if node.frozen:
            thing.frozen = True
        return thing
    return Node([build(c, width) for c in node.children], node.scale)


def attempt(rank, world_size):
    model = build(Block(children=(Leaf(kind=Kind.A), Block(children=(Leaf(kind=Kind.B, frozen=True),), scale=True))), 4)
    return repr(model)
"""


def run(code: str) -> str:
    module = types.ModuleType("_candidate")
    sys.modules[module.__name__] = module
    try:
        exec(compile(code, "candidate", "exec"), module.__dict__)
        return str(module.attempt(0, 1))
    finally:
        del sys.modules[module.__name__]


def test_a_builder_on_a_literal_is_written_out() -> None:
    assert unroll.unrollable(SCRIPT) == ["build"]
    out = unroll.unroll(SCRIPT, "build")
    assert out is not None
    body = out[out.index("def attempt") :]
    assert "build(" not in body and "isinstance" not in body, body
    assert "Thing(Kind.A.value, 4)" in body and "Node([" in body, body
    assert run(out) == run(SCRIPT) == "Node([Thing('a', 4, False), Node([Thing('b', 4, True)], True)], False)"


def test_a_local_bound_once_to_a_literal_and_passed_once_is_the_literal() -> None:
    code = SCRIPT.replace("model = build(Block(", "tree = Block(").replace(
        ", 4)\n    return", "\n    model = build(tree, 4)\n    return"
    )
    assert "build(tree, 4)" in code
    assert unroll.unrollable(code) == ["build"]
    out = unroll.unroll(code, "build")
    assert out is not None
    body = out[out.index("def attempt") :]
    assert "build(" not in body and "tree" not in body, body
    assert run(out) == run(code)


def test_a_call_on_what_is_not_a_literal_is_left() -> None:
    # ``tree`` is read twice: writing the literal in its place would build two trees.
    code = SCRIPT.replace("model = build(Block(", "tree = Block(").replace(
        ", 4)\n    return", "\n    model = build(tree, 4)\n    model.tree = tree\n    return"
    )
    assert "build(tree, 4)" in code
    assert unroll.unrollable(code) == [] and unroll.unroll(code, "build") is None


def test_a_module_class_that_runs_its_children_in_order_may_become_sequential() -> None:
    code = (
        "import torch\n"
        "from torch import nn\n"
        "class Tree(nn.Module):\n"
        "    def __init__(self, children, width):\n"
        "        super().__init__()\n"
        "        for i, child in enumerate(children):\n"
        "            self.add_module(str(i), child)\n"
        "    def forward(self, x):\n"
        "        for child in self.children():\n"
        "            x = child(x)\n"
        "        return x\n"
        "def attempt(rank, world_size):\n"
        "    torch.manual_seed(0)\n"
        "    kids = [nn.Linear(2, 2)]\n"
        "    model = Tree([nn.Linear(2, 2), Tree(kids, 2)], 2)\n"
        "    names = [n for n, _ in model.named_parameters()]\n"
        "    return repr((names, isinstance(model, Tree), model(torch.ones(1, 2)).tolist()))\n"
    )
    assert unroll.containers(code) == ["Tree"]
    out = unroll.as_sequential(code, "Tree")
    assert out is not None and "class Tree" not in out
    assert "nn.Sequential(nn.Linear(2, 2), nn.Sequential(*kids))" in out and "isinstance(model, nn.Sequential)" in out
    assert run(out) == run(code)
