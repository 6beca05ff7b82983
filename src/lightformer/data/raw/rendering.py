"""Printed text lines as images: the fonts installed under a folder, grouped by family, and one line of text rendered
in one of them (Pillow), for image-to-text data (``data.modules.image_text``).

A line is drawn in dark ink on a light background, as a grey (mode "L") image of a fixed ``height × width``: the
font's line box (ascent + descent) is a share ``size`` of the height, the glyphs are spaced by ``spacing`` em, the
line is sheared and rotated, scaled down if it then overflows the height, placed ``margin`` pixels from the left at
a random height, and blurred and noised. Everything that varies is a ``LineStyle``, drawn by the caller from a
seeded generator: rendering is a pure function of (text, font file, style, height, width), the same bit for bit.
"""

from __future__ import annotations

import io
import math
import string
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

FONT_SUFFIXES = (".ttf", ".otf", ".t1", ".pfb")  # in order of preference for one (family, style) in several files
# Families whose letters are not letters (symbols, dingbats), a math font that repeats a text family's design, or
# whose lowercase is drawn as small capitals (a reader trained on them would learn that "a" looks like "A"); Symbola
# (fonts-symbola, the emoji data's outline style) draws letters too, but is there for its symbols.
SKIPPED_FAMILIES = frozenset({"D050000L", "Standard Symbols PS", "DejaVu Math TeX Gyre", "Go Smallcaps", "Symbola"})
_CHECKED_CHARACTERS = string.ascii_letters + string.digits + ".,;:!?'\"-()"
_REFERENCE_SIZE = 100  # the size at which a font's metrics are read, to size it by its line box


class LineTooWide(ValueError):
    """The rendered line does not fit the canvas's width: the caller draws a smaller size or another line."""

    def __init__(self, needed: int, width: int) -> None:
        super().__init__(f"the line needs {needed} pixels of a canvas {width} pixels wide")
        self.needed, self.width = needed, width


@dataclass(frozen=True)
class LineStyle:
    """How one line looks (drawn per line from a seeded generator).

    Args:
        size: the font's line box (ascent + descent) as a share of the canvas height, before rotation.
        spacing: extra space between letters, in em (negative: tighter).
        rotation: degrees, counter-clockwise.
        shear: horizontal shift per pixel of height (positive leans right, as italics).
        blur: radius in pixels of a Gaussian blur; 0: none.
        noise: standard deviation of Gaussian pixel noise, in grey levels (0-255); 0: none.
        contrast: 1 - ink / background: 1 is black ink.
        background: the background's grey level as a share of white.
        margin: pixels left of the text.
        vertical: where the line sits in the height left free, 0 (top) to 1 (bottom).
        noise_seed: seeds the pixel noise.
    """

    size: float = 0.75
    spacing: float = 0.0
    rotation: float = 0.0
    shear: float = 0.0
    blur: float = 0.0
    noise: float = 0.0
    contrast: float = 1.0
    background: float = 1.0
    margin: int = 2
    vertical: float = 0.5
    noise_seed: int = 0


def font_family(path: str | Path) -> tuple[str, str]:
    """(family, style) that the font file names itself, e.g. ("Nimbus Roman", "Bold Italic")."""
    family, style = ImageFont.truetype(str(path), 12).getname()
    return family or Path(path).stem, style or ""


def missing_glyphs(path: str | Path, characters: str = _CHECKED_CHARACTERS) -> str:
    """The ``characters`` (spaces aside) that the font at ``path`` does not draw with a glyph of its own (it draws the
    font's missing-glyph box, or nothing), in order; all of them if Pillow cannot read the font."""
    wanted = "".join(dict.fromkeys(c for c in characters if not c.isspace()))
    try:
        font = ImageFont.truetype(str(path), 24)
        missing = bytes(font.getmask("\ue000"))
        return "".join(c for c in wanted if (mask := font.getmask(c)).getbbox() is None or bytes(mask) == missing)
    except OSError:
        return wanted


def renders_text(path: str | Path) -> bool:
    """Whether Pillow reads the font and draws every ASCII letter, digit and common punctuation mark."""
    return not missing_glyphs(path)


@lru_cache(maxsize=8)
def discover_fonts(font_dir: str = "/usr/share/fonts") -> dict[str, tuple[str, ...]]:
    """The text fonts under ``font_dir``, by family (sorted): each family's files, one per style (the .ttf, else
    .otf, .t1, .pfb of a style installed in several formats), sorted by path. Symbol and dingbat fonts
    (``SKIPPED_FAMILIES``) and fonts that do not draw ASCII letters (``renders_text``) are left out."""
    chosen: dict[tuple[str, str], Path] = {}
    files = sorted(p for p in Path(font_dir).rglob("*") if p.suffix.lower() in FONT_SUFFIXES and p.is_file())
    for path in sorted(files, key=lambda p: FONT_SUFFIXES.index(p.suffix.lower())):
        try:
            key = font_family(path)
        except OSError:
            continue
        if key[0] not in SKIPPED_FAMILIES and key not in chosen and renders_text(path):
            chosen[key] = path
    families: dict[str, list[str]] = {}
    for (family, _), path in chosen.items():
        families.setdefault(family, []).append(str(path))
    return {family: tuple(sorted(paths)) for family, paths in sorted(families.items())}


