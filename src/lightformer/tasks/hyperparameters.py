"""What a task stores as its hyperparameters: the arguments it was built with, every config a plain dict, so that
checkpoints load with ``torch.load(weights_only=True)``, TensorBoard lists each field and ``load_from_checkpoint``
rebuilds the task with ``cls(**hyper_parameters)``.

The arguments are read from the call that built the task, not from stack frames: ``KeptArguments.__new__``
receives them before any ``__init__`` runs, and ``arguments_given`` names them by the task class's ``__init__``
signature.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, is_dataclass
from typing import Any

from lightformer.facts import DataFacts


class KeptArguments:
    """A base of ``Task`` that keeps the arguments a task is built with until ``Task.__init__`` takes them
    (``pop_given_arguments``): a class's ``__new__`` receives them before any ``__init__`` runs. It is a base, not
    ``Task`` itself, because jsonargparse (LightningCLI) reads the parameters of a class's own ``__new__`` in place
    of its ``__init__``'s; an inherited one it leaves aside."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        task = super().__new__(cls)
        if args or kwargs:  # none for a copy (deepcopy, a data-parallel replica): its state is copied, not built
            task.__dict__["_given"] = (args, kwargs)
        return task

    def pop_given_arguments(self) -> tuple[tuple, dict]:
        """The (positional, keyword) arguments the task was built with, taken once (``__init__`` takes them)."""
        return self.__dict__.pop("_given", ((), {}))


def arguments_given(task_class: type, base: type, given: tuple[tuple, dict], common: dict[str, Any]) -> dict[str, Any]:
    """The arguments a task of ``task_class`` was built with: those of its class's ``__init__`` (``given``: the
    constructor's positional and keyword arguments, bound to that signature, defaults filled in; the ones it hands
    on as ``**common`` among them), then ``common``: the ones every task hands to ``base.__init__`` (``Task``'s),
    given or default. A task class without an ``__init__`` of its own adds only ``common``."""
    arguments: dict[str, Any] = {}
    if task_class.__init__ is not base.__init__:
        bound = inspect.signature(task_class.__init__).bind(None, *given[0], **given[1])  # None: the task itself
        bound.apply_defaults()
        for name, parameter in list(bound.signature.parameters.items())[1:]:
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(bound.arguments[name])
            elif parameter.kind is not inspect.Parameter.VAR_POSITIONAL:
                arguments[name] = bound.arguments[name]
    arguments.update(common)
    arguments.pop("_class_path", None)
    return arguments


def plain(value: Any) -> Any:
    """A config as a plain dict (``DataFacts`` with lists, not tuples: they go to YAML too)."""
    if isinstance(value, DataFacts):
        return value.as_dict()
    return asdict(value) if is_dataclass(value) else value
