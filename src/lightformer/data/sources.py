"""Where text corpora come from: Jane Austen's novels from a Debian package (works offline), or a URL
with a checksum (for machines with internet access).

Every file written here is written atomically (a temporary file in the same folder, then `os.replace`),
so several processes (DDP ranks, parallel tests) can prepare the same corpus at once.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
import warnings
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

TINY_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
# Not pinned: this file could not be fetched where this code was written, and a checksum must come from
# the real file. Pass `sha256=None` (no check) or pin the hash that `sha256_of` prints after a download.
TINY_SHAKESPEARE_SHA256: str | None = None

AUSTEN_DEB_PACKAGE = "r-cran-janeaustenr"
# The package's own order (janeaustenr::austen_books()); `austen_text` writes the novels in this order.
AUSTEN_NOVELS = (
    ("sensesensibility", "Sense and Sensibility"),
    ("prideprejudice", "Pride and Prejudice"),
    ("mansfieldpark", "Mansfield Park"),
    ("emma", "Emma"),
    ("northangerabbey", "Northanger Abbey"),
    ("persuasion", "Persuasion"),
)
# Inside the extracted .deb (and inside an installed R site library): the lazy-load database of the data.
AUSTEN_DATA_DIR = Path("usr/lib/R/site-library/janeaustenr/data")
AUSTEN_SYSTEM_DATA_DIR = Path("/") / AUSTEN_DATA_DIR


class CorpusUnavailableError(RuntimeError):
    """A built-in corpus is not on this machine and cannot be fetched (no apt-get, or it failed)."""


@contextmanager
def atomic_open(path: str | Path) -> Iterator[BinaryIO]:
    """Open a temporary file beside `path` for binary writing; it becomes `path` when the block ends.

    Readers never see a half-written file, concurrent writers of the same content are safe, and an
    exception inside the block leaves `path` untouched (the temporary file is removed).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
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
    """Write `data` to `path` atomically (see `atomic_open`)."""
    with atomic_open(path) as f:
        f.write(data)
    return Path(path)


