"""Training throughput, MFU and peak memory of our models against the peer a user would otherwise pick.

For each task, ours and the peer train at the identical configuration (shape, random batches, AdamW at a
fixed learning rate, cross-entropy) in one process, in alternating timed rounds; each keeps its median round.

- ``lm``: ``lightformer.models.GPT`` against Hugging Face ``GPT2LMHeadModel`` (built by ``gpt_vs_hf.py``) at the
  shape of configs/lm/austen_char.yaml with Austen's 85 characters, batch 12 × 64 tokens; ``--shape gpt2-small``
  instead: 12 layers, 768 dims, 12 heads, block 1024, vocabulary 50304, batch 8. Throughput: tokens/s.
- ``vision``: our ViT against timm's ``VisionTransformer`` with the same initial weights (``vit_vs_timm.py``) at
  the shape of configs/vision/vit_fashion_mnist.yaml, batch 128 images of 1×28×28, 10 classes. Images/s.
- ``translation``: our ``EncoderDecoder`` against PyTorch's tutorial model around ``torch.nn.Transformer``
  (``translation_vs_torch.py``) at the shape of configs/translation/ding_de_en.yaml and its vocabulary size. The
  config's budget of 2048 tokens per side becomes a fixed batch of 64 pairs × 32 tokens: sources hold 25 to 32
  real tokens followed by padding (so the padding mask is exercised), targets are unpadded. Throughput: target
  tokens/s (64 × 32 = 2048 predicted tokens per step).

Each cell (task × fp32/bf16 × compile off/on) builds both models from one seed. bf16 is ``torch.autocast``
around forward and loss; compile is ``nn.Module.compile()`` on both, done during the untimed warm-up steps.
MFU: the FLOPs of one training step (forward and backward of our model in eager fp32, counted once per task by
``FlopCounterMode``) per second of step, over the matrix-multiply peak of the cell's precision measured at the
start of the run. Peak memory of training one model (weights, gradients, AdamW state, activations): on CUDA
from ``max_memory_allocated`` during that model's rounds; on CPU the growth of peak RSS over a few eager
training steps in a fresh process per model and precision (the compile-on rows repeat the eager figure).

    python benchmarks/peers.py                                       # all of it on CPU (10 to 15 minutes on 2 cores)
    python benchmarks/peers.py --tasks lm --precisions fp32 --compile off --steps 2 --rounds 1   # a quick look
    python benchmarks/peers.py --device cuda --shape gpt2-small      # on a GPU, the LM at GPT-2 small's shape

On a CPU shared with other jobs, pass ``--threads 1``: with two threads on a contended core, compiled steps
(many small OpenMP regions, each waiting for both threads) ran 20× slower than on a quiet machine.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import itertools
import json
import math
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch import Tensor, nn
from torch.utils import flop_counter

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ROLES = ("ours", "peer")
SEED = 0
PROBE_STEPS = 3  # training steps of a CPU memory probe: the first allocates AdamW's state
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MATMUL_SIZES = {"cpu": (1024, 2048, 4096), "cuda": (4096, 8192)}  # n × n matrix multiplies; the fastest is the peak
Batch = tuple[tuple[Tensor, ...], Tensor]  # (model inputs, targets)


@dataclass(frozen=True)
class Task:
    name: str
    peer: str  # the peer's name in the tables
    shape: str  # the configuration, in one line
    unit: str  # what throughput counts: tokens or images
    items_per_step: int
    build: Callable[[str], nn.Module]  # "ours" or "peer" → a new model; the caller seeds
    random_batch: Callable[[torch.Generator], Batch]
    ignore_index: int = -100  # targets left out of the loss

    def batches(self, count: int, device: torch.device) -> list[Batch]:
        """``count`` seeded random batches on ``device``."""
        generator = torch.Generator().manual_seed(SEED)
        batches = [self.random_batch(generator) for _ in range(count)]
        return [(tuple(x.to(device) for x in inputs), targets.to(device)) for inputs, targets in batches]


def config_args(name: str) -> tuple[dict, dict]:
    """(model shape, data init_args) of a config under configs/: its ``model.net`` and ``data`` settings."""
    config = yaml.safe_load((CONFIGS / name).read_text())
    return config["model"]["init_args"]["net"], config["data"]["init_args"]


def lm_task(shape: str) -> Task:
    import gpt_vs_hf

    if shape == "gpt2-small":
        dims = {"vocab_size": 50304, "block_size": 1024, "n_layers": 12, "n_heads": 12, "d_model": 768}
        batch_size = 8
    else:
        model, data = config_args("lm/austen_char.yaml")
        dims = {"vocab_size": 85, "block_size": data["block_size"]}  # Austen's characters + 4 special tokens
        dims |= {key: model[key] for key in ("n_layers", "n_heads", "d_model")}
        batch_size = data["loader"]["batch_size"]
    vocab_size, block_size = dims["vocab_size"], dims["block_size"]
    names = {"ours": "lightformer", "peer": "huggingface"}

    def random_batch(generator: torch.Generator) -> Batch:
        ids = torch.randint(vocab_size, (batch_size, block_size + 1), generator=generator)
        return (ids[:, :-1],), ids[:, 1:]

    return Task(
        "lm",
        "HF GPT2LMHeadModel",
        f"GPT {dims['n_layers']} layers × {dims['d_model']} dims, {dims['n_heads']} heads, vocabulary {vocab_size}, "
        f"batch {batch_size} × {block_size} tokens",
        "tokens",
        batch_size * block_size,
        lambda role: gpt_vs_hf.build_models(**dims)[names[role]],
        random_batch,
    )


def vision_task() -> Task:
    import vit_vs_timm

    model, data = config_args("vision/vit_fashion_mnist.yaml")
    shape = {key: model[key] for key in vit_vs_timm.SHAPE_KEYS if key in model}
    image_size, batch_size, channels, classes = data["image_size"], data["loader"]["batch_size"], 1, 10  # Fashion-MNIST
    described = ", ".join(f"{key} {value}" for key, value in shape.items())

    def random_batch(generator: torch.Generator) -> Batch:
        images = torch.randn(batch_size, channels, image_size, image_size, generator=generator)
        return (images,), torch.randint(classes, (batch_size,), generator=generator)

    return Task(
        "vision",
        "timm VisionTransformer",
        f"ViT {described}, batch {batch_size} × {channels}×{image_size}×{image_size}, {classes} classes",
        "images",
        batch_size,
        lambda role: vit_vs_timm.build_models(shape, image_size, channels, classes)[ROLES.index(role)],
        random_batch,
    )


def translation_task() -> Task:
    import translation_vs_torch
    from lightformer.tokenization.text import PAD_ID, SPECIAL_TOKENS

    model, data = config_args("translation/ding_de_en.yaml")
    vocab_size, length = data["tokenizer"]["vocab_size"], 32
    pairs = data["batches"]["max_tokens"] // length
    dims = [model[key] for key in ("n_encoder_layers", "d_model", "n_heads", "d_ff", "dropout")]
    names = {"ours": "lightformer", "peer": "torch.nn.Transformer"}

    def random_batch(generator: torch.Generator) -> Batch:
        src = torch.randint(len(SPECIAL_TOKENS), vocab_size, (pairs, length), generator=generator)
        real = length - torch.arange(pairs) % 8  # 25 to 32 real tokens per source, then padding
        src[torch.arange(length) >= real[:, None]] = PAD_ID
        tgt = torch.randint(len(SPECIAL_TOKENS), vocab_size, (pairs, length + 1), generator=generator)
        return (src, tgt[:, :-1]), tgt[:, 1:]

    return Task(
        "translation",
        "torch.nn.Transformer",
        f"encoder-decoder {dims[0]}+{dims[0]} layers, d_model {dims[1]}, {dims[2]} heads, d_ff {dims[3]}, "
        f"dropout {dims[4]}, vocabulary {vocab_size}, batch {pairs} pairs × {length} tokens (padded sources)",
        "target tokens",
        pairs * length,
        lambda role: translation_vs_torch.build_model(names[role], vocab_size, *dims),
        random_batch,
        ignore_index=PAD_ID,
    )


TASKS = ("lm", "vision", "translation")


def make_task(name: str, lm_shape: str) -> Task:
    return lm_task(lm_shape) if name == "lm" else {"vision": vision_task, "translation": translation_task}[name]()


def training_loss(model: nn.Module, inputs: tuple[Tensor, ...], targets: Tensor, ignore_index: int) -> Tensor:
    out = model(*inputs)
    logits = getattr(out, "logits", out)  # Hugging Face models return a ModelOutput
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), ignore_index=ignore_index)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Trainee:
    """One model with its AdamW; on CUDA it also records its own peak memory over its timed rounds."""

    def __init__(self, task: Task, role: str, precision: str, compiled: bool, device: torch.device) -> None:
        torch.manual_seed(SEED)
        self.model = task.build(role).to(device).train()
        if compiled:
            self.model.compile()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.device, self.bf16, self.ignore_index = device, precision == "bf16", task.ignore_index
        self.peak_bytes = 0

    def step(self, inputs: tuple[Tensor, ...], targets: Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            loss = training_loss(self.model, inputs, targets, self.ignore_index)
        loss.backward()
        self.optimizer.step()

    def run(self, batches: list[Batch]) -> float:
        """Seconds per step over ``batches``."""
        synchronize(self.device)
        cuda = self.device.type == "cuda"
        if cuda:
            others = torch.cuda.memory_allocated(self.device) - self.held_bytes()
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        for inputs, targets in batches:
            self.step(inputs, targets)
        synchronize(self.device)
        seconds = (time.perf_counter() - start) / len(batches)
        if cuda:
            self.peak_bytes = max(self.peak_bytes, torch.cuda.max_memory_allocated(self.device) - others)
        return seconds

    def held_bytes(self, weights_only: bool = False) -> int:
        """Bytes of this model's weights and, unless ``weights_only``, its gradients and AdamW state."""
        params = list(self.model.parameters())
        tensors = params + list(self.model.buffers())
        if not weights_only:
            tensors += [p.grad for p in params if p.grad is not None]
            tensors += [t for state in self.optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
        unique = {id(t): t for t in tensors}.values()  # tied weights once
        return sum(t.nbytes for t in unique if t.device.type == self.device.type)


@dataclass
class Cell:
    task: Task
    precision: str
    compile: str  # "off" or "on"
    seconds: dict[str, float]  # role → median seconds per training step
    memory: dict[str, float | None]  # role → peak memory in MiB


def measure_cell(task: Task, precision: str, compile: str, batches: list[Batch], args: argparse.Namespace) -> Cell:
    """Warm-up, then ``rounds`` timed rounds per model, ours and peer alternating which goes first."""
    torch._dynamo.reset()  # each cell compiles afresh
    trainees = {role: Trainee(task, role, precision, compile == "on", args.device) for role in ROLES}
    warmup = list(itertools.islice(itertools.cycle(batches), args.warmup))
    step_seconds = max(trainee.run(warmup) for trainee in trainees.values())
    steps = max(args.steps, math.ceil(args.round_seconds / step_seconds))  # short steps: more of them per round
    timed = list(itertools.islice(itertools.cycle(batches), steps))
    seconds = {role: [] for role in ROLES}
    for round_ in range(args.rounds):
        for role in ROLES if round_ % 2 == 0 else ROLES[::-1]:
            seconds[role].append(trainees[role].run(timed))
    memory = {role: trainees[role].peak_bytes / 2**20 or None for role in ROLES}
    return Cell(task, precision, compile, {role: statistics.median(s) for role, s in seconds.items()}, memory)


def _sdpa_forward_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(query, key, value)


def _sdpa_backward_flops(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)


# FlopCounterMode knows the CUDA attention kernels but not the fused CPU one: count it as they are counted.
CPU_ATTENTION_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_forward_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_backward_flops,
}


