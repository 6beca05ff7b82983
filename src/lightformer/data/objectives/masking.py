"""BERT masking, T5 span corruption and NSP pairs, and their datasets (docs/data.md, "Pretraining objectives")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset

from lightformer.data.loading.sampling import Key, index_and_epoch
from lightformer.data.loading.streaming import Windows
from lightformer.tokenization.text import BOS_ID, EOS_ID, PAD_ID, Tokenizer

# The label of positions that carry no loss: the default `ignore_index` of torch.nn.functional.cross_entropy.
IGNORE_INDEX = -100


def mask_tokens(
    ids: np.ndarray,
    rng: np.random.Generator,
    *,
    mask_id: int,
    vocab_size: int,
    maskable: np.ndarray,
    probability: float = 0.15,
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
    word_starts: np.ndarray | None = None,
    random_low: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """BERT's masked-LM corruption of one sequence: (inputs, labels), int64, labels `IGNORE_INDEX` but where selected.

    Args:
        ids: `(seq,)` integer token ids, all in [0, `vocab_size`).
        rng: the only source of randomness.
        mask_id: the [MASK] token id, in [0, `vocab_size`).
        vocab_size: number of token ids; random replacements are below it.
        maskable: `(seq,)` bool, False at special tokens that must never be selected.
        probability: share of maskable tokens selected for prediction, in (0, 1].
        mask_fraction: share of the selected tokens replaced by `mask_id`.
        random_fraction: share of the selected tokens replaced by a random token; the rest stays unchanged.
        word_starts: `(seq,)` bool, True where a token begins a new word; None masks single tokens.
        random_low: smallest id a random replacement may take (no [CLS] or [PAD] in the text), in [0, `vocab_size`).
    """
    ids = _as_ids(ids, "ids")
    maskable = _as_flags(maskable, "maskable", len(ids))
    if word_starts is not None:
        word_starts = _as_flags(word_starts, "word_starts", len(ids))
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be at least 1, got {vocab_size}")
    if not 0 <= mask_id < vocab_size:
        raise ValueError(f"mask_id={mask_id} is out of range: it must lie in [0, vocab_size={vocab_size})")
    if not 0 <= random_low < vocab_size:
        raise ValueError(f"random_low={random_low} is out of range: it must lie in [0, vocab_size={vocab_size})")
    if not 0 < probability <= 1:
        raise ValueError(f"probability must lie in (0, 1], got {probability}")
    if mask_fraction < 0 or random_fraction < 0 or mask_fraction + random_fraction > 1 + 1e-9:
        raise ValueError(
            f"mask_fraction={mask_fraction} and random_fraction={random_fraction} must both be >= 0 "
            "with a sum of at most 1 (the rest of the selected tokens stays unchanged)"
        )
    if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"ids must lie in [0, vocab_size={vocab_size}), found [{ids.min()}, {ids.max()}]")

    num_maskable = int(maskable.sum())
    num_to_select = max(1, round(probability * num_maskable)) if num_maskable else 0
    selected = np.zeros(len(ids), dtype=bool)
    if word_starts is None:
        selected[rng.choice(np.flatnonzero(maskable), size=num_to_select, replace=False)] = True
    elif num_maskable:
        after_special = np.concatenate(([True], ~maskable[:-1]))
        begins_word = maskable & (word_starts | after_special)
        word_of_token = (np.cumsum(begins_word) - 1)[maskable]  # the word of each maskable token
        word_lengths = np.bincount(word_of_token).tolist()
        chosen = np.zeros(len(word_lengths), dtype=bool)
        total = 0
        for word in rng.permutation(len(word_lengths)).tolist():
            if total >= num_to_select:
                break
            if total + word_lengths[word] <= num_to_select:
                chosen[word] = True
                total += word_lengths[word]
        selected[maskable] = chosen[word_of_token]

    positions = np.flatnonzero(selected)
    inputs = ids.astype(np.int64)  # a copy: `ids` itself is never modified
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
    labels[positions] = inputs[positions]
    u = rng.random(len(positions))
    inputs[positions[u < mask_fraction]] = mask_id
    replaced = positions[(u >= mask_fraction) & (u < mask_fraction + random_fraction)]
    inputs[replaced] = rng.integers(random_low, vocab_size, size=len(replaced))
    return inputs, labels


def random_spans_noise_mask(
    length: int, rng: np.random.Generator, noise_density: float = 0.15, mean_span_length: float = 3.0
) -> np.ndarray:
    """`(length,)` bool mask, True on noise: T5's `random_spans_noise_mask` (docs/data.md), no span empty."""
    num_noise_tokens, num_noise_spans = _noise_span_counts(length, noise_density, mean_span_length, "length")
    noise_lengths = _random_segmentation(num_noise_tokens, num_noise_spans, rng)
    nonnoise_lengths = _random_segmentation(length - num_noise_tokens, num_noise_spans, rng)
    interleaved = np.stack([nonnoise_lengths, noise_lengths], axis=1).reshape(-1)
    span_starts = np.zeros(length, dtype=np.int64)
    span_starts[np.cumsum(interleaved)[:-1]] = 1
    return np.cumsum(span_starts) % 2 == 1  # spans 0, 2, 4, ... are non-noise, 1, 3, 5, ... noise


