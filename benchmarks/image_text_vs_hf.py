"""Our image-to-text model against Hugging Face's ``VisionEncoderDecoderModel`` at the identical configuration.

Hugging Face's side is ``VisionEncoderDecoderModel`` built from configs (no hub): a ``ViTConfig`` encoder and a
``GPT2Config(add_cross_attention=True)`` decoder. HF's ViT takes a rectangular image and patch (``image_size`` and
``patch_size`` as (height, width) pairs), so both models read the recipe's 32 × 384 grey lines in 32 × 4 patches:
96 patches each. Both have the shape of configs/image_text/printed_lines.yaml (3 + 3 layers, width 128, 4 heads,
feed-forward 512, GELU, learned positions, tied output layer, the char tokenizer's vocabulary, ``max_len``
positions), without dropout, and ours without its CTC head, so that both compute the same loss: the decoder's
label-smoothed cross-entropy. What still differs, and is counted in the parameters and FLOPs printed: HF's ViT
prepends a class token to the patches (97 encoder tokens, and one more position) and has a pooler (a linear layer
on that token, computed in every forward, unused by the decoder, so never trained).

On the same batches of the recipe's rendered lines (``ImageTextDataModule`` with the config's data; preparing it
renders 50,000 lines, about three minutes on 2 cores, once: ``--train-lines`` renders fewer), in one process:

1. Training speed: steps/s of forward, backward and AdamW step (the recipe's fused AdamW and schedule), batch 32,
   in fp32 and in bf16 (``torch.autocast``), in rounds that alternate which model goes first; median round.
2. Reading after the same training: both train ``--steps`` steps on the same batch sequence with the same AdamW
   (the config's lr, weight decay, min_lr, its warm-up shortened to ``--warmup-steps``, cosine to the last step;
   no decay of biases and norms in either, nor of HF's position tables and class token; ours decays its two
   position tables, since ``VisionEncoderDecoder`` declares no ``no_weight_decay``; measured not to change its
   CER: docs/results.md, Image to text), label smoothing and gradient clipping,
   then greedy-read the validation lines (held-out text in held-out typefaces): ours with
   ``lightformer.generation.beam_search`` (beam 1 is greedy) on its cached incremental decoder, HF with
   ``generate(num_beams=1, do_sample=False)``. CER by torchmetrics' ``CharErrorRate``.

    python benchmarks/image_text_vs_hf.py                      # speed, then 300 steps each and the CER (~8 min)
    python benchmarks/image_text_vs_hf.py --steps 0            # speed only
    python benchmarks/image_text_vs_hf.py --quick              # tiny shapes and data, a few steps: the smoke test

On a CPU shared with other jobs, pass ``--threads 1``: with two threads on contended cores a step ran 100× slower.
"""

from __future__ import annotations

import argparse
import datetime
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
import yaml
from torch import Tensor, nn
from torch.utils import flop_counter
from torchmetrics.text import CharErrorRate

from lightformer.data import ImageTextDataModule
from lightformer.data.loading.streaming import LoaderConfig
from lightformer.data.preparation.prepare import PrepareConfig
from lightformer.data.sources.lines import ImageTextSource
from lightformer.generation import beam_search
from lightformer.models.vision_text import VisionEncoderDecoder, VisionEncoderDecoderConfig
from lightformer.tasks.compilation import DYNAMIC_COMPILE_OPTIONS
from lightformer.tasks.image_text import image_text_loss
from lightformer.tasks.optim import OptimizerConfig, configure_adamw
from lightformer.training.peaks import auto_precision

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "image_text" / "printed_lines.yaml"
NAMES = ("lightformer", "huggingface")
QUICK_TOWER = {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64}
QUICK_NET = {"encoder": QUICK_TOWER, "decoder": QUICK_TOWER}
Batch = dict[str, Tensor | list[str]]


def read_config(path: Path) -> tuple[dict, dict, dict]:
    """(model init_args, data init_args, trainer) of an image-to-text config."""
    config = yaml.safe_load(path.read_text())
    return config["model"]["init_args"], config["data"]["init_args"], config.get("trainer", {})


