"""Next-token and pretraining data (docs/data.md, "What preparation does", "Pretraining objectives")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import DataLoader, Dataset

from lightformer.config_groups import as_config
from lightformer.data.loading.sampling import EpochShuffleSampler, evaluation_sampler, map_loader
from lightformer.data.loading.sequences import collate_pairs
from lightformer.data.loading.streaming import (
    EvaluationWindows,
    LoaderConfig,
    Windows,
    training_loader,
    validation_subset,
)
from lightformer.data.module import STAGE_OF, ConfigFacts, DataModule
from lightformer.data.objectives.masking import (
    MaskedLMDataset,
    SpanCorruptionDataset,
    collate_masked,
    span_corruption_lengths,
    span_corruption_max_length,
    word_boundary_tables,
)
from lightformer.data.pieces import stage_splits
from lightformer.data.preparation.prepare import (
    PrepareConfig,
    PreparedText,
    TokenizerConfig,
    prepare_documents,
    prepare_text,
)
from lightformer.data.sources import Source
from lightformer.data.sources.text import TextSource
from lightformer.errors import DataError
from lightformer.facts import DataFacts
from lightformer.nn.checks import check_at_least
from lightformer.tokenization.text import MASK, MIN_BPE_VOCAB_SIZE, PAD_ID, Tokenizer, sentinel


class TextData(DataModule):
    """Next-token prediction on any ``Source``'s documents ``{"text": str}``: batches of (x, y) (docs/data.md).

    Args:
        source: where the documents come from (a ``Source`` subclass, named by ``class_path``).
        tokenizer: the tokenizer to train or load (``TokenizerConfig``).
        loader: batch size, loader workers, validation windows (``LoaderConfig``).
        prepare: where and with how many processes the source is prepared (``PrepareConfig``).
        block_size: tokens per training example (the model's context length).
        seed: the shuffling's seed (the order depends on seed and epoch only).
    """

    validates_in_windows = True
    special_tokens: tuple[str, ...] = ()  # a trained tokenizer's special tokens after PAD, BOS, EOS and UNK
    collate_fn = None  # makes a batch of the datasets' items (None: the default collate)

    def __init__(
        self,
        source: Source,
        tokenizer: TokenizerConfig = TokenizerConfig(),
        loader: LoaderConfig = LoaderConfig(),
        prepare: PrepareConfig = PrepareConfig(),
        block_size: int = 64,
        seed: int = 1337,
    ) -> None:
        super().__init__()
        self.source = source if isinstance(source, Source) else as_config(TextSource, source)
        self.tokenizer_config = as_config(TokenizerConfig, tokenizer)
        self.tokenizer_config.check_used_by(type(self).__name__)
        self.loader = self.loader_config(loader)
        self.prepare_config = as_config(PrepareConfig, prepare)
        self.seed = seed
        self.datasets: dict[str, Dataset] = {}
        self._prepared: PreparedText | None = None
        check_at_least("data.block_size", block_size, 1)
        self.save_hyperparameters()  # a preset of other arguments saves its own, ignoring block_size
        self.block_size = block_size

    @property
    def prepared(self) -> PreparedText:
        """The prepared tokenizer and shards, prepared on first use (once per job: see ``data.prepare``)."""
        if self._prepared is None:
            specials = tuple(self.special_tokens)
            prepare = prepare_text if isinstance(self.source, TextSource) else prepare_documents
            self._prepared = prepare(self.source, self.tokenizer_config, self.prepare_config, specials)
        return self._prepared

    @property
    def tokenizer(self) -> Tokenizer:
        return self.prepared.tokenizer

    def setup(self, stage: str | None = None) -> None:
        """The datasets of the splits `stage` needs; ``test`` without a test split refused before a checkpoint loads."""
        if stage == "test" and not self.prepared.has("test"):
            raise DataError("data: there is no test split: set data.source.test_files, or test_fraction above 0")
        for split in stage_splits(stage):
            if split not in self.datasets and self.prepared.has(split):  # else made, or no such split
                self.datasets[split] = self._make_dataset(split)

    def _make_dataset(self, split: str) -> Dataset:
        """The dataset of a prepared split (its shards checked: ``PreparedText.split_dir``)."""
        raise NotImplementedError

    def _dataset(self, split: str) -> Dataset:
        if split not in self.datasets:
            self.setup(STAGE_OF[split])
        return self.datasets[split]

    def val_dataloader(self) -> DataLoader | list:
        if not self.prepared.has("val"):
            return []  # no validation split: Lightning skips validation
        dataset = self._dataset("val")
        fitting = self.trainer is not None and self.trainer.state.fn == TrainerFn.FITTING
        if fitting and self.validates_on_a_subset:
            dataset = validation_subset(dataset, self.loader.val_windows, self.seed)
        return self._loader(dataset, evaluation_sampler(dataset))

    def test_dataloader(self) -> DataLoader:
        return self._loader(self._dataset("test"), evaluation_sampler(self._dataset("test")))

    @property
    def validates_on_a_subset(self) -> bool:
        """Whether ``fit`` validates on ``loader.val_windows`` examples of the validation split rather than all."""
        windows = self.loader.val_windows
        return windows is not None and self.prepared.has("val") and windows < len(self._dataset("val"))

    def _loader(self, dataset: Dataset, sampler, drop_last: bool = False, resumable: bool = False) -> DataLoader:
        return map_loader(dataset, self.loader, sampler, resumable, drop_last=drop_last, collate_fn=self.collate_fn)

    def data_facts(self) -> DataFacts:
        tokenizer = self.tokenizer
        return DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, max_length=self.block_size)

    def decode(self, ids: Sequence[int] | np.ndarray | torch.Tensor) -> str:
        """Text of a sequence of ids (list, array or 1-D tensor), special tokens dropped."""
        return self.tokenizer.decode(ids)

    def _make_dataset(self, split: str) -> EvaluationWindows:
        """A split's (x, y) windows, by index; refused when it holds no window."""
        tokens = self.prepared.num_tokens(split)
        if tokens < self.block_size + 1:
            raise DataError(
                f"data: the {split} split has {tokens} tokens, fewer than block_size + 1 = {self.block_size + 1} "
                f"for one window; lower data.block_size or give the {split} split more text"
            )
        return EvaluationWindows(self.prepared.split_dir(split), self.block_size)

    def train_dataloader(self):
        self._check_one_batch()
        epoch = (lambda: self.trainer.fit_loop.epoch_progress.current.processed) if self.trainer else None
        return training_loader(self.prepared.split_dir("train"), self.block_size, self.loader, self.seed, epoch)

    def _check_one_batch(self) -> None:
        """Refuse a train split too short for one batch on every process (Lightning would end the fit at once)."""
        tokens, window = self.prepared.num_tokens("train"), self.block_size + 1
        processes = self.trainer.world_size if self.trainer is not None else 1
        per_process = tokens // window // processes
        if per_process < self.loader.batch_size:
            shared = f", {per_process} for each of {processes} processes" if processes > 1 else ""
            raise DataError(
                f"data: the train split has {tokens:,} tokens: {tokens // window} windows of block_size + 1 = {window} "
                f"tokens{shared}, fewer than one batch of data.loader.batch_size={self.loader.batch_size}; lower the "
                "batch size or data.block_size, or give more training text"
            )

    # --- what the pretraining presets share: segments of ``segment_tokens``, drawn afresh each epoch ---

    def _segment_loader(self) -> DataLoader:
        """Training's loader of corrupted segments: order and draws from (seed, epoch), full batches, resumable."""
        dataset = self._dataset("train")
        if len(dataset) < self.loader.batch_size:
            raise DataError(
                f"data: the train split has {len(dataset)} examples, fewer than data.loader.batch_size="
                f"{self.loader.batch_size}: lower it or data.segment_tokens, or give more text"
            )
        sampler = EpochShuffleSampler(len(dataset), self.seed, with_epoch=True)
        return self._loader(dataset, sampler, drop_last=True, resumable=True)

    def _use_sentinels(self, num_sentinels: int) -> None:
        """Give the tokenizer <mask> and ``num_sentinels`` sentinels: one prepared folder for both objectives."""
        check_at_least("data.num_sentinels", num_sentinels, 0)
        least = MIN_BPE_VOCAB_SIZE + 1 + num_sentinels
        config = self.tokenizer_config
        if config.kind == "bpe" and config.file is None and config.vocab_size < least:
            raise ValueError(
                f"data.tokenizer.vocab_size={config.vocab_size} is too small: byte-level BPE needs "
                f"{MIN_BPE_VOCAB_SIZE} ids, plus <mask> and num_sentinels={num_sentinels} sentinels; use at least "
                f"{least}"
            )
        self.num_sentinels = num_sentinels
        self.special_tokens = (MASK, *(sentinel(i) for i in range(num_sentinels)))

    def _too_short(self, split: str, needed: str, window: int) -> ValueError:
        hint = "give more text" if split == "train" else f"raise data.source.{split}_fraction"
        return ValueError(
            f"data: the {split} split ({self.prepared.num_tokens(split):,} tokens) is too short for {needed} of "
            f"{window} tokens: lower data.segment_tokens or {hint}"
        )

    def _random_low(self) -> int:
        """The smallest id that is not a special token (the special tokens come first in the vocabulary)."""
        special = self.tokenizer.special_ids
        if special != list(range(len(special))):
            raise ValueError(f"the tokenizer's special tokens are not ids 0..{len(special) - 1}: {special}")
        return len(special)


class TextDataModule(TextData):
    """Next-token prediction on text files: batches of (x, y), each (batch, block_size) int64, streamed (docs/data.md).

    Args:
        source: where the text comes from and how it splits (``TextSource``).
        tokenizer: the tokenizer to train or load (``TokenizerConfig``).
        loader: batch size, loader workers, validation windows (``LoaderConfig``).
        prepare: where and with how many processes the source is prepared (``PrepareConfig``).
        block_size: tokens per training example (the model's context length).
        seed: the shuffling's seed (the order depends on seed and epoch only).
    """

    def __init__(
        self,
        source: TextSource = TextSource(corpus="austen"),
        tokenizer: TokenizerConfig = TokenizerConfig(),
        loader: LoaderConfig = LoaderConfig(),
        prepare: PrepareConfig = PrepareConfig(),
        block_size: int = 64,
        seed: int = 1337,
    ) -> None:
        super().__init__(source, tokenizer, loader, prepare, block_size, seed)


class MaskedLMDataModule(TextData):
    """BERT pretraining data (docs/data.md, "Pretraining objectives"); other arguments as ``TextData``'s.

    Args:
        num_sentinels: T5 sentinels <extra_id_0..N-1> in the vocabulary (unused by BERT; shared with span corruption).
        segment_tokens: tokens per segment (an NSP "sentence"); an example has up to 2·segment_tokens tokens.
        nsp: next-sentence prediction pairs; False: single runs of text without "nsp_labels".
        mlm_probability: share of the tokens selected for the masked-LM loss, in (0, 1].
        whole_word_masking: select whole words instead of single tokens (docs/data.md).
    """

    def __init__(
        self,
        source: TextSource = TextSource(corpus="austen"),
        tokenizer: TokenizerConfig = TokenizerConfig(kind="bpe"),
        loader: LoaderConfig = LoaderConfig(batch_size=32),
        prepare: PrepareConfig = PrepareConfig(),
        num_sentinels: int = 100,
        segment_tokens: int = 64,
        nsp: bool = True,
        mlm_probability: float = 0.15,
        whole_word_masking: bool = False,
        seed: int = 1337,
    ) -> None:
        if not 0 < mlm_probability <= 1:
            raise ValueError(f"data.mlm_probability={mlm_probability} must be in (0, 1]")
        if segment_tokens < 3:
            raise ValueError(f"data.segment_tokens={segment_tokens} must be at least 3 (a pair needs 5 tokens)")
        super().__init__(source, tokenizer, loader, prepare, 2 * segment_tokens, seed)
        self._use_sentinels(num_sentinels)
        self.segment_tokens = segment_tokens
        self.nsp = nsp
        self.mlm_probability = mlm_probability
        self.whole_word_masking = whole_word_masking
        self.save_hyperparameters(ignore="block_size")

    def data_facts(self) -> DataFacts:
        tokenizer = self.tokenizer
        return DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, pad_id=PAD_ID,
                         max_length=self.max_length)  # fmt: skip

    @property
    def max_length(self) -> int:
        return 2 * self.segment_tokens

    @classmethod
    def facts_from_config(cls, init_args: Mapping[str, Any]) -> ConfigFacts:
        """The examples' length: two segments of ``segment_tokens`` (with [CLS] and the [SEP]s)."""
        segment_tokens = init_args.get("segment_tokens")
        if not isinstance(segment_tokens, int):
            return ConfigFacts()
        return ConfigFacts(
            DataFacts(max_length=2 * segment_tokens),
            options={"max_length": f"data.segment_tokens={segment_tokens}"},
            within={"max_length": lambda bound: f"data.segment_tokens <= {bound // 2}"},
        )

    @property
    def mask_id(self) -> int:
        return self.tokenizer.token_id(MASK)

    def _make_dataset(self, split: str) -> MaskedLMDataset:
        word_start_ids = line_end_ids = None
        if self.whole_word_masking:
            word_start_ids, line_end_ids = word_boundary_tables(self.tokenizer)
        window = self.segment_tokens if self.nsp else self.max_length - 2
        dataset = MaskedLMDataset(
            Windows(self.prepared.split_dir(split), window),
            self.seed,
            fixed=split != "train",
            nsp=self.nsp,
            max_length=self.max_length,
            mask_id=self.mask_id,
            vocab_size=self.tokenizer.vocab_size,
            random_low=self._random_low(),
            probability=self.mlm_probability,
            word_start_ids=word_start_ids,
            line_end_ids=line_end_ids,
        )
        if self.nsp and dataset.num_segments < 4:
            raise self._too_short(split, "next-sentence pairs (they need 4 segments)", window)
        if len(dataset) == 0:
            raise self._too_short(split, "one example", window)
        return dataset

    collate_fn = staticmethod(collate_masked)

    def train_dataloader(self) -> DataLoader:
        return self._segment_loader()


