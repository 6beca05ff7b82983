"""A user's captioned images: annotation files or webdataset shards (docs/data.md, "Captioned images of one's own")."""

from __future__ import annotations

import csv
import glob
import hashlib
import io
import json
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, NamedTuple

from PIL import UnidentifiedImageError

from lightformer.data.pieces import SPLITS
from lightformer.data.sources.image_files import fit_image, load_image
from lightformer.data.sources.lines import MIN_HEIGHT
from lightformer.data.sources.rendering import jpeg_bytes, png_bytes
from lightformer.errors import DataError
from lightformer.nn.checks import check_at_least

LAYOUTS = {".jsonl": "JSONL", ".csv": "CSV", ".tsv": "TSV", ".json": "COCO captions"}
SHARD_IMAGES = (".jpg", ".jpeg", ".png", ".webp")  # a webdataset sample's image members (img2dataset's)
SHARD_TEXTS = (".txt", ".json")  # its caption members (a .txt wins over a .json caption)
MAX_TOKENS = 4096  # the default of ``max_tokens``: more tokens than any text of a model here holds


# The most bytes of a line (characters of a text) one token of ``max_tokens`` may stand for (a token is a character
# or a BPE piece of ~4; a JSON escape is ≤ 6 bytes): a longer line is refused before it is parsed or held whole.
TOKEN_BYTES = 128


def is_shards(path: str) -> bool:
    """Whether a split's path names webdataset shards, not an annotation file: a ``.tar``, a glob, or a folder."""
    suffix = Path(path).suffix.lower()
    return suffix not in LAYOUTS and (suffix == ".tar" or any(c in path for c in "*?[") or Path(path).is_dir()
                                      or not suffix)  # fmt: skip


@dataclass(frozen=True)
class ImageTextFiles:
    """A user's annotation files and images, and the canvas the images are fitted to (``data.source``).

    Args:
        train: annotations (``.jsonl``, ``.csv``, ``.tsv``, COCO ``.json``) or webdataset shards (files, glob, folder).
        val: the validation annotations or shards; default: ``val_fraction`` of the training images.
        test: the test annotations or shards; default: no test split.
        images: the folder the annotations' file names resolve against; default: the annotation file's own.
        val_fraction: share of the training images (by a hash of the file name) carved for validation without ``val``.
        height: the canvas's height in pixels.
        width: the canvas's width in pixels.
        channels: 1 (grey) or 3 (RGB).
        fit: "line": a text line scaled to the height (at most the width), at the left; "resize": a photo, resized.
        max_tokens: the most tokens a text may have (a longer line is refused as it is read, naming file and line).
    """

    train: str
    val: str | None = None
    test: str | None = None
    images: str | None = None
    val_fraction: float = 0.05
    height: int = 32
    width: int = 384
    channels: int = 1
    fit: Literal["line", "resize"] = "line"
    max_tokens: int = MAX_TOKENS

    def __post_init__(self) -> None:
        for split in SPLITS:
            path = getattr(self, split)
            if (
                (path is not None or split == "train")
                and Path(path or "").suffix.lower() not in LAYOUTS
                and not (path and is_shards(path))
            ):
                raise ValueError(
                    f"data.source.{split}={path!r} is not an annotation file; valid: a .jsonl, .csv or .tsv file of "
                    "rows with 'file' and 'text', a COCO captions .json, or webdataset shards (a .tar, a glob of "
                    "them, a folder of them)"
                )
        if not 0 <= self.val_fraction < 1:
            raise ValueError(f"data.source.val_fraction={self.val_fraction} must be in [0, 1)")
        for name in ("height", "width"):
            if getattr(self, name) < MIN_HEIGHT:
                raise ValueError(f"data.source.{name}={getattr(self, name)} must be at least {MIN_HEIGHT} pixels")
        if self.channels not in (1, 3):
            raise ValueError(f"data.source.channels={self.channels} is not supported; valid: 1 (grey), 3 (RGB)")
        if self.fit not in ("line", "resize"):
            raise ValueError(f"data.source.fit={self.fit!r} is not a way to fit an image; valid: 'line', 'resize'")
        check_at_least("data.source.max_tokens", self.max_tokens, 1)


