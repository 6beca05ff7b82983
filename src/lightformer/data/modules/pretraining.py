"""Self-supervised pretraining data: a text source prepared once into token shards, cut into segments, corrupted
afresh every epoch.

    source (files, globs, JSONL, Parquet; corpus "austen") ──``data.prepare``: a tokenizer with <mask> and the T5
        sentinels, token shards──> segments of ``segment_tokens`` ids, read by index (``data.streaming.Windows``)
        ──> MaskedLMDataModule: BERT's next-sentence pairs and masking
            SpanCorruptionDataModule: T5's span corruption

The source is prepared as ``TextDataModule``'s (``data.source``, ``data.tokenizer``, ``data.prepare``), with
``split: each_file`` to hold out the end of every file (each novel of the Austen corpus). Both modules here ask for
the same special tokens (<mask>, then ``num_sentinels`` sentinels), so an MLM and a T5 run on one source share the
prepared folder. An objective is data plus a loss: the corruption (``lightformer.data.objectives.masking``)
happens here, and the shared models read the result. Memory stays flat whatever the corpus size: segments are read
from the shards.

Every random choice of a training example (its next-sentence partner, masked positions, noise spans) comes from
``np.random.default_rng((seed, epoch, index))``: the training sampler yields ``(index, epoch)`` pairs
(``EpochShuffleSampler(with_epoch=True)``), so an example is corrupted differently each epoch, exactly again on
resume, and the same whatever the number of loader workers. The training loader's position inside an epoch is saved
in every checkpoint (``ResumableDataLoader``): a run resumed mid-epoch trains on exactly the batches it would have.
Validation and test examples are drawn with epoch 0 whatever the epoch, so their metrics compare across epochs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

from lightformer.data.loading.sampling import EpochShuffleSampler, Key, index_and_epoch
from lightformer.data.loading.sequences import collate_pairs
from lightformer.data.loading.streaming import LoaderConfig, Windows
from lightformer.data.module import ConfigFacts
from lightformer.data.modules.text import TokenShards
from lightformer.data.objectives.masking import (
    IGNORE_INDEX,
    mask_tokens,
    nsp_pair,
    span_corruption,
    span_corruption_lengths,
)
from lightformer.data.preparation.prepare import PrepareConfig, TokenizerConfig
from lightformer.data.sources.text import TextSource
from lightformer.errors import DataError
from lightformer.facts import DataFacts
from lightformer.nn.checks import check_at_least
from lightformer.tokenization.text import (
    BOS_ID,
    EOS_ID,
    MASK,
    MIN_BPE_VOCAB_SIZE,
    PAD_ID,
    Tokenizer,
    sentinel,
)


def span_corruption_max_length(segment_tokens: int, noise_density: float, mean_span_length: float) -> int:
    """The ``max_length`` of ``SpanCorruptionDataModule`` (the positions its sources and targets take) for these
    values, without building it."""
    _, source_length, target_length = span_corruption_lengths(segment_tokens, noise_density, mean_span_length)
    return max(source_length, target_length - 1)


@dataclass(eq=False)
class _Segments(Dataset):
    """The windows of a prepared split as segments, and the random generator of each example. ``fixed`` makes every
    epoch draw as epoch 0 (evaluation)."""

    windows: Windows
    seed: int
    fixed: bool

    @property
    def num_segments(self) -> int:
        return len(self.windows)

    def segment(self, i: int) -> np.ndarray:
        """The ids of segment i, ``(window,)`` int64."""
        return self.windows[i]

    def rng(self, key: Key) -> tuple[int, np.random.Generator]:
        """(index, the generator of this example's draws) for an index or an (index, epoch) pair."""
        index, epoch = index_and_epoch(key)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} examples")
        return index, np.random.default_rng((self.seed, 0 if self.fixed else epoch, index))


