"""File helpers every part of lightformer shares: atomic writes, UTF-8 reading with errors that name the place,
file patterns, and the clean-up of what an interrupted atomic write leaves behind.

Every file lightformer writes (checkpoints, caches, tokenizers, exports) goes through ``atomic_open``: a temporary
file in the same folder, flushed and synced, then renamed over the target. Readers never see half a file, several
processes (DDP ranks, parallel tests) may write the same file at once, and a crash leaves the previous file intact.
"""

from __future__ import annotations

import codecs
import contextlib
import glob
import hashlib
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from lightformer.errors import DataError

TEMPORARY_SUFFIX = ".tmp"


@contextmanager
def atomic_open(path: str | Path) -> Iterator[BinaryIO]:
    """Open a temporary file beside ``path`` for binary writing; it becomes ``path`` when the block ends.

    An exception inside the block (a full disk included) leaves ``path`` untouched and removes the temporary file;
    only a process killed mid-write leaves one (``.<name>.<random>.tmp``), which ``remove_orphaned_temporary_files``
    deletes at the next start.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them visible
        os.chmod(tmp_name, 0o644)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see ``atomic_open``)."""
    with atomic_open(path) as f:
        f.write(data)
    return Path(path)


def remove_orphaned_temporary_files(folder: str | Path) -> list[Path]:
    """Delete the temporary files that writes into ``folder`` interrupted by a kill left behind; returns them."""
    folder = Path(folder)
    orphans = [p for p in folder.glob(f".*{TEMPORARY_SUFFIX}") if p.is_file()] if folder.is_dir() else []
    for orphan in orphans:
        orphan.unlink(missing_ok=True)
    return orphans


def sha256_of(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_utf8(path: str | Path, what: str | None = None) -> str:
    """A file's UTF-8 text, a leading byte-order mark dropped; a file that is not UTF-8 raises ``not_utf8``'s
    DataError (a ValueError) naming the file (``what`` says which option gave it), the byte, its offset and line, and
    how to convert it."""
    path = Path(path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise not_utf8(path, data, error, line=data.count(b"\n", 0, error.start) + 1, what=what) from None
    return text.removeprefix("\ufeff")


def not_utf8(
    path: str | Path,
    data: bytes,
    error: UnicodeDecodeError,
    offset: int = 0,
    line: int | None = None,
    what: str | None = None,
) -> DataError:
    """The error for ``data``, read from ``path`` at byte ``offset``, that is not UTF-8: it names the file (``what``
    says which option gave it), the byte, its offset (and ``line``), and how to convert it: from UTF-16 when the
    bytes look like it (a byte-order mark, or a NUL byte beside every other character), else from Latin-1."""
    sample = data[:4096]
    nuls = max(sample[0::2].count(0), sample[1::2].count(0))
    utf16 = sample.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or nuls > len(sample) // 6
    looks = "it looks like UTF-16 (a byte-order mark, or NUL bytes between the characters): " if utf16 else ""
    where = error.reason if line is None else f"line {line}: {error.reason}"
    return DataError(
        f"{what + ': ' if what else ''}{path} is not UTF-8 text: byte 0x{data[error.start]:02x} at byte offset "
        f"{offset + error.start} ({where}); {looks}convert it, e.g. `iconv -f {'utf-16' if utf16 else 'latin1'} -t "
        "utf-8`"
    )


def read_lines(path: str | Path, what: str | None = None) -> list[str]:
    """The file's lines, split on "\\n" only (other Unicode line breaks stay inside a line), "\\r" dropped."""
    lines = read_utf8(path, what).split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start another
    return [line.removesuffix("\r") for line in lines]


def as_list(patterns: list[str] | str | None) -> list[str]:
    """``None`` → [], a string → [it], a list → itself."""
    if patterns is None:
        return []
    return [patterns] if isinstance(patterns, str) else list(patterns)


def expand_patterns(
    patterns: list[str] | str | None, field: str, noun: str = "file", suffix: str = ".txt"
) -> list[Path]:
    """Paths named by ``patterns`` (plain paths or globs, ``**`` allowed; one string or a list), in the order given,
    each glob's matches sorted. A missing file, a folder or a pattern without matches raises an error that names
    ``field`` and the pattern: "train_files: the file 'a.txt' does not exist", "--images: the pattern 'x/*.png'
    matches no image file" (``noun``: what the files are; ``suffix``: the files' usual ending, for the glob a folder
    is told to use instead)."""
    paths = []
    for pattern in as_list(patterns):
        if glob.has_magic(pattern):
            matches = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
            if not matches:
                raise FileNotFoundError(f"{field}: the pattern {pattern!r} matches no {noun}")
            paths.extend(matches)
        elif Path(pattern).is_file():
            paths.append(Path(pattern))
        elif Path(pattern).is_dir():
            hint = f"name files or a glob like '{pattern}/*{suffix}'"
            raise IsADirectoryError(f"{field}: {pattern!r} is a folder; {hint}")
        else:
            raise FileNotFoundError(f"{field}: the {noun} {pattern!r} does not exist")
    return paths


def take_lock(path: str | Path) -> tuple[str, int] | None:
    """Create the lock file ``path`` holding this machine's host name and this process's id, atomically
    (``O_CREAT | O_EXCL``: of two processes, one creates it); returns None, or ``(host, pid)`` of the process that
    holds it. A lock of this host whose process is gone (killed before it could remove it) is replaced; one that
    another host wrote is held (on a file system that nodes share, its process cannot be seen from here), and so is
    one still being written (empty, for a few seconds)."""
    path = Path(path)
    for _ in range(3):  # a stale lock removed here may be taken by another process before this one retries
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = lock_holder(path)
            if holder is None:
                with contextlib.suppress(OSError):
                    if time.time() - path.stat().st_mtime < 10:
                        return ("?", -1)  # created an instant ago: its writer has not written its name yet
            elif holder[0] != socket.gethostname() or _alive(holder[1]):
                return holder
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{socket.gethostname()} {os.getpid()}\n")
        return None
    return lock_holder(path) or ("?", -1)


def lock_holder(path: str | Path) -> tuple[str, int] | None:
    """The (host, pid) a lock file of ``take_lock`` names; None when it is gone or not one (a half-written lock)."""
    try:
        host, pid = Path(path).read_text().split()
        return host, int(pid)
    except (OSError, ValueError):
        return None


def release_lock(path: str | Path) -> None:
    """Remove a lock this process holds (not one another process took after it was found stale)."""
    if lock_holder(path) == (socket.gethostname(), os.getpid()):
        Path(path).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
