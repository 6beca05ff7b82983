"""Train lightformer's contrastive model and OpenCLIP's CLIP side by side: speed, zero-shot, retrieval at equal steps.

Both models get the shape of a contrastive config (default: ``configs/contrastive/clipart.yaml``), the same initial
weights (ours copied into OpenCLIP's layout: ``lightformer_to_openclip``), the same batches of the config's data, the
same AdamW with warmup and cosine decay, and each its own framework's loss (ours ``contrastive_loss``, OpenCLIP's
``ClipLoss``/``SigLipLoss``; OpenCLIP's temperature clamped after each step as its training script does). They train
in one process, alternating step by step (and alternating which goes first), so both see the same machine load; only
the training steps are timed, not data loading. Then each is evaluated the same way on the config's test split:
zero-shot top-1 over the data's classes (the config's prompt templates, averaged) and image→text recall@5
over the split's distinct captions, a caption equal to any of an image's counting as a hit.

    python benchmarks/clip_vs_openclip.py --steps 300 --seeds 0 1 2       # quality at equal steps, mean of 3 seeds
    python benchmarks/clip_vs_openclip.py --steps 40 --precision bf16-mixed --eval none   # speed only, bf16
"""

from __future__ import annotations

import argparse
import importlib
import math
import statistics
import time
from pathlib import Path

import open_clip
import torch
import torch.nn.functional as F
import yaml
from torch import Tensor, nn

from lightformer.models.contrastive import ContrastiveConfig, ContrastiveModel
from lightformer.tasks.contrastive import DEFAULT_TEMPLATES, contrastive_loss, recalls
from lightformer.tasks.optim import OptimizerConfig, configure_adamw

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "contrastive" / "clipart.yaml"


def read_config(path: Path) -> tuple[dict, dict, dict]:
    """(model init_args, data section, trainer) of a lightformer contrastive config."""
    config = yaml.safe_load(path.read_text())
    return config["model"]["init_args"], config["data"], config.get("trainer", {})


def build_data(data: dict, batch_size: int | None):
    """The config's data module, prepared and set up for fit and test (loader workers 0: batches come in the main
    process, the same for both models)."""
    module, name = data["class_path"].rsplit(".", 1)
    args = dict(data.get("init_args", {}))
    args["loader"] = {**args.get("loader", {}), "num_workers": 0} | ({"batch_size": batch_size} if batch_size else {})
    datamodule = getattr(importlib.import_module(module), name)(**args)
    datamodule.prepare_data()
    datamodule.setup("fit")
    datamodule.setup("test")
    return datamodule


def our_model(net: dict, facts) -> ContrastiveModel:
    """Our model at the config's shape, sized by the data's facts."""
    image = {**net.get("image", {}), "image_size": facts.image_size, "in_channels": facts.in_channels}
    text = {**net.get("text", {}), "vocab_size": facts.vocab_size}
    values = {k: v for k, v in net.items() if k not in ("image", "text")}
    return ContrastiveModel(ContrastiveConfig(image=image, text=text, pad_id=facts.pad_id, **values))


def check_shape(config: ContrastiveConfig) -> None:
    """Refuse a shape OpenCLIP's CLIP cannot take: its ViT is pre-norm with a class token and no patch bias, its
    layers LayerNorm + GELU with biases, its text tower causal with learned positions."""
    image, text = config.image, config.text
    wrong = [f"image.{name}={getattr(image, name)!r}" for name, ok in (
        ("pre_norm", True), ("pool", "cls"), ("position", "learned"), ("norm", "layernorm"), ("activation", "gelu"),
        ("bias", True)) if getattr(image, name) != ok]  # fmt: skip
    wrong += [f"text.{name}={getattr(text, name)!r}" for name, ok in (
        ("position", "learned"), ("norm", "layernorm"), ("activation", "gelu"), ("bias", True))
        if getattr(text, name) != ok]  # fmt: skip
    if config.text_pool != "eos":
        wrong.append(f"text_pool={config.text_pool!r}")
    if wrong:
        raise SystemExit(f"OpenCLIP's CLIP has no counterpart of {', '.join(wrong)}: benchmark another config")


