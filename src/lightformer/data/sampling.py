"""Samplers: shuffling that a resumed run repeats exactly, and evaluation that sees every example once under DDP."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler


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


class EvaluationShardSampler(DistributedSampler):
    """Under DDP, rank r evaluates examples r, r + n, r + 2n, ... of n ranks: every example exactly once.

    Lightning's default for evaluation, ``DistributedSampler``, repeats a few examples so that every rank gets
    as many, which skews validation and test metrics (the metrics are synchronised sums, so uneven shards are
    exact). Being a ``DistributedSampler``, Lightning keeps it instead of injecting its own.
    """

    def __init__(self, dataset: Dataset) -> None:
        super().__init__(dataset, shuffle=False)  # the rank and world size come from torch.distributed

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, len(self.dataset), self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, len(self.dataset), self.num_replicas))


def evaluation_sampler(dataset: Dataset) -> Sampler | None:
    """An ``EvaluationShardSampler`` when several processes are running, else None (the loader's order)."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return EvaluationShardSampler(dataset) if distributed and torch.distributed.get_world_size() > 1 else None
