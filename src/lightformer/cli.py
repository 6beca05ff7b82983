"""The command line: ``python -m lightformer fit|validate|test|predict --config FILE`` through LightningCLI,
plus the commands that need a checkpoint alone (``generate``, ``translate``, ``classify``, ``fill-mask``,
``sample-images``, ``probe``, ``export``, ``average``: ``lightformer.commands``).

Sizes that come from the data are linked into the model when both are instantiated: each attribute of
the data module named in ``DATA_LINKS`` fills the task's argument of the same name, where the task has one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import json
import logging
import re
import sys
import traceback
import typing
import warnings
from pathlib import Path

import lightning as L
import torch
import yaml
from jsonargparse import Namespace
from lightning.pytorch.callbacks import Callback, LearningRateMonitor, ThroughputMonitor
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from lightformer.callbacks import (
    AtomicCheckpointIO,
    NonFiniteLossError,
    NonFiniteLossGuard,
    RandomStateCheckpoint,
    ResumeAfterEpochEnd,
    Throughput,
)
from lightformer.checkpoints import CheckpointError, read_checkpoint, require_file
from lightformer.data.raw.corpora import CorpusUnavailableError
from lightformer.errors import ConfigError
from lightformer.files import release_lock, take_lock
from lightformer.peaks import resolve_precision
from lightformer.progress import Summary, validation_line
from lightformer.tasks.base import Task, class_of
from lightformer.tensorboard import samples_already_drawn
from lightformer.trainer import Trainer

DATA_LINKS = (
    "vocab_size",
    "block_size",
    "num_classes",
    "image_size",
    "in_channels",
    "src_vocab_size",
    "tgt_vocab_size",
    "pad_id",
)


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
    it: ``test`` writes its results into the tested run's folder, and ``validate`` beside it."""

    FILE = "run.lock"

    def __init__(self) -> None:
        self.held: Path | None = None

    def take(self, log_dir: str | None) -> None:
        """Hold ``log_dir`` (this process must be rank 0), or raise ``ConfigError`` naming the live run holding it."""
        if self.held is not None or not log_dir:
            return
        path = Path(log_dir) / self.FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        holder = take_lock(path)
        if holder is not None:
            host, pid = holder
            raise ConfigError(
                f"the run folder {log_dir} is in use by another fit (process {pid} on {host}, which holds {path}): "
                "give this run a folder of its own (another --trainer.logger.init_args.version, or none for the next "
                f"free one), or wait for that run to end (if it ended without removing {path}, remove it)"
            )
        self.held = path

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


