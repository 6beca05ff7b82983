"""Image files: any PIL-readable file as grey or RGB, fitted to a canvas; image folders and their records."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset
from torchvision.transforms import v2

from lightformer.errors import DataError

_WARNED: set[str] = set()  # the large files warned of, once each in a process


@contextlib.contextmanager
def open_image(path: str | Path | BinaryIO, trusted_pixels: int | None = None) -> Iterator[Image.Image]:
    """``Image.open(path)``, PIL's failures and bomb limit ours (docs/data.md, "Files"); ``trusted_pixels``: silent."""
    limit = Image.MAX_IMAGE_PIXELS
    try:
        Image.MAX_IMAGE_PIXELS = None  # the size is checked here, with the file's name
        try:
            opened = Image.open(path)
        finally:
            Image.MAX_IMAGE_PIXELS = limit
        with opened:
            width, height = opened.size
            pixels = width * height
            if trusted_pixels is not None:
                if pixels > trusted_pixels:
                    raise DataError(f"{path} is {width} × {height} pixels, more than the {trusted_pixels:,} decoded")
            elif limit is not None and pixels > 2 * limit:
                raise DataError(
                    f"{path} is {width} × {height} pixels ({pixels / 1e6:.3g} megapixels), more than the "
                    f"{2 * limit / 1e6:.3g} megapixels an image file may have (twice Pillow's decompression-bomb "
                    "limit: a file this large can be an attack that fills the memory as it is decoded); reduce it "
                    "first, e.g. `convert in.png -resize 8000x8000 out.png` (the model sees it far smaller)"
                )
            elif limit is not None and pixels > limit and isinstance(path, (str, Path)) and str(path) not in _WARNED:
                _WARNED.add(str(path))
                print(
                    f"warning: {path} is {width} × {height} pixels ({pixels / 1e6:.3g} megapixels), more than "
                    f"Pillow's decompression-bomb limit of {limit / 1e6:.3g} megapixels: decoded all the same (above "
                    f"{2 * limit / 1e6:.3g} megapixels an image file is refused)",
                    file=sys.stderr,
                    flush=True,
                )
            yield opened
    except FileNotFoundError:
        raise FileNotFoundError(f"Image file not found: {path}") from None
    except (UnidentifiedImageError, OSError) as error:
        raise DataError(
            f"{path} is not a readable image file ({error}): give PNG, JPEG or another image file that PIL reads"
        ) from error


def load_image(path: str | Path | BinaryIO, in_channels: int = 3, image_size: int | None = None) -> Image.Image:
    """An image file (or its bytes) as mode "L" (in_channels=1) or "RGB" (3); with `image_size`, resized to a square."""
    modes = {1: "L", 3: "RGB"}
    if in_channels not in modes:
        raise ValueError(f"load_image: in_channels={in_channels} is not supported; use 1 (grey) or 3 (RGB)")
    with open_image(path) as opened:
        # Cameras store the orientation in EXIF instead of rotating pixels; apply it.
        image = ImageOps.exif_transpose(opened)
        if image.mode.startswith("I;16"):
            image = Image.fromarray((np.asarray(image) >> 8).astype(np.uint8))
        elif image.mode in ("I", "F"):
            raise DataError(
                f"{path} has 32-bit {'integer' if image.mode == 'I' else 'float'} pixels (PIL mode "
                f"{image.mode!r}), which have no standard 8-bit range; save it with 8-bit channels (greyscale "
                f"or RGB, also with alpha) or as 16-bit greyscale"
            )
        image = image.convert(modes[in_channels])
    if image_size is not None:
        image = v2.functional.resize(image, [image_size, image_size], antialias=True)
    return image


def read_images(
    paths: list[str | Path], in_channels: int, image_size: int, mean: list[float], std: list[float]
) -> torch.Tensor:
    """Image files as a model's input ``(len(paths), C, S, S)``, loaded, resized and normalised as for evaluation."""
    transform = to_normalised_tensor(mean, std)
    return torch.stack([transform(load_image(path, in_channels, image_size)) for path in paths])


def to_normalised_tensor(mean: Sequence[float], std: Sequence[float]) -> v2.Compose:
    """A PIL image → float32 ``(C, H, W)`` on [0, 1], normalised by the data's ``mean`` and ``std``."""
    return v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))])


