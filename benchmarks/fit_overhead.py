"""Is the model fed? A vision config's training epoch through ``fit`` against its bare training step, in images/s.

    python benchmarks/input_pipeline.py                                   # configs/vision/vit_fashion_mnist.yaml
    python benchmarks/input_pipeline.py --config configs/vision/vit_cifar10.yaml --steps 200    # on a GPU

The bare step trains the same model with the same optimizer and precision on batches already on the device
(augmented and normalised there, as the data module does), so it measures the model alone; the epoch is one
``fit`` epoch without validation, timed from its first to its last batch (loading, transfer and augmentation
included). A ratio near 1 means the data pipeline keeps up with the model.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from lightformer.cli import cli_main

REPO = Path(__file__).resolve().parents[1]


class EpochTimer(Callback):
    """Images and seconds from the first training batch's start to the last one's end (steady state)."""

    def __init__(self) -> None:
        self.start = self.end = 0.0
        self.images = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if batch_idx == 1:  # after the first batch: allocations, caches, the loader's start
            self.start = time.perf_counter()
        if batch_idx >= 1:
            self.images += len(batch[0])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()
        self.end = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/vision/vit_fashion_mnist.yaml")
    parser.add_argument("--steps", type=int, default=100, help="timed bare steps")
    parser.add_argument("overrides", nargs="*", help="more CLI options, e.g. --trainer.accelerator=gpu")
    args = parser.parse_args()

    common = [f"--config={REPO / args.config}", "--trainer.logger=false", "--trainer.enable_checkpointing=false",
              "--trainer.max_epochs=1", "--trainer.max_time=null", "--trainer.limit_val_batches=0",
              "--trainer.enable_progress_bar=false", *args.overrides]  # fmt: skip
    timer = EpochTimer()
    cli = cli_main(common, run=False)
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, cli.datamodule)
    epoch_rate = timer.images / (timer.end - timer.start)

    # the bare step: the fitted model and data module, batches prepared on the device beforehand
    task, data, strategy = cli.model, cli.datamodule, cli.trainer.strategy
    device = strategy.root_device
    loader = iter(data.train_dataloader())
    batches = [tuple(t.to(device) for t in next(loader)) for _ in range(8)]
    optimizer = task.configure_optimizers()["optimizer"]
    task.train()
    precision = cli.trainer.precision_plugin

    def step(batch) -> None:
        images, labels = data.transform_batch(batch, train=True)
        with precision.forward_context():
            logits = task(images)
        loss = torch.nn.functional.cross_entropy(logits.float(), labels, label_smoothing=task.hparams.label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for batch in batches[:3]:
        step(batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(args.steps):
        step(batches[i % len(batches)])
    if device.type == "cuda":
        torch.cuda.synchronize()
    step_rate = args.steps * len(batches[0][0]) / (time.perf_counter() - start)
    print(f"{args.config} on {device}: fit epoch {epoch_rate:,.0f} images/s, bare step {step_rate:,.0f} images/s, "
          f"ratio {epoch_rate / step_rate:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
