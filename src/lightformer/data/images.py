"""Image classification data: Fashion-MNIST, MNIST, CIFAR-10, scikit-learn's digits, folders of image files.

`ImageDataModule` turns any of these into batches of normalised images `(batch, channels, height, width)`
and integer labels `(batch,)`. Its size attributes (`num_classes`, `in_channels`, `image_size`,
`class_names`) are known right after construction, so LightningCLI can link them to the model.

Splits. Every dataset has a training pool, and a test set: the official test split where there is one
(Fashion-MNIST, MNIST, CIFAR-10, an image folder's `test/`), otherwise a fixed 15% carved from the pool
with a constant seed (digits, an image folder without `test/`), so test numbers compare across runs.
The validation set is an image folder's own `val/`, or else `val_size` images carved from what is left
of the pool with a random split seeded by `seed`. The rest is the training set.

Pixels. Images stay uint8 through resizing and augmentation (RandAugment and TrivialAugment need uint8),
then become float32 in [0, 1] and are normalised per channel with the constants in `DATASET_INFO`.
"""

import gzip
import os
import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal, get_args

import lightning as L
import numpy as np
import torch
import torchvision
from PIL import Image, ImageOps, UnidentifiedImageError
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset
from torchvision.transforms import v2

from lightformer.data.sampling import EpochShuffleSampler, evaluation_sampler

DatasetName = Literal["fashion_mnist", "mnist", "cifar10", "digits", "image_folder"]
AugmentName = Literal["none", "flip", "flip_crop", "trivialaugment", "randaugment"]

# Fraction of the pool carved off as the test set when a dataset has no test split of its own, and the
# constant seed of that carve: the test set must not change with `seed`.
CARVED_TEST_FRACTION = 0.15
CARVED_TEST_SEED = 0

# Debian's `dataset-fashion-mnist` package installs the original gzip files here.
DEBIAN_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
MNIST_RAW_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ImageDatasetInfo:
    """What the model and the transforms need to know about a dataset before reading any of it."""

    in_channels: int
    image_size: int  # native side length in pixels (the default for `image_size`)
    mean: tuple[float, ...] | None  # per-channel, on [0, 1] pixels; None: computed from the train split
    std: tuple[float, ...] | None
    horizontal_flip: bool  # whether a mirrored image keeps its label (not so for handwritten digits)
    class_names: tuple[str, ...]  # empty for image folders: read from disk
    default_val_size: int | float  # what `val_size=None` means
    train_pool_size: int | None  # images in the official train split, when known without reading it


DATASET_INFO: dict[str, ImageDatasetInfo] = {
    "fashion_mnist": ImageDatasetInfo(
        in_channels=1,
        image_size=28,
        mean=(0.2860,),
        std=(0.3530,),
        horizontal_flip=True,
        class_names=tuple(torchvision.datasets.FashionMNIST.classes),
        default_val_size=5000,
        train_pool_size=60000,
    ),
    "mnist": ImageDatasetInfo(
        in_channels=1,
        image_size=28,
        mean=(0.1307,),
        std=(0.3081,),
        horizontal_flip=False,
        class_names=tuple(torchvision.datasets.MNIST.classes),
        default_val_size=5000,
        train_pool_size=60000,
    ),
    "cifar10": ImageDatasetInfo(
        in_channels=3,
        image_size=32,
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
        horizontal_flip=True,
        # torchvision reads these from the downloaded meta file; the order is fixed by the dataset.
        class_names=(
            "airplane",
            "automobile",
            "bird",
            "cat",
            "deer",
            "dog",
            "frog",
            "horse",
            "ship",
            "truck",
        ),
        default_val_size=5000,
        train_pool_size=50000,
    ),
    "digits": ImageDatasetInfo(
        in_channels=1,
        image_size=8,
        mean=None,
        std=None,
        horizontal_flip=False,
        class_names=tuple(str(digit) for digit in range(10)),
        default_val_size=0.15,
        train_pool_size=None,
    ),
    "image_folder": ImageDatasetInfo(
        in_channels=3,
        image_size=224,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        horizontal_flip=True,
        class_names=(),
        default_val_size=0.15,
        train_pool_size=None,
    ),
}

