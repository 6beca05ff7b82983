"""Prepared data to every process: training windows; windows, records by index (docs/data.md, "What streaming does")."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from litdata import StreamingDataLoader, StreamingDataset, TokensLoader
from litdata.streaming.resolver import Dir
from torch.utils.data import Dataset, Subset

from lightformer.data.preparation.prepare import LENGTHS
from lightformer.nn.checks import check_at_least
from lightformer.training.internals import samples_yielded


@dataclass(frozen=True)
class LoaderConfig:
    """How batches are loaded (``data.loader``), the one loader config of every family.

    Args:
        batch_size: examples per batch (per process).
        num_workers: loader worker processes per training process; 0: the main process.
        pin_memory: pin batches in page-locked memory for faster copies to a GPU; None: when a GPU is present.
        val_windows: text only: validate during ``fit`` on this many windows of the validation split; None: all.
    """

    batch_size: int = 12
    num_workers: int = 0
    pin_memory: bool | None = None
    val_windows: int | None = None

    def __post_init__(self) -> None:
        check_at_least("data.loader.batch_size", self.batch_size, 1)
        check_at_least("data.loader.num_workers", self.num_workers, 0)
        if self.val_windows is not None and self.val_windows < 1:
            raise ValueError(
                f"data.loader.val_windows={self.val_windows} must be at least 1, or null to validate on the whole split"
            )


def as_pair(window: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of a window of ``block_size + 1`` ids: y is the id after each of x; both (block_size,) int64."""
    ids = torch.as_tensor(np.asarray(window, dtype=np.int64))
    return ids[:-1], ids[1:]


def training_loader(
    split_dir: str | Dir, block_size: int, loader: LoaderConfig, seed: int, epoch: Callable[[], int] | None = None
) -> StreamingDataLoader:
    """Shuffled training windows of a split, a rank's share, resumable; ``epoch()``: the epochs done, for the order."""
    dataset = StreamingDataset(
        split_dir,
        item_loader=TokensLoader(block_size=block_size + 1),
        shuffle=True,
        seed=seed,
        drop_last=True,  # every rank gets as many windows
        item_shuffle_window="full",  # a permutation of each shard's windows, not of blocks of 256
        transform=as_pair,
    )
    return ResumableStreamingDataLoader(
        dataset,
        batch_size=loader.batch_size,
        num_workers=loader.num_workers,
        drop_last=True,  # one batch shape
        pin_memory=torch.cuda.is_available(),
        persistent_workers=loader.num_workers > 0,
        epoch=epoch,
    )


class ResumableStreamingDataLoader(StreamingDataLoader):
    """LitData's loader, its epoch order from the seed and the epoch alone however the run was resumed (``epoch()``)."""

    def __init__(self, *args, epoch: Callable[[], int] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.epoch = epoch
        self._counting = False  # whether current_epoch is this loader's own count (restored or iterated)

    def __iter__(self):
        if not self._counting and not self.restore and self.epoch is not None:
            self.current_epoch = self.epoch()  # LitData adds one as the epoch starts
        self._counting = True
        batches = super().__iter__()
        if self.restore:  # a DataLoader iterator draws its base seed from the global generator as it starts: the
            # run being resumed drew it at the epoch's start, so here it must not move dropout's random numbers
            with torch.random.fork_rng(devices=[]):
                first = next(batches, None)
            if first is None:
                return
            yield first
        yield from batches

    def load_state_dict(self, obj: dict) -> None:
        """LitData's, with the shards where this run has them (LitData's state holds an absolute folder)."""
        state = obj.get("dataset")
        if isinstance(state, dict) and "input_dir_path" in state:
            obj = {**obj, "dataset": {**state, "input_dir_path": self.dataset.input_dir.path,
                                      "input_dir_url": self.dataset.input_dir.url}}  # fmt: skip
        super().load_state_dict(obj)
        self._counting = True
        left = len(self.dataset) - samples_yielded(self)
        if self.restore and self.drop_last and left < self.batch_size:
            self.restore = False


def local_folder(split_dir: str | Dir) -> Path:
    """The local folder of a split: itself, or where a split in an object store keeps its index and its lengths."""
    return Path(split_dir.path if isinstance(split_dir, Dir) else split_dir)


class Windows(Dataset):
    """Every window of ``window`` ids of a prepared split, in order, by index (int64; not crossing a shard)."""

    def __init__(self, split_dir: str | Dir, window: int) -> None:
        self.split_dir = split_dir
        self.window = window
        chunks = json.loads((local_folder(split_dir) / "index.json").read_text())["chunks"]
        self.length = sum(chunk["dim"] // window for chunk in chunks)  # TokensLoader's count of windows
        self._dataset: StreamingDataset | None = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> np.ndarray:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} is out of range for {self.length} windows")
        if self._dataset is None:
            self._dataset = StreamingDataset(self.split_dir, item_loader=TokensLoader(block_size=self.window))
        return np.asarray(self._dataset[index], dtype=np.int64)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_dataset": None}


class EvaluationWindows(Windows):
    """Every (x, y) pair of a prepared split, in order, by index: windows of ``block_size + 1`` ids (``as_pair``)."""

    def __init__(self, split_dir: str | Dir, block_size: int) -> None:
        super().__init__(split_dir, block_size + 1)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return as_pair(super().__getitem__(index))


def validation_subset(dataset: Dataset, count: int, seed: int) -> Subset:
    """``count`` examples drawn once by ``seed``, in order: what ``fit`` validates on with ``loader.val_windows``."""
    chosen = np.random.default_rng(seed).choice(len(dataset), count, replace=False)
    return Subset(dataset, np.sort(chosen).tolist())


class Records(Dataset):
    """Every record of a prepared records split, by index (docs/data.md, "Random reads of records")."""

    def __init__(self, split_dir: str | Dir) -> None:
        self.split_dir = split_dir
        self.lengths = np.load(local_folder(split_dir) / LENGTHS, mmap_mode="r")  # records × fields, not read yet
        self._dataset: StreamingDataset | None = None

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} records")
        if self._dataset is None:
            self._dataset = StreamingDataset(self.split_dir, batch_decode=0)
        return self._dataset[int(index)]

    def __getitems__(self, indices: list[int]) -> list[dict]:
        read = {index: self[index] for index in sorted(set(indices))}
        return [read[index] for index in indices]

    def __getstate__(self) -> dict:
        return {"split_dir": self.split_dir}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["split_dir"])


ImageLoaderConfig = LoaderConfig  # the image families' own loader config until 42e7f06, one config since
