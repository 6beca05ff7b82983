"""Self-supervised pretraining data: a text corpus cut into segments of tokens, corrupted afresh every epoch.

    text (Austen / files) ──byte-level BPE with <mask> and T5 sentinels (cached)──> ids per split (cached .npy)
        ──consecutive segments of `segment_tokens`──> MaskedLMDataModule: BERT's next-sentence pairs and masking
                                                     SpanCorruptionDataModule: T5's span corruption

The text is split as `TextDataModule`'s (in characters from the end: train | val | test, the last `val_fraction`
and `test_fraction`), or with `split="each_document"` at the same shares of each document (each file; each novel of
the Austen corpus), and the tokenizer and ids are cached the same way (under `cache_dir`, named by a hash of
what they depend on, written atomically). Both modules here train the same tokenizer (byte-level BPE with <mask>
and `num_sentinels` sentinels), so an MLM and a T5 run on one corpus share the cached tokenizer and ids. An
objective is data plus a loss: the corruption (`lightformer.data.masking`) happens here, and the shared models
read the result.

Every random choice of a training example (its next-sentence partner, masked positions, noise spans) comes from
`np.random.default_rng((seed, epoch, index))`: the training sampler yields `(index, epoch)` pairs
(`EpochShuffleSampler(with_epoch=True)`), so an example is corrupted differently each epoch, exactly again on
resume, and the same whatever the number of loader workers. Validation and test examples are drawn with epoch 0
whatever the epoch, so their metrics compare across epochs.

Its length is two objectives, each a dataset and a data module with the checks of its options, over one base (the
text, its tokenizer and cached ids, the loaders).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

from lightformer.data.caching import content_hash, file_stamp, preparing
from lightformer.data.corpora import austen_text, split_austen_text
from lightformer.data.masking import IGNORE_INDEX, mask_tokens, nsp_pair, random_spans_noise_mask, span_corruption
from lightformer.data.sampling import EpochShuffleSampler, evaluation_sampler
from lightformer.data.sequences import collate_pairs
from lightformer.data.tokenizers import BOS_ID, EOS_ID, MASK, MIN_BPE_VOCAB_SIZE, PAD_ID, Tokenizer, sentinel
from lightformer.files import as_list, atomic_open, expand_patterns, read_utf8, sha256_of

SPLITS = ("train", "val", "test")
# Bump when the cached files' meaning changes, so old caches are not reused.
_CACHE_FORMAT_VERSION = 1
_STAGE_SPLITS = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ()}

Key = int | tuple[int, int]  # a dataset index, or (index, epoch) from EpochShuffleSampler(with_epoch=True)


class _Segments(Dataset):
    """Consecutive segments of `segment_tokens` ids of one split (a tail shorter than a segment is left out).

    `tokens` is an array or the path of a `.npy` file, memory-mapped on first use (a copy sent to a loader worker
    carries only the path). `fixed` makes every epoch draw as epoch 0 (evaluation).
    """

    def __init__(self, tokens: np.ndarray | Path, segment_tokens: int, seed: int, fixed: bool) -> None:
        self._path = None if isinstance(tokens, np.ndarray) else Path(tokens)
        self._tokens = tokens if isinstance(tokens, np.ndarray) else None
        self.segment_tokens = segment_tokens
        self.seed = seed
        self.fixed = fixed
        self.num_segments = len(self.tokens) // segment_tokens

    @property
    def tokens(self) -> np.ndarray:
        if self._tokens is None:
            self._tokens = np.load(self._path, mmap_mode="r")
        return self._tokens

    def segment(self, i: int) -> np.ndarray:
        """The ids of segment i, `(segment_tokens,)` int64."""
        return self.tokens[i * self.segment_tokens : (i + 1) * self.segment_tokens].astype(np.int64)

    def rng(self, key: Key) -> tuple[int, np.random.Generator]:
        """(index, the generator of this example's draws) for an index or an (index, epoch) pair."""
        index, epoch = key if isinstance(key, tuple) else (key, 0)
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} examples")
        return index, np.random.default_rng((self.seed, 0 if self.fixed else int(epoch), index))

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        if self._path is not None:
            state["_tokens"] = None  # re-map the file in the receiving process instead of copying it
        return state


