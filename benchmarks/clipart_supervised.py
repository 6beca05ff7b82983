"""The supervised yardstick of a contrastive config's zero-shot figure: its image tower trained on the data's class
labels, for the same minutes, on the same train split, tested on the same held-out images.

The contrastive bar (docs/results.md) compares the contrastive model's zero-shot top-1 over the data's classes (no
label seen in training: only captions) with this classifier's top-1 (the labels seen): our ViT of the image tower's
shape with a linear head over the classes, trained with the config's AdamW, warmup and cosine decay on the training
images that have a class (the others have nothing to learn from here), cross-entropy with label smoothing 0.1. With
``--minutes``, the decay is fitted to them as the config's ``fit_to_max_time`` fits the contrastive run's (re-planned
from the pace so far every ``FIT_TO_TIME_EVERY`` steps).

    python benchmarks/clipart_supervised.py --minutes 20          # the config's own budget (trainer.max_time)
    python benchmarks/clipart_supervised.py --steps 200           # a quick look
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from lightformer.models.vit import VisionTransformer
from lightformer.tasks.optim import FIT_TO_TIME_EVERY, OptimizerConfig, configure_adamw, steps_within

from clip_vs_openclip import DEFAULT_CONFIG, build_data, our_model, read_config  # isort: skip


def labelled(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The images of ``batch`` that have a class, and their labels."""
    keep = batch["labels"] >= 0
    return batch["images"][keep], batch["labels"][keep]


@torch.no_grad()
def accuracy(model: VisionTransformer, loader, bf16: bool) -> tuple[float, int]:
    """Top-1 of ``model`` on the images of ``loader`` that have a class, and how many there are."""
    model.eval()
    correct = total = 0
    for batch in loader:
        images, labels = labelled(batch)
        if len(labels):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                correct += (model(images).argmax(-1) == labels).sum().item()
            total += len(labels)
    model.train()
    return correct / max(total, 1), total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="a lightformer contrastive config")
    parser.add_argument("--minutes", type=float, default=None, help="train this long (default: --steps)")
    parser.add_argument("--steps", type=int, default=200, help="training steps when no --minutes")
    parser.add_argument("--schedule_steps", type=int, default=None, help="decay length without --minutes")
    parser.add_argument("--precision", choices=["32-true", "bf16-mixed"], default="bf16-mixed",
                        help="precision: auto chooses bf16-mixed on a CPU of fast bf16 (the AMD EPYC)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    hp, data_section, _ = read_config(args.config)
    data = build_data(data_section, None)
    facts = data.data_facts()
    if not facts.class_names:
        raise SystemExit(f"{args.config}: its data has no classes to train a classifier on")
    torch.manual_seed(args.seed)
    tower = our_model(hp["net"], facts).config.image
    model = VisionTransformer(replace(tower, num_classes=len(facts.class_names))).train()
    optimizer = hp.get("optimizer", {})
    optimizer = OptimizerConfig(**optimizer | {"betas": tuple(optimizer.get("betas", (0.9, 0.999)))})
    total = args.schedule_steps or args.steps
    optim = configure_adamw(model, optimizer, total)
    opt, scheduler = optim["optimizer"], optim["lr_scheduler"]["scheduler"]
    schedule = scheduler.lr_lambdas[0]
    print(f"{len(facts.class_names)} classes: {', '.join(facts.class_names)}")
    start, step, done = time.perf_counter(), 0, False
    while not done:
        for batch in data.train_dataloader():
            images, labels = labelled(batch)
            if len(labels):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16-mixed"):
                    logits = model(images)
                loss = F.cross_entropy(logits.float(), labels, label_smoothing=0.1)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                scheduler.step()
                step += 1
            elapsed = time.perf_counter() - start
            if args.minutes and step % FIT_TO_TIME_EVERY == 0 and step > schedule.warmup_steps:
                schedule.total_steps = steps_within(step, elapsed, args.minutes * 60 - elapsed)
            done = elapsed > args.minutes * 60 if args.minutes else step >= args.steps
            if done:
                break
            if step % 200 == 0:
                print(f"  step {step}: loss {loss.item():.3f} ({elapsed:.0f} s)", flush=True)
    bf16 = args.precision == "bf16-mixed"
    val, n_val = accuracy(model, data.val_dataloader(), bf16)
    test, n_test = accuracy(model, data.test_dataloader(), bf16)
    print(f"supervised ViT after {step} steps ({time.perf_counter() - start:.0f} s): val top-1 {val:.2%} "
          f"({n_val} images), test top-1 {test:.2%} ({n_test} images)")  # fmt: skip


if __name__ == "__main__":
    main()
