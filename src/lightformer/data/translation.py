"""Translation data: sentence pairs → BPE token ids → length-bucketed batches under a token budget.

The flow, with the expensive steps cached under `cache_dir` (atomic writes, so DDP ranks and parallel tests
can build the same cache at once):

    Ding dictionary / TSV files / two line-aligned files ──extract, split──> train | val | test pairs (JSON)
        ──BPE (joint, or one per side; trained on train only)──> ids ──> TokenBudgetBatchSampler ──> padded batches

Pairs are kept in the source's own order, (German, English) for Ding and (first column, second column) for
files; `direction` picks which side is the source only when batches are made, so de-en and en-de share the
cached pairs and tokenizers.

**Splits.** Unless val/test files are given, a pair's split depends only on its first side (German for Ding,
the source for files): `bucket = int(md5(first.encode("utf-8")).hexdigest(), 16) % 100`; test if bucket < 5,
val if bucket < 10, else train. A sentence therefore never appears in two splits, and the split does not change
when the corpus grows.

**Ding extraction** (Debian's `trans-de-en`, `/usr/share/trans/de-en`: lines `German :: English`):

1. `#` lines are comments. `|` separates aligned sub-entries on both sides: the i-th German sub-entry is
   paired with the i-th English one; a line whose two sides have different counts is skipped.
2. Each sub-entry is cleaned: annotations are removed, namely `{...}` (gender, word class, irregular
   forms), `[...]` (usage and region labels: `[ugs.]`, `[Br.]`), `<...>` (search keywords, variant
   spellings), `/ABC/` abbreviation markers, and `(...)` (optional words and explanations: "Er scheint (sehr)
   krank zu sein." becomes "Er scheint krank zu sein."); whitespace is then collapsed and spaces before
   `. , ! ? ; :` removed.
3. `;` separates synonyms (alternative translations); the FIRST synonym of each side is kept: the
   dictionary lists the main translation first, and the alternatives on the two sides are not aligned.
4. A pair is a sentence pair when both sides start with a capital letter, end in `.`, `!` or `?`, have three
   words or more, and contain no dictionary notation: no `/` (word alternatives: "zu dumm/bunt"), no elision
   (`…`, `...`) and no placeholder (`etw.`, `jdn.`, `jdm.`, `jds.`, `sth.`, `sb.`).
5. Sentence pairs are deduplicated (first occurrence kept) and split by the bucket of the German side.

With the 2023-01-30 dictionary this gives 17,231 pairs: 15,462 train, 890 val, 879 test, of 7.5 German and
7.8 English words on average (`TranslationDataModule.stats` has the counts of the file in use).
`ding_phrases=True` adds the other cleaned sub-entry pairs (words and phrases: "Aalsuppe" → "eel soup") to
the train split only, leaving out any whose German side is a val or test German sentence: 371,141 pairs.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler

from lightformer.data.sources import CorpusUnavailableError, atomic_open, atomic_write_bytes, sha256_of
from lightformer.data.text import _as_list, _expand, _file_stamp, _hash
from lightformer.data.tokenizers import BOS_ID, EOS_ID, MIN_BPE_VOCAB_SIZE, PAD_ID, Tokenizer

SPLITS = ("train", "val", "test")
DING_FILE = "/usr/share/trans/de-en"
DING_DEB_PACKAGE = "trans-de-en"
# Bump when the cached pairs' or tokenizers' meaning changes (extraction rules, split rule), so old caches are
# not reused.
_CACHE_FORMAT_VERSION = 1

Pair = tuple[str, str]

# --- the md5 bucket split ------------------------------------------------------------------------------------

TEST_BUCKETS = 5  # buckets 0..4 are test
VAL_BUCKETS = 10  # buckets 5..9 are val; 10..99 train


def split_bucket(sentence: str) -> int:
    """The sentence's bucket in 0..99: `int(md5(sentence as UTF-8).hexdigest(), 16) % 100`."""
    return int(hashlib.md5(sentence.encode("utf-8")).hexdigest(), 16) % 100


