"""Makes the old-checkpoint fixtures of this folder: one tiny ``fit`` per task, written by an older lightformer.

The fixtures here were made by commit 51eef69 (before the refactor of how tasks store what the data tells the
model), those in ``b1bd12e/`` by commit b1bd12e (before the refactor of the model configs, the ``Task`` base and the
package layout); ``tests/test_old_checkpoints.py`` checks that today's code still loads both. Remake them only on
purpose, with that commit's code (same dependencies):

    git worktree add /tmp/old b1bd12e
    OMP_NUM_THREADS=1 PYTHONPATH=/tmp/old/src python tests/data/old_checkpoints/make.py --out b1bd12e   # or name tasks
    git worktree remove --force /tmp/old

(51eef69's set: ``git worktree add /tmp/old 51eef69`` and no ``--out``; that commit has no image-text task.)

For each task it writes the task's data file here (text corpus, TSV; with ``--out``, in ``DATA_FOLDER``), runs
``python -m lightformer fit`` with the task's shipped config of that checkout and the tiny overrides of ``ARGS`` in a
scratch folder (the data under the relative names below, so no machine's paths are stored in the model's
hyperparameters), and copies the run's ``last.ckpt`` to ``<task>.ckpt``. Vision and Image GPT train on
scikit-learn's 8×8 digits (shipped with scikit-learn).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The data files, written here by ``write_data`` (the same text as tests/tiny_runs.py of 51eef69).
CORPUS = "It is a truth universally acknowledged, that a single man in possession of a good fortune.\n" * 30
LABELLED = "".join(
    f"it is a truth number {i}\ttruth\n" if i % 2 else f"a single man in house {i}\tman\n" for i in range(64)
)
PAIRS = "".join(f"{a} {b} {c}\t{c} {b} {a}\n" for a in "abcd" for b in "efgh" for c in "ijkl")
DATA = {"corpus.txt": CORPUS, "labelled.tsv": LABELLED, "pairs.tsv": PAIRS}
# Where a set made with ``--out NAME`` reads its data files, and their modification time: the data modules of b1bd12e
# and later store each source's path, size and time in their checkpoints, and refuse to resume on other files, so a
# test that resumes these checkpoints writes the files there again (``restore_data``).
DATA_FOLDER = "/tmp/lightformer-fixtures"
DATA_MTIME_NS = 1_764_000_000 * 10**9  # 2025-11-24


def restore_data(folder: str | Path) -> Path:
    """Write the data files into ``folder`` with the fixtures' modification time; the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in DATA.items():
        (folder / name).write_text(text, encoding="utf-8")
        os.utime(folder / name, ns=(DATA_MTIME_NS, DATA_MTIME_NS))
    return folder


# Every run: fp32, no time limit, logs and checkpoints under the scratch folder's runs/, no progress bar.
COMMON = [
    "--trainer.logger.init_args.save_dir=runs",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.max_time=null",
    "--model.optimizer.fit_to_max_time=false",
    "--trainer.precision=32-true",
    "--trainer.max_steps=3",
    "--trainer.val_check_interval=null",
    "--trainer.check_val_every_n_epoch=1",
    "--trainer.limit_val_batches=1",
    "--model.optimizer.warmup_steps=2",
]

