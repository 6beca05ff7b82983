"""The optimizer every task uses: AdamW (fused, on every device) with a per-step learning-rate schedule; gradient
clipping that works with it under every precision and strategy (``clip_gradients``); the cosine decay fitted to
``max_time`` (``fit_schedule_to_max_time``) and the warnings about a schedule a run does not follow."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities import rank_zero_warn
from timm.optim import param_groups_weight_decay
from torch import nn
from torch.optim import Optimizer

from lightformer.nn.checks import check_at_least, check_choice, check_fraction
from lightformer.training.internals import step_unscales_gradients
from lightformer.training.progress import max_time_timer

Schedule = Literal["cosine", "inverse_sqrt", "constant"]
FIT_TO_TIME_EVERY = 50  # optimizer steps between two plans of a schedule fitted to max_time


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


def clip_gradients(trainer: L.Trainer, optimizer: Optimizer, value: float | None, algorithm: str | None) -> None:
    """Clip the gradients of ``optimizer``'s parameters to norm (or per value) ``value``, in true units.

    Under 16-mixed the gradients are still multiplied by the loss scale when a fused optimizer is used (Lightning
    leaves unscaling to its step), so they are unscaled here first; the step then knows they are (PyTorch's
    ``GradScaler`` tracks it) and still skips steps with infinite gradients.
    """
    if not value:
        return
    if isinstance(trainer.strategy, FSDPStrategy):
        raise ValueError(
            "gradient clipping is not supported with Lightning's FSDPStrategy (FSDP1) in lightformer: use "
            "configs/trainer/fsdp.yaml (FSDP2 through ModelParallelStrategy), where it works like everywhere else"
        )
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    if scaler is not None and step_unscales_gradients(optimizer):
        scaler.unscale_(optimizer)
    parameters = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if algorithm == "value":
        torch.nn.utils.clip_grad_value_(parameters, value)
    else:
        torch.nn.utils.clip_grad_norm_(parameters, value)


def fit_schedule_to_max_time(task: L.LightningModule) -> None:
    """Plan ``task``'s cosine decay to end when max_time stops the run (``OptimizerConfig.fit_to_max_time``): every
    ``FIT_TO_TIME_EVERY`` steps after the warm-up, from the pace of the steps so far, as rank 0 measures it."""
    trainer, step = task.trainer, task.trainer.global_step
    if step % FIT_TO_TIME_EVERY:  # the usual case, on every training batch: nothing else looked up
        return
    schedule, timer = task.lr_schedulers().lr_lambdas[0], max_time_timer(trainer)
    if timer is None or step <= schedule.warmup_steps:
        return
    reached = steps_within(step, timer.time_elapsed(), timer.time_remaining())
    planned = min(reached, trainer.estimated_stepping_batches)
    schedule.total_steps = trainer.strategy.broadcast(planned)  # rank 0's: the same rate on every rank


def warn_if_no_max_time(trainer: L.Trainer, config: OptimizerConfig) -> None:
    """Warn at a fit's start that ``fit_to_max_time`` has no max_time to fit to."""
    if config.fit_to_max_time and max_time_timer(trainer) is None:
        rank_zero_warn(
            "model.optimizer.fit_to_max_time=true fits the learning-rate decay to trainer.max_time, which is not "
            f"set: the decay ends at step {trainer.estimated_stepping_batches} (max_steps/max_epochs)"
        )


def warn_if_schedule_kept(trainer: L.Trainer, planned: int | None, config: OptimizerConfig) -> None:
    """Warn at a resumed fit's start that the cosine schedule the checkpoint planned for ``planned`` steps is kept
    although this run goes to another step, and say what that does to the steps that differ."""
    total = trainer.estimated_stepping_batches
    fitted = config.fit_to_max_time  # re-planned as it goes: a resumed plan differs by design
    if planned is not None and planned != total and config.schedule == "cosine" and not fitted:
        warmup = config.warmup_steps
        if total <= planned:
            effect = f"it stops at step {total}, before the decay ends"
        elif planned >= warmup:
            effect = f"steps {planned}..{total} run at min_lr={config.min_lr}"
        elif total <= warmup:
            effect = f"steps {planned}..{total} still warm up (to step {warmup}), with no decay after them"
        else:
            effect = (f"steps {planned}..{warmup} still warm up, then steps {warmup}..{total} run at "
                      f"min_lr={config.min_lr} (no decay)")  # fmt: skip
        rank_zero_warn(
            f"the learning-rate schedule was planned for {planned} steps by the run this checkpoint comes from, "
            f"and it is kept (resuming is exact); this run goes to {total} steps, so {effect}. To plan a new "
            "schedule, start a new run from the checkpoint's weights instead of resuming."
        )