def openclip_model(config: ContrastiveConfig, eos_id: int) -> nn.Module:
    """OpenCLIP's CLIP at our model's shape (built from a config dict, as its model configs are; no weights)."""
    image, text = config.image, config.text
    patch = image.patch_size if isinstance(image.patch_size, int) else image.patch_size[0]
    vision_cfg = dict(
        layers=image.n_layers, width=image.d_model, head_width=image.d_model // image.n_heads,
        mlp_ratio=(image.d_ff or 4 * image.d_model) / image.d_model, patch_size=patch, image_size=image.image_size,
        norm_kwargs={"eps": image.norm_eps},
    )  # fmt: skip
    text_cfg = dict(
        context_length=text.block_size, vocab_size=text.vocab_size, width=text.d_model, heads=text.n_heads,
        layers=text.n_layers, mlp_ratio=(text.d_ff or 4 * text.d_model) / text.d_model, pad_id=config.pad_id,
        eos_id=eos_id, pool_type="eos", norm_kwargs={"eps": text.norm_eps},
    )  # fmt: skip
    bias = -10.0 if config.loss == "sigmoid" else None
    return open_clip.CLIP(
        config.embed_dim, vision_cfg, text_cfg, quick_gelu=False, init_logit_bias=bias, output_dict=True
    )


def lightformer_to_openclip(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our contrastive model's state dict in OpenCLIP's CLIP layout (the same numbers, OpenCLIP's names and
    orientation: its projections are (width, embed_dim), its class token a vector)."""
    layer = {"norm1": "ln_1", "self_attn.qkv.weight": "attn.in_proj_weight",
             "self_attn.qkv.bias": "attn.in_proj_bias", "self_attn.proj": "attn.out_proj", "norm2": "ln_2",
             "ffn.fc1": "mlp.c_fc", "ffn.fc2": "mlp.c_proj"}  # fmt: skip
    fixed = {"image.patch_embed.proj.weight": "visual.conv1.weight", "image.pos_embed.weight":
             "visual.positional_embedding", "image.norm_pre.weight": "visual.ln_pre.weight", "image.norm_pre.bias":
             "visual.ln_pre.bias", "image.encoder.norm.weight": "visual.ln_post.weight", "image.encoder.norm.bias":
             "visual.ln_post.bias", "text.embed.weight": "token_embedding.weight", "text.position.weight":
             "positional_embedding", "text.decoder.norm.weight": "ln_final.weight", "text.decoder.norm.bias":
             "ln_final.bias", "logit_scale": "logit_scale", "logit_bias": "logit_bias"}  # fmt: skip
    out = {}
    for name, value in state.items():
        if name in fixed:
            out[fixed[name]] = value
        elif name == "image.cls_token":
            out["visual.class_embedding"] = value.reshape(-1)
        elif name == "image_projection.weight":
            out["visual.proj"] = value.T
        elif name == "text_projection.weight":
            out["text_projection"] = value.T
        elif ".layers." in name:
            tower, rest = name.split(".layers.", 1)
            index, inner = rest.split(".", 1)
            prefix = {"image.encoder": "visual.transformer", "text.decoder": "transformer"}[tower]
            key = next(k for k in layer if inner == k or inner.startswith(k + "."))
            out[f"{prefix}.resblocks.{index}.{layer[key]}{inner[len(key) :]}"] = value
        elif name != "text.lm_head.weight":  # the tied LM head: the token embedding again
            raise KeyError(f"{name} has no place in OpenCLIP's CLIP")
    return {k: v.clone() for k, v in out.items()}


class Trainee:
    """One model with its optimiser, schedule, loss, encoders (images → unit embeddings, ids → unit embeddings) and
    accumulated training time."""

    def __init__(
        self, name: str, model: nn.Module, optimizer: OptimizerConfig, total_steps: int, loss, encoders
    ) -> None:
        self.name, self.model, self.loss, self.encoders = name, model.train(), loss, encoders
        optim = configure_adamw(model, optimizer, total_steps)
        self.optimizer, self.scheduler = optim["optimizer"], optim["lr_scheduler"]["scheduler"]
        self.seconds, self.images, self.last_loss = 0.0, 0, float("nan")

    def step(self, images: Tensor, ids: Tensor, bf16: bool, timed: bool) -> None:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = self.loss(images, ids)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        if self.name == "OpenCLIP":  # its training script clamps the temperature after each step
            with torch.no_grad():
                self.model.logit_scale.clamp_(0, math.log(100))
        if timed:
            self.seconds += time.perf_counter() - start
            self.images += len(images)
        self.last_loss = loss.item()


def our_loss(model: ContrastiveModel):
    def loss(images: Tensor, ids: Tensor) -> Tensor:
        image_embeddings, text_embeddings = model(images, ids)
        return contrastive_loss(image_embeddings, text_embeddings, model.scale(), model.logit_bias,
                                model.config.loss)[0]  # fmt: skip

    return loss


def to_context(ids: Tensor, context: int, pad_id: int) -> Tensor:
    """Captions padded to OpenCLIP's fixed context length, as its tokenizer gives them (its CLIP adds the whole
    position table: it reads no shorter batch)."""
    return F.pad(ids, (0, context - ids.shape[1]), value=pad_id)


def openclip_loss(model: nn.Module, kind: str, pad_id: int):
    criterion = open_clip.ClipLoss() if kind == "infonce" else open_clip.SigLipLoss()

    def loss(images: Tensor, ids: Tensor) -> Tensor:
        out = model(images, to_context(ids, model.context_length, pad_id))
        args = (out["image_features"], out["text_features"], out["logit_scale"])
        return criterion(*args) if kind == "infonce" else criterion(*args, out["logit_bias"])

    return loss


def openclip_encoders(model: nn.Module, pad_id: int) -> tuple:
    """OpenCLIP's (images → unit embeddings, ids → unit embeddings)."""
    return (lambda x: model.encode_image(x, normalize=True)), (
        lambda ids: model.encode_text(to_context(ids, model.context_length, pad_id), normalize=True)
    )


