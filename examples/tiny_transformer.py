"""A small decoder-only transformer, to fuzz as a user's own model:

    python -m fuzz explore --model examples/tiny_transformer.py:tiny_transformer --budget 300

Token embedding tied to the output projection, RMSNorm, causal scaled_dot_product_attention,
an MLP that widens and narrows, a few blocks in a ModuleList. ``tiny_transformer()`` returns
``(model, batch_fn, loss_fn)`` as ``--model`` expects: the model built on the CPU from torch's
global generator (which the suite seeds), ``batch_fn(batch_size, generator)`` drawing token
sequences and their next tokens, ``loss_fn`` the cross-entropy over the vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 32
DIM = 16
HEADS = 2
LAYERS = 2
SEQ = 8


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

        y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, d))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(dim)
        self.attn = Attention(dim, heads)
        self.mlp_norm = RMSNorm(dim)
        self.mlp = MLP(dim, 3 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = VOCAB, dim: int = DIM, heads: int = HEADS, layers: int = LAYERS) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        self.output.weight = self.embed.weight  # tied

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def batch(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences and, as targets, each position's next token."""
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]


def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def tiny_transformer() -> tuple[nn.Module, object, object]:
    return TinyTransformer(), batch, loss
