"""Multi-head attention: one module for self, causal and cross attention, with a KV cache.

Mask convention (the one used everywhere in lightformer): masks are boolean and ``True`` means
"may attend" / "is a real token", the convention of ``torch.nn.functional.scaled_dot_product_attention``.

- ``key_mask``: ``(batch, key_len)``, ``True`` at real (non-padding) key positions.
- ``attn_mask``: broadcastable to ``(batch, heads, query_len, key_len)``, ``True`` where query i may
  attend to key j.
- ``causal=True``: query i may attend to keys j <= i + offset, where ``offset = key_len - query_len``
  (the number of keys already in the cache). The mask is aligned bottom-right, so a single cached
  query attends to every key; SDPA's own ``is_causal`` aligns top-left and is only used when
  ``query_len == key_len``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from lightformer.nn.checks import check_heads
from lightformer.nn.dropout import dropout
from lightformer.nn.position import RotaryEmbedding


class KVCache:
    """Keys and values of earlier positions, for incremental decoding.

    With ``max_length`` the keys/values go into a buffer preallocated for that many positions;
    without it the first ``append`` is stored as is and later ones are concatenated. Self-attention
    appends at every step; cross-attention stores the projected encoder output once and reuses it.
    """

    def __init__(self, max_length: int | None = None) -> None:
        self.max_length = max_length
        self.keys: Tensor | None = None  # (batch, heads, positions, head_dim)
        self.values: Tensor | None = None
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add keys/values ``(batch, heads, new_len, head_dim)``; return all so far."""
        new_length = self.length + k.shape[2]
        if self.max_length is None:
            if self.keys is not None:
                k, v = torch.cat([self.keys, k], dim=2), torch.cat([self.values, v], dim=2)
            self.keys, self.values, self.length = k, v, new_length
            return k, v
        if new_length > self.max_length:
            raise ValueError(f"KVCache overflow: {new_length} positions exceed max_length={self.max_length}")
        if self.keys is None:
            shape = (k.shape[0], k.shape[1], self.max_length, k.shape[3])
            self.keys, self.values = k.new_empty(shape), v.new_empty(shape)
        self.keys[:, :, self.length : new_length] = k
        self.values[:, :, self.length : new_length] = v
        self.length = new_length
        return self.get()

    def get(self) -> tuple[Tensor, Tensor]:
        """Keys and values stored so far."""
        return self.keys[:, :, : self.length], self.values[:, :, : self.length]

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search): row i becomes old row ``index[i]``."""
        if self.keys is not None:
            self.keys = self.keys.index_select(0, index)
            self.values = self.values.index_select(0, index)


def causal_mask(query_len: int, key_len: int, device: torch.device | None = None) -> Tensor:
    """``(query_len, key_len)`` bool mask, ``True`` where query i may see key j (bottom-right aligned)."""
    return torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril(key_len - query_len)


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over ``n_heads`` heads with input projections and output projection W^O.

    Queries come from ``x``; keys and values from ``context`` (cross-attention) or from ``x``
    (self-attention). The projection weights are stored as one ``qkv`` matrix ``(3·d_model, d_model)``
    with rows [W^Q; W^K; W^V], the layout of ``torch.nn.MultiheadAttention`` and timm. ``bias``: biases in the
    projections; ``qkv_bias`` (default: ``bias``) overrides it for the input projections alone (timm's ``qkv_bias``).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        rotary: RotaryEmbedding | None = None,
        qkv_bias: bool | None = None,
    ) -> None:
        super().__init__()
        check_heads(d_model, n_heads)
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias if qkv_bias is None else qkv_bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)
        self.rotary = rotary
        self.on_weights: Callable[[Tensor], None] | None = None  # set by `record_attention`

    def _split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)

    def _project(self, x: Tensor, context: Tensor | None, cache: KVCache | None) -> tuple[Tensor, Tensor, Tensor]:
        """Project to per-head q, k, v ``(batch, heads, len, head_dim)``, using and updating ``cache``."""
        if context is None:
            q, k, v = (self._split_heads(t) for t in self.qkv(x).chunk(3, dim=-1))
            if self.rotary is not None:
                offset = cache.length if cache is not None else 0
                q, k = self.rotary(q, offset), self.rotary(k, offset)
            if cache is not None:
                k, v = cache.append(k, v)
            return q, k, v
        w_q, w_kv = self.qkv.weight.split([self.d_model, 2 * self.d_model])
        b_q, b_kv = self.qkv.bias.split([self.d_model, 2 * self.d_model]) if self.qkv.bias is not None else (None, None)
        q = self._split_heads(F.linear(x, w_q, b_q))
        if cache is not None and cache.length > 0:  # the encoder output was projected at the first step
            k, v = cache.get()
        else:
            k, v = (self._split_heads(t) for t in F.linear(context, w_kv, b_kv).chunk(2, dim=-1))
            if cache is not None:
                cache.append(k, v)
        return q, k, v

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        key_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        return_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``x`` ``(batch, q_len, d_model)`` to ``context`` ``(batch, k_len, d_model)`` or to ``x``.

        Returns ``(batch, q_len, d_model)``, and with ``return_weights`` also the attention weights
        ``(batch, heads, q_len, k_len)`` (computed by the explicit path, before dropout).
        """
        q, k, v = self._project(x, context, cache)
        q_len, k_len = q.shape[2], k.shape[2]

        mask = attn_mask
        if key_mask is not None:
            mask = _and(mask, key_mask[:, None, None, :])
        # SDPA's is_causal is top-left aligned: correct only without cache offset and without other masks.
        use_is_causal = causal and q_len == k_len and mask is None
        if causal and not use_is_causal and q_len > 1:
            mask = _and(mask, causal_mask(q_len, k_len, q.device))

        dropout_p = self.dropout if self.training else 0.0
        written_out = return_weights or self.on_weights is not None or _explicit_is_faster(q, k_len, mask)
        # SDPA's CPU kernels draw dropout masks one Bernoulli sample at a time (see nn/dropout.py): with dropout on
        # CPU, SDPA's math kernel's computation (fp32 inside) is written out instead, with fast masks.
        fp32_in_place_of_sdpa = not written_out and dropout_p > 0 and q.device.type == "cpu"
        if written_out or fp32_in_place_of_sdpa:
            if use_is_causal:
                mask = causal_mask(q_len, k_len, q.device)
            qkv = (q.float(), k.float(), v.float()) if fp32_in_place_of_sdpa else (q, k, v)
            out, weights = explicit_attention(*qkv, mask, dropout_p)
            out = out.to(q.dtype)
            if self.on_weights is not None:
                self.on_weights(weights.detach())
        else:
            # With an explicit mask on CPU, SDPA's fused kernel's backward is ~2x slower than its math kernel at
            # translation shapes (short padded sequences, fp32): benchmarks/translation_vs_torch.py.
            math_kernel = mask is not None and q.device.type == "cpu"
            with sdpa_kernel(SDPBackend.MATH) if math_kernel else nullcontext():
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=use_is_causal
                )
            weights = None
        out = self.proj(out.transpose(1, 2).reshape(x.shape[0], q_len, self.d_model))
        return (out, weights) if return_weights else out


