"""Raw text files read in bounded pieces, and their train | val | test cut (docs/data.md, "What preparation does")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Literal

from lightformer.errors import DataError
from lightformer.io.files import expand_patterns, not_utf8

Format = Literal["text", "jsonl", "parquet"]
Split = Literal["end", "each_file"]
SPLITS = ("train", "val", "test")
SPLIT_PREFIX = {"train": "", "val": "val_", "test": "test_"}  # of each split's own options: tsv_files, val_tsv_files
PIECE_BYTES = 8 << 20  # the most bytes of one piece: what one preparation worker holds at a time
_FORMAT_OF_SUFFIX = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
_SEARCH_BYTES = 1 << 16  # how far a text cut looks for a line break before it cuts between two characters


def stage_splits(stage: str | None) -> tuple[str, ...]:
    """The splits a Lightning stage reads ("fit": train and val; None: all of them)."""
    return {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ()}.get(stage, SPLITS)


def format_of(path: str | Path) -> Format:
    """A file's format by its suffix: ``.jsonl`` / ``.ndjson`` → jsonl, ``.parquet`` / ``.pq`` → parquet, else text."""
    return _FORMAT_OF_SUFFIX.get(Path(path).suffix.lower(), "text")


def resolve_files(patterns: list[str], field_name: str) -> list[Path]:
    """The files named by paths, globs (``**`` allowed) and folders, in order; one matching nothing is refused."""
    expanded = []
    for pattern in patterns:
        if Path(pattern).is_dir():
            files = sorted(p for p in Path(pattern).rglob("*") if p.is_file() and not p.name.startswith("."))
            if not files:
                raise FileNotFoundError(f"{field_name}: the folder {pattern!r} holds no file")
            expanded.extend(files)
        else:
            expanded.extend(expand_patterns([pattern], field_name))
    return expanded