# The config of each task (in the old checkout's configs/) and its tiny overrides (besides COMMON). The tasks with a
# BPE of 268-397 tokens take d_model 8, so that each file stays near 100 KB (Adam's two moments triple the weights).
ARGS: dict[str, list[str]] = {
    "vision": [
        "--config=configs/vision/vit_digits.yaml",
        "--model.net.n_layers=1",
        "--model.net.d_model=16",
        "--model.net.n_heads=2",
        "--model.net.d_ff=32",
        "--model.net.dropout=0.1",
        "--model.net.drop_path=0.1",
        "--data.augment.policy=flip_crop",
        "--data.source.val_size=200",
        "--data.loader.batch_size=32",
    ],
    "lm": [
        "--config=configs/lm/austen_char.yaml",
        "--data.source.corpus=null",
        "--data.source.train_files=[corpus.txt]",
        "--data.source.test_fraction=0.1",
        "--data.prepare.dir=prepared/lm",
        "--data.block_size=16",
        "--data.loader.batch_size=8",
        "--model.net.n_layers=1",
        "--model.net.d_model=16",
        "--model.net.n_heads=2",
        "--model.net.dropout=0.1",
        "--model.sample_tokens=8",
    ],
    "translation": [
        "--config=configs/translation/ding_de_en.yaml",
        "--data.source.corpus=null",
        "--data.source.ding_phrases=false",
        "--data.source.tsv_files=[pairs.tsv]",
        "--data.source.val_tsv_files=[pairs.tsv]",
        "--data.source.test_tsv_files=[pairs.tsv]",
        "--data.tokenizer.vocab_size=270",
        "--data.batches.max_tokens=128",
        "--data.prepare.dir=prepared/translation",
        "--model.net.n_encoder_layers=1",
        "--model.net.n_decoder_layers=1",
        "--model.net.d_model=8",
        "--model.net.n_heads=2",
        "--model.net.d_ff=16",
        "--model.net.dropout=0.1",
        "--model.net.max_len=16",
    ],
    "mlm": [
        "--config=configs/mlm/austen.yaml",
        "--data.source.corpus=null",
        "--data.source.train_files=[corpus.txt]",
        "--data.prepare.dir=prepared/mlm",
        "--data.tokenizer.vocab_size=300",
        "--data.num_sentinels=8",
        "--data.segment_tokens=16",
        "--data.source.val_fraction=0.25",
        "--data.source.test_fraction=0.0",
        "--data.loader.batch_size=4",
        "--model.net.n_layers=1",
        "--model.net.d_model=8",
        "--model.net.n_heads=2",
        "--model.net.d_ff=16",
        "--model.net.max_len=32",
        "--model.net.dropout=0.1",
        "--model.num_logged_samples=1",
    ],
    "t5": [
        "--config=configs/t5/austen.yaml",
        "--data.source.corpus=null",
        "--data.source.train_files=[corpus.txt]",
        "--data.prepare.dir=prepared/t5",
        "--data.tokenizer.vocab_size=300",
        "--data.num_sentinels=8",
        "--data.segment_tokens=16",
        "--data.source.val_fraction=0.25",
        "--data.source.test_fraction=0.0",
        "--data.loader.batch_size=4",
        "--model.net.n_encoder_layers=1",
        "--model.net.n_decoder_layers=1",
        "--model.net.d_model=8",
        "--model.net.n_heads=2",
        "--model.net.d_ff=16",
        "--model.net.max_len=32",
        "--model.net.dropout=0.1",
        "--model.num_logged_samples=1",
    ],
    "classify": [
        "--config=configs/classify/austen_scratch.yaml",
        "--data.source.corpus=null",
        "--data.source.tsv_files=[labelled.tsv]",
        "--data.source.val_tsv_files=[labelled.tsv]",
        "--data.source.test_tsv_files=[labelled.tsv]",
        "--data.tokenizer.vocab_size=400",
        "--data.max_tokens=16",
        "--data.loader.batch_size=16",
        "--data.prepare.dir=prepared/classify",
        "--model.net.n_layers=1",
        "--model.net.d_model=8",
        "--model.net.n_heads=2",
        "--model.net.d_ff=16",
        "--model.net.max_len=16",
        "--model.net.dropout=0.1",
    ],
    "image_text": [
        "--config=configs/image_text/printed_lines.yaml",
        "--data.source.train_lines=48",
        "--data.source.val_lines=8",
        "--data.source.test_lines=8",
        "--data.source.max_words=1",
        "--data.render.height=16",
        "--data.render.width=96",
        "--data.prepare.dir=prepared/image_text",
        "--data.loader.batch_size=8",
        "--model.net.patch_size=[16, 8]",
        "--model.net.encoder_layers=1",
        "--model.net.encoder_d_model=16",
        "--model.net.decoder_layers=1",
        "--model.net.d_model=8",
        "--model.net.n_heads=2",
        "--model.net.d_ff=16",
        "--model.net.max_len=24",
        "--model.net.dropout=0.1",
        "--model.num_logged_samples=1",
    ],
    "igpt": [
        "--config=configs/igpt/digits.yaml",
        "--data.loader.batch_size=32",
        "--model.net.n_layers=1",
        "--model.net.d_model=16",
        "--model.net.n_heads=2",
        "--model.net.dropout=0.1",
        "--model.num_samples=2",
        "--model.completion_images=1",
        "--model.num_completions=1",
    ],
}


def old_checkout() -> Path:
    """The repository whose lightformer is imported (PYTHONPATH=<checkout>/src): its configs are the ones used."""
    import lightformer

    return Path(lightformer.__file__).resolve().parents[2]


def make(task: str, repo: Path, scratch: Path, out: Path) -> Path:
    """Run the tiny fit of ``task`` in ``scratch`` and copy its last.ckpt to ``out`` as ``<task>.ckpt``."""
    restore_data(scratch)
    args = [arg.replace("--config=", f"--config={repo}/") for arg in ARGS[task]]
    command = [sys.executable, "-m", "lightformer", "fit", *args, *COMMON]
    print(" ".join(command), flush=True)
    subprocess.run(command, cwd=scratch, env=os.environ, check=True)
    (last,) = sorted(scratch.glob("runs/*/version_*/checkpoints/last.ckpt"), key=os.path.getmtime)[-1:]
    target = out / f"{task}.ckpt"
    shutil.copyfile(last, target)
    shutil.rmtree(scratch / "runs")
    return target


def main(args: list[str]) -> None:
    """``[--out FOLDER] [task ...]``: every task (or those named), into this folder or its sub-folder FOLDER."""
    out, scratch = HERE, Path(tempfile.mkdtemp())
    if args[:1] == ["--out"]:
        out, scratch, args = HERE / args[1], Path(DATA_FOLDER) / args[1], args[2:]
        out.mkdir(exist_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
    repo = old_checkout()
    print(f"lightformer from {repo}")
    for name, text in DATA.items():
        (HERE / name).write_text(text, encoding="utf-8")
    scratch.mkdir(parents=True, exist_ok=True)
    for task in args or list(ARGS):
        target = make(task, repo, scratch, out)
        print(f"wrote {target} ({target.stat().st_size:,} bytes)", flush=True)
    shutil.rmtree(scratch)


if __name__ == "__main__":
    main(sys.argv[1:])
