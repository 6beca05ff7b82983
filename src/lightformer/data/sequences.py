"""Token sequences: many variable-length id sequences packed in two arrays, a dataset of sentence pairs built on
them, and their padding into batches."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset

from lightformer.data.tokenizers import BOS_ID, EOS_ID


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

    @classmethod
    def concatenate(cls, parts: Sequence[PackedSequences]) -> PackedSequences:
        """The sequences of `parts`, one after another."""
        if len(parts) == 1:
            return parts[0]
        lengths = np.concatenate([part.lengths for part in parts])
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(np.concatenate([part.ids for part in parts]), offsets)

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


def collate_pairs(items: list[dict[str, np.ndarray | str]], pad_id: int) -> dict[str, torch.Tensor | list[str]]:
    """Dataset items → {"src": (B, S), "tgt": (B, T) int64 padded on the right with ``pad_id``, "src_text",
    "tgt_text": lists}; S and T are the batch's longest source and target."""
    batch: dict[str, torch.Tensor | list[str]] = {
        side: pad_sequence([torch.from_numpy(np.asarray(item[side], dtype=np.int64)) for item in items], True, pad_id)
        for side in ("src", "tgt")
    }
    batch["src_text"] = [item["src_text"] for item in items]
    batch["tgt_text"] = [item["tgt_text"] for item in items]
    return batch


def truncate(ids: list[int], limit: int) -> list[int]:
    """`ids` cut to `limit` tokens, the last one replaced by EOS when cut."""
    return ids if len(ids) <= limit else ids[: limit - 1] + [EOS_ID]