@dataclass(eq=False, kw_only=True)
class MaskedLMDataset(_Segments):
    """BERT examples: with `nsp`, item i is `[CLS] A [SEP] B [SEP]` with A = segment i and B the next segment (label
    1) or, with probability 1/2, a random segment that is neither i nor next to it (label 0), cut to `max_length`;
    without, item i is `[CLS]` + window i + `[SEP]` (the windows are then `max_length - 2` ids long). Then masked as
    BERT (`mask_tokens`).

    An item is {"ids", "segment_ids", "labels": `(seq,)` int64, and with `nsp` "nsp_label": int}.
    """

    nsp: bool
    max_length: int
    mask_id: int
    vocab_size: int
    random_low: int
    probability: float
    word_start_ids: np.ndarray | None
    line_end_ids: np.ndarray | None

    def __len__(self) -> int:
        if self.nsp:
            return max(self.num_segments - 1, 0)  # every segment that has a next one
        return self.num_segments

    def __getitem__(self, key: Key) -> dict[str, np.ndarray | int]:
        index, rng = self.rng(key)
        item: dict[str, np.ndarray | int] = {}
        if self.nsp:
            is_next = bool(rng.random() < 0.5)
            partner = index + 1 if is_next else self._random_distant(index, rng)
            ids, segment_ids = nsp_pair(
                self.segment(index),
                self.segment(partner),
                cls_id=BOS_ID,
                sep_id=EOS_ID,
                max_length=self.max_length,
                rng=rng,
            )
            item["nsp_label"] = int(is_next)
        else:
            ids = np.concatenate(([BOS_ID], self.segment(index), [EOS_ID])).astype(np.int64)
            segment_ids = np.zeros(len(ids), dtype=np.int64)
        word_starts = None
        if self.word_start_ids is not None:
            after_line_end = np.concatenate(([False], self.line_end_ids[ids[:-1]]))
            word_starts = self.word_start_ids[ids] | after_line_end
        inputs, labels = mask_tokens(
            ids,
            rng,
            mask_id=self.mask_id,
            vocab_size=self.vocab_size,
            maskable=~np.isin(ids, (PAD_ID, BOS_ID, EOS_ID)),
            probability=self.probability,
            word_starts=word_starts,
            random_low=self.random_low,
        )
        item.update(ids=inputs, segment_ids=segment_ids, labels=labels)
        return item

    def _random_distant(self, index: int, rng: np.random.Generator) -> int:
        """A segment drawn uniformly among all but `index` and its neighbours."""
        excluded = [i for i in (index - 1, index, index + 1) if 0 <= i < self.num_segments]
        choice = int(rng.integers(0, self.num_segments - len(excluded)))
        for i in excluded:  # ascending: shift the choice past each excluded segment at or below it
            if choice >= i:
                choice += 1
        return choice


@dataclass(eq=False, kw_only=True)
class SpanCorruptionDataset(_Segments):
    """T5 examples: item i is segment i corrupted by `span_corruption`, framed as a translation pair.

    {"src": inputs + [EOS], "tgt": [BOS] + targets + [EOS] (int64), "src_text", "tgt_text": their texts with the
    sentinels kept}.
    """

    tokenizer: Tokenizer
    sentinel_ids: np.ndarray
    noise_density: float
    mean_span_length: float

    def __len__(self) -> int:
        return self.num_segments

    def __getitem__(self, key: Key) -> dict[str, np.ndarray | str]:
        index, rng = self.rng(key)
        inputs, targets = span_corruption(
            self.segment(index),
            rng,
            sentinel_ids=self.sentinel_ids,
            noise_density=self.noise_density,
            mean_span_length=self.mean_span_length,
        )
        src = np.concatenate((inputs, [EOS_ID])).astype(np.int64)
        tgt = np.concatenate(([BOS_ID], targets, [EOS_ID])).astype(np.int64)
        return {
            "src": src,
            "tgt": tgt,
            "src_text": self.tokenizer.decode(inputs, skip_special=False),
            "tgt_text": self.tokenizer.decode(targets, skip_special=False),
        }


def collate_masked(items: list[dict[str, np.ndarray | int]]) -> dict[str, torch.Tensor]:
    """MaskedLMDataset items → {"ids", "segment_ids", "labels": (B, T) int64 padded on the right with PAD_ID, 0 and
    IGNORE_INDEX, and "nsp_labels": (B,) when the items have them}."""

    def padded(name: str, value: int) -> torch.Tensor:
        return pad_sequence([torch.from_numpy(item[name]) for item in items], batch_first=True, padding_value=value)

    batch = {
        "ids": padded("ids", PAD_ID),
        "segment_ids": padded("segment_ids", 0),
        "labels": padded("labels", IGNORE_INDEX),
    }
    if "nsp_label" in items[0]:
        batch["nsp_labels"] = torch.tensor([item["nsp_label"] for item in items], dtype=torch.long)
    return batch


class _SegmentDataModule(TokenShards):
    """What both pretraining data modules share: the source prepared with <mask> and the sentinels, its segments,
    the loaders. Subclasses make the datasets (`_make_dataset`) and batches (`collate_fn`).

    Args:
        source: where the text comes from and how it splits (``TextSource``; ``split: each_file`` holds out the end
            of every file, each novel of corpus "austen").
        tokenizer: the tokenizer to train (byte-level BPE by default) or load (``TokenizerConfig``); it gets <mask>
            and the sentinels as special tokens.
        loader: batch size, loader workers, validation examples (``LoaderConfig``).
        prepare: where and with how many processes the source is prepared (``PrepareConfig``).
        num_sentinels: T5 sentinels <extra_id_0..N-1> in the vocabulary (one tokenizer for both objectives, so that
            they share the prepared data).
        segment_tokens: tokens per segment.
        seed: seeds the examples' draws and the shuffling (with the epoch and the example's index).
    """

    def __init__(
        self,
        source: TextSource,
        tokenizer: TokenizerConfig,
        loader: LoaderConfig,
        prepare: PrepareConfig,
        num_sentinels: int,
        segment_tokens: int,
        seed: int,
    ) -> None:
        super().__init__(source, tokenizer, loader, prepare, seed)
        self.save_hyperparameters()
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
        self.segment_tokens = segment_tokens

    @property
    def special_tokens(self) -> list[str]:
        """The tokenizer's special tokens after PAD, BOS, EOS, UNK: <mask>, then the sentinels <extra_id_0>, ..."""
        return [MASK, *(sentinel(i) for i in range(self.num_sentinels))]

    @property
    def max_length(self) -> int:
        """The longest sequence of an example, in tokens with the special ones: the model's max_len must hold it."""
        raise NotImplementedError

    def train_dataloader(self) -> DataLoader:
        dataset = self._dataset("train")
        if len(dataset) < self.loader.batch_size:
            raise DataError(
                f"data: the train split has {len(dataset)} examples, fewer than data.loader.batch_size="
                f"{self.loader.batch_size}: lower it or data.segment_tokens, or give more text"
            )
        sampler = EpochShuffleSampler(len(dataset), self.seed, with_epoch=True)
        return self._loader(dataset, sampler, drop_last=True, resumable=True)  # constant batch shape

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


