"""Strategies for module trees: random depth and branching over width-preserving leaves and,
with ``extended``, the models people train: sequences, token inputs through an embedding, a
vocabulary head (tied to the embedding or not, cross-entropy loss), RMSNorm, MLPs that change the
width inside them, attention, convolutions over the sequence."""

from __future__ import annotations

import functools
from dataclasses import replace

from hypothesis import strategies as st

from fuzz.model import (
    CLASSIC_PARAM_LEAVES,
    MAX_DEPTH,
    PARAM_LEAVES,
    UNBIASED_LEAVES,
    Block,
    Leaf,
    LeafKind,
    ModuleTree,
    Node,
    has_params,
    tree_depth,
)
from strategies._validation import check_bounds

#: Widths small enough to be fast, chosen so that most do not divide 2 or 4 ranks: uneven
#: shards, and (width 1 on 2+ ranks) empty ones.
WIDTHS = (1, 2, 3, 4, 5, 7, 8, 12)
ACTIVATIONS = (LeafKind.RELU, LeafKind.TANH, LeafKind.GELU)
#: The parameter leaves drawn inside blocks with ``extended``: all but the embedding and the
#: head, which have fixed places (the root's first and last child, :func:`language_models`).
EXTENDED_LEAVES = sorted(PARAM_LEAVES - {LeafKind.EMBEDDING, LeafKind.HEAD}, key=lambda k: k.value)
#: Sequence lengths and vocabulary sizes, shrinking towards none.
MAX_DRAWN_SEQ = 4
VOCABS = (5, 2, 3, 8, 11)


@st.composite
def _extended_leaf(draw: st.DrawFn, kind: LeafKind, frozen: bool) -> Leaf:
    return Leaf(
        kind=kind,
        bias=True if kind in UNBIASED_LEAVES else draw(st.booleans()),
        frozen=draw(st.booleans()) if frozen else False,
        kernel=draw(st.sampled_from((1, 3, 5))) if kind is LeafKind.CONV1D else 1,
        causal=draw(st.booleans()) if kind is LeafKind.ATTENTION else False,
    )


@functools.cache  # built once per set of arguments: Hypothesis validates each new strategy
def leaves(*, dropout: bool = True, frozen: bool = True, extended: bool = False) -> st.SearchStrategy[Leaf]:
    """Any leaf; parameter-holding ones with and without bias, some frozen. ``extended``: also
    RMSNorm, MLP and attention leaves (causal or not) and conv1d kernels over 1."""
    if extended:
        param = st.sampled_from(EXTENDED_LEAVES).flatmap(lambda k: _extended_leaf(k, frozen))
    else:
        param = st.builds(
            Leaf,
            kind=st.sampled_from(sorted(CLASSIC_PARAM_LEAVES, key=lambda k: k.value)),
            bias=st.booleans(),
            frozen=st.booleans() if frozen else st.just(False),
        )
    kinds = [*ACTIVATIONS, LeafKind.DROPOUT] if dropout else list(ACTIVATIONS)
    return st.one_of(param, st.builds(Leaf, kind=st.sampled_from(kinds)))


@functools.cache
def _blocks(
    depth: int,
    max_children: int,
    leaf: st.SearchStrategy[Leaf],
    buffers: bool,
    extended: bool = False,
    non_persistent: bool = True,
) -> st.SearchStrategy[Block]:
    child: st.SearchStrategy[Node] = (
        leaf
        if depth <= 1
        else st.one_of(leaf, _blocks(depth - 1, max_children, leaf, buffers, extended, non_persistent))
    )
    blocks = st.builds(
        Block,
        children=st.lists(child, min_size=1, max_size=max_children).map(tuple),
        residual=st.booleans(),
        scale=st.booleans(),
        buffer=st.booleans() if buffers else st.just(False),
    )
    if not extended:
        return blocks
    # non-persistent buffers (out of the state dict), and blocks that run their children twice
    # over (each child module called twice in one forward); both shrink to off
    persistent = st.booleans() if non_persistent else st.just(True)
    return st.tuples(blocks, persistent, st.sampled_from((False, False, True))).map(
        lambda b: replace(b[0], persistent=b[1] or not b[0].buffer, repeat=b[2])
    )


def _trainable(node: Node) -> bool:
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES and not node.frozen
    return node.scale or any(_trainable(c) for c in node.children)


@functools.cache
def _roots(
    max_depth: int,
    max_children: int,
    dropout: bool,
    frozen: bool,
    buffers: bool,
    extended: bool = False,
    non_persistent: bool = True,
) -> st.SearchStrategy[Block]:
    leaf = leaves(dropout=dropout, frozen=frozen, extended=extended)
    blocks = _blocks(max_depth, max_children, leaf, buffers, extended, non_persistent)
    return blocks.filter(_has_trainable_params)


