"""Normalisation layers: LayerNorm (the paper) or RMSNorm, chosen by name."""

from __future__ import annotations

from typing import Literal

from torch import nn

NormKind = Literal["layernorm", "rmsnorm"]


def make_norm(kind: NormKind, d_model: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """``nn.LayerNorm`` or ``nn.RMSNorm`` over the last dimension."""
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return nn.RMSNorm(d_model, eps=eps)
    raise ValueError(f"unknown norm {kind!r}; valid: 'layernorm', 'rmsnorm'")