TORCHVISION_DATASETS = {
    "fashion_mnist": torchvision.datasets.FashionMNIST,
    "mnist": torchvision.datasets.MNIST,
    "cifar10": torchvision.datasets.CIFAR10,
}
# Where torchvision looks for each dataset's files, under `root`.
TORCHVISION_FOLDERS = {
    "fashion_mnist": "FashionMNIST/raw",
    "mnist": "MNIST/raw",
    "cifar10": "cifar-10-batches-py",
}


def load_image(path: str | Path, in_channels: int = 3, image_size: int | None = None) -> Image.Image:
    """Open an image file as a PIL image in mode "L" (in_channels=1) or "RGB" (in_channels=3).

    Any PIL mode with 8-bit channels (RGBA, LA, P, CMYK, 1, ...) is converted; an alpha channel is dropped.
    16-bit greyscale keeps its 8 most significant bits (PIL's own conversion would clip it at 255). 32-bit
    integer or float pixels (PIL modes "I", "F") have no standard range and are refused. With `image_size`,
    the image is resized to image_size × image_size (aspect ratio not kept), as `ImageDataModule` does.
    Raises FileNotFoundError or ValueError naming the file when it is missing, not a readable image, or of
    such a mode.
    """
    modes = {1: "L", 3: "RGB"}
    if in_channels not in modes:
        raise ValueError(f"load_image: in_channels={in_channels} is not supported; use 1 (grey) or 3 (RGB)")
    try:
        with Image.open(path) as opened:
            # Cameras store the orientation in EXIF instead of rotating pixels; apply it.
            image = ImageOps.exif_transpose(opened)
            if image.mode.startswith("I;16"):
                image = Image.fromarray((np.asarray(image) >> 8).astype(np.uint8))
            elif image.mode in ("I", "F"):
                raise ValueError(
                    f"{path} has 32-bit {'integer' if image.mode == 'I' else 'float'} pixels (PIL mode "
                    f"{image.mode!r}), which have no standard 8-bit range; save it with 8-bit channels (greyscale "
                    f"or RGB, also with alpha) or as 16-bit greyscale"
                )
            image = image.convert(modes[in_channels])
    except FileNotFoundError:
        raise FileNotFoundError(f"Image file not found: {path}") from None
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"{path} is not a readable image file ({error})") from error
    if image_size is not None:
        image = v2.functional.resize(image, [image_size, image_size], antialias=True)
    return image


def install_debian_fashion_mnist(root: str | Path) -> bool:
    """Decompress Debian's Fashion-MNIST files into `<root>/FashionMNIST/raw/`, where torchvision reads them.

    torchvision looks for the decompressed files; its own download step would not accept Debian's `.gz`
    files, which are recompressed and so fail its checksums. Writes each file under a temporary name and
    renames it, so concurrent processes never read half a file. Returns whether all four files are there.
    """
    raw_dir = Path(root) / "FashionMNIST" / "raw"
    missing = [name for name in MNIST_RAW_FILES if not (raw_dir / name).is_file()]
    if not missing:
        return True
    sources = [DEBIAN_FASHION_MNIST_DIR / f"{name}.gz" for name in missing]
    if not all(source.is_file() for source in sources):
        return False
    raw_dir.mkdir(parents=True, exist_ok=True)
    for name, source in zip(missing, sources, strict=True):
        partial_file = raw_dir / f".{name}.partial-{os.getpid()}"
        try:
            with gzip.open(source, "rb") as compressed, open(partial_file, "wb") as decompressed:
                shutil.copyfileobj(compressed, decompressed)
            os.replace(partial_file, raw_dir / name)
        finally:
            partial_file.unlink(missing_ok=True)
    return True


