"""Image classification data: Fashion-MNIST, MNIST, CIFAR-10, scikit-learn's digits, folders of image files.

``ImageDataModule`` turns any of these into batches of images ``(batch, channels, height, width)`` and integer
labels ``(batch,)``. What the model needs to know of them (``data_facts()``: class names, image size, channels,
normalisation) is known right after construction.

Splits. Every dataset has a training pool, and a test set: the official test split where there is one
(Fashion-MNIST, MNIST, CIFAR-10, an image folder's ``test/``), otherwise a fixed 15% carved from the pool with a
constant seed (digits, an image folder without ``test/``), so test numbers compare across runs. The validation set
is an image folder's own ``val/``, or else ``val_size`` images (or ``val_fraction`` of them) carved from what is
left of the pool with a random split seeded by ``seed``. The rest is the training set.

Pixels. The built-in datasets (Fashion-MNIST, MNIST, CIFAR-10, digits) are decoded once into one uint8 tensor held in
memory and batched by slicing it: their size is fixed and bounded (at most 180 MB of pixels, CIFAR-10's), so a
prepared copy would only add a step. Image folders, of any size, are prepared once per job into ``data.prepare.dir``
(``prepare_image_folder``) and streamed: memory does not grow with the folder. Either way batches leave the loader
as uint8 and are flipped, cropped and normalised on the device the model trains on (``data.augment``), in
``on_after_batch_transfer``; outside Lightning call ``transform_batch``. TrivialAugment and RandAugment, which need
per-image operations on uint8 images, run in the loader, each image's draws seeded by (seed, epoch, index): the same
whatever the number of workers, and exact on resume.

Image folders. Preparing lists the files, carves the splits, and writes each split's records ``{"image": the file's
bytes, "label": class index}`` in order with LitData on every core (the bytes: lossless, and the size of the
folder; decoding and resizing stay in the loader's workers). Every file is decoded in full there, so a folder with
files that are not readable images (not an image, cut short, 32-bit pixels) is refused in one line naming them,
before any training. The prepared folder's name holds a hash of the files' paths, sizes and modification times,
the carve and the channels: a later run with the same files reads it without decoding anything again.
"""

from __future__ import annotations

import io
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
from litdata.streaming.resolver import Dir
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset, default_collate
from torchvision.transforms import v2

from lightformer.config_groups import as_config
from lightformer.data.loading.sampling import EpochShuffleSampler, Key, evaluation_sampler, index_and_epoch, map_loader
from lightformer.data.loading.streaming import ImageLoaderConfig, Records
from lightformer.data.module import DataModule
from lightformer.data.objectives.augment import (
    AugmentConfig,
    normalize,
    random_crop,
    random_erasing,
    random_horizontal_flip,
)
from lightformer.data.pieces import SPLITS
from lightformer.data.preparation.caching import content_hash, file_stamp, read_manifest
from lightformer.data.preparation.prepare import (
    PrepareConfig,
    piece_size,
    pieces,
    prepared_folder,
    split_location,
    stem_of,
    write_records,
)
from lightformer.data.sources.corpora import DEBIAN_FASHION_MNIST_DIR, install_debian_fashion_mnist
from lightformer.data.sources.image_files import (
    ImageFolderLayout,
    class_folder_files,
    image_file_records,
    load_image,
    read_image_folder_layout,
    to_normalised_tensor,
)
from lightformer.errors import ConfigError, DataError
from lightformer.facts import DataFacts
from lightformer.nn.checks import check_at_least

DatasetName = Literal["fashion_mnist", "mnist", "cifar10", "digits", "image_folder"]