class MaskedLMDataset(_Segments):
    """BERT examples: with `nsp`, item i is `[CLS] A [SEP] B [SEP]` with A = segment i and B the next segment (label
    1) or, with probability 1/2, a random segment that is neither i nor next to it (label 0), cut to `max_length`;
    without, item i is `[CLS]` + the i-th run of `max_length - 2` ids + `[SEP]`. Then masked as BERT (`mask_tokens`).

    An item is {"ids", "segment_ids", "labels": `(seq,)` int64, and with `nsp` "nsp_label": int}.
    """

    def __init__(
        self,
        tokens: np.ndarray | Path,
        segment_tokens: int,
        seed: int,
        fixed: bool,
        *,
        nsp: bool,
        max_length: int,
        mask_id: int,
        vocab_size: int,
        random_low: int,
        probability: float,
        word_start_ids: np.ndarray | None,
        line_end_ids: np.ndarray | None,
    ) -> None:
        super().__init__(tokens, segment_tokens, seed, fixed)
        self.nsp = nsp
        self.max_length = max_length
        self.mask_id = mask_id
        self.vocab_size = vocab_size
        self.random_low = random_low
        self.probability = probability
        self.word_start_ids = word_start_ids
        self.line_end_ids = line_end_ids

    def __len__(self) -> int:
        if self.nsp:
            return max(self.num_segments - 1, 0)  # every segment that has a next one
        return len(self.tokens) // (self.max_length - 2)

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
            run = self.max_length - 2
            text = self.tokens[index * run : (index + 1) * run].astype(np.int64)
            ids = np.concatenate(([BOS_ID], text, [EOS_ID])).astype(np.int64)
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


class SpanCorruptionDataset(_Segments):
    """T5 examples: item i is segment i corrupted by `span_corruption`, framed as a translation pair.

    {"src": inputs + [EOS], "tgt": [BOS] + targets + [EOS] (int64), "src_text", "tgt_text": their texts with the
    sentinels kept}.
    """

    def __init__(
        self,
        tokens: np.ndarray | Path,
        segment_tokens: int,
        seed: int,
        fixed: bool,
        *,
        tokenizer: Tokenizer,
        sentinel_ids: np.ndarray,
        noise_density: float,
        mean_span_length: float,
    ) -> None:
        super().__init__(tokens, segment_tokens, seed, fixed)
        self.tokenizer = tokenizer
        self.sentinel_ids = sentinel_ids
        self.noise_density = noise_density
        self.mean_span_length = mean_span_length

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


