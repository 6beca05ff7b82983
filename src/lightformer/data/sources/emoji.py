"""Emoji in two styles (Noto's bitmaps, Symbola's outlines), named by Unicode (docs/data.md, "Emoji in two styles")."""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from PIL import Image, ImageChops, ImageDraw, ImageFont

from lightformer.data.sources.image_files import check_canvas_size
from lightformer.data.sources.rendering import png_bytes

NOTO_EMOJI = "/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf"
SYMBOLA = "/usr/share/fonts/truetype/ancient-scripts/Symbola_hint.ttf"
STYLES = ("noto", "symbola")
NOTO_SIZE = 109  # the one size of Noto Color Emoji's bitmaps
SYMBOLA_SIZE = 192  # Symbola's outlines drawn this large, then fitted
CATEGORIES = ("So", "Sm", "Po")


def caption(character: str) -> str:
    """The emoji's caption: its Unicode name in lower case ("red apple")."""
    return unicodedata.name(character).lower()


def mapped(path: str | Path) -> set[int]:
    """The code points a font's character map maps (fontTools, which matplotlib brings)."""
    from fontTools.ttLib import TTFont

    with TTFont(str(path), lazy=True) as font:
        return set(font.getBestCmap())


def emoji_characters(noto: str | Path = NOTO_EMOJI, symbola: str | Path = SYMBOLA) -> list[str]:
    """The emoji both fonts map (docs/data.md, "Emoji in two styles"), by code point (drawn or not: ``draw``)."""
    both = sorted(mapped(noto) & mapped(symbola))
    return [chr(c) for c in both if c > 0x7F and unicodedata.name(chr(c), "") and
            unicodedata.category(chr(c)) in CATEGORIES and not 0x1F1E6 <= c <= 0x1F1FF]  # fmt: skip


@lru_cache(maxsize=4)
def _font(path: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, size)


def draw(character: str, style: str, font: str, size: int) -> Image.Image | None:
    """``character`` in ``style`` on white, cropped to its ink, fitted to a ``size`` square; None where not drawn."""
    points = NOTO_SIZE if style == "noto" else SYMBOLA_SIZE
    glyph = Image.new("RGBA", (2 * points, 2 * points), (255, 255, 255, 0))
    ImageDraw.Draw(glyph).text((points // 2, points // 2), character, font=_font(font, points), embedded_color=True,
                               fill=(0, 0, 0, 255))  # fmt: skip
    box = glyph.getchannel("A").getbbox()
    if box is None:
        return None
    glyph = glyph.crop(box)
    white = Image.alpha_composite(Image.new("RGBA", glyph.size, (255, 255, 255, 255)), glyph).convert("RGB")
    if ImageChops.difference(white, Image.new("RGB", white.size, "white")).getbbox() is None:
        return None
    scale = size / max(white.size)
    fitted = white.resize((max(1, round(white.width * scale)), max(1, round(white.height * scale))),
                          Image.Resampling.LANCZOS)  # fmt: skip
    canvas = Image.new("RGB", (size, size), "white")
    canvas.paste(fitted, ((size - fitted.width) // 2, (size - fitted.height) // 2))
    return canvas


@dataclass(frozen=True)
class EmojiSource:
    """The two emoji fonts, the style held out, the canvas (``data.source``).

    Args:
        held_out_style: "symbola" (Symbola's outlines: val and test; training in Noto's colours) or "noto".
        noto_font: Noto Color Emoji's file (``apt-get install fonts-noto-color-emoji``).
        symbola_font: Symbola's file (``apt-get install fonts-symbola``).
        image_size: the square canvas's side in pixels.
        val_fraction: share of the emoji (by a hash of the name) whose held-out image is val; the rest are test.
    """

    held_out_style: Literal["symbola", "noto"] = "symbola"
    noto_font: str = NOTO_EMOJI
    symbola_font: str = SYMBOLA
    image_size: int = 64
    val_fraction: float = 0.5

    def __post_init__(self) -> None:
        if self.held_out_style not in STYLES:
            raise ValueError(f"data.source.held_out_style={self.held_out_style!r} is not a style; valid: "
                             f"{list(STYLES)}")  # fmt: skip
        check_canvas_size(self.image_size)
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"data.source.val_fraction={self.val_fraction} must be in (0, 1): val and test both hold "
                             "held-out emoji")  # fmt: skip


def emoji_records(piece: list[tuple[str, int]], style: str, font: str, size: int):
    """The records {"image", "file": "U+1F34E", "texts": [its name], "label"} of (character, label) in ``style``."""
    for character, label in piece:
        image = draw(character, style, font, size)
        yield {"image": png_bytes(image), "file": f"U+{ord(character):04X}",
               "texts": json.dumps([caption(character)]), "label": label}  # fmt: skip