class Entry(NamedTuple):
    """An image of an annotation file: where it is, its name there, its texts, and the row that first names it."""

    path: str
    name: str
    texts: list[str]
    row: str


def bounded_lines(f, limit: int, too_long: Callable[[int], Exception]) -> Iterator[tuple[int, str | bytes]]:
    """(number from 1, line) of an open file's lines; one longer than ``limit`` raises ``too_long(number)`` unread."""
    number = 0
    while line := f.readline(limit + 2):  # a line of ``limit`` and its "\r\n" whole
        number += 1
        crlf, lf = (b"\r\n", b"\n") if isinstance(line, bytes) else ("\r\n", "\n")
        if len(line) - (2 if line.endswith(crlf) else 1 if line.endswith(lf) else 0) > limit:
            raise too_long(number)
        yield number, line


def line_too_long(where: str, limit: int, max_tokens: int, unit: str = "characters") -> DataError:
    """The refusal of a line (``where``: the option, file and line) longer than ``limit`` ``unit``."""
    return DataError(f"{where} is longer than {limit:,} {unit}: more than data.source.max_tokens={max_tokens} tokens "
                     f"can take ({TOKEN_BYTES} {unit} a token at most); shorten it, or raise data.source.max_tokens if "
                     "the model holds longer texts")  # fmt: skip


def source_key(source) -> dict:
    """A source's fields for its fingerprint: ``max_tokens`` only if not the default (older folders keep names)."""
    fields = asdict(source)
    if fields.get("max_tokens") == MAX_TOKENS:
        del fields["max_tokens"]
    return fields


def _row(record: object, where: str, number: int) -> tuple[str, str, str]:
    """(file, text, "line N") of a JSONL, CSV or TSV row, or a DataError naming what it lacks."""
    record = record if isinstance(record, dict) else {}
    missing = [key for key in ("file", "text") if not str(record.get(key) or "").strip()]
    if missing:
        raise DataError(f"{where}, line {number}: the row has no {' or '.join(missing)}; each row names an image "
                        "'file' and its 'text'")  # fmt: skip
    return str(record["file"]).strip(), str(record["text"]).strip(), f"line {number}"


