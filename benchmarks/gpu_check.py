"""The GPU check: one command on a machine with one GPU, at most 8 minutes, and one Markdown report with the card,
the versions, the date and every figure that the GPU bars are about (MFU in fit, ours against Hugging Face's GPT-2,
the translation config's steps/s, fit against the bare step), each from a run of a shipped config or benchmark.

    bash benchmarks/gpu_wheels.sh                          # here: the wheels the GPU machines lack, into .whl/
    python3 benchmarks/gpu_check.py --output gpu_check.md  # there, from the repository root
    python benchmarks/gpu_check.py --dry-run               # the same parts on this CPU, at tiny sizes

The parts, in the order they run (the bars' figures first, so that a check cut short still has them), each a
subprocess under its own time limit, and the whole check under ``--minutes``: a part that fails or runs out of time
is reported so, with the end of its output, and the check goes on with the next. The report, and beside it the parts'
whole output (``--output`` with the suffix .log), are rewritten after each part, so a check killed half-way keeps what
it measured.

- data: ``lightformer prepare`` for the three configs below (tokenizers and token shards, written under data/ once
  per machine), so that no later part times a data preparation;
- lm: configs/lm/austen_bpe_gpu.yaml (GPT-2 small's shape) in ``fit``: tokens/s, FLOP/s and MFU after compilation,
  the medians of the run's throughput curves in TensorBoard (Lightning's ``ThroughputMonitor``), against the GPU's
  spec dense peak (the bar: 50% in bf16) and a matrix-multiply peak measured at the start
  (``lightformer.training.peaks``);
- peers: benchmarks/peers.py at GPT-2 small's shape, bf16, compiled: our GPT's tokens/s against Hugging Face's
  GPT-2 (the bar: 1.3×);
- ding: configs/translation/ding_de_en_gpu.yaml in ``fit``: steps/s after warm-up (the bar: 10× a CPU's);
- ding-compiled: the same config's first 50 steps eager, then compiled on length buckets of 16 tokens
  (``data.batches.length_multiple``: one static graph per bucket), compilation included: the training time of each
  and the compiled run's graphs (the bar: compiled faster);
- tests: the GPU tests of tests/test_scale_out.py (bf16-mixed and 16-mixed training on CUDA, the FSDP preset);
- vit: benchmarks/fit_overhead.py on configs/vision/vit_fashion_mnist.yaml with the gpu trainer preset: images/s
  in ``fit`` against the bare step;
- overhead-lm, overhead-ding: benchmarks/fit_overhead.py on the two GPU configs, ``fit`` against the bare step
  (each config in its own process, under its own limit);
- image-text: configs/image_text/printed_lines_gpu.yaml in ``fit`` on a tenth of its lines (rendered first, on every
  core), a fixed number of steps, then one validation: images/s and MFU, and the validation CER at that step (the
  config's own bar, ≤ 3% after its 15 minutes, needs a run of its own);
- printed-lines: the same config as shipped (its validations, its learning-rate decay fitted to its time) on the same
  tenth of its lines for 5 of its 15 minutes, then ``lightformer test`` of its last checkpoint: the test CER on the
  unseen typefaces and unseen text, the figure of its bar, in the 9 to 10 minutes that a lease can give one part;
- clip: configs/contrastive/clipart_gpu.yaml in ``fit`` (compiled, batches of 512): images/s and MFU;
- vlm: configs/vlm/vlm_gpu.yaml in ``fit`` on drawings and printed lines, both towers from scratch (no run of the
  other families on the machine to start them), with the tokenizer of a one-step run of the language model's config
  (the one vlm_gpu.yaml's text tower reads): images/s and MFU.

The last two need the Open Clip Art Library, which the GPU machines lack: ``bash benchmarks/gpu_wheels.sh --clipart``
packs a sixth of its drawings and the typefaces (instead of Ding's dictionary and Fashion-MNIST), for a second check
``gpu_check.py --parts clip vlm`` (the first check's 8 minutes do not reach them).

``--dry-run`` runs the same parts through the same code on the CPU: tiny models on tiny data, the cpu trainer
preset (fp32), no compilation, a few steps; tests/test_gpu_check.py runs it.

The GPU machines lent to this project run their own Python 3.12 and torch and reach no package index; they lack
jsonargparse and litdata (and a few packages those need). When one of them cannot be imported and .whl/ exists (from
gpu_wheels.sh), the wheels there are installed into /tmp/site, which goes on the parts' PYTHONPATH with the
repository's src/ (the package is not installed there).
"""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import importlib.util
import lzma
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch

import peers

