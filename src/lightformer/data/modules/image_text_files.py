"""Image-to-text data of a user's own: images (text lines, photos) and their texts (transcriptions, captions) named in
annotation files, prepared once into records as the rendered lines are (``image_text``), for ``ImageToTextTask``.

    annotation files + image folder ──read, grouped by image, each image found──> each split's images and texts
      ──decode in full, fit to the canvas, every core, in pieces──> <prepare.dir>/image-text-<stem>-<hash>/
        train | val | test records {"image": PNG (lines) or JPEG (photos), "file", "texts": JSON list},
        tokenizer.json, prepared.json
      records ──decode, jitter (train), encode──> {"images": (B, C, H, W), "tgt", "text", "references"}

**Layouts** (found from the file): JSONL (``{"file": "a/b.png", "text": "..."}`` a line), CSV or TSV (a header row
naming the columns ``file`` and ``text``; quoted as the csv module quotes), or COCO captions (a ``.json`` with
``"images"`` ``[{"id", "file_name"}]`` and ``"annotations"`` ``[{"image_id", "caption"}]``). The rows of one image
make one example with several texts (a COCO image of no caption is left out). Files resolve against ``images``
(default: the annotation file's folder); for ``captions_<X>.json`` also against ``<images>/<X>/`` (and, with no
``images``, ``<its folder>/../<X>/``: COCO's ``annotations/`` beside ``train2017/``).

**Webdataset shards** (as img2dataset writes them, what OpenCLIP users have): a split may instead be a ``.tar``, a
glob of them or a folder of them, each holding members ``<key>.jpg|.jpeg|.png|.webp`` with ``<key>.txt`` and/or
``<key>.json`` (its ``"caption"`` or ``"text"``; the ``.txt`` wins where both are given), one caption per image;
other members are ignored. Each shard is one piece of the preparation, read as a stream (``tarfile``'s ``r|``):
nothing of all the shards is held, not even a list of their entries. A key without a caption, a caption without an
image, a caption longer than ``max_tokens`` tokens can be (below), or an image that does not decode is a DataError
naming the shard and the key. Validation is carved by the
hash of the key as it is of a file name.

**Splits.** ``train`` is required; without ``val``, the images whose file name hashes below ``val_fraction`` are
carved from train (the same images whatever their order or number); ``test`` is optional.

**Preparation** (``prepared_folder``, once per job, named by a hash of the annotation files' contents, each image's
path, size and modification time, and the options): a missing image, a row without file or text, a COCO caption of
no image, a line longer than a text of ``max_tokens`` tokens can be (``TOKEN_BYTES`` characters a token: refused as
it is read, before it is held whole), is a DataError naming the annotation file, the row and the file, before
anything is written; each image is
decoded in full and fitted to the canvas (``fit``: "line", as a text line, ``image_files.fit_line``; "resize", a
photo) in the preparing processes, where an unreadable one is a DataError naming the same. The tokenizer is a file,
or trained on the texts (``TokenizerConfig``: "char" on every split's, "bpe" on train's). Only the annotations'
text is held in memory, never the images.

**Loading.** Training items draw their text from the image's texts by (seed, epoch, index): the next one each epoch,
so every caption is trained on; jittered and resumable as the rendered lines. Val and test come in order, ``text``
their first text and ``references`` all of them (what BLEU and exact readings are scored against).
"""

from __future__ import annotations

import contextlib
import csv
import glob
import hashlib
import io
import json
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Literal, NamedTuple

import torch
from lightning.pytorch.utilities import rank_zero_info
from PIL import UnidentifiedImageError

from lightformer.config_groups import as_config
from lightformer.data.loading.streaming import ImageLoaderConfig
from lightformer.data.modules.image_text import (
    MIN_HEIGHT,
    ImageTextRecords,
    LineImages,
    collate_lines,
    pixel_statistics,
)
from lightformer.data.pieces import SPLITS, line_pieces
from lightformer.data.preparation.caching import file_stamp
from lightformer.data.preparation.prepare import (
    TOKENIZER,
    PrepareConfig,
    TokenizerConfig,
    _tokenizer_key,
    as_tokenizer_config,
    piece_sample,
    piece_size,
    pieces,
    split_location,
    stem_of,
)
from lightformer.data.preparation.records import RecordSplit, TokenizerJob, prepare_records
from lightformer.data.sources.image_files import fit_image, load_image
from lightformer.data.sources.rendering import jpeg_bytes, png_bytes
from lightformer.errors import DataError
from lightformer.facts import DataFacts
from lightformer.io.files import sha256_of
from lightformer.nn.checks import check_at_least

