"""Train lightformer's ViT and timm's VisionTransformer side by side: throughput and accuracy at equal budgets.

Both models get the shape of a config file (default: the Fashion-MNIST config), the same initial weights
(ours converted into timm's layout), the same batches, the same AdamW with warmup + cosine and the same
label smoothing. They train in one process, alternating step by step (and alternating which goes first),
so both see the same machine load. Only the training steps are timed, not data loading.

    python benchmarks/vit_vs_timm.py                  # 100 timed steps, then test accuracy of both
    python benchmarks/vit_vs_timm.py --epochs 2       # a longer budget: accuracies become meaningful
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from timm.models.vision_transformer import VisionTransformer as TimmViT
from torch import nn

from lightformer.data import ImageDataModule
from lightformer.models import VisionTransformer, ViTConfig, lightformer_to_timm
from lightformer.tasks.optim import OptimizerConfig, configure_adamw

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "vision" / "vit_fashion_mnist.yaml"
SHAPE_KEYS = (
    "patch_size",
    "d_model",
    "n_layers",
    "n_heads",
    "d_ff",
    "dropout",
    "attn_dropout",
    "drop_path",
    "pool",
    "position",
    "norm",
    "activation",
    "qkv_bias",
    "bias",
)


def read_config(path: Path) -> tuple[dict, dict, dict]:
    """(model init_args, data init_args, trainer) of a lightformer vision config."""
    config = yaml.safe_load(path.read_text())
    return config["model"]["init_args"], config["data"]["init_args"], config.get("trainer", {})


def build_models(shape: dict, image_size: int, in_channels: int, num_classes: int) -> tuple[VisionTransformer, TimmViT]:
    """Our ViT, and timm's with the same architecture and the same initial weights."""
    ours = VisionTransformer(
        ViTConfig(image_size=image_size, in_channels=in_channels, num_classes=num_classes, **shape)
    )
    if shape.get("norm", "layernorm") != "layernorm":
        raise ValueError("the timm side of this benchmark is built with LayerNorm only")
    if not shape.get("bias", True):
        raise ValueError("timm's ViT has no switch for its norms' biases: the timm side needs bias=true")
    pool = shape.get("pool", "cls")
    d_model = shape.get("d_model", 768)
    theirs = TimmViT(
        img_size=image_size,
        patch_size=shape.get("patch_size", 16),
        in_chans=in_channels,
        num_classes=num_classes,
        embed_dim=d_model,
        depth=shape.get("n_layers", 12),
        num_heads=shape.get("n_heads", 12),
        mlp_ratio=(shape.get("d_ff") or 4 * d_model) / d_model,
        qkv_bias=shape.get("qkv_bias", True),
        class_token=pool == "cls",
        global_pool="token" if pool == "cls" else "avg",
        drop_rate=0.0,
        pos_drop_rate=shape.get("dropout", 0.0),
        proj_drop_rate=shape.get("dropout", 0.0),
        attn_drop_rate=shape.get("attn_dropout", 0.0),
        drop_path_rate=shape.get("drop_path", 0.0),
        act_layer={"gelu": "gelu", "gelu_tanh": "gelu_tanh", "relu": "relu"}[shape.get("activation", "gelu")],
    )
    theirs.load_state_dict(lightformer_to_timm(ours.state_dict()), strict=True)
    if shape.get("position") == "sincos":
        theirs.pos_embed.requires_grad_(False)  # fixed in ours too
    return ours, theirs


