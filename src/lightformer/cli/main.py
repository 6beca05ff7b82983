"""The command line: ``python -m lightformer fit|validate|test|predict --config FILE`` through LightningCLI,
plus the commands that need a checkpoint alone (``generate``, ``translate``, ``classify``, ``fill-mask``,
``sample-images``, ``probe``, ``export``, ``average``: ``lightformer.cli.commands``).

What the data tells the model travels one route: the data module's ``data_facts()`` (``lightformer.facts``) is
linked into the task's ``data_facts`` argument when both are instantiated.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from jsonargparse import ArgumentParser, Namespace
from lightning.pytorch.callbacks import LearningRateMonitor, ThroughputMonitor
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from lightformer.cli.checks import (
    check_checkpoint_files,
    check_config_files,
    check_data_family,
    check_init_before_data,
    check_lengths_before_data,
    check_model_config,
    check_renamed_net_fields,
    check_trainer_limits,
    config_files,
    model_options_given,
    net_fields_given,
    read_config_file,
    take_shape_from_init_checkpoint,
    upgraded_net,
)
from lightformer.cli.commands import checkpoint_commands, task_command
from lightformer.cli.runs import (
    RunFolderLock,
    SaveRunConfig,
    continue_resumed_run,
    keep_last_checkpoint_current,
    log_into_tested_run,
    no_training_batch,
    resolve_auto_precision,
    show_progress,
)
from lightformer.data.module import DataModule
from lightformer.data.sources.corpora import CorpusUnavailableError
from lightformer.errors import CheckpointError, ConfigError, raise_as_bug, user_error
from lightformer.facts import DataFacts
from lightformer.training.callbacks import (
    AtomicCheckpointIO,
    NonFiniteLossError,
    NonFiniteLossGuard,
    RandomStateCheckpoint,
    ResumeAfterEpochEnd,
    SameDataOnResumeCheck,
    Throughput,
)
from lightformer.training.progress import Summary, validation_line
from lightformer.training.tensorboard import samples_already_drawn
from lightformer.training.trainer import Trainer


class LightformerCLI(LightningCLI):
    """LightningCLI with the data→model link, and every run protected by ``lightformer.training.callbacks``: atomic
    checkpoint files loaded with ``weights_only=True``, random state saved for exact resume, and a stop at the
    first non-finite loss.

    The task's ``data_facts`` are the data module's (``facts_for_model``); the task fills its model's sizes from
    them (``Task.net_from_data``), so setting those in a config or on the command line is refused.
    """

    def __init__(self, *args, trainer_class: type[L.Trainer] = Trainer, data_only: bool = False, **kwargs) -> None:
        self.data_only = data_only  # build the data module alone (``lightformer prepare``)
        super().__init__(*args, trainer_class=trainer_class, **kwargs)  # lightformer's: precision may be "auto"

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data", "model.init_args.data_facts", self.facts_for_model, apply_on="instantiate")

    def facts_for_model(self, datamodule: L.LightningDataModule) -> DataFacts:
        """What the task's model is built from: the facts of the checkpoint that ``--ckpt_path`` names (its model is
        rebuilt as it was trained; ``Task.setup`` compares the data's with them), else the data module's."""
        if not isinstance(datamodule, DataModule):
            raise ConfigError(
                f"data: {type(datamodule).__name__} is not a lightformer data module (lightformer.data.DataModule), "
                "whose data_facts() tells the task what the data is"
            )
        facts = self.checkpoint_facts if self.checkpoint_facts is not None else datamodule.data_facts()
        self.instantiating = "model"  # built next
        return facts

    def before_instantiate_classes(self) -> None:
        self.checkpoint_facts = None
        if self.data_only:
            return
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
            if (config.get("model.init_args.init") or {}).get("checkpoint"):  # the defaults-free parse: only then
                take_shape_from_init_checkpoint(config.model, net_fields_given(self.given_values()))
            check_init_before_data(config.model)
        # With --ckpt_path, LightningCLI has put the checkpoint's hyperparameters into the config, its data facts
        # among them (none in one written before they existed): the model is rebuilt from them (facts_for_model).
        saved = config.model.init_args.get("data_facts") if config.get("ckpt_path") else None
        self.checkpoint_facts = DataFacts.of(saved.as_dict() if isinstance(saved, Namespace) else saved)

    def instantiate_classes(self) -> None:
        """LightningCLI's, with what a class refused said in one line naming its section: the data module is built
        first, then (after ``facts_for_model``) the task, then the trainer."""
        self.instantiating = "data"
        try:
            if self.data_only:
                parser = ArgumentParser()
                parser.add_subclass_arguments(L.LightningDataModule, "data")
                self.datamodule = parser.instantiate_classes(Namespace(data=self.config.data)).data
            else:
                super().instantiate_classes()
        except (ValueError, OSError, CorpusUnavailableError) as error:
            raise ConfigError(user_error(error, self.instantiating)) from None

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        # Before LightningCLI merges the hyperparameters of a --ckpt_path checkpoint (its data facts included).
        subcommand = self.config.get("subcommand")
        check_model_config(self.config[subcommand] if subcommand else self.config)
        check_data_family(self.config[subcommand] if subcommand else self.config)
        if subcommand:
            check_trainer_limits(self.config[subcommand].get("trainer"))
            check_checkpoint_files(subcommand, self.config[subcommand])
        self.args = sys.argv[1:] if args is None else list(args)
        self.command_line_model_options = model_options_given(self.args)
        self.parsed_config = self.config.clone()

    def given_values(self) -> Namespace:
        """The config that the command line gives, in its ``--config`` files and options, without the defaults:
        jsonargparse's parse of the same arguments with ``defaults=False``."""
        given = self.parser.parse_args(self.args, defaults=False)
        return given[self.subcommand] if self.subcommand else given

    def _parse_ckpt_path(self) -> None:
        """LightningCLI's (the model config becomes a --ckpt_path checkpoint's hyperparameters), with the checkpoint's
        ``net`` read as today's config has its fields (``cli.checks.upgraded_net``: an image-to-text checkpoint of
        b1bd12e's flat fields). A copy of Lightning 2.6's private method and one line: should Lightning rename it,
        ``test_old_checkpoints.py``'s ``test`` and resume of the b1bd12e image-text checkpoint fail (jsonargparse
        refuses the flat fields)."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not ckpt_path or not Path(ckpt_path).is_file():
            return
        hparams = dict(torch.load(ckpt_path, weights_only=True, map_location="cpu").get("hyper_parameters") or {})
        hparams.pop("_instantiator", None)
        if not hparams:
            return
        if "net" in hparams:
            hparams["net"] = upgraded_net(str(hparams.get("_class_path", "")), hparams["net"])
        if "_class_path" in hparams:
            hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
        try:
            self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")
            raise

    def keep_command_line_model_options(self) -> None:
        """With --ckpt_path, LightningCLI replaces the model config by the checkpoint's hyperparameters after
        ``parse_arguments`` and before ``before_instantiate_classes``, so that the model is built as it was trained
        (``tests/test_cli.py`` pins this: ``LightningCLI._parse_ckpt_path`` does it, a private method that this
        class overrides only to read an older checkpoint's ``net`` as today's config has its fields). For
        ``validate``, ``test`` and ``predict`` the model options given on the command line then apply over them (a
        beam size or test-time flips to try; an option the weights do not fit fails at loading). ``fit`` resumes the
        run: its optimizer and schedule come back from the checkpoint too, so a model option that differs from the
        checkpoint's would be ignored, and is refused instead."""
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

    def _run_subcommand(self, subcommand: str) -> None:
        """LightningCLI's (``before_<command>``, the trainer's command, ``after_<command>``), and a fit refused (a
        ``ConfigError`` or ``CheckpointError``: at set-up, or after a fit with no training batch) before its first
        step leaves no run folder it made behind (``RunFolderLock.remove_if_unused``): the next run takes its
        version. An override of Lightning 2.6's private method: should Lightning rename it,
        ``test_a_fit_refused_at_setup_leaves_no_run_folder_behind`` (``tests/test_bad_inputs.py``) fails."""
        try:
            super()._run_subcommand(subcommand)
        except (ConfigError, CheckpointError):
            if subcommand == "fit" and self.trainer.global_step == 0:
                for callback in self.trainer.callbacks:
                    if isinstance(callback, RunFolderLock):
                        callback.remove_if_unused()
            raise

    def before_fit(self) -> None:
        """Hold the run folder before the data is prepared (``RunFolderLock``). Rank 0 alone resolves the folder
        here, before the processes of a DDP run are connected; the others learn it by broadcast at set-up."""
        lock = next((c for c in self.trainer.callbacks if isinstance(c, RunFolderLock)), None)
        if lock is not None and self.trainer.logger is not None and rank_zero_only.rank == 0:
            lock.take(self.trainer.log_dir)
        if self.config.fit.get("ckpt_path"):  # the resumed data named before the task compares its facts
            self.trainer.callbacks.append(SameDataOnResumeCheck(str(self.config.fit.ckpt_path)))

    def after_fit(self) -> None:
        """A fit that had no training batch is refused (Lightning ends it with a warning and success); a run that
        validated on a subset of the validation split (``TextDataModule``'s ``loader.val_windows``) ends
        with one validation on all of it, of the last weights, logged at the last step. Its pictures and text samples
        are not drawn again when the fit's last validation drew them from the same weights."""
        if self.trainer.fit_loop.max_batches == 0 and self.trainer.limit_train_batches != 0:
            raise ConfigError(no_training_batch(self.trainer))
        if (
            isinstance(self.datamodule, DataModule)
            and self.datamodule.validates_on_a_subset
            and not self.trainer.interrupted
        ):
            drawn = getattr(self.model, "validated_at_step", None) == self.trainer.global_step
            with samples_already_drawn(self.model) if drawn else contextlib.nullcontext():
                self.trainer.validate(self.model, datamodule=self.datamodule, verbose=False)
            rank_zero_info(validation_line(self.trainer, "validation on the whole split"))

    def instantiate_trainer(self, **kwargs) -> L.Trainer:
        self.instantiating = "trainer"
        trainer = super().instantiate_trainer(**kwargs)
        trainer.callbacks.insert(0, RunFolderLock())  # first: before SaveRunConfig writes config.yaml into the folder
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # keep a user's own CheckpointIO plugin
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        defaults = [(NonFiniteLossGuard, NonFiniteLossGuard())]  # a configured one (check_every_n_steps) replaces it
        if trainer.loggers:  # the same learning-rate and throughput curves for every task
            defaults += [(LearningRateMonitor, LearningRateMonitor("step")), (ThroughputMonitor, Throughput())]
        for kind, default in defaults:  # each unless the config has its own
            if not any(isinstance(callback, kind) for callback in trainer.callbacks):
                trainer.callbacks.append(default)
        return trainer


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


