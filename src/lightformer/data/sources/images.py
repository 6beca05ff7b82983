"""Image datasets (``ImageSource``), their splits, and image folders prepared into records (docs/data.md, "Images")."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torchvision
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import TensorDataset

from lightformer.data.pieces import SPLITS
from lightformer.data.preparation.caching import content_hash, file_stamp
from lightformer.data.preparation.prepare import (
    PrepareConfig,
    piece_size,
    pieces,
    prepared_folder,
    stem_of,
    write_records,
)
from lightformer.data.sources.image_files import ImageFolderLayout, class_folder_files, image_file_records
from lightformer.errors import ConfigError, DataError

DatasetName = Literal["fashion_mnist", "mnist", "cifar10", "digits", "image_folder"]


# The test carve of a dataset without a test split, by a constant seed: it does not change with `seed`.
CARVED_TEST_FRACTION = 0.15
CARVED_TEST_SEED = 0
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ImageDatasetInfo:
    """What the model and the transforms need to know about a dataset before reading any of it."""

    in_channels: int
    image_size: int  # native side length in pixels (the default for `image_size`)
    horizontal_flip: bool  # whether a mirrored image keeps its label (not so for handwritten digits)
    mean: tuple[float, ...] | None = None  # per-channel, on [0, 1] pixels; None: computed from the train split
    std: tuple[float, ...] | None = None
    class_names: tuple[str, ...] = ()  # empty for image folders: read from disk
    default_val_size: int | None = None  # validation images when neither val_size nor val_fraction is given...
    default_val_fraction: float | None = None  # ...or this fraction of the pool
    train_pool_size: int | None = None  # images in the official train split, when known without reading it


def _mnist_like(dataset: type, mean: float, std: float, horizontal_flip: bool) -> ImageDatasetInfo:
    """A torchvision dataset of 60,000 training and 10,000 test grey 28×28 images."""
    return ImageDatasetInfo(in_channels=1, image_size=28, horizontal_flip=horizontal_flip, mean=(mean,), std=(std,),
                            class_names=tuple(dataset.classes), default_val_size=5000,
                            train_pool_size=60000)  # fmt: skip


DATASET_INFO: dict[str, ImageDatasetInfo] = {
    "fashion_mnist": _mnist_like(torchvision.datasets.FashionMNIST, 0.2860, 0.3530, horizontal_flip=True),
    "mnist": _mnist_like(torchvision.datasets.MNIST, 0.1307, 0.3081, horizontal_flip=False),
    "cifar10": ImageDatasetInfo(
        in_channels=3,
        image_size=32,
        horizontal_flip=True,
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
        # torchvision reads these from the downloaded meta file; the order is fixed by the dataset.
        class_names=("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
        default_val_size=5000,
        train_pool_size=50000,
    ),
    "digits": ImageDatasetInfo(
        in_channels=1, image_size=8, horizontal_flip=False, class_names=tuple("0123456789"), default_val_fraction=0.15
    ),
    "image_folder": ImageDatasetInfo(
        in_channels=3,
        image_size=224,
        horizontal_flip=True,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        default_val_fraction=0.15,
    ),
}
TORCHVISION_DATASETS = {
    "fashion_mnist": torchvision.datasets.FashionMNIST,
    "mnist": torchvision.datasets.MNIST,
    "cifar10": torchvision.datasets.CIFAR10,
}


# Where torchvision looks for each dataset's files, under `root`.
TORCHVISION_FOLDERS = {"fashion_mnist": "FashionMNIST/raw", "mnist": "MNIST/raw", "cifar10": "cifar-10-batches-py"}


def load_digits_as_images() -> TensorDataset:
    """scikit-learn's 1,797 handwritten digits as uint8 images (1797, 1, 8, 8), 0..16 scaled to 0..255, and labels."""
    from sklearn.datasets import load_digits  # here: scikit-learn takes a second to import

    digits = load_digits()
    pixels = np.round(digits.images * (255 / 16)).astype(np.uint8)
    return TensorDataset(torch.from_numpy(pixels).unsqueeze(1), torch.from_numpy(digits.target).long())