def span_corruption_lengths(length: int, noise_density: float, mean_span_length: float) -> tuple[int, int, int]:
    """``(spans, source_length, target_length)`` of span corruption of any segment of ``length`` tokens."""
    noise = random_spans_noise_mask(length, np.random.default_rng(0), noise_density, mean_span_length)
    num_spans = int((noise & ~np.concatenate(([False], noise[:-1]))).sum())
    num_noise = int(noise.sum())
    return num_spans, length - num_noise + num_spans + 1, num_noise + num_spans + 2


def span_corruption(
    ids: np.ndarray,
    rng: np.random.Generator,
    *,
    sentinel_ids: Sequence[int] | np.ndarray,
    noise_density: float = 0.15,
    mean_span_length: float = 3.0,
) -> tuple[np.ndarray, np.ndarray]:
    """T5's span corruption of one sequence: (inputs, targets), int64, no EOS added (docs/data.md).

    With sentinels X, Y, `a b c d e f g` → inputs `a X d e Y`, targets `X b c Y f g`.

    Args:
        ids: `(seq,)` integer token ids, at least 2 of them (one noise and one kept token).
        rng: the only source of randomness.
        sentinel_ids: distinct ids, at least as many as the noise spans.
        noise_density: share of the tokens that are noise, in (0, 1).
        mean_span_length: mean number of tokens in a noise span, at least 1.
    """
    ids = _as_ids(ids, "ids")
    sentinels = _as_sentinels(sentinel_ids)
    _, num_noise_spans = _noise_span_counts(len(ids), noise_density, mean_span_length, "ids")
    if num_noise_spans > len(sentinels):
        raise ValueError(
            f"sentinel_ids has {len(sentinels)} ids, but a sequence of {len(ids)} tokens with "
            f"noise_density={noise_density} and mean_span_length={mean_span_length} has {num_noise_spans} noise "
            "spans, each needing its own sentinel: pass more sentinel_ids"
        )
    if np.isin(ids, sentinels).any():
        raise ValueError("ids contains some of sentinel_ids: the targets could not be told apart from the spans")
    noise = random_spans_noise_mask(len(ids), rng, noise_density, mean_span_length)
    span_starts = noise & ~np.concatenate(([False], noise[:-1]))
    inputs = ids.astype(np.int64)
    inputs[span_starts] = sentinels[: int(span_starts.sum())]
    targets = np.insert(ids[noise].astype(np.int64), np.flatnonzero(span_starts[noise]), inputs[span_starts])
    return inputs[~noise | span_starts], targets


def reconstruct_from_spans(
    inputs: np.ndarray, targets: np.ndarray, sentinel_ids: Sequence[int] | np.ndarray
) -> np.ndarray:
    """The sequence `span_corruption` corrupted into (inputs, targets); lenient (strip EOS and padding first)."""
    inputs = _as_ids(inputs, "inputs")
    targets = _as_ids(targets, "targets")
    sentinels = _as_sentinels(sentinel_ids)
    starts = np.flatnonzero(np.isin(targets, sentinels))
    ends = np.append(starts[1:], len(targets))
    fills: dict[int, np.ndarray] = {}
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        fills.setdefault(int(targets[start]), targets[start + 1 : end])
    pieces, previous = [], 0
    for position in np.flatnonzero(np.isin(inputs, sentinels)).tolist():
        pieces += [inputs[previous:position], fills.get(int(inputs[position]), targets[:0])]
        previous = position + 1
    pieces.append(inputs[previous:])
    return np.concatenate(pieces).astype(np.int64)


