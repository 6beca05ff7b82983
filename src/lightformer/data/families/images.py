"""Image classification and Image GPT data: uint8 batches, augmented on the device (docs/data.md, "Images")."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from litdata.streaming.resolver import Dir
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset, default_collate
from torchvision.transforms import v2

from lightformer.config_groups import as_config
from lightformer.data.loading.sampling import EpochShuffleSampler, Key, evaluation_sampler, index_and_epoch, map_loader
from lightformer.data.loading.streaming import LoaderConfig, Records
from lightformer.data.module import DataModule
from lightformer.data.objectives.augment import (
    AugmentConfig,
    normalize,
    random_crop,
    random_erasing,
    random_horizontal_flip,
)
from lightformer.data.pieces import SPLITS
from lightformer.data.preparation.caching import read_manifest
from lightformer.data.preparation.prepare import PrepareConfig, split_location
from lightformer.data.sources.corpora import DEBIAN_FASHION_MNIST_DIR, install_debian_fashion_mnist
from lightformer.data.sources.image_files import load_image, read_image_folder_layout, to_normalised_tensor
from lightformer.data.sources.images import (
    TORCHVISION_DATASETS,
    TORCHVISION_FOLDERS,
    ImageDatasetInfo,
    ImageSource,
    carve_splits,
    load_digits_as_images,
    prepare_image_folder,
)
from lightformer.errors import DataError
from lightformer.facts import DataFacts
from lightformer.nn.checks import check_at_least
from lightformer.tokenization.pixels import PaletteConfig, PixelTokenizer, downsample


class ImageRecords(Dataset):
    """A prepared image-folder split by index: item i is (uint8 image ``(C, S, S)`` at ``image_size``, class index)."""

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
    """The (uint8 image, label) items of ``source`` at ``indices``, through ``transform`` by (seed, epoch, index)."""

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
        """``image`` through the transform, seeded by (seed, epoch, index); the global generator left as it was."""
        if self.transform is None:
            return image
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(np.random.SeedSequence((self.seed, epoch, index)).generate_state(1)[0]))
            return self.transform(image)


def collate_images(items: tuple[Tensor, Tensor] | list) -> tuple[Tensor, Tensor]:
    """A batch sliced at once (``ImageSubset.__getitems__``) as it is; a list of items stacked."""
    return items if isinstance(items, tuple) else tuple(default_collate(items))


def image_loader(dataset: Dataset, loader: LoaderConfig, seed: int, shuffle: bool) -> DataLoader:
    """An image split's loader: training from (seed, epoch), resumable mid-epoch; evaluation once each, in order."""
    augmented = getattr(dataset, "transform", None) is not None
    sampler = EpochShuffleSampler(len(dataset), seed, with_epoch=augmented) if shuffle else evaluation_sampler(dataset)
    return map_loader(dataset, loader, sampler, shuffle, collate_fn=collate_images)


