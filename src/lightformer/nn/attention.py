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
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from lightformer.nn.checks import check_heads, check_kv_heads
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


def causal_mask(query_len: int, key_len: int, device: torch.device | None = None, window: int | None = None) -> Tensor:
    """``(query_len, key_len)`` bool mask, ``True`` where query i may see key j (bottom-right aligned); with
    ``window``, only the ``window`` keys up to its own position."""
    mask = torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril(key_len - query_len)
    return mask if window is None else mask.triu(key_len - query_len - window + 1)


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over ``n_heads`` heads with input projections and output projection W^O.

    Self-attention: queries, keys and values come from ``x``, through one ``qkv`` projection ``(3·d_model,
    d_model)`` with rows [W^Q; W^K; W^V], the layout of ``torch.nn.MultiheadAttention`` and timm. Cross-attention
    (``cross_attention=True``): queries come from ``x`` through ``q`` ``(d_model, d_model)``, keys and values from
    ``context`` through ``kv`` ``(2·d_model, d_model)`` with rows [W^K; W^V]; ``torch.nn.MultiheadAttention``'s
    ``in_proj_weight`` is their concatenation. ``bias``: biases in the projections; ``qkv_bias`` (default: ``bias``)
    overrides it for the input projections alone (timm's ``qkv_bias``). ``n_kv_heads`` (self-attention; default
    ``n_heads``): grouped-query attention (Llama 3, Qwen2, Mistral), ``n_heads / n_kv_heads`` query heads sharing
    each key/value head: ``qkv`` is ``((n_heads + 2·n_kv_heads)·head_dim, d_model)`` and the cache holds the
    ``n_kv_heads``; one key/value head is multi-query attention. ``sliding_window`` (causal self-attention): a query
    sees itself and the ``sliding_window - 1`` keys before it alone (Mistral's).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        rotary: RotaryEmbedding | None = None,
        qkv_bias: bool | None = None,
        cross_attention: bool = False,
        n_kv_heads: int | None = None,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__()
        check_heads(d_model, n_heads)
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        check_kv_heads(n_heads, self.n_kv_heads)
        if cross_attention and self.n_kv_heads != n_heads:
            raise ValueError("grouped-query attention (n_kv_heads) is for self-attention; cross-attention has n_heads")
        self.head_dim = d_model // n_heads
        self.sliding_window = sliding_window
        self.dropout = dropout
        self.cross_attention = cross_attention
        in_bias = bias if qkv_bias is None else qkv_bias
        if cross_attention:
            self.q = nn.Linear(d_model, d_model, bias=in_bias)
            self.kv = nn.Linear(d_model, 2 * d_model, bias=in_bias)
        else:
            self.qkv = nn.Linear(d_model, d_model + 2 * self.n_kv_heads * self.head_dim, bias=in_bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)
        self.rotary = rotary
        self.on_weights: Callable[[Tensor], None] | None = None  # set by `record_attention`

    def _split_heads(self, x: Tensor) -> Tensor:
        b, t, width = x.shape
        return x.view(b, t, width // self.head_dim, self.head_dim).transpose(1, 2)

    def _project(self, x: Tensor, context: Tensor | None, cache: KVCache | None) -> tuple[Tensor, Tensor, Tensor]:
        """Project to per-head q, k, v ``(batch, heads, len, head_dim)``, using and updating ``cache``."""
        if self.cross_attention:
            if context is None:
                raise ValueError("this is cross-attention: pass the sequence to attend to as `context`")
            q = self._split_heads(self.q(x))
            if cache is not None and cache.length > 0:  # the encoder output was projected at the first step
                return q, *cache.get()
            k, v = (self._split_heads(t) for t in self.kv(context).chunk(2, dim=-1))
            if cache is not None:
                cache.append(k, v)
            return q, k, v
        if context is not None:
            raise ValueError(
                "this is self-attention: build MultiHeadAttention(cross_attention=True) to attend to a context"
            )
        kv_width = self.n_kv_heads * self.head_dim
        q, k, v = (self._split_heads(t) for t in self.qkv(x).split([self.d_model, kv_width, kv_width], dim=-1))
        if self.rotary is not None:
            offset = cache.length if cache is not None else 0
            q, k = self.rotary(q, offset), self.rotary(k, offset)
        if cache is not None:
            k, v = cache.append(k, v)
        if self.n_kv_heads != self.n_heads:  # each key/value head serves n_heads / n_kv_heads query heads in a row
            groups = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return q, k, v

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        """Cross-attention weights saved packed (one ``qkv`` with rows [W^Q; W^K; W^V], before ``q`` and ``kv``) are
        split on loading."""
        if self.cross_attention:
            for leaf in ("weight", "bias"):
                packed = state_dict.pop(f"{prefix}qkv.{leaf}", None)
                if packed is not None:
                    state_dict[f"{prefix}q.{leaf}"], state_dict[f"{prefix}kv.{leaf}"] = packed.split(
                        [self.d_model, 2 * self.d_model]
                    )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

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
        window = self.sliding_window if causal and self.sliding_window and k_len > self.sliding_window else None
        # SDPA's is_causal is top-left aligned: correct only without cache offset and without other masks.
        use_is_causal = causal and q_len == k_len and mask is None and window is None
        if causal and not use_is_causal and (q_len > 1 or window):
            mask = _and(mask, causal_mask(q_len, k_len, q.device, window))

        dropout_p = self.dropout if self.training else 0.0
        kernel = attention_kernel(
            q.device.type,
            q.dtype,
            k_len,
            masked=mask is not None,
            dropout=dropout_p > 0,
            need_weights=return_weights or self.on_weights is not None,
        )
        if kernel in ("explicit", "explicit_fp32"):
            if use_is_causal:
                mask = causal_mask(q_len, k_len, q.device)
            qkv = (q.float(), k.float(), v.float()) if kernel == "explicit_fp32" else (q, k, v)
            out, weights = explicit_attention(*qkv, mask, dropout_p)
            out = out.to(q.dtype)
            if self.on_weights is not None:
                self.on_weights(weights.detach())
        else:
            with sdpa_kernel(SDPBackend.MATH) if kernel == "sdpa_math" else nullcontext():
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=use_is_causal
                )
            weights = None
        out = self.proj(out.transpose(1, 2).reshape(x.shape[0], q_len, self.d_model))
        return (out, weights) if return_weights else out


AttentionKernel = Literal["explicit", "explicit_fp32", "sdpa_math", "sdpa"]

# The longest keys for which attention written out in 16 bits on CPU beats SDPA (``attention_kernel``).
EXPLICIT_MAX_KEYS = 128


def attention_kernel(
    device_type: str, dtype: torch.dtype, key_len: int, *, masked: bool, dropout: bool, need_weights: bool
) -> AttentionKernel:
    """Which path computes softmax(QKᵀ/√d_k + M)·V, from the device type ("cpu", "cuda", ...), the dtype of q, k
    and v, the number of keys, whether a boolean mask tensor is given (padding, or a causal mask that SDPA's
    top-left ``is_causal`` cannot express), whether dropout is on, and whether the weights are needed. Pure: the
    choices of every device are tested on CPU.

    - ``"explicit"``: written out (two batched matrix multiplies and a softmax, ``explicit_attention``) in the
      input dtype. Whenever the weights are needed (``return_weights``, ``record_attention``): only this path
      has them. And on CPU in bf16/fp16 with at most ``EXPLICIT_MAX_KEYS`` keys and no mask tensor (the ViT, the
      GPT's causal training pass): there SDPA's fused CPU kernel is several times slower than the written-out
      form, and its math kernel computes in fp32 (slower, and it stores fp32 copies of q, k, v and the weights).
      With longer keys the fused kernel wins.
    - ``"explicit_fp32"``: written out from fp32 copies of q, k and v, on CPU with dropout: SDPA's CPU kernels
      draw dropout masks one Bernoulli sample at a time, the written-out form uses ``nn.dropout``'s fast masks.
      Under autocast (``bf16-mixed``) its two matrix multiplies still run in 16 bits, as autocast casts every
      matmul, and the softmax with them; the fp32 holds for fp32 models and for 16-bit ones without autocast.
    - ``"sdpa_math"``: SDPA held to its math kernel (fp32 inside), on CPU with a mask tensor (the translator's
      padding): the fused kernel's backward is slower at short padded sequences. Masked 16-bit attention stays
      here rather than being written out in 16 bits: the translation results were measured on this path, and
      the 16-bit form was not shown to match them.
    - ``"sdpa"``: everywhere else (GPUs above all), where SDPA picks its own kernel (flash, memory-efficient).
    """
    if need_weights:
        return "explicit"
    if device_type != "cpu":
        return "sdpa"
    if dtype in (torch.bfloat16, torch.float16) and key_len <= EXPLICIT_MAX_KEYS and not masked:
        return "explicit"
    if dropout:
        return "explicit_fp32"
    return "sdpa_math" if masked else "sdpa"


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
