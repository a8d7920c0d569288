"""Strategies for module trees: random depth and branching over width-preserving leaves."""

from __future__ import annotations

import functools

from hypothesis import strategies as st

from fuzz.model import MAX_DEPTH, PARAM_LEAVES, Block, Leaf, LeafKind, ModuleTree, Node, has_params
from strategies._validation import check_bounds

#: Widths small enough to be fast, chosen so that most do not divide 2 or 4 ranks: uneven
#: shards, and (width 1 on 2+ ranks) empty ones.
WIDTHS = (1, 2, 3, 4, 5, 7, 8, 12)
ACTIVATIONS = (LeafKind.RELU, LeafKind.TANH, LeafKind.GELU)


@functools.cache  # built once per set of arguments: Hypothesis validates each new strategy
def leaves(*, dropout: bool = True, frozen: bool = True) -> st.SearchStrategy[Leaf]:
    """Any leaf; parameter-holding ones with and without bias, some frozen."""
    param = st.builds(
        Leaf,
        kind=st.sampled_from(sorted(PARAM_LEAVES, key=lambda k: k.value)),
        bias=st.booleans(),
        frozen=st.booleans() if frozen else st.just(False),
    )
    kinds = [*ACTIVATIONS, LeafKind.DROPOUT] if dropout else list(ACTIVATIONS)
    return st.one_of(param, st.builds(Leaf, kind=st.sampled_from(kinds)))


@functools.cache
def _blocks(depth: int, max_children: int, leaf: st.SearchStrategy[Leaf], buffers: bool) -> st.SearchStrategy[Block]:
    child: st.SearchStrategy[Node] = (
        leaf if depth <= 1 else st.one_of(leaf, _blocks(depth - 1, max_children, leaf, buffers))
    )
    return st.builds(
        Block,
        children=st.lists(child, min_size=1, max_size=max_children).map(tuple),
        residual=st.booleans(),
        scale=st.booleans(),
        buffer=st.booleans() if buffers else st.just(False),
    )


def _trainable(node: Node) -> bool:
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES and not node.frozen
    return node.scale or any(_trainable(c) for c in node.children)


@functools.cache
def _roots(max_depth: int, max_children: int, dropout: bool, frozen: bool, buffers: bool) -> st.SearchStrategy[Block]:
    leaf = leaves(dropout=dropout, frozen=frozen)
    return _blocks(max_depth, max_children, leaf, buffers).filter(_has_trainable_params)


def _has_trainable_params(block: Block) -> bool:
    return has_params(block) and _trainable(block)


@st.composite
def module_trees(
    draw: st.DrawFn,
    *,
    max_depth: int = 3,
    max_children: int = 3,
    widths: st.SearchStrategy[int] | None = None,
    dropout: bool = True,
    frozen: bool = True,
    buffers: bool = True,
) -> ModuleTree:
    """Module trees of at most ``max_depth`` levels of blocks with at least one trainable
    parameter: linear / layer_norm / conv1d leaves (with and without bias, some frozen),
    activations, dropout; blocks with residual connections, parameters of their own and buffers."""
    check_bounds("max_depth", max_depth, "max_depth", max_depth, floor=1, ceiling=MAX_DEPTH)
    check_bounds("max_children", max_children, "max_children", max_children, floor=1, ceiling=8)
    root = draw(_roots(max_depth, max_children, dropout, frozen, buffers))
    width = draw(widths if widths is not None else st.sampled_from(WIDTHS))
    return ModuleTree(width=width, root=root)