def split_of(sentence: str) -> str:
    """The split of a sentence: "test" for buckets 0..4, "val" for 5..9, "train" for 10..99."""
    bucket = split_bucket(sentence)
    return "test" if bucket < TEST_BUCKETS else "val" if bucket < VAL_BUCKETS else "train"


# --- Ding dictionary extraction --------------------------------------------------------------------------------

# Innermost bracketed annotations ({m}, [ugs.], <Variante>, (optional words)); removed repeatedly so nested ones go.
_ANNOTATION = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]|<[^<>]*>|\([^()]*\)")
# Abbreviation markers such as "Entschuldigung, ich verstehe nicht. /SIDU/": a whole word between slashes.
_ABBREVIATION_MARKER = re.compile(r"(?<!\S)/[^/\s]+/(?!\S)")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+([.,!?;:])")
# Dictionary notation that makes a sub-entry a template rather than a sentence.
_NOTATION = re.compile(r"/|…|\.\.\.|\b(?:etw|jdn|jdm|jds|sth|sb)\.")


def clean_ding_entry(entry: str) -> str:
    """The first synonym of one Ding sub-entry, annotations removed (see the module docstring, steps 2 and 3)."""
    removed = 1
    while removed:  # innermost brackets first, until none are left
        entry, removed = _ANNOTATION.subn(" ", entry)
    if "/" in entry:
        entry = _ABBREVIATION_MARKER.sub(" ", entry)
    for synonym in entry.split(";"):
        synonym = " ".join(synonym.split())
        if synonym:
            return _SPACE_BEFORE_PUNCTUATION.sub(r"\1", synonym)
    return ""


def is_sentence(text: str) -> bool:
    """A capital first letter, a final `.`, `!` or `?`, three words or more, and no dictionary notation."""
    return (
        len(text) > 0
        and text[0].isupper()
        and text[-1] in ".!?"
        and len(text.split()) >= 3
        and _NOTATION.search(text) is None
    )


def extract_ding_pairs(path: str | Path) -> tuple[list[Pair], list[Pair], dict[str, int]]:
    """(sentence pairs, other word/phrase pairs, counts) of a Ding dictionary file, both lists deduplicated.

    Pairs are (German, English) in file order; the counts say how many lines, sub-entries and skipped
    lines (different `|` counts on the two sides, or no " :: ") were seen.
    """
    path = Path(path)
    text = _read_utf8(path)
    sentences: dict[Pair, None] = {}  # dicts keep the first occurrence's order
    phrases: dict[Pair, None] = {}
    counts = {"entry_lines": 0, "sub_entries": 0, "misaligned_lines": 0, "malformed_lines": 0}
    for line in text.split("\n"):
        if not line.strip() or line.startswith("#"):
            continue
        counts["entry_lines"] += 1
        german, separator, english = line.partition("::")
        if not separator:
            counts["malformed_lines"] += 1
            continue
        german_entries, english_entries = german.split("|"), english.split("|")
        if len(german_entries) != len(english_entries):
            counts["misaligned_lines"] += 1
            continue
        for german_entry, english_entry in zip(german_entries, english_entries, strict=True):
            counts["sub_entries"] += 1
            pair = (clean_ding_entry(german_entry), clean_ding_entry(english_entry))
            if is_sentence(pair[0]) and is_sentence(pair[1]):
                sentences[pair] = None
            elif pair[0] and pair[1]:
                phrases[pair] = None
    phrase_list = [pair for pair in phrases if pair not in sentences]
    return list(sentences), phrase_list, counts


# --- datasets, batching, collation ----------------------------------------------------------------------------


