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
    Composition,
    Container,
    Leaf,
    LeafKind,
    ModuleTree,
    Node,
    Output,
    has_params,
    scalar_problem,
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
    scalars: bool = False,
    held: bool = False,
    inner: bool = False,
) -> st.SearchStrategy[Block]:
    child: st.SearchStrategy[Node] = (
        leaf
        if depth <= 1
        else st.one_of(
            leaf, _blocks(depth - 1, max_children, leaf, buffers, extended, non_persistent, scalars, held, True)
        )
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
    rare = st.sampled_from((False, False, True))
    # bare parameters of rank 2 and 3 (a position embedding, a 3-D weight) and, with
    # ``scalars``, of rank 0 (a gain) on blocks that train without it: the case strategies take
    # the gain away where a fully_shard unit would manage it (fuzz.model.scalar_problem), which
    # then leaves the block's other parameters to the composition drawn for it
    # and blocks that return a tuple or a dict around their activation (their parent, and the
    # loss at the root, read its first element), or stash it for the loss (a loss over an
    # intermediate); all shrink to off
    outputs = st.sampled_from((Output.TENSOR, Output.TENSOR, Output.TENSOR, Output.TUPLE, Output.DICT))
    ranked = st.tuples(
        blocks, persistent, rare, st.tuples(rare, rare, rare if scalars else st.just(False)), st.tuples(outputs, rare)
    ).map(
        lambda b: replace(
            b[0],
            persistent=b[1] or not b[0].buffer,
            repeat=b[2],
            position=b[3][0],
            mix=b[3][1],
            gain=b[3][2] and _has_trainable_params(b[0]),
            output=b[4][0],
            stash=b[4][1],
        )
    )
    if not (held and inner):
        return ranked
    # with ``containers``, a block below the root is sometimes an nn.ModuleList / nn.ModuleDict
    # (its children only; shrinks to a plain block): the case strategies take the APIs off it
    # (without_container_units in the case strategies)
    kinds = st.sampled_from((Container.NONE, Container.NONE, Container.NONE, Container.LIST, Container.DICT))
    return st.tuples(ranked, kinds).map(lambda b: _as_container(b[0], b[1]))


def _as_container(block: Block, kind: Container) -> Block:
    if kind is Container.NONE:
        return block
    return Block(children=block.children, container=kind)


def _trainable(node: Node) -> bool:
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES and not node.frozen
    return node.own_params or any(_trainable(c) for c in node.children)


@functools.cache
def _roots(
    max_depth: int,
    max_children: int,
    dropout: bool,
    frozen: bool,
    buffers: bool,
    extended: bool = False,
    non_persistent: bool = True,
    scalars: bool = False,
    held: bool = False,
) -> st.SearchStrategy[Block]:
    leaf = leaves(dropout=dropout, frozen=frozen, extended=extended)
    blocks = _blocks(max_depth, max_children, leaf, buffers, extended, non_persistent, scalars, held)
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
    # A root with a residual, own parameters or buffer becomes one block between the two (the
    # model's root takes tokens and returns logits: none of those) where the depth allows, else
    # its children go there (and the embedding trains if nothing else is left to).
    inner = root.children
    if (root.residual or root.own_params or root.buffer) and tree_depth(root) < max_depth:
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
    scalars: bool = False,
    containers: bool = False,
) -> ModuleTree:
    """Module trees of at most ``max_depth`` levels of blocks with at least one trainable
    parameter: linear / layer_norm / conv1d leaves (with and without bias, some frozen),
    activations, dropout; blocks with residual connections, parameters of their own and buffers.

    ``extended``: the models people train too: a sequence dimension (activations (B, S, W)),
    RMSNorm / MLP / attention leaves and conv1d kernels over 1 (:func:`leaves`), and half the time
    two times in three a language model (:func:`language_models`: token inputs, an embedding, a vocabulary head,
    maybe tied, cross-entropy loss). Each shrinks away: to no sequence, no vocabulary, the
    first leaf kinds. ``tying`` / ``non_persistent`` False: no tied head, no non-persistent
    buffer (for oracles that do not model them yet). Blocks with ``extended`` hold bare
    parameters of rank 2 and 3 sometimes; with ``scalars`` of rank 0 too, which fully_shard
    and FSDP1 refuse: a composition drawn for such a tree must go through
    :func:`without_refused_scalars`. ``containers``: blocks below the root are sometimes
    nn.ModuleList / nn.ModuleDict containers, which no API may be applied to: a composition
    drawn for such a tree goes through the case strategies' ``without_container_units``."""
    check_bounds("max_depth", max_depth, "max_depth", max_depth, floor=1, ceiling=MAX_DEPTH)
    check_bounds("max_children", max_children, "max_children", max_children, floor=1, ceiling=8)
    root = draw(
        _roots(max_depth, max_children, dropout, frozen, buffers, extended, non_persistent, scalars, containers)
    )
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


def without_gains(tree: ModuleTree) -> ModuleTree:
    """``tree`` with no block's scalar parameter (``Block.gain``); paths and everything else as
    they were (a gain is drawn only on blocks that train without it)."""

    def strip(node: Node) -> Node:
        if isinstance(node, Leaf):
            return node
        return replace(node, gain=False, children=tuple(strip(c) for c in node.children))

    root = strip(tree.root)
    assert isinstance(root, Block)
    return replace(tree, root=root)


def without_refused_scalars(tree: ModuleTree, *comps: Composition) -> ModuleTree:
    """``tree`` without its scalar parameters where one of ``comps`` would manage one by an API
    that refuses it (:func:`fuzz.model.scalar_problem`), else ``tree``."""
    if any(scalar_problem(tree, c) is not None for c in comps):
        return without_gains(tree)
    return tree


def with_gain(tree: ModuleTree, path: str) -> ModuleTree:
    """``tree`` with a scalar parameter (``Block.gain``) on the block at ``path``."""

    def put(node: Node, at: list[str]) -> Node:
        assert isinstance(node, Block)
        if not at:
            return replace(node, gain=True)
        i = int(at[0])
        children = (*node.children[:i], put(node.children[i], at[1:]), *node.children[i + 1 :])
        return replace(node, children=children)

    root = put(tree.root, path.split(".") if path else [])
    assert isinstance(root, Block)
    return replace(tree, root=root)