REPO = Path(__file__).resolve().parents[1]
WHEELS, SITE = REPO / ".whl", Path("/tmp/site")
FONTS = REPO / "data" / "fonts"  # gpu_wheels.sh's typefaces, unpacked here on the GPU machine
CLIPART = REPO / "data" / "openclipart"  # gpu_wheels.sh --clipart's drawings (png/, svg/), unpacked there too
LM, DING, VIT, IMAGE_TEXT, CLIP, VLM = (
    "configs/lm/austen_bpe_gpu.yaml",
    "configs/translation/ding_de_en_gpu.yaml",
    "configs/vision/vit_fashion_mnist.yaml",
    "configs/image_text/printed_lines_gpu.yaml",
    "configs/contrastive/clipart_gpu.yaml",
    "configs/vlm/vlm_gpu.yaml",
)
THROUGHPUT = "velocity/train/device/"  # ThroughputMonitor's curves, as lightformer's TensorBoardLogger names them
THROUGHPUT_WINDOW = 20  # steps per throughput reading (lightformer.training.callbacks.Throughput's window)
VERSIONS = ("torch", "lightning", "timm", "litdata", "jsonargparse", "transformers", "tokenizers", "torchmetrics")
TAIL_LINES = 40  # of a failed part's output, in the report


PARTS = ("data", "lm", "peers", "ding", "ding-compiled", "tests", "vit", "overhead-lm", "overhead-ding", "image-text",
         "printed-lines", "clip", "vlm")  # fmt: skip


@dataclass(frozen=True)
class Sizes:
    """How much each part runs: on the GPU, or the dry run's tiny version on the CPU."""

    device: str
    dtype: torch.dtype  # of the training steps' matrix multiplies, for the peaks
    fit_steps: dict[str, int]  # lm, ding, image-text, printed-lines, clip, vlm: steps in fit (at most)
    first_reading: dict[str, int]  # the same parts: the throughput readings from this step on count
    max_time: dict[str, str]  # ding: it stops after its steps or this much training; printed-lines: its config's
    # training time (15 minutes) in the check's place
    overhead: dict[str, tuple[int, int]]  # vit, overhead-lm, overhead-ding: (timed steps, warm-up steps)
    peers: str  # benchmarks/peers.py's options
    limits: dict[str, int]  # part → seconds


GPU = Sizes(
    device="cuda",
    dtype=torch.bfloat16,
    fit_steps={
        "lm": 300,
        "ding": 200,
        "image-text": 1500,
        "printed-lines": 100_000,  # the last: its config's bound
        "ding-eager": 50,
        "ding-compiled": 50,
        "clip": 300,
        "vlm-tokenizer": 1,  # the language model's run that writes the tokenizer the vlm part reads
        "vlm": 300,
    },  # fmt: skip
    first_reading={"lm": 100, "ding": 50, "image-text": 100, "printed-lines": 500, "clip": 100, "vlm": 100},
    max_time={"ding": "00:00:01:30", "printed-lines": "00:00:05:00"},
    overhead={"vit": (200, 20), "overhead-lm": (60, 10), "overhead-ding": (60, 10)},
    peers="--device cuda --shape gpt2-small --tasks lm --precisions bf16 --compile on --round-seconds 1",
    limits={
        "data": 120,
        "lm": 120,
        "peers": 120,
        "ding": 150,
        "ding-compiled": 240,  # eager's 50 steps, then the compiled ones (130 s were not enough for dynamic shapes)
        "tests": 150,  # 12 tests: 88 s of pytest on an H200, after ~7 s of imports
        "vit": 60,
        "overhead-lm": 90,
        "overhead-ding": 120,
        "image-text": 270,
        "printed-lines": 550,  # rendering 50,000 lines, 5 minutes of training with its validations, the test
        "clip": 240,  # preparing the drawings, compiling, the steps
        "vlm": 300,  # a step of the language model (its tokenizer), rendering the lines, the steps
    },
)
DRY_RUN = Sizes(
    device="cpu",
    dtype=torch.float32,
    fit_steps={
        "lm": 40,
        "ding": 40,
        "image-text": 30,
        "printed-lines": 40,
        "ding-eager": 6,
        "ding-compiled": 6,
        "clip": 40,
        "vlm-tokenizer": 1,
        "vlm": 40,
    },
    first_reading={"lm": 20, "ding": 20, "image-text": 20, "printed-lines": 20, "clip": 20, "vlm": 20},
    max_time={"ding": "00:00:01:00", "printed-lines": "00:00:00:10"},
    overhead={"vit": (6, 2), "overhead-lm": (6, 2), "overhead-ding": (6, 2)},
    peers="--tasks lm --precisions fp32 --compile off --steps 2 --round-seconds 0 --rounds 1 --warmup 1 --threads 1 "
    "--no-memory",  # tests/test_benchmarks.py's budget
    limits=dict.fromkeys(PARTS, 120),
)


