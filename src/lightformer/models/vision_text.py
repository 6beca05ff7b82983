"""Image to text (TrOCR, image captioning): a ViT's patch encoder feeding a GPT decoder's cross-attention.

Images → ``VisionTransformer`` patch tokens (rectangular images and patches: a text line is 32 pixels high and
hundreds wide) → a linear map to the decoder's width where the two differ → ``GPT`` with ``cross_attention``: each
block attends causally to the text so far, then to every patch, then its feed-forward network. The same blocks as
every other model: no layer is copied. A lightformer ViT checkpoint's weights load into ``encoder.*`` and a GPT's
into ``decoder.*`` by their names (TrOCR starts its decoder from a language model); the cross-attention starts
fresh.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from torch import Tensor, nn

from lightformer.generation import ConditionedDecoder
from lightformer.models.gpt import GPT, GPTConfig
from lightformer.models.vit import VisionTransformer, ViTConfig
from lightformer.nn.checks import check_at_least, check_set

# The towers of ``VisionEncoderDecoderConfig()``: a ViT over grey text lines in patches a line high and 4 pixels
# wide, and a GPT of the same width with a 64-token position table. A tower given as a dict changes these.
ENCODER_DEFAULTS = dict(
    in_channels=1, patch_size=(32, 4), d_model=192, n_layers=4, n_heads=4, num_classes=0, pool="mean"
)
DECODER_DEFAULTS = dict(block_size=64, d_model=192, n_layers=4, n_heads=4)

# The flat fields of this config up to commit b1bd12e → their places in the towers (``from_saved``).
FLAT_FIELDS = {
    "image_size": ("encoder.image_size",),
    "in_channels": ("encoder.in_channels",),
    "patch_size": ("encoder.patch_size",),
    "encoder_layers": ("encoder.n_layers",),
    "encoder_d_model": ("encoder.d_model",),
    "encoder_heads": ("encoder.n_heads",),
    "encoder_position": ("encoder.position",),
    "vocab_size": ("decoder.vocab_size",),
    "max_len": ("decoder.block_size",),
    "decoder_layers": ("decoder.n_layers",),
    "d_model": ("decoder.d_model", "encoder.d_model"),
    "n_heads": ("decoder.n_heads", "encoder.n_heads"),
    "d_ff": ("encoder.d_ff", "decoder.d_ff"),
    "dropout": ("encoder.dropout", "encoder.attn_dropout", "decoder.dropout"),
    "position": ("decoder.position",),
    "activation": ("encoder.activation", "decoder.activation"),
    "norm": ("encoder.norm", "decoder.norm"),
    "tie_weights": ("decoder.tie_weights",),
}


def tower_config(config_class: type, given: Any, defaults: dict[str, Any]) -> Any:
    """A two-tower config's tower (image to text's, the contrastive model's): ``given`` as it is, or a mapping of
    fields (a checkpoint's, a config file's) over ``defaults``; ValueError otherwise."""
    if isinstance(given, config_class):
        return given
    values = vars(given) if isinstance(given, Namespace) else given
    if not isinstance(values, Mapping):
        raise ValueError(f"give a {config_class.__name__} or a mapping of its fields, not {given!r}")
    try:
        return config_class(**{**defaults, **values})
    except TypeError as error:  # a field the tower does not have
        raise ValueError(str(error)) from None


def build_towers(
    config: Any, towers: dict[str, tuple[type, dict]], what: str, label: str = "the {} tower", **image_fields: Any
) -> None:
    """Set each tower of a frozen two-tower ``config`` (its field → the tower's config class and defaults) as
    ``tower_config`` builds it (a ValueError names the tower: ``label``), the first (the ViT) without a classifier
    head: a ``num_classes`` given is refused, naming ``what`` the model is; ``image_fields`` are set on it too."""
    for name, (config_class, defaults) in towers.items():
        try:
            tower = tower_config(config_class, getattr(config, name), defaults)
        except ValueError as error:
            raise ValueError(f"{label.format(name)}: {error}") from None
        object.__setattr__(config, name, tower)
    name = next(iter(towers))
    image = getattr(config, name)
    if image.num_classes not in (None, 0):
        noun = "image tower" if name == "image" else name
        raise ValueError(f"{name}.num_classes={image.num_classes}: the {noun} of {what} has no classifier head; leave "
                         f"{name}.num_classes out (or 0)")  # fmt: skip
    object.__setattr__(config, name, replace(image, num_classes=0, **image_fields))


@dataclass(frozen=True)
class VisionEncoderDecoderConfig:
    """The shape of an image-to-text model: its two towers' configs whole, as Hugging Face's
    ``VisionEncoderDecoderConfig`` holds them, each free in width, heads, layers, norm, dropout and feed-forward width.

    Args:
        encoder: the ViT's shape (``ViTConfig``): its ``image_size`` and ``in_channels`` come from the data's facts.
            A text line reads best in patches (``patch_size``) as tall as the line and a few pixels wide: each patch
            is then a slice of a character or two. The joined model decides two fields: no head (``num_classes``
            0) and no class token (``pool`` "mean": every patch is memory of the decoder); where the encoder's width
            differs from the decoder's, a linear map takes the patches to the decoder's width.
        decoder: the GPT's shape (``GPTConfig``), built with cross-attention to the patches: its ``vocab_size``
            comes from the data's tokenizer; ``block_size`` is the longest text in tokens, BOS and EOS included.
        ctc_head: a linear layer from each patch to the vocabulary, for a CTC loss on the encoder beside the
            decoder's (joint CTC-attention training, Kim, Hori and Watanabe 2017): it teaches the encoder to tell
            the characters apart, in reading order, long before the decoder's cross-attention has learnt where to
            look. A line needs at least as many patches across as it has characters (and repeats).
    """

    encoder: ViTConfig = field(default_factory=lambda: ViTConfig(**ENCODER_DEFAULTS))
    decoder: GPTConfig = field(default_factory=lambda: GPTConfig(**DECODER_DEFAULTS))
    ctc_head: bool = False
    # The fields it had up to commit b1bd12e (flat) → their places now: a config that gives one is refused, naming it.
    RENAMED: ClassVar[dict[str, tuple[str, ...]]] = FLAT_FIELDS

    def __post_init__(self) -> None:
        towers = {"encoder": (ViTConfig, ENCODER_DEFAULTS), "decoder": (GPTConfig, DECODER_DEFAULTS)}
        build_towers(self, towers, "an image-to-text model", "the {}", pool="mean")
        check_at_least("decoder.block_size", self.decoder.block_size, 2)

    @classmethod
    def from_saved(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """The fields of this config from ``values`` saved by commit b1bd12e or before (a checkpoint's
        ``hyper_parameters["net"]``), when the config was one flat list of both towers' fields (``FLAT_FIELDS``);
        ``values`` as they are when they hold none of those."""
        values = dict(values)
        if not set(values) & set(FLAT_FIELDS) or "encoder" in values or "decoder" in values:
            return values
        get = values.get
        encoder = dict(
            image_size=get("image_size"),
            in_channels=get("in_channels", 1),
            patch_size=get("patch_size", (32, 4)),
            n_layers=get("encoder_layers", 4),
            d_model=get("encoder_d_model") or get("d_model", 192),
            n_heads=get("encoder_heads") or get("n_heads", 4),
            position=get("encoder_position", "learned"),
            d_ff=get("d_ff"),
            dropout=get("dropout", 0.0),
            attn_dropout=get("dropout", 0.0),
            activation=get("activation", "gelu"),
            norm=get("norm", "layernorm"),
        )
        decoder = dict(
            vocab_size=get("vocab_size"),
            block_size=get("max_len", 64),
            n_layers=get("decoder_layers", 4),
            d_model=get("d_model", 192),
            n_heads=get("n_heads", 4),
            d_ff=get("d_ff"),
            dropout=get("dropout", 0.0),
            position=get("position", "learned"),
            activation=get("activation", "gelu"),
            norm=get("norm", "layernorm"),
            tie_weights=get("tie_weights", True),
        )
        return dict(encoder=encoder, decoder=decoder, ctc_head=get("ctc_head", False))


class VisionEncoderDecoder(nn.Module):
    """Images ``(batch, C, H, W)`` and target ids ``(batch, T)`` → next-token logits ``(batch, T, vocab_size)``."""

    layer_stacks = ("encoder.encoder", "decoder.decoder")  # its units' stacks: lightformer.training.distributed

    def __init__(self, config: VisionEncoderDecoderConfig) -> None:
        super().__init__()
        check_set(config.encoder, "image_size")
        check_set(config.decoder, "vocab_size")
        self.config = config
        self.encoder = VisionTransformer(config.encoder)
        width, d_model = config.encoder.d_model, config.decoder.d_model
        self.encoder_to_decoder = nn.Linear(width, d_model) if width != d_model else nn.Identity()
        self.decoder = GPT(config.decoder, cross_attention=True)
        self.ctc_head = nn.Linear(d_model, config.decoder.vocab_size) if config.ctc_head else None
        self.block_size = config.decoder.block_size

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
