"""Printed text lines as images: the typefaces, and one line rendered from its style (docs/data.md, "Printed lines")."""

from __future__ import annotations

import io
import math
import os
import string
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from lightformer.errors import DataError

FONT_SUFFIXES = (".ttf", ".otf", ".t1", ".pfb")  # in order of preference for one (family, style) in several files
# Symbol and dingbat fonts, a math font repeating a text family, small capitals ("a" drawn as "A"), and Symbola (there
# for the emoji's outlines).
SKIPPED_FAMILIES = frozenset({"D050000L", "Standard Symbols PS", "DejaVu Math TeX Gyre", "Go Smallcaps", "Symbola"})
_CHECKED_CHARACTERS = string.ascii_letters + string.digits + ".,;:!?'\"-()"
_REFERENCE_SIZE = 100  # the size at which a font's metrics are read, to size it by its line box
SYSTEM_FONT_DIR = "/usr/share/fonts"  # data.source.font_dir's default: the declared TYPEFACES, nothing else there
FONT_ROOT = Path(SYSTEM_FONT_DIR)  # where TYPEFACES' files are


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
    """The ``characters`` (not spaces) the font at ``path`` has no glyph of; all of them if Pillow cannot read it."""
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


def typefaces(font_dir: str = SYSTEM_FONT_DIR) -> dict[str, tuple[str, ...]]:
    """The typefaces lines are drawn in, by family: the declared ones for ``SYSTEM_FONT_DIR``, else discovered."""
    return declared_fonts() if uses_declared_typefaces(font_dir) else discover_fonts(font_dir)


def uses_declared_typefaces(font_dir: str) -> bool:
    """Whether ``data.source.font_dir`` means the declared typefaces (it is ``SYSTEM_FONT_DIR``, the default)."""
    return os.path.normpath(font_dir) == SYSTEM_FONT_DIR


def declared_fonts(root: str | Path | None = None) -> dict[str, tuple[str, ...]]:
    """``TYPEFACES``' files under ``root`` by family; a missing one is a DataError naming its package."""
    return _declared_fonts(str(FONT_ROOT if root is None else root))


def missing_typefaces(root: str | Path | None = None) -> dict[str, list[tuple[str, Path]]]:
    """``TYPEFACES``' files missing under ``root`` (default ``FONT_ROOT``): package → its (family, path); {}: none."""
    base = Path(FONT_ROOT if root is None else root)
    missing: dict[str, list[tuple[str, Path]]] = {}
    for family, packages in TYPEFACES.items():
        for package, files in packages.items():
            for file in files:
                if not (base / file).is_file():
                    missing.setdefault(package, []).append((family, base / file))
    return missing


@lru_cache(maxsize=8)
def _declared_fonts(root: str) -> dict[str, tuple[str, ...]]:
    missing = missing_typefaces(root)
    if missing:

        def named(package: str, gaps: list[tuple[str, Path]]) -> str:
            (family, path), more = gaps[0], len(gaps) - 1
            others = sorted({f for f, _ in gaps} - {family})
            also = f" and {more} more (of {', '.join([family, *others])})" if more else ""
            return f"{family}'s {path}{also}, of {package}"

        listed = [named(package, gaps) for package, gaps in list(missing.items())[:3]]
        listed += [f"and {len(missing) - 3} packages more"] if len(missing) > 3 else []
        raise DataError(
            f"data.source.font_dir: {sum(map(len, missing.values()))} file(s) of the declared typefaces "
            f"(rendering.TYPEFACES) are missing under {root}: {'; '.join(listed)}. apt-get install {' '.join(missing)} "
            "(debian-packages.txt installs every one), or set data.source.font_dir to a folder of fonts of your own"
        )
    return {family: tuple(sorted(str(Path(root, f)) for files in packages.values() for f in files))
            for family, packages in sorted(TYPEFACES.items())}  # fmt: skip


