"""Samplers and loaders of map-style datasets: epoch-seeded, resumable mid-epoch, every example once under DDP."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler

from lightformer.nn.checks import check_at_least

Key = int | tuple[int, int]  # a dataset index, or (index, epoch) from EpochShuffleSampler(with_epoch=True)


def index_and_epoch(key: Key) -> tuple[int, int]:
    """(index, epoch) of a dataset key: an evaluation loader's plain index draws as epoch 0."""
    index, epoch = key if isinstance(key, tuple) else (key, 0)
    return int(index), int(epoch)


class EpochShuffleSampler(Sampler[int]):
    """A permutation of ``range(size)`` from (seed, epoch) alone; ``with_epoch``: yield ``(index, epoch)`` keys."""

    def __init__(self, size: int, seed: int, with_epoch: bool = False) -> None:
        self.size, self.seed, self.epoch, self.with_epoch = size, seed, 0, with_epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int | tuple[int, int]]:
        # a generator: the permutation is drawn at the first batch, after Lightning has called set_epoch
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        yield from ((index, self.epoch) for index in order) if self.with_epoch else order

    def __len__(self) -> int:
        return self.size


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` whose position in an epoch goes in every checkpoint (docs/data.md, "What streaming does")."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._epoch: int | None = None  # the epoch of the batches counted, if the sampler says
        self._handed_out = 0  # batches handed out in that epoch
        self._restored: dict | None = None  # a state to resume from at the next iteration

    def state_dict(self) -> dict[str, int | None]:
        return {"epoch": self._epoch, "batches": self._handed_out}

    def load_state_dict(self, state: dict[str, int | None]) -> None:
        self._restored = dict(state)

    @property
    def _index_sampler(self):
        # What every iterator draws indices from (kept by persistent workers), less the batches trained on.
        return _Skipping(self, super()._index_sampler)

    def __iter__(self):
        self._epoch = self._sampler_epoch()
        self._handed_out = self._batches_to_skip()
        if self._handed_out:
            with torch.random.fork_rng(devices=[]):
                batches = super().__iter__()
        else:
            batches = super().__iter__()
        for batch in batches:
            self._handed_out += 1  # before handing it out: a checkpoint written during its step counts it
            yield batch

    def _sampler_epoch(self) -> int | None:
        for holder in (self.batch_sampler, getattr(self.batch_sampler, "sampler", None), self.sampler):
            if isinstance(epoch := getattr(holder, "epoch", None), int):
                return epoch
        return None

    def _batches_to_skip(self) -> int:
        """The batches the restored state says were trained on in the epoch now starting (0 if none); used once."""
        restored, self._restored = self._restored, None
        if restored is None or restored["epoch"] != self._epoch:
            return 0
        batches = int(restored["batches"])
        return batches if batches < len(self) else 0


class _Skipping:
    """A ``ResumableDataLoader``'s index sampler from its position; a weak reference (persistent workers: no cycle)."""

    def __init__(self, loader: ResumableDataLoader, index_sampler: Sampler | BatchSampler) -> None:
        self.loader, self.index_sampler = weakref.ref(loader), index_sampler

    def __iter__(self) -> Iterator:
        return itertools.islice(iter(self.index_sampler), self.loader()._handed_out, None)

    def __len__(self) -> int:
        return len(self.index_sampler)


def map_loader(dataset: Dataset, config, sampler=None, resumable: bool = False, **options) -> DataLoader:
    """A map-style dataset's loader from ``config``, workers kept across epochs; ``resumable``: resumable mid-epoch."""
    if "batch_sampler" not in options:
        options["batch_size"] = config.batch_size
    return (ResumableDataLoader if resumable else DataLoader)(
        dataset,
        sampler=sampler,
        num_workers=config.num_workers,
        persistent_workers=config.num_workers > 0,
        pin_memory=torch.cuda.is_available() if config.pin_memory is None else config.pin_memory,
        **options,
    )


def evaluation_sampler(dataset: Dataset) -> Sampler | None:
    """Under DDP, ``UnrepeatedDistributedSampler`` (each example once); else None."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    several = distributed and torch.distributed.get_world_size() > 1
    return UnrepeatedDistributedSampler(dataset, shuffle=False) if several else None


class _EpochCounter:
    """Holds the epoch. Lightning's loops call `set_epoch` on `batch_sampler.sampler`, not on the batch sampler."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class TokenBudgetBatchSampler(BatchSampler):
    """Batches whose padded size stays within `max_tokens`, from (seed, epoch), as many per rank (docs/data.md).

    Args:
        lengths: per example, the longer of its source and target length in tokens.
        max_tokens: budget of one batch in padded tokens (per side).
        shuffle: random tie-breaking and batch order (training); False gives the same batches every time.
        seed: seed of the shuffling; the same on every rank.
        num_replicas: number of distributed ranks; default: from `sampler`, else `torch.distributed`, else 1.
        rank: this process's rank; default: from `sampler`, else `torch.distributed`, else 0.
        sampler: a `DistributedSampler` to take the ranks and epoch from; its order is not used.
        blocks: the number of blocks; `len(lengths)` must be a multiple of it.
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
        blocks: int = 1,
    ) -> None:
        # No BatchSampler.__init__ (a fixed batch size); subclassing lets Lightning inject its sampler as `sampler`.
        check_at_least("max_tokens", max_tokens, 1)
        if (num_replicas is None) != (rank is None):
            raise ValueError(
                f"give both num_replicas and rank or neither; got num_replicas={num_replicas}, rank={rank}"
            )
        if num_replicas is not None and not 0 <= rank < num_replicas:
            raise ValueError(f"rank={rank} must be in [0, num_replicas={num_replicas})")
        if blocks < 1 or len(lengths) % blocks:
            raise ValueError(f"blocks={blocks} must be at least 1 and divide the {len(lengths)} examples")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.blocks = blocks
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
        rng = np.random.default_rng((self.seed, epoch)) if self.shuffle else None
        batches = self._block_batches(epoch % self.blocks, rng)
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        num_replicas = self.replicas()[0]
        return _split_to_count(batches, len(self) * num_replicas)

    def __iter__(self) -> Iterator[list[int]]:
        num_replicas, rank = self.replicas()
        yield from self.all_batches()[rank::num_replicas]

    def __len__(self) -> int:
        """Batches per rank and epoch: the most any block groups into, rounded up to a multiple of the ranks."""
        num_replicas, _ = self.replicas()
        if num_replicas not in self._num_batches:
            # The count depends only on the sorted lengths, not on the tie-breaking or the batch order.
            most = max(len(self._block_batches(block)) for block in range(self.blocks))
            self._num_batches[num_replicas] = -(-most // num_replicas)
        return self._num_batches[num_replicas]

    def _block_batches(self, block: int, rng: np.random.Generator | None = None) -> list[list[int]]:
        """A block's examples grouped by length under the budget, ties broken by `rng` if given, else by index."""
        size = len(self.lengths) // self.blocks
        lengths = self.lengths[block * size : (block + 1) * size]
        order = np.argsort(lengths, kind="stable") if rng is None else np.lexsort((rng.random(size), lengths))
        return _group_by_budget((order + block * size).tolist(), self.lengths.tolist(), self.max_tokens)


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


def _split_to_count(batches: list[list[int]], count: int) -> list[list[int]]:
    """Halve the largest batches until there are `count`; with too few examples, repeat batches from the start."""
    batches = list(batches)
    while (shortfall := count - len(batches)) > 0 and any(len(batch) > 1 for batch in batches):
        largest = sorted(range(len(batches)), key=lambda i: -len(batches[i]))[:shortfall]
        for i in sorted((i for i in largest if len(batches[i]) > 1), reverse=True):
            half = len(batches[i]) // 2
            batches[i : i + 1] = [batches[i][:half], batches[i][half:]]
    if batches and (shortfall := count - len(batches)) > 0:
        batches += [batches[i % len(batches)] for i in range(shortfall)]
    return batches


class CanvasBatchSampler(TokenBudgetBatchSampler):
    """Batches of ``batch_size`` indices of one canvas each (``canvases``: one per example), dealt to the ranks."""

    def __init__(
        self,
        canvases: Sequence[int] | np.ndarray,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        sampler: Sampler | None = None,
        with_epoch: bool = False,
    ) -> None:
        super().__init__(np.zeros(0, np.int64), batch_size, shuffle, seed, num_replicas, rank, sampler)
        self.lengths = np.asarray(canvases, dtype=np.uint8)
        self.batch_size, self.with_epoch = batch_size, with_epoch

    def _block_batches(self, block: int, rng: np.random.Generator | None = None) -> list[np.ndarray]:
        """Each canvas's examples (in ``rng``'s order, else by index) cut into batches: views of one array."""
        batches: list[np.ndarray] = []
        for canvas in np.unique(self.lengths):
            members = np.flatnonzero(self.lengths == canvas)
            if rng is not None:
                members = members[rng.permutation(len(members))]
            batches += [members[i : i + self.batch_size] for i in range(0, len(members), self.batch_size)]
        return batches

    def __iter__(self) -> Iterator[list]:
        epoch = self.epoch
        for batch in super().__iter__():
            yield [(index, epoch) for index in batch.tolist()] if self.with_epoch else batch.tolist()