FORMAT_VERSION = 2  # bump when what a prepared folder holds changes meaning (2: images as litdata File leaves)
PIECE_IMAGES = 500  # images per piece a preparing process fits and writes before taking the next
LAYOUTS = {".jsonl": "JSONL", ".csv": "CSV", ".tsv": "TSV", ".json": "COCO captions"}
SHARD_IMAGES = (".jpg", ".jpeg", ".png", ".webp")  # a webdataset sample's image members (img2dataset's)
SHARD_TEXTS = (".txt", ".json")  # its caption members (a .txt wins over a .json caption)
MAX_TOKENS = 4096  # the default of ``max_tokens``: more tokens than any text of a model here holds
# The most bytes of a file's line (or characters of a text) that one token of ``max_tokens`` may stand for: a token is
# a character or a BPE piece of a few (4 on average in English), and JSON's escapes take at most 6 bytes a character,
# so a longer line holds a text of more than ``max_tokens`` tokens, and is refused before it is parsed or held whole.
TOKEN_BYTES = 128


def is_shards(path: str) -> bool:
    """Whether a split's path names webdataset shards rather than an annotation file (of a suffix of ``LAYOUTS``): a
    ``.tar``, a glob (``*``, ``?``, ``[``), or a folder (a path of no suffix or an existing directory)."""
    suffix = Path(path).suffix.lower()
    return suffix not in LAYOUTS and (suffix == ".tar" or any(c in path for c in "*?[") or Path(path).is_dir()
                                      or not suffix)  # fmt: skip


@dataclass(frozen=True)
class ImageTextFiles:
    """A user's annotation files and images, and the canvas the images are fitted to (``data.source``).

    Args:
        train: the training annotations: ``.jsonl``, ``.csv``, ``.tsv`` (rows with ``file`` and ``text``) or a COCO
            captions ``.json``; or webdataset shards: a ``.tar``, a glob of them, or a folder of them.
        val: the validation annotations or shards; default: ``val_fraction`` of the training images.
        test: the test annotations or shards; default: no test split.
        images: the folder the annotations' file names resolve against; default: the annotation file's own.
        val_fraction: share of the training images carved out for validation (by a hash of the file name) when
            there is no ``val``; 0: no validation.
        height: the canvas's height in pixels.
        width: the canvas's width in pixels.
        channels: 1 (grey) or 3 (RGB).
        fit: "line": a text line of any size, scaled to the height (at most the width), at the left on its own
            background; "resize": a photo, resized to height × width.
        max_tokens: the most tokens a text may have: a line of an annotation file (a COCO caption, a shard's caption
            member) longer than ``max_tokens × TOKEN_BYTES`` characters is refused as it is read, naming the file
            and line, before it is held whole (the model's position table is held to the data's longest text at
            set-up).
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


# --- reading the annotations -----------------------------------------------------------------------------------


def bounded_lines(f, limit: int, too_long: Callable[[int], Exception]) -> Iterator[tuple[int, str | bytes]]:
    """(number from 1, line) of each line of an open file (text or binary), none read with more than ``limit``
    characters (bytes) besides its line break, so that memory stays bounded however long a line is; a longer line
    raises ``too_long(its number)`` before any more of it is read."""
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
    """A source's fields as its prepared folder's fingerprint holds them: ``max_tokens`` only where it is not the
    default (a bound that refuses texts and changes none: the folders prepared before it keep their names)."""
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
    """The folders an annotation file's image names resolve against, in order (see the module docstring)."""
    base = Path(images) if images else annotation.parent
    if not annotation.stem.startswith("captions_"):
        return [base]
    name = annotation.stem.removeprefix("captions_")
    return [base, base / name] + ([] if images else [annotation.parent.parent / name])


def read_annotations(path: Path, images: str | None, field: str, max_tokens: int = MAX_TOKENS) -> list[Entry]:
    """The images of an annotation file, in the order first named, each with its texts; a file that is not there,
    not of a layout, a row without file or text, a COCO caption of no image, an image not found, or a line (a COCO
    caption) longer than ``max_tokens`` tokens can be (``TOKEN_BYTES`` characters each; not read whole): a DataError
    naming ``field``, the file, the row and the image."""
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


# --- webdataset shards ----------------------------------------------------------------------------------------