def training_flops(task: Task, device: torch.device) -> int:
    """FLOPs of one forward and backward of our model (eager, fp32) on one batch."""
    torch.manual_seed(SEED)
    model = task.build("ours").to(device).train()
    [(inputs, targets)] = task.batches(1, device)
    with flop_counter.FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS) as counter:
        training_loss(model, inputs, targets, task.ignore_index).backward()
    return counter.get_total_flops()


def matmul_peak(precision: str, device: torch.device, seconds: float = 1.0) -> float:
    """FLOP/s of the fastest of the square matrix multiplies ``MATMUL_SIZES``, each repeated for ``seconds``."""
    return max(matmul_rate(n, DTYPES[precision], device, seconds) for n in MATMUL_SIZES[device.type])


def matmul_rate(n: int, dtype: torch.dtype, device: torch.device, seconds: float) -> float:
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    for _ in range(3):
        a @ b
    synchronize(device)
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        a @ b
        synchronize(device)
        count += 1
    return 2 * n**3 * count / elapsed


def memory_probe(task: Task, role: str, precision: str) -> float:
    """MiB of training one model on CPU, eager: its weights plus the growth of peak RSS over a few steps."""
    trainee = Trainee(task, role, precision, compiled=False, device=torch.device("cpu"))
    batches = task.batches(PROBE_STEPS, trainee.device)
    gc.collect()  # the builder may have made and dropped the other model: hand its memory back first
    ctypes.CDLL(None).malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak RSS (VmHWM) to the current RSS
    before = rss_kib("VmRSS")
    for inputs, targets in batches:
        trainee.step(inputs, targets)
    return ((rss_kib("VmHWM") - before) * 1024 + trainee.held_bytes(weights_only=True)) / 2**20