def _table_rows(path: Path, where: str, max_tokens: int):
    limit = max_tokens * TOKEN_BYTES
    with open(path, encoding="utf-8-sig", newline="") as f:
        lines = bounded_lines(f, limit, lambda number: line_too_long(f"{where}, line {number}", limit, max_tokens))
        if path.suffix.lower() == ".jsonl":
            for number, line in lines:
                if line.strip():
                    try:
                        yield _row(json.loads(line), where, number)
                    except json.JSONDecodeError as error:
                        raise DataError(f"{where}, line {number}: not a JSON object ({error})") from None
            return
        reader = csv.DictReader((line for _, line in lines), delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
        if not {"file", "text"} <= set(reader.fieldnames or ()):
            raise DataError(f"{where}: the header row {reader.fieldnames} lacks the column 'file' or 'text'; the "
                            "first row names the columns, among them file and text")  # fmt: skip
        for record in reader:
            yield _row(record, where, reader.line_num)


def _coco_rows(data: dict, where: str, max_tokens: int):
    try:
        names = {image["id"]: image["file_name"] for image in data["images"]}
    except (KeyError, TypeError) as error:
        raise DataError(f'{where}: an entry of "images" lacks {error} (COCO: {{"id", "file_name"}})') from None
    for i, annotation in enumerate(data["annotations"]):
        image_id, caption = annotation.get("image_id"), annotation.get("caption")
        if image_id not in names:
            raise DataError(f'{where}, annotations[{i}]: its image_id {image_id!r} is the id of no entry of "images"')
        if not isinstance(caption, str) or not caption.strip():
            raise DataError(f"{where}, annotations[{i}] (image {names[image_id]}): it has no caption")
        if len(caption) > max_tokens * TOKEN_BYTES:
            raise line_too_long(f"{where}, annotations[{i}]: the caption", max_tokens * TOKEN_BYTES, max_tokens)
        yield names[image_id], caption.strip(), f"annotations[{i}]"


def image_folders(annotation: Path, images: str | None) -> list[Path]:
    """The folders an annotation file's image names resolve against, in order (docs/data.md, "Layouts")."""
    base = Path(images) if images else annotation.parent
    if not annotation.stem.startswith("captions_"):
        return [base]
    name = annotation.stem.removeprefix("captions_")
    return [base, base / name] + ([] if images else [annotation.parent.parent / name])


def read_annotations(path: Path, images: str | None, field: str, max_tokens: int = MAX_TOKENS) -> list[Entry]:
    """The images of an annotation file, in order first named, each with its texts; a bad one a DataError naming it."""
    where = f"data.source.{field}: {path}"
    if not path.is_file():
        raise DataError(f"{where} does not exist; give an annotation file ({', '.join(LAYOUTS)})")
    grouped: dict[str, tuple[str, list[str]]] = {}
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(path.read_text(encoding="utf-8-sig"))
            if not (isinstance(data, dict) and {"images", "annotations"} <= data.keys()):
                raise DataError(f'{where} is not COCO captions: a JSON object with "images" and "annotations"')
            rows = _coco_rows(data, where, max_tokens)
        else:
            rows = _table_rows(path, where, max_tokens)
        for name, text, row in rows:
            grouped.setdefault(name, (row, []))[1].append(text)
    except (UnicodeDecodeError, json.JSONDecodeError, csv.Error) as error:
        raise DataError(f"{where} is not a readable {LAYOUTS[path.suffix.lower()]} file ({error})") from None
    folders, entries = image_folders(path, images), []
    for name, (row, texts) in grouped.items():
        found = next((folder / name for folder in folders if (folder / name).is_file()), None)
        if found is None:
            tried = ", ".join(str(folder / name) for folder in folders)
            raise DataError(f"{where}, {row}: the image {name!r} is not found ({tried}); set data.source.images to "
                            "the folder the file names resolve against")  # fmt: skip
        entries.append(Entry(str(found), name, texts, row))
    if not entries:
        raise DataError(f"{where} names no image")
    return entries


def carved(name: str, fraction: float) -> bool:
    """Whether the image of file name ``name`` goes to validation: a stable hash of the name below ``fraction``."""
    return int(hashlib.sha256(name.encode("utf-8")).hexdigest()[:12], 16) < fraction * 16**12


def shard_files(path: str, field: str) -> list[Path]:
    """The ``.tar`` shards a split's path names (a file, a glob, a folder's), sorted; none: a DataError."""
    if Path(path).is_dir():
        found = sorted(Path(path).glob("*.tar"))
    elif any(c in path for c in "*?["):
        found = sorted(Path(p) for p in glob.glob(path) if p.lower().endswith(".tar") and Path(p).is_file())
    else:
        found = [Path(path)] if Path(path).is_file() else []
    if not found:
        raise DataError(f"data.source.{field}={path!r} names no webdataset shard: give a .tar file, a glob of them "
                        "or a folder holding them (00000.tar ...)")  # fmt: skip
    return found


def _member_key(name: str) -> tuple[str, str]:
    """(key, suffix) of a shard member as webdataset groups them: "dir/00012.jpg" → ("dir/00012", ".jpg")."""
    folder, _, base = name.rpartition("/")
    stem, dot, rest = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), (dot + rest).lower()


def _caption(suffix: str, data: bytes, where: str) -> str:
    """The caption of a ``.txt`` member (its text) or a ``.json`` one (its "caption" or "text"); '' where none."""
    try:
        if suffix == ".txt":
            return " ".join(data.decode("utf-8").split())
        record = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"{where}: the caption member{suffix} is not readable ({error})") from None
    caption = record.get("caption") or record.get("text") if isinstance(record, dict) else None
    return " ".join(caption.split()) if isinstance(caption, str) else ""


