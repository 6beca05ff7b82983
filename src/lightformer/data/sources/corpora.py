"""The offline corpora, the md5 split, Ding's pairs, Austen's passages (docs/data.md, "Sources", "Sentence pairs")."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
import warnings
import zlib
from collections.abc import Collection
from pathlib import Path

from lightformer.data.pieces import SPLITS, resolve_files
from lightformer.data.preparation.caching import preparing
from lightformer.data.sources.text import TextSource
from lightformer.io.files import atomic_open, atomic_write_bytes, read_utf8, sha256_of

Pair = tuple[str, str]

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


DEBIAN_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")  # dataset-fashion-mnist's gzip files
MNIST_RAW_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)

DING_FILE = "/usr/share/trans/de-en"
DING_DEB_PACKAGE = "trans-de-en"


class CorpusUnavailableError(RuntimeError):
    """A built-in corpus is not on this machine and cannot be fetched (no apt-get, or it failed)."""


def ding_dictionary(path: str | Path) -> Path:
    """``path``, the Ding dictionary, or a CorpusUnavailableError naming the field and the package."""
    path = Path(path)
    if not path.is_file():
        raise CorpusUnavailableError(
            f"data.source.ding_file: the Ding German–English dictionary is not at {path}. It is Debian's "
            f"{DING_DEB_PACKAGE} package: run `sudo apt-get install {DING_DEB_PACKAGE}` (or point ding_file at a copy "
            "of the de-en file)"
        )
    return path


def download(url: str, dest: str | Path, sha256: str | None = None) -> Path:
    """Download `url` to `dest`, renamed once verified against `sha256` if given; skipped when `dest` has that hash."""
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
    """`<root>/austen.txt`: Austen's six novels in one UTF-8 file, made if missing (docs/data.md, "Sources")."""
    root = Path(root)
    target = root / "austen.txt"
    if target.exists():
        return target
    with preparing(f"Jane Austen's novels from Debian's {AUSTEN_DEB_PACKAGE} into {target}"):
        data_dir = _find_austen_data(root) or _fetch_austen_deb(root)
        novels = read_austen_novels(data_dir)
    text = "\n\n".join(novels[name] for name, _ in AUSTEN_NOVELS)
    return atomic_write_bytes(target, text.encode("utf-8"))


def austen_novels(root: str | Path = "data/austen") -> list[Path]:
    """The six novels of ``austen_text`` as files ``<root>/novels/<n>-<name>.txt`` (docs/data.md, "Sources")."""
    folder = Path(root) / "novels"
    paths = [folder / f"{n}-{name}.txt" for n, (name, _) in enumerate(AUSTEN_NOVELS, start=1)]
    if not all(path.is_file() for path in paths):
        novels = split_austen_text(read_utf8(austen_text(root)))
        for path, (name, _) in zip(paths, AUSTEN_NOVELS, strict=True):
            atomic_write_bytes(path, novels[name].encode("utf-8"))
    return paths


def split_austen_text(text: str) -> dict[str, str]:
    """The six novels of ``austen.txt`` by package name, cut at each title line (any case)."""
    starts = []
    for _, title in AUSTEN_NOVELS:
        found = [m.start() for m in re.finditer(rf"^{re.escape(title)}$", text, re.IGNORECASE | re.MULTILINE)]
        if len(found) != 1 or (starts and found[0] <= starts[-1]):
            raise ValueError(
                f"the Austen text has {len(found)} title lines {title!r} (expected one, after the previous novel's); "
                "is it corpora.austen_text's file? Delete it to have it rebuilt"
            )
        starts.append(found[0])
    ends = [*starts[1:], len(text)]
    return {name: text[start:end] for (name, _), start, end in zip(AUSTEN_NOVELS, starts, ends, strict=True)}


def read_austen_novels(data_dir: str | Path) -> dict[str, str]:
    """The six novels from janeaustenr's R lazy-load database: {package name: its lines joined with "\\n"}."""
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


