"""The Open Clip Art Library 0.18: drawings, captions, categories (docs/data.md, "The Open Clip Art Library")."""

from __future__ import annotations

import hashlib
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from PIL import Image, ImageChops

from lightformer.data.sources.image_files import check_canvas_size, open_image
from lightformer.data.sources.rendering import png_bytes
from lightformer.errors import DataError
from lightformer.nn.checks import check_at_least

OPENCLIPART_ROOT = "/usr/share/openclipart"
# Top-level categories left out of the classes, with why: their names do not say what the drawings show, or they
# hold too few drawings for a held-out one to exist. Their drawings still train, with label -1.
EXCLUDED_CATEGORIES = {
    "unsorted": "not sorted: the name says nothing of what the 154 drawings show",
    "special": "CD covers, gradients, patterns, templates: 'special' says nothing of what the 225 drawings show",
    "buttons": "3 drawings: too few for a held-out one",
    "logos": "7 drawings: too few for a held-out one",
}
# The most pixels a (trusted) PNG of the library is decoded at: three exceed Pillow's limit, two stop signs of
# 20,990 × 29,700 (2.5 GB as RGBA while reduced) and a microchip of 16,000 × 14,464.
MAX_PIXELS = 700_000_000
NEAR_WHITE = 16  # grey levels from white that cropping a drawing to its ink counts as paper
_VARIANT_WORDS = re.compile(r"(?:^|_)(?:bw|colou?r)(?=_|$)")
_TRAILING = re.compile(r"[\d_]+$")


class Drawing(NamedTuple):
    """A drawing: its path under ``png/`` without suffix, its top-level category, its captions and keywords."""

    name: str
    category: str
    captions: list[str]
    keywords: tuple[str, ...] = ()


def categories(names: list[str]) -> list[str]:
    """The classes of the drawings ``names``: their top-level folders that are not ``EXCLUDED_CATEGORIES``, sorted."""
    return sorted({name.split("/", 1)[0] for name in names} - set(EXCLUDED_CATEGORIES))


def class_name(category: str) -> str:
    """A category's folder name as a prompt says it: "signs_and_symbols" → "signs and symbols"."""
    return category.replace("_", " ")


def variant_key(name: str) -> str:
    """The key a drawing's variants share (docs/data.md): "animals/crawfish1_bw_ganson" → "crawfish1_ganson"."""
    stem = Path(name).name.lower()
    stem = _VARIANT_WORDS.sub("", stem)
    return _TRAILING.sub("", stem) or stem


def split_of(name: str, val_fraction: float, test_fraction: float) -> str:
    """A drawing's split from a stable hash of its ``variant_key``: val, then test, by the fractions; else train."""
    share = int(hashlib.sha256(variant_key(name).encode("utf-8")).hexdigest()[:12], 16) / 16**12
    return "val" if share < val_fraction else "test" if share < val_fraction + test_fraction else "train"


def _words(text: str | None) -> str:
    return " ".join((text or "").split())


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def svg_metadata(path: str | Path) -> tuple[str, str, list[str]]:
    """(title, description, keywords) of an SVG's ``<cc:Work>``; an SVG that does not parse is a ValueError."""
    work = None
    try:
        for _, element in ET.iterparse(str(path), events=("end",)):
            if _local(element.tag) == "Work":
                work = element
                break
            if _local(element.tag) == "metadata":
                break
    except ET.ParseError as error:
        raise ValueError(f"{path} is not a readable SVG ({error})") from None
    title = description = ""
    keywords: list[str] = []
    for child in work if work is not None else ():
        kind = _local(child.tag)
        if kind == "title" and not title:
            title = _words(child.text)
        elif kind == "description" and not description:
            description = _words(child.text)
        elif kind == "subject":
            keywords += [word for li in child.iter() if _local(li.tag) == "li" and (word := _words(li.text))]
    return title, description, list(dict.fromkeys(keywords))


def cut(text: str, max_chars: int) -> str:
    """``text`` cut at the last word boundary within ``max_chars`` characters (mid-word only for one long word)."""
    if len(text) <= max_chars:
        return text
    head = text[: max_chars + 1].rsplit(" ", 1)[0] if " " in text[:max_chars] else text[:max_chars]
    return head[:max_chars].rstrip(" ,;:")


def captions_of(title: str, description: str, keywords: list[str], max_chars: int) -> list[str]:
    """A drawing's captions (docs/data.md, "The Open Clip Art Library"), each within ``max_chars``; [] where none."""
    captions = [cut(title, max_chars)] if title else []
    if description and description != title:
        captions.append(cut(description, max_chars))
    listed = title
    for word in [w for w in keywords if w.lower() != title.lower()]:
        longer = f"{listed}, {word}" if listed else word
        if len(longer) > max_chars:
            break
        listed = longer
    if listed and listed != title:
        captions.append(listed)
    return list(dict.fromkeys(captions))


