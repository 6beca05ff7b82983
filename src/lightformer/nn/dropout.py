"""Dropout with fast masks on CPU, and word (token) dropout.

PyTorch's CPU dropout draws one Bernoulli sample per element from its Mersenne Twister, a large share of a CPU
training step with many dropouts (the translation recipe's). `dropout` draws four 16-bit uniform integers from
each random 64-bit integer instead and keeps an element when its integer clears the threshold, which is faster
forward and backward (`benchmarks/dropout.py` measures both; the statistics are tested in `tests/test_blocks.py`).
On other devices it is `F.dropout` (GPU kernels draw masks in parallel; nothing to gain).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightformer.nn.checks import check_fraction

_LEVELS = 1 << 16  # a mask element is one uniform 16-bit integer: drop rates in steps of 1/65536


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Zero each element of ``x`` with probability ``p`` and scale the rest by 1/(1-p), in training only.

    On CPU, ``p`` is rounded to a multiple of 1/65536 (0.3 → 0.300003) and the scale uses the rounded rate,
    so the expected output is exactly ``x``. Masks come from torch's default generator: seeded runs repeat.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    dropped_levels = round(p * _LEVELS)
    n_words = (x.numel() + 3) // 4
    bits = torch.randint(-(2**63), 2**63 - 1, (n_words,), dtype=torch.int64, device=x.device)
    uniform16 = bits.view(torch.int16)[: x.numel()].view(x.shape)  # each in -32768..32767, uniform
    keep = uniform16 >= dropped_levels - _LEVELS // 2
    return torch.where(keep, x, 0.0) * (_LEVELS / (_LEVELS - dropped_levels))


class Dropout(nn.Module):
    """``nn.Dropout`` with `dropout`'s fast CPU masks; the identity in eval mode."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        check_fraction("dropout", p)
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class TokenDropout(nn.Module):
    """Word dropout: in training, each token's whole embedding ``(..., d_model)`` is zeroed with probability ``p``.

    The model sees that a token was there (its position remains) but not which, so it must translate or predict
    from the context: the regulariser of Gal & Ghahramani (2016) that Sennrich & Zhang (2019) found worth several
    BLEU in low-resource translation. Unlike ``Dropout`` the kept vectors are not rescaled: a dropped token is
    an unknown word, not a noisier one. The identity in eval mode.
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        check_fraction("token_dropout", p)
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape[:-1], device=x.device) >= self.p
        return x * keep.unsqueeze(-1).to(x.dtype)

    def extra_repr(self) -> str:
        return f"p={self.p}"
