"""Access to the TensorBoard writer for what Lightning's ``self.log`` cannot carry: text and images."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor
from torch.utils.tensorboard import SummaryWriter


def tensorboard_writer(module: L.LightningModule) -> SummaryWriter | None:
    """The run's ``SummaryWriter`` on global rank zero, or None (no TensorBoard logger, or another rank)."""
    if module._trainer is None or not module.trainer.is_global_zero:
        return None
    for logger in module.trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            return logger.experiment
    return None


def heatmap_image(matrix: Tensor, cell: int = 8) -> Tensor:
    """A ``(rows, cols)`` matrix as a ``(3, rows·cell, cols·cell)`` image in [0, 1] (dark blue → yellow)."""
    m = matrix.detach().float().cpu()
    m = (m - m.min()) / (m.max() - m.min()).clamp_min(1e-12)
    low, high = torch.tensor([0.07, 0.04, 0.35]), torch.tensor([1.0, 0.9, 0.1])
    image = low[:, None, None] + (high - low)[:, None, None] * m[None]
    return image.repeat_interleave(cell, 1).repeat_interleave(cell, 2)