def drawing_names(root: str | Path) -> list[str]:
    """Every drawing under ``<root>/png`` as its path there without suffix, sorted."""
    png = Path(root) / "png"
    return sorted(str(path.relative_to(png).with_suffix("")) for path in png.rglob("*.png"))


def read_drawings(root: str | Path, names: list[str], max_chars: int) -> Iterator[Drawing | str]:
    """Each of ``names`` as a ``Drawing`` with its captions from its SVG, or its name where it has none."""
    for name in names:
        title, description, keywords = svg_metadata(Path(root) / "svg" / f"{name}.svg")
        captions = captions_of(title, description, keywords, max_chars)
        keywords = tuple(dict.fromkeys(cut(word, max_chars) for word in keywords))
        yield Drawing(name, name.split("/", 1)[0], captions, keywords) if captions else name


def on_white(image: Image.Image) -> Image.Image:
    """An image of any mode as RGB, transparent parts on white."""
    if image.mode == "P" and "transparency" in image.info or image.mode in ("LA", "PA"):
        image = image.convert("RGBA")
    if image.mode == "RGBA":
        canvas = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(canvas, image).convert("RGB")
    return image.convert("RGB")


def fit_square(image: Image.Image, size: int) -> Image.Image:
    """An RGB image cropped to what is not paper (``NEAR_WHITE``), scaled onto a white ``size`` square, centred."""
    difference = ImageChops.difference(image, Image.new("RGB", image.size, "white")).convert("L")
    box = difference.point(lambda level: 255 if level > NEAR_WHITE else 0).getbbox()
    image = image.crop(box) if box else image
    scale = size / max(image.width, image.height)
    fitted = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                          Image.Resampling.LANCZOS, reducing_gap=3.0)  # fmt: skip
    canvas = Image.new("RGB", (size, size), "white")
    canvas.paste(fitted, ((size - fitted.width) // 2, (size - fitted.height) // 2))
    return canvas


def drawing_image(path: str | Path, size: int, trusted_pixels: int | None = MAX_PIXELS) -> Image.Image:
    """The PNG at ``path`` fitted on a white ``size`` square, a large one reduced in strips (``reduced_on_white``)."""
    with open_image(path, trusted_pixels) as opened:
        opened.load()
        factor = max(1, max(opened.size) // (4 * size))
        image = reduced_on_white(opened, factor) if factor > 1 else on_white(opened)
    return fit_square(image, size)


def reduced_on_white(image: Image.Image, factor: int, strip_pixels: int = 1 << 22) -> Image.Image:
    """``image`` on white, reduced ``factor`` times (block means), a strip of about ``strip_pixels`` at a time."""
    width, height = image.size
    rows = factor * max(1, strip_pixels // (width * factor))
    out = Image.new("RGB", (-(-width // factor), -(-height // factor)), "white")
    for top in range(0, height, rows):
        strip = on_white(image.crop((0, top, width, min(height, top + rows))))
        out.paste(strip.reduce(factor), (0, top // factor))
    return out


@dataclass(frozen=True)
class ClipArtSource:
    """The Open Clip Art Library and how its drawings are split and drawn (``data.source``).

    Args:
        root: the library's folder of ``png/`` and ``svg/`` (``apt-get install openclipart-png openclipart-svg``).
        image_size: the square canvas's side in pixels.
        val_fraction: share of the drawings (by a hash of their variant key) held out for validation.
        test_fraction: share held out for test.
        max_chars: most characters of a caption (cut at a word boundary).
        keyword_captions: a training drawing's keywords are captions too, each alone (the text tower reads class names).
    """

    root: str = OPENCLIPART_ROOT
    image_size: int = 64
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    max_chars: int = 96
    keyword_captions: bool = True

    def __post_init__(self) -> None:
        check_canvas_size(self.image_size)
        for name in ("val_fraction", "test_fraction"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"data.source.{name}={getattr(self, name)} must be in [0, 1)")
        if self.val_fraction + self.test_fraction >= 1:
            raise ValueError(f"data.source.val_fraction + test_fraction = {self.val_fraction + self.test_fraction} "
                             "leaves nothing to train on: their sum must be below 1")  # fmt: skip
        check_at_least("data.source.max_chars", self.max_chars, 8)


def clipart_records(piece: list[tuple[Drawing, int]], root: str, size: int):
    """The records {"image", "file", "texts", "label"} of a piece of (drawing, label), one at a time."""
    for drawing, label in piece:
        path = Path(root) / "png" / f"{drawing.name}.png"
        try:
            image = drawing_image(path, size)
        except (OSError, ValueError) as error:
            raise DataError(f"data.source.root: {path} is not a readable PNG ({error})") from None
        yield {"image": png_bytes(image), "file": drawing.name, "texts": json.dumps(drawing.captions),
               "label": label}  # fmt: skip