# Longest keys for which, on CPU in bf16/fp16, attention written out (two batched matrix multiplies and a
# softmax, all in 16 bits) trains faster than SDPA: its fused CPU kernel is 3-8x slower than that at 16-128 keys
# and its math kernel computes in fp32 (slower, and it stores fp32 copies of q, k, v and the weights). At 512
# keys and more the fused kernel wins. Measured with torch 2.14 on an AVX-512 CPU, forward and backward.
EXPLICIT_MAX_KEYS = 128


def _explicit_is_faster(q: Tensor, k_len: int, mask: Tensor | None) -> bool:
    """Whether to write attention out: on CPU, 16-bit, short keys, no padding or other explicit mask (the ViT;
    the GPT's causal training pass). Masked attention (the translator's padding) keeps SDPA's math kernel, with
    fp32 inside, the path its BLEU was measured with: one 28-minute run with masked attention written out in
    bf16 scored 5.73 test BLEU against 6.15, not enough runs to tell a loss of precision from noise."""
    short = k_len <= EXPLICIT_MAX_KEYS and mask is None
    return q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and short


def _and(mask: Tensor | None, other: Tensor) -> Tensor:
    return other if mask is None else mask & other


def explicit_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """softmax(QKᵀ/√d_k + M)·V written out, returning ``(output, weights)``; weights are before dropout.

    q: ``(..., q_len, d_k)``, k: ``(..., k_len, d_k)``, v: ``(..., k_len, d_v)``, mask bool (True = attend).
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return dropout(weights, dropout_p) @ v, weights


@contextmanager
def record_attention(model: nn.Module) -> Iterator[dict[str, Tensor]]:
    """Record the attention weights of every ``MultiHeadAttention`` in ``model`` during the block.

    Yields a dict from module name to the ``(batch, heads, q_len, k_len)`` weights of its latest call::

        with record_attention(vit) as maps:
            vit(images)
        maps["encoder.layers.0.self_attn"]
    """
    recorded: dict[str, Tensor] = {}
    modules = [(name, m) for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)]
    for name, m in modules:
        m.on_weights = partial(recorded.__setitem__, name)
    try:
        yield recorded
    finally:
        for _, m in modules:
            m.on_weights = None