class Trainee:
    """One model with its optimiser, schedule and accumulated training time."""

    def __init__(self, name: str, model: nn.Module, hp: dict, total_steps: int, label_smoothing: float) -> None:
        self.name, self.model, self.label_smoothing = name, model.train(), label_smoothing
        optimizer = hp.get("optimizer", {})
        optimizer = OptimizerConfig(**optimizer | {"betas": tuple(optimizer.get("betas", (0.9, 0.999)))})
        optim = configure_adamw(model, optimizer, total_steps)
        self.optimizer, self.scheduler = optim["optimizer"], optim["lr_scheduler"]["scheduler"]
        self.seconds, self.images, self.last_loss = 0.0, 0, float("nan")

    def step(self, images: torch.Tensor, labels: torch.Tensor, bf16: bool, timed: bool) -> None:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = self.model(images)
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=self.label_smoothing)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        if timed:
            self.seconds += time.perf_counter() - start
            self.images += len(images)
        self.last_loss = loss.item()

    @torch.no_grad()
    def accuracy(self, loader, bf16: bool) -> float:
        self.model.eval()
        correct = total = 0
        for images, labels in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                correct += (self.model(images).argmax(-1) == labels).sum().item()
            total += len(labels)
        self.model.train()
        return correct / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="a lightformer vision config")
    parser.add_argument("--steps", type=int, default=100, help="timed training steps (ignored with --epochs)")
    parser.add_argument("--epochs", type=float, default=None, help="train this many epochs instead of --steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed first steps (allocator, caches)")
    parser.add_argument("--batch_size", type=int, default=None, help="default: the config's")
    parser.add_argument("--precision", choices=["32-true", "bf16-mixed"], default=None, help="default: the config's")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--eval_split", choices=["test", "val", "none"], default="test")
    parser.add_argument("--root", default="data", help="where datasets are stored")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    hp, data_args, trainer = read_config(args.config)
    source = {**data_args.get("source", {}), "root": args.root}
    loader = {**data_args.get("loader", {}), "num_workers": 0}
    if args.batch_size:
        loader["batch_size"] = args.batch_size
    data = ImageDataModule(**{**data_args, "source": source, "loader": loader})
    data.prepare_data()
    data.setup()
    precision = args.precision or trainer.get("precision", "32-true")
    bf16 = "bf16" in str(precision)

    torch.manual_seed(args.seed)
    shape = {k: hp["net"][k] for k in SHAPE_KEYS if k in hp["net"]}
    ours, theirs = build_models(shape, data.image_size, data.in_channels, data.num_classes)
    loader = data.train_dataloader()
    steps = round(args.epochs * len(loader)) if args.epochs else args.steps + args.warmup
    label_smoothing = hp.get("label_smoothing", 0.1)
    trainees = [
        Trainee("lightformer", ours, hp, steps, label_smoothing),
        Trainee("timm", theirs, hp, steps, label_smoothing),
    ]

    print(f"config {args.config.name}: {shape}")
    print(f"{steps} steps of batch {data.loader.batch_size}, precision {precision}, {torch.get_num_threads()} threads")
    step = 0
    start = time.perf_counter()
    while step < steps:
        for images, labels in loader:
            if step >= steps:
                break
            order = trainees if step % 2 == 0 else trainees[::-1]  # alternate who runs first
            for trainee in order:
                trainee.step(images, labels, bf16, timed=step >= args.warmup)
            step += 1
            if step % max(1, steps // 10) == 0:
                losses = ", ".join(f"{t.name} {t.last_loss:.3f}" for t in trainees)
                print(f"  step {step}/{steps}: loss {losses} ({time.perf_counter() - start:.0f} s)", flush=True)

    eval_loader = {"test": data.test_dataloader, "val": data.val_dataloader}.get(args.eval_split)
    rows = []
    for trainee in trainees:
        params = sum(p.numel() for p in trainee.model.parameters())
        accuracy = trainee.accuracy(eval_loader(), bf16) if eval_loader else float("nan")
        timed_steps = steps - args.warmup
        rows.append(
            (trainee.name, params, trainee.images / trainee.seconds, 1000 * trainee.seconds / timed_steps, accuracy)
        )
    print()
    print(f"{'model':<12} {'params':>9} {'images/s':>9} {'ms/step':>8} {args.eval_split + ' acc':>9}")
    for name, params, rate, ms, accuracy in rows:
        print(f"{name:<12} {params:>9,} {rate:>9.0f} {ms:>8.1f} {accuracy:>9.2%}")
    print(f"ratio ours/timm: {rows[0][2] / rows[1][2]:.3f} (images/s; > 1 means lightformer is faster)")


if __name__ == "__main__":
    main()
