"""Position-wise feed-forward network: ReLU (the paper), GELU (exact or GPT-2's tanh approximation), or SwiGLU."""

from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

Activation = Literal["relu", "gelu", "gelu_tanh", "swiglu"]


class FeedForward(nn.Module):
    """FFN(x) = W2·act(W1·x + b1) + b2 applied at every position; SwiGLU uses W2·(silu(x·W) ⊙ x·V).

    ``d_ff`` defaults to 4·d_model. For SwiGLU ``fc1`` packs [W; V] into one ``(2·d_ff, d_model)``
    matrix (timm's ``SwiGLUPacked`` layout); LLaMA-style budgets pick ``d_ff ≈ 8/3·d_model``.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int | None = None,
        activation: Activation = "gelu",
        bias: bool = True,
    ) -> None:
        super().__init__()
        if activation not in ("relu", "gelu", "gelu_tanh", "swiglu"):
            raise ValueError(f"unknown activation {activation!r}; valid: 'relu', 'gelu', 'gelu_tanh', 'swiglu'")
        d_ff = d_ff or 4 * d_model
        self.activation = activation
        self.fc1 = nn.Linear(d_model, 2 * d_ff if activation == "swiglu" else d_ff, bias=bias)
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """``(..., d_model)`` → ``(..., d_model)``."""
        h = self.fc1(x)
        if self.activation == "swiglu":
            gate, value = h.chunk(2, dim=-1)
            h = F.silu(gate) * value
        elif self.activation == "gelu":
            h = F.gelu(h)
        elif self.activation == "gelu_tanh":
            h = F.gelu(h, approximate="tanh")
        else:
            h = F.relu(h)
        return self.fc2(h)
