"""Module trees: what the model of a case is built from, and paths into it.

Every leaf maps width -> width, so any tree is a valid model and shrinking a tree never breaks
shapes. Imports only the standard library.
"""

from __future__ import annotations

import enum
import typing
from dataclasses import dataclass
from typing import Union

from fuzz.errors import CaseError

#: Bounds that keep every case small enough to run in well under a second on CPU.
MAX_WIDTH = 64
MAX_DEPTH = 6


class LeafKind(str, enum.Enum):
    """The kinds of leaf modules a tree is made of. Every leaf maps width -> width."""

    LINEAR = "linear"
    LAYER_NORM = "layer_norm"
    CONV1D = "conv1d"  # kernel 1 over a length-1 sequence: (B, W) -> (B, W, 1) -> (B, W)
    RELU = "relu"
    TANH = "tanh"
    GELU = "gelu"
    DROPOUT = "dropout"  # p = 0.5: makes activation checkpointing's RNG handling observable


class Dtype(str, enum.Enum):
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


PARAM_LEAVES = frozenset({LeafKind.LINEAR, LeafKind.LAYER_NORM, LeafKind.CONV1D})


@dataclass(frozen=True)
class Leaf:
    kind: LeafKind
    bias: bool = True
    #: requires_grad=False on the leaf's parameters (they still take part in forward).
    frozen: bool = False

    def __post_init__(self) -> None:
        if not self.bias and self.kind not in PARAM_LEAVES:
            raise CaseError("bias", f"bias=False only applies to parameter leaves, not {self.kind.value}")
        if self.frozen and self.kind not in PARAM_LEAVES:
            raise CaseError("frozen", f"frozen=True only applies to parameter leaves, not {self.kind.value}")


@dataclass(frozen=True)
class Block:
    """A container: runs its children in order, then multiplies by its own ``scale`` parameter
    (a parameter held by a non-leaf module), adds its ``shift`` buffer, and with ``residual``
    adds its input."""

    children: tuple[Node, ...]
    residual: bool = False
    scale: bool = False
    buffer: bool = False

    def __post_init__(self) -> None:
        if not self.children:
            raise CaseError("children", "a block needs at least one child")


Node = Union[Leaf, Block]


def iter_paths(block: Block, prefix: str = "") -> typing.Iterator[tuple[str, Node]]:
    """Yield ``(path, node)`` for every node, parents before children; the root's path is ``""``.

    Paths are the module names torch gives the submodules (``"1.0"``), so
    ``model.get_submodule(path)`` finds the built module.
    """
    yield prefix, block
    for i, child in enumerate(block.children):
        path = f"{prefix}.{i}" if prefix else str(i)
        if isinstance(child, Block):
            yield from iter_paths(child, path)
        else:
            yield path, child


def has_params(node: Node) -> bool:
    """True if the module built from ``node`` holds at least one parameter."""
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES
    return node.scale or any(has_params(c) for c in node.children)


def has_leaf(node: Node, kind: LeafKind) -> bool:
    """True if the module built from ``node`` is or holds a leaf of ``kind``."""
    if isinstance(node, Leaf):
        return node.kind is kind
    return any(has_leaf(c, kind) for c in node.children)


def has_dropout(node: Node) -> bool:
    """True if the module built from ``node`` is or holds a dropout leaf."""
    return has_leaf(node, LeafKind.DROPOUT)


def owns_params(node: Node) -> bool:
    """True if ``node``'s module has parameters of its own (not only in submodules)."""
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES
    return node.scale


def forward_order(block: Block, prefix: str = "") -> list[str]:
    """Paths of the modules that hold parameters of their own, in the order forward first uses
    them (a block's children in order, then its own ``scale``), nothing left out."""
    out: list[str] = []
    for i, child in enumerate(block.children):
        path = f"{prefix}.{i}" if prefix else str(i)
        if isinstance(child, Block):
            out += forward_order(child, path)
        elif owns_params(child):
            out.append(path)
    if block.scale:
        out.append(prefix)
    return out


def param_names(node: Node) -> list[str]:
    """Names of the parameters the module built from ``node`` registers itself, in order."""
    if isinstance(node, Leaf):
        if node.kind not in PARAM_LEAVES:
            return []
        return ["weight", "bias"] if node.bias else ["weight"]
    return ["scale"] if node.scale else []


def tree_depth(node: Node) -> int:
    if isinstance(node, Leaf):
        return 0
    return 1 + max(tree_depth(c) for c in node.children)


@dataclass(frozen=True)
class ModuleTree:
    width: int
    root: Block

    def __post_init__(self) -> None:
        if not 1 <= self.width <= MAX_WIDTH:
            raise CaseError("width", f"width={self.width} is outside 1..{MAX_WIDTH}")
        if tree_depth(self.root) > MAX_DEPTH:
            raise CaseError("root", f"tree depth {tree_depth(self.root)} exceeds {MAX_DEPTH}")

    def paths(self) -> dict[str, Node]:
        return dict(iter_paths(self.root))

    @property
    def size(self) -> int:
        """Number of nodes: the size measure reported for shrunk cases."""
        return len(self.paths())


def contains(outer: str, path: str) -> bool:
    """True if the module at ``outer`` is the one at ``path`` or one of its ancestors."""
    return outer == path or outer == "" or path.startswith(outer + ".")


def is_ancestor(ancestor: str, path: str) -> bool:
    """True if the module at ``ancestor`` contains the one at ``path`` (and is not it)."""
    return ancestor != path and contains(ancestor, path)