def null_group_fields(args: list[str]) -> list[str]:
    """``--data.source.corpus=null`` → ``--data.source={"corpus": null}``: jsonargparse 4.53 turns a null given to a
    field of a dataclass group of a subclass (the data module's, the task's) into the string "None" (or refuses it),
    but merges the same value given as a dict. ``--data.source.corpus null`` (two words) is the same option.
    A workaround of a jsonargparse bug that we found no upstream issue for; ``tests/test_cli_mechanisms.py`` pins it
    (``test_jsonargparse_reads_a_null_group_field_of_a_subclass_as_the_string_none``): remove this when that fails."""
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


def cli_main(args: list[str] | None = None, run: bool = True, data_only: bool = False) -> LightformerCLI:
    """Build (and by default run) the LightningCLI over every task and data module (subclass mode); ``data_only``:
    parse a command line of ``fit`` (no subcommand) and build its data module alone."""
    quiet_library_noise()
    args = null_group_fields(sys.argv[1:] if args is None else list(args))
    return LightformerCLI(
        L.LightningModule,
        L.LightningDataModule,
        data_only=data_only,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_callback=SaveRunConfig,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"callbacks": [RandomStateCheckpoint(), ResumeAfterEpochEnd(), Summary()]},
        auto_configure_optimizers=False,  # every task configures its own (model.optimizer)
        parser_kwargs={"prog": "lightformer"},
        args=args,
        run=run,
    )


