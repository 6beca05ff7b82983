"""A contrastive dual encoder (CLIP, Radford et al. 2021; SigLIP, Zhai et al. 2023): an image tower and a text tower,
each projected to one embedding width, trained so that an image and its caption agree.

    images ──ViT──> pooled (class token, mean, attention) ──image_projection────────┐
                                                                                    ├─> unit vectors (batch, embed_dim)
    [BOS] ids [EOS] PAD… ──GPT──> EOS token's features (or mean) ──text_projection──┘
    similarities · exp(logit_scale) (+ logit_bias, SigLIP's) = the logits of every image against every text

The towers are the models of the other tasks, whole: the image tower a ``VisionTransformer`` (no head), the text tower
a ``GPT`` (its features, not its LM head), so a lightformer ViT or GPT checkpoint starts either tower by its names
(``model.init.modules``). As in CLIP, the text's features are the last block's (after the final norm) at its end
token: under causal attention that token has read the whole text, and what follows it (padding) changes nothing.
With ``text_pool`` "mean" the text tower is bidirectional instead (every token attends to every real token, the
padding hidden by the attention's key mask), and its features are the mean over the caption's real tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightformer.models.gpt import GPT, GPTConfig
from lightformer.models.vision_text import build_towers
from lightformer.models.vit import VisionTransformer, ViTConfig
from lightformer.nn.checks import check_at_least, check_choice, check_set

ContrastiveLoss = Literal["infonce", "sigmoid"]
TextPool = Literal["eos", "mean"]

# The towers of ``ContrastiveConfig()``: a small ViT over RGB images in 8-pixel patches, pre-norm with a class token
# as CLIP's (so the model exports to transformers' CLIPModel), and a GPT of the same width over captions of up to 64
# tokens. A tower given as a mapping changes these.
IMAGE_DEFAULTS = dict(
    in_channels=3, patch_size=8, d_model=192, n_layers=4, n_heads=3, num_classes=0, pool="cls", pre_norm=True
)
TEXT_DEFAULTS = dict(block_size=64, d_model=192, n_layers=4, n_heads=3)
# Where each loss's learnable temperature and bias start (CLIP: a temperature of 0.07; SigLIP: t' = log 10, b = -10)
# and the largest scale CLIP lets the temperature reach (100).
START = {"infonce": (math.log(1 / 0.07), None), "sigmoid": (math.log(10.0), -10.0)}
MAX_LOGIT_SCALE = math.log(100.0)


@dataclass(frozen=True)
class ContrastiveConfig:
    """The shape of a contrastive image-text model: its two towers' configs whole, and the embedding they share.

    Args:
        image: the image tower's shape (``ViTConfig``): its ``image_size`` and ``in_channels`` come from the data's
            facts; it has no classifier head (``num_classes`` 0): its pooled features (``pool``: "cls", CLIP's class
            token, "mean", or "map", SigLIP's attention pooling) are projected; ``pre_norm`` as CLIP's.
        text: the text tower's shape (``GPTConfig``, causal as CLIP's): ``vocab_size`` comes from the data's
            tokenizer, ``block_size`` is the longest caption in tokens (BOS and EOS included); its LM head is not used
            (``tie_weights`` true: it is the token embedding).
        embed_dim: the width both towers are projected to, where images and texts are compared.
        loss: "infonce", CLIP's symmetric cross-entropy over the batch, with a learnable temperature starting at 0.07;
            "sigmoid", SigLIP's pairwise sigmoid loss, with a learnable temperature (starting at 1/10) and bias
            (starting at -10). The temperature's scale is clamped at 100, as CLIP's.
        pad_id: the id that pads a caption (from the data's facts): a text's features are those of its last token that
            is not padding, its end token.
        text_pool: "eos", CLIP's: the text tower is causal and a text's features are its end token's; "mean": the
            text tower is bidirectional (``GPT(causal=False)``, padding hidden from attention) and a text's features
            are the mean over its tokens that are not padding (BOS and EOS included).
    """

    image: ViTConfig = field(default_factory=lambda: ViTConfig(**IMAGE_DEFAULTS))
    text: GPTConfig = field(default_factory=lambda: GPTConfig(**TEXT_DEFAULTS))
    embed_dim: int = 128
    loss: ContrastiveLoss = "infonce"
    pad_id: int | None = None
    text_pool: TextPool = "eos"

    def __post_init__(self) -> None:
        towers = {"image": (ViTConfig, IMAGE_DEFAULTS), "text": (GPTConfig, TEXT_DEFAULTS)}
        build_towers(self, towers, "a contrastive model")
        if not self.text.tie_weights:
            raise ValueError(
                "text.tie_weights=false: the text tower of a contrastive model uses no LM head, so its head must be "
                "the token embedding (tie_weights true), or it would be a parameter that is never trained"
            )
        check_at_least("embed_dim", self.embed_dim, 1)
        check_choice("loss", self.loss, get_args(ContrastiveLoss))
        check_at_least("pad_id", self.pad_id, 0)
        check_choice("text_pool", self.text_pool, get_args(TextPool))


class ContrastiveModel(nn.Module):
    """Images ``(batch, C, H, W)`` and captions ``(batch, T)`` → their unit embeddings ``(batch, embed_dim)`` each;
    ``logits`` compares them."""

    layer_stacks = ("image.encoder", "text.decoder")  # its units' stacks: lightformer.training.distributed

    def __init__(self, config: ContrastiveConfig) -> None:
        super().__init__()
        check_set(config.image, "image_size")
        check_set(config.text, "vocab_size")
        check_set(config, "pad_id")
        self.config = config
        self.image = VisionTransformer(config.image)
        self.text = GPT(config.text, causal=config.text_pool == "eos")
        self.image_projection = nn.Linear(config.image.d_model, config.embed_dim, bias=False)
        self.text_projection = nn.Linear(config.text.d_model, config.embed_dim, bias=False)
        for projection in (self.image_projection, self.text_projection):  # CLIP's: N(0, width^-1/2)
            nn.init.normal_(projection.weight, std=projection.in_features**-0.5)
        scale, bias = START[config.loss]
        self.logit_scale = nn.Parameter(torch.tensor(scale))
        self.logit_bias = nn.Parameter(torch.tensor(bias)) if bias is not None else None
        self.block_size = config.text.block_size

    def encode_image(self, images: Tensor) -> Tensor:
        """Images → unit embeddings ``(batch, embed_dim)``."""
        return F.normalize(self.image_projection(self.image(images)), dim=-1)

    def encode_text(self, ids: Tensor) -> Tensor:
        """Captions ``(batch, T)`` ([BOS] ids [EOS], padded with ``pad_id``) → unit embeddings ``(batch, embed_dim)``:
        the features of each caption's last token that is not padding, or their mean over those tokens
        (``text_pool``)."""
        real = ids != self.config.pad_id
        if self.config.text_pool == "mean":
            features = self.text.features(ids, key_mask=real)
            weights = real.unsqueeze(-1).to(features.dtype)
            pooled = (features * weights).sum(1) / weights.sum(1).clamp(min=1)
        else:
            features = self.text.features(ids)
            last = real.sum(1).clamp(min=1) - 1
            pooled = features[torch.arange(len(ids), device=ids.device), last]
        return F.normalize(self.text_projection(pooled), dim=-1)

    def scale(self) -> Tensor:
        """The logits' scale, exp(logit_scale), clamped at CLIP's 100."""
        return self.logit_scale.clamp(max=MAX_LOGIT_SCALE).exp()

    def logits(self, image_embeddings: Tensor, text_embeddings: Tensor) -> Tensor:
        """Every image's logit against every text ``(images, texts)``: the scaled cosine similarities (plus the bias
        for the sigmoid loss)."""
        logits = self.scale() * image_embeddings @ text_embeddings.T
        return logits if self.logit_bias is None else logits + self.logit_bias

    def forward(self, images: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Images and captions → their unit embeddings ``((batch, embed_dim), (batch, embed_dim))``."""
        return self.encode_image(images), self.encode_text(ids)
