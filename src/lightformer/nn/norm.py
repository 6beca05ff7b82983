"""Normalisation layers: LayerNorm (the paper) or RMSNorm, chosen by name."""

from __future__ import annotations

from typing import Literal, get_args

from torch import nn

from lightformer.nn.checks import check_choice

NormKind = Literal["layernorm", "rmsnorm"]  # declared once: configs use this type, checks read it


def make_norm(kind: NormKind, d_model: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """``nn.LayerNorm`` or ``nn.RMSNorm`` over the last dimension (RMSNorm has no bias)."""
    check_choice("norm", kind, get_args(NormKind))
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=eps, bias=bias)
    return nn.RMSNorm(d_model, eps=eps)