class SpanCorruptionDataModule(TextData):
    """T5 pretraining data (docs/data.md, "Pretraining objectives"); other arguments as ``TextData``'s.

    Args:
        num_sentinels: sentinels <extra_id_0..N-1> in the vocabulary: at least the number of spans of a segment.
        segment_tokens: tokens per segment (one example).
        noise_density: share of each segment's tokens that are dropped, in (0, 1).
        mean_span_length: mean length of a dropped span, in tokens (at least 1).
    """

    def __init__(
        self,
        source: TextSource = TextSource(corpus="austen"),
        tokenizer: TokenizerConfig = TokenizerConfig(kind="bpe"),
        loader: LoaderConfig = LoaderConfig(batch_size=32),
        prepare: PrepareConfig = PrepareConfig(),
        num_sentinels: int = 100,
        segment_tokens: int = 128,
        noise_density: float = 0.15,
        mean_span_length: float = 3.0,
        seed: int = 1337,
    ) -> None:
        if segment_tokens < 2:
            raise ValueError(f"data.segment_tokens={segment_tokens} must be at least 2 (a span and a kept token)")
        # The corruption's own checks of noise_density and mean_span_length, before any data is prepared.
        num_spans, source_length, target_length = span_corruption_lengths(
            segment_tokens, noise_density, mean_span_length
        )
        if num_spans > num_sentinels:
            raise ValueError(
                f"data.num_sentinels={num_sentinels} is too few: a segment of segment_tokens={segment_tokens} with "
                f"noise_density={noise_density} and mean_span_length={mean_span_length} has {num_spans} spans, "
                "each needing its own sentinel"
            )
        super().__init__(source, tokenizer, loader, prepare, segment_tokens, seed)
        self._use_sentinels(num_sentinels)
        self.segment_tokens = segment_tokens
        self.noise_density = noise_density
        self.mean_span_length = mean_span_length
        self.source_length, self.target_length = source_length, target_length
        self.save_hyperparameters(ignore="block_size")

    def data_facts(self) -> DataFacts:
        """One joint tokenizer for the corrupted input and the spans (the translation task's two sides)."""
        text, size = self.tokenizer.to_str(), self.tokenizer.vocab_size
        return DataFacts(src_tokenizer=text, tgt_tokenizer=text, src_vocab_size=size, tgt_vocab_size=size,
                         pad_id=PAD_ID, max_length=self.max_length)  # fmt: skip

    @property
    def sentinel_ids(self) -> np.ndarray:
        """The ids of <extra_id_0>, <extra_id_1>, ... (int64)."""
        return np.array([self.tokenizer.token_id(sentinel(i)) for i in range(self.num_sentinels)], dtype=np.int64)

    @property
    def max_length(self) -> int:
        """Positions the model needs: the source, and the target less one (teacher forcing reads tgt[:, :-1])."""
        return max(self.source_length, self.target_length - 1)

    @classmethod
    def facts_from_config(cls, init_args: Mapping[str, Any]) -> ConfigFacts:
        """The positions sources and targets take; within a bound: the largest ``segment_tokens`` that fits."""
        try:
            segment_tokens = init_args["segment_tokens"]
            spans = (init_args["noise_density"], init_args["mean_span_length"])
            max_length = span_corruption_max_length(segment_tokens, *spans)
        except (ValueError, TypeError, KeyError):
            return ConfigFacts()  # values the module refuses when it is built, with its own message

        def within(bound: int) -> str:
            fewer = (n for n in range(segment_tokens - 1, 1, -1) if span_corruption_max_length(n, *spans) <= bound)
            largest = next(fewer, None)
            return f"data.segment_tokens <= {largest}" if largest is not None else "lower data.segment_tokens"

        return ConfigFacts(
            DataFacts(max_length=max_length),
            options={"max_length": f"data.segment_tokens={segment_tokens}"},
            within={"max_length": within},
        )

    def _make_dataset(self, split: str) -> SpanCorruptionDataset:
        dataset = SpanCorruptionDataset(
            Windows(self.prepared.split_dir(split), self.segment_tokens),
            self.seed,
            fixed=split != "train",
            tokenizer=self.tokenizer,
            sentinel_ids=self.sentinel_ids,
            noise_density=self.noise_density,
            mean_span_length=self.mean_span_length,
        )
        if len(dataset) == 0:
            raise self._too_short(split, "one segment", self.segment_tokens)
        return dataset

    collate_fn = partial(collate_pairs, pad_id=PAD_ID)

    def train_dataloader(self) -> DataLoader:
        return self._segment_loader()
