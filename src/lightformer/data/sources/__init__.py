"""Where examples come from (docs/data.md, "Sources"): text files, the offline corpora, labelled texts, pairs,
images, clip art, emoji, printed lines; ``Source``, the contract of a source a user writes, and its checks."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar


class Source:
    """Where examples come from: subclass it (a frozen dataclass of the options), and a config names it (``source:
    {class_path: mypkg.MySource, init_args: {...}}``) for a family that takes any source (``TextData``: records
    ``{"text": str}``). ``records(split)`` yields a split's examples; ``fingerprint()`` is all they depend on (the
    folder is named by its hash). Optional: ``inputs`` (parts read in parallel, each passed to ``records``), ``stem``
    (the folder's name), ``splits`` (docs/data.md, "Your own source")."""

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
    """Whether ``key`` falls in the share ``fraction`` of keys, by its SHA-256: the same key on every machine and
    run, whatever else the source holds (a split carved by the examples' own names)."""
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:12], 16) < fraction * 16**12


def check_one_source(given: dict[str, bool], what: str) -> None:
    """Refuse a ``data.source`` giving other than one of its sources (``given``: each one's); ``what``: for the
    error."""
    named = [name for name, is_given in given.items() if is_given]
    if len(named) != 1:
        raise ValueError(f"data.source needs exactly one source of {what}; got {', '.join(named) if named else 'none'}")
