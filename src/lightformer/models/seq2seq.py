"""The encoder-decoder transformer of "Attention Is All You Need", assembled from the shared blocks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import InitVar, dataclass
from typing import ClassVar, get_args

import torch
from torch import Tensor, nn

from lightformer.generation import ConditionedDecoder
from lightformer.nn import (
    Decoder,
    DecoderCache,
    DecoderLayer,
    Dropout,
    Encoder,
    EncoderLayer,
    LayerConfig,
    PositionKind,
    RotaryEmbedding,
    TokenDropout,
    TokenEmbedding,
    absolute_position,
    make_norm,
)
from lightformer.nn.checks import check_at_least, check_choice, check_fraction, check_set


@dataclass(frozen=True)
class EncoderDecoderConfig(LayerConfig.with_defaults(d_model=512, n_heads=8, d_ff=2048, dropout=0.1, norm_first=False)):
    """The shape of an encoder-decoder transformer: every hyperparameter and its default, declared once.

    Defaults follow the paper's base model: 6 + 6 post-norm layers, d_model 512, 8 heads, d_ff 2048, ReLU,
    dropout 0.1, sinusoidal positions, embeddings scaled by √d_model, one joint vocabulary whose embedding is
    shared by the source, the target and the output layer. The layer's fields are ``nn.LayerConfig``'s, with these
    defaults (no dropout on the attention weights); ``norm_first`` true is pre-norm, more stable for deep or
    short-warm-up training. Every linear layer has its bias (``bias`` and ``qkv_bias`` stay unset).

    Args:
        src_vocab_size: source token ids 0..src_vocab_size-1 (from the data's facts).
        tgt_vocab_size: target token ids (from the data's facts).
        pad_id: the padding id, masked out of attention (from the data's facts).
        max_len: the longest source or target sequence, the size of the position table.
        n_encoder_layers: encoder layers.
        n_decoder_layers: decoder layers.
        token_dropout: in training, the embedding of each source and target-input token is zeroed with this
            probability (word dropout, a regulariser for small corpora; ``nn.TokenDropout``).
        position: how positions are given (``nn.PositionKind``); the paper's are "sinusoidal".
        share_embeddings: one embedding for source and target (needs a joint vocabulary).
        tie_weights: the output layer shares the target embedding's weight (as ``GPTConfig.tie_weights``).
        tie_output: the former name of ``tie_weights``, read from the hyperparameters of checkpoints saved before
            the rename; not stored. Give ``tie_weights``.
    """

    src_vocab_size: int | None = None
    tgt_vocab_size: int | None = None
    pad_id: int = 0
    max_len: int = 256
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    token_dropout: float = 0.0
    position: PositionKind = "sinusoidal"
    share_embeddings: bool = True
    tie_weights: bool = True
    tie_output: InitVar[bool | None] = None
    supported: ClassVar[Mapping[str, tuple]] = {
        "bias": (True,),
        "qkv_bias": (None,),
        "n_kv_heads": (None,),
        "sliding_window": (None,),
    }

    def __post_init__(self, tie_output: bool | None) -> None:
        if tie_output is not None and tie_output != self.tie_weights:
            if not self.tie_weights:
                raise ValueError(
                    f"tie_output={tie_output} (the former name of tie_weights) contradicts tie_weights=False; "
                    "give tie_weights only"
                )
            object.__setattr__(self, "tie_weights", tie_output)
        super().__post_init__()
        check_at_least("src_vocab_size", self.src_vocab_size, 1)
        check_at_least("tgt_vocab_size", self.tgt_vocab_size, 1)
        check_at_least("pad_id", self.pad_id, 0)
        check_at_least("max_len", self.max_len, 2)
        check_at_least("n_encoder_layers", self.n_encoder_layers, 1)
        check_at_least("n_decoder_layers", self.n_decoder_layers, 1)
        check_fraction("token_dropout", self.token_dropout)
        check_choice("position", self.position, get_args(PositionKind))
        sizes = (self.src_vocab_size, self.tgt_vocab_size)
        if self.share_embeddings and None not in sizes and sizes[0] != sizes[1]:
            raise ValueError(
                f"share_embeddings needs one joint vocabulary, but src_vocab_size={sizes[0]} and "
                f"tgt_vocab_size={sizes[1]}; use a joint vocabulary (the data's joint_vocab) or share_embeddings=false"
            )


class EncoderDecoder(nn.Module):
    """Encoder stack over the source; decoder stack with masked self-attention and cross-attention to the
    encoder's final output; a linear output layer over the target vocabulary. Token ``pad_id`` in the source
    is masked out of attention.
    """

    layer_stacks = ("encoder", "decoder")  # its units' stacks: lightformer.training.distributed

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        c = config
        check_set(c, "src_vocab_size", "tgt_vocab_size")
        self.config = config
        self.pad_id = c.pad_id
        self.max_len = c.max_len
        self.src_embed = TokenEmbedding(c.src_vocab_size, c.d_model, scale=True, padding_idx=c.pad_id)
        self.tgt_embed = (
            self.src_embed
            if c.share_embeddings
            else TokenEmbedding(c.tgt_vocab_size, c.d_model, scale=True, padding_idx=c.pad_id)
        )
        self.position = absolute_position(c.position, c.d_model, c.max_len)
        rotary = RotaryEmbedding(c.d_model // c.n_heads, c.max_len) if c.position == "rope" else None
        self.dropout = Dropout(c.dropout)
        self.token_dropout = TokenDropout(c.token_dropout)
        args = dict(c.layer_args(), rotary=rotary)
        final_norm = (lambda: make_norm(c.norm, c.d_model, c.norm_eps)) if c.norm_first else (lambda: None)
        self.encoder = Encoder([EncoderLayer(**args) for _ in range(c.n_encoder_layers)], final_norm())
        self.decoder = Decoder([DecoderLayer(**args) for _ in range(c.n_decoder_layers)], final_norm())
        self.output = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        self._init_weights()
        if c.tie_weights:
            self.output.weight = self.tgt_embed.weight

    def _init_weights(self) -> None:
        """Xavier-uniform matrices (but the embeddings), zero biases. A cross-attention's input projections are
        initialised as one ``(3·d_model, d_model)`` matrix, as ``torch.nn.MultiheadAttention`` does its
        ``in_proj_weight``."""
        for name, p in self.named_parameters():
            if name.endswith("cross_attn.q.weight"):
                with torch.no_grad():
                    packed = nn.init.xavier_uniform_(p.new_empty(3 * p.shape[1], p.shape[1]))
                    kv = self.get_parameter(name.removesuffix("q.weight") + "kv.weight")
                    p.copy_(packed[: p.shape[0]])
                    kv.copy_(packed[p.shape[0] :])
            elif name.endswith("cross_attn.kv.weight"):
                continue  # with its q above
            elif p.ndim >= 2 and "embed" not in name:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def _embed(self, embedding: TokenEmbedding, ids: Tensor, offset: int = 0) -> Tensor:
        x = self.token_dropout(embedding(ids))
        if self.position is not None:
            x = self.position(x, offset)
        return self.dropout(x)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Source ids ``(batch, src_len)`` → memory ``(batch, src_len, d_model)`` and its key mask (True = real)."""
        src_mask = src != self.pad_id
        return self.encoder(self._embed(self.src_embed, src), key_mask=src_mask), src_mask

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor, cache: DecoderCache | None = None) -> Tensor:
        """Target ids ``(batch, tgt_len)`` (continuing ``cache``) → logits ``(batch, tgt_len, tgt_vocab_size)``."""
        offset = cache.length if cache is not None else 0
        x = self._embed(self.tgt_embed, tgt, offset)
        x = self.decoder(x, memory, memory_key_mask=src_mask, cache=cache)
        return self.output(x)

    def forward(
        self, src: Tensor, tgt_in: Tensor, encoder_positions: Tensor | None = None
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Teacher forcing: source ``(batch, src_len)`` and shifted target ``(batch, tgt_len)`` → logits. With
        ``encoder_positions``, a bool mask ``(batch, src_len)``, also the output layer's logits of the encoder's
        output at those positions ``(n, tgt_vocab_size)`` (an auxiliary encoder loss; computed in this forward so
        that a sharded model's weights are gathered for it)."""
        memory, src_mask = self.encode(src)
        logits = self.decode(tgt_in, memory, src_mask)
        return logits if encoder_positions is None else (logits, self.output(memory[encoder_positions]))

    def incremental_decoder(self, src: Tensor, beam_size: int = 1) -> ConditionedDecoder:
        """Encode ``src`` once and return a decoder for ``lightformer.generation`` (rows repeated per beam)."""
        memory, src_mask = self.encode(src)
        if beam_size > 1:
            memory = memory.repeat_interleave(beam_size, dim=0)
            src_mask = src_mask.repeat_interleave(beam_size, dim=0)
        return ConditionedDecoder(
            lambda ids, cache: self.decode(ids, memory, src_mask, cache), self.decoder.new_cache, self.max_len
        )
