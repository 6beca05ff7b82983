"""Augmentation and normalisation of whole image batches on the device they train on.

Images travel from the loader as uint8 ``(batch, C, H, W)`` (a quarter of the bytes of float32) and are flipped,
cropped and normalised where the model runs, in a few vectorised operations: the GPU is not left waiting for one
CPU process to transform images one by one. Each image gets its own random flip and crop (torchvision's v2
transforms draw one set of parameters per call, which on a batch would move every image alike). The random numbers
come from the device's default generator, which ``RandomStateCheckpoint`` saves, so a resumed run repeats them.
"""

from __future__ import annotations

import torch
from torch import Tensor


def random_horizontal_flip(images: Tensor) -> Tensor:
    """Mirror each image of ``(batch, C, H, W)`` left-right with probability 1/2, independently."""
    flip = torch.rand(images.shape[0], device=images.device) < 0.5
    return torch.where(flip[:, None, None, None], images.flip(-1), images)


def random_crop(images: Tensor, padding: int) -> Tensor:
    """Pad each image of ``(batch, C, H, W)`` with ``padding`` zeros on every side and cut an ``H × W`` window at a
    random offset of its own (torchvision's ``RandomCrop(size, padding)`` per image)."""
    batch, channels, height, width = images.shape
    padded = torch.nn.functional.pad(images, (padding, padding, padding, padding))
    top = torch.randint(0, 2 * padding + 1, (batch, 1), device=images.device)
    left = torch.randint(0, 2 * padding + 1, (batch, 1), device=images.device)
    rows = (top + torch.arange(height, device=images.device))[:, None, :, None]  # (batch, 1, H, 1)
    cols = (left + torch.arange(width, device=images.device))[:, None, None, :]  # (batch, 1, 1, W)
    index = torch.arange(batch, device=images.device)[:, None, None, None]
    return padded[index, torch.arange(channels, device=images.device)[None, :, None, None], rows, cols]


def normalize(images: Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    """uint8 ``(batch, C, H, W)`` → float32 ``(pixels / 255 - mean) / std`` per channel."""
    mean_ = torch.tensor(mean, device=images.device).view(1, -1, 1, 1)
    std_ = torch.tensor(std, device=images.device).view(1, -1, 1, 1)
    return (images.float() / 255 - mean_) / std_
