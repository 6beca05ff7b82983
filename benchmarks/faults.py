"""What a run loses to each fault: kill -9 during a step and during a checkpoint write, a NaN loss, a read-only and
a full output folder. Prints one table row per fault: what happened, what was lost, and whether resuming works.

    python benchmarks/faults.py                                # kill -9, NaN and read-only (as a non-root user)
    sudo python benchmarks/faults.py --mount                   # also mounts small tmpfs folders: read-only, full

Each run is ``python -m lightformer fit`` on a small config (the digits ViT, checkpoints every few steps).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
STEPS = 200
BASE = [
    "--config=configs/vision/vit_digits.yaml",
    "--trainer.max_epochs=-1",
    f"--trainer.max_steps={STEPS}",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    '--trainer.callbacks=[{"class_path": "lightformer.training.callbacks.ModelCheckpoint", "init_args": '
    '{"every_n_train_steps": 20, "save_top_k": -1, "filename": "{step}", "save_last": true}}]',
]


def fit(save_dir: Path, *extra: str, background: bool = False) -> subprocess.Popen | subprocess.CompletedProcess:
    command = [sys.executable, "-m", "lightformer", "fit", *BASE, f"--trainer.logger.init_args.save_dir={save_dir}"]
    command += list(extra)
    if background:
        return subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True)


def last(save_dir: Path) -> Path | None:
    found = sorted(save_dir.glob("*/version_*/checkpoints/last.ckpt"))
    return found[-1] if found else None


def step_of(path: Path | None) -> int:
    return torch.load(path, weights_only=True, map_location="cpu")["global_step"] if path else 0


def kill_during(save_dir: Path, during_write: bool) -> tuple[str, str, str]:
    """Kill -9 a run after its second checkpoint; ``during_write``: at a moment a checkpoint file is being written."""
    process = fit(save_dir, background=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        folders = list(save_dir.glob("*/version_*/checkpoints"))
        written = [p for f in folders for p in f.glob("step=*.ckpt")]
        writing = [p for f in folders for p in f.glob(".*.tmp")]
        if len(written) >= 2 and (writing or not during_write):
            break
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    orphans = [p.name for p in save_dir.glob("*/version_*/checkpoints/.*.tmp")]
    checkpoint = last(save_dir)
    loaded = step_of(checkpoint)
    resumed = fit(save_dir, f"--ckpt_path={checkpoint}")
    finished = step_of(last(save_dir))
    left = [p.name for p in save_dir.glob("*/version_*/checkpoints/.*.tmp")]
    happened = f"killed; last.ckpt loads (step {loaded}); {len(orphans)} temporary file(s) left by the kill"
    lost = "the steps since that checkpoint (at most 20)"
    outcome = f"resume: exit {resumed.returncode}, reaches step {finished}/{STEPS}; temporary files after: {len(left)}"
    return happened, lost, outcome


def nan_loss(save_dir: Path) -> tuple[str, str, str]:
    run = fit(save_dir, "--model.optimizer.lr=1e30", "--model.optimizer.warmup_steps=0")
    message = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else ""
    return (
        f"exit {run.returncode}: {message[:160]}...",
        "nothing: the NaN step is never applied",
        "resume from the named checkpoint",
    )


def refused_folder(save_dir: Path, what: str) -> tuple[str, str, str]:
    run = fit(save_dir)
    message = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else ""
    return f"exit {run.returncode}: {message[:240]}", "nothing: refused before the first step", "fix the folder, rerun"


def full_during_training(save_dir: Path) -> tuple[str, str, str]:
    run = fit(save_dir)
    message = next((line for line in run.stderr.splitlines() if "disk full" in line), run.stderr[-200:])
    checkpoint = last(save_dir)
    return (
        f"exit {run.returncode}: {message.strip()[:200]}",
        f"the steps since the last checkpoint written (step {step_of(checkpoint)}), which loads",
        "free space, resume with --ckpt_path",
    )


def mount_tmpfs(folder: Path, size: str, read_only: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mount", action="store_true", help="mount small tmpfs folders (root) for read-only and full")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
        tmp = Path(tmp)
        rows.append(("kill -9 during a training step", *kill_during(tmp / "kill-step", during_write=False)))
        rows.append(("kill -9 during a checkpoint write", *kill_during(tmp / "kill-write", during_write=True)))
        rows.append(("NaN loss (lr 1e30)", *nan_loss(tmp / "nan")))
        if args.mount:
            try:
                mount_tmpfs(tmp / "read-only", "1M", read_only=True)
                rows.append(("read-only output folder", *refused_folder(tmp / "read-only", "read-only")))
                mount_tmpfs(tmp / "tiny", "64K")
                rows.append(("output folder too small to start", *refused_folder(tmp / "tiny", "full")))
                mount_tmpfs(tmp / "small", "4M")  # room for the start, then the per-20-step checkpoints fill it
                rows.append(("disk filling up during training", *full_during_training(tmp / "small")))
            finally:
                for name in ("read-only", "tiny", "small"):
                    subprocess.run(["umount", str(tmp / name)], capture_output=True)
        elif os.geteuid() != 0:
            chmod = tmp / "read-only"
            chmod.mkdir()
            chmod.chmod(0o555)
            rows.append(("read-only output folder (chmod 555)", *refused_folder(chmod, "read-only")))
    print("| fault | what happened | what was lost | then |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")


if __name__ == "__main__":
    main()
