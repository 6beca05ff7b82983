"""Translation data: sentence pairs as BPE ids, batched under a token budget (docs/data.md, "Sentence pairs")."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset

from lightformer.config_groups import as_config
from lightformer.data.loading.sampling import TokenBudgetBatchSampler, map_loader
from lightformer.data.loading.sequences import bucket_lengths, collate_pairs
from lightformer.data.loading.streaming import Records
from lightformer.data.module import STAGE_OF, DataModule
from lightformer.data.pieces import SPLIT_PREFIX, SPLITS, AlignedPiece, Piece, aligned_pieces, line_pieces, stage_splits
from lightformer.data.preparation.caching import file_stamp, preparing
from lightformer.data.preparation.prepare import (
    PrepareConfig,
    TokenizerConfig,
    as_tokenizer_config,
    pieces,
    sample_limit,
    split_location,
    stem_of,
)
from lightformer.data.preparation.records import RecordSplit, TokenizerJob, prepare_records
from lightformer.data.sources.corpora import Pair, ding_dictionary, extract_ding_pairs, split_of, split_of_line
from lightformer.data.sources.pairs import (
    _DING_INPUT_PAIRS,
    PairSource,
    _pair_counts,
    _pair_records,
    _side_texts,
    _summed_statistics,
    read_pairs,
)
from lightformer.errors import DataError
from lightformer.facts import DataFacts
from lightformer.io.files import sha256_of
from lightformer.nn.checks import check_at_least
from lightformer.tokenization.text import BOS_ID, EOS_ID, PAD_ID, Tokenizer

_FORMAT_VERSION = 2  # bump when what a prepared folder holds changes meaning: older folders are not reused
LENGTH_FIELDS = ("first", "second")  # a record's id arrays, whose lengths the batch sampler budgets


@dataclass(frozen=True)
class PairBatches:
    """How the pairs are cut and batched.

    Args:
        max_sentence_tokens: longest sentence in tokens, BOS/EOS included: longer train pairs dropped, val/test ids cut.
        max_tokens: token budget of one batch (rows × longest row), at least `max_sentence_tokens`.
        num_workers: DataLoader worker processes.
        length_multiple: pad a batch to a multiple of this, its rows to `max_tokens // length`; null: to its longest.
        pin_memory: pin batches in page-locked memory for faster copies to a GPU; None: when a GPU is present.
    """

    max_sentence_tokens: int = 128
    max_tokens: int = 4096
    num_workers: int = 0
    length_multiple: int | None = None
    pin_memory: bool | None = None

    def __post_init__(self) -> None:
        if self.max_sentence_tokens < 3:
            raise ValueError(
                f"data.batches.max_sentence_tokens={self.max_sentence_tokens} must be at least 3 (BOS, a token, EOS)"
            )
        if self.max_tokens < self.max_sentence_tokens:
            raise ValueError(
                f"data.batches.max_tokens={self.max_tokens} is smaller than max_sentence_tokens="
                f"{self.max_sentence_tokens}: a batch must hold at least one sentence of the longest allowed length; "
                "raise max_tokens or lower max_sentence_tokens"
            )
        check_at_least("data.batches.num_workers", self.num_workers, 0)
        if self.length_multiple is not None:
            check_at_least("data.batches.length_multiple", self.length_multiple, 1)

    def padded(self, lengths: np.ndarray) -> np.ndarray:
        """What rows of ``lengths`` tokens cost once padded: their bucket's length with `length_multiple`."""
        if self.length_multiple is None:
            return lengths
        return bucket_lengths(lengths, self.length_multiple, self.max_sentence_tokens)