def install_debian_fashion_mnist(root: str | Path) -> bool:
    """Decompress Debian's Fashion-MNIST into ``<root>/FashionMNIST/raw/``; returns whether all four files are there."""
    raw_dir = Path(root) / "FashionMNIST" / "raw"
    missing = [name for name in MNIST_RAW_FILES if not (raw_dir / name).is_file()]
    if not missing:
        return True
    sources = [DEBIAN_FASHION_MNIST_DIR / f"{name}.gz" for name in missing]
    if not all(source.is_file() for source in sources):
        return False
    for name, source in zip(missing, sources, strict=True):
        with gzip.open(source, "rb") as compressed, atomic_open(raw_dir / name) as decompressed:
            shutil.copyfileobj(compressed, decompressed)
    return True


TEST_BUCKETS = 5  # buckets 0..4 are test
VAL_BUCKETS = 10  # buckets 5..9 are val; 10..99 train


def split_bucket(sentence: str) -> int:
    """The sentence's bucket in 0..99: `int(md5(sentence as UTF-8).hexdigest(), 16) % 100`."""
    return int(hashlib.md5(sentence.encode("utf-8")).hexdigest(), 16) % 100


def split_of(sentence: str) -> str:
    """The split of a sentence: "test" for buckets 0..4, "val" for 5..9, "train" for 10..99."""
    bucket = split_bucket(sentence)
    return "test" if bucket < TEST_BUCKETS else "val" if bucket < VAL_BUCKETS else "train"


def split_of_line(text: str, split: str, held_out: Collection[str]) -> str:
    """A ``split`` file's text's split: a train text whose bucket is a held-out split goes there, else its file's."""
    if split == "train" and held_out and (bucket := split_of(text)) in held_out:
        return bucket
    return split


# Innermost bracketed annotations ({m}, [ugs.], <Variante>, (optional words)); removed repeatedly so nested ones go.
_ANNOTATION = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]|<[^<>]*>|\([^()]*\)")
# Abbreviation markers such as "Entschuldigung, ich verstehe nicht. /SIDU/": a whole word between slashes.
_ABBREVIATION_MARKER = re.compile(r"(?<!\S)/[^/\s]+/(?!\S)")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+([.,!?;:])")
# Dictionary notation that makes a sub-entry a template rather than a sentence.
_NOTATION = re.compile(r"/|…|\.\.\.|\b(?:etw|jdn|jdm|jds|sth|sb)\.")


def clean_ding_entry(entry: str) -> str:
    """The first synonym of one Ding sub-entry, annotations removed (docs/data.md, "Ding extraction", steps 2 and 3)."""
    removed = 1
    while removed:  # innermost brackets first, until none are left
        entry, removed = _ANNOTATION.subn(" ", entry)
    if "/" in entry:
        entry = _ABBREVIATION_MARKER.sub(" ", entry)
    for synonym in entry.split(";"):
        synonym = " ".join(synonym.split())
        if synonym:
            return _SPACE_BEFORE_PUNCTUATION.sub(r"\1", synonym)
    return ""


def is_sentence(text: str) -> bool:
    """A capital first letter, a final `.`, `!` or `?`, three words or more, and no dictionary notation."""
    return (
        len(text) > 0
        and text[0].isupper()
        and text[-1] in ".!?"
        and len(text.split()) >= 3
        and _NOTATION.search(text) is None
    )


def extract_ding_pairs(path: str | Path) -> tuple[list[Pair], list[Pair], dict[str, int]]:
    """(sentence pairs, other word/phrase pairs, counts) of a Ding file, deduplicated, (German, English) in order."""
    path = Path(path)
    text = read_utf8(path)
    sentences: dict[Pair, None] = {}  # dicts keep the first occurrence's order
    phrases: dict[Pair, None] = {}
    counts = {"entry_lines": 0, "sub_entries": 0, "misaligned_lines": 0, "malformed_lines": 0}
    for line in text.split("\n"):
        if not line.strip() or line.startswith("#"):
            continue
        counts["entry_lines"] += 1
        german, separator, english = line.partition("::")
        if not separator:
            counts["malformed_lines"] += 1
            continue
        german_entries, english_entries = german.split("|"), english.split("|")
        if len(german_entries) != len(english_entries):
            counts["misaligned_lines"] += 1
            continue
        for german_entry, english_entry in zip(german_entries, english_entries, strict=True):
            counts["sub_entries"] += 1
            pair = (clean_ding_entry(german_entry), clean_ding_entry(english_entry))
            if is_sentence(pair[0]) and is_sentence(pair[1]):
                sentences[pair] = None
            elif pair[0] and pair[1]:
                phrases[pair] = None
    phrase_list = [pair for pair in phrases if pair not in sentences]
    return list(sentences), phrase_list, counts


