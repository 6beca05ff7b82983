"""Image GPT data: images → (downsampled) uint8 → palette ids → next-pixel (x, y) sequences.

``ImageTokenDataModule`` reads the splits of an ``ImageDataModule`` (Fashion-MNIST, MNIST, CIFAR-10, scikit-learn's
digits, image folders) as uint8 images, optionally shrinks them by area averaging (``pixels.downsample``), chooses a
palette (evenly spaced levels, or k-means colours fitted on training pixels alone) and reads each image as pixel ids
in raster order (``pixels.PixelTokenizer``). A training example is one whole image: ``y`` is its ``image_size²`` pixel
ids and ``x`` is ``[start] + y[:-1]``, so the GPT predicts each pixel from the ones before it, the first from the
start token alone; the batches are those of ``LanguageModelTask``.

The built-in datasets (bounded: at most 180 MB of pixels) are encoded once, every split, into ids held in memory. An
image folder, of any size, is streamed from its prepared records (``images.prepare_image_folder``) and each batch is
encoded as it is read, so memory does not grow with the folder; its k-means palette is fitted on a bounded sample of
training images (``PALETTE_SAMPLE_PIXELS``).

``data_facts()`` tells the GPT the palette, its ``vocab_size`` (palette colours + the start token) and the
``block_size`` (pixels per image) right after construction; the palette is fitted on first use.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightformer.config_groups import as_config
from lightformer.data.loading.streaming import ImageLoaderConfig
from lightformer.data.module import DataModule
from lightformer.data.modules.images import ImageDataModule, ImageDatasetInfo, ImageSource, ImageSubset, image_loader
from lightformer.data.objectives.augment import AugmentConfig
from lightformer.data.pieces import SPLITS
from lightformer.data.preparation.prepare import PrepareConfig
from lightformer.errors import DataError
from lightformer.facts import DataFacts
from lightformer.tokenization.pixels import PaletteConfig, PixelTokenizer, downsample

# A uniform colour palette has levels³ colours: more than this and the vocabulary (and the GPT's embedding and
# output layers) grows past what Image GPT uses (512 k-means colours); k-means picks the colours that occur instead.
MAX_UNIFORM_COLOURS = 4096
# An image folder's k-means palette is fitted on the pixels of at most this many pixels' worth of training images,
# drawn at random by the seed (``fit_kmeans`` then draws its 200,000 pixels from them): a bounded read, whatever the
# folder's size. A folder with fewer training pixels is read whole, as the built-in datasets are.
PALETTE_SAMPLE_PIXELS = 2_000_000


def pixel_pairs(y: Tensor, start_id: int) -> tuple[Tensor, Tensor]:
    """(x, y) of pixel ids ``(..., S*S)``: y as int64, x = ``[start_id] + y[:-1]`` along the last dimension."""
    y = y.long()
    start = torch.full((*y.shape[:-1], 1), start_id, dtype=torch.long)
    return torch.cat([start, y[..., :-1]], dim=-1), y


class PixelSequences(Dataset):
    """Item i is (x, y) for image i: y its pixel ids ``(S*S,)`` int64, x = ``[start_id] + y[:-1]``; ``__getitems__``
    makes a whole batch at once. The ids are ``tokens`` ``(N, S*S)``, held in memory (stored compactly, widened per
    batch), or those of ``images`` (a dataset of (uint8 image ``(C, S, S)``, label): a prepared image folder's split)
    encoded with ``tokenizer`` as their batch is read, so that no split's ids are ever all held."""

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
    """Refuse an ``image_size`` that Image GPT cannot read ``source`` at: images are only made smaller (by area
    averaging), and an image folder's files have no common size to default to."""
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
        source: which images and how they split (``ImageSource``, as ``ImageDataModule``'s); an image folder's
            labels are only used by ``lightformer probe``.
        palette: the colours pixels are read as (``PaletteConfig``).
        loader: batch size, loader workers, pinned memory (``ImageLoaderConfig``; a batch is one slice of a tensor in
            memory: 0 workers is usually best).
        prepare: where an image folder is prepared (``PrepareConfig``, as ``ImageDataModule``'s).
        image_size: side length of the modelled images, at most the dataset's (28 for (fashion_)mnist, 32 for
            cifar10, 8 for digits); smaller sizes are made by area averaging. Each image is ``image_size²``
            tokens, the sequence the GPT reads (its cost grows with the square of that length). None: the
            dataset's size. Required for image folders (their files are resized to it when read).
        seed: seeds the validation carve, the k-means palette and the training-set shuffling.

    After construction: ``data_facts()``, ``block_size``, ``pixel_tokenizer``, ``resolution`` (pixels per side),
    ``channels`` and ``class_names``; after ``setup``: ``tokens(split)``, ``images(split)`` and ``labels(split)``.
    """

    def __init__(
        self,
        source: ImageSource = ImageSource(),
        palette: PaletteConfig = PaletteConfig(),
        loader: ImageLoaderConfig = ImageLoaderConfig(batch_size=64),
        prepare: PrepareConfig = PrepareConfig(),
        image_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.source = as_config(ImageSource, source)
        self.palette_config = as_config(PaletteConfig, palette)
        self.loader = as_config(ImageLoaderConfig, loader)
        self.seed = seed
        check_image_size(image_size, self.source)
        check_palette(self.palette_config, self.source.info)
        is_folder = self.source.dataset == "image_folder"
        # The splits, as uint8 images at their native size (image folders: at image_size, read that way).
        loader = ImageLoaderConfig(batch_size=self.loader.batch_size)
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
        """The training images a k-means palette is fitted on: all of a built-in dataset's; of an image folder's, at
        most ``PALETTE_SAMPLE_PIXELS`` pixels' worth, drawn by the seed (all of them, in order, when that is all)."""
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
        """Fetch a torchvision dataset (copy or download), or prepare an image folder, once, before ``setup`` runs
        in every process."""
        self.images_data.prepare_data()

    @property
    def prepared(self) -> Path | None:
        """An image folder's prepared records (``ImageDataModule.prepared``); None for a built-in dataset."""
        return self.images_data.prepared

    def _read_images(self) -> None:
        """Every split as uint8 images at the model's resolution and their labels, held in memory once (a built-in
        dataset's, which the loaders then slice)."""
        if self._images:
            return
        for split in SPLITS:
            self._images[split], self._labels[split] = self._read_split(split)

    def _read_split(self, split: str, limit: int | None = None) -> tuple[Tensor, Tensor]:
        """The first ``limit`` images of a split (all if None), uint8 at the model's resolution (area-averaged), and
        their labels: a built-in dataset's sliced from memory; a prepared image folder's decoded one by one, only
        those."""
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
        """Read the splits (all of them, once, whatever the stage): a built-in dataset's encoded with the palette
        into ids held in memory; an image folder's prepared records, which the loaders encode batch by batch."""
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
        """Every split's images as palette ids, held in memory, once."""
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
        """``images(split)`` and ``labels(split)``, the first ``limit`` of them if given (``lightformer probe``). An
        image folder's are read from its prepared records, only those asked for: memory grows with ``limit``, not
        with the folder."""
        if not self.streams_images:
            self._require(split)
            return self.pixel_tokenizer.decode(self._tokens[split][:limit].long()), self._labels[split][:limit]
        _check_split(split)
        images, labels = self._read_split(split, limit)
        return self.pixel_tokenizer.decode(self.pixel_tokenizer.encode(images).long()), labels

    # --- loaders ----------------------------------------------------------------------------------------------

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