def resolve_val_count(val_size: int | float, pool_size: int, source: str) -> int:
    """Number of validation images to carve from a pool of `pool_size` images; `source` names the data."""
    if isinstance(val_size, float):
        if not 0.0 <= val_size < 1.0:
            raise ValueError(
                f"val_size={val_size} is invalid for {source}: a fraction must be in [0, 1) "
                f"(the training pool has {pool_size} images)"
            )
        count = round(val_size * pool_size)
    else:
        count = val_size
    if not 0 <= count < pool_size:
        raise ValueError(
            f"val_size={val_size} is invalid for {source}: the training pool it is carved from has "
            f"{pool_size} images; give a count in [0, {pool_size}) or a fraction in [0, 1)"
        )
    return count


def carve_splits(
    pool_size: int, carve_test: bool, carve_val: bool, val_size: int | float, seed: int, source: str
) -> tuple[list[int], list[int], list[int]]:
    """Split indices 0..pool_size-1 into (train, val, test); a split not carved comes back empty.

    The test carve uses the constant CARVED_TEST_SEED, the validation carve uses `seed`.
    """
    remaining = torch.arange(pool_size)
    test_indices = torch.tensor([], dtype=torch.long)
    if carve_test:
        order = torch.randperm(pool_size, generator=torch.Generator().manual_seed(CARVED_TEST_SEED))
        test_count = round(CARVED_TEST_FRACTION * pool_size)
        test_indices, remaining = order[:test_count], order[test_count:]
    val_indices = torch.tensor([], dtype=torch.long)
    if carve_val:
        val_count = resolve_val_count(val_size, len(remaining), source)
        order = torch.randperm(len(remaining), generator=torch.Generator().manual_seed(seed))
        val_indices, remaining = remaining[order[:val_count]], remaining[order[val_count:]]
    return remaining.tolist(), val_indices.tolist(), test_indices.tolist()


@dataclass(frozen=True)
class ImageFolderLayout:
    """Where an image folder keeps its splits; a split dir of None is carved from `train_dir`."""

    train_dir: Path
    val_dir: Path | None
    test_dir: Path | None
    class_names: list[str]


def class_folder_names(directory: Path) -> list[str]:
    """Sorted names of the subfolders of `directory`, skipping hidden ones such as `.ipynb_checkpoints`."""
    names = [entry.name for entry in directory.iterdir() if entry.is_dir()]
    return sorted(name for name in names if not name.startswith("."))


def read_image_folder_layout(image_folder: str | None) -> ImageFolderLayout:
    """Find the splits and class names of an image folder (torchvision ImageFolder layout).

    Either `image_folder/train/<class>/<files>` with optional `val/` and `test/` alongside, or
    `image_folder/<class>/<files>` directly, from which validation and test sets are carved.
    """
    expected = (
        "a folder holding train/ (and optionally val/ and test/), each with one subfolder of images per "
        "class, or holding the class subfolders directly"
    )
    if image_folder is None:
        raise ValueError(f"dataset='image_folder' needs image_folder: {expected}")
    folder = Path(image_folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"image_folder {folder} is not an existing directory; expected {expected}")
    has_split_dirs = (folder / "train").is_dir()
    train_dir = folder / "train" if has_split_dirs else folder
    class_names = class_folder_names(train_dir)
    if not class_names:
        raise ValueError(f"image_folder: {train_dir} has no class subfolders; expected {expected}")
    split_dirs = {}
    for split in ("val", "test"):
        split_dir = folder / split
        if not (has_split_dirs and split_dir.is_dir()):
            split_dirs[split] = None
            continue
        unknown = sorted(set(class_folder_names(split_dir)) - set(class_names))
        if unknown:
            raise ValueError(
                f"image_folder: {split_dir} has class folders {unknown} that {train_dir} lacks; "
                f"the training classes are {class_names}"
            )
        split_dirs[split] = split_dir
    return ImageFolderLayout(train_dir, split_dirs["val"], split_dirs["test"], class_names)


