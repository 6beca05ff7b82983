"""The tasks lightformer knows: each registers itself once, beside its class (``register``), with the data modules it
trains on and the commands that take its checkpoints alone. The command line and ``lightformer.cli.commands`` read this
registry; adding a task is a task module (its class and its registration), a data module (or an existing one) and a
config. A registration also declares the layouts its model exports in (``export --layout NAME``: ``Layout``) and
the Hugging Face folders they read back (``HFReader``), so that no module keys anything by a task's class name.

A task outside this package registers the same way when its module is imported: by the ``class_path`` of a config
(``fit``, ``test``, ...), or by the ``_class_path`` a checkpoint of it stores (``lightformer <its command>
--ckpt_path ...``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class HFReader:
    """How a Hugging Face model folder of one ``model_type`` starts a lightformer model (``model.init.checkpoint``).

    Args:
        net: the ``model.net`` config class whose fields the folder's ``config.json`` gives (a task whose net is
            another class takes no field of it).
        net_fields: ``config.json`` → those fields; ``ConfigError`` naming what lightformer has no counterpart of.
        weights: (the folder's tensors, ``config.json``) → the tensors under the model's names.
    """

    net: type
    net_fields: Callable[[dict], dict[str, Any]]
    weights: Callable[[dict, dict], dict]


@dataclass(frozen=True)
class Layout:
    """A form other than lightformer's own safetensors that ``export --layout NAME`` writes a task's model in.

    Args:
        write: (the task rebuilt from the checkpoint, the checkpoint's path, the checkpoint, ``--output``) → the
            line ``export`` prints; it writes ``--output``.
        applies_to: what the layout fits, in words ("image classification"), for the refusal of another task's
            checkpoint.
        folder: whether ``--output`` is a folder (made by ``write``) rather than a file (whose folder ``export``
            makes before reading the checkpoint).
        reads: Hugging Face ``model_type`` → how a folder of it starts a model, the way back of this layout.
    """

    write: Callable[[Any, str, dict, str], str]
    applies_to: str
    folder: bool = False
    reads: Mapping[str, HFReader] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskSpec:
    """What the framework knows of a task besides its class.

    Args:
        task: the ``Task`` subclass.
        data: the data modules it trains on (a subclass of one of them too); a config pairing it with another is
            refused before anything is built.
        commands: the commands that take its checkpoints alone (``lightformer <name> --ckpt_path ...``): name →
            function of keyword options (``jsonargparse.auto_cli`` reads their types and docstrings; the first
            line of a docstring is the command's description).
        list_options: command → its option (or options) that take several values, also given as shells pass them
            (``--images a.png b.png``).
        layouts: name → a form ``export --layout NAME`` writes its model in, besides "lightformer" (every task's).
        carried: keys that a checkpoint of it written through the Python API before every checkpoint named its
            task carries at its top ("tokenizer"): such a checkpoint is taken as this task's.
    """

    task: type
    data: tuple[type, ...]
    commands: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    list_options: Mapping[str, str | tuple[str, ...]] = field(default_factory=dict)
    layouts: Mapping[str, Layout] = field(default_factory=dict)
    carried: tuple[str, ...] = ()


TASKS: dict[str, TaskSpec] = {}  # by the task class's name


def register(
    task: type,
    *,
    data: type | tuple[type, ...],
    commands: Mapping[str, Callable[..., Any]] | None = None,
    list_options: Mapping[str, str | tuple[str, ...]] | None = None,
    layouts: Mapping[str, Layout] | None = None,
    carried: tuple[str, ...] = (),
) -> TaskSpec:
    """Register ``task`` (see ``TaskSpec``); a command name already taken by another task is refused, and so is a
    Hugging Face ``model_type`` that another task's layout reads otherwise."""
    spec = TaskSpec(task, data if isinstance(data, tuple) else (data,), dict(commands or {}), dict(list_options or {}),
                    dict(layouts or {}), tuple(carried))  # fmt: skip
    others = [other for other in TASKS.values() if other.task is not task]
    for name in spec.commands:
        owner = next((other for other in others if name in other.commands), None)
        if owner is not None:
            raise ValueError(f"the command {name!r} of {task.__name__} is {owner.task.__name__}'s already")
    taken = {kind: (other, reader) for other in others for kind, reader in readers_of(other).items()}
    for kind, reader in readers_of(spec).items():
        if kind in taken and taken[kind][1] is not reader:
            raise ValueError(f"the Hugging Face model type {kind!r} of {task.__name__}'s layouts is read by "
                             f"{taken[kind][0].task.__name__}'s already")  # fmt: skip
    TASKS[task.__name__] = spec
    return spec


def built_in() -> dict[str, TaskSpec]:
    """Every registered task: lightformer's own once ``lightformer.tasks`` is imported (``lightformer.cli.commands``
    imports it, and so the command line), and those of the other modules imported since. The registry imports no
    task itself: each task's module imports it."""
    return TASKS


def readers_of(spec: TaskSpec) -> dict[str, HFReader]:
    """The Hugging Face model types the layouts of ``spec`` read, each with its reader."""
    return {kind: reader for layout in spec.layouts.values() for kind, reader in layout.reads.items()}


def hf_readers() -> dict[str, HFReader]:
    """Every registered task's Hugging Face readers (``Layout.reads``), by ``model_type``: any task's model starts
    from a folder of a model type another task's layout reads (an image-to-text encoder from a ViT folder)."""
    return {kind: reader for spec in built_in().values() for kind, reader in readers_of(spec).items()}


def layout_holders(name: str) -> list[tuple[TaskSpec, Layout]]:
    """The registered tasks that have the layout ``name``, each with it."""
    return [(spec, spec.layouts[name]) for spec in built_in().values() if name in spec.layouts]


def spec_of(class_path: str) -> TaskSpec | None:
    """The registration of the task ``class_path`` names (a task's module registers it when imported), or None."""
    module, _, name = class_path.rpartition(".")
    if name not in TASKS and module:
        try:
            importlib.import_module(module)
        except ImportError:
            return None
    return TASKS.get(name)


def command_of(name: str) -> tuple[TaskSpec, Callable[..., Any]] | None:
    """The registered task whose checkpoints the command ``name`` takes, and its function; None: no such command."""
    for spec in TASKS.values():
        if name in spec.commands:
            return spec, spec.commands[name]
    return None
