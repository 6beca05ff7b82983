"""Positional information: fixed sinusoidal and learned absolute embeddings, and rotary embeddings (RoPE)."""

from __future__ import annotations

import math
from dataclasses import dataclass
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


@dataclass(frozen=True)
class RopeScaling:
    """How a rotary table reaches past the positions a model was trained on (transformers' ``rope_scaling``).

    Args:
        kind: "linear": every frequency divided by ``factor`` (positions interpolated); "llama3": Llama 3.1's, the
            low frequencies divided by ``factor``, the high ones kept, those between blended.
        factor: how many times the trained positions the table stretches to.
        low_freq_factor: llama3: wavelengths above ``original_max_positions / low_freq_factor`` are divided.
        high_freq_factor: llama3: wavelengths below ``original_max_positions / high_freq_factor`` are kept.
        original_max_positions: llama3: the positions the model was trained on before scaling.
    """

    kind: Literal["linear", "llama3"] = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192

    def __post_init__(self) -> None:
        check_choice("rope_scaling.kind", self.kind, ("linear", "llama3"))
        if not self.factor > 0 or not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(f"rope_scaling: factor={self.factor} must be above 0 and 0 < low_freq_factor="
                             f"{self.low_freq_factor} < high_freq_factor={self.high_freq_factor}")  # fmt: skip

    def scaled(self, inv_freq: Tensor) -> Tensor:
        """The frequencies of a table ``inv_freq`` (head_dim/2,) under this scaling (as transformers computes them)."""
        if self.kind == "linear":
            return inv_freq / self.factor
        wavelength = 2 * math.pi / inv_freq
        low, high = (
            self.original_max_positions / self.low_freq_factor,
            self.original_max_positions / self.high_freq_factor,
        )
        divided = torch.where(wavelength > low, inv_freq / self.factor, inv_freq)
        smooth = (self.original_max_positions / wavelength - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        blended = (1 - smooth) * divided / self.factor + smooth * divided
        return torch.where((wavelength >= high) & (wavelength <= low), blended, divided)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE, Su et al. 2021) applied to queries and keys.

    Channel pairs (i, i + head_dim/2) are rotated by the angle ``pos · base^(-2i/head_dim)`` (the
    "rotate half" layout of GPT-NeoX and LLaMA), so the score between a rotated query at m and a
    rotated key at n depends only on m - n. ``base``: the rotary base (transformers' ``rope_theta``);
    ``scaling``: how the frequencies stretch past the trained positions (``RopeScaling``).
    """

    def __init__(
        self, head_dim: int, max_len: int = 4096, base: float = 10000.0, scaling: RopeScaling | None = None
    ) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head dimension, got head_dim={head_dim}")
        self.max_len = max_len
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        if scaling is not None:
            inv_freq = scaling.scaled(inv_freq)
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