class ImageDataModule(DataModule):
    """Batches of images ``(B, C, S, S)`` and labels ``(B,)``, normalised and augmented on the device (docs/data.md).

    Args:
        source: which images and how they split (``ImageSource``).
        augment: the training set's augmentation (``AugmentConfig``).
        loader: batch size, loader workers, pinned memory (``LoaderConfig``).
        prepare: where and with how many processes an image folder is prepared (``PrepareConfig``).
        image_size: side length images are resized to (square); None: the dataset's (224 for image folders).
        seed: seeds the validation carve and the training-set shuffling.
    """

    def __init__(
        self,
        source: ImageSource = ImageSource(),
        augment: AugmentConfig = AugmentConfig(),
        loader: LoaderConfig = LoaderConfig(batch_size=128, pin_memory=False),
        prepare: PrepareConfig = PrepareConfig(),
        image_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.source, self.augment = as_config(ImageSource, source), as_config(AugmentConfig, augment)
        self.loader, self.prepare = self.loader_config(loader), as_config(PrepareConfig, prepare)
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
        """An image folder's prepared records, prepared on first use, once per job; None for a built-in dataset."""
        if self._prepared is None and self.source.dataset == "image_folder":
            self._prepared = prepare_image_folder(self.folder_layout, self.source, self.in_channels, self.seed,
                                                  self.prepare)  # fmt: skip
        return self._prepared

    def prepare_data(self) -> None:
        """Fetch a torchvision dataset, or prepare an image folder, once, before ``setup`` runs in every process."""
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
        return {"trivialaugment": v2.TrivialAugmentWide(), "randaugment": v2.RandAugment()}.get(self.augment.policy)

    def transform_batch(self, batch: tuple[Tensor, Tensor], train: bool) -> tuple[Tensor, Tensor]:
        """uint8 images and labels → normalised float32 images (training: augmented, each its own draw) and labels."""
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
        """PIL image or uint8 ``(C, H, W)`` → normalised float32 ``(C, S, S)``, as evaluation does (a user's images)."""
        resize = v2.Resize((self.image_size, self.image_size), antialias=True)  # no-op at the native size
        return v2.Compose([resize, to_normalised_tensor(self.normalize_mean, self.normalize_std)])

    def _dataloader(self, split: str, shuffle: bool = False) -> DataLoader:
        dataset = getattr(self, f"{split}_dataset")
        if dataset is None:
            raise RuntimeError(f"ImageDataModule.{split}_dataloader() needs setup() to have run first")
        return image_loader(dataset, self.loader, self.seed, shuffle)


# A uniform palette has levels³ colours: past this the vocabulary outgrows Image GPT's (512 k-means colours).
MAX_UNIFORM_COLOURS = 4096
# An image folder's k-means palette is fitted on at most this many pixels' worth of training images, drawn by the
# seed (``fit_kmeans`` draws its 200,000 pixels from them); a smaller folder is read whole.
PALETTE_SAMPLE_PIXELS = 2_000_000


def pixel_pairs(y: Tensor, start_id: int) -> tuple[Tensor, Tensor]:
    """(x, y) of pixel ids ``(..., S*S)``: y as int64, x = ``[start_id] + y[:-1]`` along the last dimension."""
    y = y.long()
    start = torch.full((*y.shape[:-1], 1), start_id, dtype=torch.long)
    return torch.cat([start, y[..., :-1]], dim=-1), y


class PixelSequences(Dataset):
    """Item i is (x, y) of image i's pixel ids (``pixel_pairs``): of ``tokens`` in memory, or ``images`` encoded."""

    def __init__(self, tokenizer: PixelTokenizer, tokens: Tensor | None = None, images: Dataset | None = None) -> None:
        self.tokenizer, self.tokens, self.images = tokenizer, tokens, images

    def __len__(self) -> int:
        return len(self.tokens if self.images is None else self.images)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        x, y = self.__getitems__([index])
        return x[0], y[0]

    def __getitems__(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        if self.images is None:
            ids = self.tokens[torch.as_tensor(indices, dtype=torch.long)]
        else:
            ids = self.tokenizer.encode(torch.stack([self.images[index][0] for index in indices]))
        return pixel_pairs(ids, self.tokenizer.start_id)


def check_image_size(image_size: int | None, source: ImageSource) -> None:
    """Refuse an ``image_size`` Image GPT cannot read ``source`` at (it only shrinks; a folder needs one)."""
    dataset, native = source.dataset, source.info.image_size
    if image_size is None:
        if dataset == "image_folder":
            raise ValueError(
                "data.image_size is needed with dataset='image_folder' (the side its files are resized to; each "
                "image is image_size² tokens, e.g. 32 for 1024)"
            )
        return
    if isinstance(image_size, bool) or not isinstance(image_size, int):
        raise ValueError(f"data.image_size={image_size!r} must be an integer (pixels per side)")
    if dataset == "image_folder" and image_size < 1:
        raise ValueError(f"data.image_size={image_size} must be at least 1")
    if dataset != "image_folder" and not 1 <= image_size <= native:
        raise ValueError(
            f"data.image_size={image_size} must be from 1 to {native}, the size of dataset={dataset!r} "
            "(images are only made smaller, by area averaging)"
        )


def check_palette(palette: PaletteConfig, info: ImageDatasetInfo) -> None:
    """Refuse a uniform colour palette larger than Image GPT's vocabulary (``MAX_UNIFORM_COLOURS``)."""
    if palette.kind == "uniform" and info.in_channels == 3 and palette.levels**3 > MAX_UNIFORM_COLOURS:
        levels = palette.levels
        raise ValueError(
            f"data.palette: kind='uniform' with levels={levels} gives {levels}³ = {levels**3} colours for colour "
            f"images (levels are per channel); use levels <= {round(MAX_UNIFORM_COLOURS ** (1 / 3))}, or "
            "kind='kmeans' with levels = the number of colours"
        )


class ImageTokenDataModule(DataModule):
    """Images as sequences of palette ids for Image GPT: batches (x, y), each ``(batch, image_size²)`` int64.

    Args:
        source: which images and how they split (``ImageSource``); an image folder's labels serve only ``probe``.
        palette: the colours pixels are read as (``PaletteConfig``).
        loader: batch size, loader workers, pinned memory (``LoaderConfig``; 0 workers is usually best).
        prepare: where an image folder is prepared (``PrepareConfig``, as ``ImageDataModule``'s).
        image_size: side of the modelled images (area-averaged), at most the dataset's; None: its own (not for folders).
        seed: seeds the validation carve, the k-means palette and the training-set shuffling.
    """

    def __init__(
        self,
        source: ImageSource = ImageSource(),
        palette: PaletteConfig = PaletteConfig(),
        loader: LoaderConfig = LoaderConfig(batch_size=64, pin_memory=False),
        prepare: PrepareConfig = PrepareConfig(),
        image_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.source = as_config(ImageSource, source)
        self.palette_config = as_config(PaletteConfig, palette)
        self.loader = self.loader_config(loader)
        self.seed = seed
        check_image_size(image_size, self.source)
        check_palette(self.palette_config, self.source.info)
        is_folder = self.source.dataset == "image_folder"
        # The splits, as uint8 images at their native size (image folders: at image_size, read that way).
        loader = LoaderConfig(batch_size=self.loader.batch_size, pin_memory=False)
        self.images_data = ImageDataModule(
            self.source, AugmentConfig(policy="none"), loader, as_config(PrepareConfig, prepare),
            image_size if is_folder else None, seed,
        )  # fmt: skip
        self.resolution = self.source.info.image_size if image_size is None else image_size
        self.channels = self.source.info.in_channels
        self.class_names = self.images_data.class_names
        self.streams_images = is_folder  # encoded per batch from prepared records, not held in memory
        self._pixel_tokenizer: PixelTokenizer | None = None
        self._images: dict[str, Tensor] = {}  # uint8 (N, C, S, S) at image_size, before quantising
        self._labels: dict[str, Tensor] = {}
        self._tokens: dict[str, Tensor] = {}  # int16 (N, S*S): palette ids (at most 4097 of them)

    # --- what the GPT needs to know of the data ---------------------------------------------------------------

    @property
    def block_size(self) -> int:
        """Pixels per image, image_size²: the GPT reads [start] + all but the last pixel and predicts each pixel."""
        return self.resolution * self.resolution

    def data_facts(self) -> DataFacts:
        palette = self.pixel_tokenizer
        return DataFacts(palette=palette.to_dict(), vocab_size=palette.vocab_size, max_length=self.block_size)

    @property
    def pixel_tokenizer(self) -> PixelTokenizer:
        """The palette and its ids; a k-means palette is fitted on training images on first use."""
        if self._pixel_tokenizer is None:
            levels = self.palette_config.levels
            if self.palette_config.kind == "uniform":
                self._pixel_tokenizer = PixelTokenizer.uniform(levels, self.resolution, self.channels)
            else:
                try:
                    self._pixel_tokenizer = PixelTokenizer.fit_kmeans(
                        self._palette_sample(), levels, self.resolution, seed=self.seed
                    )
                except ValueError as error:  # fewer distinct colours than levels
                    raise ValueError(f"data.palette: kind='kmeans' with levels={levels}: {error}") from None
        return self._pixel_tokenizer

    def _palette_sample(self) -> Tensor:
        """A k-means palette's training images: a built-in set's all, a folder's ``PALETTE_SAMPLE_PIXELS`` worth."""
        if not self.streams_images:
            self._read_images()
            return self._images["train"]
        self.setup()
        train = self.images_data.train_dataset
        count = min(len(train), max(1, PALETTE_SAMPLE_PIXELS // self.block_size))
        chosen = range(len(train))
        if count < len(train):
            chosen = np.sort(np.random.default_rng(self.seed).choice(len(train), count, replace=False)).tolist()
        return torch.stack([train[index][0] for index in chosen])

    # --- reading and encoding ---------------------------------------------------------------------------------

    def prepare_data(self) -> None:
        self.images_data.prepare_data()

    @property
    def prepared(self) -> Path | None:
        return self.images_data.prepared

    def _read_images(self) -> None:
        if self._images:
            return
        for split in SPLITS:
            self._images[split], self._labels[split] = self._read_split(split)

    def _read_split(self, split: str, limit: int | None = None) -> tuple[Tensor, Tensor]:
        """The first ``limit`` images of a split (all if None) at the model's resolution, and labels."""
        self.images_data.setup()
        subset: ImageSubset = getattr(self.images_data, f"{split}_dataset")
        count = len(subset) if limit is None else min(limit, len(subset))
        if isinstance(subset.source, TensorDataset):
            rows = torch.as_tensor(subset.indices[:count], dtype=torch.long)
            images, labels = subset.source.tensors[0][rows], subset.source.tensors[1][rows]
        else:  # a prepared image folder (already at image_size)
            items = [subset[i] for i in range(count)]
            images = torch.stack([image for image, _ in items])
            labels = torch.as_tensor([int(label) for _, label in items], dtype=torch.long)
        if images.shape[-1] != self.resolution:
            images = downsample(images.contiguous(), self.resolution)
        return images.contiguous(), labels

    def setup(self, stage: str | None = None) -> None:
        """Read the splits once: a built-in dataset's encoded into palette ids in memory; an image folder's records."""
        self.images_data.setup()
        for split in SPLITS:
            if len(getattr(self.images_data, f"{split}_dataset")) == 0:
                raise DataError(
                    f"ImageTokenDataModule: the {split} split of dataset={self.source.dataset!r} is empty; "
                    "change data.source.val_size / val_fraction or add images"
                )
        if not self.streams_images:
            self._encode()

    def _encode(self) -> None:
        if self._tokens:
            return
        self._read_images()
        tokenizer = self.pixel_tokenizer
        for split in SPLITS:
            self._tokens[split] = tokenizer.encode(self._images[split]).to(torch.int16)

    def _require(self, split: str) -> None:
        _check_split(split)
        self.setup()
        self._encode()

    def tokens(self, split: str) -> Tensor:
        """The pixel ids of a split, int64 ``(N, image_size²)`` in raster order."""
        self._require(split)
        return self._tokens[split].long()

    def images(self, split: str) -> Tensor:
        """The images of a split as the model sees them: uint8 ``(N, C, S, S)``, each pixel its palette colour."""
        self._require(split)
        return self.pixel_tokenizer.decode(self._tokens[split].long())

    def labels(self, split: str) -> Tensor:
        """The class labels of a split, int64 ``(N,)`` (for ``lightformer probe``), in the order of ``images``."""
        self._require(split)
        return self._labels[split]

    def labelled_images(self, split: str, limit: int | None = None) -> tuple[Tensor, Tensor]:
        """``images(split)`` and ``labels(split)``, the first ``limit`` if given (read only those)."""
        if not self.streams_images:
            self._require(split)
            return self.pixel_tokenizer.decode(self._tokens[split][:limit].long()), self._labels[split][:limit]
        _check_split(split)
        images, labels = self._read_split(split, limit)
        return self.pixel_tokenizer.decode(self.pixel_tokenizer.encode(images).long()), labels

    def _dataloader(self, split: str, shuffle: bool = False) -> DataLoader:
        self.setup()
        if self.streams_images:
            dataset = PixelSequences(self.pixel_tokenizer, images=getattr(self.images_data, f"{split}_dataset"))
        else:
            dataset = PixelSequences(self.pixel_tokenizer, tokens=self._tokens[split])
        return image_loader(dataset, self.loader, self.seed, shuffle)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is unknown; valid: {list(SPLITS)}")
