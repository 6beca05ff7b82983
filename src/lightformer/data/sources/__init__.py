"""Where examples come from (docs/data.md, "Sources"); ``Source``, the contract of a source a user writes."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar


class Source:
    """Where examples come from: a frozen dataclass of the options (docs/data.md, "Your own source")."""

    splits: ClassVar[tuple[str, ...]] = ("train", "val", "test")

    def fingerprint(self) -> dict:
        raise NotImplementedError(f"{type(self).__name__} does not say what its examples depend on (fingerprint)")

    def records(self, split: Any) -> Iterator[dict]:
        raise NotImplementedError(f"{type(self).__name__} does not say what its examples are (records)")

    def inputs(self, split: str) -> list:
        """The parts of ``split`` that ``records`` reads, each on its own (picklable); default: the split whole."""
        return [split]

    def stem(self) -> str:
        """The prepared folder's readable name, before its hash."""
        return type(self).__name__.lower()


def file_stamps(paths: Iterable[str | Path]) -> list[list]:
    """Each file's (name, size, modification time): what a source's examples depend on, read without the files."""
    return [[os.fspath(path), (stat := os.stat(path)).st_size, stat.st_mtime_ns] for path in paths]


def hashed(key: str, fraction: float) -> bool:
    """Whether ``key`` falls in the share ``fraction`` of keys, by its SHA-256: the same on every machine and run."""
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:12], 16) < fraction * 16**12


def check_one_source(given: dict[str, bool], what: str) -> None:
    """Refuse a ``data.source`` giving other than one of its sources (``given``: each one's); ``what``: the error's."""
    named = [name for name, is_given in given.items() if is_given]
    if len(named) != 1:
        raise ValueError(f"data.source needs exactly one source of {what}; got {', '.join(named) if named else 'none'}")
