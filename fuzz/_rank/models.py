"""Build a plain ``nn.Module`` from a :class:`fuzz.case.ModuleTree`.

Submodules get the names of their tree paths (``model.get_submodule("1.0")``), so compositions
address modules the way the case does. Construction draws from torch's global RNG, which the
caller seeds from the case: every rank builds identical weights.
"""

from __future__ import annotations

import torch
from torch import nn

from fuzz.case import Leaf, LeafKind, ModuleTree, Node


class TreeBlock(nn.Module):
    """Runs its children in order; with ``residual`` adds the block's input to the result."""

    def __init__(self, children: list[nn.Module], residual: bool) -> None:
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for child in self.children():
            y = child(y)
        return x + y if self.residual else y


def build_leaf(leaf: Leaf, width: int) -> nn.Module:
    if leaf.kind is LeafKind.LINEAR:
        return nn.Linear(width, width, bias=leaf.bias)
    if leaf.kind is LeafKind.LAYER_NORM:
        return nn.LayerNorm(width, bias=leaf.bias)
    if leaf.kind is LeafKind.RELU:
        return nn.ReLU()
    if leaf.kind is LeafKind.TANH:
        return nn.Tanh()
    if leaf.kind is LeafKind.GELU:
        return nn.GELU()
    raise AssertionError(f"unhandled leaf kind {leaf.kind}")


def build_node(node: Node, width: int) -> nn.Module:
    if isinstance(node, Leaf):
        return build_leaf(node, width)
    return TreeBlock([build_node(c, width) for c in node.children], node.residual)


def build_model(tree: ModuleTree, device: torch.device) -> nn.Module:
    with torch.device(device):
        return build_node(tree.root, tree.width)
