"""Labelled texts (``PassageSource``): Austen's passages or TSV lines (docs/data.md, "Labelled texts")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from lightformer.data.pieces import SPLIT_PREFIX, SPLITS, Piece, line_pieces, piece_lines
from lightformer.data.preparation.prepare import pieces, worker_tokenizer
from lightformer.data.sources.corpora import split_of_line
from lightformer.io.files import as_list, expand_patterns
from lightformer.nn.checks import check_at_least

EXAMPLES_PER_INPUT = 1024  # Austen passages per input of the encoding processes


def text_and_label(line: str) -> tuple[str, str, bool]:
    """(text, label, whether the line has a tab) of a "text<TAB>label" line: the label follows the LAST tab."""
    text, tab, label = line.rpartition("\t")
    return text.strip(), label.strip(), bool(tab)


def read_labelled_tsv(path: str | Path, what: str = "data.source.tsv_files") -> Iterator[tuple[str, str, int]]:
    """(text, label, line number) of each non-blank "text<TAB>label" line of a UTF-8 file; a bad one a ValueError."""
    number = 0
    for piece in line_pieces(Path(path)):
        for line in piece_lines(piece, what):
            number += 1
            if not line.strip():
                continue
            text, label, tab = text_and_label(line)
            if not tab:
                raise ValueError(
                    f"{what}: {path}, line {number}: no tab; each line must be 'text<TAB>label' (line starts "
                    f"{line[:60]!r})"
                )
            if not text or not label:
                empty = "text" if not text else "label"
                raise ValueError(f"{what}: {path}, line {number}: the {empty} is empty; each line is 'text<TAB>label'")
            yield text, label, number


def scan_tsv(files: dict[str, list[Path]]) -> tuple[list[str], dict[str, list[int]]]:
    """The first pass over the TSV files: every line checked, the class names (sorted), each split's class counts."""
    held_out = frozenset(split for split in ("val", "test") if not files[split])
    counts: dict[str, Counter] = {split: Counter() for split in SPLITS}
    for path in files["train"]:
        for text, label, _ in read_labelled_tsv(path, "data.source.tsv_files"):
            counts[split_of_line(text, "train", held_out)][label] += 1
    labels = set().union(*counts.values())
    if not labels:
        raise ValueError(f"data.source.tsv_files: no labelled line in {', '.join(map(str, files['train']))}")
    class_names = sorted(labels)
    if len(class_names) < 2:
        raise ValueError(
            f"data.source.tsv_files: every line has the label {class_names[0]!r}; a classifier needs two or more"
        )
    for split in ("val", "test"):
        option = f"data.source.{SPLIT_PREFIX[split]}tsv_files"
        for path in files[split]:
            for _, label, number in read_labelled_tsv(path, option):
                if label not in labels:
                    raise ValueError(
                        f"{option}: {path}, line {number}: the label {label!r} is not one of the training labels "
                        f"{class_names}"
                    )
                counts[split][label] += 1
    return class_names, {split: [counts[split][name] for name in class_names] for split in SPLITS}


def tsv_examples(
    piece: Piece, split: str, held_out: frozenset[str], class_names: list[str], limit: int | None = None
) -> list[tuple[str, int]]:
    """The (text, class index) examples of a piece that go to ``split``; ``limit``: about this many bytes of it."""
    index = {name: i for i, name in enumerate(class_names)}
    file_split = "train" if split in held_out else split
    examples = []
    for line in piece_lines(piece, "data.source.tsv_files", limit):
        if line.strip():
            text, label, _ = text_and_label(line)
            if split_of_line(text, file_split, held_out) == split:
                examples.append((text, index[label]))
    return examples


def example_records(examples: list[tuple[str, int]], tokenizer_json: str) -> Iterator[dict]:
    """The records of (text, class index) examples: {"ids": [CLS] tokens [SEP] (int32, whole), "label"}."""
    encoded = worker_tokenizer(tokenizer_json).encode_batch([text for text, _ in examples], add_bos=True, add_eos=True)
    for ids, (_, label) in zip(encoded, examples, strict=True):
        yield {"ids": np.asarray(ids, dtype=np.int32), "label": label}


def tsv_records(
    piece: Piece, split: str, held_out: frozenset[str], class_names: list[str], tokenizer_json: str
) -> Iterator[dict]:
    """The records of a TSV piece's examples that go to ``split`` (``tsv_examples``), as ``example_records``."""
    for examples in pieces(tsv_examples(piece, split, held_out, class_names), EXAMPLES_PER_INPUT):
        yield from example_records(examples, tokenizer_json)


def chosen_examples(count: int, train_examples: int | None) -> np.ndarray | None:
    """The indices of `train_examples` of `count` train texts, drawn once, in order; None: all."""
    if train_examples is None or train_examples >= count:
        return None
    return np.sort(np.random.default_rng(0).choice(count, train_examples, replace=False))


@dataclass(frozen=True)
class PassageSource:
    """Where the labelled texts come from: `corpus` (the default) or `tsv_files` with `corpus: null`.

    Args:
        corpus: "austen": passages of Austen's six novels labelled with their novel; null to read `tsv_files`.
        tsv_files: training texts as "text<TAB>label" lines (UTF-8; paths or glob patterns); needs `corpus: null`.
        val_tsv_files: validation texts in the same form; default: the md5 bucket split of `tsv_files` (5%).
        test_tsv_files: test texts in the same form; default: the md5 bucket split of `tsv_files` (5%).
        passage_sentences: consecutive sentences per Austen passage.
        train_examples: label only this many training texts, drawn once (the same for every seed); None: all.
        data_root: where the built-in corpus is stored.
    """

    corpus: Literal["austen"] | None = "austen"
    tsv_files: list[str] | None = None
    val_tsv_files: list[str] | None = None
    test_tsv_files: list[str] | None = None
    passage_sentences: int = 3
    train_examples: int | None = None
    data_root: str = "data"

    def __post_init__(self) -> None:
        if self.corpus not in (None, "austen"):
            raise ValueError(
                f"data.source.corpus={self.corpus!r} is not a built-in corpus; valid: 'austen', or null with tsv_files"
            )
        if (self.corpus is None) == (self.tsv_files is None):
            raise ValueError(
                "data.source needs exactly one source of labelled texts: corpus ('austen', the default) or tsv_files "
                "with corpus: null; "
                + ("got both: set corpus to null to read tsv_files" if self.corpus else "got neither")
            )
        for prefix in SPLIT_PREFIX.values():
            files = getattr(self, f"{prefix}tsv_files")
            if files is not None and not as_list(files):
                raise ValueError(
                    f"data.source.{prefix}tsv_files is an empty list; give paths or glob patterns, or leave it unset"
                )
            if files is not None and self.corpus is not None:
                raise ValueError(
                    f"data.source.corpus={self.corpus!r} has its own val/test split (by position in each novel); "
                    f"remove {prefix}tsv_files"
                )
        check_at_least("data.source.passage_sentences", self.passage_sentences, 1)
        if self.train_examples is not None and self.train_examples < 1:
            raise ValueError(
                f"data.source.train_examples={self.train_examples} must be at least 1, or null to use every "
                "training text"
            )

    def files(self) -> dict[str, list[Path]]:
        """Each split's TSV files ([] for the corpus or a split cut from train); a missing one refused by option."""
        return {
            split: expand_patterns(as_list(getattr(self, f"{prefix}tsv_files")), f"data.source.{prefix}tsv_files")
            for split, prefix in SPLIT_PREFIX.items()
        }
