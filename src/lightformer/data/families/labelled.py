"""Text classification data: labelled texts as [CLS] text [SEP] records (docs/data.md, "Labelled texts")."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset, Subset

from lightformer.config_groups import as_config
from lightformer.data.loading.sampling import EpochShuffleSampler, evaluation_sampler, map_loader
from lightformer.data.loading.streaming import LoaderConfig, Records
from lightformer.data.module import ConfigFacts, DataModule
from lightformer.data.pieces import SPLITS, Piece, line_pieces, stage_splits
from lightformer.data.preparation.caching import content_hash, file_stamp, preparing
from lightformer.data.preparation.prepare import (
    TOKENIZER,
    PrepareConfig,
    TokenizerConfig,
    as_tokenizer_config,
    pieces,
    sample_limit,
    split_location,
    stem_of,
)
from lightformer.data.preparation.records import RecordSplit, TokenizerJob, prepare_records
from lightformer.data.sources.corpora import AUSTEN_NOVELS, austen_passages, austen_text
from lightformer.data.sources.labelled import (
    EXAMPLES_PER_INPUT,
    PassageSource,
    chosen_examples,
    example_records,
    scan_tsv,
    tsv_examples,
    tsv_records,
)
from lightformer.errors import ConfigError, DataError
from lightformer.facts import DataFacts
from lightformer.io.files import read_utf8, sha256_of
from lightformer.tokenization.text import EOS_ID, MASK, MIN_BPE_VOCAB_SIZE, PAD_ID, sentinel

# The special tokens a BERT / T5 pretraining run's BPE is trained with (after PAD, BOS = [CLS], EOS = [SEP], UNK).
EXTRA_SPECIAL_TOKENS = (MASK, *(sentinel(i) for i in range(100)))
MIN_VOCAB_SIZE = MIN_BPE_VOCAB_SIZE + len(EXTRA_SPECIAL_TOKENS)
# Bump when a prepared folder's meaning changes (passage or split rules, what a record holds): a new folder is made.
FORMAT_VERSION = 2


def cut_to(ids: np.ndarray, max_tokens: int) -> np.ndarray:
    """``ids`` cut to ``max_tokens``, [SEP] (EOS) kept last, when longer."""
    return ids if len(ids) <= max_tokens else np.append(ids[: max_tokens - 1], np.int32(EOS_ID))


def collate_classification(items: list[dict], max_tokens: int, pad_id: int = PAD_ID, multiple: int = 8) -> dict:
    """Records → {"ids": (B, T) int64 cut to ``max_tokens``, padded to a multiple of ``multiple``, "labels": (B,)}."""
    rows = [cut_to(np.asarray(item["ids"]), max_tokens) for item in items]
    width = -(-max(map(len, rows)) // multiple) * multiple
    ids = torch.full((len(rows), width), pad_id, dtype=torch.int64)
    for row, sequence in enumerate(rows):
        ids[row, : len(sequence)] = torch.from_numpy(sequence.astype(np.int64))
    labels = torch.tensor([int(item["label"]) for item in items], dtype=torch.int64)
    return {"ids": ids, "labels": labels}


class TextClassificationDataModule(DataModule):
    """Labelled texts for a BERT classifier: batches {"ids": (B, T), "labels": (B,)} (docs/data.md, "Labelled texts").

    Args:
        source: the labelled texts and their splits (``PassageSource``).
        tokenizer: the tokenizer file, or the size of the BPE to train (``TokenizerConfig``; kind "bpe" or a file).
        loader: texts per batch and loader workers (``LoaderConfig``; `val_windows` must stay unset).
        max_tokens: longest sequence in tokens, [CLS] and [SEP] included (at most the model's `max_len`).
        prepare: where and with how many processes the texts are prepared (``PrepareConfig``).
        seed: seeds the order of the training texts in each epoch (the splits do not depend on it).
    """

    def __init__(
        self,
        source: PassageSource = PassageSource(),
        tokenizer: TokenizerConfig = TokenizerConfig(kind="bpe"),
        loader: LoaderConfig = LoaderConfig(batch_size=32),
        max_tokens: int = 128,
        prepare: PrepareConfig = PrepareConfig(),
        seed: int = 0,
    ) -> None:
        super().__init__()
        if max_tokens < 3:
            raise ValueError(f"data.max_tokens={max_tokens} must be at least 3 ([CLS], a token, [SEP])")
        self.save_hyperparameters()
        self.source = as_config(PassageSource, source)
        self.tokenizer_config = as_tokenizer_config(tokenizer, TokenizerConfig(kind="bpe"))
        self.tokenizer_config.check_used_by("TextClassificationDataModule", kinds=("bpe",))
        if self.tokenizer_config.file is None and self.tokenizer_config.vocab_size < MIN_VOCAB_SIZE:
            raise ConfigError(
                f"data.tokenizer.vocab_size={self.tokenizer_config.vocab_size} is too small: the byte-level BPE holds "
                f"256 bytes and {len(EXTRA_SPECIAL_TOKENS) + 4} special tokens; use at least {MIN_VOCAB_SIZE}"
            )
        self.loader = self.loader_config(loader)
        self.prepare_config = as_config(PrepareConfig, prepare)
        self.files = self.source.files()
        self.max_tokens = max_tokens
        self.seed = seed
        self._class_counts: dict[str, dict[str, int]] | None = None
        self._logged_counts = False

    def data_facts(self) -> DataFacts:
        tokenizer = self.tokenizer
        return DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, pad_id=PAD_ID,
                         class_names=tuple(self.class_names), max_length=self.max_tokens)  # fmt: skip

    @classmethod
    def facts_from_config(cls, init_args: Mapping[str, Any]) -> ConfigFacts:
        max_tokens = init_args.get("max_tokens")
        if not isinstance(max_tokens, int):
            return ConfigFacts()
        return ConfigFacts(
            DataFacts(max_length=max_tokens),
            options={"max_length": f"data.max_tokens={max_tokens}"},
            within={"max_length": lambda bound: f"data.max_tokens <= {bound}"},
        )

    @property
    def class_names(self) -> list[str]:
        """Name of each class, by index: the novels' titles in ``AUSTEN_NOVELS`` order, or the sorted TSV labels."""
        return list(self.manifest["class_names"])

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def class_counts(self) -> dict[str, dict[str, int]]:
        """{split: {class name: texts}}, of the `train_examples` chosen when set."""
        if self._class_counts is None:
            counts = dict(self.manifest["counts"])
            if self._chosen() is not None:  # read once: the labels of the chosen records
                labels = [int(record["label"]) for record in self.dataset("train")]
                counts["train"] = np.bincount(labels, minlength=self.num_classes).tolist()
            self._class_counts = {split: dict(zip(self.class_names, counts[split], strict=True)) for split in SPLITS}
        return self._class_counts

    @property
    def chance_accuracy(self) -> float:
        """The test accuracy of always answering the test split's largest class (its share of the test texts)."""
        counts = self.class_counts["test"].values()
        return max(counts) / max(sum(counts), 1)

    def dataset(self, split: str) -> Dataset:
        """A split's records by index ({"ids": whole, "label"}): the `train_examples` chosen of train when set."""
        if split not in self.datasets:
            if not self._has(split):
                raise DataError(f"the {split} split has no texts ({self._describe_source()})")
            records = Records(split_location(self.prepared, split))
            chosen = self._chosen() if split == "train" else None
            self.datasets[split] = records if chosen is None else Subset(records, chosen.tolist())
        return self.datasets[split]

    def setup(self, stage: str | None = None) -> None:
        """Open the splits ``stage`` needs that hold texts (their shards checked); log the class counts once."""
        for split in stage_splits(stage):
            if self._has(split):
                self.dataset(split)
        if not self._logged_counts:
            self._logged_counts = True
            lines = [f"TextClassificationDataModule: {self.num_classes} classes ({self._describe_source()})"]
            for split, counts in self.class_counts.items():
                per_class = ", ".join(f"{name} {count}" for name, count in counts.items())
                lines.append(f"  {split}: {sum(counts.values())} texts ({per_class})")
            lines.append(f"  chance accuracy (the largest test class): {self.chance_accuracy:.1%}")
            rank_zero_info("\n".join(lines))

    def _has(self, split: str) -> bool:
        return bool(sum(self.manifest["counts"][split]))

    def _dataloader(self, split: str, shuffle: bool = False) -> DataLoader:
        dataset = self.dataset(split)
        sampler = EpochShuffleSampler(len(dataset), self.seed) if shuffle else evaluation_sampler(dataset)
        collate = partial(collate_classification, max_tokens=self.max_tokens)
        return map_loader(dataset, self.loader, sampler, shuffle, collate_fn=collate)

    def _chosen(self) -> np.ndarray | None:
        """The indices of the `train_examples` train texts, drawn once, the same for every seed; None: all."""
        return chosen_examples(sum(self.manifest["counts"]["train"]), self.source.train_examples)

    def _describe_source(self) -> str:
        if self.source.corpus == "austen":
            return f"Austen's novels, passages of {self.source.passage_sentences} sentences"
        return ", ".join(str(path) for paths in self.files.values() for path in paths)

    def _stem(self) -> str:
        return "classify-" + ("austen" if self.source.corpus == "austen" else stem_of(self.files["train"]))

    def _fingerprint(self) -> dict:
        """What the folder depends on: the corpus or files, the passage rule, the tokenizer, the format version."""
        if self.tokenizer_config.file is not None:
            tokenizer = {
                "file": content_hash(Path(self.tokenizer_config.file).read_text(encoding="utf-8", errors="replace"))
            }
        else:
            tokenizer = {
                "bpe_vocab_size": self.tokenizer_config.vocab_size,
                "special": list(EXTRA_SPECIAL_TOKENS),
                "sample_bytes": self.tokenizer_config.sample_bytes,
                "train_examples": self.source.train_examples,  # the texts it is trained on
            }
        if self.source.corpus == "austen":
            source = {
                "austen": sha256_of(austen_text(Path(self.source.data_root) / "austen")),
                "passages": self.source.passage_sentences,
            }
        else:
            source = {"tsv": {split: [file_stamp(path) for path in paths] for split, paths in self.files.items()}}
        return {"format": FORMAT_VERSION, **source, "tokenizer": tokenizer}

    def _build(self, folder: Path) -> dict:
        """Build the prepared folder through ``prepare_records``: tokenizer, records, class names and counts."""
        if self.source.corpus == "austen":
            with preparing(f"cutting {self._describe_source()}"):
                text = read_utf8(austen_text(Path(self.source.data_root) / "austen"))
                passages = austen_passages(text, self.source.passage_sentences)
            class_names = [title for _, title in AUSTEN_NOVELS]
            examples = {split: [(text, label) for text, label, _ in passages[split]] for split in SPLITS}
            counts = {
                split: np.bincount([label for _, label in examples[split]], minlength=len(class_names)).tolist()
                for split in SPLITS
            }

            def train_texts() -> list[str]:
                return [text for text, _ in examples["train"]]

            inputs = {split: pieces(examples[split], EXAMPLES_PER_INPUT) for split in SPLITS}

            def records_of(split: str, tokenizer_json: str) -> partial:
                return partial(example_records, tokenizer_json=tokenizer_json)

        else:
            with preparing(f"checking and counting the labelled lines of {self._describe_source()}"):
                class_names, counts = scan_tsv(self.files)
            held_out = frozenset(split for split in ("val", "test") if not self.files[split])
            files = {split: [p for path in paths for p in line_pieces(path)] for split, paths in self.files.items()}

            def train_texts() -> Iterator[str]:
                return self._tsv_sample(files["train"], held_out, class_names)

            inputs = {split: files["train" if split in held_out else split] for split in SPLITS}

            def records_of(split: str, tokenizer_json: str) -> partial:
                return partial(tsv_records, split=split, held_out=held_out, class_names=class_names,
                               tokenizer_json=tokenizer_json)  # fmt: skip

        def splits(tokenizers: dict[str, str]) -> list[RecordSplit]:
            return [RecordSplit(split, inputs[split], records_of(split, tokenizers[TOKENIZER]), sum(counts[split]))
                    for split in SPLITS if sum(counts[split])]  # fmt: skip

        config = self.tokenizer_config
        what = f"training a byte-level BPE of {config.vocab_size} tokens on the train texts"
        job = TokenizerJob(TOKENIZER, config, lambda splits: self._chosen_texts(train_texts(), counts),
                           EXTRA_SPECIAL_TOKENS, needed=(), what=what)  # fmt: skip
        tokenizers, _ = prepare_records(folder, [job], splits, ("ids",), self.prepare_config.num_workers)
        tokenizer = tokenizers[TOKENIZER]
        rank_zero_info(f"prepared data: {folder} ({', '.join(f'{s} {sum(counts[s]):,} texts' for s in SPLITS)})")
        return {"class_names": class_names, "counts": counts, "vocab_size": tokenizer.vocab_size}

    def _chosen_texts(self, texts: Iterable[str], counts: dict[str, list[int]]) -> Iterable[str]:
        chosen = chosen_examples(sum(counts["train"]), self.source.train_examples)
        if chosen is None:
            return texts
        kept = set(chosen.tolist())
        return [text for i, text in enumerate(texts) if i in kept]

    def _tsv_sample(self, pieces: list[Piece], held_out: frozenset[str], class_names: list[str]) -> Iterator[str]:
        """The train texts of the train pieces, or the same share of the start of every piece (``sample_bytes``)."""
        sample_bytes = self.tokenizer_config.sample_bytes
        limit = sample_limit(pieces, sample_bytes) if self.source.train_examples is None else None
        for piece in pieces:
            yield from (text for text, _ in tsv_examples(piece, "train", held_out, class_names, limit))