def sha256_of(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download(url: str, dest: str | Path, sha256: str | None = None) -> Path:
    """Download `url` to `dest` and check its SHA-256 (hex) when `sha256` is given.

    Skips the download when `dest` already exists with the right hash (or exists at all, when `sha256`
    is None). The body is streamed to a temporary file next to `dest` and renamed only once verified.
    """
    dest = Path(dest)
    expected = sha256.lower() if sha256 else None
    if dest.exists() and (expected is None or sha256_of(dest) == expected):
        return dest
    digest = hashlib.sha256()
    try:
        with atomic_open(dest) as f, urllib.request.urlopen(url, timeout=60) as response:
            for chunk in iter(lambda: response.read(1 << 20), b""):
                digest.update(chunk)
                f.write(chunk)
            actual = digest.hexdigest()
            if expected is not None and actual != expected:
                raise ValueError(
                    f"download of {url} failed its checksum: expected sha256 {expected}, got {actual}. "
                    "The file has changed upstream or the transfer was corrupted; nothing was written "
                    f"to {dest}."
                )
    except urllib.error.URLError as error:
        raise OSError(f"could not download {url}: {error}") from error
    return dest


def austen_text(root: str | Path = "data/austen") -> Path:
    """Path of `<root>/austen.txt`: Jane Austen's six novels as one UTF-8 text file, created if missing.

    The text comes from Debian's `r-cran-janeaustenr` package. Its data files are looked up in
    `<root>/deb/usr/lib/R/site-library/janeaustenr/data/`, then in the system R library; if neither has
    them, the package is fetched with `apt-get download` and unpacked with `dpkg-deb -x` into
    `<root>/deb` (neither needs root, and R is not installed).

    Layout: each novel's lines joined by "\\n", novels separated by one blank line, no final newline,
    in the package's order: Sense and Sensibility, Pride and Prejudice, Mansfield Park, Emma,
    Northanger Abbey, Persuasion (4,025,032 characters, 81 distinct).
    """
    root = Path(root)
    target = root / "austen.txt"
    if target.exists():
        return target
    data_dir = _find_austen_data(root) or _fetch_austen_deb(root)
    novels = read_austen_novels(data_dir)
    text = "\n\n".join(novels[name] for name, _ in AUSTEN_NOVELS)
    return atomic_write_bytes(target, text.encode("utf-8"))


def read_austen_novels(data_dir: str | Path) -> dict[str, str]:
    """Read the six novels from janeaustenr's R lazy-load database `Rdata.rdx` / `Rdata.rdb`.

    The `.rdx` is gzip'ed R serialization holding, under `variables`, each object's (offset, length)
    in the `.rdb`; an `.rdb` entry is a 4-byte big-endian uncompressed length followed by a zlib
    stream of the R serialization of a character vector with one element per line ("" or NA: blank).
    Returns {package name of the novel: its lines joined with "\\n"}.
    """
    import rdata  # here, not at the top: it takes ~0.3 s to import and is needed once, to build austen.txt

    data_dir = Path(data_dir)
    rdx_path, rdb_path = data_dir / "Rdata.rdx", data_dir / "Rdata.rdb"
    with warnings.catch_warnings():
        # rdata cannot tell a bare serialization stream from a file type and says it "assumed RDS".
        warnings.filterwarnings("ignore", message=".*assumed RDS.*")
        index = rdata.conversion.convert(rdata.parser.parse_data(gzip.decompress(rdx_path.read_bytes())))
        database = rdb_path.read_bytes()
        novels = {}
        for name, _ in AUSTEN_NOVELS:
            if name not in index["variables"]:
                raise ValueError(
                    f"{rdx_path} lists no object named {name!r}; it has {sorted(index['variables'])}. "
                    f"Is this the data of the {AUSTEN_DEB_PACKAGE} package?"
                )
            offset, length = (int(v) for v in index["variables"][name])
            entry = database[offset : offset + length]
            try:
                serialized = zlib.decompress(entry[4:])
            except zlib.error as error:
                raise ValueError(
                    f"{rdb_path}: entry {name!r} at byte {offset} (length {length}) is not zlib data "
                    f"({error}); only zlib-compressed lazy-load databases are supported"
                ) from error
            lines = rdata.conversion.convert(rdata.parser.parse_data(serialized))
            novels[name] = "\n".join("" if line is None else str(line) for line in lines)
    return novels


def _find_austen_data(root: Path) -> Path | None:
    """The janeaustenr data folder under `<root>/deb` or in the system R library, if one has the files."""
    for data_dir in (root / "deb" / AUSTEN_DATA_DIR, AUSTEN_SYSTEM_DATA_DIR):
        if (data_dir / "Rdata.rdx").is_file() and (data_dir / "Rdata.rdb").is_file():
            return data_dir
    return None


def _fetch_austen_deb(root: Path) -> Path:
    """`apt-get download` the package into a temporary folder and unpack it into `<root>/deb`."""
    root = root.resolve()
    commands = (
        f"cd {root} && apt-get download {AUSTEN_DEB_PACKAGE} && dpkg-deb -x {AUSTEN_DEB_PACKAGE}_*.deb {root / 'deb'}"
    )
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise CorpusUnavailableError(
                f"Jane Austen's novels are not under {root / 'deb'} and `{tool}` is not available to fetch "
                f"them. On a Debian/Ubuntu machine run:\n    {commands}\nor pass the text as train_files."
            )
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".fetch-") as tmp:
        tmp_dir = Path(tmp)
        result = subprocess.run(
            ["apt-get", "download", AUSTEN_DEB_PACKAGE], cwd=tmp_dir, capture_output=True, text=True
        )
        debs = sorted(tmp_dir.glob(f"{AUSTEN_DEB_PACKAGE}_*.deb"))
        if result.returncode != 0 or not debs:
            raise CorpusUnavailableError(
                f"`apt-get download {AUSTEN_DEB_PACKAGE}` failed (exit code {result.returncode}):\n"
                f"{result.stderr.strip()}\nIf the package is unknown, run `apt-get update` first; then:\n"
                f"    {commands}"
            )
        # Unpack beside the target and rename, so a concurrent process never reads a half-unpacked tree.
        unpacked = tmp_dir / "deb"
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], check=True)
        try:
            os.rename(unpacked, root / "deb")
        except OSError:
            if not (root / "deb").exists():
                raise  # not a lost race with another process: a real error
    data_dir = _find_austen_data(root)
    if data_dir is None:
        raise RuntimeError(
            f"{AUSTEN_DEB_PACKAGE} was unpacked into {root / 'deb'} but has no {AUSTEN_DATA_DIR}/Rdata.rdx"
        )
    return data_dir