def shard_files(path: str, field: str) -> list[Path]:
    """The ``.tar`` shards a split's path names (a file, a glob, a folder's ``*.tar``), sorted; none: a DataError
    naming ``field``."""
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
    """(key, image bytes (None unless ``images``), caption) of each sample of a shard, read as a stream, one sample
    at a time; a key without a caption or without an image, a caption member larger than a text of ``max_tokens``
    tokens can be (``TOKEN_BYTES`` bytes each: refused by its size, unread), or a shard that is not a tar file: a
    DataError naming ``field``, the shard and the key."""
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
    """The records {"image", "file": "<shard>/<key>", "texts"} of a shard's samples (``keep``: "train" or "val" keeps
    those ``carved`` puts there; None: all), decoded in full and fitted one at a time; an image that does not decode
    is a DataError naming the shard and the key."""
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
    """Why the bytes in ``stream`` are not an image ``load_image`` reads, in words that name no Python object (PIL's
    message holds the stream's repr, ``<_io.BytesIO object at 0x…>``): not an image, cut short, or what was said."""
    cause = error.__cause__ or error
    if isinstance(cause, UnidentifiedImageError):
        return "not an image: PIL recognises no image format in it"
    if "truncated" in str(cause).lower():
        return f"cut short: {cause}"
    return str(cause).replace(str(stream), "it")


# --- preparation and loading -----------------------------------------------------------------------------------


def image_records(piece: list[Entry], source: ImageTextFiles, annotation: str):
    """The records {"image": the fitted image's PNG or JPEG, "file", "texts": JSON list} of a piece of images, one at
    a time; an image that does not decode in full is a DataError naming the annotation file, the row and the file."""
    for entry in piece:
        try:
            image = load_image(entry.path, source.channels)
        except (OSError, ValueError) as error:
            raise DataError(f"{annotation}, {entry.row}: {error}") from None
        image = fit_image(image, source.height, source.width, source.fit)
        encoded = png_bytes(image) if source.fit == "line" else jpeg_bytes(image)  # a photo: a tenth of the bytes
        yield {"image": encoded, "file": entry.name, "texts": json.dumps(entry.texts, ensure_ascii=False)}


class CaptionedImages(LineImages):
    """A prepared split of captioned images: items as ``LineImages``'s, grey or RGB, with "references" (all the
    image's texts) and, with ``labels``, "label" (the record's class index, -1 for none); "text" is, in training
    (``cycle``), the image's next text each epoch (from (seed, epoch, index)), else its first."""

    def __init__(self, split_dir, tokenizer_json: str, augment: bool, seed: int, channels: int, cycle: bool,
                 labels: bool = False) -> None:  # fmt: skip
        super().__init__(split_dir, tokenizer_json, augment, seed)
        self.mode, self.cycle, self.labels = ("L" if channels == 1 else "RGB"), cycle, labels

    def _item(self, record: dict, index: int, epoch: int) -> dict:
        texts = json.loads(record["texts"])
        text = texts[(self.seed + epoch + index) % len(texts)] if self.cycle else texts[0]
        item = {**self._encoded(record["image"], text, index, epoch), "references": texts}
        return {**item, "label": int(record["label"])} if self.labels else item


def collate_captions(items: list[dict], mean: Iterable[float], std: Iterable[float], pad_id: int) -> dict:
    """``collate_lines``'s batch, with "labels" (B,) int64 where the items have a "label" (-1: of no class)."""
    batch = collate_lines(items, mean, std, pad_id)
    if "label" in items[0]:
        batch["labels"] = torch.tensor([item["label"] for item in items], dtype=torch.int64)
    return batch


def written_texts(folder: Path, rows: Iterable[tuple[str, list[str]]]) -> tuple[dict[str, Path], dict, dict]:
    """Each split's texts written to ``<folder>/.texts-<split>.jsonl`` ({"text"} a line) from (split, an image's
    texts) rows read once; returns the files and each split's images and texts counted."""
    files = {split: folder / f".texts-{split}.jsonl" for split in SPLITS}
    images, texts = dict.fromkeys(SPLITS, 0), dict.fromkeys(SPLITS, 0)
    with contextlib.ExitStack() as stack:
        handles = {split: stack.enter_context(open(path, "w", encoding="utf-8")) for split, path in files.items()}
        for split, image_texts in rows:
            handles[split].writelines(json.dumps({"text": t}) + "\n" for t in image_texts)
            images[split] += 1
            texts[split] += len(image_texts)
    return files, images, texts


def longest_text(tokenizer, files: Iterable[Path]) -> int:
    """The most tokens of any text of the ``.texts-*.jsonl`` files, encoded 1,024 at a time (never all held)."""
    longest = 0
    for path in files:
        with open(path, encoding="utf-8") as f:
            while batch := [json.loads(line)["text"] for line in [f.readline() for _ in range(1024)] if line]:
                longest = max(longest, *map(len, tokenizer.encode_batch(batch)))
    return longest


