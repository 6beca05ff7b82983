"""What a run prints while it works: a short model summary, a progress bar in a terminal, and log lines elsewhere.

The CLI installs them (``lightformer.cli.main``): in a terminal, ``ProgressBar`` (Lightning's rich bar, counting steps
to ``max_steps`` when the run is step-bound rather than "epoch 0/-2", without ``v_num``); when output goes to a file
or the bar is off, ``ProgressLog``: a line at least every ``every_seconds`` and one per validation, with the step,
the loss, the throughput and the time left, so a long run's log shows it is alive and how far it is.
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelSummary, RichProgressBar, Timer
from lightning.pytorch.utilities import rank_zero_info

from lightformer.training.internals import should_update_logs


def _count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class Summary(ModelSummary):
    """The model's top-level parts and their parameters, in a few lines (Lightning's table also lists the task's
    metric objects as layers, and a FLOPs column that is 0 without an example input; FLOPs are logged live by
    ``lightformer.training.callbacks.Throughput``)."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        model = getattr(pl_module, "model", pl_module)
        if not trainer.is_global_zero:
            return
        total = sum(p.numel() for p in model.parameters())
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        megabytes = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
        lines = [
            f"{type(model).__name__}: {_count(total)} parameters ({_count(trainable)} trained), {megabytes:.1f} MB"
        ]
        seen: set[int] = set()
        for name, child in model.named_children():
            parameters = list(child.parameters())
            own = [p for p in parameters if id(p) not in seen]
            seen.update(id(p) for p in own)
            if parameters:
                count = _count(sum(p.numel() for p in own)) if own else "shared"
                lines.append(f"  {name:<14} {type(child).__name__:<28} {count:>8}")
        rank_zero_info("\n".join(lines))


class ProgressBar(RichProgressBar):
    """Lightning's rich progress bar, titled with the step and ``max_steps`` for runs bounded by steps (Lightning
    writes "Epoch 0/-2" when ``max_epochs`` is -1), and without the logger's version number among the metrics."""

    def _get_train_description(self, current_epoch: int) -> str:
        trainer = self.trainer
        if trainer.max_steps > 0 and (trainer.max_epochs is None or trainer.max_epochs < 0):
            return f"Epoch {current_epoch} (step {trainer.global_step}/{trainer.max_steps})"
        return super()._get_train_description(current_epoch)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        """Lightning's metrics and the latest logged ``train/loss``, read back from the device only when they change:
        while training, on the steps whose logs are written (a bar that read them each step would wait for the
        device each step)."""
        shown = getattr(self, "_shown", None)  # the metrics read back when the logs were last written
        if shown is not None and trainer.training and not should_update_logs(trainer):
            return shown
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        loss = trainer.callback_metrics.get("train/loss")
        if isinstance(loss, torch.Tensor):
            metrics["train/loss"] = float(loss)
        self._shown = metrics
        return metrics


def validation_line(trainer: L.Trainer, what: str = "validation") -> str:
    """'<what> at step N: val/acc 0.91, val/loss 0.27': the validation metrics the trainer holds."""
    metrics = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    shown = ", ".join(f"{k} {float(v):.4g}" for k, v in sorted(metrics.items()))
    return f"{what} at step {trainer.global_step}: {shown}"


def max_time_timer(trainer: L.Trainer) -> Timer | None:
    """Lightning's ``Timer``, which stops the run at ``trainer.max_time``, or None where max_time is not set."""
    timer = next((callback for callback in trainer.callbacks if isinstance(callback, Timer)), None)
    return timer if timer is not None and timer.time_remaining() is not None else None


def _time_remaining(trainer: L.Trainer) -> float | None:
    """Seconds of training left before ``max_time`` stops it, or None without max_time."""
    timer = max_time_timer(trainer)
    return timer.time_remaining() if timer is not None else None


class ProgressLog(Callback):
    """A log line at least every ``every_seconds`` of training and one after each validation: the step of the
    total, the latest loss, throughput, and time elapsed and left (estimated from the steps so far).

    Args:
        every_seconds: the longest silence between two lines while training.
    """

    def __init__(self, every_seconds: float = 30.0) -> None:
        self.every_seconds = every_seconds
        self._start = self._last = 0.0
        self._start_step = 0
        self._items = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = self._last = time.monotonic()
        self._start_step, self._items = trainer.global_step, 0
        total = trainer.estimated_stepping_batches
        remaining = _time_remaining(trainer)
        limit = f", or for {_duration(remaining)} (max_time)" if remaining is not None else ""
        rank_zero_info(f"training from step {trainer.global_step} to {total:.0f}{limit}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        counts = getattr(pl_module, "throughput_counts", None)  # a tensor on the device (read when a line is due)
        self._items = self._items + (counts(batch)[1] * trainer.world_size if counts is not None else 0)
        now = time.monotonic()
        if now - self._last >= self.every_seconds:
            self._last = now
            rank_zero_info(self._line(trainer, pl_module, now))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        rank_zero_info(validation_line(trainer))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        rank_zero_info(self._line(trainer, pl_module, time.monotonic(), finished=True))

    def _line(self, trainer: L.Trainer, pl_module: L.LightningModule, now: float, finished: bool = False) -> str:
        step, total = trainer.global_step, trainer.estimated_stepping_batches
        elapsed = now - self._start
        rate = (step - self._start_step) / elapsed if elapsed > 0 else 0.0
        loss = trainer.callback_metrics.get("train/loss")
        parts = [f"step {step}/{total:.0f} ({step / max(total, 1):.0%})"]
        if isinstance(loss, torch.Tensor):
            parts.append(f"loss {float(loss):.4f}")
        items = int(self._items)
        if elapsed > 0 and items:
            parts.append(f"{_count(items / elapsed)} {getattr(pl_module, 'items_name', 'items')}/s")
        parts.append(f"{_duration(elapsed)} elapsed")
        if not finished and rate > 0 and total > step:
            left = (total - step) / rate
            remaining = _time_remaining(trainer)
            parts.append(f"~{_duration(left if remaining is None else min(left, remaining))} left")
        return ("finished: " if finished else "") + " · ".join(parts)