def source_files(source: TextSource) -> dict[str, list[Path]]:
    """Each split's files of a text ``source`` (a corpus fetched, a ``url`` downloaded); val and test [] when cut."""
    if source.corpus == "austen":
        train = austen_novels(Path(source.data_root) / "austen")
    elif source.url is not None:
        name = Path(source.url.split("?")[0]).name or "corpus.txt"
        train = [download(source.url, Path(source.data_root) / "downloads" / name, source.sha256)]
    else:
        train = resolve_files(list(source.train_files), "data.source.train_files")
    return {
        "train": train,
        "val": resolve_files(list(source.val_files or []), "data.source.val_files"),
        "test": resolve_files(list(source.test_files or []), "data.source.test_files"),
    }


TRAIN_SHARE, VAL_SHARE = 0.8, 0.1  # of each novel's passages, in order: train, val, then test
Example = tuple[str, int, int]  # (text, class index, position: the passage's index in its novel)
_CHAPTER = re.compile(r"^chapter\b", re.IGNORECASE)
_HEADING = re.compile(r"^(?:chapter|volume)\b", re.IGNORECASE)
_END_MARK = re.compile(r"^(?:the end|finis|a note on the text)$", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?]['\"’”)\]_]*(?=\s)")
_ABBREVIATION = re.compile(r"\b(?:Mr|Mrs|Dr|St|Messrs)\.$")
MIN_SENTENCE_WORDS = 3


def split_sentences(paragraph: str) -> list[str]:
    """A paragraph's sentences (docs/data.md, "Labelled texts", step 3), short fragments included."""
    text = " ".join(paragraph.split())
    sentences, start = [], 0
    for end in _SENTENCE_END.finditer(text):
        sentence = text[start : end.end()].strip()
        if sentence and not _ABBREVIATION.search(sentence):  # "Mr. Darcy": an abbreviation ends no sentence
            sentences.append(sentence)
            start = end.end()
    if text[start:].strip():
        sentences.append(text[start:].strip())
    return sentences


def novel_sentences(novel: str) -> list[str]:
    """A novel body's sentences, headings and fragments under three words dropped (docs/data.md, steps 1-3)."""
    lines = novel.split("\n")
    first = next((i for i, line in enumerate(lines) if _CHAPTER.match(line.strip())), 0)
    last = next((i for i in range(first, len(lines)) if _END_MARK.match(lines[i].strip())), len(lines))
    sentences = []
    for paragraph in re.split(r"\n[ \t]*\n", "\n".join(lines[first:last])):
        paragraph = " ".join(paragraph.split())
        if not paragraph or _HEADING.match(paragraph) or not re.search("[a-z]", paragraph):
            continue
        sentences += [s for s in split_sentences(paragraph) if len(s.split()) >= MIN_SENTENCE_WORDS]
    return sentences


def austen_passages(text: str, passage_sentences: int) -> dict[str, list[Example]]:
    """Each split's (passage, novel index, index in its novel), novel by novel (docs/data.md, steps 4 and 5)."""
    splits: dict[str, list[Example]] = {split: [] for split in SPLITS}
    for label, novel in enumerate(split_austen_text(text).values()):
        sentences = novel_sentences(novel)
        count = len(sentences) // passage_sentences
        passages = [" ".join(sentences[i * passage_sentences : (i + 1) * passage_sentences]) for i in range(count)]
        n_train, n_val = int(count * TRAIN_SHARE), int(count * (TRAIN_SHARE + VAL_SHARE))
        for position, passage in enumerate(passages):
            split = "train" if position < n_train else "val" if position < n_val else "test"
            splits[split].append((passage, label, position))
    return splits