@torch.no_grad()
def evaluate(trainee: Trainee, loader, tokenizer, pad_id: int, block: int, class_names, templates, bf16: bool) -> dict:
    """Zero-shot top-1 (images with a class) and recall@1/5/10 both ways on ``loader``'s split."""
    encode_image, encode_text = trainee.encoders
    trainee.model.eval()

    def texts_to_ids(texts: list[str]) -> Tensor:
        rows = tokenizer.encode_batch(texts, add_bos=True, add_eos=True)
        rows = [row if len(row) <= block else [*row[: block - 1], row[-1]] for row in rows]
        ids = torch.full((len(rows), max(map(len, rows))), pad_id, dtype=torch.int64)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
        return ids

    def embed_texts(texts: list[str]) -> Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return torch.cat([encode_text(texts_to_ids(texts[i : i + 256])).float() for i in range(0, len(texts), 256)])

    images, references, labels = [], [], []
    for batch in loader:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            images.append(encode_image(batch["images"]).float())
        references += batch["references"]
        if "labels" in batch:
            labels.append(batch["labels"])
    images = torch.cat(images)
    captions = sorted({ref for refs in references for ref in refs})
    index = {text: i for i, text in enumerate(captions)}
    relevant = torch.zeros(len(images), len(captions), dtype=torch.bool)
    for row, refs in enumerate(references):
        relevant[row, [index[ref] for ref in refs]] = True
    found = recalls(images @ embed_texts(captions).T, relevant)
    if class_names and labels:
        labels = torch.cat(labels)
        prompts = [template.replace("{}", name) for name in class_names for template in templates]
        classes = F.normalize(embed_texts(prompts).view(len(class_names), len(templates), -1).mean(1), dim=-1)
        labelled = labels >= 0
        found["zero_shot_top1"] = ((images[labelled] @ classes.T).argmax(1) == labels[labelled]).float().mean().item()
    trainee.model.train()
    return found


