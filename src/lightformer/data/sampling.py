"""Shuffling that a resumed run repeats exactly."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class EpochShuffleSampler(Sampler[int]):
    """A random permutation of ``range(size)`` drawn from (seed, epoch) alone.

    ``DataLoader(shuffle=True, generator=...)`` advances one generator from epoch to epoch, so a run resumed at
    epoch 3 would replay epoch 1's order. Here Lightning's ``set_epoch`` picks the order, as with
    ``DistributedSampler``; under DDP Lightning wraps this sampler and gives each process its own shard.
    """

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        # a generator: the permutation is drawn at the first batch, after Lightning has called set_epoch
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from torch.randperm(self.size, generator=generator).tolist()

    def __len__(self) -> int:
        return self.size
