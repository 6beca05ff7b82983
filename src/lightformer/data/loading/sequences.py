"""Sequence-pair batches: dataset items of source and target ids padded into two tensors."""

from __future__ import annotations

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence


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