class _SegmentDataModule(L.LightningDataModule):
    """What both pretraining data modules share: the text and its splits, the BPE with <mask> and the sentinels,
    the cached ids, segments, loaders. Subclasses make the datasets (`_make_dataset`) and batches (`collate_fn`)."""

    def __init__(
        self,
        train_files: list[str] | None,
        corpus: Literal["austen"] | None,
        val_fraction: float,
        test_fraction: float,
        split: Literal["end", "each_document"],
        bpe_vocab_size: int,
        num_sentinels: int,
        segment_tokens: int,
        batch_size: int,
        num_workers: int,
        cache_dir: str,
        data_root: str,
        seed: int,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if (train_files is None) == (corpus is None):
            raise ValueError(
                f"{name} needs exactly one source of text: train_files (paths or globs) or corpus ('austen'); "
                + ("got both: set corpus=null to train on files" if corpus else "got neither")
            )
        if corpus is not None and corpus != "austen":
            raise ValueError(f"corpus={corpus!r} is not a built-in corpus; valid: 'austen'")
        for option, fraction in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0 <= fraction < 1:
                raise ValueError(f"{option}={fraction} must be in [0, 1)")
        if val_fraction + test_fraction >= 1:
            raise ValueError(
                f"val_fraction={val_fraction} + test_fraction={test_fraction} leaves no training text; their sum must "
                "be below 1"
            )
        if split not in ("end", "each_document"):
            raise ValueError(f"split={split!r} is not a way to split the text; valid: 'end', 'each_document'")
        if num_sentinels < 0:
            raise ValueError(f"num_sentinels={num_sentinels} must be at least 0")
        if bpe_vocab_size < MIN_BPE_VOCAB_SIZE + 1 + num_sentinels:
            raise ValueError(
                f"bpe_vocab_size={bpe_vocab_size} is too small: byte-level BPE needs {MIN_BPE_VOCAB_SIZE} ids, plus "
                f"<mask> and num_sentinels={num_sentinels} sentinels; use at least "
                f"{MIN_BPE_VOCAB_SIZE + 1 + num_sentinels}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1")
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be at least 0")
        self.save_hyperparameters()
        self.train_patterns = as_list(train_files)
        self.corpus = corpus
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.split = split
        self.bpe_vocab_size = bpe_vocab_size
        self.num_sentinels = num_sentinels
        self.segment_tokens = segment_tokens
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.cache_dir = Path(cache_dir)
        self.data_root = Path(data_root)
        self.seed = seed
        self.datasets: dict[str, Dataset] = {}
        self._files: list[Path] | None = None
        self._fingerprint_value: dict | None = None
        self._texts: dict[str, str] | None = None
        self._tokenizer: Tokenizer | None = None

    # --- what the CLI links into the model (available right after construction). A subclass exposes only the sizes
    # its model has (vocab_size, or src_/tgt_vocab_size): the CLI would put any other into the model's config. ---

    @property
    def tokenizer(self) -> Tokenizer:
        """The byte-level BPE with <mask> and the sentinels: from the cache, or trained on the train split (and
        cached) on first use."""
        if self._tokenizer is None:
            self._tokenizer = self._load_or_train_tokenizer()
        return self._tokenizer

    @property
    def pad_id(self) -> int:
        """The padding id (linked into the model, which masks it out of attention)."""
        return PAD_ID

    @property
    def special_tokens(self) -> list[str]:
        """The tokenizer's special tokens after PAD, BOS, EOS, UNK: <mask>, then the sentinels <extra_id_0>, ..."""
        return [MASK, *(sentinel(i) for i in range(self.num_sentinels))]

    @property
    def max_length(self) -> int:
        """The longest sequence of an example, in tokens with the special ones: the model's max_len must hold it."""
        raise NotImplementedError

    # --- LightningDataModule hooks ---

    def prepare_data(self) -> None:
        """Fetch the corpus, train the tokenizer and write the token caches (once, on one process per node)."""
        self._write_token_caches()

    def setup(self, stage: str | None = None) -> None:
        """Memory-map the cached ids and build the datasets that `stage` needs (all of them for None)."""
        paths = self._write_token_caches()  # a no-op when prepare_data already ran
        for split in _STAGE_SPLITS.get(stage, SPLITS):
            if split not in self.datasets and paths[split] is not None:  # else built, or no such split
                self.datasets[split] = self._make_dataset(paths[split], split)

    def train_dataloader(self) -> DataLoader:
        dataset = self._dataset("train")
        if len(dataset) < self.batch_size:
            raise ValueError(
                f"the train split has {len(dataset)} examples, fewer than batch_size={self.batch_size}: lower "
                "batch_size or segment_tokens, or give more text"
            )
        sampler = EpochShuffleSampler(len(dataset), self.seed, with_epoch=True)
        return self._loader(dataset, sampler, drop_last=True)  # constant batch shape

    def val_dataloader(self) -> DataLoader | list:
        if self.val_fraction == 0:
            return []  # no validation split: Lightning skips validation
        return self._loader(self._dataset("val"), evaluation_sampler(self._dataset("val")), drop_last=False)

    def test_dataloader(self) -> DataLoader:
        if self.test_fraction == 0:
            raise ValueError("there is no test split: set test_fraction above 0")
        return self._loader(self._dataset("test"), evaluation_sampler(self._dataset("test")), drop_last=False)

    # --- for the subclasses ---

    def _make_dataset(self, tokens: Path, split: str) -> Dataset:
        """The dataset of `split`, whose ids are in the .npy file `tokens`."""
        raise NotImplementedError

    # Makes a batch of the datasets' items (a module-level function: loader workers get it by reference).
    collate_fn: Callable[[list[dict]], dict]

    def _too_short(self, split: str, needed: str) -> ValueError:
        hint = "give more text" if split == "train" else f"raise {split}_fraction={getattr(self, f'{split}_fraction')}"
        return ValueError(
            f"the {split} split is too short for {needed} of segment_tokens={self.segment_tokens} tokens: lower "
            f"segment_tokens or {hint}"
        )

    def _random_low(self) -> int:
        """The smallest id that is not a special token (the special tokens come first in the vocabulary)."""
        special = self.tokenizer.special_ids
        if special != list(range(len(special))):
            raise ValueError(f"the tokenizer's special tokens are not ids 0..{len(special) - 1}: {special}")
        return len(special)

    # --- internals: text → tokenizer → cached ids, as TextDataModule's (with its cache layout) ---

    def _dataset(self, split: str) -> Dataset:
        if split not in self.datasets:
            self.setup({"train": "fit", "val": "validate", "test": "test"}[split])
        return self.datasets[split]

    def _loader(self, dataset: Dataset, sampler, drop_last: bool) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            drop_last=drop_last,
            collate_fn=self.collate_fn,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
        )

    def _source_files(self) -> list[Path]:
        if self._files is None:
            if self.corpus == "austen":
                self._files = [austen_text(self.data_root / "austen")]
            else:
                self._files = expand_patterns(self.train_patterns, "train_files")
        return self._files

    def _fingerprint(self) -> dict:
        """What the cached tokenizer and ids depend on: the text (content hash of the built-in corpus, path + size +
        mtime of user files) and the split fractions."""
        if self._fingerprint_value is None:
            files = self._source_files()
            sources = [sha256_of(files[0])] if self.corpus else [file_stamp(path) for path in files]
            self._fingerprint_value = {
                "format": _CACHE_FORMAT_VERSION,
                "sources": sources,
                "val_fraction": self.val_fraction,
                "test_fraction": self.test_fraction,
                "split": self.split,
            }
        return self._fingerprint_value

    def _split_texts(self) -> dict[str, str]:
        """train | val | test, cut in characters: the last `test_fraction` for test and the `val_fraction` before it for
        validation, of the whole text (split="end", as TextDataModule) or of each document (split="each_document":
        each file, each novel of the Austen corpus; a split's parts are joined by a blank line)."""
        if self._texts is None:
            files = self._source_files()
            if self.split == "end":
                documents = [read_texts(files)]
            elif self.corpus == "austen":
                documents = list(split_austen_text(read_utf8(files[0])).values())
            else:
                documents = [read_utf8(path) for path in files]
            if not any(documents):
                raise ValueError(f"the text is empty: {', '.join(map(str, files))}")
            parts = [split_by_fraction(document, self.val_fraction, self.test_fraction) for document in documents]
            self._texts = (
                parts[0] if len(parts) == 1 else {name: "\n\n".join(part[name] for part in parts) for name in SPLITS}
            )
        return self._texts

    def _load_or_train_tokenizer(self) -> Tokenizer:
        specials = self.special_tokens
        key = {"fingerprint": self._fingerprint(), "vocab_size": self.bpe_vocab_size, "special_tokens": specials}
        path = self.cache_dir / f"tokenizer-bpe-{content_hash(key)}.json"
        return cached_bpe(path, self.bpe_vocab_size, lambda: self._split_texts()["train"], specials)

    def _write_token_caches(self) -> dict[str, Path | None]:
        """Encode each split once into `<cache_dir>/tokens-<hash>-<split>.npy`; None for a split without text."""
        has_text = {"train": True, "val": self.val_fraction > 0, "test": self.test_fraction > 0}
        paths = token_cache_paths(self.cache_dir, self._fingerprint(), self.tokenizer, has_text)
        write_token_caches(paths, self.tokenizer, self._split_texts)
        self._texts = None  # everything is cached: free the text
        return paths


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

    Args:
        train_files: training text files (UTF-8): paths or glob patterns; set `corpus` to null to use them.
        corpus: a built-in offline corpus: "austen" (Jane Austen's six novels, fetched into `<data_root>/austen`).
        val_fraction: the last share of the text held out for validation, in [0, 1); 0: no validation.
        test_fraction: the share after validation held out for testing, in [0, 1).
        split: where val and test are cut: "end" (of the whole text, in the order of the files) or "each_document"
            (the same shares of each file, or of each novel of corpus="austen": every document is in every split).
        bpe_vocab_size: vocabulary size of the byte-level BPE trained on the train split (the attribute
            `vocab_size`, linked into the model, is the size in use).
        num_sentinels: T5 sentinels <extra_id_0..N-1> in the vocabulary (unused by BERT; the same tokenizer as
            SpanCorruptionDataModule, so both objectives share the cached tokenizer and ids).
        segment_tokens: tokens per segment (an NSP "sentence"); an example has up to 2·segment_tokens tokens.
        nsp: next-sentence prediction pairs; False: single runs of text without "nsp_labels".
        mlm_probability: share of the tokens selected for the masked-LM loss, in (0, 1].
        whole_word_masking: select whole words (a token starting with whitespace, or after a line end, starts one)
            instead of single tokens.
        batch_size: examples per batch.
        num_workers: DataLoader worker processes.
        cache_dir: where the tokenizer and the token ids are cached.
        data_root: where built-in corpora are stored.
        seed: seeds the pairs, the masking and the shuffling (with the epoch and the example's index).
    """

    def __init__(
        self,
        train_files: list[str] | None = None,
        corpus: Literal["austen"] | None = "austen",
        val_fraction: float = 0.1,
        test_fraction: float = 0.0,
        split: Literal["end", "each_document"] = "end",
        bpe_vocab_size: int = 8192,
        num_sentinels: int = 100,
        segment_tokens: int = 64,
        nsp: bool = True,
        mlm_probability: float = 0.15,
        whole_word_masking: bool = False,
        batch_size: int = 32,
        num_workers: int = 0,
        cache_dir: str = "data/cache",
        data_root: str = "data",
        seed: int = 1337,
    ) -> None:
        if not 0 < mlm_probability <= 1:
            raise ValueError(f"mlm_probability={mlm_probability} must be in (0, 1]")
        if segment_tokens < 3:
            raise ValueError(f"segment_tokens={segment_tokens} must be at least 3 (a pair needs 5 tokens)")
        super().__init__(
            train_files,
            corpus,
            val_fraction,
            test_fraction,
            split,
            bpe_vocab_size,
            num_sentinels,
            segment_tokens,
            batch_size,
            num_workers,
            cache_dir,
            data_root,
            seed,
        )
        self.nsp = nsp
        self.mlm_probability = mlm_probability
        self.whole_word_masking = whole_word_masking

    @property
    def vocab_size(self) -> int:
        """Size of the tokenizer's vocabulary (the model's embedding and output size)."""
        return self.tokenizer.vocab_size

    @property
    def max_length(self) -> int:
        return 2 * self.segment_tokens

    @property
    def mask_id(self) -> int:
        return self.tokenizer.token_id(MASK)

    def _make_dataset(self, tokens: Path, split: str) -> MaskedLMDataset:
        word_start_ids = line_end_ids = None
        if self.whole_word_masking:
            word_start_ids, line_end_ids = word_boundary_tables(self.tokenizer)
        dataset = MaskedLMDataset(
            tokens,
            self.segment_tokens,
            self.seed,
            fixed=split != "train",
            nsp=self.nsp,
            max_length=self.max_length,
            mask_id=self.mask_id,
            vocab_size=self.vocab_size,
            random_low=self._random_low(),
            probability=self.mlm_probability,
            word_start_ids=word_start_ids,
            line_end_ids=line_end_ids,
        )
        if self.nsp and dataset.num_segments < 4:
            raise self._too_short(split, "next-sentence pairs (they need 4 segments)")
        if len(dataset) == 0:
            raise self._too_short(split, "one example")
        return dataset

    collate_fn = staticmethod(collate_masked)


class SpanCorruptionDataModule(_SegmentDataModule):
    """T5 pretraining data, in the translation task's batch format: {"src": (B, S), "tgt": (B, T) int64 padded
    with PAD_ID, "src_text", "tgt_text": lists of str}.

    Each segment of `segment_tokens` tokens is corrupted by T5's span corruption: `noise_density` of its tokens,
    in spans of mean length `mean_span_length`, are dropped; `src` is the segment with each span replaced by a
    sentinel (<extra_id_0>, <extra_id_1>, ... from the left) + [EOS], `tgt` is [BOS] + each sentinel followed by
    its span + [EOS]. The texts keep the sentinels. The source and target tokenizer are one joint tokenizer
    (`src_tokenizer` is `tgt_tokenizer`), so the model can share its embeddings.

    Args:
        train_files: training text files (UTF-8): paths or glob patterns; set `corpus` to null to use them.
        corpus: a built-in offline corpus: "austen" (Jane Austen's six novels, fetched into `<data_root>/austen`).
        val_fraction: the last share of the text held out for validation, in [0, 1); 0: no validation.
        test_fraction: the share after validation held out for testing, in [0, 1).
        split: where val and test are cut: "end" (of the whole text, in the order of the files) or "each_document"
            (the same shares of each file, or of each novel of corpus="austen": every document is in every split).
        bpe_vocab_size: vocabulary size of the byte-level BPE trained on the train split.
        num_sentinels: sentinels <extra_id_0..N-1> in the vocabulary: at least the number of spans of a segment.
        segment_tokens: tokens per segment (one example).
        noise_density: share of each segment's tokens that are dropped, in (0, 1).
        mean_span_length: mean length of a dropped span, in tokens (at least 1).
        batch_size: examples per batch.
        num_workers: DataLoader worker processes.
        cache_dir: where the tokenizer and the token ids are cached.
        data_root: where built-in corpora are stored.
        seed: seeds the corruption and the shuffling (with the epoch and the example's index).
    """

    def __init__(
        self,
        train_files: list[str] | None = None,
        corpus: Literal["austen"] | None = "austen",
        val_fraction: float = 0.1,
        test_fraction: float = 0.0,
        split: Literal["end", "each_document"] = "end",
        bpe_vocab_size: int = 8192,
        num_sentinels: int = 100,
        segment_tokens: int = 128,
        noise_density: float = 0.15,
        mean_span_length: float = 3.0,
        batch_size: int = 32,
        num_workers: int = 0,
        cache_dir: str = "data/cache",
        data_root: str = "data",
        seed: int = 1337,
    ) -> None:
        if segment_tokens < 2:
            raise ValueError(f"segment_tokens={segment_tokens} must be at least 2 (a span and a kept token)")
        # The corruption's own checks of noise_density and mean_span_length, before any data is prepared; the
        # counts of noise tokens and spans depend on the length only, so this mask tells them for every segment.
        noise = random_spans_noise_mask(segment_tokens, np.random.default_rng(0), noise_density, mean_span_length)
        num_spans = int((noise & ~np.concatenate(([False], noise[:-1]))).sum())
        if num_spans > num_sentinels:
            raise ValueError(
                f"num_sentinels={num_sentinels} is too few: a segment of segment_tokens={segment_tokens} with "
                f"noise_density={noise_density} and mean_span_length={mean_span_length} has {num_spans} spans, "
                "each needing its own sentinel"
            )
        super().__init__(
            train_files,
            corpus,
            val_fraction,
            test_fraction,
            split,
            bpe_vocab_size,
            num_sentinels,
            segment_tokens,
            batch_size,
            num_workers,
            cache_dir,
            data_root,
            seed,
        )
        self.noise_density = noise_density
        self.mean_span_length = mean_span_length
        self.num_spans = num_spans
        num_noise = int(noise.sum())
        self.source_length = segment_tokens - num_noise + num_spans + 1  # ... + [EOS]
        self.target_length = num_noise + num_spans + 2  # [BOS] ... [EOS]

    # --- what the translation task and the CLI's links read ---

    @property
    def src_tokenizer(self) -> Tokenizer:
        """The joint tokenizer (the same object as `tgt_tokenizer`)."""
        return self.tokenizer

    @property
    def tgt_tokenizer(self) -> Tokenizer:
        return self.tokenizer

    @property
    def src_vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def tgt_vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def sentinel_ids(self) -> np.ndarray:
        """The ids of <extra_id_0>, <extra_id_1>, ... (int64)."""
        return np.array([self.tokenizer.token_id(sentinel(i)) for i in range(self.num_sentinels)], dtype=np.int64)

    @property
    def max_length(self) -> int:
        """Positions the model needs: the source, and the target less one (teacher forcing reads tgt[:, :-1])."""
        return max(self.source_length, self.target_length - 1)

    def _make_dataset(self, tokens: Path, split: str) -> SpanCorruptionDataset:
        dataset = SpanCorruptionDataset(
            tokens,
            self.segment_tokens,
            self.seed,
            fixed=split != "train",
            tokenizer=self.tokenizer,
            sentinel_ids=self.sentinel_ids,
            noise_density=self.noise_density,
            mean_span_length=self.mean_span_length,
        )
        if len(dataset) == 0:
            raise self._too_short(split, "one segment")
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


def read_texts(paths: list[Path]) -> str:
    """The files' UTF-8 text, joined in order with a newline between files that lack a final one."""
    texts = []
    for path in paths:
        text = read_utf8(path)
        if texts and not texts[-1].endswith("\n"):
            texts.append("\n")
        texts.append(text)
    return "".join(texts)


def split_by_fraction(text: str, val_fraction: float, test_fraction: float) -> dict[str, str]:
    """train | val | test, cut in characters: the last ``test_fraction`` of ``text`` for test, the
    ``val_fraction`` before it for validation, the rest for training."""
    n = len(text)
    n_val, n_test = int(n * val_fraction), int(n * test_fraction)
    return {
        "train": text[: n - n_val - n_test],
        "val": text[n - n_val - n_test : n - n_test],
        "test": text[n - n_test :],
    }


def cached_bpe(
    path: Path, vocab_size: int, train_text: Callable[[], str], special_tokens: Sequence[str] = ()
) -> Tokenizer:
    """The byte-level BPE cached at ``path``, or trained on ``train_text()`` (with ``special_tokens`` after PAD,
    BOS, EOS, UNK) and cached there."""
    if path.exists():
        return Tokenizer.from_file(path)
    text = train_text()
    extra = f" with {len(special_tokens)} extra special tokens" if special_tokens else ""
    with preparing(f"training a byte-level BPE of {vocab_size} tokens{extra} on {len(text):,} characters"):
        tokenizer = Tokenizer.train_bpe(io.StringIO(text), vocab_size, extra_special_tokens=list(special_tokens))
    tokenizer.save(path)
    return tokenizer


def token_cache_paths(
    cache_dir: Path, fingerprint: dict, tokenizer: Tokenizer, has_text: dict[str, bool]
) -> dict[str, Path | None]:
    """The cache file of each split's ids, named by what they depend on (the text and the tokenizer); None for a
    split without text."""
    key = content_hash({"fingerprint": fingerprint, "tokenizer": content_hash(tokenizer.to_str())})
    return {split: cache_dir / f"tokens-{key}-{split}.npy" if has_text[split] else None for split in SPLITS}


def write_token_caches(
    paths: dict[str, Path | None], tokenizer: Tokenizer, split_texts: Callable[[], dict[str, str]]
) -> None:
    """Encode each split whose cache file is missing and save its ids as .npy (uint16 for vocabularies up to
    65,536), atomically; ``split_texts`` is called only then."""
    for split, path in paths.items():
        if path is not None and not path.exists():
            text = split_texts()[split]
            with preparing(f"encoding the {split} split ({len(text):,} characters) into {path}"):
                ids = tokenizer.encode_to_array(text)
            with atomic_open(path) as f:
                np.save(f, ids)
