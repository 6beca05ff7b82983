"""Vision Transformer (Dosovitskiy et al. 2021) assembled from the shared blocks, state-dict compatible with timm.

Images → patch tokens → [class token] + positions → pre-norm encoder stack → pooled token → linear head.
Parameter layout and initialisation follow timm's ``VisionTransformer``, so weights convert both ways with
``timm_to_lightformer`` and ``lightformer_to_timm``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal, get_args

import torch
from timm.layers import build_sincos2d_pos_embed, resample_abs_pos_embed, trunc_normal_
from torch import Tensor, nn

from lightformer.nn import (
    Dropout,
    Encoder,
    EncoderLayer,
    FeedForward,
    LayerConfig,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    PatchEmbedding,
    make_norm,
    record_attention,
)
from lightformer.nn.checks import (
    as_pair,
    check_at_least,
    check_choice,
    check_fraction,
    check_patch_size,
    check_set,
    lists_as_pairs,
)

Pool = Literal["cls", "mean", "map"]
ViTPosition = Literal["learned", "sincos"]


@dataclass(frozen=True)
class ViTConfig(
    LayerConfig.with_defaults(d_model=192, n_heads=3, dropout=0.0, activation="gelu", norm_eps=1e-6, qkv_bias=True)
):
    """The shape of a Vision Transformer: every hyperparameter and its default, declared once.

    The layer's fields are ``nn.LayerConfig``'s, with the ViT's defaults: width 192, 3 heads, no dropout, GELU, norm
    epsilon 1e-6 (timm's), biases in the query, key and value projection (timm's qkv_bias). ``d_ff`` is timm's
    mlp_ratio · d_model; ``bias`` switches the other biases of the encoder layers: the attention output projection,
    the feed-forward layers, the two norms of each layer (timm has no switch for its norms' biases: build its
    counterpart with bias=true); the final norm and the head always have biases. A ViT is pre-norm (``norm_first``
    true).

    Args:
        image_size: side of square input images, or (height, width); a multiple of patch_size (from the data's
            facts).
        in_channels: image channels, 1 grey or 3 RGB (from the data's facts).
        num_classes: classifier outputs (from the data's facts); 0 gives no head (the model returns features).
        patch_size: side of square patches, or (height, width): the encoder sees (height / patch height) ·
            (width / patch width) tokens.
        n_layers: encoder layers.
        drop_path: stochastic depth rate of the last layer; layer i gets drop_path · i / (n_layers - 1).
        pool: "cls" classifies from a class token (final norm before pooling, timm's global_pool='token');
            "mean" averages the patch tokens, then normalises (timm's global_pool='avg' with fc_norm); "map"
            pools the normalised patch tokens by attention from one learned query, then a feed-forward layer
            (``AttentionPoolLatent``: SigLIP's head, timm's global_pool='map' with class_token=False).
        position: "learned" absolute positions, or "sincos" fixed 2-D sin-cos positions (timm's
            ``build_sincos2d_pos_embed``: a quarter of the channels each for sin and cos of the patch's column and
            row; zero for the class token).
        pre_norm: normalise the tokens after the positions, before the first layer (timm's ``norm_pre``, CLIP's
            ``ln_pre``); the patch embedding then has no bias, as in timm's and CLIP's ViTs.
    """

    image_size: int | tuple[int, int] | None = None
    in_channels: int = 3
    num_classes: int | None = None
    patch_size: int | tuple[int, int] = 4
    n_layers: int = 6
    drop_path: float = 0.0
    pool: Pool = "cls"
    position: ViTPosition = "learned"
    pre_norm: bool = False
    supported: ClassVar[Mapping[str, tuple]] = {"norm_first": (True,), "n_kv_heads": (None,), "sliding_window": (None,)}

    def __post_init__(self) -> None:
        lists_as_pairs(self, "image_size", "patch_size")
        super().__post_init__()
        check_choice("in_channels", self.in_channels, (1, 3))
        check_at_least("num_classes", self.num_classes, 0)
        for side in as_pair(self.patch_size):
            check_at_least("patch_size", side, 1)
        if self.image_size is not None:
            check_patch_size(self.image_size, self.patch_size)
        check_at_least("n_layers", self.n_layers, 1)
        check_fraction("drop_path", self.drop_path)
        check_choice("pool", self.pool, get_args(Pool))
        check_choice("position", self.position, get_args(ViTPosition))
        if self.position == "sincos" and self.d_model % 4:
            raise ValueError(
                f"position='sincos' needs d_model divisible by 4 (rows and columns, sin and cos); "
                f"got d_model={self.d_model}"
            )


class VisionTransformer(nn.Module):
    """ViT image classifier: ``(batch, in_channels, image_size, image_size)`` → logits ``(batch, num_classes)``."""

    layer_stacks = ("encoder",)  # its units' stacks: lightformer.training.distributed

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        c = config
        check_set(c, "image_size", "num_classes")
        self.config = config
        self.num_classes = c.num_classes
        self.pool = c.pool
        self.d_model = c.d_model
        self.patch_embed = PatchEmbedding(c.image_size, c.patch_size, c.in_channels, c.d_model, bias=not c.pre_norm)
        self.num_prefix_tokens = 1 if c.pool == "cls" else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model)) if c.pool == "cls" else None
        num_tokens = self.patch_embed.num_patches + self.num_prefix_tokens
        self.pos_embed = LearnedPositionalEmbedding(c.d_model, num_tokens)  # (tokens, d_model), class token first
        if c.position == "sincos":  # fixed: a frozen table, so it still travels in the state dict (as in MAE)
            with torch.no_grad():
                self.pos_embed.weight.zero_()
                grid = self.patch_embed.grid
                self.pos_embed.weight[self.num_prefix_tokens :] = build_sincos2d_pos_embed(grid, c.d_model)
            self.pos_embed.weight.requires_grad_(False)
        self.pos_drop = Dropout(c.dropout)
        self.norm_pre = make_norm(c.norm, c.d_model, c.norm_eps) if c.pre_norm else nn.Identity()
        rates = (
            [c.drop_path * i / max(1, c.n_layers - 1) for i in range(c.n_layers)] if c.n_layers > 1 else [c.drop_path]
        )
        layers = [EncoderLayer(**c.layer_args(), drop_path=rate) for rate in rates]
        # timm normalises the tokens before class-token pooling, but the pooled mean after average pooling.
        self.encoder = Encoder(layers, make_norm(c.norm, c.d_model, c.norm_eps) if c.pool != "mean" else None)
        self.fc_norm = make_norm(c.norm, c.d_model, c.norm_eps) if c.pool == "mean" else nn.Identity()
        self.attn_pool = AttentionPoolLatent(c) if c.pool == "map" else None
        self.head = nn.Linear(c.d_model, c.num_classes) if c.num_classes > 0 else nn.Identity()
        self._init_weights(c.position == "learned")

    def _init_weights(self, learned_positions: bool) -> None:
        """timm's default ("original timm") init: truncated N(0, 0.02) for positions and Linear weights, zero biases."""
        if learned_positions:
            trunc_normal_(self.pos_embed.weight, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)  # as timm >= 0.9; the position row gives it its scale
        for module in self.modules():
            if isinstance(module, nn.Linear):
                trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def saved_without_layer_biases(self, state_dict: dict[str, Tensor], prefix: str = "") -> bool:
        """Whether ``state_dict`` holds weights saved when ``qkv_bias=False`` also switched off every other bias of the
        encoder layers (before ``bias`` existed), for this config, which keeps those biases."""
        layers = [f"{prefix}encoder.layers.{i}." for i in range(len(self.encoder.layers))]
        biases = [f"{layer}{name}.bias" for layer in layers for name in _LEGACY_BIAS_FREE]
        return (
            self.config.bias
            and not self.config.qkv_bias
            and all(key not in state_dict and f"{key.removesuffix('bias')}weight" in state_dict for key in biases)
        )

    def _load_from_state_dict(self, state_dict: dict[str, Tensor], prefix: str, *args, **kwargs) -> None:
        """Such weights (``saved_without_layer_biases``) load with those biases zero: the model computes what it
        computed (it may then train them)."""
        if self.saved_without_layer_biases(state_dict, prefix):
            own = self.state_dict(prefix=prefix)
            for name in _LEGACY_BIAS_FREE:
                for i in range(len(self.encoder.layers)):
                    key = f"{prefix}encoder.layers.{i}.{name}.bias"
                    state_dict[key] = torch.zeros_like(own[key])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def no_weight_decay(self) -> set[str]:
        """Parameters never decayed (timm's convention, read by ``tasks.optim.parameter_groups``)."""
        return {"pos_embed.weight", "cls_token"}

    @property
    def grid(self) -> tuple[int, int]:
        """Patches per column and per row of an image."""
        return self.patch_embed.grid

    def forward_features(self, images: Tensor) -> Tensor:
        """Images ``(batch, C, H, W)`` → encoded tokens ``(batch, num_prefix_tokens + H/p·W/p, d_model)``."""
        return self.encoder(self.embed(images))

    def embed(self, images: Tensor, any_size: bool = False) -> Tensor:
        """Images → the tokens the first block reads (patches, class token, positions, pre-norm). With ``any_size``,
        images of another size than the config's (sides multiples of the patch's): the position table is resampled
        bicubic to their grid, a class token's position kept (timm's ``dynamic_img_size``)."""
        x = self.patch_embed(images, any_size=any_size)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)
        grid = (images.shape[-2] // self.patch_embed.patch_size[0], images.shape[-1] // self.patch_embed.patch_size[1])
        if grid == self.grid:
            x = self.pos_embed(x)
        else:
            table = resample_abs_pos_embed(
                self.pos_embed.weight[None], list(grid), list(self.grid), self.num_prefix_tokens
            )
            x = x + table
        return self.norm_pre(self.pos_drop(x))

    def hidden_state(self, images: Tensor, layer: int = -1) -> Tensor:
        """Images of any size (``embed``'s ``any_size``) → the residual stream after block ``layer`` (-1 the last),
        without the final norm: ``(batch, num_prefix_tokens + patches, d_model)``, as Hugging Face's
        ``hidden_states[layer]`` (a vision-language model's image features, LLaVA's vision_feature_layer)."""
        n = len(self.encoder.layers)
        if not -n <= layer < n:
            raise ValueError(f"layer={layer} is not a block of this ViT's {n}: give -{n}..{n - 1}")
        return self.encoder(self.embed(images, any_size=True), depth=layer % n + 1)

    def forward_head(self, tokens: Tensor, pre_logits: bool = False) -> Tensor:
        """Encoded tokens ``(batch, seq, d_model)`` → logits ``(batch, num_classes)`` (or pooled features)."""
        if self.attn_pool is not None:
            x = self.attn_pool(tokens[:, self.num_prefix_tokens :])
        else:
            x = tokens[:, 0] if self.pool == "cls" else tokens[:, self.num_prefix_tokens :].mean(dim=1)
        x = self.fc_norm(x)
        return x if pre_logits else self.head(x)

    def forward(self, images: Tensor) -> Tensor:
        """Images ``(batch, in_channels, image_size, image_size)`` → logits ``(batch, num_classes)``."""
        return self.forward_head(self.forward_features(images))


class AttentionPoolLatent(MultiHeadAttention):
    """Tokens ``(batch, seq, d_model)`` → one pooled vector ``(batch, d_model)``: attention from a learned query
    (``latent``) to the tokens, then a pre-norm feed-forward layer with its residual (Zhai et al. 2023's MAP head;
    timm's ``AttentionPoolLatent``, by its names: ``latent``, ``q``, ``kv``, ``proj``, ``norm``, ``mlp.fc1/fc2``)."""

    def __init__(self, c: ViTConfig) -> None:
        super().__init__(c.d_model, c.n_heads, c.attention_dropout, cross_attention=True)
        self.latent = nn.Parameter(torch.zeros(1, 1, c.d_model))
        trunc_normal_(self.latent, std=c.d_model**-0.5)
        self.norm = make_norm(c.norm, c.d_model, c.norm_eps)
        self.mlp = FeedForward(c.d_model, c.d_ff, c.activation)

    def forward(self, tokens: Tensor) -> Tensor:  # type: ignore[override]
        x = super().forward(self.latent.expand(tokens.shape[0], -1, -1).to(tokens.dtype), tokens)
        return (x + self.mlp(self.norm(x)))[:, 0]


@torch.no_grad()
def resample_positions(model: nn.Module, weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """``weights`` (to be loaded into ``model``) with the position table of each ViT of ``model`` whose grid is
    another resampled to the ViT's, bicubic, as timm loads weights at another image size
    (``resample_abs_pos_embed``): a classifier's square grid (every timm and lightformer classifier's) to a text
    line's 1 × 96 patches, say. The table's own grid is taken to be square, after a class token's position, which is
    kept where the ViT has a class token and dropped where it has none. A table that is not of a square grid is left
    as it is (``init.strict`` refuses its shape)."""
    weights = dict(weights)
    for path, module in model.named_modules():
        name = f"{path}.pos_embed.weight" if path else "pos_embed.weight"
        if not isinstance(module, VisionTransformer) or name not in weights:
            continue
        table, own = weights[name], module.pos_embed.weight
        if table.shape == own.shape or table.ndim != 2 or table.shape[1] != own.shape[1]:
            continue
        prefix = next((n for n in (0, 1) if math.isqrt(len(table) - n) ** 2 == len(table) - n), None)
        if prefix is None or prefix < module.num_prefix_tokens:
            continue
        side = math.isqrt(len(table) - prefix)
        grid = resample_abs_pos_embed(table[None, prefix:].float(), list(module.grid), [side, side], 0)[0]
        weights[name] = torch.cat([table[: module.num_prefix_tokens], grid.to(table.dtype)])
    return weights


# The biases of an encoder layer that ``qkv_bias=False`` also switched off before ``bias`` existed.
_LEGACY_BIAS_FREE = ("self_attn.proj", "ffn.fc1", "ffn.fc2", "norm1", "norm2")


@torch.no_grad()
def attention_rollout(model: VisionTransformer, images: Tensor) -> Tensor:
    """Attention rollout (Abnar & Zuidema 2020): how much each patch feeds the pooled representation.

    Per layer the head-averaged attention plus the identity (the residual path) is renormalised, and the layers
    are multiplied. The row of the class token (or the mean over patch rows for mean pooling) gives weights
    ``(batch, grid height, grid width)`` for images ``(batch, C, H, W)``, each map summing to 1 over the patches.
    """
    was_training = model.training
    model.eval()
    with record_attention(model) as maps:
        model(images)
    model.train(was_training)
    pooled = maps.pop("attn_pool", None)  # the attention pool's query over the patches (pool "map")
    rollout = None
    for weights in maps.values():  # recorded in layer order
        attention = weights.float().mean(dim=1)
        attention = attention + torch.eye(attention.shape[-1], device=attention.device)
        attention = attention / attention.sum(dim=-1, keepdim=True)
        rollout = attention if rollout is None else attention @ rollout
    prefix = model.num_prefix_tokens
    if pooled is not None:
        relevance = (pooled.float().mean(dim=1) @ rollout[:, prefix:, prefix:])[:, 0]
    else:
        relevance = rollout[:, 0, prefix:] if model.pool == "cls" else rollout[:, prefix:, prefix:].mean(dim=1)
    relevance = relevance / relevance.sum(dim=-1, keepdim=True)
    return relevance.reshape(-1, *model.grid)


# --- timm interoperability --------------------------------------------------------------------------------

# Per-layer names: timm's ``blocks.{i}.<left>`` ↔ our ``encoder.layers.{i}.<right>``.
_TIMM_LAYER_NAMES = {
    "norm1": "norm1",
    "attn.qkv": "self_attn.qkv",
    "attn.proj": "self_attn.proj",
    "norm2": "norm2",
    "mlp.fc1": "ffn.fc1",
    "mlp.fc2": "ffn.fc2",
}
_TIMM_TOP_NAMES = {"patch_embed.proj": "patch_embed.proj", "head": "head", "fc_norm": "fc_norm", "norm": "encoder.norm",
                   "norm_pre": "norm_pre"}  # fmt: skip
# Whole names: timm's position table has no ``.weight`` (and a batch dimension, ``_convert``).
_TIMM_WHOLE_NAMES = {"cls_token": "cls_token", "pos_embed": "pos_embed.weight"}


def _rename(name: str, forward: bool) -> str | None:
    """timm parameter name → ours (``forward``) or ours → timm; None for a name with no counterpart."""
    blocks, new_blocks = "blocks.", "encoder.layers."
    layers, top, whole = _TIMM_LAYER_NAMES, _TIMM_TOP_NAMES, _TIMM_WHOLE_NAMES
    if not forward:  # the same tables, read from right to left
        blocks, new_blocks = new_blocks, blocks
        layers, top, whole = ({v: k for k, v in m.items()} for m in (layers, top, whole))
    if name in whole:
        return whole[name]
    module, _, leaf = name.rpartition(".")
    if name.startswith("attn_pool."):  # timm's AttentionPoolLatent's names are ours
        return name
    if name.startswith(blocks):
        index, _, module = module.removeprefix(blocks).partition(".")
        return f"{new_blocks}{index}.{layers[module]}.{leaf}" if module in layers else None
    return f"{top[module]}.{leaf}" if module in top else None


def _convert(state_dict: dict[str, Tensor], forward: bool) -> dict[str, Tensor]:
    """timm's state dict → ours (``forward``) or ours → timm's: every parameter renamed (``_rename``)."""
    out: dict[str, Tensor] = {}
    for name, value in state_dict.items():
        new = _rename(name, forward)
        if new is None:
            source, target = ("timm", "lightformer") if forward else ("lightformer", "timm")
            raise ValueError(f"{source} ViT parameter {name!r} has no {target} counterpart")
        if new.startswith("pos_embed"):  # timm's table is (1, tokens, d_model), ours (tokens, d_model)
            value = value[0] if forward else value[None]
        out[new] = value
    return out


def timm_to_lightformer(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Map a timm ``VisionTransformer`` state dict to our ``VisionTransformer`` layout.

    Supported timm models: ``global_pool='token'`` (our ``pool="cls"``), ``global_pool='avg',
    class_token=False`` (our ``pool="mean"``, normalised after pooling by ``fc_norm``), or ``global_pool='map',
    class_token=False`` (our ``pool="map"``); learned positions
    with ``no_embed_class=False``; pre-norm (``norm_pre``: our ``pre_norm``); no register tokens, layer scale or
    qk-norm. Build ours with the same shape, ``norm_eps`` and activation.
    """
    unsupported = [k for k in state_dict if k.startswith("reg_token") or ".ls" in k]
    unsupported += [k for k in state_dict if ".q_norm" in k or ".k_norm" in k]
    if "fc_norm.weight" in state_dict and "cls_token" in state_dict:
        unsupported.append("cls_token with average pooling (the class token still takes part in attention)")
    if unsupported:
        raise ValueError(f"timm ViT features without a lightformer counterpart: {sorted(unsupported)}")
    return _convert(state_dict, forward=True)


def lightformer_to_timm(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Map our ``VisionTransformer`` state dict to timm's layout (the inverse of ``timm_to_lightformer``).

    Build the timm model with ``global_pool='token'`` for ``pool="cls"``, or ``global_pool='avg',
    class_token=False`` for ``pool="mean"``, ``global_pool='map', class_token=False`` for ``pool="map"``;
    ``mlp_ratio = d_ff / d_model``; ``pre_norm`` as ours;
    ``pos_embed='learn'`` also for our fixed sin-cos positions (the table is copied).
    """
    return _convert(state_dict, forward=False)


@torch.no_grad()
def load_timm_weights(model: VisionTransformer, state_dict: dict[str, Tensor]) -> VisionTransformer:
    """Load a timm ``VisionTransformer`` state dict into ``model``, strictly."""
    model.load_state_dict(timm_to_lightformer(state_dict), strict=True)
    return model
