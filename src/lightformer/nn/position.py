"""Positional information: fixed sinusoidal and learned absolute embeddings, and rotary embeddings (RoPE)."""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor, nn

from lightformer.nn.checks import check_choice

# Declared once: configs use this type (a model that offers fewer declares its own subset), checks read it.
PositionKind = Literal["learned", "sinusoidal", "rope", "none"]


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """``(max_len, d_model)`` table with PE(pos, 2i) = sin(pos/10000^(2i/d)), PE(pos, 2i+1) = cos(pos/10000^(2i/d))."""
    position = torch.arange(max_len, dtype=torch.float64)[:, None]
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])
    return table.float()


def _check_length(end: int, max_len: int, what: str) -> None:
    if end > max_len:
        raise ValueError(
            f"sequence reaches position {end} but the {what} table holds max_len={max_len} positions; "
            f"use sequences of at most {max_len} tokens or build the model with a larger max_len"
        )


class SinusoidalPositionalEmbedding(nn.Module):
    """Adds the fixed sinusoidal table of "Attention Is All You Need" to ``(batch, seq, d_model)`` inputs."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.register_buffer("table", sinusoidal_table(max_len, d_model), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        _check_length(offset + x.shape[1], self.max_len, "sinusoidal position")
        return x + self.table[offset : offset + x.shape[1]].to(x.dtype)


class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned vector per absolute position (GPT-2, BERT, ViT) to ``(batch, seq, d_model)`` inputs."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.zeros(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        _check_length(offset + x.shape[1], self.max_len, "learned position")
        return x + self.weight[offset : offset + x.shape[1]]


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE, Su et al. 2021) applied to queries and keys.

    Channel pairs (i, i + head_dim/2) are rotated by the angle ``pos · base^(-2i/head_dim)`` (the
    "rotate half" layout of GPT-NeoX and LLaMA), so the score between a rotated query at m and a
    rotated key at n depends only on m - n.
    """

    def __init__(self, head_dim: int, max_len: int = 4096, base: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head dimension, got head_dim={head_dim}")
        self.max_len = max_len
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq  # (max_len, head_dim/2)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Rotate ``(batch, heads, seq, head_dim)`` queries or keys at positions ``offset..offset+seq-1``."""
        seq = x.shape[-2]
        _check_length(offset + seq, self.max_len, "rotary position")
        cos = self.cos[offset : offset + seq].to(x.dtype)
        sin = self.sin[offset : offset + seq].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def absolute_position(kind: PositionKind, d_model: int, max_len: int) -> nn.Module | None:
    """The module that adds absolute positions to token embeddings, or None for "rope"/"none"."""
    check_choice("position", kind, get_args(PositionKind))
    if kind == "learned":
        return LearnedPositionalEmbedding(d_model, max_len)
    if kind == "sinusoidal":
        return SinusoidalPositionalEmbedding(d_model, max_len)
    return None  # "rope" rotates queries and keys in attention instead; "none" adds nothing
