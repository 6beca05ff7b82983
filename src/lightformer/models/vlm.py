"""A vision-language model (LLaVA, nanoVLM, PaliGemma): an image's patch tokens put into a decoder-only language
model's own sequence, where the text's image placeholder stands.

    images ──ViT──> patch tokens of block image_layer (class token dropped, no final norm)
           ──pixel shuffle (s×s patches → 1 token)──projector──> K embeddings at the GPT's width ─┐
    ids: [BOS] … <image> … ──token embeddings──────────────────────────── placeholder → K rows ──┴─GPT──> logits

The towers are the other tasks' models, whole: the image tower a ``VisionTransformer`` named ``image`` as the
contrastive model's (a contrastive run's checkpoint starts it by names), the language model a ``GPT`` named ``text``
(a language model run's checkpoint starts it). The placeholder is one id equal to the tokenizer's size
(``image_token_id == text.vocab_size``): never an embedding row, never an output of the LM head. The logits come back
aligned with the input ids: ``logits[:, t]`` predicts ``ids[:, t + 1]``; at the placeholder they are the last image
token's (which predicts the token after the image).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from lightformer.generation import ConditionedDecoder
from lightformer.models.gpt import GPT, GPTConfig
from lightformer.models.vision_text import build_towers
from lightformer.models.vit import VisionTransformer, ViTConfig
from lightformer.nn import DecoderCache, record_attention
from lightformer.nn.checks import as_pair, check_at_least, check_choice, check_set

Projector = Literal["linear", "mlp"]
ImageAttention = Literal["bidirectional", "causal"]

# The towers of ``VisionLanguageConfig()``: a small pre-norm ViT with a class token in 8-pixel patches (the contrastive
# model's tower), and a GPT of the same width. A tower given as a mapping changes these.
IMAGE_DEFAULTS = dict(
    in_channels=3, patch_size=8, d_model=128, n_layers=4, n_heads=4, num_classes=0, pool="cls", pre_norm=True
)
TEXT_DEFAULTS = dict(block_size=128, d_model=128, n_layers=4, n_heads=4)


@dataclass(frozen=True)
class VisionLanguageConfig:
    """The shape of a vision-language model: its two towers' configs whole, and what joins them.

    Args:
        image: the image tower's shape (``ViTConfig``, no classifier head): ``image_size`` and ``in_channels`` from
            the data's facts; images of other sizes are read too (the position table resampled to their grid).
        text: the language model's shape (``GPTConfig``, causal): ``vocab_size`` is the tokenizer's (the image
            placeholder is ``vocab_size``), ``block_size`` the longest text with the image's K tokens in it.
        pixel_shuffle: s: each s×s block of neighbouring patches becomes one token of s²·d channels (nanoVLM's,
            Idefics3's), K = patches / s²; 1 keeps every patch. The tower's grid must be divisible by s.
        projector: "linear", one linear layer to the GPT's width, or "mlp": Linear, GELU, Linear (LLaVA-1.5's).
        image_layer: the tower's block whose output (the residual stream, before the final norm) gives the patch
            tokens: -1 the last, -2 the one before (LLaVA's default), 0 the first.
        image_attention: "bidirectional": the K image tokens attend to each other both ways (PaliGemma's prefix);
            "causal": as text (LLaVA's). The text is causal either way.
        image_norm: the patch tokens pass through the tower's final norm before the pixel shuffle (SigLIP's features,
            nanoVLM's; Qwen2-VL's merger normalises them too), so the projector reads tokens of one scale rather than
            the residual stream's few huge channels; false (the default): the residual stream, as LLaVA reads
            ``hidden_states``.
        ctc_head: a linear layer from each of the tower's patch tokens (those the projector reads, before the pixel
            shuffle) to the vocabulary, for a CTC loss against the text an image shows (``VisionLanguageTask``'s
            ``ctc_weight``; joint CTC-attention training, as ``VisionEncoderDecoderConfig``'s): it teaches the tower
            to tell characters apart in reading order before the language model has learnt to look. A training aid:
            answers are always the language model's, and an export leaves the head out.
    """

    image: ViTConfig = field(default_factory=lambda: ViTConfig(**IMAGE_DEFAULTS))
    text: GPTConfig = field(default_factory=lambda: GPTConfig(**TEXT_DEFAULTS))
    pixel_shuffle: int = 2
    projector: Projector = "mlp"
    image_layer: int = -1
    image_attention: ImageAttention = "bidirectional"
    image_norm: bool = False
    ctc_head: bool = False

    def __post_init__(self) -> None:
        towers = {"image": (ViTConfig, IMAGE_DEFAULTS), "text": (GPTConfig, TEXT_DEFAULTS)}
        build_towers(self, towers, "a vision-language model")
        check_at_least("pixel_shuffle", self.pixel_shuffle, 1)
        if self.image.image_size is not None:
            check_grid(self.image.image_size, self.image.patch_size, self.pixel_shuffle)
        n = self.image.n_layers
        if not -n <= self.image_layer < n:
            raise ValueError(
                f"image_layer={self.image_layer} is not a block of the image tower's image.n_layers={n}: "
                f"give -{n}..{n - 1} (-1 the last block)"
            )
        check_choice("projector", self.projector, get_args(Projector))
        check_choice("image_attention", self.image_attention, get_args(ImageAttention))


def check_grid(image_size: int | tuple[int, int], patch_size: int | tuple[int, int], pixel_shuffle: int) -> None:
    """Raise ValueError unless ``pixel_shuffle`` divides both sides of the patch grid of images of ``image_size``."""
    grid = [side // patch for side, patch in zip(as_pair(image_size), as_pair(patch_size), strict=True)]
    if grid[0] % pixel_shuffle or grid[1] % pixel_shuffle:
        raise ValueError(
            f"pixel_shuffle={pixel_shuffle} does not divide the image tower's grid of {grid[0]}×{grid[1]} patches "
            f"(image_size={image_size}, patch_size={patch_size}): set pixel_shuffle to a divisor of both sides, or "
            f"resize the images so that each side holds a multiple of {pixel_shuffle} patches"
        )


def pixel_shuffle(tokens: Tensor, grid: tuple[int, int], s: int) -> Tensor:
    """Patch tokens ``(batch, h·w, d)`` in row-major order → ``(batch, h/s·w/s, s²·d)``: each s×s block of
    neighbours joined into one token (nanoVLM's, Idefics3's), channels ordered (row in the block, column in the block,
    channel): channel ``(i·s + j)·d + c`` of a token is channel c of the block's patch at row i, column j."""
    if s == 1:
        return tokens
    b, _, d = tokens.shape
    h, w = grid
    x = tokens.reshape(b, h // s, s, w // s, s, d).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // s) * (w // s), s * s * d)


class ImageProjector(nn.Module):
    """Shuffled patch tokens → the language model's width: one linear layer, or Linear, GELU, Linear (LLaVA's
    ``multi_modal_projector``, by its names ``linear_1``, ``linear_2``)."""

    def __init__(self, in_features: int, out_features: int, kind: Projector) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_features, out_features)
        self.act = nn.GELU() if kind == "mlp" else nn.Identity()
        self.linear_2 = nn.Linear(out_features, out_features) if kind == "mlp" else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class _TextPositions:
    """A ``DecoderCache`` seen by ``generation``: its ``length`` counts text positions (the image's K tokens as one,
    the placeholder's), so ``generate``'s bookkeeping against the decoder's ``block_size`` holds."""

    def __init__(self, cache: DecoderCache, extra: int) -> None:
        self.cache, self.extra = cache, extra

    @property
    def length(self) -> int:
        return max(0, self.cache.length - self.extra)

    def reorder(self, index: Tensor) -> None:
        self.cache.reorder(index)


class VisionLanguageModel(nn.Module):
    """Ids with one image placeholder per row ``(batch, T)`` and images ``(batch, C, H, W)`` → next-token logits
    ``(batch, T, vocab_size)`` aligned with the ids."""

    layer_stacks = ("image.encoder", "text.decoder")  # its units' stacks: lightformer.training.distributed

    def __init__(self, config: VisionLanguageConfig) -> None:
        super().__init__()
        check_set(config.image, "image_size")
        check_set(config.text, "vocab_size")
        self.config = config
        self.image = VisionTransformer(config.image)
        # What the patch tokens never pass through (the blocks after image_layer, the tower's final norm unless
        # image_norm, its pooling) would get no gradient: frozen, so that DDP, which refuses a trained parameter left
        # without one, takes it.
        kept = config.image_layer % config.image.n_layers + 1
        tower = self.image
        unread = (*tower.encoder.layers[kept:], None if config.image_norm else tower.encoder.norm, tower.fc_norm)
        for module in (*unread, tower.attn_pool, tower.head):
            if module is not None:
                module.requires_grad_(False)
        self.projector = ImageProjector(
            config.pixel_shuffle**2 * config.image.d_model, config.text.d_model, config.projector
        )
        self.text = GPT(config.text)
        self.ctc_head = nn.Linear(config.image.d_model, config.text.vocab_size) if config.ctc_head else None
        self.image_token_id = config.text.vocab_size
        self.block_size = config.text.block_size

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """The patch grid of images of ``height`` × ``width`` pixels; ValueError unless the patches and the pixel
        shuffle tile it."""
        ph, pw = self.image.patch_embed.patch_size
        if height % ph or width % pw:
            raise ValueError(
                f"images of {height}×{width} pixels are not tiled by the image tower's patches of {ph}×{pw}: "
                "resize them to multiples of the patch size"
            )
        check_grid((height, width), (ph, pw), self.config.pixel_shuffle)
        return height // ph, width // pw

    def num_image_tokens(self, height: int, width: int) -> int:
        """K: how many embeddings an image of ``height`` × ``width`` pixels takes in the text."""
        h, w = self.grid(height, width)
        return h * w // self.config.pixel_shuffle**2

    def patch_tokens(self, images: Tensor) -> Tensor:
        """Images ``(batch, C, H, W)`` → the tower's patch tokens the projector reads ``(batch, h·w, d)``, row-major."""
        tokens = self.image.hidden_state(images, self.config.image_layer)[:, self.image.num_prefix_tokens :]
        return self.image.encoder.norm(tokens) if self.config.image_norm else tokens

    def image_tokens(self, images: Tensor, patches: Tensor | None = None) -> Tensor:
        """Images ``(batch, C, H, W)`` (or their ``patch_tokens``) → their K embeddings ``(batch, K, text.d_model)``."""
        grid = self.grid(*images.shape[-2:])
        patches = self.patch_tokens(images) if patches is None else patches
        return self.projector(pixel_shuffle(patches, grid, self.config.pixel_shuffle))

    def reading_logits(self, images: Tensor, patches: Tensor) -> Tensor:
        """The CTC head's logits of each patch token ``(batch, h·w, vocab_size)`` in reading order: column by column
        from the left, each column from the top."""
        if self.ctc_head is None:
            raise ValueError("this model has no CTC head: build it with ctc_head=true")
        h, w = self.grid(*images.shape[-2:])
        columns = patches.unflatten(1, (h, w)).transpose(1, 2).flatten(1, 2)
        return self.ctc_head(columns)

    def _placeholders(self, ids: Tensor) -> Tensor:
        """Each row's placeholder position ``(batch,)``; ValueError unless every row holds exactly one (in training
        an assertion that does not wait for the device: a training step reads nothing back to the host)."""
        is_image = ids == self.image_token_id
        if self.training:
            message = f"every row of the ids holds exactly one image placeholder (id {self.image_token_id})"
            torch._assert_async((is_image.sum(1) == 1).all(), message)
            return is_image.int().argmax(1)
        counts = is_image.sum(1).tolist()
        wrong = [(row, n) for row, n in enumerate(counts) if n != 1]
        if wrong:
            row, n = wrong[0]
            raise ValueError(
                f"row {row} of the ids holds {n} image placeholders (id {self.image_token_id}); every row holds "
                "exactly one, where the image goes"
            )
        return is_image.int().argmax(1)

    def _layout(self, ids: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
        """Where things go when each row's placeholder becomes K image tokens: each id's joined position ``(batch,
        T)`` (the placeholder's: the image's first), the image's positions ``(batch, K)``, and the joined position
        whose logits each id gets ``(batch, T)`` (the placeholder's: the image's last)."""
        place = self._placeholders(ids)
        steps = torch.arange(ids.shape[1], device=ids.device)
        where = steps[None] + (k - 1) * (steps[None] > place[:, None]).long()
        image_at = place[:, None] + torch.arange(k, device=ids.device)[None]
        return where, image_at, where + (k - 1) * (steps[None] == place[:, None]).long()

    def _join(self, ids: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Ids ``(batch, T)`` and image tokens ``(batch, K, D)`` → the joined embeddings ``(batch, T + K - 1, D)``, the
        image's span in them ``(batch, T + K - 1)`` and the joined position whose logits each id gets ``(batch, T)``."""
        (b, t), (k, d) = ids.shape, tokens.shape[1:]
        where, image_at, aligned = self._layout(ids, k)
        text = self.text.embed(ids.masked_fill(ids == self.image_token_id, 0)).to(tokens.dtype)
        joined = text.new_zeros(b, t + k - 1, d).scatter(1, where[..., None].expand(-1, -1, d), text)
        joined = joined.scatter(1, image_at[..., None].expand(-1, -1, d), tokens)
        span = torch.zeros(b, t + k - 1, dtype=torch.bool, device=ids.device).scatter(1, image_at, True)
        return joined, span, aligned

    def forward(
        self, ids: Tensor, images: Tensor, cache: DecoderCache | None = None, ctc: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Ids ``(batch, T)``, one placeholder per row, and images ``(batch, C, H, W)`` → logits ``(batch, T,
        vocab_size)`` aligned with the ids. With ``cache``: the call that starts it holds the placeholder; later
        calls continue with text ids alone (``images`` are then not read). With ``ctc``, also the CTC head's logits
        of the patches in reading order (``reading_logits``), from the same pass of the tower."""
        if cache is not None and cache.length > 0:
            if (ids == self.image_token_id).any():
                raise ValueError("the image placeholder goes in the call that starts the cache, not in a later one")
            return self.text(ids, cache)
        k = self.num_image_tokens(*images.shape[-2:])
        if ids.shape[1] + k - 1 > self.block_size:
            raise ValueError(
                f"{ids.shape[1]} ids with an image of {k} tokens in place of its placeholder make "
                f"{ids.shape[1] + k - 1} positions, more than text.block_size={self.block_size}: shorten the text "
                f"to at most {self.block_size - k + 1} ids, or use smaller images or a larger pixel_shuffle"
            )
        patches = self.patch_tokens(images)
        joined, span, aligned = self._join(ids, self.image_tokens(images, patches))
        bidirectional = span if self.config.image_attention == "bidirectional" else None
        features = self.text.features(cache=cache, embeddings=joined, bidirectional=bidirectional)
        features = features.gather(1, aligned[..., None].expand(-1, -1, features.shape[-1]))
        logits = self.text.lm_head(features)
        return (logits, self.reading_logits(images, patches)) if ctc else logits

    def incremental_decoder(self, images: Tensor, beam_size: int = 1) -> ConditionedDecoder:
        """A decoder for ``lightformer.generation`` bound to ``images`` (rows repeated per beam): its first call holds
        the prompt with the placeholder; its ``block_size`` and its caches' lengths count text positions."""
        images = images.repeat_interleave(beam_size, dim=0) if beam_size > 1 else images
        extra = self.num_image_tokens(*images.shape[-2:]) - 1

        def step(ids: Tensor, cache: Any) -> Tensor:
            if cache is not None and cache.cache.length == 0 and not (ids == self.image_token_id).any():
                raise ValueError(
                    "the text outgrew the block without its image: the cache can only be rebuilt with the image "
                    f"placeholder in it; generate at most {self.block_size - extra} text positions in all "
                    f"(text.block_size={self.block_size} less the image's {extra} extra tokens)"
                )
            return self(ids, images, cache.cache if cache is not None else None)

        def new_cache(max_length: int) -> _TextPositions:
            return _TextPositions(self.text.new_cache(max_length + extra), extra)

        return ConditionedDecoder(step, new_cache, self.block_size - extra)

    @torch.no_grad()
    def image_attention(self, ids: Tensor, images: Tensor) -> Tensor:
        """The last layer's attention (mean over heads) from each text position to the K image tokens ``(batch, T,
        K)`` (at the placeholder: the last image token's), for TensorBoard."""
        k = self.num_image_tokens(*images.shape[-2:])
        last = f"decoder.layers.{len(self.text.decoder.layers) - 1}.self_attn"
        with record_attention(self.text) as maps:
            self(ids, images)
        weights = maps[last].float().mean(dim=1)  # (batch, T + K - 1, T + K - 1)
        _, image_at, aligned = self._layout(ids, k)
        rows = weights.gather(1, aligned[..., None].expand(-1, -1, weights.shape[-1]))
        return rows.gather(2, image_at[:, None, :].expand(-1, ids.shape[1], -1))