@dataclass(frozen=True)
class ImageSource:
    """Which images, and how their training pool splits (``data.source``; docs/data.md, "Images").

    Args:
        dataset: "fashion_mnist", "mnist", "cifar10" (torchvision's); "digits" (scikit-learn's 8×8); "image_folder".
        root: directory where torchvision datasets are stored (or downloaded to).
        download: let torchvision download a dataset missing under ``root`` (needs internet).
        image_folder: for "image_folder": a folder of train/ (optional val/, test/) of class subfolders, or those.
        val_size: validation images carved from the training pool by ``seed`` (5000; digits, folders: 15%; not val/).
        val_fraction: instead of ``val_size``, the share of the pool carved for validation, in [0, 1).
    """

    dataset: DatasetName = "fashion_mnist"
    root: str = "data"
    download: bool = True
    image_folder: str | None = None
    val_size: int | None = None
    val_fraction: float | None = None

    def __post_init__(self) -> None:
        if self.dataset not in DATASET_INFO:
            raise ValueError(f"data.source.dataset={self.dataset!r} is unknown; valid: {list(DATASET_INFO)}")
        if self.image_folder is not None and self.dataset != "image_folder":
            raise ValueError(
                f"data.source.image_folder={self.image_folder!r} is only read with dataset='image_folder', "
                f"not dataset={self.dataset!r}"
            )
        if self.val_size is not None and self.val_fraction is not None:
            raise ValueError(
                f"data.source: give val_size (a count, here {self.val_size}) or val_fraction (here "
                f"{self.val_fraction}), not both"
            )
        if self.val_fraction is not None and not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"data.source.val_fraction={self.val_fraction} must be in [0, 1)")
        if self.val_size is not None and self.val_size < 0:
            raise ValueError(f"data.source.val_size={self.val_size} must be at least 0 (a count of images)")
        if self.info.train_pool_size is not None:  # fail at construction, not after the model is built
            self.val_count(self.info.train_pool_size)

    @property
    def info(self) -> ImageDatasetInfo:
        return DATASET_INFO[self.dataset]

    def val_count(self, pool_size: int) -> int:
        """Validation images to carve from a pool of ``pool_size`` (the dataset's default without a given one)."""
        val_size, val_fraction = self.val_size, self.val_fraction
        if val_size is None and val_fraction is None:
            val_size, val_fraction = self.info.default_val_size, self.info.default_val_fraction
        if val_fraction is not None:
            return round(val_fraction * pool_size)
        if val_size >= pool_size:
            raise DataError(
                f"data.source.val_size={val_size} is invalid for {self.dataset}: the training pool it is carved from "
                f"has {pool_size} images; give a count in [0, {pool_size}), or val_fraction in [0, 1)"
            )
        return val_size


def carve_splits(
    pool_size: int, carve_test: bool, val_count_of: Callable[[int], int], carve_val: bool, seed: int
) -> tuple[list[int], list[int], list[int]]:
    """Indices 0..pool_size-1 as (train, val, test): test by CARVED_TEST_SEED, val by ``seed``; uncarved: empty."""
    remaining = torch.arange(pool_size)
    test_indices = torch.tensor([], dtype=torch.long)
    if carve_test:
        order = torch.randperm(pool_size, generator=torch.Generator().manual_seed(CARVED_TEST_SEED))
        test_count = round(CARVED_TEST_FRACTION * pool_size)
        test_indices, remaining = order[:test_count], order[test_count:]
    val_indices = torch.tensor([], dtype=torch.long)
    if carve_val:
        val_count = val_count_of(len(remaining))
        order = torch.randperm(len(remaining), generator=torch.Generator().manual_seed(seed))
        val_indices, remaining = remaining[order[:val_count]], remaining[order[val_count:]]
    return remaining.tolist(), val_indices.tolist(), test_indices.tolist()


# bump when what a prepared image folder holds changes meaning (2: the files as litdata File leaves)
IMAGE_RECORDS_VERSION = 2
CARVE = "carve.json"  # in a prepared image folder: each split's files, in record order
MAX_PIECE_FILES = 1000  # image files per piece a preparing worker holds at a time


def prepare_image_folder(
    layout: ImageFolderLayout, source: ImageSource, in_channels: int, seed: int, prepare: PrepareConfig
) -> Path:
    """Prepare an image folder once per job into each split's records (docs/data.md, "Image folders"); its folder."""
    listed = {"train": class_folder_files(layout.train_dir, layout.class_names, require_every_class=True)}
    for split, directory in (("val", layout.val_dir), ("test", layout.test_dir)):
        if directory is not None:
            listed[split] = class_folder_files(directory, layout.class_names, require_every_class=False)
    pool = listed["train"]
    train, val, test = carve_splits(len(pool), "test" not in listed, source.val_count, "val" not in listed, seed)
    files = {
        "train": [pool[i] for i in train],
        "val": listed["val"] if "val" in listed else [pool[i] for i in val],
        "test": listed["test"] if "test" in listed else [pool[i] for i in test],
    }
    stamps = {split: [[*file_stamp(Path(path)), label] for path, label in files[split]] for split in SPLITS}
    fingerprint = {"format": IMAGE_RECORDS_VERSION, "files": content_hash(stamps), "in_channels": in_channels}
    build = partial(_write_image_records, files=files, in_channels=in_channels, workers=prepare.num_workers)
    return prepared_folder(prepare, stem_of([Path(source.image_folder)]), fingerprint, build)


def _write_image_records(folder: Path, files: dict, in_channels: int, workers: int | None) -> dict:
    """``prepared_folder``'s build for an image folder: each split's records, the bad files refused, the carve."""
    unreadable: list[list[str]] = []  # each piece's files that are not readable images
    for split in SPLITS:
        if files[split]:
            size = piece_size(len(files[split]), MAX_PIECE_FILES, workers)
            records_of = partial(image_file_records, in_channels=in_channels)
            write_records(
                folder / split, records_of, pieces(files[split], size), workers, ("image",), summaries=unreadable
            )
    problems = [problem for piece in unreadable for problem in piece]
    if problems:
        total = sum(len(split_files) for split_files in files.values())
        listed = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ConfigError(
            f"data.source.image_folder: {len(problems)} of {total} files are not readable images: {listed}. Remove "
            "or replace them: every file with an image extension under a class folder is trained on"
        )
    (folder / CARVE).write_text(json.dumps({split: [path for path, _ in files[split]] for split in SPLITS}))
    counts = {split: len(files[split]) for split in SPLITS}
    rank_zero_info(f"prepared image folder: {folder} ({', '.join(f'{s} {n:,} images' for s, n in counts.items())})")
    return {"images": counts}
