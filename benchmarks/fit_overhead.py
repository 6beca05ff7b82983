"""What does ``fit`` cost on top of the model? A config's training steps inside ``fit`` against the same model's bare
training step on the same batches, in items/s (tokens or images).

    python benchmarks/fit_overhead.py                      # the CPU recipes: LM, ViT, translation
    python benchmarks/fit_overhead.py --configs configs/lm/austen_bpe_gpu.yaml --steps 300    # on a GPU
    python benchmarks/fit_overhead.py --configs configs/vision/vit_fashion_mnist.yaml -- \\
        --config=configs/trainer/gpu.yaml      # more options for every config's fit after --: a CPU config on a GPU

Inside ``fit`` everything a run does per step counts: loading and transfer, augmentation, the callbacks (throughput
and MFU with their FLOP count, the random-state and non-finite guards), logging to TensorBoard every
``log_every_n_steps``, gradient clipping, the scheduler. Validation and checkpoint writes are left out by design
(``limit_val_batches=0``, the checkpoint callbacks removed): they are once per interval, not per step. Steps are timed
from the start of the ``--warmup``-th to the end of the last one; every batch of that window is kept.

The bare step is nanoGPT's loop on those same batches, already on the device, with the model's dropout as it was in
the window (``LateDropout`` may have it off): the data module's augmentation on the device if it has one (images),
``training_step`` under the precision's autocast, ``backward``, clipping as configured, ``optimizer.step``, the
scheduler, nothing else. A ratio ``fit / bare`` near 1 means ``fit`` adds nothing to a step (the bar is 0.95 on a
CPU). It is given for the totals, and as the median over the batches of each batch's ratio, which a burst of load
from another process on a shared machine moves less.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from lightformer.cli.main import cli_main
from lightformer.training.callbacks import drop_rates

REPO = Path(__file__).resolve().parents[1]
CPU_RECIPES = ["configs/lm/austen_char.yaml", "configs/vision/vit_fashion_mnist.yaml",
               "configs/translation/ding_de_en.yaml"]  # fmt: skip


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class StepWindow(Callback):
    """The batches of steps ``warmup..`` (as they reach the device, before the data module's
    ``on_after_batch_transfer``: images are augmented there, in the step) and the seconds each took, from its start
    to the next one's (loading the next batch included)."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.batches: list = []
        self.starts: list[float] = []
        self.end = 0.0
        self.drop_rates: dict = {}  # the model's dropout rates in the window (LateDropout may have them at 0)

    @property
    def seconds(self) -> list[float]:
        return [b - a for a, b in zip(self.starts, [*self.starts[1:], self.end], strict=True)]

    def setup(self, trainer, pl_module, stage: str) -> None:
        data = trainer.datamodule
        transform = data.on_after_batch_transfer

        def record(batch, dataloader_idx: int):
            if trainer.training and trainer.global_step >= self.warmup:
                self.batches.append(batch)
            return transform(batch, dataloader_idx)

        data.on_after_batch_transfer = record

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.global_step == self.warmup:
            self.drop_rates = drop_rates(pl_module)
        if trainer.global_step >= self.warmup:
            synchronize(pl_module.device)
            self.starts.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        synchronize(pl_module.device)
        self.end = time.perf_counter()


def batches_device(batches: list) -> torch.device:
    """The device ``batches`` are on: that of the first tensor of the first batch (a tuple or a dict of tensors)."""
    first = batches[0]
    values = first.values() if isinstance(first, dict) else first
    return next(value.device for value in values if isinstance(value, torch.Tensor))


def bare_seconds(cli, batches: list) -> list[float]:
    """Seconds the bare training step takes on each of ``batches`` (after a warm-up on a few of them).

    The task trains on the device of the batches: ``fit``'s teardown moves the task back to the CPU (Lightning's
    ``Strategy.teardown``), while the batches it recorded stay on the device they were trained on (a GPU)."""
    task, trainer = cli.model, cli.trainer
    task.log = task.log_dict = lambda *args, **kwargs: None  # no trainer loop to log to
    task.to(batches_device(batches)).train()  # before configure_optimizers: the fused AdamW needs them there
    optimization = task.configure_optimizers()
    optimizer, scheduler = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]
    clip = trainer.gradient_clip_val
    parameters = [p for p in task.parameters() if p.requires_grad]

    transform = getattr(cli.datamodule, "transform_batch", None)  # augmentation on the device, as in fit

    def step(i: int, batch) -> None:
        if transform is not None:
            batch = transform(batch, train=True)
        with trainer.precision_plugin.forward_context():
            loss = task.training_step(batch, i)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(parameters, clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()

    for i, batch in enumerate(batches[:3]):
        step(i, batch)
    seconds = []
    for i, batch in enumerate(batches):
        synchronize(trainer.strategy.root_device)
        start = time.perf_counter()
        step(i, batch)
        synchronize(trainer.strategy.root_device)
        seconds.append(time.perf_counter() - start)
    return seconds


def fit_window(config: str, steps: int, warmup: int, overrides: list[str], runs: str) -> tuple[LightningCLI, Callback]:
    """Trains ``config`` inside ``fit`` for ``warmup + steps`` steps (no validation, no checkpoint writes, logs under
    ``runs``); returns the CLI (its task, trainer and data module) and the window of steps it recorded."""
    window = StepWindow(warmup)
    args = [f"--config={REPO / config}", f"--trainer.default_root_dir={runs}",
            f"--trainer.max_steps={warmup + steps}", "--trainer.max_time=null", "--trainer.max_epochs=-1",
            "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
            f"--trainer.logger.init_args.save_dir={runs}", *overrides]  # fmt: skip
    cli = cli_main(args, run=False)
    callbacks = [c for c in cli.trainer.callbacks if not isinstance(c, ModelCheckpoint)]  # no checkpoint writes
    cli.trainer.callbacks = [*callbacks, window]
    cli.trainer.fit(cli.model, cli.datamodule)
    return cli, window


def measure(config: str, steps: int, warmup: int, overrides: list[str]) -> tuple[float, float, float]:
    """(items/s inside fit, items/s of the bare step, the median over the batches of fit's rate over the bare
    step's: robust to a burst of load from elsewhere on a shared machine) for ``config``."""
    with tempfile.TemporaryDirectory() as runs:
        cli, window = fit_window(config, steps, warmup, overrides, runs)
        items = int(sum(cli.model.throughput_counts(batch)[1] for batch in window.batches))  # (a tensor: read once)
        for module, (attribute, rate) in window.drop_rates.items():  # the model as it trained in the window
            setattr(module, attribute, rate)
        fit, bare = window.seconds, bare_seconds(cli, window.batches)
        return items / sum(fit), items / sum(bare), statistics.median(b / f for f, b in zip(fit, bare, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=CPU_RECIPES)
    parser.add_argument("--steps", type=int, default=60, help="timed steps (and the bare step's batches)")
    parser.add_argument("--warmup", type=int, default=10, help="steps before the timed window")
    parser.add_argument("overrides", nargs="*", help="more CLI options for every config, after --")
    args = parser.parse_args()
    print(f"{'config':<40} {'fit items/s':>12} {'bare items/s':>13} {'fit/bare':>9} {'median per batch':>17}")
    for config in args.configs:
        fit_rate, bare_rate, median = measure(config, args.steps, args.warmup, args.overrides)
        print(f"{config:<40} {fit_rate:>12,.0f} {bare_rate:>13,.0f} {fit_rate / bare_rate:>9.2f} {median:>17.2f}",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
