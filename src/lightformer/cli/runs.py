"""What every run of the command line gets around Lightning's Trainer: its folder held by one fit at a time
(``RunFolderLock``), its ``config.yaml`` beside its checkpoints when it has no logger (``SaveRunConfig``), a
``last.ckpt`` that is always the latest state, progress shown where output goes, ``precision: auto`` resolved, and
the TensorBoard run it belongs to: a resumed fit goes on in the run it resumes, a test joins the tested run."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import lightning as L
import torch
from jsonargparse import Namespace
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import SaveConfigCallback

from lightformer.errors import ConfigError
from lightformer.io.files import release_lock, take_lock
from lightformer.training.peaks import resolve_precision


class SaveRunConfig(SaveConfigCallback):
    """Lightning's ``SaveConfigCallback``, except that a run without a logger saves its ``config.yaml`` beside its
    checkpoints (``<default_root_dir>/checkpoints``) instead of into the working directory."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.logger is not None or self.already_saved:
            super().setup(trainer, pl_module, stage)
            return
        if trainer.checkpoint_callback is not None and trainer.is_global_zero:
            folder = Path(trainer.checkpoint_callback.dirpath or Path(trainer.default_root_dir) / "checkpoints")
            folder.mkdir(parents=True, exist_ok=True)
            self.parser.save(self.config, folder / self.config_filename, skip_none=False, overwrite=self.overwrite)
        self.already_saved = True


class RunFolderLock(Callback):
    """A run folder (the logger's ``<save_dir>/<name>/<version>``) is written by one fit at a time: a second fit into
    a folder a live run holds is refused (two event files, ``last.ckpt`` and ``last-v1.ckpt``, and a ``config.yaml``
    of only one of them, otherwise). The lock is the file ``run.lock`` in the folder (``files.take_lock``: host name
    and process id), taken by rank 0 and removed when the fit ends, also by an exception; one left by a killed
    process does not block the next run. The command line takes it before the fit starts (``before_fit``: before the
    data is prepared and anything is written there); a fit started otherwise takes it at set-up. Only ``fit`` takes
    it: ``test`` writes its results into the tested run's folder, and ``validate`` beside it.

    A fit refused before its first step (``remove_if_unused``) leaves no folder that it made itself behind, so that the
    next run does not become ``version_1``."""

    FILE = "run.lock"
    # What a fit writes into its run folder as it starts, before its first step: nothing a user needs of a refused one.
    STARTING_FILES = frozenset({FILE, "config.yaml", "hparams.yaml", "tokenizer.json", "src_tokenizer.json",
                                "tgt_tokenizer.json"})  # fmt: skip

    def __init__(self) -> None:
        self.held: Path | None = None
        self.made: Path | None = None  # the run folder, where this fit made it (it did not exist before)

    def take(self, log_dir: str | None) -> None:
        """Hold ``log_dir`` (this process must be rank 0), or raise ``ConfigError`` naming the live run holding it."""
        if self.held is not None or not log_dir:
            return
        path = Path(log_dir) / self.FILE
        made = not path.parent.exists()
        path.parent.mkdir(parents=True, exist_ok=True)
        holder = take_lock(path)
        if holder is not None:
            host, pid = holder
            raise ConfigError(
                f"the run folder {log_dir} is in use by another fit (process {pid} on {host}, which holds {path}): "
                "give this run a folder of its own (another --trainer.logger.init_args.version, or none for the next "
                f"free one), or wait for that run to end (if it ended without removing {path}, remove it)"
            )
        self.held, self.made = path, path.parent if made else None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and trainer.logger is not None:
            log_dir = trainer.log_dir  # a broadcast under DDP: every process must ask, or rank 0 waits forever
            if trainer.is_global_zero:
                self.take(log_dir)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.release()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.release()

    def release(self) -> None:
        if self.held is not None:
            release_lock(self.held)
            self.held = None

    def remove_if_unused(self) -> bool:
        """Remove the run folder when this fit made it and it holds nothing but what a fit writes as it starts
        (``STARTING_FILES``, TensorBoard's event files, empty folders): for a fit refused before its first step (the
        caller knows). Never a folder that was there before, nor one holding a checkpoint or any other file."""
        folder, self.made = self.made, None
        if folder is None or not folder.is_dir():
            return False
        for path in folder.rglob("*"):
            starting = path.name in self.STARTING_FILES or path.name.startswith("events.out.tfevents.")
            if path.is_symlink() or not (path.is_dir() or starting):
                return False
        self.release()
        shutil.rmtree(folder, ignore_errors=True)
        return True


def no_training_batch(trainer: L.Trainer) -> str:
    """Why a fit had no training batch: how much data each process had, and what a batch needs."""
    batch_size = getattr(trainer.train_dataloader, "batch_size", None)
    processes = f"each of its {trainer.world_size} processes has" if trainer.world_size > 1 else "it has"
    return (
        f"data: the training split gives no batch: {processes} fewer examples than one batch of "
        f"data.loader.batch_size={batch_size} (an incomplete batch is dropped); lower the batch size or the length of "
        "an example (data.block_size, data.segment_tokens), or give more training data"
    )


LIGHTNING_CHECKPOINT = {
    "lightning.pytorch.callbacks.ModelCheckpoint",
    "lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint",
}


