"""Augmentation and normalisation of uint8 image batches on the device, each image its own draws (docs/data.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import torch
from torch import Tensor

AugmentName = Literal["none", "flip", "flip_crop", "trivialaugment", "randaugment"]


@dataclass(frozen=True)
class AugmentConfig:
    """How training images are augmented (``data.augment``); validation and test images never are.

    Args:
        policy: "none", "flip" (not mnist, digits), "flip_crop" (pad image_size // 7), "trivialaugment", "randaugment".
        random_erasing: probability, in [0, 1], that a rectangle (2% to 33%) of a training image becomes noise; 0: none.
    """

    policy: AugmentName = "flip_crop"
    random_erasing: float = 0.0

    def __post_init__(self) -> None:
        if self.policy not in get_args(AugmentName):
            raise ValueError(f"data.augment.policy={self.policy!r} is unknown; valid: {list(get_args(AugmentName))}")
        if not 0.0 <= self.random_erasing <= 1.0:
            raise ValueError(f"data.augment.random_erasing={self.random_erasing} is a probability, in [0, 1]")


def random_horizontal_flip(images: Tensor) -> Tensor:
    """Mirror each image of ``(batch, C, H, W)`` left-right with probability 1/2, independently."""
    flip = torch.rand(images.shape[0], device=images.device) < 0.5
    return torch.where(flip[:, None, None, None], images.flip(-1), images)


def random_crop(images: Tensor, padding: int) -> Tensor:
    """Torchvision's ``RandomCrop(size, padding)`` per image of ``(batch, C, H, W)``: zero padding, its own offset."""
    batch, channels, height, width = images.shape
    padded = torch.nn.functional.pad(images, (padding, padding, padding, padding))
    top = torch.randint(0, 2 * padding + 1, (batch, 1), device=images.device)
    left = torch.randint(0, 2 * padding + 1, (batch, 1), device=images.device)
    rows = (top + torch.arange(height, device=images.device))[:, None, :, None]  # (batch, 1, H, 1)
    cols = (left + torch.arange(width, device=images.device))[:, None, None, :]  # (batch, 1, 1, W)
    index = torch.arange(batch, device=images.device)[:, None, None, None]
    return padded[index, torch.arange(channels, device=images.device)[None, :, None, None], rows, cols]


def random_erasing(
    images: Tensor,
    probability: float,
    scale: tuple[float, float] = (0.02, 1 / 3),
    ratio: tuple[float, float] = (0.3, 3.3),
) -> Tensor:
    """Random erasing (timm's ``RandomErasing(mode="pixel")``, a side cut to the image's, not redrawn; docs/data.md)."""
    batch, _, height, width = images.shape
    device = images.device
    area = torch.empty(batch, device=device).uniform_(*scale) * height * width
    aspect = torch.exp(torch.empty(batch, device=device).uniform_(math.log(ratio[0]), math.log(ratio[1])))
    h = torch.sqrt(area * aspect).round().clamp(1, height)
    w = torch.sqrt(area / aspect).round().clamp(1, width)
    top = (torch.rand(batch, device=device) * (height - h + 1)).floor()
    left = (torch.rand(batch, device=device) * (width - w + 1)).floor()
    rows = torch.arange(height, device=device)[None, :]
    cols = torch.arange(width, device=device)[None, :]
    inside_rows = (rows >= top[:, None]) & (rows < (top + h)[:, None])  # (batch, H)
    inside_cols = (cols >= left[:, None]) & (cols < (left + w)[:, None])  # (batch, W)
    erase = torch.rand(batch, device=device) < probability
    mask = (inside_rows[:, :, None] & inside_cols[:, None, :] & erase[:, None, None])[:, None]  # (batch, 1, H, W)
    return torch.where(mask, torch.randn_like(images), images)


def normalize(images: Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    """uint8 ``(batch, C, H, W)`` → float32 ``(pixels / 255 - mean) / std`` per channel."""
    mean_ = torch.tensor(mean, device=images.device).view(1, -1, 1, 1)
    std_ = torch.tensor(std, device=images.device).view(1, -1, 1, 1)
    return (images.float() / 255 - mean_) / std_


def jitter(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A training image ``(H, W)`` or ``(H, W, 3)`` uint8: contrast ×[0.8, 1.2], brightness ±20, a shift of 2 and 1."""
    pixels = image.astype(np.float32)
    mean = pixels.mean()
    pixels = (pixels - mean) * rng.uniform(0.8, 1.2) + mean + rng.uniform(-20, 20)
    dx, dy = int(rng.integers(-2, 3)), int(rng.integers(-1, 2))
    padded = np.pad(pixels, ((1, 1), (2, 2)) + ((0, 0),) * (image.ndim - 2), mode="edge")
    h, w = image.shape[:2]
    pixels = padded[1 - dy : 1 - dy + h, 2 - dx : 2 - dx + w]
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)