TRAINER_COMMANDS = {
    "prepare": "Prepare a config's data once (tokenizer, shards); fit does it too on first use",
    "fit": "Train a task from a config             lightformer fit --config configs/lm/austen_char.yaml",
    "validate": "Evaluate on the validation split (a config and --ckpt_path)",
    "test": "Evaluate on the test split; the metrics join the run the checkpoint comes from",
    "predict": "Run a checkpoint over the data module's predict set",
}


def usage() -> str:
    lines = ["usage: lightformer <command> [options]      (or: python -m lightformer <command> [options])", ""]
    lines.append("Train and evaluate (every option of the trainer, the task and its model, and the data):")
    lines += [f"  {name:<13} {text}" for name, text in TRAINER_COMMANDS.items()]
    lines += ["", "With a checkpoint alone (no config, no data):"]
    for name, (run, _) in checkpoint_commands().items():
        summary = (run.__doc__ or "").strip().split("\n", 1)[0].rstrip(".")  # a docstring's first line
        lines.append(f"  {name:<13} {summary}")
    lines += [
        "",
        "lightformer <command> --help describes a command; lightformer fit --config FILE --help lists the options of",
        "that config's task, model and data (Lightning's Trainer options: lightformer fit --help).",
    ]
    return "\n".join(lines)


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