@lru_cache(maxsize=1024)
def _font(path: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, size)


def font_size(font_path: str, line_box: float) -> int:
    """The font size (pixels per em) whose line box (ascent + descent) is ``line_box`` pixels."""
    ascent, descent = _font(font_path, _REFERENCE_SIZE).getmetrics()
    return max(4, round(line_box * _REFERENCE_SIZE / (ascent + descent)))


def ink_mask(text: str, font_path: str, style: LineStyle, height: int) -> Image.Image:
    """The line's ink (mode "L", 255 = ink), sheared, rotated and cut to the line's width; at most ``height`` high
    (scaled down if the rotation made it taller), the font's line box kept so that the baseline does not move with
    the letters."""
    size = font_size(font_path, style.size * height)
    font = _font(font_path, size)
    ascent, descent = font.getmetrics()
    spacing = style.spacing * size
    pad = math.ceil(size * 0.5)
    total = font.getlength(text) + spacing * max(len(text) - 1, 0)
    canvas = Image.new("L", (math.ceil(total) + 2 * pad, ascent + descent + 2 * pad), 0)
    draw = ImageDraw.Draw(canvas)
    if spacing == 0:
        draw.text((pad, pad), text, font=font, fill=255)
    else:  # each character where the text's own advance (kerning included) puts it, plus the spacing
        for i, character in enumerate(text):
            if not character.isspace():
                draw.text((pad + font.getlength(text[:i]) + spacing * i, pad), character, font=font, fill=255)
    box = canvas.getbbox() or (pad, pad, pad + 1, pad + 1)
    canvas = canvas.crop((box[0], min(box[1], pad), box[2], max(box[3], pad + ascent + descent)))
    canvas = _sheared_and_rotated(canvas, style.shear, style.rotation)
    if canvas.height > height:
        scale = height / canvas.height
        canvas = canvas.resize((max(1, round(canvas.width * scale)), height), Image.Resampling.BICUBIC)
    return canvas


def _sheared_and_rotated(mask: Image.Image, shear: float, rotation: float) -> Image.Image:
    """``mask`` sheared (x += shear * (centre y - y)) then rotated by ``rotation`` degrees about its centre, on a
    canvas that holds the whole result."""
    if shear == 0 and rotation == 0:
        return mask
    w, h = mask.size
    angle = math.radians(rotation)
    cos, sin = math.cos(angle), math.sin(angle)
    # forward map of a point (x, y), y down: shear, then rotate counter-clockwise on screen
    shear_m = np.array([[1.0, -shear], [0.0, 1.0]])
    rotate_m = np.array([[cos, sin], [-sin, cos]])
    forward = rotate_m @ shear_m
    corners = np.array([[0, 0], [w, 0], [0, h], [w, h]], dtype=np.float64) - [w / 2, h / 2]
    moved = corners @ forward.T
    low, high = moved.min(axis=0), moved.max(axis=0)
    out_w, out_h = (math.ceil(v) for v in high - low)
    inverse = np.linalg.inv(forward)
    # output (u, v) -> input: inverse @ ((u, v) + low) + centre
    offset = inverse @ low + [w / 2, h / 2]
    data = (inverse[0, 0], inverse[0, 1], offset[0], inverse[1, 0], inverse[1, 1], offset[1])
    return mask.transform((out_w, out_h), Image.Transform.AFFINE, data, resample=Image.Resampling.BICUBIC)


def render_line(text: str, font_path: str, params: LineStyle, height: int, width: int) -> Image.Image:
    """``text`` in ``font_path`` as a grey line image (mode "L", ``height × width``): dark ink on a light
    background, left-aligned ``params.margin`` pixels in, the rest of the width background. Raises
    ``LineTooWide`` (with the width needed) when the line does not fit: the caller must not pick it."""
    mask = ink_mask(text, font_path, params, height)
    needed = params.margin + mask.width + 1
    if needed > width:
        raise LineTooWide(needed, width)
    ink_share = np.zeros((height, width), dtype=np.float32)
    top = round(params.vertical * (height - mask.height))
    ink_share[top : top + mask.height, params.margin : params.margin + mask.width] = np.asarray(mask) / 255.0
    background = 255.0 * params.background
    ink = background * (1.0 - params.contrast)
    pixels = background - (background - ink) * ink_share
    image = Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), mode="L")
    if params.blur > 0:
        image = image.filter(ImageFilter.GaussianBlur(params.blur))
    if params.noise > 0:
        noise = np.random.default_rng(params.noise_seed).normal(0.0, params.noise, (height, width))
        pixels = np.asarray(image, dtype=np.float32) + noise
        image = Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), mode="L")
    return image


def png_bytes(image: Image.Image) -> bytes:
    """The image as PNG (lossless, as the records store it)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=6)
    return buffer.getvalue()


def jpeg_bytes(image: Image.Image, quality: int = 95) -> bytes:
    """The image as JPEG of ``quality`` (a photo: about a tenth of its PNG, no difference a model sees)."""
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()
