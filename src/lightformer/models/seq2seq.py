"""The encoder-decoder transformer of "Attention Is All You Need", assembled from the shared blocks."""

from __future__ import annotations

from torch import Tensor, nn

from lightformer.nn import (
    Activation,
    Decoder,
    DecoderCache,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    NormKind,
    PositionKind,
    RotaryEmbedding,
    TokenEmbedding,
    absolute_position,
    make_norm,
)
from lightformer.nn.checks import check_heads


class EncoderDecoder(nn.Module):
    """Encoder stack over the source; decoder stack with masked self-attention and cross-attention to the
    encoder's final output; a linear output layer over the target vocabulary.

    Defaults follow the paper: post-norm, sinusoidal positions, embeddings scaled by √d_model, ReLU FFN, and
    the output layer sharing the target embedding's weight. ``share_embeddings`` also shares source and
    target embeddings (a joint vocabulary). Token ``pad_id`` in the source is masked out of attention.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        max_len: int = 256,
        n_encoder_layers: int = 6,
        n_decoder_layers: int = 6,
        d_model: int = 512,
        n_heads: int = 8,
        d_ff: int | None = 2048,
        dropout: float = 0.1,
        attn_dropout: float = 0.0,
        activation: Activation = "relu",
        norm: NormKind = "layernorm",
        norm_first: bool = False,
        position: PositionKind = "sinusoidal",
        share_embeddings: bool = False,
        tie_output: bool = True,
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        check_heads(d_model, n_heads)  # before the rotary table, whose head_dim assumes it
        if share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(
                f"share_embeddings needs one joint vocabulary, but src_vocab_size={src_vocab_size} and "
                f"tgt_vocab_size={tgt_vocab_size}; use a joint vocabulary or share_embeddings=false"
            )
        self.pad_id = pad_id
        self.max_len = max_len
        self.src_embed = TokenEmbedding(src_vocab_size, d_model, scale=True, padding_idx=pad_id)
        self.tgt_embed = self.src_embed if share_embeddings else TokenEmbedding(tgt_vocab_size, d_model, True, pad_id)
        self.position = absolute_position(position, d_model, max_len)
        rotary = RotaryEmbedding(d_model // n_heads, max_len) if position == "rope" else None
        self.dropout = nn.Dropout(dropout)
        layer_args = dict(
            d_model=d_model,
            n_heads=n_heads,
            d_ff=d_ff,
            dropout=dropout,
            attn_dropout=attn_dropout,
            activation=activation,
            norm=norm,
            norm_first=norm_first,
            rotary=rotary,
        )
        self.encoder = Encoder(
            [EncoderLayer(**layer_args) for _ in range(n_encoder_layers)],
            make_norm(norm, d_model) if norm_first else None,
        )
        self.decoder = Decoder(
            [DecoderLayer(**layer_args) for _ in range(n_decoder_layers)],
            make_norm(norm, d_model) if norm_first else None,
        )
        self.output = nn.Linear(d_model, tgt_vocab_size, bias=False)
        self._init_weights()
        if tie_output:
            self.output.weight = self.tgt_embed.weight

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.ndim >= 2 and "embed" not in name:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def _embed(self, embedding: TokenEmbedding, ids: Tensor, offset: int = 0) -> Tensor:
        x = embedding(ids)
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

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher forcing: source ``(batch, src_len)`` and shifted target ``(batch, tgt_len)`` → logits."""
        memory, src_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_mask)

    def incremental_decoder(self, src: Tensor, beam_size: int = 1) -> SourceConditionedDecoder:
        """Encode ``src`` once and return a decoder for ``lightformer.generation`` (rows repeated per beam)."""
        memory, src_mask = self.encode(src)
        if beam_size > 1:
            memory = memory.repeat_interleave(beam_size, dim=0)
            src_mask = src_mask.repeat_interleave(beam_size, dim=0)
        return SourceConditionedDecoder(self, memory, src_mask)


class SourceConditionedDecoder:
    """The decoder bound to one batch of encoded sources: ``decoder(ids, cache) -> logits``."""

    def __init__(self, model: EncoderDecoder, memory: Tensor, src_mask: Tensor) -> None:
        self.model = model
        self.memory = memory
        self.src_mask = src_mask
        self.block_size = model.max_len

    def __call__(self, ids: Tensor, cache: DecoderCache | None = None) -> Tensor:
        return self.model.decode(ids, self.memory, self.src_mask, cache)

    def new_cache(self, max_length: int | None = None) -> DecoderCache:
        return self.model.decoder.new_cache(max_length or self.block_size)