class PackedSequences:
    """Variable-length id sequences in one flat int32 array: sequence i is `ids[offsets[i]:offsets[i + 1]]`.

    Compact, cheap to send to DataLoader workers and to save as `.npz`; the operations below are vectorized.
    """

    def __init__(self, ids: np.ndarray, offsets: np.ndarray) -> None:
        self.ids = np.asarray(ids, dtype=np.int32)
        self.offsets = np.asarray(offsets, dtype=np.int64)

    @classmethod
    def from_lists(cls, sequences: Sequence[Sequence[int]]) -> PackedSequences:
        offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
        np.cumsum([len(sequence) for sequence in sequences], out=offsets[1:])
        ids = np.fromiter((i for sequence in sequences for i in sequence), dtype=np.int32, count=int(offsets[-1]))
        return cls(ids, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        return self.ids[self.offsets[index] : self.offsets[index + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def framed(self, bos: bool, eos: bool) -> PackedSequences:
        """Each sequence with BOS prepended and/or EOS appended."""
        lengths = self.lengths
        offsets = np.zeros_like(self.offsets)
        np.cumsum(lengths + bos + eos, out=offsets[1:])
        ids = np.full(int(offsets[-1]), EOS_ID, dtype=np.int32)
        if bos:
            ids[offsets[:-1]] = BOS_ID
        position_in_sequence = np.arange(len(self.ids)) - np.repeat(self.offsets[:-1], lengths)
        ids[np.repeat(offsets[:-1] + bos, lengths) + position_in_sequence] = self.ids
        return PackedSequences(ids, offsets)

    def select(self, keep: np.ndarray) -> PackedSequences:
        """The sequences where the boolean mask `keep` is True, in order."""
        lengths = self.lengths[keep]
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return PackedSequences(self.ids[np.repeat(keep, self.lengths)], offsets)

    def truncated(self, max_length: int) -> PackedSequences:
        """Sequences longer than `max_length` cut to it, their last id replaced by EOS."""
        lengths = self.lengths
        new_lengths = np.minimum(lengths, max_length)
        position_in_sequence = np.arange(len(self.ids)) - np.repeat(self.offsets[:-1], lengths)
        ids = self.ids[position_in_sequence < np.repeat(new_lengths, lengths)]
        offsets = np.zeros_like(self.offsets)
        np.cumsum(new_lengths, out=offsets[1:])
        ids[offsets[1:][lengths > max_length] - 1] = EOS_ID
        return PackedSequences(ids, offsets)


class TranslationDataset(Dataset):
    """Encoded sentence pairs with their texts; item i is {"src": ids, "tgt": ids, "src_text", "tgt_text"}."""

    def __init__(
        self,
        src_ids: PackedSequences | Sequence[Sequence[int]],
        tgt_ids: PackedSequences | Sequence[Sequence[int]],
        src_texts: list[str],
        tgt_texts: list[str],
    ) -> None:
        self.src = src_ids if isinstance(src_ids, PackedSequences) else PackedSequences.from_lists(src_ids)
        self.tgt = tgt_ids if isinstance(tgt_ids, PackedSequences) else PackedSequences.from_lists(tgt_ids)
        if not len(self.src) == len(self.tgt) == len(src_texts) == len(tgt_texts):
            raise ValueError(
                f"a translation dataset needs as many of each: {len(self.src)} source id sequences, {len(self.tgt)} "
                f"target id sequences, {len(src_texts)} source texts, {len(tgt_texts)} target texts"
            )
        self.src_texts = src_texts
        self.tgt_texts = tgt_texts

    def __len__(self) -> int:
        return len(self.src_texts)

    @property
    def lengths(self) -> np.ndarray:
        """Per pair, max(source length, target length): what one row of a padded batch costs."""
        return np.maximum(self.src.lengths, self.tgt.lengths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor | str]:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} sentence pairs")
        return {
            "src": torch.from_numpy(self.src[index].astype(np.int64)),
            "tgt": torch.from_numpy(self.tgt[index].astype(np.int64)),
            "src_text": self.src_texts[index],
            "tgt_text": self.tgt_texts[index],
        }

    def __getitems__(self, indices: list[int]) -> list[dict[str, np.ndarray | str]]:
        """Items as the DataLoader fetches a batch: like `__getitem__` but ids as int32 array views (faster)."""
        return [
            {"src": self.src[i], "tgt": self.tgt[i], "src_text": self.src_texts[i], "tgt_text": self.tgt_texts[i]}
            for i in indices
        ]


class PadCollator:
    """Pads a list of dataset items into {"src": (B, S), "tgt": (B, T) int64, "src_text", "tgt_text": lists}.

    S and T are the longest source and target in the batch; shorter rows are filled with `pad_id` on the right.
    """

    def __init__(self, pad_id: int = PAD_ID) -> None:
        self.pad_id = pad_id

    def __call__(self, items: list[dict[str, torch.Tensor | np.ndarray | str]]) -> dict[str, torch.Tensor | list[str]]:
        batch: dict[str, torch.Tensor | list[str]] = {}
        for side in ("src", "tgt"):
            rows = [np.asarray(item[side]) for item in items]
            lengths = np.array([len(row) for row in rows])
            padded = np.full((len(rows), lengths.max(initial=0)), self.pad_id, dtype=np.int64)
            padded[np.arange(padded.shape[1]) < lengths[:, None]] = np.concatenate(rows) if rows else []
            batch[side] = torch.from_numpy(padded)
        batch["src_text"] = [item["src_text"] for item in items]
        batch["tgt_text"] = [item["tgt_text"] for item in items]
        return batch


class _EpochCounter:
    """Holds the epoch. Lightning's loops call `set_epoch` on `batch_sampler.sampler`, not on the batch sampler."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class TokenBudgetBatchSampler(BatchSampler):
    """Batches of indices whose padded size, rows × max(source, target length), stays within `max_tokens`.

    As fairseq's `max_tokens`: examples are sorted by length (ties broken at random per epoch when `shuffle`,
    by index otherwise), consecutive examples are grouped while `(batch size) × (longest in batch) <= max_tokens`,
    and with `shuffle` the batches are put in a random order. The randomness depends only on (seed, epoch): call
    `set_epoch` each epoch (Lightning does). An example longer than `max_tokens` gets a batch of its own.

    **Distributed.** The batches are divided among `num_replicas` ranks (rank r takes batches r, r + n, ...);
    when their count is not a multiple of n, the batches with the most examples are halved until it is, so
    every rank gets the same number of batches and each example goes to exactly one rank (only a corpus with
    fewer examples than ranks repeats batches). The ranks come, in this order of precedence, from a
    `DistributedSampler` passed as `sampler` (what Lightning injects when `use_distributed_sampler=True`; only its
    `num_replicas`, `rank` and `epoch` are used), from `num_replicas` / `rank`, or from `torch.distributed` when
    it is initialized. Every rank must build the sampler with the same lengths, seed and budget.

    Args:
        lengths: per example, the longer of its source and target length in tokens.
        max_tokens: budget of one batch in padded tokens (per side).
        shuffle: random tie-breaking and batch order (training); False gives the same batches every time.
        seed: seed of the shuffling; the same on every rank.
        num_replicas: number of distributed ranks; default: from `sampler`, else `torch.distributed`, else 1.
        rank: this process's rank; default: from `sampler`, else `torch.distributed`, else 0.
        sampler: a `DistributedSampler` to take the ranks and epoch from (see above); its order is not used.
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        max_tokens: int,
        shuffle: bool = False,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        sampler: Sampler | None = None,
    ) -> None:
        # BatchSampler.__init__ is not called: it wants a fixed batch size. Subclassing lets Lightning inject a
        # DistributedSampler through `sampler` instead of failing on an unknown batch sampler.
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be at least 1")
        if (num_replicas is None) != (rank is None):
            raise ValueError(
                f"give both num_replicas and rank or neither; got num_replicas={num_replicas}, rank={rank}"
            )
        if num_replicas is not None and not 0 <= rank < num_replicas:
            raise ValueError(f"rank={rank} must be in [0, num_replicas={num_replicas})")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.sampler = sampler if sampler is not None else _EpochCounter()
        self._num_batches: dict[int, int] = {}

    @property
    def epoch(self) -> int:
        return int(getattr(self.sampler, "epoch", 0))

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration use this epoch's shuffle."""
        self.sampler.set_epoch(epoch)

    def replicas(self) -> tuple[int, int]:
        """(num_replicas, rank) in use now."""
        if hasattr(self.sampler, "num_replicas") and hasattr(self.sampler, "rank"):
            return int(self.sampler.num_replicas), int(self.sampler.rank)
        if self.num_replicas is not None:
            return self.num_replicas, self.rank
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_world_size(), torch.distributed.get_rank()
        return 1, 0

    def all_batches(self, epoch: int | None = None) -> list[list[int]]:
        """Every rank's batches of `epoch` (default: the current one); this rank's are `[rank::num_replicas]`."""
        epoch = self.epoch if epoch is None else epoch
        if self.shuffle:
            rng = np.random.default_rng((self.seed, epoch))
            order = np.lexsort((rng.random(len(self.lengths)), self.lengths))
        else:
            order = np.argsort(self.lengths, kind="stable")
        batches = _group_by_budget(order.tolist(), self.lengths.tolist(), self.max_tokens)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return _divisible_by(batches, self.replicas()[0])

    def __iter__(self) -> Iterator[list[int]]:
        num_replicas, rank = self.replicas()
        yield from self.all_batches()[rank::num_replicas]

    def __len__(self) -> int:
        num_replicas, _ = self.replicas()
        if num_replicas not in self._num_batches:
            # The count depends only on the sorted lengths, not on the tie-breaking or the batch order.
            self._num_batches[num_replicas] = len(self.all_batches(epoch=0)) // num_replicas
        return self._num_batches[num_replicas]


