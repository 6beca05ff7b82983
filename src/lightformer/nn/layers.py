"""Encoder and decoder layers, and stacks of them.

Each sublayer (attention or feed-forward) sits in a residual connection, in one of two placements:

- post-norm (the paper): ``x = norm(x + dropout(sublayer(x)))``; the stack needs no final norm.
- pre-norm (GPT-2, ViT): ``x = x + dropout(sublayer(norm(x)))``; the stack ends with a final norm.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from timm.layers import DropPath
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from lightformer.nn.attention import KVCache, MultiHeadAttention
from lightformer.nn.dropout import Dropout
from lightformer.nn.feedforward import Activation, FeedForward
from lightformer.nn.norm import NormKind, make_norm
from lightformer.nn.position import RotaryEmbedding


class _ResidualLayer(nn.Module):
    """What the encoder and decoder layers share: self-attention (and, with ``cross_attention``, attention to an
    encoder's output) then a feed-forward network, each in a residual connection with dropout and stochastic depth
    on its output, pre- or post-norm. A model's config gives the arguments (``nn.LayerConfig.layer_args``).

    ``bias``: biases in every linear layer and LayerNorm of the layer; ``qkv_bias`` (default: ``bias``) overrides it
    for the attention's input projections alone; ``n_kv_heads``, ``sliding_window``: grouped-query, windowed causal
    self-attention (``MultiHeadAttention``).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        dropout: float = 0.1,
        attn_dropout: float = 0.0,
        activation: Activation = "relu",
        norm: NormKind = "layernorm",
        norm_first: bool = True,
        norm_eps: float = 1e-5,
        bias: bool = True,
        drop_path: float = 0.0,
        rotary: RotaryEmbedding | None = None,
        qkv_bias: bool | None = None,
        cross_attention: bool = False,
        n_kv_heads: int | None = None,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.dropout = Dropout(dropout)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm1 = make_norm(norm, d_model, norm_eps, bias)
        self.self_attn = MultiHeadAttention(
            d_model, n_heads, attn_dropout, bias, rotary, qkv_bias, n_kv_heads=n_kv_heads, sliding_window=sliding_window
        )
        if cross_attention:
            self.norm_cross = make_norm(norm, d_model, norm_eps, bias)
            self.cross_attn = MultiHeadAttention(
                d_model, n_heads, attn_dropout, bias, qkv_bias=qkv_bias, cross_attention=True
            )
        else:
            self.norm_cross = self.cross_attn = None
        self.norm2 = make_norm(norm, d_model, norm_eps, bias)
        self.ffn = FeedForward(d_model, d_ff, activation, bias)

    def residual(self, x: Tensor, norm: nn.Module, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.norm_first:
            return x + self.drop_path(self.dropout(sublayer(norm(x))))
        return norm(x + self.drop_path(self.dropout(sublayer(x))))


class EncoderLayer(_ResidualLayer):
    """Self-attention (bidirectional by default) followed by a feed-forward network; arguments as
    ``_ResidualLayer``'s (an encoder layer has no cross-attention)."""

    def forward(self, x: Tensor, key_mask: Tensor | None = None, causal: bool = False) -> Tensor:
        """``(batch, seq, d_model)`` → same; ``key_mask`` ``(batch, seq)`` is True at real tokens."""
        x = self.residual(x, self.norm1, lambda h: self.self_attn(h, key_mask=key_mask, causal=causal))
        return self.residual(x, self.norm2, self.ffn)


class DecoderLayer(_ResidualLayer):
    """Masked (causal) self-attention, cross-attention to the encoder output, then a feed-forward network.

    Arguments as ``_ResidualLayer``'s; with ``cross_attention=False`` it is the block of a decoder-only model (GPT).
    """

    def __init__(self, *args: Any, cross_attention: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, cross_attention=cross_attention, **kwargs)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        key_mask: Tensor | None = None,
        memory_key_mask: Tensor | None = None,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
        attn_mask: Tensor | None = None,
    ) -> Tensor:
        """Target ``x`` ``(batch, tgt_len, d_model)`` attends causally to itself, then to the encoder's ``memory``.

        ``memory`` is ``(batch, src_len, d_model)``. ``key_mask`` ``(batch, cached + tgt_len)`` and
        ``memory_key_mask`` ``(batch, src_len)`` are True at real tokens. ``attn_mask`` ``(batch, 1, tgt_len, cached +
        tgt_len)`` (True: may attend) replaces the causal mask (an image prefix that attends both ways).
        """
        causal = attn_mask is None
        x = self.residual(
            x,
            self.norm1,
            lambda h: self.self_attn(h, key_mask=key_mask, attn_mask=attn_mask, causal=causal, cache=self_cache),
        )
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("this decoder layer has cross-attention: pass the encoder output as `memory`")
            x = self.residual(
                x,
                self.norm_cross,
                lambda h: self.cross_attn(h, memory, key_mask=memory_key_mask, cache=cross_cache),
            )
        return self.residual(x, self.norm2, self.ffn)


class Encoder(nn.Module):
    """A stack of encoder layers, with the final norm that pre-norm stacks need (``final_norm``).

    With ``activation_checkpointing`` set, training recomputes each layer's activations in the backward pass
    instead of storing them (``torch.utils.checkpoint``, dropout replayed with the same random numbers).
    """

    def __init__(self, layers: Iterable[EncoderLayer], final_norm: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = final_norm if final_norm is not None else nn.Identity()
        self.activation_checkpointing = False

    def forward(
        self, x: Tensor, key_mask: Tensor | None = None, causal: bool = False, depth: int | None = None
    ) -> Tensor:
        """With ``depth``, only the first ``depth`` layers, and no final norm: the residual stream there."""
        for layer in self.layers[:depth]:
            if self.activation_checkpointing and self.training:
                x = checkpoint(layer, x, key_mask=key_mask, causal=causal, use_reentrant=False)
            else:
                x = layer(x, key_mask=key_mask, causal=causal)
        return x if depth is not None else self.norm(x)


class DecoderCache:
    """Per-layer KV caches of a decoder: self-attention keys grow each step, cross-attention keys are fixed."""

    def __init__(self, n_layers: int, max_length: int | None = None) -> None:
        self.self_attn = [KVCache(max_length) for _ in range(n_layers)]
        self.cross_attn = [KVCache() for _ in range(n_layers)]

    @property
    def length(self) -> int:
        """Number of target positions already decoded."""
        return self.self_attn[0].length

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search): row i becomes old row ``index[i]``."""
        for cache in self.self_attn + self.cross_attn:
            cache.reorder(index)


class Decoder(nn.Module):
    """A stack of decoder layers, with the final norm that pre-norm stacks need (``final_norm``).

    ``activation_checkpointing`` as in ``Encoder`` (never with a cache: incremental decoding stores nothing).
    """

    def __init__(self, layers: Iterable[DecoderLayer], final_norm: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = final_norm if final_norm is not None else nn.Identity()
        self.activation_checkpointing = False

    def new_cache(self, max_length: int | None = None) -> DecoderCache:
        return DecoderCache(len(self.layers), max_length)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        key_mask: Tensor | None = None,
        memory_key_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        attn_mask: Tensor | None = None,
    ) -> Tensor:
        """``attn_mask``: as ``DecoderLayer``'s, for every layer (None: causal)."""
        for i, layer in enumerate(self.layers):
            if self.activation_checkpointing and self.training and cache is None:
                x = checkpoint(
                    layer,
                    x,
                    memory,
                    key_mask=key_mask,
                    memory_key_mask=memory_key_mask,
                    attn_mask=attn_mask,
                    use_reentrant=False,
                )
                continue
            x = layer(
                x,
                memory,
                key_mask=key_mask,
                memory_key_mask=memory_key_mask,
                self_cache=cache.self_attn[i] if cache is not None else None,
                cross_cache=cache.cross_attn[i] if cache is not None else None,
                attn_mask=attn_mask,
            )
        return self.norm(x)