def rss_kib(field: str) -> int:
    """``VmRSS`` (current) or ``VmHWM`` (peak) resident memory of this process in KiB, from /proc (Linux).

    Not ``getrusage``'s ``ru_maxrss``: in a process started by fork and exec it never falls below the parent's
    peak RSS, which here is the benchmark's own.
    """
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text())[1])


def probe_memory(task: Task, precisions: list[str], args: argparse.Namespace) -> dict[tuple[str, str], float]:
    """(role, precision) → MiB, each from a fresh process of this script running ``memory_probe``."""
    memory = {}
    for role, precision in itertools.product(ROLES, precisions):
        command = [sys.executable, __file__, "--memory-probe", task.name, role, precision, "--shape", args.shape]
        command += ["--threads", str(torch.get_num_threads())]
        out = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True).stdout
        memory[role, precision] = json.loads(out.splitlines()[-1])["mib"]
    return memory


def markdown_table(header: list[str], rows: list[list[str]], text_columns: int) -> str:
    """A markdown table whose columns after the first ``text_columns`` are right-aligned."""
    rule = ["---"] * text_columns + ["---:"] * (len(header) - text_columns)
    return "\n".join("| " + " | ".join(row) + " |" for row in [header, rule, *rows])


def flop_rate(flops_per_second: float) -> str:
    return (
        f"{flops_per_second / 1e12:.1f} TFLOP/s"
        if flops_per_second >= 1e12
        else f"{flops_per_second / 1e9:.1f} GFLOP/s"
    )


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model and the instructions torch uses on it."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())[1]
    return f"{name} ({torch.backends.cpu.get_cpu_capability()})"