@lru_cache(maxsize=8)
def discover_fonts(font_dir: str = SYSTEM_FONT_DIR) -> dict[str, tuple[str, ...]]:
    """The text fonts under a user's ``font_dir``, by family: one file per style; symbol fonts left out."""
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
    """The line's ink (mode "L", 255 = ink), sheared, rotated, at most ``height`` high, the font's line box kept."""
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
    """``mask`` sheared (x += shear * (centre y - y)), then rotated ``rotation`` degrees about its centre, whole."""
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
    """``text`` in ``font_path`` as a grey line (mode "L", ``height × width``); ``LineTooWide`` if too wide."""
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
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=6)
    return buffer.getvalue()


def jpeg_bytes(image: Image.Image, quality: int = 95) -> bytes:
    """The image as JPEG of ``quality`` (a photo: about a tenth of its PNG, no difference a model sees)."""
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


# --- the declared typefaces --------------------------------------------------------------------------------------

# The rendered lines' typefaces: family → {Debian package: its files of the family, under FONT_ROOT}. 47 families of the
# 22 font packages of debian-packages.txt and fonts-dejavu-extra (held out: ``lines.DEFAULT_HELD_OUT``), as
# ``discover_fonts()`` found them with exactly these installed (Debian 12.11, 2026-12-07), so prepared folders stay
# what they were; a family or file added here changes the data (and its fingerprint's "fonts").
# fmt: off
TYPEFACES: dict[str, dict[str, tuple[str, ...]]] = {
    "Accanthis ADF Std": {"fonts-adf-accanthis": ("truetype/adf/AccanthisADFStd-Bold.otf",
        "truetype/adf/AccanthisADFStd-BoldItalic.otf", "truetype/adf/AccanthisADFStd-Italic.otf",
        "truetype/adf/AccanthisADFStd-Regular.otf")},
    "Accanthis ADF Std No2": {"fonts-adf-accanthis": ("truetype/adf/AccanthisADFStdNo2-Bold.otf",
        "truetype/adf/AccanthisADFStdNo2-BoldItalic.otf", "truetype/adf/AccanthisADFStdNo2-Italic.otf",
        "truetype/adf/AccanthisADFStdNo2-Regular.otf")},
    "Accanthis ADF Std No3": {"fonts-adf-accanthis": ("truetype/adf/AccanthisADFStdNo3-Bold.otf",
        "truetype/adf/AccanthisADFStdNo3-BoldItalic.otf", "truetype/adf/AccanthisADFStdNo3-Italic.otf",
        "truetype/adf/AccanthisADFStdNo3-Regular.otf")},
    "Baskervald ADF Std": {"fonts-adf-baskervald": ("truetype/adf/BaskervaldADFStd-Bold.otf",
        "truetype/adf/BaskervaldADFStd-BoldItalic.otf", "truetype/adf/BaskervaldADFStd-Heavy.otf",
        "truetype/adf/BaskervaldADFStd-HeavyItalic.otf", "truetype/adf/BaskervaldADFStd-Italic.otf",
        "truetype/adf/BaskervaldADFStd.otf")},
    "C059": {"fonts-urw-base35": ("opentype/urw-base35/C059-BdIta.otf", "opentype/urw-base35/C059-Bold.otf",
        "opentype/urw-base35/C059-Italic.otf", "opentype/urw-base35/C059-Roman.otf")},
    "Caladea": {"fonts-crosextra-caladea": ("truetype/crosextra/Caladea-Bold.ttf",
        "truetype/crosextra/Caladea-BoldItalic.ttf", "truetype/crosextra/Caladea-Italic.ttf",
        "truetype/crosextra/Caladea-Regular.ttf")},
    "Cantarell": {"fonts-cantarell": ("opentype/cantarell/Cantarell-Bold.otf",
        "opentype/cantarell/Cantarell-ExtraBold.otf", "opentype/cantarell/Cantarell-Light.otf",
        "opentype/cantarell/Cantarell-Regular.otf", "opentype/cantarell/Cantarell-Thin.otf")},
    "Carlito": {"fonts-crosextra-carlito": ("truetype/crosextra/Carlito-Bold.ttf",
        "truetype/crosextra/Carlito-BoldItalic.ttf", "truetype/crosextra/Carlito-Italic.ttf",
        "truetype/crosextra/Carlito-Regular.ttf")},
    "Charis SIL": {"fonts-sil-charis": ("truetype/charis/CharisSIL-Bold.ttf",
        "truetype/charis/CharisSIL-BoldItalic.ttf", "truetype/charis/CharisSIL-Italic.ttf",
        "truetype/charis/CharisSIL-Regular.ttf")},
    "Courier Prime": {"fonts-courier-prime": ("opentype/courier-prime/Courier Prime Bold Italic.otf",)},
    "Courier Prime Code": {"fonts-courier-prime": ("opentype/courier-prime/Courier Prime Code Italic.otf",
        "opentype/courier-prime/Courier Prime Code.otf")},
    "Courier Prime Sans": {"fonts-courier-prime": ("opentype/courier-prime/Courier Prime Sans Bold Italic.otf",)},
    "DejaVu Sans": {"fonts-dejavu-core": ("truetype/dejavu/DejaVuSans-Bold.ttf", "truetype/dejavu/DejaVuSans.ttf"),
        "fonts-dejavu-extra": ("truetype/dejavu/DejaVuSans-BoldOblique.ttf",
        "truetype/dejavu/DejaVuSans-ExtraLight.ttf", "truetype/dejavu/DejaVuSans-Oblique.ttf",
        "truetype/dejavu/DejaVuSansCondensed-Bold.ttf", "truetype/dejavu/DejaVuSansCondensed-BoldOblique.ttf",
        "truetype/dejavu/DejaVuSansCondensed-Oblique.ttf", "truetype/dejavu/DejaVuSansCondensed.ttf")},
    "DejaVu Sans Mono": {"fonts-dejavu-core": ("truetype/dejavu/DejaVuSansMono-Bold.ttf",
        "truetype/dejavu/DejaVuSansMono.ttf"),
        "fonts-dejavu-extra": ("truetype/dejavu/DejaVuSansMono-BoldOblique.ttf",
        "truetype/dejavu/DejaVuSansMono-Oblique.ttf")},
    "DejaVu Serif": {"fonts-dejavu-core": ("truetype/dejavu/DejaVuSerif-Bold.ttf", "truetype/dejavu/DejaVuSerif.ttf"),
        "fonts-dejavu-extra": ("truetype/dejavu/DejaVuSerif-BoldItalic.ttf", "truetype/dejavu/DejaVuSerif-Italic.ttf",
        "truetype/dejavu/DejaVuSerifCondensed-Bold.ttf", "truetype/dejavu/DejaVuSerifCondensed-BoldItalic.ttf",
        "truetype/dejavu/DejaVuSerifCondensed-Italic.ttf", "truetype/dejavu/DejaVuSerifCondensed.ttf")},
    "FreeMono": {"fonts-freefont-ttf": ("truetype/freefont/FreeMono.ttf", "truetype/freefont/FreeMonoBold.ttf",
        "truetype/freefont/FreeMonoBoldOblique.ttf", "truetype/freefont/FreeMonoOblique.ttf")},
    "FreeSans": {"fonts-freefont-ttf": ("truetype/freefont/FreeSans.ttf", "truetype/freefont/FreeSansBold.ttf",
        "truetype/freefont/FreeSansBoldOblique.ttf", "truetype/freefont/FreeSansOblique.ttf")},
    "FreeSerif": {"fonts-freefont-ttf": ("truetype/freefont/FreeSerif.ttf", "truetype/freefont/FreeSerifBold.ttf",
        "truetype/freefont/FreeSerifBoldItalic.ttf", "truetype/freefont/FreeSerifItalic.ttf")},
    "Gentium Book Plus": {"fonts-sil-gentiumplus": ("truetype/gentiumplus/GentiumBookPlus-Bold.ttf",
        "truetype/gentiumplus/GentiumBookPlus-BoldItalic.ttf", "truetype/gentiumplus/GentiumBookPlus-Italic.ttf",
        "truetype/gentiumplus/GentiumBookPlus-Regular.ttf")},
    "Gentium Plus": {"fonts-sil-gentiumplus": ("truetype/gentiumplus/GentiumPlus-Bold.ttf",
        "truetype/gentiumplus/GentiumPlus-BoldItalic.ttf", "truetype/gentiumplus/GentiumPlus-Italic.ttf",
        "truetype/gentiumplus/GentiumPlus-Regular.ttf")},
    "Gillius ADF": {"fonts-adf-gillius": ("truetype/adf/GilliusADF-Bold.otf", "truetype/adf/GilliusADF-BoldCond.otf",
        "truetype/adf/GilliusADF-BoldCondItalic.otf", "truetype/adf/GilliusADF-BoldItalic.otf",
        "truetype/adf/GilliusADF-Cond.otf", "truetype/adf/GilliusADF-CondItalic.otf",
        "truetype/adf/GilliusADF-Italic.otf", "truetype/adf/GilliusADF-Regular.otf")},
    "Gillius ADF No2": {"fonts-adf-gillius": ("truetype/adf/GilliusADFNo2-Bold.otf",
        "truetype/adf/GilliusADFNo2-BoldCond.otf", "truetype/adf/GilliusADFNo2-BoldCondItalic.otf",
        "truetype/adf/GilliusADFNo2-BoldItalic.otf", "truetype/adf/GilliusADFNo2-Cond.otf",
        "truetype/adf/GilliusADFNo2-CondItalic.otf", "truetype/adf/GilliusADFNo2-Italic.otf",
        "truetype/adf/GilliusADFNo2-Regular.otf")},
    "Go": {"fonts-go": ("fonts-go/Go-Bold-Italic.ttf", "fonts-go/Go-Bold.ttf", "fonts-go/Go-Italic.ttf",
        "fonts-go/Go-Regular.ttf")},
    "Go Medium": {"fonts-go": ("fonts-go/Go-Medium-Italic.ttf", "fonts-go/Go-Medium.ttf")},
    "Go Mono": {"fonts-go": ("fonts-go/Go-Mono-Bold-Italic.ttf", "fonts-go/Go-Mono-Bold.ttf",
        "fonts-go/Go-Mono-Italic.ttf", "fonts-go/Go-Mono.ttf")},
    "JetBrains Mono": {"fonts-jetbrains-mono": ("truetype/jetbrains-mono/JetBrainsMono-Bold.ttf",
        "truetype/jetbrains-mono/JetBrainsMono-BoldItalic.ttf", "truetype/jetbrains-mono/JetBrainsMono-ExtraBold.ttf",
        "truetype/jetbrains-mono/JetBrainsMono-ExtraBoldItalic.ttf",
        "truetype/jetbrains-mono/JetBrainsMono-ExtraLight.ttf",
        "truetype/jetbrains-mono/JetBrainsMono-ExtraLightItalic.ttf",
        "truetype/jetbrains-mono/JetBrainsMono-Italic.ttf", "truetype/jetbrains-mono/JetBrainsMono-Light.ttf",
        "truetype/jetbrains-mono/JetBrainsMono-LightItalic.ttf", "truetype/jetbrains-mono/JetBrainsMono-Medium.ttf",
        "truetype/jetbrains-mono/JetBrainsMono-MediumItalic.ttf", "truetype/jetbrains-mono/JetBrainsMono-Regular.ttf",
        "truetype/jetbrains-mono/JetBrainsMono-SemiBold.ttf",
        "truetype/jetbrains-mono/JetBrainsMono-SemiBoldItalic.ttf", "truetype/jetbrains-mono/JetBrainsMono-Thin.ttf",
        "truetype/jetbrains-mono/JetBrainsMono-ThinItalic.ttf")},
    "Lato": {"fonts-lato": ("truetype/lato/Lato-Black.ttf", "truetype/lato/Lato-BlackItalic.ttf",
        "truetype/lato/Lato-Bold.ttf", "truetype/lato/Lato-BoldItalic.ttf", "truetype/lato/Lato-Hairline.ttf",
        "truetype/lato/Lato-HairlineItalic.ttf", "truetype/lato/Lato-Heavy.ttf", "truetype/lato/Lato-HeavyItalic.ttf",
        "truetype/lato/Lato-Italic.ttf", "truetype/lato/Lato-Light.ttf", "truetype/lato/Lato-LightItalic.ttf",
        "truetype/lato/Lato-Medium.ttf", "truetype/lato/Lato-MediumItalic.ttf", "truetype/lato/Lato-Regular.ttf",
        "truetype/lato/Lato-Semibold.ttf", "truetype/lato/Lato-SemiboldItalic.ttf", "truetype/lato/Lato-Thin.ttf",
        "truetype/lato/Lato-ThinItalic.ttf")},
    "Liberation Mono": {"fonts-liberation2": ("truetype/liberation2/LiberationMono-Bold.ttf",
        "truetype/liberation2/LiberationMono-BoldItalic.ttf", "truetype/liberation2/LiberationMono-Italic.ttf",
        "truetype/liberation2/LiberationMono-Regular.ttf")},
    "Liberation Sans": {"fonts-liberation2": ("truetype/liberation2/LiberationSans-Bold.ttf",
        "truetype/liberation2/LiberationSans-BoldItalic.ttf", "truetype/liberation2/LiberationSans-Italic.ttf",
        "truetype/liberation2/LiberationSans-Regular.ttf")},
    "Liberation Serif": {"fonts-liberation2": ("truetype/liberation2/LiberationSerif-Bold.ttf",
        "truetype/liberation2/LiberationSerif-BoldItalic.ttf", "truetype/liberation2/LiberationSerif-Italic.ttf",
        "truetype/liberation2/LiberationSerif-Regular.ttf")},
    "Nimbus Mono PS": {"fonts-urw-base35": ("opentype/urw-base35/NimbusMonoPS-Bold.otf",
        "opentype/urw-base35/NimbusMonoPS-BoldItalic.otf", "opentype/urw-base35/NimbusMonoPS-Italic.otf",
        "opentype/urw-base35/NimbusMonoPS-Regular.otf")},
    "Nimbus Roman": {"fonts-urw-base35": ("opentype/urw-base35/NimbusRoman-Bold.otf",
        "opentype/urw-base35/NimbusRoman-BoldItalic.otf", "opentype/urw-base35/NimbusRoman-Italic.otf",
        "opentype/urw-base35/NimbusRoman-Regular.otf")},
    "Nimbus Sans": {"fonts-urw-base35": ("opentype/urw-base35/NimbusSans-Bold.otf",
        "opentype/urw-base35/NimbusSans-BoldItalic.otf", "opentype/urw-base35/NimbusSans-Italic.otf",
        "opentype/urw-base35/NimbusSans-Regular.otf")},
    "Nimbus Sans Narrow": {"fonts-urw-base35": ("opentype/urw-base35/NimbusSansNarrow-Bold.otf",
        "opentype/urw-base35/NimbusSansNarrow-BoldOblique.otf", "opentype/urw-base35/NimbusSansNarrow-Oblique.otf",
        "opentype/urw-base35/NimbusSansNarrow-Regular.otf")},
    "Noto Mono": {"fonts-noto-mono": ("truetype/noto/NotoMono-Regular.ttf",)},
    "Noto Sans Mono": {"fonts-noto-mono": ("truetype/noto/NotoSansMono-Bold.ttf",
        "truetype/noto/NotoSansMono-Regular.ttf")},
    "Open Sans": {"fonts-open-sans": ("truetype/open-sans/OpenSans-Bold.ttf",
        "truetype/open-sans/OpenSans-BoldItalic.ttf", "truetype/open-sans/OpenSans-CondLight.ttf",
        "truetype/open-sans/OpenSans-CondLightItalic.ttf", "truetype/open-sans/OpenSans-ExtraBold.ttf",
        "truetype/open-sans/OpenSans-ExtraBoldItalic.ttf", "truetype/open-sans/OpenSans-Italic.ttf",
        "truetype/open-sans/OpenSans-Light.ttf", "truetype/open-sans/OpenSans-LightItalic.ttf",
        "truetype/open-sans/OpenSans-Regular.ttf", "truetype/open-sans/OpenSans-Semibold.ttf",
        "truetype/open-sans/OpenSans-SemiboldItalic.ttf")},
    "Open Sans Condensed": {"fonts-open-sans": ("truetype/open-sans/OpenSans-CondBold.ttf",)},
    "P052": {"fonts-urw-base35": ("opentype/urw-base35/P052-Bold.otf", "opentype/urw-base35/P052-BoldItalic.otf",
        "opentype/urw-base35/P052-Italic.otf", "opentype/urw-base35/P052-Roman.otf")},
    "Quattrocento": {"fonts-quattrocento": ("opentype/quattrocento/Quattrocento-Regular.otf",)},
    "Roboto": {"fonts-roboto-unhinted": ("truetype/roboto/unhinted/RobotoTTF/Roboto-Black.ttf",
        "truetype/roboto/unhinted/RobotoTTF/Roboto-BlackItalic.ttf",
        "truetype/roboto/unhinted/RobotoTTF/Roboto-Bold.ttf",
        "truetype/roboto/unhinted/RobotoTTF/Roboto-BoldItalic.ttf",
        "truetype/roboto/unhinted/RobotoTTF/Roboto-Italic.ttf", "truetype/roboto/unhinted/RobotoTTF/Roboto-Light.ttf",
        "truetype/roboto/unhinted/RobotoTTF/Roboto-LightItalic.ttf",
        "truetype/roboto/unhinted/RobotoTTF/Roboto-Medium.ttf",
        "truetype/roboto/unhinted/RobotoTTF/Roboto-MediumItalic.ttf",
        "truetype/roboto/unhinted/RobotoTTF/Roboto-Regular.ttf", "truetype/roboto/unhinted/RobotoTTF/Roboto-Thin.ttf",
        "truetype/roboto/unhinted/RobotoTTF/Roboto-ThinItalic.ttf")},
    "Roboto Condensed": {"fonts-roboto-unhinted": ("truetype/roboto/unhinted/RobotoCondensed-Bold.ttf",
        "truetype/roboto/unhinted/RobotoCondensed-BoldItalic.ttf",
        "truetype/roboto/unhinted/RobotoCondensed-Italic.ttf", "truetype/roboto/unhinted/RobotoCondensed-Light.ttf",
        "truetype/roboto/unhinted/RobotoCondensed-LightItalic.ttf",
        "truetype/roboto/unhinted/RobotoCondensed-Medium.ttf",
        "truetype/roboto/unhinted/RobotoCondensed-MediumItalic.ttf",
        "truetype/roboto/unhinted/RobotoCondensed-Regular.ttf")},
    "Roboto Slab": {"fonts-roboto-slab": ("opentype/roboto/slab/RobotoSlab-Bold.otf",
        "opentype/roboto/slab/RobotoSlab-Light.otf", "opentype/roboto/slab/RobotoSlab-Regular.otf",
        "opentype/roboto/slab/RobotoSlab-Thin.otf")},
    "URW Bookman": {"fonts-urw-base35": ("opentype/urw-base35/URWBookman-Demi.otf",
        "opentype/urw-base35/URWBookman-DemiItalic.otf", "opentype/urw-base35/URWBookman-Light.otf",
        "opentype/urw-base35/URWBookman-LightItalic.otf")},
    "URW Gothic": {"fonts-urw-base35": ("opentype/urw-base35/URWGothic-Book.otf",
        "opentype/urw-base35/URWGothic-BookOblique.otf", "opentype/urw-base35/URWGothic-Demi.otf",
        "opentype/urw-base35/URWGothic-DemiOblique.otf")},
    "Universalis ADF Std": {"fonts-adf-universalis": ("truetype/adf/UniversalisADFStd-Bold.otf",
        "truetype/adf/UniversalisADFStd-BoldCond.otf", "truetype/adf/UniversalisADFStd-BoldCondIt.otf",
        "truetype/adf/UniversalisADFStd-BoldItalic.otf", "truetype/adf/UniversalisADFStd-Cond.otf",
        "truetype/adf/UniversalisADFStd-CondItalic.otf", "truetype/adf/UniversalisADFStd-Italic.otf",
        "truetype/adf/UniversalisADFStd-Regular.otf")},
    "Z003": {"fonts-urw-base35": ("opentype/urw-base35/Z003-MediumItalic.otf",)},
}
# fmt: on
