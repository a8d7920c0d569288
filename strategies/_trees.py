"""Strategies for module trees: random depth and branching over width-preserving leaves."""

from __future__ import annotations

from hypothesis import strategies as st

from fuzz.case import MAX_DEPTH, PARAM_LEAVES, Block, Leaf, LeafKind, ModuleTree, Node, has_params
from strategies._validation import check_bounds

#: Widths small enough to be fast, chosen so that most do not divide 2 or 4 ranks: uneven
#: shards, and (width 1 on 2+ ranks) empty ones.
WIDTHS = (1, 2, 3, 4, 5, 7, 8, 12)


def leaves() -> st.SearchStrategy[Leaf]:
    """Any leaf; parameter-holding ones (linear, layer_norm) with and without bias."""
    param = st.builds(Leaf, kind=st.sampled_from(sorted(PARAM_LEAVES, key=lambda k: k.value)), bias=st.booleans())
    act = st.builds(Leaf, kind=st.sampled_from([LeafKind.RELU, LeafKind.TANH, LeafKind.GELU]))
    return st.one_of(param, act)


def _blocks(depth: int, max_children: int) -> st.SearchStrategy[Block]:
    child: st.SearchStrategy[Node] = leaves() if depth <= 1 else st.one_of(leaves(), _blocks(depth - 1, max_children))
    return st.builds(
        Block,
        children=st.lists(child, min_size=1, max_size=max_children).map(tuple),
        residual=st.booleans(),
    )


@st.composite
def module_trees(
    draw: st.DrawFn,
    *,
    max_depth: int = 3,
    max_children: int = 3,
    widths: st.SearchStrategy[int] | None = None,
) -> ModuleTree:
    """Module trees of at most ``max_depth`` levels of blocks, each with at least one parameter."""
    check_bounds("max_depth", max_depth, "max_depth", max_depth, floor=1, ceiling=MAX_DEPTH)
    check_bounds("max_children", max_children, "max_children", max_children, floor=1, ceiling=8)
    root = draw(_blocks(max_depth, max_children).filter(has_params))
    width = draw(widths if widths is not None else st.sampled_from(WIDTHS))
    return ModuleTree(width=width, root=root)
