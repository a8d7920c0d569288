"""Module trees: what the model of a case is built from, and paths into it.

Every leaf but two maps width -> width (an MLP widens and narrows inside itself), so shrinking
a tree's blocks never breaks shapes. Activations are ``(B, W)``, or ``(B, S, W)`` where the
tree has a sequence (``ModuleTree.seq``). A tree with a vocabulary (``ModuleTree.vocab``)
begins with an embedding (integer token inputs) as its root's first child and may end with a
vocabulary projection as its root's last child (then the loss is cross-entropy over the
vocabulary, else MSE), optionally tied to the embedding: one Parameter in two modules. Those two
sit at fixed places, which the strategies build around the drawn blocks, so shrinking keeps
them. Imports only the standard library.
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
#: Longest sequence (``ModuleTree.seq``), largest vocabulary (``ModuleTree.vocab``), widest
#: convolution kernel (``Leaf.kernel``).
MAX_SEQ = 8
MAX_VOCAB = 32
MAX_KERNEL = 5
#: An MLP leaf maps W -> MLP_EXPAND * W -> W (3: an odd width stays odd, so its shards stay uneven).
MLP_EXPAND = 3
#: The weight of a stashed activation's mean square in the loss (``Block.stash``).
STASH_WEIGHT = 0.1


class LeafKind(str, enum.Enum):
    """The kinds of leaf modules a tree is made of. Every leaf maps width -> width, but the
    embedding (tokens -> width) and the head (width -> vocabulary)."""

    LINEAR = "linear"
    LAYER_NORM = "layer_norm"
    #: Conv1d over the sequence, ``kernel`` taps with padding 'same' (a (B, W) activation is a
    #: length-1 sequence: (B, W) -> (B, W, 1) -> (B, W)).
    CONV1D = "conv1d"
    RELU = "relu"
    TANH = "tanh"
    GELU = "gelu"
    DROPOUT = "dropout"  # p = 0.5: makes activation checkpointing's RNG handling observable
    RMS_NORM = "rms_norm"  # nn.RMSNorm(W): a weight, no bias
    MLP = "mlp"  # up: Linear(W, MLP_EXPAND * W), GELU, down: Linear(MLP_EXPAND * W, W)
    #: q, k, v, o: Linear(W, W); F.scaled_dot_product_attention over the sequence with
    #: attention_heads(W) heads, ``causal`` or not
    ATTENTION = "attention"
    #: nn.Embedding(vocab, W), padding_idx 0 with ``padding``: the root's first child only
    EMBEDDING = "embedding"
    #: Linear(W, vocab), its weight the embedding's with ``tied``: the root's last child only
    HEAD = "head"


class Container(str, enum.Enum):
    """What a block is built as: a module that runs its children (``none``), or an
    ``nn.ModuleList`` / ``nn.ModuleDict`` holding them (no forward of its own: its parent
    iterates over it and calls each item, as models do with ``for layer in self.layers``)."""

    NONE = "none"
    LIST = "list"
    DICT = "dict"


class Output(str, enum.Enum):
    """What a block returns: its activation (``tensor``), or that and its input as a tuple
    ``(y, x)`` or a dict ``{"out": y, "input": x}``; its parent, and the loss for the root,
    read the first element (the rest is returned unused, as models return auxiliary outputs)."""

    TENSOR = "tensor"
    TUPLE = "tuple"
    DICT = "dict"


class Dtype(str, enum.Enum):
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


#: The leaves the first trees were made of (``strategies.leaves(extended=False)`` draws these).
CLASSIC_PARAM_LEAVES = frozenset({LeafKind.LINEAR, LeafKind.LAYER_NORM, LeafKind.CONV1D})
#: Leaves that hold parameters (a tied head: the embedding's weight, and its bias).
PARAM_LEAVES = CLASSIC_PARAM_LEAVES | frozenset(
    {LeafKind.RMS_NORM, LeafKind.MLP, LeafKind.ATTENTION, LeafKind.EMBEDDING, LeafKind.HEAD}
)
#: Leaves without a bias to leave out.
UNBIASED_LEAVES = frozenset({LeafKind.RMS_NORM, LeafKind.EMBEDDING})
#: Leaves that hold a weight matrix (something to shard on dim 1).
MATRIX_LEAVES = frozenset(
    {LeafKind.LINEAR, LeafKind.CONV1D, LeafKind.MLP, LeafKind.ATTENTION, LeafKind.EMBEDDING, LeafKind.HEAD}
)
#: A block's own parameters, in registration order, and their ranks.
BLOCK_PARAMS = ("scale", "gain", "position", "mix")
BLOCK_PARAM_RANKS = {"scale": 1, "gain": 0, "position": 2, "mix": 3}
#: The submodules an attention leaf and an MLP leaf are made of, in forward order.
ATTENTION_PARTS = ("q", "k", "v", "o")
MLP_PARTS = ("up", "down")


@dataclass(frozen=True)
class Leaf:
    kind: LeafKind
    bias: bool = True
    #: requires_grad=False on the leaf's parameters (they still take part in forward).
    frozen: bool = False
    #: conv1d: kernel size, odd (padding 'same').
    kernel: int = 1
    #: attention: a causal mask (``is_causal=True``).
    causal: bool = False
    #: embedding: padding_idx=0 (that row is zero and gets no gradient).
    padding: bool = False
    #: head: its weight is the embedding's (one Parameter in two modules).
    tied: bool = False

    def __post_init__(self) -> None:
        if not self.bias and (self.kind not in PARAM_LEAVES or self.kind in UNBIASED_LEAVES):
            raise CaseError("bias", f"bias=False only applies to leaves with a bias, not {self.kind.value}")
        if self.frozen and self.kind not in PARAM_LEAVES:
            raise CaseError("frozen", f"frozen=True only applies to parameter leaves, not {self.kind.value}")
        if self.kernel != 1 and (
            self.kind is not LeafKind.CONV1D or not 1 <= self.kernel <= MAX_KERNEL or self.kernel % 2 == 0
        ):
            # padding 'same' with an even kernel pads unevenly, through a copy torch warns about
            raise CaseError("kernel", f"kernel={self.kernel}: conv1d leaves take odd kernels 1..{MAX_KERNEL}")
        if self.causal and self.kind is not LeafKind.ATTENTION:
            raise CaseError("causal", f"causal=True only applies to attention, not {self.kind.value}")
        if self.padding and self.kind is not LeafKind.EMBEDDING:
            raise CaseError("padding", f"padding=True only applies to an embedding, not {self.kind.value}")
        if self.tied and self.kind is not LeafKind.HEAD:
            raise CaseError("tied", f"tied=True only applies to a head, not {self.kind.value}")
        if self.tied and self.frozen:
            raise CaseError("frozen", "a tied head's weight is the embedding's: freeze the embedding instead")


@dataclass(frozen=True)
class Block:
    """A container: runs its children in order (twice over with ``repeat``: each child module
    called twice in one forward, its parameters used twice), then multiplies by its own
    ``scale`` parameter (a parameter held by a non-leaf module, shape (W,)) and its ``gain``
    (rank 0), adds its ``position`` parameter (rank 2, (max(seq, 1), W): a position embedding
    held as a bare parameter) and ``y @ mix`` summed over its first dimension (rank 3, (2, W,
    W)), adds its ``shift`` buffer (registered non-persistent, out of the state dict, without
    ``persistent``), and with ``residual`` adds its input."""

    children: tuple[Node, ...]
    residual: bool = False
    scale: bool = False
    buffer: bool = False
    persistent: bool = True
    repeat: bool = False
    #: A scalar parameter (rank 0). fully_shard refuses it ("fully_shard doesn't support scalar
    #: parameters", torch 2.13): only replicate, DDP or FSDP1 manage it (fuzz.model.rules).
    gain: bool = False
    #: A (max(seq, 1), W) parameter added to the activation (rank 2).
    position: bool = False
    #: A (2, W, W) parameter (rank 3): ``y + einsum("...i,kij->...j", y, mix)``.
    mix: bool = False
    #: Built as an nn.ModuleList / nn.ModuleDict its parent iterates over (never the root):
    #: nothing of its own, and fully_shard and replicate refuse it ("does not support containers
    #: that do not implement forward", torch 2.13; the ``invalid`` property's container_unit).
    container: Container = Container.NONE
    #: Returns a tuple or a dict around its activation (:class:`Output`).
    output: Output = Output.TENSOR
    #: Keeps its activation (the first element of what it returns) for the loss, which adds
    #: ``STASH_WEIGHT`` times its mean square: a loss over an intermediate, as auxiliary losses
    #: read stashed activations.
    stash: bool = False

    def __post_init__(self) -> None:
        if not self.children:
            raise CaseError("children", "a block needs at least one child")
        if not self.persistent and not self.buffer:
            raise CaseError("persistent", "persistent=False applies to a block's buffer: it has none")
        forward_only = self.residual or self.own_params or self.buffer or self.repeat or self.stash
        if self.container is not Container.NONE and (forward_only or self.output is not Output.TENSOR):
            raise CaseError(
                "container",
                f"a {self.container.value} container has no forward: no residual, parameters, buffer, repeat,"
                " output or stash",
            )

    @property
    def own_params(self) -> bool:
        """True if the block registers parameters of its own (not only its children's)."""
        return self.scale or self.gain or self.position or self.mix


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
    """True if the module built from ``node`` holds at least one parameter (a tied head holds
    the embedding's weight)."""
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES
    return node.own_params or any(has_params(c) for c in node.children)


def has_leaf(node: Node, kind: LeafKind) -> bool:
    """True if the module built from ``node`` is or holds a leaf of ``kind``."""
    if isinstance(node, Leaf):
        return node.kind is kind
    return any(has_leaf(c, kind) for c in node.children)


def has_dropout(node: Node) -> bool:
    """True if the module built from ``node`` is or holds a dropout leaf."""
    return has_leaf(node, LeafKind.DROPOUT)


def owns_params(node: Node) -> bool:
    """True if ``node``'s module has parameters of its own (not only in submodules; a leaf's
    parts, an attention's ``q`` or an MLP's ``up``, count as the leaf's own)."""
    if isinstance(node, Leaf):
        return node.kind in PARAM_LEAVES
    return node.own_params


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
    if block.own_params:
        out.append(prefix)
    return out


def param_names(node: Node) -> list[str]:
    """Names of the parameters the module built from ``node`` registers itself (a leaf: with
    its parts, ``q.weight``), in registration order. A tied head registers the embedding's
    weight as its own ``weight`` too: ``named_parameters()`` lists that Parameter once (under the
    embedding, the root's first child), ``named_parameters(remove_duplicate=False)`` and
    replicate's collection of parameters under both names."""
    if isinstance(node, Leaf):
        if node.kind not in PARAM_LEAVES:
            return []
        if node.kind in UNBIASED_LEAVES:
            return ["weight"]
        own = ["weight", "bias"] if node.bias else ["weight"]
        if node.kind is LeafKind.ATTENTION:
            return [f"{part}.{name}" for part in ATTENTION_PARTS for name in own]
        if node.kind is LeafKind.MLP:
            return [f"{part}.{name}" for part in MLP_PARTS for name in own]
        return own
    flags = (node.scale, node.gain, node.position, node.mix)
    return [name for name, on in zip(BLOCK_PARAMS, flags) if on]


def attention_heads(width: int) -> int:
    """Heads of an attention leaf over ``width``: 2 where the width splits in two halves of 2 or
    more, else 1 (a function of the width, so shrinking the width keeps every tree valid)."""
    return 2 if width % 2 == 0 and width >= 4 else 1


def is_classic(tree: ModuleTree) -> bool:
    """True for a tree of the first kind: (B, W) activations, float inputs, the first leaf kinds
    (linear, layer_norm, conv1d of kernel 1, activations, dropout), blocks that run once and
    hold persistent buffers."""
    if tree.seq or tree.vocab:
        return False
    return all(
        (
            n.persistent
            and not (n.repeat or n.gain or n.position or n.mix or n.stash)
            and n.container is Container.NONE
            and n.output is Output.TENSOR
        )
        if isinstance(n, Block)
        else (n.kind not in PARAM_LEAVES or n.kind in CLASSIC_PARAM_LEAVES) and n.kernel == 1
        for _, n in iter_paths(tree.root)
    )


def containers(tree: ModuleTree) -> list[str]:
    """Paths of the blocks built as nn.ModuleList / nn.ModuleDict (never called themselves)."""
    return [p for p, n in iter_paths(tree.root) if isinstance(n, Block) and n.container is not Container.NONE]


def stashes(tree: ModuleTree) -> list[str]:
    """Paths of the blocks whose activation the loss reads too (``Block.stash``)."""
    return [p for p, n in iter_paths(tree.root) if isinstance(n, Block) and n.stash]


def has_repeat(tree: ModuleTree) -> bool:
    """True if a block of ``tree`` runs its children twice (modules called twice in a forward)."""
    return any(isinstance(n, Block) and n.repeat for _, n in iter_paths(tree.root))


def tree_depth(node: Node) -> int:
    if isinstance(node, Leaf):
        return 0
    return 1 + max(tree_depth(c) for c in node.children)


@dataclass(frozen=True)
class ModuleTree:
    width: int
    root: Block
    #: 0: activations (B, W); 1..MAX_SEQ: (B, seq, W).
    seq: int = 0
    #: 0: float inputs; 2..MAX_VOCAB: integer tokens in [0, vocab) into the embedding that is
    #: the root's first child; a head (the root's last child, optional) projects onto it.
    vocab: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.width <= MAX_WIDTH:
            raise CaseError("width", f"width={self.width} is outside 1..{MAX_WIDTH}")
        if tree_depth(self.root) > MAX_DEPTH:
            raise CaseError("root", f"tree depth {tree_depth(self.root)} exceeds {MAX_DEPTH}")
        if not 0 <= self.seq <= MAX_SEQ:
            raise CaseError("seq", f"seq={self.seq} is outside 0..{MAX_SEQ}")
        if self.root.container is not Container.NONE:
            raise CaseError("root.container", "the root is called: it is no container")
        if self.vocab and not 2 <= self.vocab <= MAX_VOCAB:
            raise CaseError("vocab", f"vocab={self.vocab} is outside 2..{MAX_VOCAB} (or 0: no vocabulary)")
        children = self.root.children
        last = str(len(children) - 1)
        for path, node in iter_paths(self.root):
            if not isinstance(node, Leaf):
                continue
            at = "root" + "".join(f".children[{i}]" for i in path.split("."))
            if node.kind is LeafKind.EMBEDDING and (path != "0" or not self.vocab):
                raise CaseError(at, "an embedding is the root's first child, in a tree with a vocabulary")
            if node.kind is LeafKind.HEAD and (path != last or path == "0" or not self.vocab):
                raise CaseError(at, "a head is the root's last child (not its first), in a tree with a vocabulary")
        if self.vocab and not (isinstance(children[0], Leaf) and children[0].kind is LeafKind.EMBEDDING):
            raise CaseError("root.children[0]", f"vocab={self.vocab}: the root's first child is an embedding")
        if self.vocab and self.root.residual:
            raise CaseError("root.residual", "the root of a tree with a vocabulary takes tokens: no residual")
        if self.tied is not None and children[0].frozen:  # type: ignore[union-attr]
            # The validity rules read requires_grad per leaf; a weight frozen through the
            # embedding would be frozen in the head too, which its own flag would not say.
            raise CaseError("root.children[0].frozen", "a tied embedding is not frozen")
        if self.head is not None and (self.root.own_params or self.root.buffer):
            # The root's scale and shift have the width, its output (the head's) the vocabulary.
            raise CaseError("root", "the root of a tree with a head has no parameters of its own or buffer")

    def paths(self) -> dict[str, Node]:
        return dict(iter_paths(self.root))

    @property
    def head(self) -> str | None:
        """The path of the vocabulary projection (the root's last child), or None."""
        last = self.root.children[-1]
        if self.vocab and isinstance(last, Leaf) and last.kind is LeafKind.HEAD:
            return str(len(self.root.children) - 1)
        return None

    @property
    def tied(self) -> tuple[str, str] | None:
        """(embedding path, head path) where the head's weight is the embedding's, else None."""
        head = self.head
        if head is None:
            return None
        node = self.root.children[-1]
        return ("0", head) if isinstance(node, Leaf) and node.tied else None

    @property
    def shape_changing(self) -> tuple[str, ...]:
        """The paths of the leaves that change what an activation is (the embedding, the head):
        a module left out of forward passes its input on, which these cannot do."""
        out = ("0",) if self.vocab else ()
        return out + ((self.head,) if self.head is not None else ())

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


def tree_features(tree: ModuleTree, world_size: int) -> list[str]:
    """What the tree is made of: its leaves (``leaf:<kind>``, with ``:no-bias``, conv1d's
    ``:kernel>1``, attention's ``:causal``, an embedding's ``:padding_idx``, a head's ``:tied``),
    its blocks' own parameters and buffers, tuple and dict outputs (``output:tuple``), stashed
    activations in the loss (``loss:intermediate``), its shards' evenness, and the model's shape
    (``model:sequence``, ``model:tokens``, ``loss:cross_entropy``)."""
    out = ["shards:uneven" if tree.width % world_size else "shards:even"]
    if tree.width < world_size:
        out.append("shards:empty")
    if tree.seq:
        out.append("model:sequence")
    if tree.vocab:
        out.append("model:tokens")
    if tree.head is not None:
        out.append("loss:cross_entropy")  # else MSE, the loss of every tree of the first kind
    for node in tree.paths().values():
        if isinstance(node, Leaf):
            out.append(f"leaf:{node.kind.value}" + ("" if node.bias else ":no-bias"))
            for flag, name in ((node.kernel > 1, "kernel>1"), (node.causal, "causal"), (node.padding, "padding_idx")):
                if flag:
                    out.append(f"leaf:{node.kind.value}:{name}")
            if node.tied:
                out.append("param:tied")
            if node.frozen:
                out.append("param:frozen")
        elif isinstance(node, Block):
            if node.residual:
                out.append("block:residual")
            if node.scale:
                out.append("block:own-param")
            for name, on in (("gain", node.gain), ("position", node.position), ("mix", node.mix)):
                if on:
                    out.append(f"param:rank{BLOCK_PARAM_RANKS[name]}")
            if node.buffer:
                out.append("block:buffer" if node.persistent else "block:buffer:non-persistent")
            if node.repeat:
                out.append("model:shared:called-twice")
            if node.container is not Container.NONE:
                out.append(f"block:{node.container.value}")
            if node.output is not Output.TENSOR:
                out.append(f"output:{node.output.value}")
            if node.stash:
                out.append("loss:intermediate")
    return out