def prepare_captioned(
    folder: Path,
    rows: Iterable[tuple[str, list[str]]],
    record_splits: Callable[[dict[str, int]], list[RecordSplit]],
    tokenizer_config: TokenizerConfig,
    workers: int | None,
    what: str,
) -> dict:
    """A folder of captioned images through ``prepare_records``: the texts of ``rows`` ((split, an image's texts),
    read once) written to disk and sampled for the tokenizer, each split of ``record_splits(images counted)`` written
    on every core, then the longest text and the train pixels' statistics. Returns the manifest's {"images",
    "texts", "mean", "std", "longest"}."""
    files, images, texts = written_texts(folder, rows)
    text_pieces = {split: line_pieces(path) if images[split] else [] for split, path in files.items()}
    job = TokenizerJob(TOKENIZER, tokenizer_config, piece_sample(text_pieces, "text", tokenizer_config.sample_bytes))
    tokenizers, _ = prepare_records(folder, [job], lambda _: record_splits(images), ("texts",), workers)
    longest = longest_text(tokenizers[TOKENIZER], [files[split] for split in SPLITS if images[split]])
    for path in files.values():
        path.unlink()
    mean, std = pixel_statistics(folder / "train", images["train"])
    rank_zero_info(f"prepared {what}: {folder} ({', '.join(f'{s} {n:,}' for s, n in images.items())})")
    return {"images": images, "texts": texts, "mean": mean, "std": std, "longest": longest}


