"""Few-second configurations of each task, built from the shipped configs, for tests that run real training."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import IterableDataset

from lightformer.cli.main import cli_main
from lightformer.data.module import DataModule
from lightformer.facts import DataFacts

REPO = Path(__file__).resolve().parents[1]
# Every task, by the name task_args knows it: the tests that run each task (resume, bf16) take them all.
ALL_TASKS = ("vision", "lm", "translation", "mlm", "t5", "classify", "igpt", "image_text", "contrastive", "vlm")
# The image-to-text data of the tiny runs: a few dozen lines of a word, rendered in seconds.
IMAGE_TEXT_DATA = ["--data.source.train_lines=48", "--data.source.val_lines=8", "--data.source.test_lines=8",
                   "--data.source.max_words=1", "--data.render.height=16", "--data.render.width=96"]  # fmt: skip
CORPUS = "It is a truth universally acknowledged, that a single man in possession of a good fortune.\n" * 30


def tower_options(*fields: str) -> list[str]:
    """The options that set ``fields`` ("n_layers=1") in both towers of an image-to-text model."""
    return [f"--model.net.{tower}.{field}" for tower in ("encoder", "decoder") for field in fields]


def write_captioned_squares(root: Path, count: int = 48) -> Path:
    """``count`` 16-pixel images of a coloured square on white, each captioned with its colour and place; the JSONL
    that names them (a user's captioned images, ``ImageTextFilesDataModule``)."""
    from PIL import Image, ImageDraw

    colours = {"red": (220, 30, 30), "green": (30, 160, 60), "blue": (40, 60, 220)}
    rows = []
    for i in range(count):
        colour, x, y = list(colours)[i % 3], 1 + i // 3 % 4 * 2, 1 + i // 12 * 2
        image = Image.new("RGB", (16, 16), "white")
        ImageDraw.Draw(image).rectangle((x, y, x + 6, y + 6), fill=colours[colour])
        name = f"squares/{i:03d}.png"
        (root / "squares").mkdir(parents=True, exist_ok=True)
        image.save(root / name)
        rows.append({"file": name, "text": f"a {colour} square at {x} {y}"})
    path = root / "squares.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def quiet_run_args(tmp_path: Path) -> list[str]:
    """Trainer options of every tiny test run (after its --config): logs under tmp_path, fp32, no progress bar or
    model summary, no time limit and so no decay fitted to one."""
    return [
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.max_time=null",
        "--model.optimizer.fit_to_max_time=false",  # nothing to fit to without max_time
        "--trainer.precision=32-true",
    ]


class StepClock(Callback):
    """The clock of Lightning's ``Timer`` (which stops a run at ``trainer.max_time``) during a run: every training
    step takes ``seconds_per_step``, whatever else the machine is running; a list gives each process (by global
    rank) its own pace."""

    def __init__(self, seconds_per_step: float | list[float]) -> None:
        self.seconds_per_step, self.now = seconds_per_step, 0.0

    def monotonic(self) -> float:
        return self.now

    def setup(self, trainer, pl_module, stage: str) -> None:
        import lightning.pytorch.callbacks.timer

        if isinstance(self.seconds_per_step, list):
            self.seconds_per_step = self.seconds_per_step[trainer.global_rank]

        self._time, lightning.pytorch.callbacks.timer.time = lightning.pytorch.callbacks.timer.time, self

    def teardown(self, trainer, pl_module, stage: str) -> None:
        import lightning.pytorch.callbacks.timer

        lightning.pytorch.callbacks.timer.time = self._time

    def on_train_batch_start(self, trainer, *args) -> None:
        self.now = (trainer.global_step + 1) * self.seconds_per_step  # the time at the end of this step


def write_square_conversations(root: Path, count: int = 48) -> Path:
    """``count`` 16-pixel images of a coloured square in one of four corners, each with a LLaVA conversation of two
    turns (its colour, its corner); the JSONL that holds them (a user's conversations: ConversationFilesDataModule)."""
    from PIL import Image, ImageDraw

    colours = {"red": (220, 30, 30), "green": (30, 160, 60), "blue": (40, 60, 220)}
    corners = {"top left": (0, 0), "top right": (8, 0), "bottom left": (0, 8), "bottom right": (8, 8)}
    rows = []
    (root / "squares").mkdir(parents=True, exist_ok=True)
    for i in range(count):
        colour, corner = list(colours)[i % 3], list(corners)[i // 3 % 4]
        x, y = corners[corner]
        image = Image.new("RGB", (16, 16), "white")
        ImageDraw.Draw(image).rectangle((x + 1, y + 1, x + 6, y + 6), fill=colours[colour])
        name = f"squares/{i:03d}.png"
        image.save(root / name)
        turns = [("<image>\nWhat colour is the square?", colour), ("Which corner is it in?", corner)]
        conversation = [{"from": who, "value": text} for q, a in turns for who, text in (("human", q), ("gpt", a))]
        rows.append({"id": str(i), "image": name, "conversations": conversation})
    path = root / "conversations.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def task_args(task: str, tmp_path: Path) -> list[str]:
    """A few-second configuration of each task, with dropout so that random state matters on resume."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    common = [*quiet_run_args(tmp_path), "--trainer.check_val_every_n_epoch=1"]
    if task == "vision":
        return [
            "--config=configs/vision/vit_digits.yaml",
            "--model.net.dropout=0.1",
            "--model.net.drop_path=0.1",
            "--data.augment.policy=flip_crop",
            "--data.source.val_size=200",
            *common,
        ]
    if task == "lm":
        corpus = tmp_path / "corpus.txt"
        corpus.write_text(CORPUS, encoding="utf-8")
        return [
            "--config=configs/lm/austen_char.yaml",
            "--data.source.corpus=null",
            f"--data.source.train_files=[{corpus}]",
            f"--data.prepare.dir={tmp_path / 'prepared'}",
            "--data.block_size=16",
            "--data.loader.batch_size=8",
            "--model.net.n_layers=1",
            "--model.net.d_model=32",
            "--model.net.n_heads=2",
            "--model.net.dropout=0.1",
            "--model.optimizer.warmup_steps=2",
            "--model.sample_tokens=8",
            "--trainer.max_steps=-1",
            "--trainer.val_check_interval=null",
            "--trainer.limit_val_batches=2",
            *common,
        ]
    if task in ("mlm", "t5"):  # the pretraining objectives on CORPUS, with a small BPE
        corpus = tmp_path / "corpus.txt"
        corpus.write_text(CORPUS, encoding="utf-8")
        config = {"mlm": "configs/mlm/austen.yaml", "t5": "configs/t5/austen.yaml"}[task]
        shape = ["--model.net.n_layers=1"] if task == "mlm" else ["--model.net.n_encoder_layers=1",
                                                                  "--model.net.n_decoder_layers=1"]  # fmt: skip
        return [
            f"--config={config}",
            "--data.source.corpus=null",
            f"--data.source.train_files=[{corpus}]",
            f"--data.prepare.dir={tmp_path / 'prepared'}",
            "--data.tokenizer.vocab_size=300",
            "--data.num_sentinels=8",
            "--data.segment_tokens=16",
            "--data.source.val_fraction=0.25",
            "--data.source.test_fraction=0.0",
            "--data.loader.batch_size=4",
            *shape,
            "--model.net.d_model=32",
            "--model.net.n_heads=2",
            "--model.net.d_ff=64",
            "--model.net.max_len=32",
            "--model.net.dropout=0.1",
            "--model.optimizer.warmup_steps=2",
            "--model.num_logged_samples=1",
            "--trainer.max_steps=-1",
            "--trainer.val_check_interval=null",
            "--trainer.limit_val_batches=2",
            *common,
        ]
    if task == "classify":  # which of two phrasings a line is
        tsv = tmp_path / "labelled.tsv"
        lines = [
            f"it is a truth number {i}\ttruth\n" if i % 2 else f"a single man in house {i}\tman\n" for i in range(64)
        ]
        tsv.write_text("".join(lines), encoding="utf-8")
        return [
            "--config=configs/classify/austen_scratch.yaml",
            "--data.source.corpus=null",
            f"--data.source.tsv_files=[{tsv}]",
            f"--data.source.val_tsv_files=[{tsv}]",
            "--data.tokenizer.vocab_size=400",
            "--data.max_tokens=16",
            "--data.loader.batch_size=16",
            f"--data.prepare.dir={tmp_path / 'prepared'}",
            "--model.net.n_layers=1",
            "--model.net.d_model=32",
            "--model.net.n_heads=2",
            "--model.net.d_ff=64",
            "--model.net.max_len=16",
            "--model.net.dropout=0.1",
            "--model.optimizer.warmup_steps=2",
            *common,
        ]
    if task == "igpt":  # Image GPT on the 8×8 digits
        return [
            "--config=configs/igpt/digits.yaml",
            "--data.loader.batch_size=128",
            "--model.net.n_layers=1",
            "--model.net.d_model=32",
            "--model.net.n_heads=2",
            "--model.net.dropout=0.1",
            "--model.optimizer.warmup_steps=2",
            "--model.num_samples=2",
            "--model.completion_images=1",
            "--model.num_completions=1",
            "--trainer.max_steps=-1",
            "--trainer.val_check_interval=null",
            "--trainer.limit_val_batches=1",
            *common,
        ]
    if task == "image_text":  # printed lines of a word, 16 pixels high
        return [
            "--config=configs/image_text/printed_lines.yaml",
            *IMAGE_TEXT_DATA,
            f"--data.prepare.dir={tmp_path / 'prepared'}",
            "--data.loader.batch_size=8",
            "--model.net.encoder.patch_size=[16, 8]",
            *tower_options("n_layers=1", "d_model=32", "n_heads=2", "d_ff=64", "dropout=0.1"),
            "--model.net.encoder.attn_dropout=0.1",
            "--model.net.decoder.block_size=24",  # a reading of an untrained model is as long as this: keep it short
            "--model.optimizer.warmup_steps=2",
            "--model.num_logged_samples=1",
            "--trainer.max_steps=-1",
            "--trainer.val_check_interval=null",
            "--trainer.check_val_every_n_epoch=1",
            "--trainer.limit_val_batches=1",
            *common,
        ]
    if task == "vlm":  # a user's conversations (llava_jsonl.yaml, on the CPU, from scratch), 16 pixels
        return [
            "--config=configs/vlm/llava_jsonl.yaml",
            f"--data.source.train={write_square_conversations(tmp_path)}",
            "--data.source.image_folder=null",
            "--data.source.val_fraction=0.25",
            "--data.source.image_size=16",
            "--data.tokenizer.file=null",
            "--data.loader.batch_size=8",
            "--data.loader.num_workers=0",
            "--data.loader.pin_memory=false",
            f"--data.prepare.dir={tmp_path / 'prepared'}",
            "--model.net.image.patch_size=8",
            *[
                f"--model.net.{tower}.{field}"
                for tower in ("image", "text")
                for field in ("n_layers=1", "d_model=32", "n_heads=2", "d_ff=64", "dropout=0.1")
            ],  # fmt: skip
            "--model.net.text.block_size=96",
            "--model.net.image_layer=-1",
            "--model.init.checkpoint=null",
            "--model.init.modules={}",
            "--model.optimizer.warmup_steps=2",
            "--model.num_logged_samples=1",
            "--model.compile=false",
            "--trainer.accelerator=cpu",
            "--trainer.max_steps=-1",
            "--trainer.val_check_interval=null",
            "--trainer.limit_val_batches=null",
            *common,
        ]
    if task == "contrastive":  # a user's captioned images (captions.yaml, on the CPU), 16 pixels
        return [
            "--config=configs/contrastive/captions.yaml",
            f"--data.source.train={write_captioned_squares(tmp_path)}",
            "--data.source.val_fraction=0.25",
            "--data.source.height=16",
            "--data.source.width=16",
            "--data.tokenizer.kind=char",
            "--data.loader.batch_size=8",
            "--data.loader.num_workers=0",
            "--data.loader.pin_memory=false",
            f"--data.prepare.dir={tmp_path / 'prepared'}",
            "--model.net.image.patch_size=8",
            *[
                f"--model.net.{tower}.{field}"
                for tower in ("image", "text")
                for field in ("n_layers=1", "d_model=32", "n_heads=2", "d_ff=64", "dropout=0.1")
            ],  # fmt: skip
            "--model.net.text.block_size=24",
            "--model.net.embed_dim=16",
            "--model.optimizer.warmup_steps=2",
            "--model.num_logged_samples=1",
            "--model.compile=false",
            "--trainer.accelerator=cpu",
            "--trainer.max_steps=-1",
            "--trainer.val_check_interval=null",
            "--trainer.limit_val_batches=null",
            *common,
        ]
    pairs = [(f"{a} {b} {c}", f"{c} {b} {a}") for a in "abcd" for b in "efgh" for c in "ijkl"]
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return [
        "--config=configs/translation/ding_de_en.yaml",
        "--data.source.corpus=null",
        "--data.source.ding_phrases=false",
        f"--data.source.tsv_files=[{tsv}]",
        f"--data.source.val_tsv_files=[{tsv}]",
        "--data.tokenizer.vocab_size=270",
        "--data.batches.max_tokens=128",
        f"--data.prepare.dir={tmp_path / 'prepared'}",
        "--model.net.n_encoder_layers=1",
        "--model.net.n_decoder_layers=1",
        "--model.net.d_model=32",
        "--model.net.n_heads=2",
        "--model.net.d_ff=64",
        "--model.net.dropout=0.1",
        "--model.net.max_len=16",
        "--model.optimizer.warmup_steps=4",
        "--trainer.max_steps=-1",
        "--trainer.val_check_interval=null",
        *common,
    ]


def start_cli(
    args: list[str], log: Path, launcher: list[str] | None = None, threads: int | None = None
) -> subprocess.Popen:
    """``python -m lightformer <args>`` started from the repository (``launcher`` replaces ``python``, e.g. with
    torchrun), its output written to ``log`` (a pipe would stall it when full), with this folder on its path for the
    callbacks above and, given ``threads``, that many threads per process."""
    path = os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        command = [*(launcher or [sys.executable]), "-m", "lightformer", *args]
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=out)


def finish(run: subprocess.Popen, log: Path) -> None:
    """Wait for a run of ``start_cli``; fail with the end of its ``log`` unless it succeeds."""
    assert run.wait(timeout=600) == 0, log.read_text()[-5000:]


def run_cli(args: list[str], log: Path, threads: int | None = None) -> None:
    """``python -m lightformer <args>`` run to its successful end (``start_cli``)."""
    finish(start_cli(args, log, threads=threads), log)


def resolved_config(capsys, *configs: str) -> dict:
    """The config ``fit --config A --config B ...`` resolves to (``--print_config``), as a dict."""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", *(f"--config={c}" for c in configs), "--print_config"])
    assert exit_info.value.code == 0
    return yaml.safe_load(capsys.readouterr().out)


def build(args: list[str], *callbacks: Callback):
    cli = cli_main(args, run=False)
    cli.trainer.callbacks[:0] = list(callbacks)
    return cli


def events_of(tmp_path: Path, name: str) -> tuple[str, EventAccumulator]:
    """The log folder of run ``name`` (version 0) under ``tmp_path/runs`` and its TensorBoard events, loaded."""
    (run,) = glob.glob(str(tmp_path / "runs" / name / "version_0"))
    events = EventAccumulator(run)
    events.Reload()
    return run, events


def last_checkpoint(tmp_path: Path, version: int = 0) -> str:
    (path,) = glob.glob(str(tmp_path / "runs" / "*" / f"version_{version}" / "checkpoints" / "last.ckpt"))
    return path


class ShardProbe(Callback):
    """Writes, per process, what that process trained on and the validation metrics it ended with:
    ``{out_dir}/rank{global_rank}.json`` with ``world_size``, ``train_indices`` (the example indices of the
    first training epoch, as this process's loader yields them), ``train_examples`` (examples in the
    batches it trained on) and ``metrics`` (every ``val/`` metric after the last validation)."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self.record: dict = {"train_indices": [], "train_examples": 0, "metrics": {}}

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch != 0:
            return
        loader = trainer.train_dataloader
        if isinstance(loader.dataset, IterableDataset):  # LitData's: each item is read through __getitem__
            read, self.read_indices = loader.dataset.__getitem__, []

            def recording(index):
                self.read_indices.append(int(getattr(index, "index", index)))
                return read(index)

            loader.dataset.__getitem__ = recording
            return
        keys = [key for batch in loader.batch_sampler for key in batch]  # indices, or (index, epoch) pairs
        self.record["train_indices"] = [int(key[0] if isinstance(key, tuple) else key) for key in keys]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.current_epoch == 0:
            first = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
            self.record["train_examples"] += len(first)
            if hasattr(self, "read_indices"):  # the items of this batch (a dropped last partial batch never arrives)
                self.record["train_indices"] += self.read_indices[: len(first)]
                del self.read_indices[: len(first)]

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if hasattr(self, "read_indices"):
            del trainer.train_dataloader.dataset.__getitem__, self.read_indices

    def on_validation_end(self, trainer, pl_module) -> None:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        self.record.update(world_size=trainer.world_size, metrics=metrics)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.record))


