"""The command line's checks of a config before anything is built or any data is prepared (which can take minutes):
the model's config groups, the data module's family, the trainer's limits, the checkpoint files, the data's lengths
against the model's positions, and ``model.init`` against the model; and the config files themselves (YAML errors
named with their file, line and column)."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml
from jsonargparse import Namespace
from lightning.pytorch.utilities import rank_zero_info

from lightformer.data.module import DataModule
from lightformer.errors import CheckpointError, ConfigError
from lightformer.io.checkpoints import read_checkpoint, require_file
from lightformer.io.hf_layouts import is_hf_folder, net_from_hf_folder
from lightformer.registry import spec_of
from lightformer.tasks.base import Task
from lightformer.tasks.config_values import class_of, config_defaults


def check_model_config(config) -> None:
    """Validate ``model.net``, ``model.optimizer`` and ``model.init`` before the data is prepared (which can take
    minutes), and refuse the fields of ``model.net`` that come from the data (``Task.net_from_data``)."""
    model = config.get("model")
    init_args = model.get("init_args") if model is not None else None
    if not init_args:
        return
    task_class = class_of(model["class_path"])
    if task_class is None or not issubclass(task_class, Task):
        return
    hints = {**typing.get_type_hints(Task.__init__), **typing.get_type_hints(task_class.__init__)}
    for group in ("net", "optimizer", "init"):
        config_class, values = hints.get(group), init_args.get(group)
        if values is None or not dataclasses.is_dataclass(config_class):
            continue
        values = values.as_dict() if isinstance(values, Namespace) else dict(values)
        defaults = config_defaults(config_class)
        for name in task_class.net_from_data if group == "net" else ():  # a dotted path into a nested config
            owner, default, leaf = _holder(values, name), _holder(defaults, name), name.rpartition(".")[2]
            if leaf in owner and owner[leaf] != default.get(leaf):
                raise ConfigError(
                    f"model.net.{name}={owner[leaf]} is set, but it comes from the data (the data module's "
                    f"data_facts); remove model.net.{name} from the config files and the command line"
                )
            owner.pop(leaf, None)
        try:
            config_class(**values)
        except ValueError as error:
            raise ConfigError(f"model.{group}: {error}") from None


def _holder(values: dict, path: str) -> dict:
    """The dict of nested ``values`` that holds the last field of the dotted ``path`` (created where absent)."""
    for name in path.split(".")[:-1]:
        inner = values.get(name)
        values[name] = inner = inner.as_dict() if isinstance(inner, Namespace) else dict(inner or {})
        values = inner
    return values


def _leaves(values: dict, prefix: str = "", whole: Callable[[str], bool] = lambda path: False) -> dict[str, Any]:
    """Nested ``values`` as {dotted path: value} of their leaves; a dict at a path where ``whole`` says so is one leaf
    (an optional group unset on the other side: a rotary scaling that a config's ``None`` does not hold)."""
    leaves = {}
    for name, value in values.items():
        if isinstance(value, dict) and not whole(f"{prefix}{name}"):
            leaves |= _leaves(value, f"{prefix}{name}.", whole)
        else:
            leaves[f"{prefix}{name}"] = value
    return leaves


def upgraded_net(class_path: str, saved: dict) -> dict:
    """A checkpoint's ``hyper_parameters["net"]`` as today's config of its task's model (``class_path``) has its
    fields: a config whose fields moved reads its older checkpoints' (``VisionEncoderDecoderConfig.from_saved``)."""
    task_class = class_of(class_path) if class_path else None
    net_class = typing.get_type_hints(task_class.__init__).get("net") if isinstance(task_class, type) else None
    return getattr(net_class, "from_saved", dict)(saved or {})


def check_renamed_net_fields(args: list[str], configs: list[dict]) -> None:
    """Refuse, before the command line is parsed, the ``model.net`` fields a model config has renamed or moved (its
    ``RENAMED``: the image-to-text config's flat fields of b1bd12e, now in its towers), naming each and its new
    place; ``configs``: the command line's config files as read (``check_config_files``)."""
    files = [config.get("model") for config in configs]
    class_paths = [m.get("class_path") for m in files if isinstance(m, dict) and m.get("class_path")]
    class_paths += [a.split("=", 1)[1] for a in args if a.startswith(("--model=", "--model.class_path="))]
    task_class = class_of(str(class_paths[-1])) if class_paths else None
    if task_class is None or not issubclass(task_class, Task):
        return
    renamed = getattr(typing.get_type_hints(task_class.__init__).get("net"), "RENAMED", {})
    given = []
    for model in files:
        net = ((model.get("init_args") or model) if isinstance(model, dict) else {}).get("net")
        given += list(net) if isinstance(net, dict) else []
    prefix = "model.init_args.net."
    given += [key.removeprefix(prefix).split(".")[0] for key in model_options_given(args) if key.startswith(prefix)]
    old = [name for name in dict.fromkeys(given) if name in renamed]
    if old:
        moves = []
        for name in old:
            *others, last = [f"model.net.{path}" for path in renamed[name]]
            moves.append(f"model.net.{name} is now {', '.join(others)}{' and ' if others else ''}{last}")
        moves = "; ".join(moves)
        raise ConfigError(f"{task_class.__name__}'s model.net holds its towers whole (encoder, decoder): {moves}")


def check_data_family(config) -> None:
    """Refuse, before anything is built, a data module that the task does not train on (its registration's
    ``data``: ``lightformer.registry``)."""
    model, data = config.get("model"), config.get("data")
    if not model or not data or not model.get("class_path") or not data.get("class_path"):
        return
    spec, data_class = spec_of(model.class_path), class_of(data.class_path)
    if spec is not None and data_class is not None and not issubclass(data_class, spec.data):
        valid = " or ".join(f"{module.__module__}.{module.__name__}" for module in spec.data)
        raise ConfigError(
            f"data: {spec.task.__name__} trains on {valid} (or a subclass), not on {data_class.__name__}; give the "
            "data module of its family"
        )


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
    after the data is prepared), and the ``model.init`` checkpoints a new fit starts from (their weights are checked
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
    init = config.get("model.init_args.init") or {}
    if subcommand == "fit" and not ckpt_path:
        if init.get("checkpoint") and not is_hf_folder(str(init["checkpoint"])):
            require_file(str(init["checkpoint"]), "model.init.checkpoint: the file")
        for path, file in (init.get("modules") or {}).items():
            require_file(str(file), f"model.init.modules.{path}: the file")


def check_lengths_before_data(config) -> None:
    """The check of the data's longest sequence against the model's position table (the task's ``position_table``)
    from the config alone, before the data is prepared: ``check_lengths_before_data`` of the task class (every
    ``Task``'s, ``DataContract``), given the facts that the data module's options decide
    (``DataModule.facts_from_config``)."""
    model, data = config.get("model"), config.get("data")
    if not model or not model.get("class_path") or not model.get("init_args") or not data or not data.get("class_path"):
        return
    check = getattr(class_of(model.class_path), "check_lengths_before_data", None)
    data_class = class_of(data.class_path)
    if check is not None and issubclass(data_class or object, DataModule):
        check(model.init_args.get("net"), data_class.facts_from_config(data.get("init_args") or Namespace()))


def check_init_before_data(model: Namespace) -> None:
    """Check the ``model.init`` of a new fit (its checkpoint, and the parameters it freezes) against the model its
    config builds, before the data module is built, which for most tasks prepares the data (the tokenizer that the
    model's vocabulary size comes from). The task is built on the meta device (no memory, no compute) without the
    data's facts: its tensors are compared with the checkpoint's by name only (``Task.check_init``), which the sizes
    the data gives do not change. ``Task.setup`` checks again before loading, with every shape known, after the data's
    facts are checked (a tokenizer or classes other than the checkpoint's name the cause of a mismatch better)."""
    init = model.init_args.get("init") if model.get("init_args") else None
    task_class = class_of(model.class_path)
    starts = init and (init.get("checkpoint") or init.get("modules") or init.get("freeze"))
    if not starts or not issubclass(task_class or object, Task):
        return
    task = task_for_names(task_class, model.init_args.as_dict())
    if task is not None:
        task.check_init(starting=True, unknown_shapes=frozenset(task.model.state_dict()))


def task_for_names(task_class: type[Task], arguments: dict) -> Task | None:
    """``task_class`` built from ``arguments`` on the meta device, for the names of its tensors: the sizes its data
    would give (``net_from_data``), unknown before the data is prepared, are the first power of two the model's config
    accepts (parameter names do not depend on them). None: no build succeeds (instantiation says why)."""
    net = copy.deepcopy(dict(arguments.get("net") or {}))
    unset = [name for name in task_class.net_from_data if _holder(net, name).get(name.rpartition(".")[2]) is None]
    for size in (None, *(2**k for k in range(1, 12))):
        filled = copy.deepcopy(net)
        for name in unset if size is not None else ():
            _holder(filled, name)[name.rpartition(".")[2]] = size
        try:
            with torch.device("meta"):
                return task_class(**{**arguments, "net": filled})
        except (ValueError, TypeError, KeyError):
            continue
    return None


def config_files(args: list[str]) -> list[str]:
    """The files that ``--config`` (``-c``) names on a command line, in order, read as jsonargparse reads the option
    (argparse's, on which it is built); none where the option lacks its value (jsonargparse then says so)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("-c", "--config", action="append", default=[])
    try:
        return parser.parse_known_args(args)[0].config
    except argparse.ArgumentError:
        return []


def check_config_files(args: list[str]) -> list[dict]:
    """Refuse a ``--config`` file that is missing, not YAML, or not a mapping, in one line naming the file (and the
    line and column of a syntax error), before jsonargparse reads it: jsonargparse 4.53 reports a syntax error as in
    ``"<unicode string>"`` and its loader is given the file's base name only, and reports the others over several
    lines with its usage. ``tests/test_cli_mechanisms.py`` pins this
    (``test_jsonargparse_names_no_config_file_in_its_syntax_errors``): remove this when that fails. Returns the
    files' configs, in order."""
    return [read_config_file(path) for path in config_files(args)]


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


def model_options_given(args: list[str]) -> list[str]:
    """The config keys of the single model options on a command line: ``--model.beam_size=4`` and
    ``--model.init_args.net.dropout 0.1`` → ``model.init_args.beam_size``, ``model.init_args.net.dropout``.
    jsonargparse 4.53 keeps no record of where a parsed value came from (a config file or the command line: its pull
    request #975 adds one), so the options are read from the command line's words; ``tests/test_cli_mechanisms.py``
    pins this (``test_jsonargparse_keeps_no_source_of_a_parsed_value``): use that record when that fails."""
    keys = []
    for arg in args:
        name = arg.split("=", 1)[0]
        if name.startswith("--model."):
            path = name.removeprefix("--model.").removeprefix("init_args.")
            if path not in ("class_path", "dict_kwargs"):
                keys.append(f"model.init_args.{path}")
    return keys


def net_fields_given(given: Namespace) -> set[str]:
    """The fields of ``model.net`` that a command line gives, in its ``--config`` files or as options, as dotted paths
    to its leaves (``encoder.n_layers``): ``given`` is its config as jsonargparse parses it without defaults
    (``parse_args(args, defaults=False)``)."""
    net = given.get("model.init_args.net") if isinstance(given.get("model"), Namespace) else None
    return set(_leaves(net.as_dict())) if isinstance(net, Namespace) else set()


# The fields of a model's shape that change what its weights compute without changing their shapes: given otherwise
# than a start's checkpoint, its weights would load without a word into another function (post-norm weights into a
# pre-norm model, learned positions' layers under rotary ones).
KIND_FIELDS = ("position", "norm", "norm_first", "activation")


def take_shape_from_init_checkpoint(model: Namespace, given: set[str]) -> None:
    """A new run that starts from a lightformer checkpoint (``model.init.checkpoint``) builds its model in that
    checkpoint's shape: each field of ``model.net`` that the command line does not give (``given``), and that the
    data does not fill, takes the checkpoint model's value, so that a fine-tuning config does not retype it; a field
    of ``KIND_FIELDS`` given otherwise than the checkpoint's is refused by name."""
    init = model.init_args.get("init") if model.get("init_args") else None
    path = init.get("checkpoint") if init else None
    task_class = class_of(model.class_path)
    if not path or "://" in path or not issubclass(task_class or object, Task):
        return
    net_class = typing.get_type_hints(task_class.__init__)["net"]
    if is_hf_folder(path):  # a Hugging Face model folder: the shape its config.json gives
        saved = net_from_hf_folder(path, net_class)
    elif path.endswith(".ckpt"):
        saved = read_checkpoint(path, "model.init.checkpoint").get("hyper_parameters", {}).get("net") or {}
        saved = upgraded_net(model.class_path, saved)
    else:
        return
    net = model.init_args.get("net")
    if net is None:
        return
    taken = []
    unset = lambda path: path in net and net[path] is None  # noqa: E731
    for name, value in _leaves(saved, whole=unset).items():  # dotted paths into a nested config: "encoder.n_layers"
        given_here = any(name == g or name.startswith(f"{g}.") or g.startswith(f"{name}.") for g in given)
        if given_here and name.rpartition(".")[2] in KIND_FIELDS and name in net and net[name] != value:
            raise ConfigError(
                f"model.net.{name}={net[name]!r} is given, but model.init.checkpoint {path} was trained with "
                f"{name}={value!r}: its weights would compute another function in this model. Remove "
                f"model.net.{name} from the config and the command line (the checkpoint's is taken), or set it to "
                f"{value!r}"
            )
        if name in net and not given_here and name not in task_class.net_from_data and net[name] != value:
            net[name] = value
            taken.append(f"{name}={value}")
    if taken:
        rank_zero_info(f"model.net from model.init.checkpoint {path}: {', '.join(taken)}")
