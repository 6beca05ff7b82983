"""Token sequences: many variable-length id sequences packed in two arrays, and their padding into batches."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

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