def _group_by_budget(order: list[int], lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Consecutive runs of `order` with len(run) × max(lengths in run) <= max_tokens (at least one each)."""
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for index in order:
        new_longest = max(longest, lengths[index])
        if batch and (len(batch) + 1) * new_longest > max_tokens:
            batches.append(batch)
            batch, new_longest = [], lengths[index]
        batch.append(index)
        longest = new_longest
    if batch:
        batches.append(batch)
    return batches


def _divisible_by(batches: list[list[int]], num_replicas: int) -> list[list[int]]:
    """Halve the batches with the most examples until the count is a multiple of `num_replicas`; if too few
    examples for that, repeat batches from the start."""
    batches = list(batches)
    while (shortfall := -len(batches) % num_replicas) and any(len(batch) > 1 for batch in batches):
        largest = sorted(range(len(batches)), key=lambda i: -len(batches[i]))[:shortfall]
        for i in sorted((i for i in largest if len(batches[i]) > 1), reverse=True):
            half = len(batches[i]) // 2
            batches[i : i + 1] = [batches[i][:half], batches[i][half:]]
    if batches and (shortfall := -len(batches) % num_replicas):
        batches += [batches[i % len(batches)] for i in range(shortfall)]
    return batches


# --- the data module --------------------------------------------------------------------------------------------


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
            if tsv is not None and not _as_list(tsv):
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
            "train": (_as_list(tsv_files), src_file, tgt_file),
            **{split: (_as_list(tsv), src, tgt) for split, (tsv, src, tgt) in split_files.items()},
        }
        self.ding_file = Path(ding_file)
        self.ding_phrases = ding_phrases
        self.sentence_repeats = sentence_repeats
        self.direction = direction
        self.joint_vocab = joint_vocab
        self.bpe_vocab_size = bpe_vocab_size
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

    def encode_source(self, lines: list[str]) -> list[list[int]]:
        """Source ids of `lines` as the model sees them: `encode(line.strip()) + [EOS]`, cut to
        `max_sentence_tokens` (EOS kept last) as val and test sentences are."""
        ids = self.src_tokenizer.encode_batch([line.strip() for line in lines], add_eos=True)
        return [_truncate(sequence, self.max_sentence_tokens) for sequence in ids]

    def decode_target(self, ids: Sequence[int] | np.ndarray | torch.Tensor) -> str:
        """Text of target ids (list, array or 1-D tensor), special tokens dropped."""
        return self.tgt_tokenizer.decode(ids)

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
        return DataLoader(
            dataset,
            batch_sampler=TokenBudgetBatchSampler(dataset.lengths, self.max_tokens, shuffle=shuffle, seed=self.seed),
            collate_fn=PadCollator(self.pad_id),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
        )

    def _encode_split(self, split: str) -> TranslationDataset:
        """The split's dataset: source + EOS, BOS + target + EOS; over-long train pairs dropped, val/test cut."""
        pairs = self._split_pairs()[split]
        src_side, tgt_side = self._source_side, 1 - self._source_side
        packed = self._encoded_pairs()
        src = packed[f"{split}-{src_side}"].framed(bos=False, eos=True)
        tgt = packed[f"{split}-{tgt_side}"].framed(bos=True, eos=True)
        src_texts, tgt_texts = [pair[src_side] for pair in pairs], [pair[tgt_side] for pair in pairs]
        limit = self.max_sentence_tokens
        too_long = (src.lengths > limit) | (tgt.lengths > limit)
        if split == "train":
            self.stats["train_dropped_too_long"] = int(too_long.sum())
            if too_long.any():
                rank_zero_info(
                    f"TranslationDataModule: dropped {int(too_long.sum())} of {len(pairs)} train pairs longer than "
                    f"max_sentence_tokens={limit}"
                )
                keep = ~too_long
                src, tgt = src.select(keep), tgt.select(keep)
                src_texts = [text for text, kept in zip(src_texts, keep, strict=True) if kept]
                tgt_texts = [text for text, kept in zip(tgt_texts, keep, strict=True) if kept]
        else:
            self.stats[f"{split}_truncated"] = int(too_long.sum())
            src, tgt = src.truncated(limit), tgt.truncated(limit)
        return TranslationDataset(src, tgt, src_texts, tgt_texts)

    def _encoded_pairs(self) -> dict[str, PackedSequences]:
        """Ids of every split's pairs without special tokens, keyed "{split}-{stored side}"; cached as .npz."""
        if self._encoded is None:
            tokenizer_hashes = [_hash(self._tokenizer(side).to_str()) for side in (0, 1)]
            key = _hash({"pairs": self._fingerprint(), "tokenizers": tokenizer_hashes})
            path = self.cache_dir / f"translation-ids-{key}.npz"
            if path.exists():
                with np.load(path) as arrays:
                    self._encoded = {
                        name: PackedSequences(arrays[f"{name}-ids"], arrays[f"{name}-offsets"])
                        for name in (f"{split}-{side}" for split in SPLITS for side in (0, 1))
                    }
            else:
                self._encoded = {
                    f"{split}-{side}": PackedSequences.from_lists(
                        self._tokenizer(side).encode_batch([pair[side] for pair in pairs])
                    )
                    for split, pairs in self._split_pairs().items()
                    for side in (0, 1)
                }
                arrays = {}
                for name, packed in self._encoded.items():
                    arrays[f"{name}-ids"], arrays[f"{name}-offsets"] = packed.ids, packed.offsets
                with atomic_open(path) as f:
                    np.savez(f, **arrays)
        return self._encoded

    def _tokenizer(self, side: int) -> Tokenizer:
        """The tokenizer of stored side 0 or 1 (both the joint one), loaded from the cache or trained."""
        name = "joint" if self.joint_vocab else ("first", "second")[side]
        if name not in self._tokenizers:
            key = _hash({"pairs": self._fingerprint(), "vocab_size": self.bpe_vocab_size, "side": name})
            path = self.cache_dir / f"translation-tokenizer-{key}-{name}.json"
            if path.exists():
                tokenizer = Tokenizer.from_file(path)
            else:
                train = self._split_pairs()["train"]
                if not train:
                    raise ValueError(f"the train split has no sentence pairs ({self._describe_source('train')})")
                sides = (0, 1) if self.joint_vocab else (side,)
                tokenizer = Tokenizer.train_bpe((pair[s] for s in sides for pair in train), self.bpe_vocab_size)
                tokenizer.save(path)
            self._tokenizers[name] = tokenizer
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
                    split: {kind: [_file_stamp(p) for p in paths] for kind, paths in files.items()}
                    for split, files in sources.items()
                }
            self._fingerprint_value = {"format": _CACHE_FORMAT_VERSION, "sources": sources}
        return self._fingerprint_value

    def _split_pairs(self) -> dict[str, list[Pair]]:
        """Each split's (first side, second side) pairs, from the cache or extracted (and cached)."""
        if self._pairs is None:
            path = self.cache_dir / f"translation-pairs-{_hash(self._fingerprint())}.json"
            if path.exists():
                cached = json.loads(path.read_text(encoding="utf-8"))
            else:
                pairs, stats = self._extract_pairs()
                cached = {"pairs": pairs, "stats": stats}
                atomic_write_bytes(path, json.dumps(cached, ensure_ascii=False).encode("utf-8"))
            self._pairs = {split: [tuple(pair) for pair in cached["pairs"][split]] for split in SPLITS}
            self.stats.update(cached["stats"])
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
            return {"tsv": _expand(tsv_patterns, f"{prefix}tsv_files")}
        if src is not None:
            return {"src": _expand([src], f"{prefix}src_file"), "tgt": _expand([tgt], f"{prefix}tgt_file")}
        return {}

    def _read_split_files(self, split: str) -> tuple[list[Pair], int]:
        """(pairs, number of pairs skipped for an empty side) of a split's files; ([], 0) when it has none."""
        files = self._split_files(split)
        if "tsv" in files:
            pairs = [pair for path in files["tsv"] for pair in _read_tsv(path)]
        elif "src" in files:
            pairs = _read_parallel(files["src"][0], files["tgt"][0])
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


