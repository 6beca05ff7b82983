"""Sentence pairs for translation (``PairSource``): the Ding dictionary, line-aligned files or TSV files, in pieces."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from lightformer.data.pieces import SPLIT_PREFIX, AlignedPiece, Piece, first_line, piece_lines
from lightformer.data.preparation.prepare import worker_tokenizer
from lightformer.data.sources import check_one_source
from lightformer.data.sources.corpora import DING_FILE, Pair, split_of_line
from lightformer.io.files import as_list, expand_patterns
from lightformer.nn.checks import check_at_least

_DING_INPUT_PAIRS = 100_000  # Ding pairs per encoding input (one worker process each)


@dataclass(frozen=True)
class PairSource:
    """Where the sentence pairs come from: one of `corpus`, `tsv_files`, `src_file` + `tgt_file` (docs/data.md).

    Args:
        corpus: "ding": German–English sentence pairs of the Ding dictionary (read from `ding_file`, never copied).
        tsv_files: files of `source<TAB>target` lines (UTF-8; paths or globs); blank lines skipped, more columns too.
        src_file: source sentences, one per line, line-aligned with `tgt_file`.
        tgt_file: target sentences, one per line.
        val_tsv_files: validation pairs as TSV files (else `val_src_file` + `val_tgt_file`, else the bucket split).
        val_src_file: validation source sentences, line-aligned with `val_tgt_file`.
        val_tgt_file: validation target sentences.
        test_tsv_files: test pairs as TSV files (else `test_src_file` + `test_tgt_file`, else the bucket split).
        test_src_file: test source sentences, line-aligned with `test_tgt_file`.
        test_tgt_file: test target sentences.
        ding_file: where the Ding dictionary is (`apt-get install trans-de-en` puts it at the default).
        ding_phrases: with corpus="ding", also train on its word and phrase pairs (none of a val or test sentence).
        sentence_repeats: with ding_phrases, each train sentence pair's appearances per epoch (phrases once).
        direction: with corpus="ding", "de-en" or "en-de"; for files only "de-en" (the first column / `src_file`).
    """

    corpus: Literal["ding"] | None = None
    tsv_files: list[str] | None = None
    src_file: str | None = None
    tgt_file: str | None = None
    val_tsv_files: list[str] | None = None
    val_src_file: str | None = None
    val_tgt_file: str | None = None
    test_tsv_files: list[str] | None = None
    test_src_file: str | None = None
    test_tgt_file: str | None = None
    ding_file: str = DING_FILE
    ding_phrases: bool = False
    sentence_repeats: int = 1
    direction: Literal["de-en", "en-de"] = "de-en"

    def __post_init__(self) -> None:
        given = {"corpus": self.corpus is not None, "tsv_files": self.tsv_files is not None,
                 "src_file + tgt_file": self.src_file is not None or self.tgt_file is not None}  # fmt: skip
        check_one_source(given, "sentence pairs: corpus ('ding'), tsv_files, or src_file + tgt_file")
        if self.corpus not in (None, "ding"):
            raise ValueError(f"data.source.corpus={self.corpus!r} is not a built-in corpus; valid: 'ding'")
        for split, prefix in SPLIT_PREFIX.items():
            tsv, src, tgt = self.patterns(split)
            if (src is None) != (tgt is None):
                given_name, value, missing = ("src", src, "tgt") if tgt is None else ("tgt", tgt, "src")
                raise ValueError(
                    f"data.source.{prefix}{given_name}_file={value!r} needs {prefix}{missing}_file: line-aligned "
                    "files come in pairs"
                )
            if tsv is not None and not as_list(tsv):
                raise ValueError(
                    f"data.source.{prefix}tsv_files is an empty list; give paths or glob patterns, or leave it unset"
                )
            if tsv is not None and src is not None:
                raise ValueError(
                    f"data.source: give the {split} pairs as {prefix}tsv_files or as {prefix}src_file + "
                    f"{prefix}tgt_file, not both"
                )
        if self.corpus is not None:
            explicit = [
                f"{SPLIT_PREFIX[split]}{kind}"
                for split in ("val", "test")
                for kind, value in zip(("tsv_files", "src_file", "tgt_file"), self.patterns(split), strict=True)
                if value is not None
            ]
            if explicit:
                raise ValueError(
                    "data.source.corpus='ding' has its own val/test split (md5 buckets of the German sentence); "
                    f"remove {', '.join(explicit)}"
                )
        elif self.ding_phrases:
            raise ValueError("data.source.ding_phrases=True applies to corpus='ding' only; the pairs come from files")
        check_at_least("data.source.sentence_repeats", self.sentence_repeats, 1)
        if self.direction not in ("de-en", "en-de"):
            raise ValueError(f"data.source.direction={self.direction!r} is not valid; valid: 'de-en', 'en-de'")
        if self.corpus is None and self.direction != "de-en":
            raise ValueError(
                f"data.source.direction={self.direction!r} applies to corpus='ding' only; for files the source is the "
                "first column (tsv_files) or src_file: swap the columns or the files to reverse the direction"
            )

    def patterns(self, split: str) -> tuple[list[str] | None, str | None, str | None]:
        prefix = SPLIT_PREFIX[split]
        return tuple(getattr(self, f"{prefix}{kind}") for kind in ("tsv_files", "src_file", "tgt_file"))

    def files(self, split: str) -> dict[str, list[Path]]:
        """A split's files, {"tsv": [...]} or {"src": [path], "tgt": [path]} ({} without); a missing one refused."""
        (tsv, src, tgt), prefix = self.patterns(split), f"data.source.{SPLIT_PREFIX[split]}"
        if tsv:
            return {"tsv": expand_patterns(as_list(tsv), f"{prefix}tsv_files")}
        if src is not None:
            return {
                "src": expand_patterns([src], f"{prefix}src_file"),
                "tgt": expand_patterns([tgt], f"{prefix}tgt_file"),
            }
        return {}

    @property
    def source_side(self) -> int:
        """Index of the source side in the stored (German, English) / (first, second) pairs."""
        return 1 if self.direction == "en-de" else 0


