"""The tasks lightformer knows: each registers itself once, beside its class (``register``), with the data modules it
trains on and the commands that take its checkpoints alone. The command line and ``lightformer.commands`` read this
registry; adding a task is a task module (its class and its registration), a data module (or an existing one) and a
config.

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
class TaskSpec:
    """What the framework knows of a task besides its class.

    Args:
        task: the ``Task`` subclass.
        data: the data modules it trains on (a subclass of one of them too); a config pairing it with another is
            refused before anything is built.
        commands: the commands that take its checkpoints alone (``lightformer <name> --ckpt_path ...``): name →
            function of keyword options (``jsonargparse.auto_cli`` reads their types and docstrings; the first
            line of a docstring is the command's description).
        list_options: command → its option that takes several values, also given as shells pass them
            (``--images a.png b.png``).
    """

    task: type
    data: tuple[type, ...]
    commands: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    list_options: Mapping[str, str] = field(default_factory=dict)


TASKS: dict[str, TaskSpec] = {}  # by the task class's name


def register(
    task: type,
    *,
    data: type | tuple[type, ...],
    commands: Mapping[str, Callable[..., Any]] | None = None,
    list_options: Mapping[str, str] | None = None,
) -> TaskSpec:
    """Register ``task`` (see ``TaskSpec``); a command name already taken by another task is refused."""
    spec = TaskSpec(task, data if isinstance(data, tuple) else (data,), dict(commands or {}), dict(list_options or {}))
    for name in spec.commands:
        owner = next((other for other in TASKS.values() if name in other.commands and other.task is not task), None)
        if owner is not None:
            raise ValueError(f"the command {name!r} of {task.__name__} is {owner.task.__name__}'s already")
    TASKS[task.__name__] = spec
    return spec


def built_in() -> dict[str, TaskSpec]:
    """Every registered task: lightformer's own once ``lightformer.tasks`` is imported (``lightformer.commands``
    imports it, and so the command line), and those of the other modules imported since. The registry imports no
    task itself: each task's module imports it."""
    return TASKS


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
