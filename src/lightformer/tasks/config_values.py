"""A config's values before anything is built: the command line's checks before any data is prepared read the task's
and the data module's arguments from the config itself (``class_of``, ``data_config_values``, ``net_config_values``)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
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


def data_config_values(data: Mapping | None, expected: str) -> dict[str, Any] | None:
    """The init arguments of the data module a config names (``class_path``, ``init_args``), its signature's
    defaults filled in, when it is ``expected`` (a class path) or a subclass of it; None otherwise (another data
    module, whose own checks apply at set-up)."""
    if not data or not data.get("class_path"):
        return None
    data_class, expected_class = class_of(str(data["class_path"])), class_of(expected)
    if data_class is None or expected_class is None or not issubclass(data_class, expected_class):
        return None  # another data module, or a class path that instantiation refuses with its own message
    parameters = inspect.signature(data_class.__init__).parameters.values()
    values = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    return {**values, **dict(data.get("init_args") or {})}


def net_config_values(net: Mapping | None, config_class: type) -> dict[str, Any]:
    """``model.net`` as given in a config, the defaults of ``config_class`` (a dataclass) filled in."""
    defaults = {field.name: field.default for field in dataclasses.fields(config_class)}
    given = dataclasses.asdict(net) if dataclasses.is_dataclass(net) else dict(net or {})
    return {**defaults, **given}