def fit_line(image: Image.Image, height: int, width: int) -> Image.Image:
    """A line image on a ``height`` × ``width`` canvas, as lines are rendered: scaled to the height, at the left."""
    pixels = np.asarray(image)
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    background = tuple(int(v) for v in np.median(border.reshape(len(border), -1), axis=0))
    scale = min(height / image.height, width / image.width)
    size = (max(1, min(width, round(image.width * scale))), max(1, min(height, round(image.height * scale))))
    canvas = Image.new(image.mode, (width, height), background if len(background) > 1 else background[0])
    canvas.paste(image.resize(size, Image.Resampling.LANCZOS), (0, (height - size[1]) // 2))
    return canvas


def fit_image(image: Image.Image, height: int, width: int, fit: str | None) -> Image.Image:
    """``image`` on a ``height`` × ``width`` canvas: as a text line (``fit`` "line"), else stretched (a photo)."""
    if fit == "line":
        return fit_line(image, height, width)
    return image.resize((width, height), Image.Resampling.LANCZOS)


def read_line_image(
    path: str | Path,
    in_channels: int,
    image_size: tuple[int, int],
    mean: Sequence[float],
    std: Sequence[float],
    fit: str | None = "line",
) -> torch.Tensor:
    """An image file as an image-to-text model's input ``(C, H, W)``; a blank image is a DataError naming the file."""
    image = load_image(path, in_channels)
    pixels = np.asarray(image)
    if pixels.min() == pixels.max():
        raise DataError(f"{path} is blank (every pixel has one value): it holds nothing to read")
    return to_normalised_tensor(mean, std)(fit_image(image, *image_size, fit))


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
    """The splits and class names of an image folder: ``train/<class>/`` (``val/``, ``test/``), or ``<class>/``."""
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
        raise DataError(f"data.source.image_folder: {train_dir} has no class subfolders; expected {expected}")
    split_dirs = {}
    for split in ("val", "test"):
        split_dir = folder / split
        if not (has_split_dirs and split_dir.is_dir()):
            split_dirs[split] = None
            continue
        unknown = sorted(set(class_folder_names(split_dir)) - set(class_names))
        if unknown:
            raise DataError(
                f"data.source.image_folder: {split_dir} has class folders {unknown} that {train_dir} lacks; "
                f"the training classes are {class_names}"
            )
        split_dirs[split] = split_dir
    return ImageFolderLayout(train_dir, split_dirs["val"], split_dirs["test"], class_names)


def class_folder_files(directory: Path, class_names: list[str], require_every_class: bool) -> list[tuple[str, int]]:
    """The image files under ``directory/<class name>/`` (in torchvision's order) with their class index."""
    class_to_index = {name: index for index, name in enumerate(class_names)}
    samples = make_dataset(str(directory), class_to_index, extensions=IMG_EXTENSIONS, allow_empty=True)
    if not samples:
        extensions = ", ".join(IMG_EXTENSIONS)
        raise DataError(
            f"data.source.image_folder: no image files ({extensions}) in {directory}: put each class's images in a "
            "subfolder named after the class"
        )
    found = {label for _, label in samples}
    empty = [name for name in class_names if class_to_index[name] not in found]
    if require_every_class and empty:
        raise DataError(f"data.source.image_folder: class folders without image files in {directory}: {empty}")
    return samples


def read_checked_image(path: str, in_channels: int) -> tuple[bytes | None, str | None]:
    """An image file's bytes and what keeps it from training (None: nothing), decoded in full (a file cut short)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None, "gone: it was removed while the folder was read"
    except OSError as error:
        return None, str(error)
    stream = io.BytesIO(data)
    try:
        load_image(stream, in_channels)
    except ValueError as error:
        cause = error.__cause__ or error
        if isinstance(cause, UnidentifiedImageError):
            return None, "not an image: PIL recognises no image format in it"
        if "truncated" in str(cause).lower():
            return None, f"cut short: {cause}"
        return None, str(cause).removeprefix(f"{stream} ")
    return data, None


def image_file_records(files: list[tuple[str, int]], in_channels: int) -> Generator[dict, None, list[str]]:
    """The records ``{"image": bytes, "label"}`` of a piece ``[(path, label)]``; returns the bad as "path (problem)"."""
    problems = []
    for path, label in files:
        data, problem = read_checked_image(path, in_channels)
        if problem is None:
            yield {"image": data, "label": label}
        else:
            problems.append(f"{path} ({problem})")
    return problems


MIN_SIZE = 16


def check_canvas_size(size: int) -> None:
    if size < MIN_SIZE:
        raise ValueError(f"data.source.image_size={size} must be at least {MIN_SIZE} pixels")
