"""Cache keys for the data modules' prepared files (tokenizers, token ids, extracted pairs).

A cached file's name holds a short hash of everything its content depends on (the source files, the options, a
format version), so a change to any of them makes a new file instead of reusing a stale one.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightformer.files import atomic_write_bytes

T = TypeVar("T")


def file_stamp(path: Path) -> list:
    """What identifies a user's file without reading it: its absolute path, size and modification time."""
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def content_hash(value: object) -> str:
    """Short stable hash of a JSON-serializable value (or a string), for cache file names."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@contextmanager
def preparing(what: str) -> Iterator[None]:
    """Say what slow preparation is running (tokenizer training, encoding, extraction, fetching), and how long it
    took: a run is not silent for minutes before its first step."""
    rank_zero_info(f"preparing data: {what} ...")
    start = time.monotonic()
    yield
    rank_zero_info(f"preparing data: {what}: done in {time.monotonic() - start:.1f} s")


def cached(path: Path, load: Callable[[Path], T], build: Callable[[], T], save: Callable[[Path, T], object]) -> T:
    """The value cached at ``path`` (``load``), or ``build()``-t and cached (``save``, which writes atomically). A
    cache file that does not load (cut short, overwritten, from a broken disk) is named in a warning, removed and
    built again: a damaged cache never fails every later run the same way."""
    if path.exists():
        try:
            return load(path)
        except Exception as error:  # the loaders raise what their format's parser raises
            rank_zero_warn(f"the cached file {path} is damaged ({type(error).__name__}: {error}); preparing it again")
            path.unlink(missing_ok=True)
    value = build()
    save(path, value)
    return value


def write_json(path: Path, value: object) -> None:
    """``value`` as UTF-8 JSON at ``path``, written atomically (a cache's ``save``)."""
    atomic_write_bytes(path, json.dumps(value, ensure_ascii=False).encode("utf-8"))


def write_tokenizer(path: Path, tokenizer) -> None:
    """A tokenizer's JSON at ``path``, written atomically (a cache's ``save``)."""
    tokenizer.save(path)
