"""AdamW with decay/no-decay parameter groups and the learning-rate schedules the tasks share."""

from __future__ import annotations

import math
from functools import partial
from typing import Literal

import torch
from torch import nn

Schedule = Literal["cosine", "inverse_sqrt", "constant"]


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices (Linear, Embedding, Conv weights); none on biases and norm gains.

    Names listed by ``model.no_weight_decay()`` (timm's convention: class token, position table) are
    never decayed. Tied weights appear once.
    """
    skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, p in model.named_parameters():  # yields shared (tied) parameters once
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 and name not in skip else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Linear warmup from 0 to 1 over ``warmup_steps``, then cosine decay to ``min_ratio`` at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def inverse_sqrt(step: int, warmup_steps: int) -> float:
    """The paper's schedule, normalised to peak at 1: linear warmup, then decay ∝ 1/√step."""
    step = step + 1
    return min(step / warmup_steps, math.sqrt(warmup_steps / step))


def configure_adamw(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    schedule: Schedule,
    warmup_steps: int,
    total_steps: int,
    min_lr: float = 0.0,
) -> dict:
    """What ``LightningModule.configure_optimizers`` returns: AdamW and a per-step LambdaLR schedule."""
    fused = {"fused": True} if all(p.is_cuda for p in model.parameters()) else {}
    optimizer = torch.optim.AdamW(parameter_groups(model, weight_decay), lr=lr, betas=betas, **fused)
    if schedule == "cosine":
        factor = partial(warmup_cosine, warmup_steps=warmup_steps, total_steps=total_steps, min_ratio=min_lr / lr)
    elif schedule == "inverse_sqrt":
        factor = partial(inverse_sqrt, warmup_steps=max(1, warmup_steps))
    elif schedule == "constant":  # after the warmup
        factor = partial(warmup_cosine, warmup_steps=warmup_steps, total_steps=total_steps, min_ratio=1.0)
    else:
        raise ValueError(f"unknown schedule {schedule!r}; valid: 'cosine', 'inverse_sqrt', 'constant'")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def configure_task_optimizer(task) -> dict:
    """``configure_adamw`` for a task whose hparams hold lr, min_lr, weight_decay, betas, schedule and
    warmup_steps, over ``task.model``, for as many steps as the trainer will take."""
    hp = task.hparams
    return configure_adamw(
        task.model,
        lr=hp.lr,
        weight_decay=hp.weight_decay,
        betas=hp.betas,
        schedule=hp.schedule,
        warmup_steps=hp.warmup_steps,
        total_steps=task.trainer.estimated_stepping_batches,
        min_lr=hp.min_lr,
    )