@dataclass(frozen=True)
class Peaks:
    """Peak FLOP/s of the device at the check's dtype, from ``lightformer.training.peaks``."""

    spec: float | None  # dense, from the GPU's datasheet; None: not in the table (a CPU)
    measured: float  # the fastest of a few n × n matrix multiplies, at the start of the check


def measure_peaks(device: torch.device, dtype: torch.dtype) -> Peaks:
    from lightformer.training.peaks import (  # here: src/ is on the path once python_path() ran
        measured_flops,
        spec_flops,
    )

    spec = spec_flops(torch.cuda.get_device_name(device), dtype) if device.type == "cuda" else None
    return Peaks(spec, measured_flops(device, dtype))


# --- the parts ---------------------------------------------------------------------------------------------------


@dataclass
class Part:
    name: str
    title: str
    commands: list[list[str]]  # run one after the other, under the part's one time limit
    figures: Callable[[str], list[str]]  # the commands' output → the report's lines (raises if a figure is missing)


@dataclass
class Outcome:
    status: str  # "ok", or what went wrong
    seconds: float
    lines: list[str]  # the figures
    output: str


def plan(sizes: Sizes, dry_run: bool, work: Path, peaks: Peaks) -> list[Part]:
    """The check's parts, in ``PARTS``' order; their runs log under ``work``."""
    fonts = [f"--data.source.font_dir={FONTS}"] if FONTS.is_dir() else []  # else the machine's own
    packed = CLIPART.is_dir()  # gpu_wheels.sh --clipart's drawings, else the machine's own library (the default)
    drawings = [f"--data.source.root={CLIPART}"] if packed else []
    qa_drawings = [f"--data.source.clipart_root={CLIPART}"] if packed else []
    gpu = {
        VIT: ["--config=configs/trainer/gpu.yaml"],
        IMAGE_TEXT: ["--data.source.train_lines=50000", *fonts],
        CLIP: drawings,
        VLM: [*qa_drawings, "--data.source.train_lines=20000", *fonts],
    }
    options = dry_run_options(work) if dry_run else gpu
    python = sys.executable

    def lightformer(command: str, config: str, *more: str) -> list[str]:
        return [python, "-m", "lightformer", command, f"--config={config}", *options.get(config, []), *more]

    def fit(name: str, config: str, *more: str) -> list[str]:
        return lightformer("fit", config, f"--trainer.max_steps={sizes.fit_steps[name]}",
                           "--trainer.limit_val_batches=0", "--trainer.log_every_n_steps=10",
                           "--trainer.enable_progress_bar=false", f"--trainer.logger.init_args.save_dir={work / name}",
                           *more)  # fmt: skip

    def overhead(name: str, config: str) -> list[str]:
        steps, warmup = sizes.overhead[name]
        return [python, "benchmarks/fit_overhead.py", "--configs", config, "--steps", str(steps), "--warmup",
                str(warmup), "--", *options.get(config, [])]  # fmt: skip

    tests = [python, *shlex.split("-m pytest -q -p no:cacheprovider tests/test_scale_out.py -k 'gpu or fsdp_preset'")]
    lm, ding, lines, whole = (sizes.first_reading[name] for name in ("lm", "ding", "image-text", "printed-lines"))
    printed_lines = work / "printed-lines"
    last = printed_lines / "printed_lines_gpu" / "version_0" / "checkpoints" / "last.ckpt"
    ding_bar = "the bar: ≥ 10× the steps/s of a CPU (not measured by this check)"
    # compiled on length buckets (one static graph each); TORCH_LOGS prints a line per recompilation (a new bucket)
    bucketed = ["--data.batches.length_multiple=16", "--trainer.max_time=null"]
    compiled = ["env", "TORCH_LOGS=recompiles", *fit("ding-compiled", DING, *bucketed,
                                                     *([] if dry_run else ["--model.compile=true"]))]  # fmt: skip
    # the vision-language model from scratch (no run of the other families here to start it), with the tokenizer of
    # a one-step run of the language model's config (vlm_gpu.yaml's text tower reads that config's tokenizer)
    tokenizer = work / "vlm-tokenizer" / "austen_bpe" / "version_0" / "tokenizer.json"
    vlm = ["--model.init.checkpoint=null", "--model.init.modules={}", f"--data.tokenizer.file={tokenizer}",
           "--data.source.sources=[clipart,lines]"]  # fmt: skip
    return [
        Part("data", "each config's tokenizer and token shards, prepared once per machine",
             [lightformer("prepare", config) for config in (LM, DING, VIT)], prepared_folders),
        Part("lm", f"GPT-2 small (`{LM}`) in fit: throughput and MFU after compilation", [fit("lm", LM)],
             lambda output: fit_figures(work / "lm", lm, "tokens", peaks, mfu_bar=0.5)),
        Part("peers", "our GPT against Hugging Face's GPT-2 (`benchmarks/peers.py`)",
             [[python, "benchmarks/peers.py", *shlex.split(sizes.peers)]], peer_figures),
        Part("ding", f"translation (`{DING}`) in fit: steps/s after warm-up",
             [fit("ding", DING, f"--trainer.max_time={sizes.max_time['ding']}")],
             lambda output: [*fit_figures(work / "ding", ding, "target tokens", peaks), ding_bar]),
        Part("ding-compiled", f"translation (`{DING}`) compiled on length buckets of 16 tokens: its first "
             f"{sizes.fit_steps['ding-compiled']} steps in fit, compilation included, against eager's",
             [fit("ding-eager", DING, "--trainer.max_time=null"), compiled],
             lambda output: compile_figures(output, compiled=not dry_run)),
        Part("tests", "the GPU tests of `tests/test_scale_out.py`", [tests], pytest_counts),
        Part("vit", f"the ViT (`{VIT}`) with the gpu trainer preset: fit against the bare step",
             [overhead("vit", VIT)], lambda output: overhead_figures(output, "images")),
        Part("overhead-lm", f"GPT-2 small (`{LM}`): fit against the bare step", [overhead("overhead-lm", LM)],
             lambda output: overhead_figures(output, "tokens")),
        Part("overhead-ding", f"translation (`{DING}`): fit against the bare step", [overhead("overhead-ding", DING)],
             lambda output: overhead_figures(output, "target tokens")),
        Part("image-text", f"reading printed lines (`{IMAGE_TEXT}`, a tenth of its lines) in fit: throughput, MFU, "
             "the validation CER after its steps",
             [fit("image-text", IMAGE_TEXT, f"--trainer.val_check_interval={sizes.fit_steps['image-text']}",
                  "--trainer.limit_val_batches=null", "--trainer.max_time=null",
                  f"--model.optimizer.warmup_steps={sizes.fit_steps['image-text'] // 5}")],
             lambda output: [*fit_figures(work / "image-text", lines, "images", peaks),
                             validation_figure(work / "image-text", "val/cer")]),
        Part("printed-lines", f"reading printed lines (`{IMAGE_TEXT}` as shipped, on a tenth of its lines and a third "
             "of its minutes), then its test: the CER on unseen typefaces and unseen text",
             [lightformer("prepare", IMAGE_TEXT),
              lightformer("fit", IMAGE_TEXT, f"--trainer.max_time={sizes.max_time['printed-lines']}",
                          f"--trainer.max_steps={sizes.fit_steps['printed-lines']}",
                          f"--trainer.logger.init_args.save_dir={printed_lines}",
                          "--trainer.enable_progress_bar=false"),
              lightformer("test", IMAGE_TEXT, f"--ckpt_path={last}", "--trainer.enable_progress_bar=false",
                          "--trainer.logger=false")],
             lambda output: [*fit_figures(printed_lines, whole, "images", peaks),
                             validation_figure(printed_lines, "val/cer"),
                             test_figure(output, "test/cer", bar=0.03)]),
        Part("clip", f"contrastive image-text (`{CLIP}`) in fit on the drawings: images/s and MFU after compilation",
             [fit("clip", CLIP)], lambda output: fit_figures(work / "clip", sizes.first_reading["clip"], "images",
                                                             peaks)),
        Part("vlm", f"the vision-language model (`{VLM}`, both towers from scratch) in fit on drawings and printed "
             "lines: images/s and MFU",
             [fit("vlm-tokenizer", LM, "--model.compile=false"), fit("vlm", VLM, *vlm)],
             lambda output: fit_figures(work / "vlm", sizes.first_reading["vlm"], "images", peaks)),
    ]  # fmt: skip


