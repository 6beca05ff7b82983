"""Image GPT data: images → (downsampled) uint8 → palette ids → next-pixel (x, y) sequences held in memory.

``ImageTokenDataModule`` reads the splits of an ``ImageDataModule`` (Fashion-MNIST, MNIST, CIFAR-10, scikit-learn's
digits, image folders) as uint8 images, optionally shrinks them by area averaging (``pixels.downsample``), chooses a
palette (evenly spaced levels, or k-means colours fitted on the training pixels alone) and encodes every split once
into pixel ids read in raster order (``pixels.PixelTokenizer``). A training example is one whole image:
``y`` is its ``image_size²`` pixel ids and ``x`` is ``[start] + y[:-1]``, so the GPT predicts each pixel from the ones
before it, the first from the start token alone; the batches are those of ``LanguageModelTask``.

``vocab_size`` (palette colours + the start token) and ``block_size`` (pixels per image) are known right after
construction, so LightningCLI links them into the GPT (``model.net``). The palette is fitted on first use of either.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightformer.config_groups import as_config
from lightformer.data.loading.sampling import EpochShuffleSampler, ResumableDataLoader, evaluation_sampler
from lightformer.data.modules.images import (
    ImageDataModule,
    ImageDatasetInfo,
    ImageLoaderConfig,
    ImageSource,
    ImageSubset,
    collate_images,
)
from lightformer.data.objectives.augment import AugmentConfig
from lightformer.data.objectives.pixels import PaletteConfig, PixelTokenizer, downsample
from lightformer.data.preparation.prepare import PrepareConfig

SPLITS = ("train", "val", "test")

# A uniform colour palette has levels³ colours: more than this and the vocabulary (and the GPT's embedding and
# output layers) grows past what Image GPT uses (512 k-means colours); k-means picks the colours that occur instead.
MAX_UNIFORM_COLOURS = 4096


class PixelSequenceDataset(Dataset):
    """Item i is (x, y) for image i: y its pixel ids ``(S*S,)`` int64, x = ``[start_id] + y[:-1]``.

    ``tokens``: ``(N, S*S)`` integer ids (stored compactly; widened to int64 per batch). ``__getitems__`` slices a
    whole batch at once.
    """

    def __init__(self, tokens: Tensor, start_id: int) -> None:
        self.tokens = tokens
        self.start_id = start_id

    def __len__(self) -> int:
        return len(self.tokens)

    def _pairs(self, y: Tensor) -> tuple[Tensor, Tensor]:
        y = y.long()
        start = torch.full((*y.shape[:-1], 1), self.start_id, dtype=torch.long)
        return torch.cat([start, y[..., :-1]], dim=-1), y

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self._pairs(self.tokens[index])

    def __getitems__(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        return self._pairs(self.tokens[torch.as_tensor(indices, dtype=torch.long)])


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


class ImageTokenDataModule(L.LightningDataModule):
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

    After construction: ``vocab_size``, ``block_size``, ``pixel_tokenizer``, ``resolution`` (pixels per side),
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
        # Not named image_size / in_channels: the CLI links data attributes of those names into model.net.
        self.resolution = self.source.info.image_size if image_size is None else image_size
        self.channels = self.source.info.in_channels
        self.class_names = self.images_data.class_names
        self._pixel_tokenizer: PixelTokenizer | None = None
        self._images: dict[str, Tensor] = {}  # uint8 (N, C, S, S) at image_size, before quantising
        self._labels: dict[str, Tensor] = {}
        self._tokens: dict[str, Tensor] = {}  # int16 (N, S*S): palette ids (at most 4097 of them)

    # --- sizes the CLI links into the GPT ---------------------------------------------------------------------

    @property
    def block_size(self) -> int:
        """Pixels per image, image_size²: the GPT reads [start] + all but the last pixel and predicts each pixel."""
        return self.resolution * self.resolution

    @property
    def vocab_size(self) -> int:
        """Palette colours + 1 (the start token)."""
        return self.pixel_tokenizer.vocab_size

    @property
    def pixel_tokenizer(self) -> PixelTokenizer:
        """The palette and its ids; a k-means palette is fitted on the training images on first use."""
        if self._pixel_tokenizer is None:
            levels = self.palette_config.levels
            if self.palette_config.kind == "uniform":
                self._pixel_tokenizer = PixelTokenizer.uniform(levels, self.resolution, self.channels)
            else:
                self._read_images()
                try:
                    self._pixel_tokenizer = PixelTokenizer.fit_kmeans(
                        self._images["train"], levels, self.resolution, seed=self.seed
                    )
                except ValueError as error:  # fewer distinct colours than levels
                    raise ValueError(f"data.palette: kind='kmeans' with levels={levels}: {error}") from None
        return self._pixel_tokenizer

    # --- reading and encoding ---------------------------------------------------------------------------------

    def prepare_data(self) -> None:
        """Fetch a torchvision dataset (copy or download) once, before ``setup`` runs in every process."""
        self.images_data.prepare_data()

    def _read_images(self) -> None:
        """Every split as uint8 images at image_size (area-averaged) and their labels, once."""
        if self._images:
            return
        self.images_data.setup()
        for split in SPLITS:
            subset: ImageSubset = getattr(self.images_data, f"{split}_dataset")
            if isinstance(subset.source, TensorDataset):
                rows = torch.as_tensor(subset.indices, dtype=torch.long)
                images, labels = subset.source.tensors[0][rows], subset.source.tensors[1][rows]
            else:  # image files, decoded one by one (already at image_size)
                items = [subset[i] for i in range(len(subset))]
                if not items:
                    raise ValueError(f"ImageTokenDataModule: the {split} split of the image folder is empty")
                images = torch.stack([image for image, _ in items])
                labels = torch.as_tensor([int(label) for _, label in items], dtype=torch.long)
            if len(images) == 0:
                raise ValueError(
                    f"ImageTokenDataModule: the {split} split of dataset={self.source.dataset!r} is empty; "
                    "change data.source.val_size / val_fraction or add images"
                )
            if images.shape[-1] != self.resolution:
                images = downsample(images.contiguous(), self.resolution)
            self._images[split], self._labels[split] = images.contiguous(), labels

    def setup(self, stage: str | None = None) -> None:
        """Encode every split with the palette (all of them, once, whatever the stage)."""
        if self._tokens:
            return
        self._read_images()
        tokenizer = self.pixel_tokenizer
        for split in SPLITS:
            self._tokens[split] = tokenizer.encode(self._images[split]).to(torch.int16)

    def _require(self, split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is unknown; valid: {list(SPLITS)}")
        if not self._tokens:
            self.setup()

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

    # --- loaders ----------------------------------------------------------------------------------------------

    def _dataloader(self, split: str, shuffle: bool) -> DataLoader:
        self._require(split)
        dataset = PixelSequenceDataset(self._tokens[split], self.pixel_tokenizer.start_id)
        # training: a loader whose position inside an epoch is saved in checkpoints (an exact mid-epoch resume)
        resumable = {"trainer": lambda: self.trainer} if shuffle else {}
        return (ResumableDataLoader if shuffle else DataLoader)(
            dataset,
            batch_size=self.loader.batch_size,
            sampler=EpochShuffleSampler(len(dataset), self.seed) if shuffle else evaluation_sampler(dataset),
            collate_fn=collate_images,
            num_workers=self.loader.num_workers,
            pin_memory=self.loader.pin_memory,
            persistent_workers=self.loader.num_workers > 0,
            **resumable,
        )

    def train_dataloader(self) -> DataLoader:
        return self._dataloader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._dataloader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._dataloader("test", shuffle=False)