class RecordSchedule(Callback):
    """Writes, per process, where training ended and the learning-rate schedule it ended with:
    ``{out_dir}/rank{global_rank}.json`` with ``step``, ``lr`` and ``planned_steps`` (the cosine's length)."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_train_end(self, trainer, pl_module) -> None:
        schedule = pl_module.lr_schedulers().lr_lambdas[0]
        record = {
            "step": trainer.global_step,
            "lr": trainer.optimizers[0].param_groups[0]["lr"],
            "planned_steps": schedule.total_steps,
        }
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


class RecordBatches(Callback):
    """Writes ``<out_dir>/<stage>-rank<r>.jsonl``: one line per batch this process trains or validates on, its step
    and the windows' token ids (the first row's, and every row's sum), to compare runs batch by batch."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def _write(self, trainer, stage: str, batch) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        x = batch[0]
        line = {"step": trainer.global_step, "rows": [row.tolist() for row in x]}
        with open(self.out_dir / f"{stage}-rank{trainer.global_rank}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._write(trainer, "train", batch)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            self._write(trainer, f"val{trainer.global_step}", batch)


class KillAt(Callback):
    """SIGKILL this process when training reaches ``step``, as a crash or a lost node would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)


class RecordBatchDigests(Callback):
    """In memory, for in-process runs: ``batches``, the (global step, digest of its tensors) of every training batch
    this process trains on, to compare runs batch by batch whatever a batch holds (tensors, or dicts or tuples of
    them)."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, str]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        digest = hashlib.sha256()
        for name, value in sorted(batch.items()) if isinstance(batch, dict) else enumerate(batch):
            digest.update(str(name).encode())
            digest.update(value.numpy().tobytes() if isinstance(value, torch.Tensor) else repr(value).encode())
        self.batches.append((trainer.global_step, digest.hexdigest()))


class Crash(Exception):
    """What ``CrashAt`` raises."""


class CrashAt(Callback):
    """An in-process run dies as it reaches ``step``, as a killed process would: nothing more is saved (raises
    ``Crash``, which the test expects)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise Crash(f"crashed at step {self.step}")


def recorded(out_dir: Path, stage: str, rank: int) -> list[dict]:
    path = out_dir / f"{stage}-rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class FactsOnly(DataModule):
    """A data module that only states its facts: all that a task's ``setup`` reads of its data."""

    def __init__(self, **facts) -> None:
        super().__init__()
        self.facts = DataFacts(**facts)

    def data_facts(self) -> DataFacts:
        return self.facts


def with_data(task, datamodule, ckpt_path: str | None = None):
    """Attach a data module the way ``Trainer.fit(task, datamodule=...)`` does, as far as ``setup`` can see."""
    from types import SimpleNamespace

    task._trainer = SimpleNamespace(datamodule=datamodule, ckpt_path=ckpt_path)
    return task
