"""Config groups: the frozen dataclasses models, optimizers and data modules take their options as."""

from __future__ import annotations

from typing import Any, TypeVar

ConfigT = TypeVar("ConfigT")


def as_config(config_class: type[ConfigT], value: ConfigT | dict[str, Any]) -> ConfigT:
    """A config group from itself or from the plain dict a checkpoint's saved hyperparameters store."""
    return value if isinstance(value, config_class) else config_class(**value)
