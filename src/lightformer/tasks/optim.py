"""The optimizer every task uses: AdamW (fused, on every device) with a per-step learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from timm.optim import param_groups_weight_decay
from torch import nn

from lightformer.nn.checks import check_at_least, check_choice, check_fraction

Schedule = Literal["cosine", "inverse_sqrt", "constant"]


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW and its learning-rate schedule, the same for every task (``model.optimizer`` in a config).

    Args:
        lr: peak learning rate, reached at the end of the warm-up.
        min_lr: learning rate at the end of the cosine decay (schedule "cosine").
        warmup_steps: optimizer steps of linear warm-up from 0 to lr.
        schedule: after the warm-up, per optimizer step: "cosine" decays to min_lr at the run's last step,
            "inverse_sqrt" decays ∝ 1/√step (the Transformer paper's), "constant" stays at lr.
        weight_decay: AdamW's decoupled weight decay of the weight matrices and embeddings (never of biases,
            norm gains, position tables or class tokens).
        betas: AdamW's running-average coefficients.
        fit_to_max_time: with schedule "cosine" and the trainer's ``max_time``: the decay ends at min_lr when
            max_time ends the run, however fast the machine, instead of at max_steps (which stays the upper
            bound). Every 50 steps after the warm-up its length is planned anew from the pace of the steps so far
            (validations included), as rank 0 measures it; checkpoints keep the last plan. The schedule then
            depends on the machine's speed, so two runs are not bit-identical. Without max_time (a warning says
            so), the decay ends at max_steps.
    """

    lr: float = 1e-3
    min_lr: float = 0.0
    warmup_steps: int = 0
    schedule: Schedule = "cosine"
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    fit_to_max_time: bool = False

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr} must be positive")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"min_lr={self.min_lr} must be in [0, lr={self.lr}]")
        check_at_least("warmup_steps", self.warmup_steps, 0)
        check_choice("schedule", self.schedule, ("cosine", "inverse_sqrt", "constant"))
        check_at_least("weight_decay", self.weight_decay, 0)
        for i, beta in enumerate(self.betas):
            check_fraction(f"betas[{i}]", beta)
        if self.fit_to_max_time and self.schedule != "cosine":
            raise ValueError(f"fit_to_max_time plans a cosine decay's length; schedule={self.schedule!r} has none")


class WarmupSchedule:
    """The learning-rate factor (of ``lr``) at each optimizer step: linear warm-up, then the chosen decay.

    A callable object rather than a function so that ``LambdaLR.state_dict`` stores its fields: a resumed run
    keeps the schedule it was planned with (``total_steps`` included), even if the new run is longer.
    """

    def __init__(self, schedule: Schedule, warmup_steps: int, total_steps: int, min_ratio: float) -> None:
        check_choice("schedule", schedule, ("cosine", "inverse_sqrt", "constant"))
        self.schedule = schedule
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_ratio = min_ratio

    def __call__(self, step: int) -> float:
        if self.schedule == "inverse_sqrt":  # the paper's, normalised to peak at 1 at the end of the warm-up
            warmup = max(1, self.warmup_steps)
            return min((step + 1) / warmup, math.sqrt(warmup / (step + 1)))
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def steps_within(step: int, elapsed: float, remaining: float) -> int:
    """The step a run reaches when ``remaining`` seconds are spent at the pace of its first ``step`` steps, which
    took ``elapsed`` seconds."""
    return step + int(max(remaining, 0.0) * step / elapsed)


def configure_adamw(
    model: nn.Module,
    config: OptimizerConfig,
    total_steps: int,
    pretrained: set[str] = frozenset(),
    pretrained_lr_scale: float = 1.0,
) -> dict:
    """What ``LightningModule.configure_optimizers`` returns: AdamW over ``model`` and its per-step schedule.

    The optimizer is fused (one kernel for all parameters) on every device, CPU included, so the CPU tests run
    the optimizer a GPU run uses; ``Task.configure_gradient_clipping`` makes clipping work with it. Parameters
    named in ``pretrained`` (fine-tuning) learn at ``pretrained_lr_scale`` times the learning rate.
    """
    no_decay = model.no_weight_decay() if hasattr(model, "no_weight_decay") else ()
    groups = param_groups_weight_decay(model, config.weight_decay, no_weight_decay_list=no_decay)
    for group in groups:  # LearningRateMonitor logs each group under its name: train/lr/decayed, train/lr/not_decayed
        group["name"] = "decayed" if group["weight_decay"] else "not_decayed"
    if pretrained and pretrained_lr_scale != 1.0:  # timm's grouping cannot also split by where weights came from
        is_pretrained = {id(p) for name, p in model.named_parameters() if name in pretrained}
        split = []
        for group in groups:
            for kind, scale in (("pretrained", pretrained_lr_scale), ("new", 1.0)):
                params = [p for p in group["params"] if (id(p) in is_pretrained) == (kind == "pretrained")]
                if params:
                    split.append(group | {"params": params, "lr": config.lr * scale, "name": f"{group['name']}_{kind}"})
        groups = split
    optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, fused=True)
    factor = WarmupSchedule(config.schedule, config.warmup_steps, total_steps, config.min_lr / config.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "name": "train/lr"}}
