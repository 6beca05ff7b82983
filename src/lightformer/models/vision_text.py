"""Image to text (TrOCR, image captioning): a ViT's patch encoder feeding a GPT decoder's cross-attention.

Images → ``VisionTransformer`` patch tokens (rectangular images and patches: a text line is 32 pixels high and
hundreds wide) → a linear map to the decoder's width where the two differ → ``GPT`` with ``cross_attention``: each
block attends causally to the text so far, then to every patch, then its feed-forward network. The same blocks as
every other model: no layer is copied. A lightformer ViT checkpoint's weights load into ``encoder.*`` and a GPT's
into ``decoder.*`` by their names (TrOCR starts its decoder from a language model); the cross-attention starts
fresh.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from lightformer.generation import ConditionedDecoder
from lightformer.models.gpt import GPT, GPTConfig
from lightformer.models.vit import VisionTransformer, ViTConfig, ViTPosition
from lightformer.nn import Activation, NormKind, PositionKind
from lightformer.nn.checks import check_at_least, check_set, lists_as_pairs


@dataclass(frozen=True)
class VisionEncoderDecoderConfig:
    """The shape of an image-to-text model: the encoder's fields, then the decoder's, each default declared once.

    Args:
        image_size: (height, width) of the images, or a square's side (from the data's facts).
        in_channels: image channels, 1 grey or 3 colour (from the data's facts).
        patch_size: (height, width) of the patches, or a square's side. A text line reads best in patches as tall
            as the line and a few pixels wide: each patch is then a slice of a character or two.
        encoder_layers: the ViT's layers.
        encoder_d_model: the ViT's token width; None: ``d_model``. Where it differs from ``d_model``, a linear map
            takes the patches to the decoder's width.
        encoder_heads: the ViT's attention heads; None: ``n_heads``.
        encoder_position: the patches' positions, "learned" or fixed 2-D "sincos" (``ViTConfig.position``).
        vocab_size: the text tokenizer's size (from the data's facts).
        max_len: the longest text in tokens, BOS and EOS included: the decoder's position table (from the data).
        decoder_layers: the GPT's blocks.
        d_model: the decoder's width.
        n_heads: the decoder's attention heads (self and cross).
        d_ff: hidden width of every feed-forward network; None: 4·width.
        dropout: dropout on the embeddings, the attention weights and each sublayer's output, in both stacks.
        position: the decoder's positions (``GPTConfig.position``).
        activation: feed-forward activation of both stacks (``nn.Activation``).
        norm: the norm layers of both stacks (``nn.NormKind``).
        tie_weights: the decoder's output layer shares its token embedding's weight.
        ctc_head: a linear layer from each patch to the vocabulary, for a CTC loss on the encoder beside the
            decoder's (joint CTC-attention training, Kim, Hori and Watanabe 2017): it teaches the encoder to tell
            the characters apart, in reading order, long before the decoder's cross-attention has learnt where to
            look. A line needs at least as many patches across as it has characters (and repeats).
    """

    image_size: int | tuple[int, int] | None = None
    in_channels: int = 1
    patch_size: int | tuple[int, int] = (32, 4)
    encoder_layers: int = 4
    encoder_d_model: int | None = None
    encoder_heads: int | None = None
    encoder_position: ViTPosition = "learned"
    vocab_size: int | None = None
    max_len: int = 64
    decoder_layers: int = 4
    d_model: int = 192
    n_heads: int = 4
    d_ff: int | None = None
    dropout: float = 0.0
    position: PositionKind = "learned"
    activation: Activation = "gelu"
    norm: NormKind = "layernorm"
    tie_weights: bool = True
    ctc_head: bool = False

    def __post_init__(self) -> None:
        lists_as_pairs(self, "image_size", "patch_size")
        check_at_least("encoder_layers", self.encoder_layers, 1)
        check_at_least("decoder_layers", self.decoder_layers, 1)
        check_at_least("max_len", self.max_len, 2)
        for stack, config in (("encoder", self.encoder_config), ("decoder", self.decoder_config)):
            try:  # the rest of the checks, by the stacks' own configs
                config()
            except ValueError as error:
                raise ValueError(f"the {stack}: {error}") from None

    def encoder_config(self) -> ViTConfig:
        """The ViT's shape: no head (``num_classes`` 0), no class token (``pool`` "mean": every patch is memory)."""
        return ViTConfig(
            image_size=self.image_size,
            in_channels=self.in_channels,
            num_classes=0,
            patch_size=self.patch_size,
            d_model=self.encoder_d_model or self.d_model,
            n_layers=self.encoder_layers,
            n_heads=self.encoder_heads or self.n_heads,
            d_ff=self.d_ff,
            dropout=self.dropout,
            attn_dropout=self.dropout,
            pool="mean",
            position=self.encoder_position,
            norm=self.norm,
            activation=self.activation,
        )

    def decoder_config(self) -> GPTConfig:
        """The GPT's shape (built with cross-attention to the patches)."""
        return GPTConfig(
            vocab_size=self.vocab_size,
            block_size=self.max_len,
            n_layers=self.decoder_layers,
            n_heads=self.n_heads,
            d_model=self.d_model,
            d_ff=self.d_ff,
            dropout=self.dropout,
            position=self.position,
            activation=self.activation,
            norm=self.norm,
            tie_weights=self.tie_weights,
        )


class VisionEncoderDecoder(nn.Module):
    """Images ``(batch, C, H, W)`` and target ids ``(batch, T)`` → next-token logits ``(batch, T, vocab_size)``."""

    layer_stacks = ("encoder.encoder", "decoder.decoder")  # its units' stacks: lightformer.distributed

    def __init__(self, config: VisionEncoderDecoderConfig) -> None:
        super().__init__()
        check_set(config, "image_size", "vocab_size")
        self.config = config
        self.encoder = VisionTransformer(config.encoder_config())
        width = self.encoder.d_model
        self.encoder_to_decoder = nn.Linear(width, config.d_model) if width != config.d_model else nn.Identity()
        self.decoder = GPT(config.decoder_config(), cross_attention=True)
        self.ctc_head = nn.Linear(config.d_model, config.vocab_size) if config.ctc_head else None
        self.block_size = config.max_len

    def encode(self, images: Tensor) -> Tensor:
        """Images → memory ``(batch, patches, d_model)``: the encoder's patch tokens, normalised, at the decoder's
        width."""
        return self.encoder_to_decoder(self.encoder.fc_norm(self.encoder.forward_features(images)))

    def forward(self, images: Tensor, tgt_in: Tensor, ctc: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Teacher forcing: images and the shifted target ``(batch, T)`` (BOS first) → logits ``(batch, T, vocab)``.
        With ``ctc``, also the CTC head's logits of every patch ``(batch, patches, vocab)`` (computed in this forward
        so that a sharded model's weights are gathered for it)."""
        memory = self.encode(images)
        logits = self.decoder(tgt_in, memory=memory)
        if not ctc:
            return logits
        if self.ctc_head is None:
            raise ValueError("this model has no CTC head: build it with ctc_head=true")
        return logits, self.ctc_head(memory)

    def incremental_decoder(self, images: Tensor, beam_size: int = 1) -> ConditionedDecoder:
        """Encode ``images`` once and return a decoder for ``lightformer.generation`` (rows repeated per beam)."""
        memory = self.encode(images)
        memory = memory.repeat_interleave(beam_size, dim=0) if beam_size > 1 else memory
        return ConditionedDecoder(
            lambda ids, cache: self.decoder(ids, cache, memory=memory), self.decoder.new_cache, self.block_size
        )