def run_seed(args, seed: int, hp: dict, data, facts, bf16: bool) -> list[dict]:
    """Train both models from one seed's initial weights; their speed and, unless ``--eval none``, their figures."""
    torch.manual_seed(seed)
    net = {**hp["net"], **{tower: {**hp["net"].get(tower, {}), "dropout": 0.0} for tower in ("image", "text")}}
    ours = our_model(net, facts)  # without dropout: OpenCLIP's CLIP has none
    check_shape(ours.config)
    theirs = openclip_model(ours.config, eos_id=2)
    missing, unexpected = theirs.load_state_dict(lightformer_to_openclip(ours.state_dict()), strict=False)
    if unexpected or set(missing) - {"attn_mask"}:
        raise SystemExit(f"the weights do not map onto OpenCLIP's CLIP: missing {missing}, unexpected {unexpected}")
    optimizer = hp.get("optimizer", {})
    optimizer = OptimizerConfig(**optimizer | {"betas": tuple(optimizer.get("betas", (0.9, 0.999)))})
    steps = args.steps + args.warmup
    trainees = [
        Trainee("lightformer", ours, optimizer, steps, our_loss(ours), (ours.encode_image, ours.encode_text)),
        Trainee(
            "OpenCLIP",
            theirs,
            optimizer,
            steps,
            openclip_loss(theirs, ours.config.loss, facts.pad_id),
            openclip_encoders(theirs, facts.pad_id),
        ),  # fmt: skip
    ]
    step, start = 0, time.perf_counter()
    while step < steps:
        for batch in data.train_dataloader():
            if step >= steps:
                break
            order = trainees if step % 2 == 0 else trainees[::-1]
            for trainee in order:
                trainee.step(batch["images"], batch["tgt"], bf16, timed=step >= args.warmup)
            step += 1
            if step % max(1, steps // 5) == 0:
                losses = ", ".join(f"{t.name} {t.last_loss:.3f}" for t in trainees)
                print(f"  seed {seed} step {step}/{steps}: loss {losses} ({time.perf_counter() - start:.0f} s)",
                      flush=True)  # fmt: skip
    rows = []
    for trainee in trainees:
        row = {"name": trainee.name, "images/s": trainee.images / trainee.seconds}
        if args.eval != "none":
            loader = data.test_dataloader() if args.eval == "test" else data.val_dataloader()
            templates = hp.get("templates", DEFAULT_TEMPLATES)
            row |= evaluate(trainee, loader, data.tokenizer, facts.pad_id, ours.config.text.block_size,
                            facts.class_names, templates, bf16)  # fmt: skip
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="a lightformer contrastive config")
    parser.add_argument("--steps", type=int, default=100, help="timed training steps per seed")
    parser.add_argument("--warmup", type=int, default=5, help="untimed first steps (allocator, caches)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--batch_size", type=int, default=None, help="default: the config's")
    parser.add_argument("--precision", choices=["32-true", "bf16-mixed"], default="32-true")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--eval", choices=["test", "val", "none"], default="test")
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    hp, data_section, _ = read_config(args.config)
    data = build_data(data_section, args.batch_size)
    facts = data.data_facts()
    bf16 = args.precision == "bf16-mixed"
    print(f"config {args.config.name}: {args.steps} timed steps of batch {data.loader.batch_size} per seed, "
          f"precision {args.precision}, {torch.get_num_threads()} threads, seeds {args.seeds}")  # fmt: skip
    results = [run_seed(args, seed, hp, data, facts, bf16) for seed in args.seeds]
    print()
    keys = [k for k in results[0][0] if k != "name"]
    print(f"{'model':<20} " + " ".join(f"{k:>15}" for k in keys))
    for i in range(2):
        name = results[0][i]["name"]
        if len(args.seeds) > 1:  # each seed, then their mean: a seed moves either model by more than the gap
            for seed, rows in zip(args.seeds, results, strict=True):
                print(f"{f'{name} seed {seed}':<20} " + " ".join(f"{rows[i][k]:>15.4f}" for k in keys))
        means = {k: statistics.mean(rows[i][k] for rows in results) for k in keys}
        print(f"{f'{name} mean':<20} " + " ".join(f"{means[k]:>15.4f}" for k in keys))
    ratio = statistics.mean(rows[0]["images/s"] / rows[1]["images/s"] for rows in results)
    print(f"speed ratio ours/OpenCLIP: {ratio:.3f} (images/s; > 1 means lightformer is faster)")


if __name__ == "__main__":
    main()