# Fraction of the pool carved off as the test set when a dataset has no test split of its own, and the
# constant seed of that carve: the test set must not change with `seed`.
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
    """scikit-learn's 1,797 handwritten digits as uint8 images (1797, 1, 8, 8) and labels (1797,).

    The raw values 0..16 (16 = most ink) are scaled to 0..255 so they share the uint8 pipeline.
    """
    from sklearn.datasets import load_digits  # here: scikit-learn takes a second to import

    digits = load_digits()
    pixels = np.round(digits.images * (255 / 16)).astype(np.uint8)
    return TensorDataset(torch.from_numpy(pixels).unsqueeze(1), torch.from_numpy(digits.target).long())


@dataclass(frozen=True)
class ImageSource:
    """Which images, and how their training pool splits (``data.source``): shared by ``ImageDataModule`` and
    ``ImageTokenDataModule``.

    Args:
        dataset: "fashion_mnist" reads Debian's dataset-fashion-mnist package offline, else downloads; "mnist" and
            "cifar10" download through torchvision; "digits" is scikit-learn's 8×8 digits (instant, for tests);
            "image_folder" reads image files from ``image_folder``.
        root: directory where torchvision datasets are stored (or downloaded to).
        download: let torchvision download a dataset missing under ``root`` (needs internet).
        image_folder: for dataset="image_folder": a folder with train/ and optionally val/ and test/, each holding one
            subfolder of images per class; or the class subfolders directly. Split folders that are missing are
            carved from the training images.
        val_size: validation images carved from the training pool (a count), with a random split seeded by the data's
            ``seed``. Default: 5000 for fashion_mnist, mnist and cifar10; for digits and image folders
            ``val_fraction`` 0.15. Ignored when an image folder has its own val/.
        val_fraction: instead of ``val_size``, the fraction of the pool carved for validation, in [0, 1).
            Digits with the defaults: 1298 train, 229 val, 270 test (a fixed 15% carve).
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
        """Number of validation images to carve from a pool of ``pool_size`` images (the dataset's default where
        neither ``val_size`` nor ``val_fraction`` is given)."""
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
    """Split indices 0..pool_size-1 into (train, val, test); a split not carved comes back empty.

    The test carve uses the constant CARVED_TEST_SEED, the validation carve uses ``seed`` and takes
    ``val_count_of(size of what is left)`` images.
    """
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
    """Prepare an image folder once per job (``prepare.prepared_folder``) into per-split records of the files' bytes
    and labels, written by every core, in the order the splits read them (the carve: the folder's val/ and test/,
    else ``carve_splits`` of train/); returns the prepared folder, which records the carve in ``carve.json``.

    Every file is decoded in full while it is written; files that are not readable images are refused together in
    one ConfigError naming them (nothing of the folder is left: ``prepare.prepared_folder``).
    """
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


class ImageRecords(Dataset):
    """A prepared image-folder split (``prepare_image_folder``) by index: item i is (uint8 image ``(C, S, S)``
    decoded from the stored file bytes and resized to ``image_size``, class index), what reading the file gives."""

    def __init__(self, split_dir: str | Dir, in_channels: int, image_size: int) -> None:
        self.records = Records(split_dir)
        self.in_channels = in_channels
        self.image_size = image_size

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        record = self.records[index]
        image = load_image(io.BytesIO(record["image"]), self.in_channels, self.image_size)
        return v2.functional.pil_to_tensor(image), int(record["label"])


@dataclass(eq=False)
class ImageSubset(Dataset):
    """The (uint8 image, label) items of ``source`` at ``indices``, each image through ``transform`` if given.

    The transform's random draws (TrivialAugment's, RandAugment's) come from (``seed``, epoch, index) alone: the
    training sampler yields ``(index, epoch)`` keys (``EpochShuffleSampler(with_epoch=True)``), so an image is
    augmented afresh each epoch, the same whatever the number of loader workers, and exactly again on resume. For a
    source held in memory (a ``TensorDataset``) ``__getitems__`` slices a whole batch at once.
    """

    source: Dataset
    indices: list[int]
    transform: v2.Transform | None = None
    seed: int = 0

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, key: Key) -> tuple[Tensor, Tensor | int]:
        index, epoch = index_and_epoch(key)
        image, label = self.source[self.indices[index]]
        return self._transformed(image, index, epoch), label

    def __getitems__(self, keys: list[Key]) -> tuple[Tensor, Tensor] | list[tuple[Tensor, Tensor | int]]:
        if not isinstance(self.source, TensorDataset):
            return [self[key] for key in keys]
        keys = [index_and_epoch(key) for key in keys]
        rows = torch.as_tensor([self.indices[index] for index, _ in keys], dtype=torch.long)
        images, labels = self.source.tensors[0][rows], self.source.tensors[1][rows]
        if self.transform is not None:
            images = torch.stack([self._transformed(image, *key) for image, key in zip(images, keys, strict=True)])
        return images, labels

    def _transformed(self, image: Tensor, index: int, epoch: int) -> Tensor:
        """``image`` through the transform, its draws seeded by (seed, epoch, index); the global generator is left
        as it was."""
        if self.transform is None:
            return image
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(np.random.SeedSequence((self.seed, epoch, index)).generate_state(1)[0]))
            return self.transform(image)


def collate_images(items: tuple[Tensor, Tensor] | list) -> tuple[Tensor, Tensor]:
    """A batch sliced at once (``ImageSubset.__getitems__``) as it is; a list of items stacked."""
    return items if isinstance(items, tuple) else tuple(default_collate(items))


def image_loader(dataset: Dataset, loader: ImageLoaderConfig, seed: int, shuffle: bool) -> DataLoader:
    """The loader of an image split (Image GPT's too): training (``shuffle``) in an order drawn from (seed, epoch),
    its position inside an epoch saved in checkpoints (an exact mid-epoch resume); evaluation in order, every image
    once under DDP. A training set that augments in the loader (``ImageSubset.transform``) is handed (index, epoch)
    keys, from which it draws."""
    augmented = getattr(dataset, "transform", None) is not None
    sampler = EpochShuffleSampler(len(dataset), seed, with_epoch=augmented) if shuffle else evaluation_sampler(dataset)
    return map_loader(dataset, loader, sampler, shuffle, collate_fn=collate_images)


class ImageDataModule(DataModule):
    """Batches of images (batch, channels, image_size, image_size) and labels (batch,): uint8 from the loaders,
    normalised (and for training augmented) float32 once on the device.

    Args:
        source: which images and how they split (``ImageSource``).
        augment: the training set's augmentation (``AugmentConfig``).
        loader: batch size, loader workers, pinned memory (``ImageLoaderConfig``).
        prepare: where an image folder is prepared, with how many processes (``PrepareConfig``; the built-in datasets
            are read into memory and not prepared).
        image_size: side length images are resized to (square); None: the dataset's native size
            (28 for (fashion_)mnist, 32 for cifar10, 8 for digits, 224 for image folders).
        seed: seeds the validation carve and the training-set shuffling.
    """

    def __init__(
        self,
        source: ImageSource = ImageSource(),
        augment: AugmentConfig = AugmentConfig(),
        loader: ImageLoaderConfig = ImageLoaderConfig(),
        prepare: PrepareConfig = PrepareConfig(),
        image_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.source, self.augment = as_config(ImageSource, source), as_config(AugmentConfig, augment)
        self.loader, self.prepare = as_config(ImageLoaderConfig, loader), as_config(PrepareConfig, prepare)
        self.seed = seed
        self.info = info = self.source.info
        if self.augment.policy == "flip" and not info.horizontal_flip:
            raise ValueError(
                f"data.augment.policy='flip' does not suit dataset={self.source.dataset!r}: a mirrored image does not "
                "keep its label there; use 'none', 'flip_crop' (crops only, for this dataset) or 'trivialaugment'"
            )
        check_at_least("data.image_size", image_size, 1)
        self.in_channels = info.in_channels
        self.image_size = info.image_size if image_size is None else image_size
        is_folder = self.source.dataset == "image_folder"
        self.folder_layout = read_image_folder_layout(self.source.image_folder) if is_folder else None
        self.class_names = self.folder_layout.class_names if self.folder_layout else list(info.class_names)
        self.num_classes = len(self.class_names)
        if self.num_classes < 2:
            raise ValueError(
                f"image_folder: {self.folder_layout.train_dir} has {self.num_classes} class folder "
                f"({', '.join(self.class_names)}); classification needs at least 2"
            )
        self.normalize_mean, self.normalize_std = info.mean, info.std
        self.train_dataset = self.val_dataset = self.test_dataset = self._prepared = None
        if self.source.dataset == "digits":  # statistics of the training split: instant for 1,797 tiny images
            self.setup()
            pixels = self.train_dataset.source.tensors[0][self.train_dataset.indices].float() / 255
            self.normalize_mean, self.normalize_std = (pixels.mean().item(),), (pixels.std().item(),)

    def data_facts(self) -> DataFacts:
        return DataFacts(class_names=tuple(self.class_names), image_size=self.image_size,
                         in_channels=self.in_channels, normalize_mean=tuple(self.normalize_mean),
                         normalize_std=tuple(self.normalize_std))  # fmt: skip

    # --- reading the data --------------------------------------------------------------------------------------

    def _load_torchvision(self, train: bool) -> TensorDataset:
        """The official train or test split of fashion_mnist, mnist or cifar10, as uint8 images and labels."""
        name, root, download = self.source.dataset, self.source.root, self.source.download
        found_offline = name == "fashion_mnist" and install_debian_fashion_mnist(root)
        try:
            dataset = TORCHVISION_DATASETS[name](root, train=train, download=download and not found_offline)
        except (RuntimeError, OSError) as error:
            if download:
                online = "torchvision's download failed: is there an internet connection?"
            else:
                online = "With internet, set data.source.download=true to let torchvision download it."
            if name == "fashion_mnist":
                offline = (
                    f"Offline: `apt-get install dataset-fashion-mnist` puts the files in "
                    f"{DEBIAN_FASHION_MNIST_DIR}, from where they are copied automatically."
                )
            else:
                offline = (
                    f"Offline: put the files torchvision downloads into {Path(root) / TORCHVISION_FOLDERS[name]}/."
                )
            raise DataError(
                f"data.source.dataset={name}: could not load it under data.source.root={root!r} ({error}). {online} "
                f"{offline}"
            ) from error
        images = torch.as_tensor(dataset.data)
        images = images[:, None] if images.ndim == 3 else images.permute(0, 3, 1, 2)  # CIFAR: (N, H, W, C)
        return TensorDataset(images.contiguous(), torch.as_tensor(dataset.targets, dtype=torch.long))

    def _resized(self, source: TensorDataset) -> TensorDataset:
        images, labels = source.tensors
        if images.shape[-1] != self.image_size:
            images = v2.functional.resize(images, [self.image_size, self.image_size], antialias=True)
        return TensorDataset(images, labels)

    @property
    def prepared(self) -> Path | None:
        """An image folder's prepared records, prepared on first use (once per job: see ``prepare_image_folder``);
        None for a built-in dataset (held in memory, nothing prepared)."""
        if self._prepared is None and self.source.dataset == "image_folder":
            self._prepared = prepare_image_folder(self.folder_layout, self.source, self.in_channels, self.seed,
                                                  self.prepare)  # fmt: skip
        return self._prepared

    def prepare_data(self) -> None:
        """Fetch a torchvision dataset (copy or download), or prepare an image folder, once, before ``setup`` runs
        in every process."""
        if self.source.dataset in TORCHVISION_DATASETS:
            self._load_torchvision(train=True)
            self._load_torchvision(train=False)
        elif self.source.dataset == "image_folder":
            self.prepared  # noqa: B018 (prepares on first use)

    def setup(self, stage: str | None = None) -> None:
        """Build the train, validation and test sets (all of them, once, whatever the stage)."""
        if self.train_dataset is not None:
            return
        if self.source.dataset == "image_folder":  # each split's records, in order
            counts = read_manifest(self.prepared)["images"]
            parts = {split: (ImageRecords(split_location(self.prepared, split), self.in_channels, self.image_size)
                             if counts[split] else [], list(range(counts[split]))) for split in SPLITS}  # fmt: skip
        else:  # one pool held in memory, carved; the official test split where there is one
            test_source = None
            if self.source.dataset in TORCHVISION_DATASETS:
                pool = self._resized(self._load_torchvision(train=True))
                test_source = self._resized(self._load_torchvision(train=False))
            else:
                pool = self._resized(load_digits_as_images())
            train, val, test = carve_splits(
                len(pool), test_source is None, self.source.val_count, carve_val=True, seed=self.seed
            )
            parts = {"train": (pool, train), "val": (pool, val), "test": (pool, test)}
            if test_source is not None:
                parts["test"] = (test_source, list(range(len(test_source))))
        self.train_dataset = ImageSubset(*parts["train"], self._per_image_augmentation(), self.seed)
        self.val_dataset, self.test_dataset = ImageSubset(*parts["val"]), ImageSubset(*parts["test"])

    # --- augmentation and normalisation ------------------------------------------------------------------------

    def _per_image_augmentation(self) -> v2.Transform | None:
        """TrivialAugment or RandAugment, which run in the loader on each uint8 image; None otherwise."""
        return {"trivialaugment": v2.TrivialAugmentWide(), "randaugment": v2.RandAugment()}.get(self.augment.policy)

    def transform_batch(self, batch: tuple[Tensor, Tensor], train: bool) -> tuple[Tensor, Tensor]:
        """uint8 images ``(batch, C, S, S)`` and labels → normalised float32 images (training: flipped and cropped
        per ``augment.policy`` first, erased per ``augment.random_erasing`` after, each image with its own random
        draw) and the labels."""
        images, labels = batch
        if train and self.augment.policy in ("flip", "flip_crop"):
            if self.augment.policy == "flip_crop":
                images = random_crop(images, padding=max(1, self.image_size // 7))
            if self.info.horizontal_flip:
                images = random_horizontal_flip(images)
        images = normalize(images, self.normalize_mean, self.normalize_std)
        if train and self.augment.random_erasing > 0:
            images = random_erasing(images, self.augment.random_erasing)
        return images, labels

    def on_after_batch_transfer(self, batch: tuple[Tensor, Tensor], dataloader_idx: int) -> tuple[Tensor, Tensor]:
        return self.transform_batch(batch, train=self.trainer is not None and self.trainer.training)

    def eval_transform(self) -> v2.Compose:
        """PIL image (mode matching ``in_channels``) or uint8 tensor ``(C, H, W)`` → normalised float32 ``(C, S, S)``:
        what evaluation does to one image, for user images at predict time:
        ``eval_transform()(load_image(path, in_channels, image_size))``."""
        resize = v2.Resize((self.image_size, self.image_size), antialias=True)  # no-op at the native size
        return v2.Compose([resize, to_normalised_tensor(self.normalize_mean, self.normalize_std)])

    # --- loaders -----------------------------------------------------------------------------------------------

    def _dataloader(self, split: str, shuffle: bool = False) -> DataLoader:
        dataset = getattr(self, f"{split}_dataset")
        if dataset is None:
            raise RuntimeError(f"ImageDataModule.{split}_dataloader() needs setup() to have run first")
        return image_loader(dataset, self.loader, self.seed, shuffle)

    def predict_dataloader(self) -> DataLoader:
        """The test set, for ``lightformer predict``: the task returns each image's class probabilities."""
        return self._dataloader("test")