def _has_trainable_params(block: Block) -> bool:
    return has_params(block) and _trainable(block)


@st.composite
def language_models(
    draw: st.DrawFn,
    root: Block,
    *,
    frozen: bool = True,
    tied: bool | None = None,
    max_depth: int = MAX_DEPTH,
    tying: bool = True,
) -> tuple[Block, int]:
    """``root`` as the body of a language model: an embedding (padding_idx or not) before its
    children, a head after them two times in three (with ``tied``: always, tied or not as
    asked), its weight tied to the embedding's two times in three; and the vocabulary. The embedding
    and the head are added around the drawn blocks, so shrinking the blocks keeps them."""
    head = True if tied is not None else draw(st.sampled_from((False, True, True)))
    tie = (draw(st.sampled_from((False, True, True))) if tied is None else tied) if head and tying else False
    embedding = Leaf(
        LeafKind.EMBEDDING,
        # a tied pair's weight is frozen or not through one flag: the embedding's (ModuleTree)
        frozen=draw(st.booleans()) if frozen and not tie else False,
        padding=draw(st.booleans()),
    )
    tail: tuple[Leaf, ...] = ()
    if head:
        tail = (
            Leaf(
                LeafKind.HEAD,
                bias=draw(st.booleans()),
                tied=tie,
                frozen=draw(st.booleans()) if frozen and not tie else False,
            ),
        )
    # A root with a residual, scale or buffer becomes one block between the two (the model's
    # root takes tokens and returns logits: none of those) where the depth allows, else its
    # children go there (and the embedding trains if nothing else is left to).
    inner = root.children
    if (root.residual or root.scale or root.buffer) and tree_depth(root) < max_depth:
        inner = (root,)
    elif not any(_trainable(c) for c in inner) and embedding.frozen:
        embedding = replace(embedding, frozen=False)
    return Block(children=(embedding, *inner, *tail)), draw(st.sampled_from(VOCABS))


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
    extended: bool = False,
    tying: bool = True,
    non_persistent: bool = True,
) -> ModuleTree:
    """Module trees of at most ``max_depth`` levels of blocks with at least one trainable
    parameter: linear / layer_norm / conv1d leaves (with and without bias, some frozen),
    activations, dropout; blocks with residual connections, parameters of their own and buffers.

    ``extended``: the models people train too: a sequence dimension (activations (B, S, W)),
    RMSNorm / MLP / attention leaves and conv1d kernels over 1 (:func:`leaves`), and half the time
    two times in three a language model (:func:`language_models`: token inputs, an embedding, a vocabulary head,
    maybe tied, cross-entropy loss). Each shrinks away: to no sequence, no vocabulary, the
    first leaf kinds. ``tying`` / ``non_persistent`` False: no tied head, no non-persistent
    buffer (for oracles that do not model them yet)."""
    check_bounds("max_depth", max_depth, "max_depth", max_depth, floor=1, ceiling=MAX_DEPTH)
    check_bounds("max_children", max_children, "max_children", max_children, floor=1, ceiling=8)
    root = draw(_roots(max_depth, max_children, dropout, frozen, buffers, extended, non_persistent))
    width = draw(widths if widths is not None else st.sampled_from(WIDTHS))
    if not extended:
        return ModuleTree(width=width, root=root)
    seq = draw(st.integers(0, MAX_DRAWN_SEQ))
    vocab = 0
    if draw(st.sampled_from((False, True, True))):
        root, vocab = draw(language_models(root, frozen=frozen, max_depth=max_depth, tying=tying))
    return ModuleTree(width=width, root=root, seq=seq, vocab=vocab)


@st.composite
def tied_trees(draw: st.DrawFn, *, max_depth: int = 2, widths: st.SearchStrategy[int] | None = None) -> ModuleTree:
    """Language models whose head is tied to their embedding (:func:`language_models`) around
    blocks of :func:`module_trees` with ``extended``."""
    check_bounds("max_depth", max_depth, "max_depth", max_depth, floor=1, ceiling=MAX_DEPTH)
    root = draw(_roots(max_depth, 3, True, True, True, True))
    width = draw(widths if widths is not None else st.sampled_from(WIDTHS))
    seq = draw(st.integers(0, MAX_DRAWN_SEQ))
    body, vocab = draw(language_models(root, tied=True, max_depth=max_depth))
    return ModuleTree(width=width, root=body, seq=seq, vocab=vocab)