def machine(device: torch.device) -> str:
    return f"{device_name(device)}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def mfu(cell: Cell, role: str, flops: dict[str, int], peaks: dict[str, float]) -> float:
    return flops[cell.task.name] / cell.seconds[role] / peaks[cell.precision]


def mib(memory: float | None) -> str:
    return "–" if memory is None else f"{memory:,.1f}"


def cell_table(cells: list[Cell], flops: dict[str, int], peaks: dict[str, float]) -> str:
    rows = []
    for cell in cells:
        for role, model in zip(ROLES, ("lightformer", cell.task.peer), strict=True):
            rate = cell.task.items_per_step / cell.seconds[role]
            rows.append(
                [cell.task.name, cell.precision, cell.compile, model]
                + [f"{rate:,.0f} {cell.task.unit}/s", f"{1000 * cell.seconds[role]:.1f}"]
                + [f"{mfu(cell, role, flops, peaks):.1%}", mib(cell.memory[role])]
            )
    header = ["task", "precision", "compile", "model", "throughput", "ms/step", "MFU", "peak memory (MiB)"]
    return markdown_table(header, rows, text_columns=4)


def summary_table(cells: list[Cell], flops: dict[str, int], peaks: dict[str, float]) -> str:
    rows = []
    for cell in cells:
        ours, peer = (cell.memory[role] for role in ROLES)
        rows.append(
            [cell.task.name, cell.precision, cell.compile]
            + [f"{cell.seconds['peer'] / cell.seconds['ours']:.2f}"]
            + [f"{mfu(cell, role, flops, peaks):.1%}" for role in ROLES]
            + [f"{peer / ours:.2f}" if ours and peer else "–"]
        )
    header = ["task", "precision", "compile", "speed ours/peer", "MFU ours", "MFU peer", "memory peer/ours"]
    return markdown_table(header, rows, text_columns=3)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--precisions", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--compile", nargs="+", choices=["off", "on"], default=["off", "on"])
    parser.add_argument("--steps", type=int, default=5, help="timed training steps per round, at least")
    parser.add_argument("--round-seconds", type=float, default=2.0, help="more steps per round until it lasts this")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per model (median kept)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model (compilation happens here)")
    parser.add_argument("--device", type=torch.device, default=torch.device("cpu"))
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--shape", choices=["config", "gpt2-small"], default="config", help="shape of the lm task")
    parser.add_argument(
        "--memory", action=argparse.BooleanOptionalAction, default=True, help="on CPU, measure peak memory"
    )
    parser.add_argument("--memory-probe", nargs=3, metavar=("TASK", "MODEL", "PRECISION"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_probe:
        name, role, precision = args.memory_probe
        print(json.dumps({"mib": memory_probe(make_task(name, args.shape), role, precision)}))
        return

    cpu = args.device.type == "cpu"
    peaks = {precision: matmul_peak(precision, args.device) for precision in args.precisions}
    sizes = "/".join(str(n) for n in MATMUL_SIZES[args.device.type])
    print(f"machine: {machine(args.device)}")
    measured = ", ".join(f"{p} {flop_rate(r)}" for p, r in peaks.items())
    print(f"matrix-multiply peak (fastest of n × n, n = {sizes}, measured now): {measured}")
    rounds = f"{args.rounds} rounds per model of ≥ {args.steps} steps and ≥ {args.round_seconds} s"
    print(f"{rounds}, after {args.warmup} warm-up steps; AdamW")
    cells, flops = [], {}
    for name in args.tasks:
        task = make_task(name, args.shape)
        flops[name] = training_flops(task, args.device)
        print(f"- {name}: {task.shape}; peer {task.peer}; {flops[name] / 1e9:.3g} GFLOP per training step", flush=True)
        probed = probe_memory(task, args.precisions, args) if cpu and args.memory else {}
        batches = task.batches(args.steps, args.device)
        for precision, compile in itertools.product(args.precisions, args.compile):
            cell = measure_cell(task, precision, compile, batches, args)
            if probed:
                cell.memory = {role: probed[role, precision] for role in ROLES}
            cells.append(cell)
            times = ", ".join(f"{role} {1000 * s:.1f} ms/step" for role, s in cell.seconds.items())
            print(f"  {name} {precision} compile {compile}: {times}", file=sys.stderr, flush=True)

    print()
    print(cell_table(cells, flops, peaks))
    if cpu and args.memory:
        print("\nPeak memory on CPU: eager, each model alone in a fresh process; compile-on rows repeat it.")
    print()
    print(summary_table(cells, flops, peaks))
    print("\n≥ 1 is in our favour in the ratio columns; MFU is against the measured peak of the row's precision.")


if __name__ == "__main__":
    main()
