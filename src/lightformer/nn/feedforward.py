"""Position-wise feed-forward network: ReLU (the paper), GELU (exact or GPT-2's tanh approximation), or SwiGLU."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Literal, get_args

import torch.nn.functional as F
from torch import Tensor, nn

from lightformer.nn.checks import check_choice

# The activations, declared once: configs use these types (the command line lists and checks their values) and the
# checks below read the values with ``get_args``. "gelu" is the exact (erf) GELU, "gelu_tanh" GPT-2's approximation.
PointwiseActivation = Literal["relu", "gelu", "gelu_tanh"]
Activation = Literal[PointwiseActivation, "swiglu"]  # SwiGLU gates one half of its input by the other: not pointwise

_POINTWISE: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
}


def pointwise_activation(name: PointwiseActivation, field: str = "activation") -> Callable[[Tensor], Tensor]:
    """The function of a pointwise activation; ValueError naming ``field``, the value and the valid ones."""
    check_choice(field, name, get_args(PointwiseActivation))
    return _POINTWISE[name]


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
        check_choice("activation", activation, get_args(Activation))
        d_ff = d_ff or 4 * d_model
        self.activation = activation
        self.act = None if activation == "swiglu" else pointwise_activation(activation)
        self.fc1 = nn.Linear(d_model, 2 * d_ff if activation == "swiglu" else d_ff, bias=bias)
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """``(..., d_model)`` → ``(..., d_model)``."""
        h = self.fc1(x)
        if self.act is None:  # SwiGLU
            gate, value = h.chunk(2, dim=-1)
            h = F.silu(gate) * value
        else:
            h = self.act(h)
        return self.fc2(h)
