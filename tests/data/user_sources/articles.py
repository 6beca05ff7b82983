"""A language model's corpus of CSV files: the ``column`` of each row is one document (a user's own source)."""

import csv
from collections.abc import Iterator
from dataclasses import dataclass

from lightformer.data.sources import Source, file_stamps, hashed


@dataclass(frozen=True)
class CsvArticles(Source):
    """The rows of ``files``; a row's ``key`` column hashes it into val (``val_fraction`` of them) or train."""

    files: tuple[str, ...]
    column: str = "body"
    key: str = "id"
    val_fraction: float = 0.1
    splits = ("train", "val")

    def fingerprint(self) -> dict:
        return {"files": file_stamps(self.files), "column": self.column, "key": self.key, "val": self.val_fraction}

    def records(self, split: str) -> Iterator[dict]:
        for path in self.files:
            with open(path, newline="", encoding="utf-8") as file:
                for row in csv.DictReader(file):
                    text = (row.get(self.column) or "").strip()
                    if text and ("val" if hashed(row[self.key], self.val_fraction) else "train") == split:
                        yield {"text": text}
