"""Input embeddings: tokens → vectors, and image patches → vectors."""

from __future__ import annotations

import math

from torch import Tensor, nn

from lightformer.nn.checks import as_pair, check_patch_size


class TokenEmbedding(nn.Embedding):
    """Token ids ``(batch, seq)`` → ``(batch, seq, d_model)``, optionally scaled by √d_model as in the paper.

    With ``scale`` the weights start at N(0, 1/d_model) (as in fairseq), so scaled embeddings have unit
    variance, the same as the sinusoidal positions added to them.
    """

    def __init__(self, vocab_size: int, d_model: int, scale: bool = False, padding_idx: int | None = None) -> None:
        self.scale = math.sqrt(d_model) if scale else 1.0
        super().__init__(vocab_size, d_model, padding_idx=padding_idx)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=1.0 / self.scale)
        self._fill_padding_idx_with_zero()

    def forward(self, ids: Tensor) -> Tensor:
        out = super().forward(ids)
        return out * self.scale if self.scale != 1.0 else out


class PatchEmbedding(nn.Module):
    """Images ``(batch, C, H, W)`` → patch tokens ``(batch, H/ph·W/pw, d_model)``, by a convolution with stride
    (ph, pw), in row-major order. Image and patch sizes are a square's side or (height, width): a text line is 32
    pixels high and hundreds wide, and reads best in tall, narrow patches.

    Same parameter layout as timm's ``PatchEmbed`` (``proj`` is the convolution).
    """

    def __init__(
        self,
        image_size: int | tuple[int, int],
        patch_size: int | tuple[int, int],
        in_channels: int,
        d_model: int,
        bias: bool = True,
    ) -> None:
        super().__init__()
        check_patch_size(image_size, patch_size)
        self.image_size, self.patch_size = as_pair(image_size), as_pair(patch_size)
        self.in_channels = in_channels
        self.grid = (self.image_size[0] // self.patch_size[0], self.image_size[1] // self.patch_size[1])
        self.num_patches = self.grid[0] * self.grid[1]
        self.proj = nn.Conv2d(in_channels, d_model, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)

    def forward(self, images: Tensor, any_size: bool = False) -> Tensor:
        """With ``any_size``, images of any height and width that the patches tile (the grid is then another)."""
        expected = (self.in_channels, *self.image_size)
        if any_size and images.ndim == 4 and images.shape[1] == self.in_channels:
            if images.shape[2] % self.patch_size[0] or images.shape[3] % self.patch_size[1]:
                raise ValueError(
                    f"images of {images.shape[2]}×{images.shape[3]} pixels are not tiled by patches of "
                    f"{self.patch_size[0]}×{self.patch_size[1]}: resize them to multiples of the patch size"
                )
        elif images.ndim != 4 or tuple(images.shape[1:]) != expected:
            hint = "add a batch dimension: images[None]" if images.ndim == 3 else "convert or resize the images"
            raise ValueError(
                f"expected images of shape (batch, {', '.join(map(str, expected))}), got {tuple(images.shape)}: "
                f"the model takes (batch, channels, height, width) with in_channels={self.in_channels} and "
                f"image_size={self.image_size}; {hint}"
            )
        return self.proj(images).flatten(2).transpose(1, 2)
