"""``TextSource``: where a text corpus comes from, and how it splits into train | val | test."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from lightformer.data import pieces as bounded
from lightformer.data.pieces import Piece, Split, format_of, split_pieces
from lightformer.data.sources import check_one_source
from lightformer.errors import DataError


@dataclass(frozen=True)
class TextSource:
    """Where a text corpus comes from, and how it splits into train | val | test.

    Args:
        train_files: training text: files, globs or folders; ``.jsonl`` and ``.parquet`` records, others plain UTF-8.
        val_files: validation text; default: the last ``val_fraction`` of the training text.
        test_files: test text; default: the last ``test_fraction`` of the training text.
        corpus: "austen": Jane Austen's six novels (4.0 M characters, a Debian package's, into ``<data_root>/austen``).
        url: download the training text from this URL into ``<data_root>/downloads/``.
        sha256: the expected SHA-256 (hex) of the file at ``url``; None skips the check.
        text_field: the field (JSONL) or column (Parquet) that holds each record's text.
        val_fraction: share of the training text held out for validation, in [0, 1), when no ``val_files``.
        test_fraction: share held out for testing, in [0, 1), when no ``test_files``.
        split: where val and test are cut from the training files: "end" (of them all) or "each_file" (of each).
        data_root: where built-in and downloaded corpora are stored.
    """

    train_files: list[str] | None = None
    val_files: list[str] | None = None
    test_files: list[str] | None = None
    corpus: str | None = None
    url: str | None = None
    sha256: str | None = None
    text_field: str = "text"
    val_fraction: float = 0.1
    test_fraction: float = 0.0
    split: Split = "end"
    data_root: str = "data"

    def __post_init__(self) -> None:
        check_one_source({name: getattr(self, name) is not None for name in ("train_files", "corpus", "url")},
                         "training text: train_files (files, globs or folders), corpus ('austen') or url")  # fmt: skip
        if self.corpus not in (None, "austen"):
            raise ValueError(f"data.source.corpus={self.corpus!r} is not a built-in corpus; valid: 'austen'")
        if self.split not in get_args(Split):
            raise ValueError(f"data.source.split={self.split!r} is not a way to split; valid: {get_args(Split)}")
        for name in ("val_fraction", "test_fraction"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"data.source.{name}={getattr(self, name)} must be in [0, 1)")
        held_out = (self.val_fraction if not self.val_files else 0) + (self.test_fraction if not self.test_files else 0)
        if held_out >= 1:
            raise ValueError(
                f"data.source: val_fraction={self.val_fraction} + test_fraction={self.test_fraction} leaves no "
                "training text; their sum must be below 1"
            )

    def pieces(self, files: dict[str, list[Path]], piece_bytes: int | None = None) -> dict[str, list[Piece]]:
        """Each split's pieces, of ``files`` (each split's files: ``corpora.source_files``)."""
        fractions = (self.val_fraction, self.test_fraction)
        return split_pieces(files["train"], files, *fractions, piece_bytes or bounded.PIECE_BYTES, self.split)

    def check_held_out(self, files: dict[str, list[Path]], pieces: dict[str, list[Piece]]) -> None:
        """Refuse a ``val_fraction`` or ``test_fraction`` that left its split empty (cut only between lines)."""
        for split, fraction in (("val", self.val_fraction), ("test", self.test_fraction)):
            if fraction > 0 and not files[split] and not pieces[split]:
                unit = "line breaks" if all(format_of(path) == "text" for path in files["train"]) else "records"
                raise DataError(
                    f"data.source.{split}_fraction={fraction} gives an empty {split} split: the training text is cut "
                    f"only between {unit}, and {', '.join(str(path) for path in files['train'])} has too few for "
                    f"{fraction:.0%} of it; give more text, the split's own files (data.source.{split}_files), or "
                    f"data.source.{split}_fraction=0 for no {split} split"
                )