def dry_run_options(work: Path) -> dict[str, list[str]]:
    """Each config's options in the dry run: the cpu trainer preset in fp32, no compilation, a tiny model, and tiny
    data written into ``work`` (a sentence repeated, sentence pairs made of letters, a hundredth of the clip art)."""
    sentence = "It is a truth universally acknowledged, that a single man in possession of a good fortune.\n"
    corpus = work / "corpus.txt"
    corpus.write_text(sentence * 600)  # no epoch ends within the few steps timed
    pairs = work / "pairs.tsv"
    pairs.write_text("".join(f"{a} {b} {c}\t{c} {b} {a}\n" for a in "abcd" for b in "efgh" for c in "ijkl"))
    from lightformer.data.sources.openclipart import (
        OPENCLIPART_ROOT,  # here: src/ is on the path once python_path() ran
    )

    library = clipart_sample(Path(OPENCLIPART_ROOT), work / "openclipart", every=100)
    cpu = ["--config=configs/trainer/cpu.yaml", "--trainer.precision=32-true", "--model.compile=false"]
    prepared = f"--data.prepare.dir={work / 'prepared'}"
    loader = ["--data.loader.batch_size=8", "--data.loader.num_workers=0", "--data.loader.pin_memory=false"]
    towers = [f"--model.net.{tower}.{field}" for tower in ("image", "text") for field in ("d_model=32", "n_heads=2")]
    return {
        LM: [*cpu, "--data.source.corpus=null", f"--data.source.train_files=[{corpus}]", prepared,
             "--data.tokenizer.vocab_size=300", "--data.block_size=32", "--data.loader.batch_size=4",
             "--data.loader.num_workers=0", "--model.net.n_layers=1", "--model.net.n_heads=2",
             "--model.net.d_model=32"],
        DING: [*cpu, "--data.source.corpus=null", "--data.source.ding_phrases=false",
               f"--data.source.tsv_files=[{pairs}]", f"--data.source.val_tsv_files=[{pairs}]", prepared,
               "--data.tokenizer.vocab_size=270", "--data.batches.max_tokens=128", "--data.batches.num_workers=0",
               "--model.net.n_encoder_layers=1", "--model.net.n_decoder_layers=1", "--model.net.d_model=32",
               "--model.net.n_heads=2", "--model.net.d_ff=64", "--model.net.max_len=16"],
        VIT: [*cpu, "--model.net.n_layers=1", "--model.net.n_heads=2", "--model.net.d_model=32", "--model.net.d_ff=64",
              "--data.loader.batch_size=32"],
        IMAGE_TEXT: [*cpu, "--data.source.train_lines=64", "--data.source.val_lines=8", "--data.source.test_lines=8",
                     prepared, "--data.loader.batch_size=8", "--data.loader.num_workers=0",
                     "--data.loader.pin_memory=false",
                     *[f"--model.net.{tower}.{field}" for tower in ("encoder", "decoder")
                       for field in ("n_layers=1", "d_model=32", "n_heads=2", "d_ff=64")],
                     "--trainer.log_every_n_steps=10", "--trainer.val_check_interval=20"],
        CLIP: [*cpu, f"--data.source.root={library}", "--data.source.image_size=32", prepared, *loader,
               "--data.tokenizer.vocab_size=300", *towers, "--model.net.image.patch_size=16",
               "--model.net.image.n_layers=1", "--model.net.text.n_layers=1", "--model.net.text.block_size=128",
               "--model.net.embed_dim=16"],
        VLM: [*cpu, f"--data.source.clipart_root={library}", "--data.source.drawing_size=32",
              "--data.source.line_width=128", "--data.source.train_lines=32", "--data.source.val_lines=4",
              "--data.source.test_lines=4", "--data.source.seen=2", prepared, *loader, *towers,
              "--model.net.image.patch_size=16", "--model.net.image.n_layers=2", "--model.net.text.n_layers=1"],
    }  # fmt: skip