@dataclass(frozen=True)
class Piece:
    """A part of one file read on its own: bytes [start, end) of text or JSONL, rows of Parquet; ``file_end``: last."""

    path: str
    format: Format
    start: int
    end: int
    file_end: bool

    @property
    def weight(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class FileSpan:
    """A file with its extent in the units its pieces use (bytes, or rows for Parquet) and its size in bytes."""

    path: Path
    format: Format
    extent: int
    size: int = field(default=0)

    @classmethod
    def of(cls, path: Path) -> FileSpan:
        kind = format_of(path)
        size = path.stat().st_size
        return cls(path, kind, parquet_rows(path) if kind == "parquet" else size, size)

    def bytes_per_unit(self) -> float:
        return self.size / self.extent if self.extent else 0.0


def parquet_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception as error:  # pyarrow raises ArrowInvalid and OSError for a file that is not Parquet
        raise DataError(f"{path} is not a readable Parquet file: {error}") from None


def align(span: FileSpan, position: int) -> int:
    """The first line's or row's start at or after ``position`` (no line break within 64 KiB: the next character)."""
    if span.format == "parquet" or position <= 0 or position >= span.extent:
        return min(max(position, 0), span.extent)
    with open(span.path, "rb") as f:
        f.seek(position - 1)
        scanned = 0
        while True:
            block = f.read(_SEARCH_BYTES)
            if not block:
                return span.extent
            found = block.find(b"\n")
            if found >= 0:
                return position + scanned + found
            scanned += len(block)
            if span.format == "text" and scanned >= _SEARCH_BYTES:
                break
        f.seek(position)
        block = f.read(4)  # a UTF-8 character is at most 4 bytes; skip its continuation bytes (10xxxxxx)
        return position + next((i for i, byte in enumerate(block) if byte & 0xC0 != 0x80), len(block))


def pieces_of(span: FileSpan, start: int, end: int, piece_bytes: int = PIECE_BYTES) -> list[Piece]:
    """[start, end) of a file (aligned places) cut into pieces of about ``piece_bytes`` at aligned places."""
    step = max(1, int(piece_bytes / span.bytes_per_unit())) if span.bytes_per_unit() else span.extent or 1
    pieces, position = [], start
    while position < end:
        stop = min(end, align(span, position + step)) if position + step < end else end
        pieces.append(Piece(str(span.path), span.format, position, stop, stop == span.extent))
        position = stop
    return pieces


def split_pieces(
    train: list[Path],
    held_out: dict[str, list[Path]],
    val_fraction: float,
    test_fraction: float,
    piece_bytes: int = PIECE_BYTES,
    cut: Split = "end",
) -> dict[str, list[Piece]]:
    """Each split's pieces: ``held_out``'s val and test files, else the end of the train files (``cut``)."""
    spans = [FileSpan.of(path) for path in train]
    fractions = {
        split: 0.0 if held_out.get(split) else fraction
        for split, fraction in (("val", val_fraction), ("test", test_fraction))
    }

    def cut_points(total: int) -> list[int]:  # in bytes of ``total`` bytes: train | val | test
        return [total - int(total * (fractions["val"] + fractions["test"])), total - int(total * fractions["test"])]

    result: dict[str, list[Piece]] = {split: [] for split in SPLITS}
    offset, cuts = 0, cut_points(sum(span.size for span in spans))
    for span in spans:
        unit = span.bytes_per_unit() or 1.0
        if cut == "each_file":
            offset, cuts = 0, cut_points(span.size)
        bounds = [0]
        for point in cuts:  # the split boundaries inside this file, in its own units
            local = min(max(int((point - offset) / unit), 0), span.extent)
            bounds.append(max(bounds[-1], align(span, local)))
        bounds.append(span.extent)
        for split, (lo, hi) in zip(SPLITS, zip(bounds, bounds[1:], strict=False), strict=True):
            result[split] += pieces_of(span, lo, hi, piece_bytes)
        offset += span.size
    for split in ("val", "test"):
        for path in held_out.get(split) or []:
            span = FileSpan.of(path)
            result[split] += pieces_of(span, 0, span.extent, piece_bytes)
    return result


def read_piece(piece: Piece, text_field: str = "text", limit: int | None = None) -> Iterator[str]:
    """The text of a piece: one string for text, one per record for JSONL and Parquet; ``limit``: bytes, about."""
    if piece.format == "parquet":
        yield from _parquet_texts(piece, text_field, limit)
        return
    end = piece.end if limit is None else min(piece.end, piece.start + limit)
    with open(piece.path, "rb") as f:
        f.seek(piece.start)
        data = f.read(end - piece.start)
    if limit is not None and end < piece.end:  # a sample stops at the end of its last whole line
        data = data[: data.rfind(b"\n") + 1] if b"\n" in data else data[: _last_character_start(data)]
    if piece.format == "text":
        text = _decode(data, piece.path, piece.start).removeprefix("\ufeff" if piece.start == 0 else "")
        yield text + ("\n" if piece.file_end and limit is None and text and not text.endswith("\n") else "")
        return
    offset = piece.start
    for line in data.split(b"\n"):
        if line.strip():
            yield _record_text(_decode(line, piece.path, offset), text_field, piece.path, offset)
        offset += len(line) + 1


def _decode(data: bytes, path: str, offset: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise not_utf8(path, data, error, offset) from None


def _last_character_start(data: bytes) -> int:
    """Where the last (possibly incomplete) UTF-8 character of ``data`` starts: ``data[:it]`` decodes whole."""
    end = len(data)
    while end > 0 and data[end - 1] & 0xC0 == 0x80:  # continuation bytes, 10xxxxxx
        end -= 1
    return end - 1 if end > 0 and data[end - 1] >= 0xC0 else end


def line_pieces(path: Path, piece_bytes: int | None = None) -> list[Piece]:
    """A file of lines cut into pieces of about ``piece_bytes`` (``PIECE_BYTES``) at line breaks, as JSONL is."""
    span = FileSpan(Path(path), "jsonl", Path(path).stat().st_size, Path(path).stat().st_size)
    return pieces_of(span, 0, span.extent, piece_bytes or PIECE_BYTES)


def piece_lines(piece: Piece, what: str, limit: int | None = None) -> list[str]:
    """The lines of a piece of a UTF-8 file, split on "\\n" only, "\\r" and a BOM dropped; not UTF-8: a DataError."""
    end = piece.end if limit is None else min(piece.end, piece.start + limit)
    with open(piece.path, "rb") as f:
        f.seek(piece.start)
        data = f.read(end - piece.start)
    if end < piece.end:
        data = data[: data.rfind(b"\n") + 1]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = first_line(piece) + data.count(b"\n", 0, error.start)
        raise not_utf8(piece.path, data, error, piece.start, line, what) from None
    lines = (text.removeprefix("\ufeff") if piece.start == 0 else text).split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start another
    return [line.removesuffix("\r") for line in lines]


def first_line(piece: Piece) -> int:
    """The number (from 1) of a piece's first line in its file, counted when asked (an error's: reads up to it)."""
    breaks, position = 0, 0
    with open(piece.path, "rb") as f:
        while position < piece.start:
            block = f.read(min(1 << 20, piece.start - position))
            if not block:
                break
            breaks, position = breaks + block.count(b"\n"), position + len(block)
    return breaks + 1


@dataclass(frozen=True)
class AlignedPiece:
    """The same lines of two line-aligned files (line i translates line i): their byte ranges ``src`` and ``tgt``."""

    src: Piece
    tgt: Piece

    @property
    def weight(self) -> int:
        return self.src.weight + self.tgt.weight


def aligned_pieces(src_path: Path, tgt_path: Path, piece_bytes: int | None = None) -> list[AlignedPiece]:
    """Two line-aligned files cut into aligned line ranges of about ``piece_bytes``; unequal line counts an error."""
    piece_bytes = piece_bytes or PIECE_BYTES
    paths, sizes = (Path(src_path), Path(tgt_path)), (Path(src_path).stat().st_size, Path(tgt_path).stat().st_size)

    def aligned(start: tuple[int, int], end: list[int]) -> AlignedPiece:
        src, tgt = (Piece(str(paths[i]), "text", start[i], end[i], end[i] == sizes[i]) for i in (0, 1))
        return AlignedPiece(src, tgt)

    pieces, lines, cut, position = [], 0, (0, 0), [0, 0]
    with open(paths[0], "rb") as src, open(paths[1], "rb") as tgt:
        for src_line, tgt_line in zip_longest(src, tgt):
            if src_line is None or tgt_line is None:
                src_lines = lines + (src_line is not None) + sum(1 for _ in src)
                tgt_lines = lines + (tgt_line is not None) + sum(1 for _ in tgt)
                raise ValueError(
                    f"the line-aligned files differ in length: {paths[0]} has {src_lines} lines, {paths[1]} has "
                    f"{tgt_lines}; line i of one must translate line i of the other"
                )
            lines += 1
            position[0] += len(src_line)
            position[1] += len(tgt_line)
            if max(position[0] - cut[0], position[1] - cut[1]) >= piece_bytes:
                pieces.append(aligned(cut, position))
                cut = tuple(position)
    if position[0] > cut[0] or position[1] > cut[1]:
        pieces.append(aligned(cut, position))
    return pieces


def _record_text(line: str, text_field: str, path: str, offset: int) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataError(f"{path}: the line at byte offset {offset} is not JSON: {error}") from None
    if isinstance(record, dict) and text_field in record and not isinstance(record[text_field], str):
        found = _JSON_KINDS.get(type(record[text_field]), type(record[text_field]).__name__)
        raise DataError(
            f"{path}: the record at byte offset {offset} has {found} in its text field {text_field!r}, not a string; "
            f"set data.source.text_field to the field that holds the text (its fields: {sorted(record)})"
        )
    if not isinstance(record, dict) or text_field not in record:
        found = f"fields {sorted(record)}" if isinstance(record, dict) else f"a {type(record).__name__}"
        raise DataError(
            f"{path}: the record at byte offset {offset} has no text field {text_field!r} (found {found}); set "
            "data.source.text_field to the field that holds the text"
        )
    return record[text_field]


_JSON_KINDS = {int: "a number", float: "a number", bool: "true or false", list: "a list", dict: "an object",
               type(None): "null"}  # fmt: skip


def _parquet_texts(piece: Piece, text_field: str, limit: int | None) -> Iterator[str]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(piece.path)
    schema = parquet.schema_arrow
    if text_field not in schema.names:
        raise DataError(
            f"{piece.path} has no column {text_field!r} (its columns: {schema.names}); set "
            "data.source.text_field to the column that holds the text"
        )
    kind = schema.field(text_field).type
    if not _is_string(kind):
        columns = ", ".join(f"{column.name}: {column.type}" for column in schema)
        raise DataError(
            f"{piece.path}: the column {text_field!r} holds {kind} values, but the text must be strings; set "
            f"data.source.text_field to a column of strings (its columns: {columns})"
        )
    row, read = 0, 0
    for batch in parquet.iter_batches(batch_size=1024, columns=[text_field]):
        lo, hi = max(piece.start - row, 0), min(piece.end - row, len(batch))
        row += len(batch)
        if hi <= lo:
            if row >= piece.end:
                return
            continue
        for text in batch.column(0).slice(lo, hi - lo).to_pylist():
            if text is None:
                continue
            yield text
            read += len(text)
            if limit is not None and read >= limit:
                return
        if row >= piece.end:
            return


def _is_string(kind) -> bool:
    """Whether a Parquet column of Arrow type ``kind`` holds strings (also dictionary-encoded ones)."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
