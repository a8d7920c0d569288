"""Build a plain ``nn.Module`` from a :class:`fuzz.model.ModuleTree`.

Submodules get the names of their tree paths (``model.get_submodule("1.0")``), so compositions
address modules the way the case does. Construction draws from torch's global RNG, which the
caller seeds from the case: every rank builds identical weights.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fuzz.model import (
    DEFAULT_FQN_MODIFIERS,
    MLP_EXPAND,
    STASH_WEIGHT,
    Container,
    Leaf,
    LeafKind,
    ModuleTree,
    Node,
    Output,
    attention_heads,
)


class TreeBlock(nn.Module):
    """Runs its children in order (twice over with ``repeat``), then ``* scale`` (its own
    parameter), ``* gain`` (rank 0), ``+ position`` (rank 2), ``+ y @ mix`` (rank 3), ``+ shift``
    (its buffer, persistent or not) and ``+ input`` (residual), each if the block has it; keeps
    that activation in ``stashed`` for the loss (``stash``), and returns it alone or with its
    input in a tuple or a dict (``output``)."""

    def __init__(
        self,
        children: list[nn.Module],
        residual: bool,
        width: int,
        scale: bool,
        buffer: bool,
        persistent: bool = True,
        repeat: bool = False,
        ranks: tuple[bool, bool, bool] = (False, False, False),
        seq: int = 0,
        output: Output = Output.TENSOR,
        stash: bool = False,
    ) -> None:
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.residual = residual
        # registered in BLOCK_PARAMS's order: scale, gain, position, mix (drawn from the RNG
        # only where present, so trees without the later ones build what they always built)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(width)) if scale else None
        gain, position, mix = ranks
        self.gain = nn.Parameter(1.0 + 0.1 * torch.randn(())) if gain else None
        self.position = nn.Parameter(0.1 * torch.randn(max(seq, 1), width)) if position else None
        self.mix = nn.Parameter(0.1 * torch.randn(2, width, width) / width**0.5) if mix else None
        if buffer:
            self.register_buffer("shift", 0.1 * torch.randn(width), persistent=persistent)
        else:
            self.shift = None
        #: Runs the children twice over (each child module called twice in one forward).
        self.repeat = repeat
        #: Names of children left out of forward (``Training.skips``); set by :func:`set_skipped`.
        self.skipped: frozenset[str] = frozenset()
        self.output = output
        self.stash = stash
        #: The activation of the last forward, for the loss (:func:`stashed_loss`).
        self.stashed: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> Any:
        y = x
        for _ in range(2 if self.repeat else 1):
            y = run_children(self, y)
        if self.scale is not None:
            y = y * self.scale
        if self.gain is not None:
            y = y * self.gain
        if self.position is not None:
            y = y + self.position  # (S, W) over (B, S, W); (1, W) over (B, W)
        if self.mix is not None:
            y = y + torch.einsum("...i,kij->...j", y, self.mix)
        if self.shift is not None:
            y = y + self.shift
        if self.residual:
            y = x + y
        if self.stash:
            self.stashed = y
        if self.output is Output.TUPLE:
            return y, x
        if self.output is Output.DICT:
            return {"out": y, "input": x}
        return y


def main_output(out: Any) -> Any:
    """What a parent and the loss read of a block's output: the activation, also from a tuple
    or a dict (``Block.output``)."""
    if isinstance(out, tuple):
        return out[0]
    if isinstance(out, dict):
        return out["out"]
    return out


class TreeList(nn.ModuleList):
    """A block built as an nn.ModuleList: no forward; its parent calls each item in order."""

    skipped: frozenset[str] = frozenset()


class TreeDict(nn.ModuleDict):
    """A block built as an nn.ModuleDict (keys "0", "1", ...: the tree's paths): no forward;
    its parent calls each item in insertion order."""

    skipped: frozenset[str] = frozenset()


def run_children(holder: nn.Module, y: Any) -> Any:
    """Call ``holder``'s children in order on ``y``, but those it skips; a container child
    (:class:`TreeList`, :class:`TreeDict`) is iterated over, as a model iterates over its layers."""
    items = holder.items() if isinstance(holder, TreeDict) else holder.named_children()
    for name, child in items:
        if name in holder.skipped:  # type: ignore[operator]
            continue
        y = run_children(child, y) if isinstance(child, (TreeList, TreeDict)) else main_output(child(y))
    return y


class PointwiseConv1d(nn.Conv1d):
    """Conv1d over the sequence of a (batch, seq, width) activation (moved to (batch, width,
    seq) and back), or over (batch, width) as a length-1 sequence; kernel 1, or more with
    padding 'same'.

    In an SPMD program with tensor parallelism, an activation after a rowwise pair's output
    (a LayerNorm, a residual add) may have its batch dimension sharded on two mesh dimensions
    ([Shard(0), Shard(0)]), which DTensor's convolution refuses by design ("does not support
    things like hybrid sharding strategies yet", torch 2.13): as a user must, the input is then
    redistributed so that each tensor dimension is sharded on one mesh dimension at most (the
    later ones become Replicate; the values are the same). Any other input, a Partial one
    included, goes to the convolution as it is."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3:
            return super().forward(x.transpose(1, 2)).transpose(1, 2)
        return super().forward(_one_shard_per_dim(x).unsqueeze(-1)).squeeze(-1)


class Attention(nn.Module):
    """Self-attention over the sequence: q, k, v, o projections (Linear(W, W)) and
    ``F.scaled_dot_product_attention`` with ``heads`` heads, causal or not. A (batch, width)
    activation is a length-1 sequence."""

    def __init__(self, width: int, bias: bool, causal: bool) -> None:
        super().__init__()
        # registered in ATTENTION_PARTS's order: q, k, v, o
        self.q = nn.Linear(width, width, bias=bias)
        self.k = nn.Linear(width, width, bias=bias)
        self.v = nn.Linear(width, width, bias=bias)
        self.o = nn.Linear(width, width, bias=bias)
        self.heads = attention_heads(width)
        self.causal = causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.unsqueeze(1) if x.dim() == 2 else x
        b, s, w = h.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(b, s, self.heads, w // self.heads).transpose(1, 2)

        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        out = self.o(out.transpose(1, 2).reshape(b, s, w))
        return out.squeeze(1) if x.dim() == 2 else out


class Mlp(nn.Module):
    """up: Linear(W, MLP_EXPAND * W), GELU, down: Linear(MLP_EXPAND * W, W): Linears that change
    the width inside a leaf that keeps it."""

    def __init__(self, width: int, bias: bool) -> None:
        super().__init__()
        self.up = nn.Linear(width, MLP_EXPAND * width, bias=bias)
        self.down = nn.Linear(MLP_EXPAND * width, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


def _one_shard_per_dim(x: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(x, DTensor):
        return x
    seen: set[int] = set()
    placements: list[Any] = []
    for p in x.placements:
        if isinstance(p, Shard) and p.dim in seen:
            placements.append(Replicate())
            continue
        if isinstance(p, Shard):
            seen.add(p.dim)
        placements.append(p)
    return x if tuple(placements) == tuple(x.placements) else x.redistribute(x.device_mesh, placements)


def build_leaf(leaf: Leaf, width: int, vocab: int = 0) -> nn.Module:
    module = _build_leaf(leaf, width, vocab)
    if leaf.frozen:
        module.requires_grad_(False)
    return module


def _build_leaf(leaf: Leaf, width: int, vocab: int) -> nn.Module:
    if leaf.kind is LeafKind.LINEAR:
        return nn.Linear(width, width, bias=leaf.bias)
    if leaf.kind is LeafKind.LAYER_NORM:
        return nn.LayerNorm(width, bias=leaf.bias)
    if leaf.kind is LeafKind.CONV1D:
        if leaf.kernel == 1:
            return PointwiseConv1d(width, width, kernel_size=1, bias=leaf.bias)
        return PointwiseConv1d(width, width, kernel_size=leaf.kernel, padding="same", bias=leaf.bias)
    if leaf.kind is LeafKind.RMS_NORM:
        return nn.RMSNorm(width)
    if leaf.kind is LeafKind.MLP:
        return Mlp(width, leaf.bias)
    if leaf.kind is LeafKind.ATTENTION:
        return Attention(width, leaf.bias, leaf.causal)
    if leaf.kind is LeafKind.EMBEDDING:
        return nn.Embedding(vocab, width, padding_idx=0 if leaf.padding else None)
    if leaf.kind is LeafKind.HEAD:
        return nn.Linear(width, vocab, bias=leaf.bias)
    if leaf.kind is LeafKind.DROPOUT:
        return nn.Dropout(0.5)
    if leaf.kind is LeafKind.RELU:
        return nn.ReLU()
    if leaf.kind is LeafKind.TANH:
        return nn.Tanh()
    if leaf.kind is LeafKind.GELU:
        return nn.GELU()
    raise AssertionError(f"unhandled leaf kind {leaf.kind}")


def build_node(node: Node, width: int, vocab: int = 0, seq: int = 0) -> nn.Module:
    """The module of ``node``; a block whose last child is a tied head gets the weight of its
    first child (the embedding) there: one Parameter in two modules."""
    if isinstance(node, Leaf):
        return build_leaf(node, width, vocab)
    children = [build_node(c, width, vocab, seq) for c in node.children]
    last = node.children[-1]
    if isinstance(last, Leaf) and last.kind is LeafKind.HEAD and last.tied:
        children[-1].weight = children[0].weight
    if node.container is Container.LIST:
        return TreeList(children)
    if node.container is Container.DICT:
        return TreeDict({str(i): c for i, c in enumerate(children)})
    ranks = (node.gain, node.position, node.mix)
    return TreeBlock(
        children,
        node.residual,
        width,
        node.scale,
        node.buffer,
        node.persistent,
        node.repeat,
        ranks,
        seq,
        node.output,
        node.stash,
    )


#: The name of the child a :class:`FusedLeaf` holds its leaf under: its state dict hides it.
FUSED_CHILD = "fused"


class FusedLeaf(nn.Module):
    """A leaf held under a child it hides from its state dict, as fused modules do to keep the
    keys of the module they replaced (torchtune's FusionEmbedding keeps ``weight`` for its
    ``embedding.weight``): a state-dict hook renames ``<prefix>fused.<name>`` to
    ``<prefix><name>``, a load pre-hook renames it back, and the method named ``method``
    returns ``{name: "fused"}`` for each such key atom, which is how the distributed
    state-dict API is told (pytorch/pytorch#146557). Forward is the leaf's."""

    def __init__(self, leaf: nn.Module, method: str = DEFAULT_FQN_MODIFIERS) -> None:
        super().__init__()
        self.add_module(FUSED_CHILD, leaf)
        self._atoms = [n for n, _ in leaf.named_parameters(recurse=False)]
        self._atoms += [n for n, _ in leaf.named_buffers(recurse=False) if n not in leaf._non_persistent_buffers_set]
        object.__setattr__(self, method, self.key_modifiers)
        self.register_state_dict_post_hook(FusedLeaf._hide)
        self.register_load_state_dict_pre_hook(FusedLeaf._unhide)

    def key_modifiers(self) -> dict[str, str]:
        return {atom: FUSED_CHILD for atom in self._atoms}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, FUSED_CHILD)(x)

    @staticmethod
    def _hide(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
        for atom in module.key_modifiers():  # type: ignore[operator]
            key = f"{prefix}{FUSED_CHILD}.{atom}"
            if key in state_dict:
                state_dict[f"{prefix}{atom}"] = state_dict.pop(key)

    @staticmethod
    def _unhide(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        for atom in module.key_modifiers():  # type: ignore[operator]
            key = f"{prefix}{atom}"
            if key in state_dict:
                state_dict[f"{prefix}{FUSED_CHILD}.{atom}"] = state_dict.pop(key)


def fuse(model: nn.Module, paths: tuple[str, ...], method: str = DEFAULT_FQN_MODIFIERS) -> None:
    """Put the leaves at ``paths`` of a built tree under :class:`FusedLeaf` (same weights: the
    leaf is moved, not rebuilt)."""
    for path in paths:
        parent, _, name = path.rpartition(".")
        owner = model.get_submodule(parent)
        owner.add_module(name, FusedLeaf(owner.get_submodule(name), method))


def own_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters the tree node built as ``module`` holds as its own: a block's own (its
    scale), a leaf's all (an attention's q, k, v, o; an MLP's up, down)."""
    if isinstance(module, (TreeList, TreeDict)):
        return []
    return list(module.parameters(recurse=not isinstance(module, TreeBlock)))


def build_model(tree: ModuleTree, device: torch.device) -> nn.Module:
    with torch.device(device):
        return build_node(tree.root, tree.width, tree.vocab, tree.seq)


def sample_batch(tree: ModuleTree, rows: int, gen: torch.Generator, dtype: torch.dtype) -> tuple[Any, Any]:
    """``rows`` inputs and targets for ``tree`` from ``gen``: float (rows, [seq,] width) inputs,
    or integer tokens where the tree has a vocabulary; targets the output's shape (floats), or
    tokens where the tree ends in a head (its loss is cross-entropy). A tree of the first kind
    (no sequence, no vocabulary) draws what it always drew: corpus entries replay unchanged."""
    lead = (rows, tree.seq) if tree.seq else (rows,)
    if tree.vocab:
        x = torch.randint(tree.vocab, lead, generator=gen)
    else:
        x = torch.randn(*lead, tree.width, generator=gen, dtype=dtype)
    if tree.head is not None:
        y = torch.randint(tree.vocab, lead, generator=gen)
    else:
        y = torch.randn(*lead, tree.width, generator=gen, dtype=dtype)
    return x, y


def loss_of(out: Any, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The loss the tree chose through its targets (:func:`sample_batch`) over the model's
    output (its first element, :func:`main_output`): token targets (a tree that ends in a head)
    take cross-entropy over the last dimension, the vocabulary (the logits in the training's
    ``dtype``); float targets MSE (in ``y``'s dtype)."""
    out = main_output(out)
    if not y.is_floating_point():
        return F.cross_entropy(out.to(dtype).reshape(-1, out.shape[-1]), y.reshape(-1))
    return F.mse_loss(out.to(y.dtype), y)


def tree_loss(out: Any, y: torch.Tensor, dtype: torch.dtype, blocks: dict[str, Any]) -> torch.Tensor:
    """The training loss of the forward just run: :func:`loss_of` its output, plus
    ``STASH_WEIGHT`` times the mean square (in ``dtype``) of each activation its blocks
    (:func:`tree_blocks`) stashed (``Block.stash``: a loss over an intermediate); the stashes
    are cleared (:func:`clear_stashed`)."""
    loss = loss_of(out, y, dtype)
    for path in sorted(blocks):
        held = getattr(blocks[path], "stashed", None)
        if held is not None:
            loss = loss + STASH_WEIGHT * held.to(dtype).pow(2).mean()
    clear_stashed(blocks)
    return loss


def clear_stashed(blocks: dict[str, Any]) -> None:
    """Forget stashed activations: before a forward (a block left out of it stashes nothing),
    and after a backward (a checkpointed region's recomputation stashes again)."""
    for block in blocks.values():
        if getattr(block, "stashed", None) is not None:
            block.stashed = None


def tree_blocks(model: nn.Module) -> dict[str, Any]:
    """The blocks of a built tree by their case paths (containers too), through any wrapper
    (DDP's ``module``, FSDP1's ``_fsdp_wrapped_module``, checkpoint wrappers): tree paths are
    digits only."""
    return {
        ".".join(c for c in name.split(".") if c.isdigit()): m
        for name, m in model.named_modules()
        if isinstance(m, (TreeBlock, TreeList, TreeDict))
    }


def set_skipped(blocks: dict[str, Any], paths: list[str]) -> None:
    """Leave the modules at ``paths`` out of forward until the next call (the rest run)."""
    skipped: dict[str, set[str]] = {p: set() for p in blocks}
    for path in paths:
        parent, _, name = path.rpartition(".")
        skipped[parent].add(name)
    for p, block in blocks.items():
        if block.skipped != skipped[p]:
            block.skipped = frozenset(skipped[p])


def leaf_parameters(model: nn.Module, paths: list[str]) -> dict[str, list[nn.Parameter]]:
    """Per tree path in ``paths`` (leaves): the parameters registered under it, found by their
    plain-model names through any wrapper prefix (the path is the name's numeric components)."""
    out: dict[str, list[nn.Parameter]] = {path: [] for path in paths}
    for name, p in model.named_parameters():
        owner = ".".join(c for c in name.split(".")[:-1] if c.isdigit())
        if owner in out:
            out[owner].append(p)
    return out