def clipart_sample(library: Path, target: Path, every: int) -> Path:
    """Every ``every``-th drawing of the Open Clip Art Library at ``library`` (its PNG and its SVG, linked) in a
    library of the same layout at ``target``."""
    for png in sorted((library / "png").rglob("*.png"))[::every]:
        name = png.relative_to(library / "png").with_suffix("")
        for kind in ("png", "svg"):
            link = target / kind / name.with_suffix(f".{kind}")
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(library / kind / name.with_suffix(f".{kind}"))
    return target


# --- reading the figures -----------------------------------------------------------------------------------------


def prepared_folders(output: str) -> list[str]:
    """What ``lightformer prepare`` printed for each config."""
    lines = [line for line in output.splitlines() if line.startswith("prepared: ")]
    if len(lines) != 3:
        raise ValueError(f"{len(lines)} of the 3 configs prepared")
    return lines


def pytest_counts(output: str) -> list[str]:
    """pytest's summary line (how many passed, failed, were skipped) and the failed tests."""
    summary = [line.strip("= ") for line in output.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    if not summary:
        raise ValueError("no pytest summary line")
    if not re.search(r"[1-9]\d* passed", summary[-1]):
        raise ValueError(f"no test passed: {summary[-1]}")
    return [summary[-1], *(line for line in output.splitlines() if line.startswith(("FAILED", "ERROR")))]


def scalars(runs: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar curve that the one run logged under ``runs`` wrote to TensorBoard: tag → [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folders = {path.parent for path in runs.rglob("events.out.tfevents.*")}
    if len(folders) != 1:
        raise ValueError(f"{len(folders)} runs with TensorBoard events under {runs}")
    events = EventAccumulator(str(folders.pop()))
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def fit_figures(runs: Path, first_step: int, unit: str, peaks: Peaks, mfu_bar: float | None = None) -> list[str]:
    """Steps/s, items/s, FLOP/s and MFU of a fit run: the medians of its throughput readings from ``first_step`` on
    (each reading is over the ``THROUGHPUT_WINDOW`` steps before it)."""
    curves = scalars(runs)

    def median(name: str) -> float:
        values = [value for step, value in curves.get(THROUGHPUT + name, []) if step >= first_step]
        if not values:
            raise ValueError(f"no {THROUGHPUT + name} reading at step {first_step} or later")
        return statistics.median(values)

    steps, items, flops = median("batches_per_sec"), median("items_per_sec"), median("flops_per_sec")
    readings = sum(step >= first_step for step, _ in curves[THROUGHPUT + "batches_per_sec"])
    lines = [
        f"{steps:.2f} steps/s, {items:,.0f} {unit}/s, {peers.flop_rate(flops)} (the medians of {readings} readings, "
        f"from step {first_step}, each over {THROUGHPUT_WINDOW} steps)",
        f"MFU against the measured peak ({peers.flop_rate(peaks.measured)}): {flops / peaks.measured:.1%}",
    ]
    if peaks.spec is None:
        lines.append("MFU against the spec dense peak: no spec peak known for this device")
    else:
        mfu = flops / peaks.spec
        bar = f"; the bar, ≥ {mfu_bar:.0%}: {verdict(mfu >= mfu_bar)}" if mfu_bar else ""
        lines.append(f"MFU against the spec dense peak ({peers.flop_rate(peaks.spec)}): **{mfu:.1%}**{bar}")
    if THROUGHPUT + "mfu" in curves:
        lines.append(f"the run's own MFU curve (`{THROUGHPUT}mfu`): {median('mfu'):.1%}")
    return lines


def validation_figure(runs: Path, tag: str) -> str:
    """The last value of the run's validation curve ``tag``, and its step."""
    curve = scalars(runs).get(tag)
    if not curve:
        raise ValueError(f"no {tag} in the run's TensorBoard events")
    step, value = curve[-1]
    return f"{tag} at step {step}: **{value:.2%}**"


def test_figure(output: str, tag: str, bar: float) -> str:
    """``tag`` from the table that ``lightformer test`` printed, against the config's ``bar`` (which holds after the
    config's whole time)."""
    found = re.findall(rf"│\s*{re.escape(tag)}\s*│\s*([-+.\deE]+)\s*│", output)
    if not found:
        raise ValueError(f"no {tag} in the test's table")
    value = float(found[-1])
    return f"{tag}: **{value:.2%}** (the config's bar after its whole time, ≤ {bar:.0%}: {verdict(value <= bar)} here)"


def markdown_rows(text: str, column: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table in ``text`` that has ``column``, each as {column: cell}."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("|") and column in line]
    if not starts:
        raise ValueError(f"no table with a column {column!r}")

    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip().strip("|").split("|")]

    header, rows = cells(lines[starts[0]]), []
    for line in lines[starts[0] + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, cells(line), strict=True)))
    return rows


def peer_figures(output: str) -> list[str]:
    """Our throughput and the peer's, their ratio and MFU, from peers.py's two tables."""
    ours, peer = markdown_rows(output, "throughput")[:2]  # lightformer's row, then the peer's
    summary = markdown_rows(output, "speed ours/peer")[0]
    ratio = float(summary["speed ours/peer"])
    peak = re.search(r"matrix-multiply peak .*: (.*)", output)[1]
    return [
        f"lightformer {ours['throughput']}, {peer['model']} {peer['throughput']}: ours/peer **{ratio:.2f}×**; "
        f"the bar, ≥ 1.3×: {verdict(ratio >= 1.3)}",
        f"MFU against peers.py's measured peak ({peak}): ours {summary['MFU ours']}, peer {summary['MFU peer']}",
        f"peak memory: ours {ours['peak memory (MiB)']} MiB, peer {peer['peak memory (MiB)']} MiB",
    ]


def overhead_figures(output: str, unit: str) -> list[str]:
    """fit_overhead.py's line for each config: items/s in fit and in the bare step, and their ratios."""
    rows = re.findall(r"^(configs/\S+) +([\d,]+) +([\d,]+) +([\d.]+) +([\d.]+)$", output, re.MULTILINE)
    if not rows:
        raise ValueError("no result line from fit_overhead.py")
    return [
        f"fit {fit} {unit}/s, bare step {bare} {unit}/s: fit/bare **{ratio}** (median per batch {median})"
        for _, fit, bare, ratio, median in rows
    ]


def compile_figures(output: str, compiled: bool = True) -> list[str]:
    """The training time of the eager run and of the compiled one (their progress logs' last lines: from the first
    step, compilation included), and the compiled run's graphs (one, and one per recompilation TORCH_LOGS reported;
    ``compiled`` False: the dry run, whose second run is eager too)."""
    elapsed = re.findall(r"^finished: step (\d+)/\d+ .*· (?:(\d+)h)?(\d+)m(\d+)s elapsed", output, re.MULTILINE)
    if len(elapsed) != 2:
        raise ValueError(f"{len(elapsed)} of the 2 runs finished")
    (steps, *eager), (_, *compiled) = elapsed
    eager_s, compiled_s = (int(h or 0) * 3600 + int(m) * 60 + int(s) for h, m, s in (eager, compiled))
    graphs = 1 + len(re.findall(r"Recompiling function", output))
    how = f"compilation included: {graphs} graph{'s' * (graphs > 1)}" if compiled else "dry run: not compiled"
    return [
        f"first {steps} steps: eager {eager_s} s, on length buckets **{compiled_s} s** ({how}); the bar, compiled "
        f"faster: {verdict(compiled_s < eager_s)}"
    ]


def verdict(met: bool) -> str:
    return "met" if met else "**not met**"


# --- running -----------------------------------------------------------------------------------------------------


def python_path() -> list[str]:
    """The folders that the parts (and this process) import from: the repository's src/, and /tmp/site with the
    wheels of .whl/ installed there when jsonargparse or litdata is missing (the GPU machines' image)."""
    paths = [str(REPO / "src")]
    if any(importlib.util.find_spec(name) is None for name in ("jsonargparse", "litdata")) and WHEELS.is_dir():
        wheels = [str(path) for path in sorted(WHEELS.glob("*.whl"))]
        install = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        subprocess.run([*install, "--target", str(SITE), *wheels], check=True)
        paths.insert(0, str(SITE))
    sys.path[:0] = paths
    importlib.invalidate_caches()
    return paths


def unpack_data() -> list[str]:
    """The offline data that gpu_wheels.sh packed into .whl/data/, unpacked where the configs read it, unless it is
    there already: Austen's novels, Ding's dictionary, Fashion-MNIST, the typefaces (into ``FONTS``), the drawings
    (into ``CLIPART``). Returns what it unpacked."""
    packed = WHEELS / "data"
    unpacked = []
    for archive, folder in (("fonts.tar.xz", FONTS), ("openclipart.tar.xz", CLIPART)):
        if (packed / archive).is_file() and not folder.exists():
            with tarfile.open(packed / archive) as files:
                files.extractall(folder, filter="data")
            unpacked.append(str(folder))
    targets = {"austen.txt.gz": REPO / "data/austen/austen.txt", "de-en.xz": Path("/usr/share/trans/de-en")}
    targets |= {path.name: REPO / "data/FashionMNIST/raw" / path.stem for path in packed.glob("*-ubyte.xz")}
    for name, target in targets.items():
        if (packed / name).is_file() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            opener = gzip.open if name.endswith(".gz") else lzma.open
            with opener(packed / name) as source, open(target, "wb") as destination:
                shutil.copyfileobj(source, destination)
            unpacked.append(str(target))
    return unpacked


def run_part(part: Part, env: dict[str, str], limit: float, log: Path) -> Outcome:
    """Runs the part's commands from the repository, their output into ``log``, for at most ``limit`` seconds."""
    start, status = time.perf_counter(), "ok"
    with open(log, "w") as out:
        for command in part.commands:
            out.write(f"$ {shown(command)}\n")
            out.flush()
            code = run(command, env, out, limit - (time.perf_counter() - start))
            if code is None:
                status = f"timed out after {limit:.0f} s"
                break
            if code != 0:
                status = f"failed (exit code {code})"
                break
    seconds, output = time.perf_counter() - start, log.read_text(errors="replace")
    try:
        lines = part.figures(output)  # a part that failed may still have some (fit_overhead's first config)
    except Exception as error:  # a figure missing from the output: the output says why
        lines = []
        if status == "ok":
            status = f"no figures ({type(error).__name__}: {error})"
    return Outcome(status, seconds, lines, output)


def run(command: list[str], env: dict[str, str], out, seconds: float) -> int | None:
    """``command``'s exit code, or None if it ran past ``seconds``: then it and every process it started (data
    loader workers, the runs a test starts) are killed."""
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return process.wait(timeout=max(seconds, 1))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None


def shown(command: list[str]) -> str:
    if command[0] == "env":  # env VARIABLE=value ... python ...: the variables, then the command
        variables = [word for word in command[1:] if "=" in word and not word.startswith("-")][:1]
        return " ".join([*variables, shown(command[1 + len(variables) :])])
    return shlex.join(["python", *command[1:]])


# --- the report --------------------------------------------------------------------------------------------------


def machine_lines(device: torch.device, peaks: Peaks, dtype: torch.dtype, missing_wheels: bool) -> list[str]:
    """The card, the versions, the date and the commit."""
    if device.type == "cuda":
        card = torch.cuda.get_device_properties(device)
        name = f"{card.name}, {card.total_memory / 2**30:.1f} GiB, compute capability {card.major}.{card.minor}"
    else:
        name = f"no GPU: {peers.device_name(device)}, {os.cpu_count()} cores"
    versions = [f"Python {platform.python_version()}", f"CUDA {torch.version.cuda}"]
    for package in VERSIONS:
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package} missing")
    spec = "unknown" if peaks.spec is None else peers.flop_rate(peaks.spec)
    lines = [
        f"- date: {datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; commit {commit()}",
        f"- device: {name}",
        f"- versions: {', '.join(versions)}",
        f"- peak {str(dtype).removeprefix('torch.')} FLOP/s (`lightformer.training.peaks`): spec dense {spec}, "
        f"measured {peers.flop_rate(peaks.measured)} (the fastest of a few n × n matrix multiplies, at the start)",
    ]
    if missing_wheels:
        lines.append("- jsonargparse or litdata is missing and there is no .whl/: run `bash benchmarks/gpu_wheels.sh`")
    return lines


