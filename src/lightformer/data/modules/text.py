"""Next-token language-modelling data: a text source prepared once into token shards, streamed as (x, y) windows.

source (files, globs, folders, JSONL, Parquet; built-in corpus; URL) ──``data.prepare``──> tokenizer + shards
    ──``data.streaming``──> training windows (shuffled, sharded, resumable) | evaluation windows (each once)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import DataLoader, Dataset

from lightformer.config_groups import as_config
from lightformer.data.loading.sampling import evaluation_sampler, map_loader
from lightformer.data.loading.streaming import EvaluationWindows, LoaderConfig, training_loader, validation_subset
from lightformer.data.module import STAGE_OF, DataModule
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
from lightformer.tokenization.text import Tokenizer


class TokenShards(DataModule):
    """What the data modules of a text source prepared into token shards share (``TextDataModule``, the pretraining
    modules): the options below, the prepared folder and its tokenizer, set-up (a test split checked, each split's
    dataset made by ``_make_dataset``) and the evaluation loaders (``fit`` validates on ``loader.val_windows``
    examples when set).

    Args:
        source: where the text comes from and how it splits (``TextSource``).
        tokenizer: the tokenizer to train or load (``TokenizerConfig``).
        loader: batch size, loader workers, validation windows (``LoaderConfig``).
        prepare: where and with how many processes the source is prepared (``PrepareConfig``).
        seed: the shuffling's seed (the order depends on seed and epoch only).
    """

    special_tokens: tuple[str, ...] = ()  # a trained tokenizer's special tokens after PAD, BOS, EOS and UNK
    collate_fn = None  # makes a batch of the datasets' items (None: the default collate)

    def __init__(
        self,
        source: TextSource | Source,
        tokenizer: TokenizerConfig,
        loader: LoaderConfig,
        prepare: PrepareConfig,
        seed: int,
    ) -> None:
        super().__init__()
        self.source = source if isinstance(source, Source) else as_config(TextSource, source)
        self.tokenizer_config = as_config(TokenizerConfig, tokenizer)
        self.tokenizer_config.check_used_by(type(self).__name__)
        self.loader = as_config(LoaderConfig, loader)
        self.prepare_config = as_config(PrepareConfig, prepare)
        self.seed = seed
        self.datasets: dict[str, Dataset] = {}
        self._prepared: PreparedText | None = None

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
        """The prepared data's tokenizer (prepared on first use)."""
        return self.prepared.tokenizer

    def setup(self, stage: str | None = None) -> None:
        """Make the datasets of the splits that `stage` needs (all for None) over the prepared shards; refuse ``test``
        without a test split here, before a checkpoint is restored."""
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
        """A loader of ``dataset``; ``resumable`` (training) saves its position inside an epoch in checkpoints."""
        return map_loader(dataset, self.loader, sampler, resumable, drop_last=drop_last, collate_fn=self.collate_fn)


class TextData(TokenShards):
    """Next-token prediction on the documents of any source (``lightformer.data.sources.Source`` whose records are
    ``{"text": str}``, each ended by EOS): batches of (x, y), each (batch, block_size) int64. A user's own source is
    one class (docs/data.md, "Your own source"); ``TextDataModule`` is this family with files of text.

    Args:
        source: where the documents come from (a ``Source`` subclass, named by ``class_path``).
        tokenizer: the tokenizer to train or load (``TokenizerConfig``).
        loader: batch size, loader workers, validation windows (``LoaderConfig``).
        prepare: where and with how many processes the source is prepared (``PrepareConfig``).
        block_size: tokens per training example (the model's context length).
        seed: the shuffling's seed (the order depends on seed and epoch only).
    """

    def __init__(
        self,
        source: Source,
        tokenizer: TokenizerConfig = TokenizerConfig(),
        loader: LoaderConfig = LoaderConfig(),
        prepare: PrepareConfig = PrepareConfig(),
        block_size: int = 64,
        seed: int = 1337,
    ) -> None:
        super().__init__(source, tokenizer, loader, prepare, seed)
        check_at_least("data.block_size", block_size, 1)
        self.save_hyperparameters()
        self.block_size = block_size

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
        """Refuse a training split too short for one batch on every process, before the first step (Lightning would
        end the fit at once, with a warning and success)."""
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


class TextDataModule(TextData):
    """Character- or BPE-level next-token prediction: batches of (x, y), each (batch, block_size) int64.

    The source is prepared once (``data.prepare``: a tokenizer trained on a bounded sample, token shards written by
    every core) into ``prepare.dir``, then streamed: memory stays flat whatever the corpus size, and a resumed run
    continues mid-epoch exactly. An epoch is every non-overlapping window of the train split, in a new order.

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