class ImageFileDataset(Dataset):
    """Labelled image files: item i is (PIL image from `load_image`, class index)."""

    def __init__(self, samples: list[tuple[str, int]], in_channels: int) -> None:
        self.samples = samples
        self.load = partial(load_image, in_channels=in_channels)  # a partial pickles into worker processes

    @classmethod
    def from_class_folders(
        cls, directory: Path, class_names: list[str], in_channels: int, require_every_class: bool
    ) -> "ImageFileDataset":
        """Collect the image files under `directory/<class name>/` (searched recursively)."""
        class_to_index = {name: index for index, name in enumerate(class_names)}
        samples = make_dataset(str(directory), class_to_index, extensions=IMG_EXTENSIONS, allow_empty=True)
        if not samples:
            extensions = ", ".join(IMG_EXTENSIONS)
            raise ValueError(f"image_folder: no image files ({extensions}) found in {directory}")
        found = {label for _, label in samples}
        empty = [name for name in class_names if class_to_index[name] not in found]
        if require_every_class and empty:
            raise ValueError(f"image_folder: class folders without image files in {directory}: {empty}")
        return cls(samples, in_channels)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        path, label = self.samples[index]
        return self.load(path), label


class TransformedSubset(Dataset):
    """The items of `dataset` at `indices`, each image passed through `transform`; labels pass unchanged."""

    def __init__(self, dataset: Dataset, indices: list[int], transform: v2.Transform) -> None:
        self.dataset = dataset
        self.indices = indices
        self.transform = transform

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, label = self.dataset[self.indices[index]]
        return self.transform(image), label


def load_digits_as_images() -> TensorDataset:
    """scikit-learn's 1,797 handwritten digits as uint8 images (1797, 1, 8, 8) and labels (1797,).

    The raw values 0..16 (16 = most ink) are scaled to 0..255 so they share the uint8 pipeline.
    """
    digits = load_digits()
    pixels = np.round(digits.images * (255 / 16)).astype(np.uint8)
    images = torch.from_numpy(pixels).unsqueeze(1)
    return TensorDataset(images, torch.from_numpy(digits.target).long())


