"""A config's values before anything is built: the command line's checks before any data is prepared read the task's
arguments from the config itself (``class_of``, ``net_config_values``, ``config_defaults``)."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any


def class_of(class_path: str) -> type | None:
    """The class a config's ``class_path`` names, or None where it names none (instantiation says why)."""
    module, _, name = class_path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return found if isinstance(found, type) else None


def net_config_values(net: Mapping | None, config_class: type) -> dict[str, Any]:
    """``model.net`` as given in a config, the defaults of ``config_class`` (a dataclass) filled in."""
    defaults = {field.name: field.default for field in dataclasses.fields(config_class)}
    given = dataclasses.asdict(net) if dataclasses.is_dataclass(net) else dict(net or {})
    return {**defaults, **given}


def config_defaults(config_class: type) -> dict[str, Any]:
    """The defaults of a config dataclass's fields (``dataclasses.MISSING`` where it has none), a nested config's
    (a tower's) as the dict of its own."""
    defaults = {}
    for field in dataclasses.fields(config_class):
        has_factory = field.default_factory is not dataclasses.MISSING
        value = field.default_factory() if has_factory else field.default
        defaults[field.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return defaults