def commit() -> str:
    """The repository's commit, with "-dirty" where the files differ from it (a copy of a working tree whose git
    reference is older than its files, as a device machine's can be), or "unknown" (a copy without git)."""
    try:
        found = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return found.stdout.strip() or "unknown"


def report(title: str, machine: list[str], parts: list[Part], outcomes: dict[str, Outcome]) -> str:
    """The Markdown report: the machine, a table of the parts, then each part's figures (and the end of its output
    where it went wrong)."""
    lines = [f"# {title}", "", *machine, "", "| part | result | seconds |", "|---|---|---:|"]
    for part in parts:
        outcome = outcomes.get(part.name)
        lines.append(f"| {part.name} | {outcome.status if outcome else 'not run yet'} | "
                     f"{f'{outcome.seconds:.0f}' if outcome else ''} |")  # fmt: skip
    for part in parts:
        if part.name not in outcomes:
            continue
        outcome = outcomes[part.name]
        lines += ["", f"## {part.name}: {part.title}", ""]
        lines += [f"    {shown(command)}" for command in part.commands]
        lines += ["", f"Result: **{outcome.status}**, {outcome.seconds:.0f} s", ""]
        lines += [f"- {line}" for line in outcome.lines]
        if outcome.status != "ok" and outcome.output:
            tail = "\n".join(outcome.output.splitlines()[-TAIL_LINES:])
            lines += ["", "The end of its output:", "", "```text", tail, "```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=Path("gpu_check.md"), help="the report (Markdown)")
    parser.add_argument("--dry-run", action="store_true", help="the same parts on the CPU at tiny sizes")
    parser.add_argument("--minutes", type=float, default=8.0, help="the whole check's time limit")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS, help="run only these parts")
    args = parser.parse_args()
    start = time.perf_counter()

    paths = python_path()
    for target in unpack_data():
        print(f"unpacked {target}", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [*paths, os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    missing_wheels = any(importlib.util.find_spec(name) is None for name in ("jsonargparse", "litdata"))
    sizes = DRY_RUN if args.dry_run else GPU
    if sizes.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: torch sees no GPU here (try --dry-run)")
    device = torch.device(sizes.device)
    peaks = measure_peaks(device, sizes.dtype)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the peak's matrices: the parts get the whole GPU
    machine = machine_lines(device, peaks, sizes.dtype, missing_wheels)
    title = "GPU check" + (" (dry run: tiny shapes on the CPU, no GPU figure)" if args.dry_run else "")

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        parts = [part for part in plan(sizes, args.dry_run, Path(work), peaks) if part.name in args.parts]
        outcomes: dict[str, Outcome] = {}
        outputs = args.output.with_suffix(".log")  # every part's whole output, beside the report
        for part in parts:
            left = 60 * args.minutes - (time.perf_counter() - start)
            if left < 1:
                outcomes[part.name] = Outcome(f"not run: the check's {args.minutes:g} minutes were spent", 0, [], "")
            else:
                print(f"{part.name}: at most {min(sizes.limits[part.name], left):.0f} s", flush=True)
                log = Path(work) / f"{part.name}.log"
                outcomes[part.name] = run_part(part, env, min(sizes.limits[part.name], left), log)
                print(f"{part.name}: {outcomes[part.name].status}, {outcomes[part.name].seconds:.0f} s", flush=True)
            args.output.write_text(report(title, machine, parts, outcomes))
            outputs.write_text(
                "".join(f"# {name}: {outcome.status}\n{outcome.output}" for name, outcome in outcomes.items())
            )
    minutes = (time.perf_counter() - start) / 60
    args.output.write_text(report(title, [*machine, f"- the check took {minutes:.1f} minutes"], parts, outcomes))
    print(f"report: {args.output}, the parts' output: {outputs} ({minutes:.1f} minutes)")


if __name__ == "__main__":
    main()