class MaskedLMDataModule(_SegmentDataModule):
    """BERT pretraining data: batches {"ids", "segment_ids", "labels": (B, T) int64, "nsp_labels": (B,) int64}.

    The text is cut into segments of `segment_tokens` tokens. With `nsp`, an example is `[CLS] A [SEP] B [SEP]`
    (BOS is [CLS], EOS is [SEP]; segment_ids 0 up to the first [SEP], 1 after) where B is the segment after A
    (nsp_labels 1) or, with probability 1/2, a random segment of the same split that is not next to A (0); a pair
    longer than `max_length` = 2·segment_tokens is cut as BERT's `truncate_seq_pair`. Without `nsp`, an example is
    `[CLS]` + 2·segment_tokens - 2 consecutive tokens + `[SEP]`, and there is no "nsp_labels". Then `mlm_probability`
    of the tokens other than [CLS]/[SEP] are selected (80% become <mask>, 10% a random non-special token, 10% stay);
    `labels` holds their original ids and IGNORE_INDEX (-100) elsewhere. `ids` are padded with PAD_ID, `segment_ids`
    with 0, `labels` with IGNORE_INDEX.

    Its source, tokenizer, loader, prepare and seed are ``_SegmentDataModule``'s.

    Args:
        num_sentinels: T5 sentinels <extra_id_0..N-1> in the vocabulary (unused by BERT; the same tokenizer as
            SpanCorruptionDataModule's, so both objectives share the prepared data).
        segment_tokens: tokens per segment (an NSP "sentence"); an example has up to 2·segment_tokens tokens.
        nsp: next-sentence prediction pairs; False: single runs of text without "nsp_labels".
        mlm_probability: share of the tokens selected for the masked-LM loss, in (0, 1].
        whole_word_masking: select whole words (a token starting with whitespace, or after a line end, starts one)
            instead of single tokens.
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
        super().__init__(source, tokenizer, loader, prepare, num_sentinels, segment_tokens, seed)
        self.nsp = nsp
        self.mlm_probability = mlm_probability
        self.whole_word_masking = whole_word_masking

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


class SpanCorruptionDataModule(_SegmentDataModule):
    """T5 pretraining data, in the translation task's batch format: {"src": (B, S), "tgt": (B, T) int64 padded
    with PAD_ID, "src_text", "tgt_text": lists of str}.

    Each segment of `segment_tokens` tokens is corrupted by T5's span corruption: `noise_density` of its tokens,
    in spans of mean length `mean_span_length`, are dropped; `src` is the segment with each span replaced by a
    sentinel (<extra_id_0>, <extra_id_1>, ... from the left) + [EOS], `tgt` is [BOS] + each sentinel followed by
    its span + [EOS]. The texts keep the sentinels. The source and target tokenizer are one joint tokenizer
    (its facts' `src_tokenizer` is its `tgt_tokenizer`), so the model can share its embeddings.

    Its source, tokenizer, loader, prepare and seed are ``_SegmentDataModule``'s.

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
        super().__init__(source, tokenizer, loader, prepare, num_sentinels, segment_tokens, seed)
        self.noise_density = noise_density
        self.mean_span_length = mean_span_length
        self.source_length, self.target_length = source_length, target_length

    # --- what the translation task needs to know of the data ---

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
        """The positions the sources and targets take, which ``segment_tokens``, ``noise_density`` and
        ``mean_span_length`` decide; within a bound: the largest ``segment_tokens`` that fits."""
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


def word_boundary_tables(tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Per token id of a byte-level BPE: (starts a word: its text begins with whitespace, ends a line: its text ends
    with a newline), both `(vocab_size,)` bool. Special tokens are neither."""
    texts = [tokenizer.decode([i], skip_special=False) for i in range(tokenizer.vocab_size)]
    special = set(tokenizer.special_ids)
    starts = np.array([i not in special and t[:1].isspace() for i, t in enumerate(texts)], dtype=bool)
    ends = np.array([i not in special and t.endswith("\n") for i, t in enumerate(texts)], dtype=bool)
    return starts, ends
