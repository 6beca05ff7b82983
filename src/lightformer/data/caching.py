"""Cache keys for the data modules' prepared files (tokenizers, token ids, extracted pairs).

A cached file's name holds a short hash of everything its content depends on (the source files, the options, a
format version), so a change to any of them makes a new file instead of reusing a stale one.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_info


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