def keep_last_checkpoint_current(trainer: Namespace) -> None:
    """Make every ``last.ckpt`` the latest state: Lightning's ``ModelCheckpoint`` with ``save_last`` becomes
    lightformer's (the same arguments; Lightning's rewrites ``last.ckpt`` only when the monitored metric improves),
    and a run configured without checkpoints (but with checkpointing on) gets one that writes ``last.ckpt``.
    ``--trainer.enable_checkpointing=false`` removes the config's checkpoint callbacks (Lightning refuses both).
    Done on the parsed config, so that the run's ``config.yaml`` names what ran: LightningCLI has no default callback
    that a configured one of its kind replaces (its ``trainer_defaults`` callbacks are added beside the config's;
    ``tests/test_cli_mechanisms.py`` pins this: ``test_lightningcli_adds_default_callbacks_beside_configured_ones``)."""
    configured = [c for c in trainer.callbacks or [] if c.class_path.rsplit(".", 1)[-1] == "ModelCheckpoint"]
    if trainer.enable_checkpointing is False:
        trainer.callbacks = [c for c in trainer.callbacks or [] if c not in configured]
        return
    for callback in configured:
        if callback.class_path in LIGHTNING_CHECKPOINT and callback.init_args.get("save_last"):
            callback.class_path = "lightformer.training.callbacks.ModelCheckpoint"
    if not configured and trainer.enable_checkpointing is not False:
        default = Namespace(
            class_path="lightformer.training.callbacks.ModelCheckpoint", init_args=Namespace(save_last=True)
        )
        trainer.callbacks = [*(trainer.callbacks or []), default]


def show_progress(trainer: Namespace) -> None:
    """A progress bar in a terminal; log lines when output goes to a file or the bar is switched off; none added
    beside a configured one (on the parsed config, as ``keep_last_checkpoint_current`` says why)."""
    configured = {c.class_path.rsplit(".", 1)[-1] for c in trainer.callbacks or []}
    if configured & {"ProgressBar", "RichProgressBar", "TQDMProgressBar", "ProgressLog"}:
        return
    if trainer.enable_progress_bar is not False and sys.stderr.isatty():
        added = Namespace(class_path="lightformer.training.progress.ProgressBar", init_args=Namespace())
    else:
        trainer.enable_progress_bar = False
        added = Namespace(
            class_path="lightformer.training.progress.ProgressLog", init_args=Namespace(every_seconds=30.0)
        )
    trainer.callbacks = [*(trainer.callbacks or []), added]


def resolve_auto_precision(trainer: Namespace, resumed: str | None) -> None:
    """``precision: auto`` → the precision this run trains in (``lightformer.training.peaks.resolve_precision``),
    before the trainer is built, so that the run's saved ``config.yaml`` names it; a resumed run keeps its
    checkpoint's."""
    if trainer.precision != "auto":
        return
    saved = None
    if resumed and Path(resumed).is_file():
        saved = torch.load(resumed, map_location="cpu", weights_only=True, mmap=True).get("precision")
    trainer.precision = resolve_precision("auto", trainer.accelerator, saved)


def log_into_tested_run(trainer: Namespace, ckpt_path: str) -> None:
    """Point a TensorBoard logger at the run a tested checkpoint comes from (``<save_dir>/<name>/version_N`` holding
    ``checkpoints/<file>``, or for an averaged checkpoint the run of the checkpoints it averages), so that its test
    metrics join that run's curves and HParams row instead of starting a run of their own."""
    logger = _tensorboard_logger(trainer)
    if logger is None:
        return
    path = Path(ckpt_path)
    if path.is_file() and path.parent.name != "checkpoints":
        averaged = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("averaged_checkpoints")
        path = Path(averaged[0]) if averaged else path
    run = _run_folder(path)
    if run is not None and (run / "hparams.yaml").is_file():
        logger.init_args.save_dir, logger.init_args.name = str(run.parent.parent), run.parent.name
        logger.init_args.version = run.name


def continue_resumed_run(trainer: Namespace, ckpt_path: str) -> None:
    """Resume into the run folder the checkpoint comes from (``<save_dir>/<name>/version_N/checkpoints/<file>``, when
    ``save_dir`` and ``name`` are the config's and no version is given), instead of a new ``version_N+1``: the
    TensorBoard curves go on where they stopped, and the checkpoints (best and last) stay in one folder."""
    logger = _tensorboard_logger(trainer)
    if logger is None or logger.init_args.get("version") is not None:
        return
    run = _run_folder(Path(ckpt_path).resolve())
    config_root = Path(logger.init_args.save_dir or "lightning_logs") / (logger.init_args.get("name") or "")
    if run is not None and run.parent == config_root.resolve():
        logger.init_args.version = run.name


def _tensorboard_logger(trainer: Namespace) -> Namespace | None:
    """The trainer config's logger when it is a TensorBoard logger (ours or Lightning's), else None."""
    logger = trainer.get("logger")
    return logger if isinstance(logger, Namespace) and logger.class_path.endswith("TensorBoardLogger") else None


def _run_folder(checkpoint: Path) -> Path | None:
    """``<save_dir>/<name>/version_N`` for a checkpoint at ``version_N/checkpoints/<file>``, else None."""
    run = checkpoint.parent.parent
    return run if checkpoint.parent.name == "checkpoints" and run.name.startswith("version_") else None