def shard_samples(
    shard: Path, field: str, images: bool = True, max_tokens: int = MAX_TOKENS
) -> Iterator[tuple[str, bytes | None, str]]:
    """(key, image bytes or None without ``images``, caption) of each sample of a shard, streamed, checked."""
    where, limit = f"data.source.{field}: {shard}", max_tokens * TOKEN_BYTES
    key, image, caption, has_image = None, None, "", False

    def sample() -> tuple[str, bytes | None, str]:
        if not caption:
            raise DataError(f"{where}, key {key!r}: the image has no caption (a .txt, or a .json with 'caption' or "
                            "'text')")  # fmt: skip
        if not has_image:
            raise DataError(f"{where}, key {key!r}: the caption has no image ({', '.join(SHARD_IMAGES)})")
        return key, image, caption

    try:
        with tarfile.open(shard, "r|*") as tar:
            while (member := tar.next()) is not None:
                tar.members.clear()  # the members read so far, which a TarFile keeps: none is needed again
                if not member.isfile():
                    continue
                name, suffix = _member_key(member.name)
                if suffix not in SHARD_IMAGES + SHARD_TEXTS:
                    continue
                if name != key:
                    if key is not None:
                        yield sample()
                    key, image, caption, has_image = name, None, "", False
                if suffix in SHARD_IMAGES:
                    has_image = True
                    image = tar.extractfile(member).read() if images else None
                elif not caption or suffix == ".txt":
                    said = f"{where}, key {name!r}: the caption member{suffix}"
                    if suffix == ".txt" and member.size > limit:  # refused unread (a .json may hold more fields)
                        raise line_too_long(f"{said} ({member.size:,} bytes)", limit, max_tokens, "bytes")
                    caption = _caption(suffix, tar.extractfile(member).read(), f"{where}, key {name!r}") or caption
                    if len(caption) > limit:
                        raise line_too_long(f"{said}'s caption", limit, max_tokens)
            if key is not None:
                yield sample()
    except (tarfile.TarError, OSError) as error:
        raise DataError(f"{where} is not a readable tar file ({error})") from None


def shard_records(shard: str, field: str, keep: str | None, fraction: float, source: ImageTextFiles):
    """The records {"image", "file": "<shard>/<key>", "texts"} of a shard (``keep``: "train", "val" or None: all)."""
    for key, data, caption in shard_samples(Path(shard), field, max_tokens=source.max_tokens):
        if keep is not None and carved(key, fraction) != (keep == "val"):
            continue
        stream = io.BytesIO(data)
        try:
            image = load_image(stream, source.channels)
        except (OSError, ValueError) as error:
            raise DataError(f"data.source.{field}: {shard}, key {key!r}: the image is not readable "
                            f"({unreadable_image(error, stream)})") from None  # fmt: skip
        image = fit_image(image, source.height, source.width, source.fit)
        encoded = png_bytes(image) if source.fit == "line" else jpeg_bytes(image)
        texts = json.dumps([caption], ensure_ascii=False)
        yield {"image": encoded, "file": f"{Path(shard).name}/{key}", "texts": texts}


def unreadable_image(error: BaseException, stream: io.BytesIO) -> str:
    """Why ``stream``'s bytes are not an image, in words naming no Python object: not an image, cut short, or PIL's."""
    cause = error.__cause__ or error
    if isinstance(cause, UnidentifiedImageError):
        return "not an image: PIL recognises no image format in it"
    if "truncated" in str(cause).lower():
        return f"cut short: {cause}"
    return str(cause).replace(str(stream), "it")


def image_records(piece: list[Entry], source: ImageTextFiles, annotation: str):
    """The records {"image": PNG or JPEG, "file", "texts": JSON list} of a piece of images, one at a time."""
    for entry in piece:
        try:
            image = load_image(entry.path, source.channels)
        except (OSError, ValueError) as error:
            raise DataError(f"{annotation}, {entry.row}: {error}") from None
        image = fit_image(image, source.height, source.width, source.fit)
        encoded = png_bytes(image) if source.fit == "line" else jpeg_bytes(image)  # a photo: a tenth of the bytes
        yield {"image": encoded, "file": entry.name, "texts": json.dumps(entry.texts, ensure_ascii=False)}
