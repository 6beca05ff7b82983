"""Sequence-pair batches: dataset items of source and target ids padded into two tensors."""

from __future__ import annotations

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence


def bucket_lengths(lengths: np.ndarray | int, multiple: int, limit: int) -> np.ndarray | int:
    """The length a batch whose longest has ``lengths`` tokens is padded to: the next multiple, at most ``limit``."""
    rounded = -(-np.asarray(lengths) // multiple) * multiple
    bucketed = np.maximum(np.minimum(rounded, limit), lengths)
    return int(bucketed) if np.ndim(bucketed) == 0 else bucketed


def collate_pairs(
    items: list[dict[str, np.ndarray | str]],
    pad_id: int,
    length_multiple: int | None = None,
    limit: int | None = None,
    max_tokens: int | None = None,
) -> dict[str, torch.Tensor | list[str]]:
    """Dataset items → {"src", "tgt" int64 right-padded with ``pad_id``, "src_text", "tgt_text"} (docs/data.md)."""
    sides = {
        side: [torch.from_numpy(np.asarray(item[side], dtype=np.int64)) for item in items] for side in ("src", "tgt")
    }
    if length_multiple is not None:
        longest = max(len(ids) for side in sides.values() for ids in side)
        length = bucket_lengths(longest, length_multiple, limit if limit is not None else longest)
        extra = max(max_tokens // length - len(items), 0) if max_tokens is not None else 0
        sides["src"] += [sides["src"][0]] * extra
        sides["tgt"] += [sides["tgt"][0][:1]] * extra
        sides = {side: [*ids, torch.full((length,), pad_id, dtype=torch.int64)] for side, ids in sides.items()}
    batch: dict[str, torch.Tensor | list[str]] = {side: pad_sequence(ids, True, pad_id) for side, ids in sides.items()}
    if length_multiple is not None:
        batch = {side: padded[:-1] for side, padded in batch.items()}  # without the row that set the length
    batch["src_text"] = [item["src_text"] for item in items]
    batch["tgt_text"] = [item["tgt_text"] for item in items]
    return batch
