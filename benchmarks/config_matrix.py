"""Every shipped config × every trainer preset, a few training steps each: does it run, how fast, in how much memory.

    python benchmarks/config_matrix.py                      # GPU presets where a GPU exists, else the CPU presets
    python benchmarks/config_matrix.py --presets gpu fsdp --steps 50
    python benchmarks/config_matrix.py --quick              # small batches, no compile: a smoke test (the tests)

Each cell is ``python -m lightformer fit --config <config> --config <preset>`` in a fresh process for ``--steps``
optimizer steps and one short validation, with the real data, logging and checkpointing into a temporary folder.
It prints a Markdown table: ok / error (the error's last line) / unavailable (data this machine cannot get, and
why), training steps per second after the first steps (compilation and caches), and the peak memory of process
0 (GPU: allocated by PyTorch; CPU: resident set). Data is prepared once into ``--cache_dir`` and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from lightning.pytorch.callbacks import Callback

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
GPU_PRESETS = ("gpu", "ddp", "fsdp")
CPU_PRESETS = ("cpu", "ddp_cpu", "fsdp_cpu")
# --quick: small batches (and short LM windows), so that a CPU runs every config in seconds.
QUICK_DATA = {
    "lightformer.data.TextDataModule": [
        "--data.loader.batch_size=2",
        "--data.block_size=64",
        "--data.loader.num_workers=0",
    ],
    "lightformer.data.ImageDataModule": ["--data.loader.batch_size=8", "--data.loader.num_workers=0"],
    "lightformer.data.TranslationDataModule": ["--data.batches.max_tokens=256", "--data.batches.num_workers=0"],
    "lightformer.data.TextClassificationDataModule": ["--data.loader.batch_size=4", "--data.loader.num_workers=0"],
    "lightformer.data.MaskedLMDataModule": ["--data.loader.batch_size=2", "--data.loader.num_workers=0"],
    "lightformer.data.SpanCorruptionDataModule": ["--data.loader.batch_size=2", "--data.loader.num_workers=0"],
    "lightformer.data.ImageTokenDataModule": ["--data.loader.batch_size=4", "--data.loader.num_workers=0"],
    "lightformer.data.ImageTextDataModule": [
        "--data.source.train_lines=64",
        "--data.source.val_lines=8",
        "--data.source.test_lines=8",
        "--data.loader.batch_size=4",
        "--data.loader.num_workers=0",
    ],
}


class MatrixProbe(Callback):
    """Writes ``{out}`` (JSON) from process 0 at the end of fit: steps per second after ``skip`` steps, the
    peak memory in MiB, and the last training loss."""

    def __init__(self, out: str, skip: int = 1) -> None:
        self.out, self.skip = Path(out), skip
        self.times: list[float] = []
        self.loss = float("nan")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if pl_module.device.type == "cuda":
            import torch

            torch.cuda.synchronize()
        self.times.append(time.perf_counter())
        self.loss = float(outputs["loss"]) if isinstance(outputs, dict) else float(outputs)

    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        timed = self.times[self.skip :]
        steps_per_sec = (len(timed) - 1) / (timed[-1] - timed[0]) if len(timed) > 1 else None
        if pl_module.device.type == "cuda":
            import torch

            memory = torch.cuda.max_memory_allocated() / 2**20
        else:
            memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        record = {"steps": trainer.global_step, "steps_per_sec": steps_per_sec, "memory_mib": memory, "loss": self.loss}
        self.out.write_text(json.dumps(record))


def unavailable(config: dict) -> str | None:
    """Why the data of ``config`` cannot be had on this machine, or None."""
    source = config.get("data", {}).get("init_args", {}).get("source") or {}
    init = (config.get("model", {}).get("init_args") or {}).get("init") or {}
    for checkpoint in [init.get("checkpoint"), *(init.get("modules") or {}).values()]:
        if checkpoint and not Path(checkpoint).is_file():
            return f"starts from {checkpoint}, which a pretraining run writes first (see the config's comments)"
    train = source.get("train")
    if isinstance(train, str) and "://" not in train and not Path(train).exists():  # a user's own files, e.g. COCO
        return f"reads {train}, which is not on this machine (see the config's comments)"
    if source.get("dataset") == "cifar10":
        folder = Path(source.get("root", "data")) / "cifar-10-batches-py"
        if not folder.is_dir():
            return (
                f"CIFAR-10 is downloaded by torchvision (needs internet); put cifar-10-batches-py in {folder.parent}/"
            )
    return None


def run_cell(
    config_path: Path, preset: str, steps: int, quick: bool, cache_dir: str, timeout: int, threads: int | None
) -> dict:
    config = yaml.safe_load(config_path.read_text())
    reason = unavailable(config)
    if reason:
        return {"status": "unavailable", "detail": reason}
    with tempfile.TemporaryDirectory(prefix="matrix-") as tmp:
        out = Path(tmp) / "probe.json"
        probe = {"class_path": "config_matrix.MatrixProbe", "init_args": {"out": str(out)}}
        args = [
            sys.executable, "-m", "lightformer", "fit",
            f"--config={config_path}", f"--config={CONFIGS / 'trainer' / f'{preset}.yaml'}",
            f"--trainer.max_steps={steps}", "--trainer.max_epochs=-1", "--trainer.max_time=null",
            f"--trainer.val_check_interval={steps}", "--trainer.check_val_every_n_epoch=null",
            f"--trainer.limit_val_batches={1 if quick else 2}", "--trainer.num_sanity_val_steps=0",
            "--trainer.log_every_n_steps=1",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
            f"--trainer.logger.init_args.save_dir={tmp}/runs", f"--trainer.callbacks+={json.dumps(probe)}",
            f"--data.cache_dir={cache_dir}" if "cache_dir" in _data_arguments(config) else "",
        ]  # fmt: skip
        if quick:
            args += QUICK_DATA.get(config["data"]["class_path"], []) + ["--model.compile=false"]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO / "benchmarks"), os.environ.get("PYTHONPATH", "")]),
        }
        start = time.perf_counter()
        try:
            result = subprocess.run(
                [a for a in args if a], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return {"status": "error", "detail": f"no result within {timeout} s"}
        seconds = time.perf_counter() - start
        if result.returncode != 0 or not out.is_file():
            lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
            return {"status": "error", "detail": lines[-1] if lines else f"exit code {result.returncode}"}
        return {"status": "ok", "seconds": seconds, **json.loads(out.read_text())}


def _data_arguments(config: dict) -> set[str]:
    import importlib
    import inspect

    module, _, name = config["data"]["class_path"].rpartition(".")
    return set(inspect.signature(getattr(importlib.import_module(module), name)).parameters)


def table(rows: list[tuple[str, str, dict]]) -> str:
    lines = ["| config | preset | result | steps/s | peak memory |", "|---|---|---|---:|---:|"]
    for config, preset, cell in rows:
        if cell["status"] == "ok":
            rate = f"{cell['steps_per_sec']:.2f}" if cell["steps_per_sec"] else "–"
            lines.append(f"| {config} | {preset} | ok | {rate} | {cell['memory_mib']:,.0f} MiB |")
        else:
            lines.append(f"| {config} | {preset} | {cell['status']}: {cell['detail']} | | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="*", help="configs under configs/ (default: every task config)")
    parser.add_argument(
        "--presets", nargs="*", help="trainer presets (default: gpu ddp fsdp with a GPU, else CPU ones)"
    )
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per cell")
    parser.add_argument("--quick", action="store_true", help="small batches and no compile (a smoke test)")
    parser.add_argument("--cache_dir", default="data/cache", help="where the data modules cache tokenizers and ids")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    parser.add_argument("--jobs", type=int, default=1, help="cells run at once, one thread each (timings then shared)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    import torch

    presets = args.presets or (GPU_PRESETS if torch.cuda.is_available() else CPU_PRESETS)
    configs = args.configs or sorted(str(p.relative_to(CONFIGS)) for p in CONFIGS.glob("*/*.yaml"))
    configs = [c for c in configs if not c.startswith("trainer/")]
    cells = [(config, preset) for config in configs for preset in presets]

    def run(cell: tuple[str, str]) -> dict:
        config, preset = cell
        threads = 1 if args.jobs > 1 else None
        result = run_cell(CONFIGS / config, preset, args.steps, args.quick, args.cache_dir, args.timeout, threads)
        print(f"{config} × {preset}: {result['status']} {result.get('detail', '')}", file=sys.stderr, flush=True)
        return result

    if args.jobs > 1:  # the first cell of each config prepares its data, then the other presets find it prepared
        # (configs that share data prepare it once: the data modules lock what they prepare, or write it atomically)
        firsts, rest = [c for c in cells if c[1] == presets[0]], [c for c in cells if c[1] != presets[0]]
        with ThreadPoolExecutor(args.jobs) as pool:
            done = dict(zip(firsts, pool.map(run, firsts), strict=True))
            done |= dict(zip(rest, pool.map(run, rest), strict=True))
        results = [done[cell] for cell in cells]
    else:
        results = [run(cell) for cell in cells]
    rows = [(config, preset, result) for (config, preset), result in zip(cells, results, strict=True)]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    how = f"{args.steps} steps per cell" + (" (--quick)" if args.quick else "")
    how += f", {args.jobs} cells at once (timings not comparable)" if args.jobs > 1 else ""
    print(f"\n{how}, torch {torch.__version__}, {device}\n")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([{"config": c, "preset": p, **cell} for c, p, cell in rows], indent=1))


if __name__ == "__main__":
    main()