class LightformerCLI(LightningCLI):
    """LightningCLI with the data→model links, and every run protected by ``lightformer.callbacks``: atomic
    checkpoint files loaded with ``weights_only=True``, random state saved for exact resume, and a stop at the
    first non-finite loss.

    Each attribute of the data module named in ``DATA_LINKS`` fills the field of the same name of the task's
    model config (``model.net``), where it has one. Those fields come from the data, so setting them in a
    config or on the command line is refused.
    """

    def __init__(self, *args, trainer_class: type[L.Trainer] = Trainer, **kwargs) -> None:
        super().__init__(*args, trainer_class=trainer_class, **kwargs)  # lightformer's: precision may be "auto"

    def add_arguments_to_parser(self, parser) -> None:
        for name in DATA_LINKS:
            parser.link_arguments(f"data.{name}", f"model.init_args.net.{name}", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        self.keep_command_line_model_options()
        config = self.config[self.subcommand] if self.subcommand else self.config
        keep_last_checkpoint_current(config.trainer)
        show_progress(config.trainer)
        resolve_auto_precision(config.trainer, config.get("ckpt_path") if self.subcommand == "fit" else None)
        if self.subcommand == "test" and config.get("ckpt_path"):
            log_into_tested_run(config.trainer, config.ckpt_path)
        if self.subcommand == "fit" and config.get("ckpt_path"):
            continue_resumed_run(config.trainer, config.ckpt_path)
        check_lengths_before_data(config)
        if self.subcommand == "fit" and not config.get("ckpt_path"):
            check_init_before_data(config.model)
        # With --ckpt_path, LightningCLI has put the checkpoint's hyperparameters into the config: keep the sizes its
        # model was built with, which the data's linked values replace at instantiation.
        net = config.model.init_args.get("net") if config.get("ckpt_path") else None
        self.checkpoint_sizes = {name: net[name] for name in DATA_LINKS if net and net.get(name) is not None}

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except (ValueError, OSError, CorpusUnavailableError) as error:
            reason = reason_of(error)
            section = "" if isinstance(reason, ConfigError) else _section_of(reason)  # ours name their field
            raise ConfigError(f"{section}{reason}") from None

    def after_instantiate_classes(self) -> None:
        net = self.model.hparams.get("net", {})
        for name, trained in self.checkpoint_sizes.items():
            if net.get(name) not in (None, trained):
                raise ConfigError(
                    f"the checkpoint's model was built with {name}={trained} (model.net.{name}), but the data gives "
                    f"{name}={net[name]}: use the data settings the model was trained with (data.{name}={trained}, or "
                    "the same files and tokenizer)"
                )

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        # Before LightningCLI merges the hyperparameters of a --ckpt_path checkpoint (linked values included).
        subcommand = self.config.get("subcommand")
        check_model_config(self.config[subcommand] if subcommand else self.config)
        if subcommand:
            check_trainer_limits(self.config[subcommand].get("trainer"))
            check_checkpoint_files(subcommand, self.config[subcommand])
        self.command_line_model_options = model_options_given(sys.argv[1:] if args is None else args)
        self.parsed_config = self.config.clone()

    def keep_command_line_model_options(self) -> None:
        """With --ckpt_path, LightningCLI replaces the model config by the checkpoint's hyperparameters after
        ``parse_arguments`` and before ``before_instantiate_classes``, so that the model is built as it was trained
        (``tests/test_cli.py`` pins this: ``LightningCLI._parse_ckpt_path`` does it, a private method that this
        class no longer overrides). For ``validate``, ``test`` and ``predict`` the model options given on the
        command line then apply over them (a beam size or test-time flips to try; an option the weights do not fit
        fails at loading). ``fit`` resumes the run: its optimizer and schedule come back from the checkpoint too,
        so a model option that differs from the checkpoint's would be ignored, and is refused instead."""
        subcommand = self.config.get("subcommand")
        if not self.command_line_model_options or not subcommand or not self.config[subcommand].get("ckpt_path"):
            return
        given = self.parsed_config
        keys = [key for key in self.command_line_model_options if f"{subcommand}.{key}" in given]
        if subcommand != "fit":
            for key in keys:
                self.config[f"{subcommand}.{key}"] = given[f"{subcommand}.{key}"]
            return
        changed = {key: (given[f"fit.{key}"], self.config[f"fit.{key}"]) for key in keys}
        changed = {key: values for key, values in changed.items() if values[0] != values[1]}
        if changed:
            options = ", ".join(
                f"--{key.replace('.init_args', '')}={value} (the checkpoint's: {saved})"
                for key, (value, saved) in changed.items()
            )
            raise ConfigError(
                f"fit --ckpt_path resumes the run as the checkpoint configured it (model, optimizer and schedule), so "
                f"{options} would be ignored. To train these weights with other model options, start a new run from "
                "them: --model.init.checkpoint=<the checkpoint> instead of --ckpt_path"
            )

    def before_fit(self) -> None:
        """Hold the run folder before the data is prepared (``RunFolderLock``). Rank 0 alone resolves the folder
        here, before the processes of a DDP run are connected; the others learn it by broadcast at set-up."""
        lock = next((c for c in self.trainer.callbacks if isinstance(c, RunFolderLock)), None)
        if lock is not None and self.trainer.logger is not None and rank_zero_only.rank == 0:
            lock.take(self.trainer.log_dir)

    def after_fit(self) -> None:
        """A fit that had no training batch is refused (Lightning ends it with a warning and success); a run that
        validated on a subset of the validation split (``TextDataModule``'s ``loader.val_windows``) ends
        with one validation on all of it, of the last weights, logged at the last step. Its pictures and text samples
        are not drawn again when the fit's last validation drew them from the same weights."""
        if self.trainer.fit_loop.max_batches == 0 and self.trainer.limit_train_batches != 0:
            raise ConfigError(no_training_batch(self.trainer))
        if getattr(self.datamodule, "validates_on_a_subset", False) and not self.trainer.interrupted:
            drawn = getattr(self.model, "validated_at_step", None) == self.trainer.global_step
            with samples_already_drawn(self.model) if drawn else contextlib.nullcontext():
                self.trainer.validate(self.model, datamodule=self.datamodule, verbose=False)
            rank_zero_info(validation_line(self.trainer, "validation on the whole split"))

    def instantiate_trainer(self, **kwargs) -> L.Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        trainer.callbacks.insert(0, RunFolderLock())  # first: before SaveRunConfig writes config.yaml into the folder
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # keep a user's own CheckpointIO plugin
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        if trainer.loggers:  # the same learning-rate and throughput curves for every task, unless configured
            for kind, default in (
                (LearningRateMonitor, LearningRateMonitor("step")),
                (ThroughputMonitor, Throughput()),
            ):
                if not any(isinstance(callback, kind) for callback in trainer.callbacks):
                    trainer.callbacks.append(default)
        return trainer


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
    ``--trainer.enable_checkpointing=false`` removes the config's checkpoint callbacks (Lightning refuses both)."""
    configured = [c for c in trainer.callbacks or [] if c.class_path.rsplit(".", 1)[-1] == "ModelCheckpoint"]
    if trainer.enable_checkpointing is False:
        trainer.callbacks = [c for c in trainer.callbacks or [] if c not in configured]
        return
    for callback in configured:
        if callback.class_path in LIGHTNING_CHECKPOINT and callback.init_args.get("save_last"):
            callback.class_path = "lightformer.callbacks.ModelCheckpoint"
    if not configured and trainer.enable_checkpointing is not False:
        default = Namespace(class_path="lightformer.callbacks.ModelCheckpoint", init_args=Namespace(save_last=True))
        trainer.callbacks = [*(trainer.callbacks or []), default]


def _section_of(error: BaseException) -> str:
    """The config section to fix ("data: ", "model.net: ", "model: "), by the package the error was raised in."""
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    module = traceback.tb_frame.f_globals.get("__name__", "") if traceback is not None else ""
    sections = {
        "lightformer.data": "data: ",
        "lightformer.models": "model.net: ",
        "lightformer.nn": "model.net: ",
        "lightformer.tasks": "model: ",
    }
    return next((prefix for package, prefix in sections.items() if module.startswith(package)), "")


def show_progress(trainer: Namespace) -> None:
    """A progress bar in a terminal; log lines when output goes to a file or the bar is switched off."""
    configured = {c.class_path.rsplit(".", 1)[-1] for c in trainer.callbacks or []}
    if configured & {"ProgressBar", "RichProgressBar", "TQDMProgressBar", "ProgressLog"}:
        return
    if trainer.enable_progress_bar is not False and sys.stderr.isatty():
        added = Namespace(class_path="lightformer.progress.ProgressBar", init_args=Namespace())
    else:
        trainer.enable_progress_bar = False
        added = Namespace(class_path="lightformer.progress.ProgressLog", init_args=Namespace(every_seconds=30.0))
    trainer.callbacks = [*(trainer.callbacks or []), added]


def resolve_auto_precision(trainer: Namespace, resumed: str | None) -> None:
    """``precision: auto`` → the precision this run trains in (``lightformer.peaks.resolve_precision``), before the
    trainer is built, so that the run's saved ``config.yaml`` names it; a resumed run keeps its checkpoint's."""
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


def check_model_config(config) -> None:
    """Validate ``model.net``, ``model.optimizer`` and ``model.init`` before the data is prepared (which can take
    minutes), and
    refuse the fields of ``model.net`` that the CLI links from the data."""
    model = config.get("model")
    init_args = model.get("init_args") if model is not None else None
    if not init_args:
        return
    task_class = class_of(model["class_path"])
    if task_class is None:
        return
    hints = typing.get_type_hints(task_class.__init__)
    for group in ("net", "optimizer", "init"):
        config_class, values = hints.get(group), init_args.get(group)
        if values is None or not dataclasses.is_dataclass(config_class):
            continue
        values = dict(values)
        defaults = {field.name: field.default for field in dataclasses.fields(config_class)}
        for link in DATA_LINKS:
            if link in values and values.pop(link) != defaults.get(link):
                raise ConfigError(
                    f"model.{group}.{link}={init_args[group][link]} is set, but it comes from the data: the command "
                    f"line links it from data.{link} (what the data module reads from its files); remove "
                    f"model.{group}.{link} from the config files and the command line"
                )
        try:
            config_class(**values)
        except ValueError as error:
            raise ConfigError(f"model.{group}: {error}") from None


def check_trainer_limits(trainer: Namespace | None) -> None:
    """Refuse, before anything is built, the trainer limits Lightning would refuse with a traceback (or, for a
    ``max_time`` of zero, end the run at once): ``max_time`` as ``DD:HH:MM:SS`` (Lightning's ``Timer`` format) or a
    dict of ``datetime.timedelta`` fields, ``max_steps`` and ``max_epochs`` at least 0, or -1 for no limit."""
    if trainer is None:
        return
    for name in ("max_steps", "max_epochs"):
        value = trainer.get(name)
        if value is not None and value < -1:
            raise ConfigError(f"trainer.{name}={value}: give a number of {name[4:]} (at least 0), or -1 for no limit")
    max_time = trainer.get("max_time")
    if max_time is None:
        return
    valid = (
        'give "DD:HH:MM:SS" (e.g. "00:12:30:00": 12.5 hours) or a dict (e.g. {hours: 12, minutes: 30}), or null for '
        "no time limit"
    )
    if isinstance(max_time, str):
        found = re.fullmatch(r"(\d+):(\d\d):(\d\d):(\d\d)", max_time.strip())
        if found is None:
            raise ConfigError(f"trainer.max_time={max_time!r} is not a duration: {valid}")
        days, hours, minutes, seconds = map(int, found.groups())
        duration = datetime.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    else:
        fields = dict(max_time)
        try:
            duration = datetime.timedelta(**fields)
        except TypeError:
            raise ConfigError(
                f"trainer.max_time={fields} is not a duration: its keys are fields of datetime.timedelta (days, hours, "
                f"minutes, seconds, ...); {valid}"
            ) from None
    if duration <= datetime.timedelta(0):
        raise ConfigError(f"trainer.max_time={max_time!r} is not a positive duration: {valid}")


# The --ckpt_path values Lightning reads as words, not file names: the best or last checkpoint of the trainer's own
# ModelCheckpoint, a SLURM requeue's, a model registry's ("registry" or "registry:<name>...").
CKPT_PATH_WORDS = ("best", "last", "hpc", "registry")


def check_checkpoint_files(subcommand: str, config) -> None:
    """Refuse, before anything is built or any data is read, a checkpoint file that is missing or not a checkpoint:
    ``--ckpt_path`` (which LightningCLI reads for its hyperparameters only if the file exists, and Lightning loads
    after the data is prepared), and the ``model.init.checkpoint`` a new fit starts from (its weights are checked
    against the model once it is built: ``Task.check_init``)."""
    ckpt_path = config.get("ckpt_path")
    word = str(ckpt_path).lower().partition(":")[0] if ckpt_path else None
    if ckpt_path and word not in CKPT_PATH_WORDS and "://" not in str(ckpt_path):  # remote: Lightning's fsspec reads
        checkpoint = read_checkpoint(str(ckpt_path))
        if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
            raise CheckpointError(
                f"--ckpt_path: {ckpt_path} holds no state_dict, so it is not a checkpoint of a run (to start from "
                "weights alone, give them as --model.init.checkpoint)"
            )
    init_checkpoint = (config.get("model.init_args.init") or {}).get("checkpoint")
    if subcommand == "fit" and not ckpt_path and init_checkpoint:
        require_file(str(init_checkpoint), "model.init.checkpoint: the file")


def check_lengths_before_data(config) -> None:
    """The task's check of the data's sequence lengths against ``model.net.max_len`` from the config alone, before
    the data is prepared: ``check_lengths_before_data`` of the task class, where it has one."""
    model, data = config.get("model"), config.get("data")
    if not model or not model.get("class_path") or not model.get("init_args"):
        return
    check = getattr(class_of(model.class_path), "check_lengths_before_data", None)
    if check is not None:
        check(model.init_args.get("net"), data)


def check_init_before_data(model: Namespace) -> None:
    """Check the ``model.init`` of a new fit (its checkpoint, and the parameters it freezes) against the model its
    config builds, before the data module is built, which for most tasks prepares the data (the tokenizer that the
    linked ``vocab_size`` comes from). The sizes linked from the data are not known yet, so the task is built twice
    on the meta device (no memory, no compute) with two sets of stand-in sizes: the tensors whose shapes differ
    between the two depend on the data and are compared by name only, the others by name and shape
    (``Task.check_init``). ``Task.setup`` checks again before loading, with every shape known, after the task's own
    checks of the data (a tokenizer or classes other than the checkpoint's, which name the cause of a mismatch in
    those tensors better)."""
    init = model.init_args.get("init") if model.get("init_args") else None
    task_class = class_of(model.class_path)
    if not init or not (init.get("checkpoint") or init.get("freeze")) or not issubclass(task_class or object, Task):
        return
    arguments = model.init_args.as_dict()
    net_class = typing.get_type_hints(task_class.__init__).get("net")
    try:
        with torch.device("meta"):
            tasks = [
                task_class(
                    **{**arguments, "net": {**arguments["net"], **stand_in_sizes(net_class, arguments["net"], i)}}
                )
                for i in (0, 1)
            ]
    except (ValueError, TypeError, KeyError):  # a config the real instantiation refuses, with its own message
        return
    first, second = (task.model.state_dict() for task in tasks)
    unknown = frozenset(name for name, value in first.items() if value.shape != second[name].shape)
    tasks[0].check_init(starting=True, unknown_shapes=unknown)


def stand_in_sizes(net_class: type, net: dict, which: int) -> dict[str, int]:
    """Valid sizes for the fields of ``net_class`` that the data fills (``DATA_LINKS``), two different sets
    (``which`` 0 or 1), for ``check_init_before_data``."""
    fields = {field.name: field.default for field in dataclasses.fields(net_class)}
    sizes = {
        "vocab_size": 512 + which,
        "src_vocab_size": 512 + which,
        "tgt_vocab_size": 512 + which,
        "num_classes": 10 + which,
        "block_size": (net.get("block_size") or fields.get("block_size") or 64) + 8 * which,
        "image_size": (net.get("patch_size") or fields.get("patch_size") or 4) * (4 + which),
        "in_channels": 3 - 2 * which,
    }
    return {name: size for name, size in sizes.items() if name in fields}


def quiet_library_noise() -> None:
    """Silence what a user cannot act on: a cloud-logging advert, and a deprecation inside Lightning 2.6's use of
    torch's pytree (fixed upstream), and the note that our model summary replaces Lightning's."""
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")  # main() passes args
    noise = ("💡 Tip:", "Trainer already configured with model summary callbacks")
    # LitData's StreamingDataset has a length (each rank's share) and shards across loader workers itself.
    warnings.filterwarnings("ignore", message=r"Your `IterableDataset` has `__len__` defined")
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(getattr(f, "lightformer", False) for f in logger.filters):
        quiet = logging.Filter()
        quiet.filter = lambda record: not str(record.msg).startswith(noise)  # type: ignore[method-assign]
        quiet.lightformer = True
        logger.addFilter(quiet)


def reason_of(error: BaseException) -> BaseException:
    """The error of a chain that says why: jsonargparse wraps what a data module or task raised in its own errors,
    and ours may wrap a library's (``raise ... from error``) whose message does not name the file or field. So the
    outermost error raised in lightformer's own code, else the innermost of all (a context suppressed with
    ``from None`` is not followed)."""
    package = str(Path(__file__).resolve().parent)
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    ours = [e for e in chain if _raised_in(e, package)]
    return ours[0] if ours else chain[-1]


def _raised_in(error: BaseException, folder: str) -> bool:
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and str(Path(frames[-1].filename).resolve()).startswith(folder)


def null_group_fields(args: list[str]) -> list[str]:
    """``--data.source.corpus=null`` → ``--data.source={"corpus": null}``: jsonargparse 4.53 turns a null given to a
    field of a config group of a subclass (the data module's, the task's) into the string "None" or refuses it, but
    merges the same value given as a dict. ``--data.source.corpus null`` (two words) is the same option."""
    rewritten, args = [], list(args)
    for i, arg in enumerate(args):
        if arg is None:
            continue
        if arg.startswith("--") and "=" not in arg and i + 1 < len(args) and args[i + 1] == "null":
            arg, args[i + 1] = f"{arg}=null", None
        name, _, value = arg.partition("=")
        parts = name.removeprefix("--").split(".")
        if value == "null" and len(parts) == 3 and parts[0] in ("data", "model") and parts[1] != "init_args":
            arg = f"--{parts[0]}.{parts[1]}={json.dumps({parts[2]: None})}"
        rewritten.append(arg)
    return rewritten


def cli_main(args: list[str] | None = None, run: bool = True) -> LightformerCLI:
    """Build (and by default run) the LightningCLI over every task and data module (subclass mode)."""
    quiet_library_noise()
    args = null_group_fields(sys.argv[1:] if args is None else list(args))
    return LightformerCLI(
        L.LightningModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_callback=SaveRunConfig,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={
            "callbacks": [NonFiniteLossGuard(), RandomStateCheckpoint(), ResumeAfterEpochEnd(), Summary()]
        },
        auto_configure_optimizers=False,  # every task configures its own (model.optimizer)
        parser_kwargs={"prog": "lightformer"},
        args=args,
        run=run,
    )


TRAINER_COMMANDS = {
    "prepare": "prepare a config's data once (tokenizer, shards); fit does it too on first use",
    "fit": "train a task from a config             lightformer fit --config configs/lm/austen_char.yaml",
    "validate": "evaluate on the validation split (a config and --ckpt_path)",
    "test": "evaluate on the test split; the metrics join the run the checkpoint comes from",
    "predict": "run a checkpoint over the data module's predict set",
}
CHECKPOINT_COMMANDS = {
    "generate": "continue a prompt with a language model",
    "translate": "translate the lines of a file or of standard input",
    "classify": "the most likely classes of image files",
    "fill-mask": "the most likely words at each [MASK] of a sentence",
    "sample-images": "PNGs of images an Image GPT draws, or completes from image files",
    "probe": "a linear classifier on an Image GPT's features, against raw pixels",
    "export": "a model's weights to safetensors (also in timm's layout)",
    "average": "the mean of a run's last checkpoints",
}
# Options that take several values: also given the way shells pass them (`--images a.png b.png`, `--images *.png`).
LIST_OPTIONS = {"classify": "--images", "sample-images": "--complete_from", "average": "--ckpt_paths"}


def usage() -> str:
    lines = ["usage: lightformer <command> [options]      (or: python -m lightformer <command> [options])", ""]
    lines.append("Train and evaluate (every option of the trainer, the task and its model, and the data):")
    lines += [f"  {name:<13} {text}" for name, text in TRAINER_COMMANDS.items()]
    lines += ["", "With a checkpoint alone (no config, no data):"]
    lines += [f"  {name:<13} {text}" for name, text in CHECKPOINT_COMMANDS.items()]
    lines += [
        "",
        "lightformer <command> --help describes a command; lightformer fit --config FILE --help lists the options of",
        "that config's task, model and data (Lightning's Trainer options: lightformer fit --help).",
    ]
    return "\n".join(lines)


def config_files(args: list[str]) -> list[str]:
    """The files that ``--config`` (``-c``) names on a command line, in order."""
    files = []
    for i, arg in enumerate(args):
        if arg in ("--config", "-c") and i + 1 < len(args):
            files.append(args[i + 1])
        elif arg.startswith("--config="):
            files.append(arg.partition("=")[2])
    return files


def read_config_file(path: str) -> dict:
    """A config file's YAML, or a ``ConfigError`` naming the file (and the line and column of a syntax error)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise ConfigError(f"--config {path!r}: no such config file") from None
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(f"--config {path}: not valid YAML{where}: {problem}") from None
    if config is not None and not isinstance(config, dict):
        raise ConfigError(f"--config {path}: a config is a mapping of sections (trainer, model, data), not a "
                          f"{type(config).__name__}")  # fmt: skip
    return config or {}


def task_help(command: str, args: list[str]) -> None:
    """``<command> --config FILE --help``: the options of the config's task (with its model and optimizer groups)
    and data module, instead of the 550 lines that include every Trainer option."""
    classes = {}
    for path in config_files(args):
        config = read_config_file(path)
        for section in ("model", "data"):
            if isinstance(config.get(section), dict) and "class_path" in config[section]:
                classes[section] = config[section]["class_path"]
    print(f"lightformer {command}: the options of {' and '.join(classes.values())} (set them in YAML or as flags)")
    print("Lightning's Trainer options (devices, precision, steps, callbacks, ...): lightformer fit --help\n")
    for section, class_path in classes.items():
        with contextlib.suppress(SystemExit):  # a help action prints and exits
            cli_main([command, f"--{section}.help", class_path])


def model_options_given(args: list[str]) -> list[str]:
    """The config keys of the single model options on a command line: ``--model.beam_size=4`` and
    ``--model.init_args.net.dropout 0.1`` → ``model.init_args.beam_size``, ``model.init_args.net.dropout``."""
    keys = []
    for arg in args:
        name = arg.split("=", 1)[0]
        if name.startswith("--model."):
            path = name.removeprefix("--model.").removeprefix("init_args.")
            if path not in ("class_path", "dict_kwargs"):
                keys.append(f"model.init_args.{path}")
    return keys


def _gather_list_option(args: list[str], option: str) -> list[str]:
    """``--images a.png b.png`` → ``--images=["a.png", "b.png"]`` (the list form jsonargparse reads)."""
    if option not in args:
        return args
    start = args.index(option) + 1
    end = next((i for i in range(start, len(args)) if args[i].startswith("--")), len(args))
    if end - start <= 1:
        return args
    return [*args[: start - 1], f"{option}={json.dumps(args[start:end])}", *args[end:]]


def prepare_main(args: list[str]) -> None:
    """``lightformer prepare --config FILE [--data.OPTION=VALUE ...]``: prepare the config's data (its tokenizer and
    shards, or whatever the data module's ``prepare_data`` caches) and exit. It takes the command line of ``fit``:
    the options of the trainer and the model are read and ignored, so the same command line prepares and trains."""
    from jsonargparse import ArgumentParser

    kept, i = [], 0
    while i < len(args):
        arg = args[i]
        name, has_value, value = arg.partition("=")
        if name in ("--config", "-c"):
            path = value if has_value else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if has_value else 2
            config = read_config_file(path)
            if "data" in config:
                kept.append(f"--data={json.dumps(config['data'])}")
            continue
        if name.startswith("--data") or name in ("-h", "--help"):
            kept.append(arg)
            if not has_value and name.startswith("--data") and i + 1 < len(args) and not args[i + 1].startswith("--"):
                kept.append(args[i + 1])
                i += 1
        elif not has_value and i + 1 < len(args) and not args[i + 1].startswith("--"):
            i += 1  # another section's option and its value: fit's, not prepare's
        i += 1
    parser = ArgumentParser(prog="lightformer prepare", description=prepare_main.__doc__)
    parser.add_subclass_arguments(L.LightningDataModule, "data", required=True)
    try:
        datamodule = parser.instantiate_classes(parser.parse_args(null_group_fields(kept))).data
        datamodule.prepare_data()
    except ConfigError:
        raise
    except (ValueError, OSError, CorpusUnavailableError) as error:
        raise ConfigError(f"data: {error}") from None
    prepared = getattr(datamodule, "prepared", None)  # PreparedText, a prepared folder, or None: nothing prepared
    folder = getattr(prepared, "folder", prepared)
    print(f"prepared: {folder}" if folder is not None else f"prepared: {type(datamodule).__name__}'s data (in memory)")


def main(argv: list[str] | None = None) -> None:
    """``lightformer`` (also ``python -m lightformer``): dispatch to the command named first."""
    args = sys.argv[1:] if argv is None else list(argv)
    sys.argv[0] = "lightformer"  # what usage lines call the program (not __main__.py)
    command = args[0] if args else None
    if command in (None, "-h", "--help"):
        print(usage())
        return
    if command not in TRAINER_COMMANDS and command not in CHECKPOINT_COMMANDS:
        commands = ", ".join([*TRAINER_COMMANDS, *CHECKPOINT_COMMANDS])
        raise SystemExit(f"lightformer: unknown command {command!r}; the commands are: {commands} (lightformer --help)")
    try:
        if command == "prepare":
            prepare_main(args[1:])
        elif command in CHECKPOINT_COMMANDS:
            from jsonargparse import auto_cli

            from lightformer.commands import COMMANDS

            rest = _gather_list_option(args[1:], LIST_OPTIONS[command]) if command in LIST_OPTIONS else args[1:]
            auto_cli(COMMANDS[command], args=rest, prog=f"lightformer {command}")
        elif {"-h", "--help"} & set(args) and any(a in ("-c", "--config") or a.startswith("--config=") for a in args):
            task_help(command, args[1:])
        else:
            for path in config_files(args):  # a syntax error named with its file (jsonargparse: "<unicode string>")
                read_config_file(path)
            cli_main(args)
    except (ConfigError, CheckpointError, NonFiniteLossError, CorpusUnavailableError) as error:
        raise SystemExit(f"lightformer: {error}") from None
    except torch.OutOfMemoryError:
        raise SystemExit(
            "lightformer: the device ran out of memory: lower data.loader.batch_size (or the data's tokens per batch) "
            "and raise trainer.accumulate_grad_batches to keep the batch, or turn on "
            "model.activation_checkpointing, or use more devices (configs/trainer/fsdp.yaml)"
        ) from None
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EACCES, errno.EROFS):
            raise_as_bug()
        where = f": {error.filename}" if error.filename else ""  # the folder, or in our own messages already
        raise SystemExit(f"lightformer: {error.strerror}{where}") from None
    except Exception:  # not an error in what the user gave (those are the ones above): a bug of ours
        raise_as_bug()


def raise_as_bug() -> None:
    """Show the exception being handled with its traceback, and exit saying that it is lightformer's fault."""
    traceback.print_exc()
    raise SystemExit(
        "lightformer: the error above is a bug in lightformer, not in your config or data: please report it with the "
        "command line and this output"
    ) from None