def nsp_pair(
    segment_a: np.ndarray, segment_b: np.ndarray, *, cls_id: int, sep_id: int, max_length: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """BERT's NSP input `[CLS] A [SEP] B [SEP]`, at most `max_length` (≥ 5), cut as `truncate_seq_pair`; int64."""
    segment_a = _as_ids(segment_a, "segment_a")
    segment_b = _as_ids(segment_b, "segment_b")
    if max_length < 5:
        raise ValueError(
            f"max_length must be at least 5 ([CLS], [SEP], [SEP] and a token of each segment), got {max_length}"
        )
    a_start, a_end, b_start, b_end = 0, len(segment_a), 0, len(segment_b)
    excess = len(segment_a) + len(segment_b) - (max_length - 3)
    for from_front in (rng.random(max(excess, 0)) < 0.5).tolist():
        if a_end - a_start > b_end - b_start:
            a_start, a_end = (a_start + 1, a_end) if from_front else (a_start, a_end - 1)
        else:
            b_start, b_end = (b_start + 1, b_end) if from_front else (b_start, b_end - 1)
    ids = np.concatenate(
        ([cls_id], segment_a[a_start:a_end], [sep_id], segment_b[b_start:b_end], [sep_id]), dtype=np.int64
    )
    segment_ids = np.zeros(len(ids), dtype=np.int64)
    segment_ids[a_end - a_start + 2 :] = 1
    return ids, segment_ids


def _noise_span_counts(length: int, noise_density: float, mean_span_length: float, name: str) -> tuple[int, int]:
    """(num_noise_tokens, num_noise_spans) of T5's span corruption; `name` is what error messages call the length."""
    if not 0 < noise_density < 1:
        raise ValueError(f"noise_density must lie in (0, 1), got {noise_density}")
    if not mean_span_length >= 1:
        raise ValueError(f"mean_span_length must be at least 1, got {mean_span_length}")
    if length < 2:
        what = "length is" if name == "length" else f"{name} has length"
        raise ValueError(f"{what} {length}: span corruption needs at least 2 tokens (one noise, one kept)")
    num_noise_tokens = min(max(int(np.round(length * noise_density)), 1), length - 1)
    num_noise_spans = max(1, int(np.round(num_noise_tokens / mean_span_length)))
    return num_noise_tokens, min(num_noise_spans, num_noise_tokens, length - num_noise_tokens)


def _random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """`(num_segments,)` positive lengths summing to `num_items`, every such split equally likely (T5's)."""
    first_in_segment = np.zeros(num_items, dtype=np.int64)
    first_in_segment[1:] = rng.permutation(np.arange(num_items - 1) < num_segments - 1)
    return np.bincount(np.cumsum(first_in_segment), minlength=num_segments)


def _as_ids(ids: np.ndarray | Sequence[int], name: str) -> np.ndarray:
    """`ids` as a 1-D integer array (an empty list counts as integers), or a ValueError naming `name`."""
    array = np.asarray(ids)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of token ids, got shape {array.shape}")
    if array.size == 0:
        return array.astype(np.int64)
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must hold integer token ids, got dtype {array.dtype}")
    return array


def _as_flags(flags: np.ndarray, name: str, length: int) -> np.ndarray:
    array = np.asarray(flags)
    if array.shape != (length,):
        raise ValueError(f"{name} must have the shape of ids, ({length},), got {array.shape}")
    if array.dtype != np.bool_:
        raise ValueError(f"{name} must be a bool array, got dtype {array.dtype}")
    return array


def _as_sentinels(sentinel_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    sentinels = _as_ids(sentinel_ids, "sentinel_ids").astype(np.int64)
    if len(np.unique(sentinels)) != len(sentinels):
        raise ValueError("sentinel_ids must be distinct: each noise span needs its own sentinel")
    return sentinels


def span_corruption_max_length(segment_tokens: int, noise_density: float, mean_span_length: float) -> int:
    """``SpanCorruptionDataModule``'s ``max_length`` for these values, without building it."""
    _, source_length, target_length = span_corruption_lengths(segment_tokens, noise_density, mean_span_length)
    return max(source_length, target_length - 1)


@dataclass(eq=False)
class _Segments(Dataset):
    """A prepared split's windows as segments, and each example's generator (``fixed``: every epoch as epoch 0)."""

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
    """BERT examples masked by `mask_tokens`: {"ids", "segment_ids", "labels": `(seq,)` int64, "nsp_label" with nsp}."""

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
    """T5 examples: segment i through `span_corruption`, as a pair {"src", "tgt", "src_text", "tgt_text"}."""

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
    """MaskedLMDataset items → {"ids", "segment_ids", "labels": (B, T) int64, padded; "nsp_labels": (B,) if any}."""

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


def word_boundary_tables(tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Per token id of a byte-level BPE: (starts a word, ends a line), both `(vocab_size,)` bool; specials neither."""
    texts = [tokenizer.decode([i], skip_special=False) for i in range(tokenizer.vocab_size)]
    special = set(tokenizer.special_ids)
    starts = np.array([i not in special and t[:1].isspace() for i, t in enumerate(texts)], dtype=bool)
    ends = np.array([i not in special and t.endswith("\n") for i, t in enumerate(texts)], dtype=bool)
    return starts, ends