def build_models(
    net: VisionEncoderDecoderConfig, bos_id: int, eos_id: int, pad_id: int, ctc: bool = False, seed: int = 0
) -> dict[str, nn.Module]:
    """Ours and HF's VisionEncoderDecoderModel (ViT + GPT-2 with cross-attention) at ``net``'s shape, without
    dropout, each seeded with ``seed`` and initialised its own way; with ``ctc``, each with a CTC head on its
    encoder's patches (ours: ``ctc_head``; HF: the same linear layer on its ViT's patch tokens, class token left
    out), else neither."""
    from transformers import GPT2Config, VisionEncoderDecoderModel, ViTConfig
    from transformers import VisionEncoderDecoderConfig as HFConfig

    e = replace(net.encoder, dropout=0.0, attn_dropout=0.0)
    d = replace(net.decoder, dropout=0.0, attn_dropout=None)
    net = replace(net, ctc_head=ctc, encoder=e, decoder=d)
    if {e.norm, d.norm} != {"layernorm"} or {e.position, d.position} != {"learned"}:
        raise ValueError("HF's ViT and GPT-2 have LayerNorm and learned positions only")
    if not d.tie_weights:
        raise ValueError("GPT-2 ties its output layer to its token embedding: build ours with tie_weights=true")
    activations = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
    encoder = ViTConfig(
        image_size=e.image_size,
        patch_size=e.patch_size,
        num_channels=e.in_channels,
        hidden_size=e.d_model,
        num_hidden_layers=e.n_layers,
        num_attention_heads=e.n_heads,
        intermediate_size=e.d_ff or 4 * e.d_model,
        hidden_act=activations[e.activation],
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    decoder = GPT2Config(
        vocab_size=d.vocab_size,
        n_positions=d.block_size,
        n_embd=d.d_model,
        n_layer=d.n_layers,
        n_head=d.n_heads,
        n_inner=d.d_ff or 4 * d.d_model,
        activation_function=activations[d.activation],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        add_cross_attention=True,
        is_decoder=True,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    config = HFConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = bos_id, pad_id, eos_id
    torch.manual_seed(seed)
    ours = VisionEncoderDecoder(net)
    torch.manual_seed(seed)
    hf = VisionEncoderDecoderModel(config=config)
    if ctc:
        hf.ctc_head = nn.Linear(encoder.hidden_size, d.vocab_size)
    # What timm never decays (configure_adamw reads it): position tables and the class token.
    hf.no_weight_decay = lambda: {
        "encoder.embeddings.position_embeddings",
        "encoder.embeddings.cls_token",
        "decoder.transformer.wpe.weight",
    }
    return {"lightformer": ours, "huggingface": hf}


def logits_of(name: str, model: nn.Module, images: Tensor, tgt_in: Tensor, ctc: bool = False):
    """The decoder's logits; with ``ctc``, also each patch's CTC logits ``(batch, patches, vocab)``."""
    if name == "lightformer":
        return model(images, tgt_in, ctc=ctc)
    out = model(pixel_values=images, decoder_input_ids=tgt_in, use_cache=False)  # no cache in training
    return (out.logits, model.ctc_head(out.encoder_last_hidden_state[:, 1:])) if ctc else out.logits


class Trainee:
    """One model with the config's AdamW and schedule."""

    def __init__(
        self, name: str, model: nn.Module, optimizer: OptimizerConfig, total_steps: int, hp: dict, compile: bool
    ) -> None:
        self.name, self.model = name, model.train()
        # Compiled as ImageToTextTask(compile=true) compiles its model and loss: one graph, dynamic shapes.
        self.loss = torch.compile(self.loss, dynamic=True, options=DYNAMIC_COMPILE_OPTIONS) if compile else self.loss
        optim = configure_adamw(model, optimizer, max(1, total_steps))
        self.optimizer, self.scheduler = optim["optimizer"], optim["lr_scheduler"]["scheduler"]
        self.label_smoothing, self.pad_id, self.clip = hp["label_smoothing"], hp["pad_id"], hp["clip"]
        self.ctc_weight = hp["ctc_weight"]
        self.seconds, self.steps, self.last_loss = 0.0, 0, float("nan")

    def loss(self, batch: Batch, bf16: bool) -> Tensor:
        """The decoder's label-smoothed cross-entropy, plus ``ctc_weight`` × the CTC loss of the encoder's patches
        (as ``ImageToTextTask`` computes both)."""
        tgt, ctc = batch["tgt"], self.ctc_weight > 0
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = logits_of(self.name, self.model, batch["images"], tgt[:, :-1], ctc)
        logits, patch_logits = logits if ctc else (logits, None)
        return image_text_loss(logits, tgt, self.pad_id, self.label_smoothing, patch_logits, self.ctc_weight)

    def step(self, batch: Batch, bf16: bool, clip: bool = False) -> None:
        start = time.perf_counter()
        loss = self.loss(batch, bf16)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip and self.clip:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.scheduler.step()
        self.seconds += time.perf_counter() - start
        self.steps += 1
        self.last_loss = loss.item()

    def run(self, batches: list[Batch], bf16: bool) -> float:
        """Seconds for one step per batch."""
        start = time.perf_counter()
        for batch in batches:
            self.step(batch, bf16)
        return time.perf_counter() - start

    @torch.no_grad()
    def read(self, images: Tensor, max_len: int, bos: int, eos: int, pad: int, bf16: bool) -> list[list[int]]:
        """Greedy readings of ``images``: token ids without BOS, EOS and padding."""
        self.model.eval()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            if self.name == "lightformer":
                decoder = self.model.incremental_decoder(images, 1)
                ids, _ = beam_search(decoder, len(images), 1, bos, eos, max_len - 1, 1.0, device=images.device)
            else:
                out = self.model.generate(
                    pixel_values=images,
                    max_new_tokens=max_len - 1,
                    decoder_start_token_id=bos,
                    bos_token_id=bos,
                    eos_token_id=eos,
                    pad_token_id=pad,
                    num_beams=1,
                    do_sample=False,
                )
                ids = []
                for row in out[:, 1:].tolist():  # after the start token, up to EOS
                    ids.append(row[: row.index(eos)] if eos in row else row)
        self.model.train()
        return ids


def training_flops(name: str, model: nn.Module, batch: Batch) -> int:
    """FLOPs of one forward and backward (eager, fp32) on ``batch``, counted by ``FlopCounterMode``."""
    from peers import CPU_ATTENTION_FLOPS

    tgt = batch["tgt"]
    with flop_counter.FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS) as counter:
        logits_of(name, model, batch["images"], tgt[:, :-1]).float().sum().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def make_data(args: argparse.Namespace, data_args: dict) -> ImageTextDataModule:
    source = dict(data_args.get("source", {}), data_root=args.data_root)
    for key in ("train_lines", "val_lines", "test_lines"):
        if getattr(args, key) is not None:
            source[key] = getattr(args, key)
    loader = dict(data_args.get("loader", {}), num_workers=0)
    if args.batch_size:
        loader["batch_size"] = args.batch_size
    options = {k: v for k, v in data_args.items() if k not in ("source", "loader", "prepare")}
    prepare = PrepareConfig(**{**data_args.get("prepare", {}), "dir": args.prepare_dir})
    data = ImageTextDataModule(
        source=ImageTextSource(**source), loader=LoaderConfig(**loader), prepare=prepare, **options
    )
    data.prepare_data()
    data.setup("fit")
    return data


def take(loader, count: int) -> list[Batch]:
    """``count`` batches of ``loader``, epoch after epoch."""
    batches: list[Batch] = []
    while len(batches) < count:
        for batch in loader:
            batches.append(batch)
            if len(batches) == count:
                break
    return batches


def measure_speed(
    precision: str, batches: list[Batch], trainees: dict[str, Trainee], args: argparse.Namespace
) -> dict[str, float]:
    """Median seconds per step of each model, its rounds alternating which model goes first."""
    bf16 = precision == "bf16"
    for trainee in trainees.values():  # warm-up: allocator, AdamW state, oneDNN kernels
        trainee.run(batches[: args.warmup], bf16)
    seconds = {name: [] for name in trainees}
    for round_ in range(args.rounds):
        for name in NAMES if round_ % 2 == 0 else NAMES[::-1]:
            seconds[name].append(trainees[name].run(batches, bf16) / len(batches))
    return {name: statistics.median(s) for name, s in seconds.items()}


def train_and_read(
    data: ImageTextDataModule, trainees: dict[str, Trainee], bf16: bool, args: argparse.Namespace, max_len: int
) -> dict[str, dict]:
    """Train both ``args.steps`` steps on the same batches, then greedy-read the validation lines."""
    tokenizer = data.tokenizer
    step, start = 0, time.perf_counter()
    loader = data.train_dataloader()
    while step < args.steps:
        for batch in loader:
            if step >= args.steps:
                break
            for name in NAMES if step % 2 == 0 else NAMES[::-1]:
                trainees[name].step(batch, bf16, clip=True)
            step += 1
            if step % max(1, args.steps // 10) == 0:
                losses = ", ".join(f"{name} {t.last_loss:.3f}" for name, t in trainees.items())
                print(f"  step {step}/{args.steps}: loss {losses} ({time.perf_counter() - start:.0f} s)", flush=True)
    results = {}
    for name, trainee in trainees.items():
        cer, read_seconds = CharErrorRate(), 0.0
        for batch in data.val_dataloader():
            begin = time.perf_counter()
            ids = trainee.read(batch["images"], max_len, tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id, bf16)
            read_seconds += time.perf_counter() - begin
            readings = tokenizer.decode_batch(ids)
            cer.update(readings, batch["text"])
            example = (batch["text"][0], readings[0])
        results[name] = {"cer": cer.compute().item(), "read_s": read_seconds, "example": example}
    return results


def machine() -> str:
    from peers import machine as described

    return described(torch.device("cpu"))


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    rule = ["---"] + ["---:"] * (len(header) - 1)
    return "\n".join("| " + " | ".join(row) + " |" for row in [header, rule, *rows])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="an image-to-text config")
    parser.add_argument("--precisions", nargs="*", choices=["fp32", "bf16"], default=["fp32", "bf16"])
    parser.add_argument("--speed-steps", type=int, default=10, help="timed training steps per round")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per model and precision (median kept)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per model before the timed rounds")
    parser.add_argument("--steps", type=int, default=300, help="training steps of each model before reading; 0: none")
    parser.add_argument("--warmup-steps", type=int, default=None, help="lr warm-up; default min(config's, steps/5)")
    parser.add_argument(
        "--cer-precision",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="precision of that training and reading; auto: the config's (precision: auto)",
    )
    parser.add_argument(
        "--ctc-weight", type=float, default=0.0, help="train both with a CTC loss on the encoder (the config: 0.5)"
    )
    parser.add_argument(
        "--compile", action="store_true", help="both models' forward and loss through torch.compile (dynamic shapes)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds both models' initialisations")
    parser.add_argument("--batch-size", type=int, default=None, help="default: the config's")
    parser.add_argument("--train-lines", type=int, default=None, help="default: the config's data")
    parser.add_argument("--val-lines", type=int, default=None, help="lines read for the CER; default: the config's")
    parser.add_argument("--test-lines", type=int, default=None, help="rendered, unused; default: the config's data")
    parser.add_argument("--prepare-dir", default=PrepareConfig.dir, help="where the rendered lines are kept")
    parser.add_argument("--data-root", default="data", help="where the Austen corpus is stored")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes and data, a few steps (the smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.speed_steps, args.rounds, args.warmup, args.steps = 2, 1, 1, min(args.steps, 4)
        args.batch_size = args.batch_size or 8
        args.train_lines, args.val_lines, args.test_lines = args.train_lines or 32, args.val_lines or 8, 0
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()  # its advice to pass an attention mask: the padding is at the end
    hp, data_args, trainer = read_config(args.config)
    data = make_data(args, data_args)
    facts = data.data_facts()
    tokenizer = data.tokenizer
    shape = dict(hp["net"])
    from_data = {
        "encoder": {"image_size": facts.image_size, "in_channels": facts.in_channels},
        "decoder": {"vocab_size": facts.vocab_size},
    }
    for tower, values in from_data.items():
        shape[tower] = {**shape.get(tower, {}), **(QUICK_NET[tower] if args.quick else {}), **values}
    net = VisionEncoderDecoderConfig(**shape)
    if facts.max_length > net.decoder.block_size:
        longest, size = facts.max_length, net.decoder.block_size
        raise ValueError(f"the data's longest line has {longest} tokens, more than decoder.block_size={size}")
    total = args.steps
    optimizer = hp.get("optimizer", {})
    warmup = min(optimizer.get("warmup_steps", 0), total // 5) if args.warmup_steps is None else args.warmup_steps
    optimizer = {k: v for k, v in optimizer.items() if k != "fit_to_max_time"} | {"warmup_steps": warmup}
    optimizer = OptimizerConfig(**optimizer | {"betas": tuple(optimizer.get("betas", (0.9, 0.999)))})
    train_hp = {
        "label_smoothing": hp.get("label_smoothing", 0.1),
        "pad_id": tokenizer.pad_id,
        "clip": trainer.get("gradient_clip_val"),
        "ctc_weight": args.ctc_weight,
    }

    def trainees(steps: int) -> dict[str, Trainee]:
        ids = tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id
        models = build_models(net, *ids, ctc=args.ctc_weight > 0, seed=args.seed)
        return {name: Trainee(name, model, optimizer, steps, train_hp, args.compile) for name, model in models.items()}

    batch_size = data.loader.batch_size
    batches = take(data.train_dataloader(), max(args.speed_steps, args.warmup, 1))
    described = ", ".join(f"{k} {v}" for k, v in shape.items() if k != "ctc_head")
    print(f"machine: {machine()}")
    print(f"date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")
    print(f"config {args.config.name}: {described}; image {facts.image_size}, vocabulary {facts.vocab_size}")
    print(f"data: {data.prepared} (train {data.manifest['lines']['train']:,} lines), batch {batch_size}")
    print(f"seed {args.seed}; " + ("forward and loss compiled (torch.compile, dynamic)" if args.compile else "eager"))

    # Equivalence of the setups: the same logits' shape on the same batch; parameters and FLOPs of each.
    models = {name: t.model for name, t in trainees(1).items()}
    tgt_in = batches[0]["tgt"][:, :-1]
    shapes = {name: tuple(logits_of(name, m, batches[0]["images"], tgt_in).shape) for name, m in models.items()}
    expected = (batch_size, tgt_in.shape[1], facts.vocab_size)
    assert shapes["lightformer"] == shapes["huggingface"] == expected, shapes
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    flops = {name: training_flops(name, m, batches[0]) for name, m in models.items()}
    hf_extra = models["huggingface"].encoder
    pooler = sum(p.numel() for p in hf_extra.pooler.parameters()) if hf_extra.pooler is not None else 0
    print(f"logits {shapes['lightformer']} from both; parameters " + ", ".join(f"{n} {p:,}" for n, p in params.items()))
    print(
        f"  HF has {params['huggingface'] - params['lightformer']:+,}: its ViT's pooler ({pooler:,}, never trained), "
        f"class token and its position ({2 * net.encoder.d_model:,})"
    )
    print(
        "training FLOPs (forward + backward, fp32) of the first batch: "
        + ", ".join(f"{n} {f / 1e9:.3g} G" for n, f in flops.items())
        + f" (HF/ours {flops['huggingface'] / flops['lightformer']:.3f})"
    )
    del models

    speed: dict[str, dict[str, float]] = {}
    timed = batches[: args.speed_steps]
    for precision in args.precisions:
        speed[precision] = measure_speed(precision, timed, trainees(args.warmup + args.rounds * len(timed)), args)
        times = ", ".join(f"{n} {1000 * s:.1f} ms/step" for n, s in speed[precision].items())
        print(f"  {precision}: {times}", flush=True)

    results = {}
    if args.steps:
        cer_precision = args.cer_precision
        if cer_precision == "auto":
            cer_precision = "bf16" if auto_precision("cpu")[0] == "bf16-mixed" else "fp32"
        bf16 = cer_precision == "bf16"
        print(f"training each {args.steps} steps ({cer_precision}, warm-up {warmup}), then reading the val lines")
        pair = trainees(args.steps)
        results = train_and_read(data, pair, bf16, args, net.decoder.block_size)
        for name, trainee in pair.items():
            results[name]["train_steps_s"] = trainee.steps / trainee.seconds
            results[name]["loss"] = trainee.last_loss
            reference, reading = results[name]["example"]
            print(f"  {name}: {reference!r} read as {reading!r}")

    header = ["model", "parameters", "GFLOP/step"] + [f"{p} steps/s" for p in speed]
    if results:
        lines = data.manifest["lines"]["val"]
        header += [f"train loss @ {args.steps}", f"val CER @ {args.steps} ({cer_precision})", f"read {lines} lines (s)"]
    rows = []
    for name in NAMES:
        row = [name if name == "lightformer" else "HF VisionEncoderDecoderModel", f"{params[name]:,}"]
        row += [f"{flops[name] / 1e9:.2f}"] + [f"{1 / speed[p][name]:.2f}" for p in speed]
        if results:
            r = results[name]
            row += [f"{r['loss']:.3f}", f"{r['cer']:.2%}", f"{r['read_s']:.1f}"]
        rows.append(row)
    ratio = ["ours/HF", "", ""] + [f"{speed[p]['huggingface'] / speed[p]['lightformer']:.2f}×" for p in speed]
    if results:
        ours, theirs = results["lightformer"], results["huggingface"]
        ratio += ["", "", f"{theirs['read_s'] / ours['read_s']:.2f}× faster" if ours["read_s"] else "–"]
    rows.append(ratio)
    print()
    print(markdown_table(header, rows))
    print()
    for precision in speed:
        value = speed[precision]["huggingface"] / speed[precision]["lightformer"]
        print(f"ratio lightformer/huggingface {precision}: {value:.2f} (steps/s; > 1 means lightformer is faster)")
    if results and not all(math.isfinite(r["cer"]) for r in results.values()):
        raise SystemExit("a CER is not finite")


if __name__ == "__main__":
    main()
