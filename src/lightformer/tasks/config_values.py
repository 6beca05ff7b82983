"""A config's values before anything is built: the command line's checks before any data is prepared read the task's
arguments from the config itself (``class_of``, ``net_value``, ``config_defaults``)."""

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


def net_value(net: Any, config_class: type, path: str) -> Any:
    """The field ``path`` of ``model.net`` (dotted: a tower's, "text.block_size") as a config gives it (a dict, a
    dataclass or a jsonargparse ``Namespace``, whose keys are dotted), else the default of ``config_class``."""
    return _value_at(net, config_defaults(config_class), path)


def _value_at(given: Any, defaults: Mapping[str, Any], path: str) -> Any:
    values = dataclasses.asdict(given) if dataclasses.is_dataclass(given) else dict(given or {})
    if path in values:
        return values[path]
    head, _, rest = path.partition(".")
    return _value_at(values.get(head), defaults[head], rest) if rest else defaults[head]


def config_defaults(config_class: type) -> dict[str, Any]:
    """The defaults of a config dataclass's fields (``dataclasses.MISSING`` where it has none), a nested config's
    (a tower's) as the dict of its own."""
    defaults = {}
    for field in dataclasses.fields(config_class):
        has_factory = field.default_factory is not dataclasses.MISSING
        value = field.default_factory() if has_factory else field.default
        defaults[field.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return defaults