def read_pairs(
    source: list[Pair] | Piece | AlignedPiece, options: str = "data.source.", limit: int | None = None
) -> tuple[list[Pair], int]:
    """(pairs, lines skipped for an empty side) of an input; ``limit``: about this many bytes of a piece."""
    if isinstance(source, list):
        return source, 0
    if isinstance(source, AlignedPiece):
        src_lines = piece_lines(source.src, f"{options}src_file", limit)
        tgt_lines = piece_lines(source.tgt, f"{options}tgt_file")[: len(src_lines)]
        pairs = [(src.strip(), tgt.strip()) for src, tgt in zip(src_lines, tgt_lines, strict=True)]
    else:
        pairs = []
        for index, line in enumerate(piece_lines(source, f"{options}tsv_files", limit)):
            if line.strip():
                fields = line.split("\t")
                if len(fields) < 2:
                    raise ValueError(
                        f"{options}tsv_files: {source.path}, line {first_line(source) + index}: no tab; each line "
                        f"must be 'source<TAB>target' (line starts {line[:60]!r})"
                    )
                pairs.append((fields[0].strip(), fields[1].strip()))
    kept = [(src, tgt) for src, tgt in pairs if src and tgt]
    return kept, len(pairs) - len(kept)


def _pair_records(
    item: tuple[int, list[Pair] | Piece | AlignedPiece],
    wanted: str | None,
    held_out: tuple[str, ...],
    tokenizers: tuple[str, str],
    options: str = "data.source.",
    dropout: tuple[float, int, int] | None = None,
) -> Generator[dict, None, dict]:
    """One input's records of split `wanted` (all for None); returns its counts. `dropout`: (probability, seed, k)."""
    index, source = item
    pairs, skipped = read_pairs(source, options)
    if wanted is not None:
        pairs = [pair for pair in pairs if split_of_line(pair[0], "train", held_out) == wanted]
    ids = []
    for side, tokenizer_json in enumerate(tokenizers):
        tokenizer = worker_tokenizer(tokenizer_json)
        texts = [pair[side] for pair in pairs]
        if dropout is None:
            ids.append(tokenizer.encode_batch(texts))
        else:
            probability, seed, k = dropout
            entropy = [seed, k, side] + ([index] if index else [])
            state = int(np.random.SeedSequence(entropy).generate_state(1)[0])
            ids.append(tokenizer.encode_batch_with_dropout(texts, probability, seed=state))
    for (first, second), first_ids, second_ids in zip(pairs, *ids, strict=True):
        yield {
            "first": np.asarray(first_ids, np.int32),
            "second": np.asarray(second_ids, np.int32),
            "first_text": first,
            "second_text": second,
        }
    return _pair_counts(pairs, skipped)


def _pair_counts(pairs: list[Pair], skipped: int = 0) -> dict:
    """Pairs, the words of each side, the lines skipped for an empty side (``_summed_statistics`` adds them up)."""
    words = [sum(len(pair[side].split()) for pair in pairs) for side in (0, 1)]
    return {"pairs": len(pairs), "words": words, "skipped_empty": skipped}


def _summed_statistics(split: str, counts: dict, languages: tuple[str, str], skipped: bool = True) -> dict[str, object]:
    """A split's statistics from its inputs' summed counts: pairs, words per sentence of each side, lines skipped."""
    pairs = counts.get("pairs", 0)
    stats: dict[str, object] = {f"{split}_pairs": pairs}
    for side, language in enumerate(languages):
        words = counts["words"][side] if pairs else 0
        stats[f"{split}_{language}_words_per_sentence"] = round(words / max(pairs, 1), 3)
    if skipped:
        stats[f"{split}_skipped_empty"] = counts.get("skipped_empty", 0)
    return stats


def _side_texts(train: list[list[Pair]], sides: tuple[int, ...], splits: tuple[str, ...]):
    """The texts of ``sides`` of the sampled train pairs: a BPE's sample (``splits``: train alone)."""
    return (pair[side] for side in sides for pairs in train for pair in pairs)