class ImageTextFilesDataModule(ImageTextRecords):
    """A user's own images and texts for an image-to-text model: batches {"images": (B, C, H, W) float32
    normalised, "tgt": (B, T) int64 [BOS] ids [EOS] padded with PAD, "text": B strings, "references": each image's
    texts}. See the module docstring for the layouts, splits, preparation and loading; ``data_facts()`` (after
    preparation) tells the model the tokenizer, the canvas (H, W), the channels, each channel's mean and std, and the
    longest ``tgt``.

    Args:
        source: the annotation files, the image folder and the canvas (``ImageTextFiles``).
        tokenizer: a tokenizer file, or the kind trained on the texts (``TokenizerConfig``; default: characters).
        loader: images per batch, loader workers, pinned memory (``ImageLoaderConfig``).
        prepare: where and with how many processes the images are prepared (``PrepareConfig``).
        augment: jitter training images (brightness, contrast, a shift of a pixel or two); never val or test.
        seed: seeds the training order, jitter and which text of an image each epoch trains on.
    """

    counted = "images"

    def __init__(
        self,
        source: ImageTextFiles,
        tokenizer: TokenizerConfig = TokenizerConfig(),
        loader: ImageLoaderConfig = ImageLoaderConfig(batch_size=64),
        prepare: PrepareConfig = PrepareConfig(),
        augment: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(loader, prepare, augment, seed)
        self.save_hyperparameters()
        self.source = as_config(ImageTextFiles, source)
        self.tokenizer_config = as_tokenizer_config(tokenizer, TokenizerConfig())
        self.tokenizer_config.check_used_by("ImageTextFilesDataModule")

    def data_facts(self) -> DataFacts:
        tokenizer, manifest = self.tokenizer, self.manifest
        return DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                         image_size=(self.source.height, self.source.width), in_channels=self.source.channels,
                         image_fit=self.source.fit,
                         normalize_mean=tuple(manifest["mean"]), normalize_std=tuple(manifest["std"]),
                         max_length=manifest["longest"] + 2)  # fmt: skip

    def _stem(self) -> str:
        return f"image-text-{stem_of([Path(self.source.train)])}"

    def splits(self) -> dict[str, list[Entry]]:
        """Each split's images and texts, read from the annotation files (val carved from train when not given); a
        split of webdataset shards has none here (``shards``)."""
        s = self.source
        splits = {split: read_annotations(Path(getattr(s, split)), s.images, split, s.max_tokens)
                  if getattr(s, split) and not is_shards(getattr(s, split)) else [] for split in SPLITS}  # fmt: skip
        if not s.val and s.val_fraction and not is_shards(s.train):
            train = splits["train"]
            splits["val"] = [entry for entry in train if carved(entry.name, s.val_fraction)]
            splits["train"] = [entry for entry in train if not carved(entry.name, s.val_fraction)]
            if not splits["val"] or not splits["train"]:
                raise DataError(
                    f"data.source.val_fraction={s.val_fraction} carves {len(splits['val'])} of the {len(train)} "
                    "training images for validation: give more images, a data.source.val file, or another fraction "
                    "(0: no validation)"
                )
        return splits

    def shards(self) -> dict[str, list[Path]]:
        """The webdataset shards of each split given as shards (``shard_files``)."""
        s = self.source
        return {split: shard_files(getattr(s, split), split) for split in SPLITS
                if getattr(s, split) and is_shards(getattr(s, split))}  # fmt: skip

    def _carves_shards(self) -> bool:
        """Whether validation is carved from the training shards (by the hash of each sample's key)."""
        return not self.source.val and bool(self.source.val_fraction) and is_shards(self.source.train)

    def _fingerprint(self) -> dict:
        """What the records depend on: the annotation files' contents, each image's path, size and modification
        time (hashed as they are read: not held), each shard's path, size and modification time, the options, the
        tokenizer's."""
        self._entries = splits = self.splits()  # read once: what ``_build`` prepares
        self._shards = shards = self.shards()
        annotations = {split: sha256_of(getattr(self.source, split)) for split in SPLITS
                       if getattr(self.source, split) and split not in shards}  # fmt: skip
        images = hashlib.sha256()
        for split in SPLITS:
            for entry in splits[split]:
                images.update(json.dumps([split, *file_stamp(Path(entry.path))]).encode())
        stamps = {"shards": {split: [file_stamp(path) for path in paths] for split, paths in shards.items()}}
        return {"format": FORMAT_VERSION, "annotations": annotations, "images": images.hexdigest(),
                **(stamps if shards else {}), "source": source_key(self.source),
                "tokenizer": _tokenizer_key(self.tokenizer_config, ())}  # fmt: skip

    def _rows(self) -> Iterator[tuple[str, list[str]]]:
        """(split, an image's texts) of every image: the annotations' entries, then the shards' samples, read as a
        stream (the carved ones as val)."""
        for split in SPLITS:
            for entry in self._entries[split]:
                yield split, entry.texts
        carve, fraction = self._carves_shards(), self.source.val_fraction
        for split, paths in self._shards.items():
            for path in paths:
                for key, _, caption in shard_samples(path, split, images=False, max_tokens=self.source.max_tokens):
                    yield ("val" if carve and split == "train" and carved(key, fraction) else split), [caption]

    def _build(self, folder: Path) -> dict:
        """``prepared_folder``'s build through ``prepare_captioned``: the tokenizer, each split's records in pieces
        (of images; of shards, one a piece) on every core; then the train pixels' statistics, the longest text; what
        it returns goes into the manifest."""
        splits, shards, workers = self._entries, self._shards, self.prepare_config.num_workers
        carve = self._carves_shards()

        def record_splits(images: dict[str, int]) -> list[RecordSplit]:
            if carve and not (images["val"] and images["train"]):
                raise DataError(
                    f"data.source.val_fraction={self.source.val_fraction} carves {images['val']} of the "
                    f"{images['val'] + images['train']} training images of the shards for validation: give more "
                    "images, a data.source.val, or another fraction (0: no validation)"
                )
            out = []
            for split, entries in splits.items():
                if entries:
                    records = partial(image_records, source=self.source, annotation=self._annotation(split))
                    out.append(RecordSplit(split, pieces(entries, piece_size(len(entries), PIECE_IMAGES, workers)),
                                           records, expected=len(entries)))  # fmt: skip
                elif images[split] and (split in shards or carve and split == "val"):
                    field = split if split in shards else "train"
                    keep = ("train" if split == "train" else "val") if carve and field == "train" else None
                    out.append(RecordSplit(split, [str(path) for path in shards[field]],
                                           partial(shard_records, field=field, keep=keep,
                                                   fraction=self.source.val_fraction, source=self.source),
                                           expected=images[split]))  # fmt: skip
            return out

        return prepare_captioned(folder, self._rows(), record_splits, self.tokenizer_config, workers,
                                 "image-text files")  # fmt: skip

    def _annotation(self, split: str) -> str:
        """The option and annotation file a split's images come from (val's: train's, when carved), for errors."""
        return f"data.source.{split}: {getattr(self.source, split) or self.source.train}"

    def dataset(self, split: str) -> CaptionedImages:
        """A prepared split's images, its shards checked."""
        if split not in self.datasets:
            if not self.manifest["images"][split]:
                raise DataError(f"data.source: there is no {split} split; give data.source.{split}")
            self.datasets[split] = CaptionedImages(
                split_location(self.prepared, split), self.tokenizer.to_str(), self.augment and split == "train",
                self.seed, self.source.channels, cycle=split == "train",
            )  # fmt: skip
        return self.datasets[split]