class ImageDataModule(L.LightningDataModule):
    """Batches of normalised images (batch, channels, image_size, image_size) and labels (batch,).

    Args:
        dataset: which data. "fashion_mnist" reads Debian's dataset-fashion-mnist package offline, else
            downloads; "mnist" and "cifar10" download through torchvision; "digits" is scikit-learn's
            8×8 digits (instant, for tests); "image_folder" reads image files from `image_folder`.
        root: directory where torchvision datasets are stored (or downloaded to).
        download: let torchvision download a dataset missing under `root` (needs internet).
        image_folder: for dataset="image_folder": a folder with train/ and optionally val/ and test/,
            each holding one subfolder of images per class; or the class subfolders directly. Split
            folders that are missing are carved from the training images. Images are read as RGB.
        image_size: side length images are resized to (square); None: the dataset's native size
            (28 for (fashion_)mnist, 32 for cifar10, 8 for digits, 224 for image folders).
        val_size: validation images carved from the training pool with a random split seeded by `seed`:
            a count, or a float fraction of the pool. None: 5000 for fashion_mnist, mnist and cifar10;
            0.15 for digits and image folders. Ignored when an image folder has its own val/.
            Digits with the defaults: 1298 train, 229 val, 270 test (a fixed 15% carve).
        batch_size: images per batch, in every split.
        num_workers: DataLoader worker processes; 0 loads in the main process.
        augment: training-set augmentation: "none"; "flip" (horizontal flips; not for mnist and digits, whose
            flipped digits are not digits); "flip_crop" (random crop after padding by
            image_size // 7 pixels, plus horizontal flips except for mnist and digits, whose flipped
            digits are not digits); "trivialaugment" (TrivialAugmentWide); "randaugment" (RandAugment).
        seed: seeds the validation carve and the training-set shuffling.
        pin_memory: pin batches in page-locked memory for faster copies to a GPU.
    """

    def __init__(
        self,
        dataset: DatasetName = "fashion_mnist",
        root: str = "data",
        download: bool = True,
        image_folder: str | None = None,
        image_size: int | None = None,
        val_size: int | float | None = None,
        batch_size: int = 128,
        num_workers: int = 0,
        augment: AugmentName = "flip_crop",
        seed: int = 0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if dataset not in DATASET_INFO:
            raise ValueError(f"ImageDataModule: dataset={dataset!r} is unknown; valid: {list(DATASET_INFO)}")
        if augment not in get_args(AugmentName):
            valid = list(get_args(AugmentName))
            raise ValueError(f"ImageDataModule: augment={augment!r} is unknown; valid: {valid}")
        if image_folder is not None and dataset != "image_folder":
            raise ValueError(
                f"ImageDataModule: image_folder={image_folder!r} is only read with dataset='image_folder', "
                f"not dataset={dataset!r}"
            )
        if image_size is not None and image_size < 1:
            raise ValueError(f"ImageDataModule: image_size={image_size} must be a positive number of pixels")
        info = DATASET_INFO[dataset]
        self.info = info
        if augment == "flip" and not info.horizontal_flip:
            raise ValueError(
                f"ImageDataModule: augment='flip' does not suit dataset={dataset!r}: a mirrored image does not keep "
                "its label there; use 'none', 'flip_crop' (crops only, for this dataset) or 'trivialaugment'"
            )
        self.dataset_name = dataset
        self.root = root
        self.download = download
        self.val_size = info.default_val_size if val_size is None else val_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.augment = augment
        self.seed = seed
        self.pin_memory = pin_memory

        self.in_channels = info.in_channels
        self.image_size = info.image_size if image_size is None else image_size
        self.folder_layout = read_image_folder_layout(image_folder) if dataset == "image_folder" else None
        self.class_names = self.folder_layout.class_names if self.folder_layout else list(info.class_names)
        self.num_classes = len(self.class_names)

        if info.train_pool_size is not None:  # fail at construction, not after the model is built
            resolve_val_count(self.val_size, info.train_pool_size, dataset)
        self.normalize_mean, self.normalize_std = info.mean, info.std
        if dataset == "digits":
            self.normalize_mean, self.normalize_std = self._digits_train_statistics()

        self.train_dataset: TransformedSubset | None = None
        self.val_dataset: TransformedSubset | None = None
        self.test_dataset: TransformedSubset | None = None

    def _digits_train_statistics(self) -> tuple[tuple[float], tuple[float]]:
        """Pixel mean and std of the digits training split, on [0, 1] pixels (instant: 1,797 tiny images)."""
        images, _ = load_digits_as_images().tensors
        train_indices, _, _ = carve_splits(
            len(images),
            carve_test=True,
            carve_val=True,
            val_size=self.val_size,
            seed=self.seed,
            source="digits",
        )
        pixels = images[train_indices].float() / 255
        return (pixels.mean().item(),), (pixels.std().item(),)

    def _augmentation(self) -> list[v2.Transform]:
        """The training-only random transforms, applied to uint8 images of the final size."""
        if self.augment == "flip":
            return [v2.RandomHorizontalFlip()]
        if self.augment == "flip_crop":
            steps = [v2.RandomCrop(self.image_size, padding=max(1, self.image_size // 7))]
            if self.info.horizontal_flip:
                steps.append(v2.RandomHorizontalFlip())
            return steps
        if self.augment == "trivialaugment":
            return [v2.TrivialAugmentWide()]
        if self.augment == "randaugment":
            return [v2.RandAugment()]
        return []

    def _transform(self, augmentation: list[v2.Transform]) -> v2.Compose:
        return v2.Compose(
            [
                v2.Resize((self.image_size, self.image_size), antialias=True),  # no-op at the native size
                v2.ToImage(),
                *augmentation,
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(self.normalize_mean, self.normalize_std),
            ]
        )

    def train_transform(self) -> v2.Compose:
        """PIL image or uint8 tensor (C, H, W) → augmented, normalised float32 tensor (C, S, S)."""
        return self._transform(self._augmentation())

    def eval_transform(self) -> v2.Compose:
        """PIL image (mode matching `in_channels`) or uint8 tensor (C, H, W) → normalised float32 (C, S, S).

        The validation and test transform, and the one for user images at predict time:
        `eval_transform()(load_image(path, in_channels, image_size))`.
        """
        return self._transform([])

    def _load_torchvision(self, train: bool) -> Dataset:
        """The official train or test split of fashion_mnist, mnist or cifar10, as (PIL image, label)."""
        dataset_class = TORCHVISION_DATASETS[self.dataset_name]
        found_offline = self.dataset_name == "fashion_mnist" and install_debian_fashion_mnist(self.root)
        try:
            return dataset_class(self.root, train=train, download=self.download and not found_offline)
        except (RuntimeError, OSError) as error:
            if self.download:
                online = "torchvision's download failed: is there an internet connection?"
            else:
                online = "With internet, set download=True to let torchvision download it."
            if self.dataset_name == "fashion_mnist":
                offline = (
                    f"Offline: `apt-get install dataset-fashion-mnist` puts the files in "
                    f"{DEBIAN_FASHION_MNIST_DIR}, from where they are copied automatically."
                )
            else:
                folder = Path(self.root) / TORCHVISION_FOLDERS[self.dataset_name]
                offline = f"Offline: put the files torchvision downloads into {folder}/."
            raise RuntimeError(
                f"Could not load {self.dataset_name} under root={self.root!r}: {error}\n{online}\n{offline}"
            ) from error

    def prepare_data(self) -> None:
        """Fetch a torchvision dataset (copy or download) once, before `setup` runs in every process."""
        if self.dataset_name in TORCHVISION_DATASETS:
            self._load_torchvision(train=True)
            self._load_torchvision(train=False)

    def setup(self, stage: str | None = None) -> None:
        """Build the train, validation and test sets (all of them, once, whatever the stage)."""
        if self.train_dataset is not None:
            return
        val_source = test_source = None
        if self.dataset_name in TORCHVISION_DATASETS:
            pool = self._load_torchvision(train=True)
            test_source = self._load_torchvision(train=False)
        elif self.dataset_name == "digits":
            pool = load_digits_as_images()
        else:
            layout = self.folder_layout
            read_folder = partial(
                ImageFileDataset.from_class_folders,
                class_names=layout.class_names,
                in_channels=self.in_channels,
            )
            pool = read_folder(layout.train_dir, require_every_class=True)
            if layout.val_dir is not None:
                val_source = read_folder(layout.val_dir, require_every_class=False)
            if layout.test_dir is not None:
                test_source = read_folder(layout.test_dir, require_every_class=False)

        train_indices, val_indices, test_indices = carve_splits(
            len(pool),
            carve_test=test_source is None,
            carve_val=val_source is None,
            val_size=self.val_size,
            seed=self.seed,
            source=self.dataset_name,
        )
        train_transform, eval_transform = self.train_transform(), self.eval_transform()
        self.train_dataset = TransformedSubset(pool, train_indices, train_transform)
        if val_source is None:
            self.val_dataset = TransformedSubset(pool, val_indices, eval_transform)
        else:
            self.val_dataset = TransformedSubset(val_source, list(range(len(val_source))), eval_transform)
        if test_source is None:
            self.test_dataset = TransformedSubset(pool, test_indices, eval_transform)
        else:
            self.test_dataset = TransformedSubset(test_source, list(range(len(test_source))), eval_transform)

    def _dataloader(self, dataset: Dataset | None, split: str, shuffle: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"ImageDataModule.{split}_dataloader() needs setup() to have run first")
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=EpochShuffleSampler(len(dataset), self.seed) if shuffle else evaluation_sampler(dataset),
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._dataloader(self.train_dataset, "train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._dataloader(self.val_dataset, "val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._dataloader(self.test_dataset, "test", shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        raise NotImplementedError(
            "ImageDataModule has no predict set: to classify image files, preprocess each with "
            "datamodule.eval_transform()(load_image(path, datamodule.in_channels, datamodule.image_size))"
        )