class TranslationDataModule(DataModule):
    """Sentence pairs: batches {"src": ids + [EOS], "tgt": [BOS] + ids + [EOS], "src_text", "tgt_text"} (docs/data.md).

    Args:
        source: where the pairs come from, which direction they are translated (``PairSource``).
        tokenizer: the BPE tokenizers and BPE-dropout (``TokenizerConfig``: kind "bpe", 8,000 tokens by default).
        batches: sentence length, token budget, loader workers (``PairBatches``).
        prepare: where and with how many processes the pairs are prepared (``PrepareConfig``).
        seed: seeds the batches' shuffling and BPE-dropout's draws (the splits do not depend on it).
    """

    def __init__(
        self,
        source: PairSource,
        tokenizer: TokenizerConfig = TokenizerConfig(kind="bpe", vocab_size=8000),
        batches: PairBatches = PairBatches(),
        prepare: PrepareConfig = PrepareConfig(),
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.source = as_config(PairSource, source)
        self.tokenizer_config = as_tokenizer_config(tokenizer, TokenizerConfig(kind="bpe", vocab_size=8000))
        self.tokenizer_config.check_used_by("TranslationDataModule", kinds=("bpe",), file=False, pairs=True)
        self.batches = as_config(PairBatches, batches)
        self.prepare_config = as_config(PrepareConfig, prepare)
        self.seed = seed

    @property
    def src_tokenizer(self) -> Tokenizer:
        """Tokenizer of the source side (the same object as `tgt_tokenizer` when `joint_vocab`)."""
        return self._side_tokenizer(self.source.source_side)

    @property
    def tgt_tokenizer(self) -> Tokenizer:
        return self._side_tokenizer(1 - self.source.source_side)

    def data_facts(self) -> DataFacts:
        """The two tokenizers and the longest pair's positions: its source, its target less one."""
        for split in SPLITS:
            if split not in self.datasets and self.stats.get(f"{split}_pairs"):
                self.datasets[split] = self._encode_split(split)
        longest = max((max(int(pairs.src_lengths.max()), int(pairs.tgt_lengths.max()) - 1)
                       for pairs in self.datasets.values() if len(pairs)), default=None)  # fmt: skip
        if longest is not None and self.batches.length_multiple is not None:  # a padded source's length
            longest = max(
                int(self.batches.padded(pairs.lengths).max()) for pairs in self.datasets.values() if len(pairs)
            )
        src, tgt = self.src_tokenizer, self.tgt_tokenizer
        return DataFacts(src_tokenizer=src.to_str(), tgt_tokenizer=tgt.to_str(), src_vocab_size=src.vocab_size,
                         tgt_vocab_size=tgt.vocab_size, pad_id=PAD_ID, max_length=longest,
                         length_multiple=self.batches.length_multiple)  # fmt: skip

    @property
    def stats(self) -> dict[str, object]:
        """The pairs' statistics (the manifest's), with the pairs dropped or cut as the splits are opened."""
        return self.manifest["stats"]

    def setup(self, stage: str | None = None) -> None:
        """Open the splits `stage` needs (None: all): long train pairs dropped, val and test ones cut."""
        for split in stage_splits(stage):
            if split not in self.datasets:
                self.datasets[split] = self._encode_split(split)

    def _has(self, split: str) -> bool:
        return bool(self.stats[f"{split}_pairs"])

    def _dataloader(self, split: str, shuffle: bool = False) -> DataLoader:
        if split not in self.datasets:
            self.setup(STAGE_OF[split])
        dataset = self.datasets[split]
        if len(dataset) == 0:
            raise DataError(f"the {split} split has no sentence pairs ({self._describe_source(split)})")
        blocks = max(self.tokenizer_config.segmentations, 1) if split == "train" else 1
        batches = self.batches
        budget = TokenBudgetBatchSampler(batches.padded(dataset.lengths), batches.max_tokens, shuffle, self.seed,
                                         blocks=blocks)  # fmt: skip
        collate = partial(collate_pairs, pad_id=PAD_ID, length_multiple=batches.length_multiple,
                          limit=batches.max_sentence_tokens, max_tokens=batches.max_tokens)  # fmt: skip
        return map_loader(dataset, self.batches, resumable=split == "train", batch_sampler=budget, collate_fn=collate)

    def _encode_split(self, split: str) -> PreparedPairs:
        """The split's dataset: long train pairs dropped (in any BPE-dropout block), val/test ones cut."""
        if split == "train" and self.tokenizer_config.bpe_dropout:
            names = [_dropout_split(k) for k in range(self.tokenizer_config.bpe_dropout_segmentations)]
        else:
            names = [split]
        blocks = [Records(split_location(self.prepared, name)) for name in names]
        src_side, tgt_side, limit = (
            self.source.source_side,
            1 - self.source.source_side,
            self.batches.max_sentence_tokens,
        )
        too_long = np.logical_or.reduce(
            [(block.lengths[:, src_side] + 1 > limit) | (block.lengths[:, tgt_side] + 2 > limit) for block in blocks]
        )
        if split != "train":
            self.stats[f"{split}_truncated"] = int(too_long.sum())
            return PreparedPairs(blocks, np.arange(len(too_long)), src_side, cut_to=limit)
        self.stats["train_dropped_too_long"] = int(too_long.sum())
        if too_long.any():
            rank_zero_info(
                f"TranslationDataModule: dropped {int(too_long.sum())} of {len(too_long)} train pairs longer than "
                f"max_sentence_tokens={limit}" + (" in one of their segmentations" if len(blocks) > 1 else "")
            )
        return PreparedPairs(blocks, np.flatnonzero(~too_long), src_side, cut_to=None)

    def _side_tokenizer(self, side: int) -> Tokenizer:
        return self._tokenizer_file(f"tokenizer-{_names(self.tokenizer_config)[side]}.json")

    def _stem(self) -> str:
        if self.source.corpus == "ding":
            return "translation-ding"
        return f"translation-{stem_of([path for paths in self.source.files('train').values() for path in paths])}"

    def _fingerprint(self) -> dict:
        """The sources (the Ding file's hash, user files' stamps), the format, the tokenizers, BPE-dropout."""
        if self.source.corpus == "ding":
            sources: dict = {
                "ding": sha256_of(ding_dictionary(self.source.ding_file)),
                "phrases": self.source.ding_phrases,
                "sentence_repeats": self.source.sentence_repeats if self.source.ding_phrases else 1,
            }
        else:
            sources = {
                split: {kind: [file_stamp(p) for p in paths] for kind, paths in self.source.files(split).items()}
                for split in SPLITS
            }
        config = self.tokenizer_config
        dropout = {"p": config.bpe_dropout, "segmentations": config.bpe_dropout_segmentations, "seed": self.seed}
        return {
            "format": _FORMAT_VERSION,
            "sources": sources,
            "joint_vocab": config.joint_vocab,
            "bpe_vocab_size": config.vocab_size,
            "sample_bytes": config.sample_bytes,
            "bpe_dropout": dropout if config.bpe_dropout else None,
        }

    def _build(self, folder: Path) -> dict:
        """Prepare `folder` through ``prepare_records`` (tokenizers, then record splits); returns manifest additions."""
        if self.source.corpus == "ding":
            inputs, stats = self._ding_inputs()
            train, wanted, held_out = inputs["train"], {}, ()
        else:
            inputs, stats = {split: self._pieces(split) for split in SPLITS}, {}
            held_out = tuple(split for split in ("val", "test") if not inputs[split])  # taken from the buckets
            wanted = {split: split for split in held_out} | {"train": "train"}
            inputs.update({split: inputs["train"] for split in held_out})
            train = self._sampled_train_pairs(inputs["train"], held_out)
        count = sum(map(len, train))
        if not count:
            raise ValueError(f"the train split has no sentence pairs ({self._describe_source('train')})")
        config, names = self.tokenizer_config, _names(self.tokenizer_config)
        jobs = []
        for name in dict.fromkeys(names):
            sides = (0, 1) if config.joint_vocab else (("first", "second").index(name),)
            texts = partial(_side_texts, train, sides)
            what = f"training a {name} byte-level BPE of {config.vocab_size} tokens on {count:,} pairs"
            jobs.append(TokenizerJob(f"tokenizer-{name}.json", config, texts, what=what))
        written = [(split, split, None) for split in SPLITS]  # (record split, pairs of split, BPE-dropout draws)
        written += [
            (_dropout_split(k), "train", (config.bpe_dropout, self.seed, k)) for k in range(config.segmentations)
        ]

        def splits(tokenizers: dict[str, str]) -> list[RecordSplit]:
            sides = tuple(tokenizers[f"tokenizer-{name}.json"] for name in names)
            return [
                RecordSplit(name, list(enumerate(inputs[split])), partial(
                    _pair_records, wanted=wanted.get(split), held_out=held_out, tokenizers=sides,
                    options=f"data.source.{'' if split in held_out else SPLIT_PREFIX[split]}", dropout=dropout))
                for name, split, dropout in written
            ]  # fmt: skip

        _, counts = prepare_records(folder, jobs, splits, LENGTH_FIELDS, self.prepare_config.num_workers)
        if self.source.corpus == "ding":
            return {"stats": stats}
        for split in SPLITS:
            stats.update(_summed_statistics(split, counts[split], ("first", "second")))
            if split != "train" and split in wanted:  # a bucket split: its skipped lines are train's
                stats[f"{split}_skipped_empty"] = 0
            elif stats[f"{split}_pairs"] == 0:
                raise self._no_pairs(split, stats[f"{split}_skipped_empty"])
        return {"stats": stats}

    def _ding_inputs(self) -> tuple[dict[str, list], dict[str, object]]:
        """Each split's Ding pairs (in memory: ~40 MB) in lists of `_DING_INPUT_PAIRS`, and the extraction's stats."""
        with preparing(f"reading the sentence pairs of the Ding dictionary {self.source.ding_file}"):
            sentences, phrases, stats = extract_ding_pairs(ding_dictionary(self.source.ding_file))
        pairs: dict[str, list[Pair]] = {split: [] for split in SPLITS}
        for pair in sentences:
            pairs[split_of(pair[0])].append(pair)
        stats["train_skipped_empty"] = 0
        for split in SPLITS:
            stats.update(_summed_statistics(split, _pair_counts(pairs[split]), ("german", "english"), skipped=False))
        if self.source.ding_phrases:
            held_out = {pair[0] for split in ("val", "test") for pair in pairs[split]}
            added = [pair for pair in phrases if pair[0] not in held_out]
            stats["train_phrase_pairs"] = len(added)
            stats["phrase_pairs_held_out"] = len(phrases) - len(added)
            pairs["train"] = pairs["train"] * self.source.sentence_repeats + added
        return {split: pieces(found, _DING_INPUT_PAIRS) for split, found in pairs.items()}, stats

    def _no_pairs(self, split: str, skipped: int) -> ValueError:
        layout = "'source<TAB>target' lines" if "tsv" in self.source.files(split) else "line-aligned sentences"
        return ValueError(
            f"no sentence pairs in {self._describe_source(split)}"
            + (f" ({skipped} lines with an empty side skipped)" if skipped else "")
            + f"; the files must hold {layout} with both sides non-empty"
        )

    def _pieces(self, split: str) -> list[Piece | AlignedPiece]:
        """The pieces of a split's own files ([] without): line ranges of TSV files, or aligned ranges of two files."""
        files = self.source.files(split)
        if "tsv" in files:
            return [piece for path in files["tsv"] for piece in line_pieces(path)]
        if "src" in files:
            return aligned_pieces(files["src"][0], files["tgt"][0])
        return []

    def _sampled_train_pairs(self, pieces: list[Piece | AlignedPiece], held_out: tuple[str, ...]) -> list[list[Pair]]:
        """The train pairs, or a sample of about `tokenizer.sample_bytes` taken evenly from every piece (the BPEs')."""
        limit = sample_limit(pieces, self.tokenizer_config.sample_bytes)
        sampled, read, skipped = [], 0, 0
        with preparing(f"reading {'a sample of ' if limit else ''}the train pairs of {self._describe_source('train')}"):
            for piece in pieces:
                pairs, piece_skipped = read_pairs(piece, limit=limit)
                sampled.append([pair for pair in pairs if split_of_line(pair[0], "train", held_out) == "train"])
                read, skipped = read + len(pairs), skipped + piece_skipped
        if not read:
            raise self._no_pairs("train", skipped)
        return sampled

    def _describe_source(self, split: str) -> str:
        if self.source.corpus == "ding":
            return f"the {split} split of the Ding dictionary {self.source.ding_file}"
        files = self.source.files(split)
        if not files:
            return f"the md5 bucket split of the training files ({self._describe_source('train')})"
        return ", ".join(f"{kind} {', '.join(map(str, paths))}" for kind, paths in files.items())


class PreparedPairs(Dataset):
    """Prepared pairs in one direction, by index: the records `keep` of each block in turn, ids cut to `cut_to`."""

    def __init__(self, blocks: list[Records], keep: np.ndarray, source_side: int, cut_to: int | None) -> None:
        self.blocks, self.keep, self.source_side, self.cut_to = blocks, np.asarray(keep, np.int64), source_side, cut_to
        lengths = np.concatenate([block.lengths[self.keep] for block in blocks]).astype(np.int64)
        limit = cut_to if cut_to is not None else np.iinfo(np.int64).max
        self.src_lengths = np.minimum(lengths[:, source_side] + 1, limit)
        self.tgt_lengths = np.minimum(lengths[:, 1 - source_side] + 2, limit)

    def __len__(self) -> int:
        return len(self.src_lengths)

    @property
    def lengths(self) -> np.ndarray:
        """Per pair, max(source length, target length): what one row of a padded batch costs."""
        return np.maximum(self.src_lengths, self.tgt_lengths)

    def __getitem__(self, index: int) -> dict[str, np.ndarray | str]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> list[dict[str, np.ndarray | str]]:
        """Items as the DataLoader fetches a batch: each block's records read at once, in index order."""
        for index in indices:
            if not 0 <= index < len(self):
                raise IndexError(f"index {index} is out of range for {len(self)} sentence pairs")
        block_of, position = np.divmod(np.asarray(indices, dtype=np.int64), len(self.keep))
        records = [None] * len(indices)
        for block in np.unique(block_of):
            places = np.flatnonzero(block_of == block)
            found = self.blocks[block].__getitems__(self.keep[position[places]].tolist())
            for place, record in zip(places, found, strict=True):
                records[place] = record
        src, tgt = LENGTH_FIELDS[self.source_side], LENGTH_FIELDS[1 - self.source_side]
        return [
            {
                "src": self._framed(record[src], bos=False),
                "tgt": self._framed(record[tgt], bos=True),
                "src_text": record[f"{src}_text"],
                "tgt_text": record[f"{tgt}_text"],
            }
            for record in records
        ]

    def _framed(self, ids: np.ndarray, bos: bool) -> np.ndarray:
        framed = np.concatenate([[BOS_ID]] * bos + [np.asarray(ids, np.int64), [EOS_ID]])
        if self.cut_to is not None and len(framed) > self.cut_to:
            framed = framed[: self.cut_to]
            framed[-1] = EOS_ID
        return framed


def _names(config: TokenizerConfig) -> tuple[str, str]:
    return ("joint", "joint") if config.joint_vocab else ("first", "second")


def _dropout_split(k: int) -> str:
    return f"train-dropout-{k}"