def _gather_list_option(args: list[str], option: str) -> list[str]:
    """``--images a.png b.png`` → ``--images=["a.png", "b.png"]`` (the list form jsonargparse reads): ``auto_cli``
    reads a list only as ``[a, b]`` or ``--images+=a``, not as the words a shell's glob expands to (jsonargparse
    issue #550, closed without ``nargs`` for signatures). ``tests/test_cli_mechanisms.py`` pins it
    (``test_jsonargparse_reads_no_list_of_words_for_a_list_parameter``): remove this when that fails."""
    if option not in args:
        return args
    start = args.index(option) + 1
    end = next((i for i in range(start, len(args)) if args[i].startswith("--")), len(args))
    if end - start <= 1:
        return args
    return [*args[: start - 1], f"{option}={json.dumps(args[start:end])}", *args[end:]]


def prepare_main(args: list[str]) -> None:
    """``lightformer prepare --config FILE [--data.OPTION=VALUE ...]``: prepare the config's data (its tokenizer and
    shards, or whatever the data module's ``prepare_data`` caches) and exit. It takes the command line of ``fit``,
    parsed as ``fit`` parses it; only the data module is built, so the same command line prepares and trains."""
    datamodule = cli_main(args, run=False, data_only=True).datamodule
    try:
        datamodule.prepare_data()
    except (ValueError, OSError, CorpusUnavailableError) as error:
        raise ConfigError(user_error(error, "data")) from None
    prepared = datamodule.prepared if isinstance(datamodule, DataModule) else None  # a folder, or an object with it
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
    found = None if command in TRAINER_COMMANDS else checkpoint_commands().get(command) or task_command(command, args)
    if command not in TRAINER_COMMANDS and found is None:
        commands_ = ", ".join([*TRAINER_COMMANDS, *checkpoint_commands()])
        raise SystemExit(
            f"lightformer: unknown command {command!r}; the commands are: {commands_} (lightformer --help)"
        )
    try:
        if command in TRAINER_COMMANDS:  # a syntax error named with its file (jsonargparse: "<unicode string>")
            check_renamed_net_fields(args, check_config_files(args))
        if command == "prepare":
            prepare_main(args[1:])
        elif found is not None:
            from jsonargparse import auto_cli

            run, list_options = found
            rest = args[1:]
            for option in (list_options,) if isinstance(list_options, str) else list_options or ():
                rest = _gather_list_option(rest, option)
            auto_cli(run, args=rest, prog=f"lightformer {command}")
        elif {"-h", "--help"} & set(args) and any(a in ("-c", "--config") or a.startswith("--config=") for a in args):
            task_help(command, args[1:])
        else:
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
