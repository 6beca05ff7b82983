"""Translation data: sentence pairs → BPE token ids → length-bucketed batches under a token budget.

The flow, with the expensive steps cached under `cache_dir` (atomic writes, so DDP ranks and parallel tests
can build the same cache at once):

    Ding dictionary / TSV files / two line-aligned files ──extract, split──> train | val | test pairs (JSON)
        ──BPE (joint, or one per side; trained on train only)──> ids ──> TokenBudgetBatchSampler ──> padded batches

Pairs are kept in the source's own order, (German, English) for Ding and (first column, second column) for
files; `direction` picks which side is the source only when batches are made, so de-en and en-de share the
cached pairs and tokenizers.

The Ding dictionary's extraction and the split of sentence pairs are described in ``lightformer.data.corpora``.

Its length is one class, the data module: its many sources and options (Ding, TSV or line-aligned files per split,
direction, vocabulary, budgets) and their checks, which fail at construction naming the option.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from lightformer.data.caching import cached, content_hash, file_stamp, preparing, write_json, write_tokenizer
from lightformer.data.corpora import (
    DING_DEB_PACKAGE,
    DING_FILE,
    CorpusUnavailableError,
    Pair,
    extract_ding_pairs,
    read_parallel_pairs,
    read_tsv_pairs,
    split_of,
)
from lightformer.data.sampling import TokenBudgetBatchSampler
from lightformer.data.sequences import PackedSequences, TranslationDataset, collate_pairs
from lightformer.data.tokenizers import MIN_BPE_VOCAB_SIZE, PAD_ID, Tokenizer
from lightformer.files import as_list, atomic_open, expand_patterns, sha256_of

SPLITS = ("train", "val", "test")
# Bump when the cached pairs' or tokenizers' meaning changes (extraction rules, split rule), so old caches are
# not reused.
_CACHE_FORMAT_VERSION = 1


class TranslationDataModule(L.LightningDataModule):
    """Sentence pairs for an encoder-decoder: batches {"src": (B, S), "tgt": (B, T), "src_text", "tgt_text"}.

    `src` is `encode(source) + [EOS]`; `tgt` is `[BOS] + encode(target) + [EOS]` (the task shifts it for teacher
    forcing); both are padded with `pad_id`. `src_text` / `tgt_text` are the pairs' texts (BLEU references).
    Batches hold up to `max_tokens` padded tokens per side (see `TokenBudgetBatchSampler`).

    Give the pairs as exactly one of `corpus`, `tsv_files`, or `src_file` + `tgt_file`. For files, the val and
    test pairs come from `val_*` / `test_*` files when given, else from the md5 bucket split of the source
    sentences (see the module docstring); file pairs are kept as they are (not deduplicated), except that pairs
    with an empty side are skipped.

    **Distributed training**: the batch sampler divides batches among ranks itself. It works with Lightning's
    default `use_distributed_sampler: true` (it reads the ranks and epoch from the injected DistributedSampler)
    and with `use_distributed_sampler: false` (it reads `torch.distributed`).

    Args:
        corpus: a built-in offline corpus: "ding" (German–English sentence pairs from the Ding dictionary, Debian
            package trans-de-en, read at run time from `ding_file`; GPL-2+, so never copied into the repository).
        tsv_files: files of `source<TAB>target` lines (UTF-8; paths or glob patterns). Blank lines are skipped;
            columns after the second are ignored (as in Tatoeba exports).
        src_file: source sentences, one per line, line-aligned with `tgt_file`.
        tgt_file: target sentences, one per line.
        val_tsv_files: validation pairs as TSV files (else `val_src_file` + `val_tgt_file`, else the bucket split).
        val_src_file: validation source sentences, line-aligned with `val_tgt_file`.
        val_tgt_file: validation target sentences.
        test_tsv_files: test pairs as TSV files (else `test_src_file` + `test_tgt_file`, else the bucket split).
        test_src_file: test source sentences, line-aligned with `test_tgt_file`.
        test_tgt_file: test target sentences.
        ding_file: where the Ding dictionary is (`apt-get install trans-de-en` puts it at the default).
        ding_phrases: with corpus="ding", also train on the dictionary's word and phrase pairs (371,141 in the
            2023 dictionary; train split only, none whose German side is a val or test sentence).
        sentence_repeats: with ding_phrases, each train sentence pair appears this many times per epoch (the
            phrase pairs once), so that 15k sentences are not drowned by 24 times as many short phrase pairs.
            Without ding_phrases it has no effect (an epoch of sentences only needs no balance).
        direction: with corpus="ding", "de-en" translates German to English, "en-de" English to German. For
            files the source is always the first column / `src_file`; only "de-en" (the default) is accepted.
        joint_vocab: one byte-level BPE trained on both sides of the train split (needed to share embeddings);
            False trains one BPE per side.
        bpe_vocab_size: size of each trained BPE vocabulary (named so as not to clash with the model's
            `src_vocab_size` / `tgt_vocab_size`, which are linked from this module's actual sizes).
        bpe_dropout: BPE-dropout (Provilkov et al. 2020; 0.1 in the paper) on the train split: each merge is skipped
            with this probability, so the model sees each train sentence split into subwords in several ways
            (`Tokenizer.encode_batch_with_dropout`). Validation and test keep the one segmentation of plain BPE.
            0 turns it off.
        bpe_dropout_segmentations: with bpe_dropout, how many segmentations of each train sentence are drawn (from
            `seed`, cached under `cache_dir`); epoch e trains on the (e mod this)-th of each, so runs repeat exactly
            on resume and on every rank.
        max_sentence_tokens: longest train sentence in tokens, BOS/EOS included; longer train pairs are dropped.
            Val and test pairs are all kept, their ids cut to this length with EOS kept last, and their texts
            kept whole, so BLEU is computed on the full split against the full references. (Not named `max_len`:
            the model's `max_len` is its position table and need not be equal; Lightning refuses to log
            hyperparameters that share a name but differ.)
        max_tokens: token budget of one batch: rows × longest row (source or target) <= max_tokens; must be at
            least `max_sentence_tokens`.
        num_workers: DataLoader worker processes.
        cache_dir: where the extracted pairs and trained tokenizers are cached.
        seed: seeds the batches' shuffling (the splits do not depend on it).
    """

    def __init__(
        self,
        corpus: Literal["ding"] | None = None,
        tsv_files: list[str] | None = None,
        src_file: str | None = None,
        tgt_file: str | None = None,
        val_tsv_files: list[str] | None = None,
        val_src_file: str | None = None,
        val_tgt_file: str | None = None,
        test_tsv_files: list[str] | None = None,
        test_src_file: str | None = None,
        test_tgt_file: str | None = None,
        ding_file: str = DING_FILE,
        ding_phrases: bool = False,
        sentence_repeats: int = 1,
        direction: Literal["de-en", "en-de"] = "de-en",
        joint_vocab: bool = True,
        bpe_vocab_size: int = 8000,
        bpe_dropout: float = 0.0,
        bpe_dropout_segmentations: int = 8,
        max_sentence_tokens: int = 128,
        max_tokens: int = 4096,
        num_workers: int = 0,
        cache_dir: str = "data/cache",
        seed: int = 0,
    ) -> None:
        super().__init__()
        sources = {
            "corpus": corpus is not None,
            "tsv_files": tsv_files is not None,
            "src_file + tgt_file": src_file is not None or tgt_file is not None,
        }
        given = [name for name, is_given in sources.items() if is_given]
        if len(given) != 1:
            raise ValueError(
                "TranslationDataModule needs exactly one source of sentence pairs: corpus ('ding'), tsv_files, or "
                f"src_file + tgt_file; got {', '.join(given) if given else 'none'}"
            )
        if corpus is not None and corpus != "ding":
            raise ValueError(f"corpus={corpus!r} is not a built-in corpus; valid: 'ding'")
        split_files = {
            "val": (val_tsv_files, val_src_file, val_tgt_file),
            "test": (test_tsv_files, test_src_file, test_tgt_file),
        }
        for split, (tsv, src, tgt) in (("train", (tsv_files, src_file, tgt_file)), *split_files.items()):
            prefix = "" if split == "train" else f"{split}_"
            if (src is None) != (tgt is None):
                given_name, value, missing_name = (
                    (f"{prefix}src_file", src, f"{prefix}tgt_file")
                    if tgt is None
                    else (f"{prefix}tgt_file", tgt, f"{prefix}src_file")
                )
                raise ValueError(f"{given_name}={value!r} needs {missing_name}: line-aligned files come in pairs")
            if tsv is not None and not as_list(tsv):
                raise ValueError(f"{prefix}tsv_files is an empty list; give paths or glob patterns, or leave it unset")
            if tsv is not None and src is not None:
                raise ValueError(
                    f"give the {split} pairs as {prefix}tsv_files or as {prefix}src_file + {prefix}tgt_file, not both"
                )
        if corpus is not None:
            explicit = [name for name, value in _named_split_files(split_files) if value is not None]
            if explicit:
                raise ValueError(
                    f"corpus='ding' has its own val/test split (md5 buckets of the German sentence); remove "
                    f"{', '.join(explicit)}"
                )
        elif ding_phrases:
            raise ValueError("ding_phrases=True applies to corpus='ding' only; the pairs come from files here")
        if sentence_repeats < 1:
            raise ValueError(f"sentence_repeats={sentence_repeats} must be at least 1")
        if direction not in ("de-en", "en-de"):
            raise ValueError(f"direction={direction!r} is not valid; valid: 'de-en', 'en-de'")
        if corpus is None and direction != "de-en":
            raise ValueError(
                f"direction={direction!r} applies to corpus='ding' only; for files the source is the first column "
                "(tsv_files) or src_file: swap the columns or the files to reverse the direction"
            )
        if bpe_vocab_size < MIN_BPE_VOCAB_SIZE:
            raise ValueError(
                f"bpe_vocab_size={bpe_vocab_size} is too small for byte-level BPE: use at least {MIN_BPE_VOCAB_SIZE}"
            )
        if not 0.0 <= bpe_dropout < 1.0:
            raise ValueError(f"bpe_dropout={bpe_dropout} must be in [0, 1) (0.1 in the paper; 0 turns it off)")
        if bpe_dropout_segmentations < 1:
            raise ValueError(f"bpe_dropout_segmentations={bpe_dropout_segmentations} must be at least 1")
        if max_sentence_tokens < 3:
            raise ValueError(f"max_sentence_tokens={max_sentence_tokens} must be at least 3 (BOS, a token, EOS)")
        if max_tokens < max_sentence_tokens:
            raise ValueError(
                f"max_tokens={max_tokens} is smaller than max_sentence_tokens={max_sentence_tokens}: a batch must "
                "hold at least one sentence of the longest allowed length; raise max_tokens or lower "
                "max_sentence_tokens"
            )
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be at least 0")
        self.save_hyperparameters()
        self.corpus = corpus
        self.file_patterns = {
            "train": (as_list(tsv_files), src_file, tgt_file),
            **{split: (as_list(tsv), src, tgt) for split, (tsv, src, tgt) in split_files.items()},
        }
        self.ding_file = Path(ding_file)
        self.ding_phrases = ding_phrases
        self.sentence_repeats = sentence_repeats
        self.direction = direction
        self.joint_vocab = joint_vocab
        self.bpe_vocab_size = bpe_vocab_size
        self.bpe_dropout = bpe_dropout
        self.bpe_dropout_segmentations = bpe_dropout_segmentations
        self.max_sentence_tokens = max_sentence_tokens
        self.max_tokens = max_tokens
        self.num_workers = num_workers
        self.cache_dir = Path(cache_dir)
        self.seed = seed
        self.datasets: dict[str, TranslationDataset] = {}
        self.stats: dict[str, object] = {}
        self._fingerprint_value: dict | None = None
        self._pairs: dict[str, list[Pair]] | None = None
        self._tokenizers: dict[str, Tokenizer] = {}
        self._encoded: dict[str, PackedSequences] | None = None

    # --- tokenizers: available right after construction (LightningCLI links the sizes into the model) ---

    @property
    def src_tokenizer(self) -> Tokenizer:
        """Tokenizer of the source side (the same object as `tgt_tokenizer` when `joint_vocab`)."""
        return self._tokenizer(self._source_side)

    @property
    def tgt_tokenizer(self) -> Tokenizer:
        """Tokenizer of the target side."""
        return self._tokenizer(1 - self._source_side)

    @property
    def src_vocab_size(self) -> int:
        return self.src_tokenizer.vocab_size

    @property
    def tgt_vocab_size(self) -> int:
        return self.tgt_tokenizer.vocab_size

    @property
    def pad_id(self) -> int:
        return PAD_ID

    # --- LightningDataModule hooks ---

    def prepare_data(self) -> None:
        """Extract the pairs and train the tokenizers into the cache (once, on one process per node)."""
        for side in (0, 1):
            self._tokenizer(side)

    def setup(self, stage: str | None = None) -> None:
        """Encode the splits that `stage` needs (all for None); train pairs over `max_sentence_tokens` are dropped."""
        needed = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ()}.get(stage, SPLITS)
        for split in needed:
            if split not in self.datasets:
                self.datasets[split] = self._encode_split(split)

    def train_dataloader(self) -> DataLoader:
        return self._dataloader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader | list:
        if not self._split_pairs()["val"]:
            return []  # no validation pairs: Lightning skips validation
        return self._dataloader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._dataloader("test", shuffle=False)

    # --- internals ---

    @property
    def _source_side(self) -> int:
        """Index of the source side in the stored (German, English) / (first, second) pairs."""
        return 1 if self.direction == "en-de" else 0

    def _dataloader(self, split: str, shuffle: bool) -> DataLoader:
        if split not in self.datasets:
            self.setup({"train": "fit", "val": "validate", "test": "test"}[split])
        dataset = self.datasets[split]
        if len(dataset) == 0:
            raise ValueError(f"the {split} split has no sentence pairs ({self._describe_source(split)})")
        blocks = self.bpe_dropout_segmentations if split == "train" and self.bpe_dropout else 1
        return DataLoader(
            dataset,
            batch_sampler=TokenBudgetBatchSampler(
                dataset.lengths, self.max_tokens, shuffle=shuffle, seed=self.seed, blocks=blocks
            ),
            collate_fn=partial(collate_pairs, pad_id=self.pad_id),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
        )

    def _encode_split(self, split: str) -> TranslationDataset:
        """The split's dataset: source + EOS, BOS + target + EOS; over-long train pairs dropped, val/test cut.

        With `bpe_dropout`, the train dataset is `bpe_dropout_segmentations` blocks, one per segmentation of the
        pairs (the batch sampler draws each epoch from one block).
        """
        pairs = self._split_pairs()[split]
        src_side, tgt_side = self._source_side, 1 - self._source_side
        if split == "train" and self.bpe_dropout:
            segmentations = self._dropout_segmentations()
        else:
            packed = self._encoded_pairs()
            segmentations = [{side: packed[f"{split}-{side}"] for side in (0, 1)}]
        srcs = [segmented[src_side].framed(bos=False, eos=True) for segmented in segmentations]
        tgts = [segmented[tgt_side].framed(bos=True, eos=True) for segmented in segmentations]
        src_texts, tgt_texts = [pair[src_side] for pair in pairs], [pair[tgt_side] for pair in pairs]
        limit = self.max_sentence_tokens
        too_long = np.logical_or.reduce(
            [(src.lengths > limit) | (tgt.lengths > limit) for src, tgt in zip(srcs, tgts, strict=True)]
        )
        if split == "train":
            self.stats["train_dropped_too_long"] = int(too_long.sum())
            if too_long.any():
                rank_zero_info(
                    f"TranslationDataModule: dropped {int(too_long.sum())} of {len(pairs)} train pairs longer than "
                    f"max_sentence_tokens={limit}" + (" in one of their segmentations" if len(srcs) > 1 else "")
                )
                keep = ~too_long
                srcs, tgts = [src.select(keep) for src in srcs], [tgt.select(keep) for tgt in tgts]
                src_texts = [text for text, kept in zip(src_texts, keep, strict=True) if kept]
                tgt_texts = [text for text, kept in zip(tgt_texts, keep, strict=True) if kept]
        else:
            self.stats[f"{split}_truncated"] = int(too_long.sum())
            srcs, tgts = [src.truncated(limit) for src in srcs], [tgt.truncated(limit) for tgt in tgts]
        return TranslationDataset(
            PackedSequences.concatenate(srcs),
            PackedSequences.concatenate(tgts),
            src_texts * len(srcs),
            tgt_texts * len(tgts),
        )

    def _encoded_pairs(self) -> dict[str, PackedSequences]:
        """Ids of every split's pairs without special tokens, keyed "{split}-{stored side}"; cached as .npz."""
        if self._encoded is None:
            path = self.cache_dir / f"translation-ids-{self._encoding_key()}.npz"

            def encode() -> dict[str, PackedSequences]:
                pairs_of = self._split_pairs()
                with preparing(f"encoding {sum(map(len, pairs_of.values())):,} sentence pairs into {path}"):
                    return {
                        f"{split}-{side}": PackedSequences.from_lists(
                            self._tokenizer(side).encode_batch([pair[side] for pair in pairs])
                        )
                        for split, pairs in pairs_of.items()
                        for side in (0, 1)
                    }

            self._encoded = cached(path, _load_packed, encode, _save_packed)
        return self._encoded

    def _dropout_segmentations(self) -> list[dict[int, PackedSequences]]:
        """`bpe_dropout_segmentations` BPE-dropout segmentations of the train pairs, each {stored side: ids without
        special tokens}; drawn from `seed`, cached as .npz."""
        count, train = self.bpe_dropout_segmentations, self._split_pairs()["train"]
        settings = {"bpe_dropout": self.bpe_dropout, "segmentations": count, "seed": self.seed}
        path = self.cache_dir / f"translation-bpe-dropout-{content_hash([self._encoding_key(), settings])}.npz"

        def draw() -> dict[str, PackedSequences]:
            with preparing(f"drawing {count} BPE-dropout segmentations of {len(train):,} train pairs into {path}"):
                return {
                    f"{k}-{side}": PackedSequences.from_lists(
                        self._tokenizer(side).encode_batch_with_dropout(
                            [pair[side] for pair in train],
                            self.bpe_dropout,
                            seed=int(np.random.SeedSequence([self.seed, k, side]).generate_state(1)[0]),
                        )
                    )
                    for k in range(count)
                    for side in (0, 1)
                }

        packed = cached(path, _load_packed, draw, _save_packed)
        return [{side: packed[f"{k}-{side}"] for side in (0, 1)} for k in range(count)]

    def _encoding_key(self) -> str:
        """What the encoded ids depend on: the pairs and the tokenizers."""
        tokenizer_hashes = [content_hash(self._tokenizer(side).to_str()) for side in (0, 1)]
        return content_hash({"pairs": self._fingerprint(), "tokenizers": tokenizer_hashes})

    def _tokenizer(self, side: int) -> Tokenizer:
        """The tokenizer of stored side 0 or 1 (both the joint one), loaded from the cache or trained."""
        name = "joint" if self.joint_vocab else ("first", "second")[side]
        if name not in self._tokenizers:
            key = content_hash({"pairs": self._fingerprint(), "vocab_size": self.bpe_vocab_size, "side": name})
            path = self.cache_dir / f"translation-tokenizer-{key}-{name}.json"

            def train_tokenizer() -> Tokenizer:
                train = self._split_pairs()["train"]
                if not train:
                    raise ValueError(f"the train split has no sentence pairs ({self._describe_source('train')})")
                sides = (0, 1) if self.joint_vocab else (side,)
                what = f"training a {name} byte-level BPE of {self.bpe_vocab_size} tokens on {len(train):,} pairs"
                with preparing(what):
                    return Tokenizer.train_bpe((pair[s] for s in sides for pair in train), self.bpe_vocab_size)

            self._tokenizers[name] = cached(path, Tokenizer.from_file, train_tokenizer, write_tokenizer)
        return self._tokenizers[name]

    def _fingerprint(self) -> dict:
        """What the cached pairs depend on: the sources (content hash of the Ding file, path + size + mtime of
        user files), the extraction and split rules."""
        if self._fingerprint_value is None:
            if self.corpus == "ding":
                sources: dict = {
                    "ding": sha256_of(self._ding_path()),
                    "phrases": self.ding_phrases,
                    "sentence_repeats": self.sentence_repeats if self.ding_phrases else 1,
                }
            else:
                sources = {split: self._split_files(split) for split in SPLITS}
                sources = {
                    split: {kind: [file_stamp(p) for p in paths] for kind, paths in files.items()}
                    for split, files in sources.items()
                }
            self._fingerprint_value = {"format": _CACHE_FORMAT_VERSION, "sources": sources}
        return self._fingerprint_value

    def _split_pairs(self) -> dict[str, list[Pair]]:
        """Each split's (first side, second side) pairs, from the cache or extracted (and cached)."""
        if self._pairs is None:
            path = self.cache_dir / f"translation-pairs-{content_hash(self._fingerprint())}.json"

            def extract() -> dict:
                with preparing(f"reading the sentence pairs of {self._describe_source('train')}"):
                    pairs, stats = self._extract_pairs()
                return {"pairs": pairs, "stats": stats}

            found = cached(path, _load_pairs, extract, write_json)
            self._pairs = {split: [tuple(pair) for pair in found["pairs"][split]] for split in SPLITS}
            self.stats.update(found["stats"])
        return self._pairs

    def _extract_pairs(self) -> tuple[dict[str, list[Pair]], dict[str, object]]:
        if self.corpus == "ding":
            sentences, phrases, stats = extract_ding_pairs(self._ding_path())
            pairs, skipped_empty = {split: [] for split in SPLITS}, 0
            for pair in sentences:
                pairs[split_of(pair[0])].append(pair)
        else:
            explicit = {split: self._read_split_files(split) for split in ("val", "test")}
            train, skipped_empty = self._read_split_files("train")
            if not train:
                raise ValueError(f"no sentence pairs in {self._describe_source('train')}")
            pairs = {split: found for split, (found, _) in explicit.items()}
            stats = {f"{split}_skipped_empty": skipped for split, (_, skipped) in explicit.items()}
            pairs["train"] = []
            held_out = {split for split, (found, _) in explicit.items() if not found}  # taken from the buckets
            for pair in train:
                split = split_of(pair[0])
                pairs[split if split in held_out else "train"].append(pair)
        stats["train_skipped_empty"] = skipped_empty
        for split in SPLITS:
            stats[f"{split}_pairs"] = len(pairs[split])
            for side, language in enumerate(("first", "second") if self.corpus is None else ("german", "english")):
                words = sum(len(pair[side].split()) for pair in pairs[split])
                stats[f"{split}_{language}_words_per_sentence"] = round(words / max(len(pairs[split]), 1), 3)
        if self.corpus == "ding" and self.ding_phrases:
            held_out = {pair[0] for split in ("val", "test") for pair in pairs[split]}
            added = [pair for pair in phrases if pair[0] not in held_out]
            stats["train_phrase_pairs"] = len(added)
            stats["phrase_pairs_held_out"] = len(phrases) - len(added)
            pairs["train"] = pairs["train"] * self.sentence_repeats + added
        return pairs, stats

    def _ding_path(self) -> Path:
        if not self.ding_file.is_file():
            raise CorpusUnavailableError(
                f"ding_file: the Ding German–English dictionary is not at {self.ding_file}. It is Debian's "
                f"{DING_DEB_PACKAGE} package: run `sudo apt-get install {DING_DEB_PACKAGE}` (or point ding_file at a "
                "copy of the de-en file)"
            )
        return self.ding_file

    def _split_files(self, split: str) -> dict[str, list[Path]]:
        """{"tsv": [...]} or {"src": [path], "tgt": [path]} for a split's files; {} when it has none."""
        tsv_patterns, src, tgt = self.file_patterns[split]
        prefix = "" if split == "train" else f"{split}_"
        if tsv_patterns:
            return {"tsv": expand_patterns(tsv_patterns, f"{prefix}tsv_files")}
        if src is not None:
            return {
                "src": expand_patterns([src], f"{prefix}src_file"),
                "tgt": expand_patterns([tgt], f"{prefix}tgt_file"),
            }
        return {}

    def _read_split_files(self, split: str) -> tuple[list[Pair], int]:
        """(pairs, number of pairs skipped for an empty side) of a split's files; ([], 0) when it has none."""
        files = self._split_files(split)
        if "tsv" in files:
            pairs = [pair for path in files["tsv"] for pair in read_tsv_pairs(path)]
        elif "src" in files:
            pairs = read_parallel_pairs(files["src"][0], files["tgt"][0])
        else:
            return [], 0
        kept = [(src, tgt) for src, tgt in pairs if src and tgt]
        if files and not kept:
            skipped = f" ({len(pairs)} lines with an empty side skipped)" if pairs else ""
            layout = "'source<TAB>target' lines" if "tsv" in files else "line-aligned sentences"
            raise ValueError(
                f"no sentence pairs in {self._describe_source(split)}{skipped}; the files must hold {layout} "
                "with both sides non-empty"
            )
        return kept, len(pairs) - len(kept)

    def _describe_source(self, split: str) -> str:
        if self.corpus == "ding":
            return f"the {split} split of the Ding dictionary {self.ding_file}"
        files = self._split_files(split)
        if not files:
            return f"the md5 bucket split of the training files ({self._describe_source('train')})"
        return ", ".join(f"{kind} {', '.join(map(str, paths))}" for kind, paths in files.items())


def _save_packed(path: Path, packed: dict[str, PackedSequences]) -> None:
    arrays = {}
    for name, sequences in packed.items():
        arrays[f"{name}-ids"], arrays[f"{name}-offsets"] = sequences.ids, sequences.offsets
    with atomic_open(path) as f:
        np.savez(f, **arrays)


def _load_pairs(path: Path) -> dict:
    found = json.loads(path.read_text(encoding="utf-8"))
    if set(found) != {"pairs", "stats"} or set(found["pairs"]) != set(SPLITS):
        raise ValueError(f"expected the pairs of {SPLITS} and their statistics, found {sorted(found)}")
    return found


def _load_packed(path: Path) -> dict[str, PackedSequences]:
    with np.load(path) as arrays:
        names = [name.removesuffix("-ids") for name in arrays.files if name.endswith("-ids")]
        return {name: PackedSequences(arrays[f"{name}-ids"], arrays[f"{name}-offsets"]) for name in names}


def _named_split_files(split_files: dict[str, tuple]) -> list[tuple[str, object]]:
    return [
        (f"{split}_{kind}", value)
        for split, values in split_files.items()
        for kind, value in zip(("tsv_files", "src_file", "tgt_file"), values, strict=True)
    ]