def _named_split_files(split_files: dict[str, tuple]) -> list[tuple[str, object]]:
    return [
        (f"{split}_{kind}", value)
        for split, values in split_files.items()
        for kind, value in zip(("tsv_files", "src_file", "tgt_file"), values, strict=True)
    ]


def _read_utf8(path: Path) -> str:
    """A file's UTF-8 text (a leading byte-order mark dropped); errors name the file, byte offset and line."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(
            f"{path} is not UTF-8 text: byte 0x{data[error.start]:02x} at byte offset {error.start} (line {line}: "
            f"{error.reason}); convert it, e.g. `iconv -f latin1 -t utf-8`"
        ) from error
    return text.removeprefix("\ufeff")


def _lines(path: Path) -> list[str]:
    """The file's lines, split on "\\n" only (so other Unicode line breaks stay inside a sentence), "\\r" dropped."""
    text = _read_utf8(path)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start another
    return [line.removesuffix("\r") for line in lines]


def _read_tsv(path: Path) -> list[Pair]:
    pairs = []
    for number, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2:
            raise ValueError(
                f"{path}, line {number}: no tab; each line must be 'source<TAB>target' (line starts {line[:60]!r})"
            )
        pairs.append((fields[0].strip(), fields[1].strip()))
    return pairs


def _read_parallel(src_path: Path, tgt_path: Path) -> list[Pair]:
    src_lines, tgt_lines = _lines(src_path), _lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise ValueError(
            f"the line-aligned files differ in length: {src_path} has {len(src_lines)} lines, {tgt_path} has "
            f"{len(tgt_lines)}; line i of one must translate line i of the other"
        )
    return [(src.strip(), tgt.strip()) for src, tgt in zip(src_lines, tgt_lines, strict=True)]


def _truncate(ids: list[int], limit: int) -> list[int]:
    """`ids` cut to `limit` tokens, the last one replaced by EOS when cut."""
    return ids if len(ids) <= limit else ids[: limit - 1] + [EOS_ID]
