"""A user's LLaVA conversation files (``ConversationFiles``): read in pieces, checked, their images fitted."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from PIL import Image

from lightformer.data.objectives.chat import ChatTemplate
from lightformer.data.pieces import SPLITS
from lightformer.data.preparation.prepare import worker_tokenizer
from lightformer.data.sources.captions import MAX_TOKENS, TOKEN_BYTES, bounded_lines, carved, line_too_long
from lightformer.data.sources.image_files import fit_image, load_image
from lightformer.data.sources.rendering import jpeg_bytes
from lightformer.errors import DataError
from lightformer.nn.checks import check_at_least

PIECE_RECORDS = 500  # records per piece a preparing process reads and writes before taking the next
PAD_COLOUR = (122, 116, 104)  # CLIP's mean colour (0.4815, 0.4578, 0.4082), which LLaVA-1.5 pads images with
ROLES = ("human", "gpt")


@dataclass(frozen=True)
class ConversationFiles:
    """A user's conversation files and the canvas (``data.source``).

    Args:
        train: the training file: ``.jsonl`` (one record a line) or ``.json`` (a list of records; read whole).
        val: the validation file; default: ``val_fraction`` of the training records.
        test: the test file; default: no test split.
        image_folder: the folder the records' "image" paths resolve against; default: each file's own folder.
        val_fraction: share of the training records carved out for validation when there is no ``val``.
        image_size: the square canvas's side in pixels, a multiple of 16.
        fit: "resize" (stretched to the square) or "pad" (LLaVA-1.5's: padded to a square, then resized).
        max_tokens: the most ids a record may have (its turns in the chat template, BOS, EOS, the image's place).
    """

    train: str
    val: str | None = None
    test: str | None = None
    image_folder: str | None = None
    val_fraction: float = 0.05
    image_size: int = 64
    fit: Literal["resize", "pad"] = "resize"
    max_tokens: int = MAX_TOKENS

    def __post_init__(self) -> None:
        for split in SPLITS:
            path = getattr(self, split)
            if path is not None and Path(path).suffix.lower() not in (".jsonl", ".json"):
                raise ValueError(f"data.source.{split}={path!r} is not a conversation file; valid: a .jsonl file of "
                                 "LLaVA records, or a .json list of them")  # fmt: skip
        if not 0 <= self.val_fraction < 1:
            raise ValueError(f"data.source.val_fraction={self.val_fraction} must be in [0, 1)")
        if self.image_size < 16 or self.image_size % 16:
            raise ValueError(f"data.source.image_size={self.image_size} must be a positive multiple of 16 (the patch "
                             "grid: patch 8 × pixel shuffle 2)")  # fmt: skip
        if self.fit not in ("resize", "pad"):
            raise ValueError(f"data.source.fit={self.fit!r} is not a way to fit an image; valid: 'resize', 'pad'")
        check_at_least("data.source.max_tokens", self.max_tokens, 1)


def pad_square(image: Image.Image, colour: tuple[int, int, int] = PAD_COLOUR) -> Image.Image:
    """An RGB image centred on a square of ``colour`` whose side is its longer side (LLaVA-1.5's ``expand2square``)."""
    side = max(image.size)
    canvas = Image.new("RGB", (side, side), colour)
    canvas.paste(image, ((side - image.width) // 2, (side - image.height) // 2))
    return canvas


def read_pieces(path: Path, field: str, max_tokens: int = MAX_TOKENS) -> list[tuple[str, int, int, int]]:
    """A file's pieces (path, byte offset or list index, first line number, records) of at most ``PIECE_RECORDS``."""
    if not path.is_file():
        raise DataError(f"data.source.{field}: {path} does not exist; give a .jsonl or .json file of LLaVA records")
    found = []
    if path.suffix.lower() == ".json":
        count = len(_json_list(path, field))
        return [(str(path), start, start, min(PIECE_RECORDS, count - start))
                for start in range(0, count, PIECE_RECORDS)]  # fmt: skip
    limit, where = max_tokens * TOKEN_BYTES, f"data.source.{field}: {path}"

    def too_long(number: int) -> DataError:
        return line_too_long(f"{where}, line {number}", limit, max_tokens, "bytes")

    with path.open("rb") as f:
        offset = 0
        for number, line in bounded_lines(f, limit, too_long):
            if line.strip():
                if not found or found[-1][3] >= PIECE_RECORDS:
                    found.append((str(path), offset, number, 0))
                found[-1] = (*found[-1][:3], found[-1][3] + 1)
            offset += len(line)
    return found


def _json_list(path: Path, field: str) -> list:
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"data.source.{field}: {path} is not a readable JSON file ({error})") from None
    if not isinstance(data, list):
        raise DataError(f"data.source.{field}: {path} is not a JSON list of LLaVA records")
    return data


def piece_entries(piece: tuple[str, int, int, int], field: str):
    """The (where, record) of a piece: ``where`` names the file and line (or list index) and the field."""
    path, start, number, count = piece
    if path.lower().endswith(".json"):
        for i, record in enumerate(_json_list(Path(path), field)[start : start + count]):
            yield f"data.source.{field}: {path}, record {start + i}", record
        return
    with open(path, "rb") as f:
        f.seek(start)
        done = 0
        while done < count:
            line = f.readline()
            if line.strip():
                where = f"data.source.{field}: {path}, line {number}"
                try:
                    yield where, json.loads(line.decode("utf-8-sig"))
                except (UnicodeDecodeError, json.JSONDecodeError) as error:
                    raise DataError(f"{where} is not a JSON record ({error})") from None
                done += 1
            number += 1


def turns_of(record: object, where: str, max_tokens: int = MAX_TOKENS) -> list[tuple[str, str]]:
    """A record's (question, answer) turns, or a DataError naming where and which field is wrong (or too long)."""
    if not isinstance(record, dict):
        raise DataError(f"{where} is not a JSON object with 'image' and 'conversations'")
    if not isinstance(record.get("image"), str) or not record["image"]:
        raise DataError(f"{where}: field 'image' is missing or not a path; every record needs an image")
    conversations = record.get("conversations")
    if not isinstance(conversations, list) or not conversations:
        raise DataError(f"{where}: field 'conversations' is missing or empty; give a list of turns")
    for i, turn in enumerate(conversations):
        if not isinstance(turn, dict) or turn.get("from") != ROLES[i % 2] or not isinstance(turn.get("value"), str):
            got = turn.get("from") if isinstance(turn, dict) else turn
            raise DataError(f"{where}: field conversations[{i}].from is {got!r}, expected {ROLES[i % 2]!r} with a "
                            "string 'value' (the turns go human, gpt, human, gpt, ...)")  # fmt: skip
    if len(conversations) % 2:
        raise DataError(f"{where}: field conversations[{len(conversations) - 1}] is a question with no answer; the "
                        "turns go human, gpt, ... and end with gpt")  # fmt: skip
    if sum(len(turn["value"]) for turn in conversations) > max_tokens * TOKEN_BYTES:
        raise line_too_long(f"{where}: field conversations", max_tokens * TOKEN_BYTES, max_tokens)
    return [(conversations[i]["value"], conversations[i + 1]["value"]) for i in range(0, len(conversations), 2)]


def _keep(record: dict, keep: str | None, fraction: float) -> bool:
    return keep is None or carved(record["image"], fraction) == (keep == "val")


def conversation_records(piece, field: str, keep: str | None, source: ConversationFiles, template: ChatTemplate,
                         tokenizer_json: str):  # fmt: skip
    """The records {"image": JPEG, "turns", "group": 0} of a piece (``keep``: of a carved file); returns the longest."""
    tokenizer, longest = worker_tokenizer(tokenizer_json), 0
    folder = Path(source.image_folder) if source.image_folder else Path(piece[0]).parent
    for where, record in piece_entries(piece, field):
        turns = turns_of(record, where, source.max_tokens)
        if not _keep(record, keep, source.val_fraction):
            continue
        try:
            ids = template.encode(tokenizer, turns, tokenizer.vocab_size)[0]
        except DataError as error:
            raise DataError(f"{where}: field conversations: {error}") from None
        if len(ids) > source.max_tokens:
            raise DataError(
                f"{where}: the record is {len(ids):,} tokens long (its turns in the chat template, BOS, EOS and the "
                f"image's place counted), more than data.source.max_tokens={source.max_tokens}: shorten its "
                "conversation or split it into records, or raise data.source.max_tokens (model.net.text.block_size "
                "must hold a record's tokens and its image's)"
            )
        path = folder / record["image"]
        try:
            image = load_image(path, 3)
        except (OSError, ValueError) as error:
            raise DataError(f"{where}: field 'image' {record['image']!r} does not load from {path} ({error})") from None
        image = pad_square(image) if source.fit == "pad" else image
        image = fit_image(image, source.image_size, source.image_size, "resize")
        longest = max(longest, len(ids))
        yield {"image": jpeg_bytes(image), "turns": json.dumps(turns, ensure_ascii=False), "group": 0}
    return {"longest": longest}
