"""Printed lines, drawn from (seed, split, index), and their records (docs/data.md, "Printed lines")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image

from lightformer.data.preparation.prepare import TokenizerConfig, _tokenizer
from lightformer.data.sources.corpora import (
    DING_FILE,
    TRAIN_SHARE,
    VAL_SHARE,
    extract_ding_pairs,
    novel_sentences,
    source_files,
    split_austen_text,
    split_of,
)
from lightformer.data.sources.rendering import (
    SYSTEM_FONT_DIR,
    LineStyle,
    LineTooWide,
    missing_glyphs,
    png_bytes,
    render_line,
    typefaces,
    uses_declared_typefaces,
)
from lightformer.data.sources.text import TextSource
from lightformer.errors import ConfigError
from lightformer.io.files import read_utf8
from lightformer.nn.checks import check_at_least
from lightformer.tokenization.text import Tokenizer

CORPORA = ("austen", "ding")
PREPARED_SPLITS = ("train", "val", "test", "test_seen")
TEXT_SPLIT = {"train": "train", "val": "val", "test": "test", "test_seen": "test"}  # whose sentences a split reads
SPLIT_CODE = {"train": 0, "val": 1, "test": 2, "test_seen": 3}  # in the seeds of a split's style draws
# Designs unlike any training family (Vera serif, Palatino, Avant Garde): the Liberation, Free and Nimbus families are
# metric clones of each other and stay together.
DEFAULT_HELD_OUT = ("DejaVu Serif", "P052", "URW Gothic")
PIECE_LINES = 1000  # lines per piece a preparing process renders and writes before taking the next
STYLE_TRIES = 4  # styles drawn for a text before another text is drawn, when the line is too wide
MIN_HEIGHT = 16


@dataclass(frozen=True)
class ImageTextSource:
    """Which lines of text, how many, and in which typefaces (``data.source``; docs/data.md, "Printed lines").

    Args:
        corpus: "austen": Jane Austen's six novels; "ding": the Ding dictionary's German sentences (``ding_file``).
        min_words: fewest words of a line.
        max_words: most words of a line (fewer where a sentence is shorter).
        max_chars: most characters of a line, spaces included (a longer text is drawn again; 62: the LM's 64 positions).
        train_lines: lines rendered for training.
        val_lines: lines rendered for validation (held-out text, held-out typefaces); 0: no validation.
        test_lines: lines rendered for each of the two test splits (held-out text; held-out and training typefaces).
        held_out_families: font families never trained on, which val and test are rendered in ("DejaVu Serif", ...).
        test_fonts: "unseen": test is rendered in the held-out families; "seen": the same texts in the trained ones.
        font_dir: "/usr/share/fonts": the declared typefaces (``rendering.TYPEFACES``); another folder: its text fonts.
        data_root: where the built-in corpus is stored.
        ding_file: where the Ding dictionary is (``apt-get install trans-de-en`` puts it at the default).
    """

    corpus: Literal["austen", "ding"] = "austen"
    min_words: int = 1
    max_words: int = 8
    max_chars: int = 62
    train_lines: int = 50_000
    val_lines: int = 500
    test_lines: int = 1000
    held_out_families: tuple[str, ...] = DEFAULT_HELD_OUT
    test_fonts: Literal["unseen", "seen"] = "unseen"
    font_dir: str = SYSTEM_FONT_DIR  # "/usr/share/fonts": the declared typefaces
    data_root: str = "data"
    ding_file: str = DING_FILE

    def __post_init__(self) -> None:
        object.__setattr__(self, "held_out_families", tuple(self.held_out_families))
        if self.corpus not in CORPORA:
            raise ValueError(f"data.source.corpus={self.corpus!r} is not a built-in corpus; valid: {list(CORPORA)}")
        check_at_least("data.source.min_words", self.min_words, 1)
        if self.max_words < self.min_words:
            raise ValueError(
                f"data.source.max_words={self.max_words} must be at least data.source.min_words={self.min_words}"
            )
        check_at_least("data.source.max_chars", self.max_chars, 1)
        check_at_least("data.source.train_lines", self.train_lines, 1)
        for name in ("val_lines", "test_lines"):
            check_at_least(f"data.source.{name}", getattr(self, name), 0)
        if self.test_fonts not in ("unseen", "seen"):
            raise ValueError(f"data.source.test_fonts={self.test_fonts!r} is unknown; valid: 'unseen', 'seen'")
        if (self.val_lines or self.test_lines) and not self.held_out_families:
            raise ValueError(
                "data.source.held_out_families is empty: val and test are rendered in families never trained on; "
                "name one or more, or set val_lines and test_lines to 0"
            )


def _range(group: str, name: str, value: tuple[float, float], low: float, high: float) -> tuple[float, float]:
    pair = tuple(float(v) for v in value)
    if len(pair) != 2 or not low <= pair[0] <= pair[1] <= high:
        raise ValueError(
            f"data.{group}.{name}={list(value)} must be a range [low, high] with {low} <= low <= high <= {high}"
        )
    return pair


@dataclass(frozen=True)
class RenderConfig:
    """How lines are rendered (``data.render``); each line draws its own values uniformly from these ranges.

    Args:
        height: image height in pixels (at least 16).
        width: image width in pixels; lines too wide for it are drawn smaller, or not drawn.
        size: the font's line box (ascent + descent) as a share of the height, before rotation.
        letter_spacing: extra space between letters, in em.
        rotation: the largest rotation, in degrees either way.
        shear: the largest horizontal shear (pixels per pixel of height) either way.
        blur: Gaussian blur radius in pixels.
        noise: standard deviation of Gaussian pixel noise, in grey levels of 255.
        contrast: 1 - ink / background (1: black ink).
        background: background grey level as a share of white.
    """

    height: int = 32
    width: int = 384
    size: tuple[float, float] = (0.55, 0.9)
    letter_spacing: tuple[float, float] = (-0.02, 0.1)
    rotation: float = 2.0
    shear: float = 0.15
    blur: tuple[float, float] = (0.0, 0.8)
    noise: tuple[float, float] = (0.0, 8.0)
    contrast: tuple[float, float] = (0.5, 1.0)
    background: tuple[float, float] = (0.7, 1.0)

    def __post_init__(self) -> None:
        if self.height < MIN_HEIGHT:
            raise ValueError(f"data.render.height={self.height} is too small to read a line; use at least {MIN_HEIGHT}")
        if self.width < 2 * self.height:
            raise ValueError(f"data.render.width={self.width} must be at least twice data.render.height={self.height}")
        for name, low, high in (("size", 0.1, 1.0), ("letter_spacing", -0.2, 1.0), ("blur", 0.0, 5.0),
                                ("noise", 0.0, 64.0), ("contrast", 0.1, 1.0), ("background", 0.3, 1.0)):  # fmt: skip
            object.__setattr__(self, name, _range("render", name, getattr(self, name), low, high))
        if not 0.0 <= self.rotation <= 15.0:
            raise ValueError(f"data.render.rotation={self.rotation} must be in [0, 15] degrees")
        if not 0.0 <= self.shear <= 1.0:
            raise ValueError(f"data.render.shear={self.shear} must be in [0, 1]")


def austen_char_tokenizer(data_root: str = "data") -> Tokenizer:
    """The Austen language model's character tokenizer, made as ``prepare_text`` makes it (every split's text)."""
    source = TextSource(corpus="austen", val_fraction=0.1, data_root=data_root)
    return _tokenizer(TokenizerConfig(kind="char"), source.pieces(source_files(source)), source.text_field, ())


@lru_cache(maxsize=2)
def split_sentences(corpus: str, path: str) -> dict[str, tuple[str, ...]]:
    """Each split's sentences of ``corpus`` at ``path``: Austen's by position (80%, 10%, 10%), Ding's by md5 bucket."""
    splits: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    if corpus == "ding":
        pairs, _, _ = extract_ding_pairs(path)
        for german in dict.fromkeys(pair[0] for pair in pairs):
            splits[split_of(german)].append(german)
    else:
        for novel in split_austen_text(read_utf8(Path(path))).values():
            sentences = novel_sentences(novel)
            n_train, n_val = int(len(sentences) * TRAIN_SHARE), int(len(sentences) * (TRAIN_SHARE + VAL_SHARE))
            splits["train"] += sentences[:n_train]
            splits["val"] += sentences[n_train:n_val]
            splits["test"] += sentences[n_val:]
    return {split: tuple(sentences) for split, sentences in splits.items()}


def check_glyphs(fonts: dict[str, tuple[str, ...]], characters: str) -> None:
    """A ValueError naming each font of ``fonts`` (family → files) that does not draw one of ``characters``."""
    missing = {path: gaps for paths in fonts.values() for path in paths if (gaps := missing_glyphs(path, characters))}
    if missing:
        listed = "; ".join(f"{path}: {gaps!r}" for path, gaps in missing.items())
        raise ValueError(
            f"data.source.font_dir: {len(missing)} font(s) cannot draw characters of the text (they would render as "
            f"boxes): {listed}. Remove them from the folder, or hold their families out of training and validation"
        )


def split_families(source: ImageTextSource) -> dict[str, tuple[str, ...]]:
    """The font families of each split: val and test the held-out ones, train and test_seen the others."""
    installed = typefaces(source.font_dir)
    missing = [family for family in source.held_out_families if family not in installed]
    if missing:
        where = "declared typefaces" if uses_declared_typefaces(source.font_dir) else f"fonts under {source.font_dir}"
        raise ConfigError(
            f"data.source.held_out_families: {missing} {'is' if len(missing) == 1 else 'are'} not among the {where}; "
            f"valid: {list(installed)}"
        )
    training = tuple(family for family in installed if family not in source.held_out_families)
    if not training:
        raise ConfigError(
            f"data.source.held_out_families={list(source.held_out_families)} leaves no family to train on; installed "
            f"families: {list(installed)}"
        )
    held_out = tuple(source.held_out_families)
    return {"train": training, "val": held_out, "test": held_out, "test_seen": training}


@dataclass(frozen=True)
class Line:
    """A drawn line: its text, typeface, style and redraws (texts of another split; styles or texts too wide)."""

    text: str
    family: str
    font: str
    style: LineStyle
    other_split: int = 0
    style_redraws: int = 0
    text_redraws: int = 0


@dataclass(frozen=True)
class LineDrawer:
    """Draws and renders line i of a split from (seed, split, i) alone; small to pickle to a preparing process."""

    source: ImageTextSource
    render: RenderConfig
    seed: int
    text_path: str  # the corpus's file
    families: tuple[tuple[str, tuple[str, ...]], ...]  # (split, its families)

    def fonts(self, split: str) -> list[tuple[str, tuple[str, ...]]]:
        installed = typefaces(self.source.font_dir)
        return [(family, installed[family]) for family in dict(self.families)[split]]

    def _text(self, rng: np.random.Generator, sentences: tuple[str, ...]) -> str:
        words = sentences[rng.integers(len(sentences))].split()
        count = min(int(rng.integers(self.source.min_words, self.source.max_words + 1)), len(words))
        start = int(rng.integers(len(words) - count + 1))
        return " ".join(words[start : start + count])

    def _style(self, rng: np.random.Generator) -> LineStyle:
        r = self.render

        def uniform(pair: tuple[float, float]) -> float:
            return float(rng.uniform(pair[0], pair[1]))

        return LineStyle(
            size=uniform(r.size), spacing=uniform(r.letter_spacing), rotation=float(rng.uniform(-1, 1)) * r.rotation,
            shear=float(rng.uniform(-1, 1)) * r.shear, blur=uniform(r.blur), noise=uniform(r.noise),
            contrast=uniform(r.contrast), background=uniform(r.background),
            margin=int(rng.integers(1, max(2, r.height // 4) + 1)), vertical=float(rng.uniform()),
            noise_seed=int(rng.integers(2**31)),
        )  # fmt: skip

    def line(self, split: str, index: int) -> tuple[Line, Image.Image]:
        """Line ``index`` of ``split`` and its image (``height × width``, mode "L")."""
        text_rng = np.random.default_rng(np.random.SeedSequence((self.seed, 0, SPLIT_CODE[TEXT_SPLIT[split]], index)))
        style_rng = np.random.default_rng(np.random.SeedSequence((self.seed, 1, SPLIT_CODE[split], index)))
        sentences = split_sentences(self.source.corpus, self.text_path)[TEXT_SPLIT[split]]
        fonts = self.fonts(split)
        other_split = style_redraws = text_redraws = 0
        height, width = self.render.height, self.render.width
        while True:
            text = self._text(text_rng, sentences)
            if split_of(text) != TEXT_SPLIT[split]:  # a line's own text decides its split: none is in two
                other_split += 1
                continue
            if len(text) > self.source.max_chars:
                text_redraws += 1
                continue
            for _ in range(STYLE_TRIES):
                family, paths = fonts[int(style_rng.integers(len(fonts)))]
                font = paths[int(style_rng.integers(len(paths)))]
                style = self._style(style_rng)
                try:
                    image = render_line(text, font, style, height, width)
                except LineTooWide as error:  # smaller, down to the smallest size
                    size = style.size * (width - 1 - style.margin) / (error.needed - 1 - style.margin) * 0.98
                    if size < self.render.size[0]:
                        style_redraws += 1
                        continue
                    style = LineStyle(**{**asdict(style), "size": size})
                    try:
                        image = render_line(text, font, style, height, width)
                    except LineTooWide:
                        style_redraws += 1
                        continue
                return Line(text, family, font, style, other_split, style_redraws, text_redraws), image
            text_redraws += 1


def line_records(piece: tuple[int, int], drawer: LineDrawer, split: str) -> Generator[dict, None, dict]:
    """The records {"image": PNG bytes, "text", "family"} of lines [start, stop) of ``split``; returns its counts."""
    start, stop = piece
    counts: Counter = Counter()
    families: Counter = Counter()
    longest = {"chars": 0, "bytes": 0}
    for index in range(start, stop):
        line, image = drawer.line(split, index)
        counts.update(other_split=line.other_split, style_redraws=line.style_redraws, text_redraws=line.text_redraws)
        families[line.family] += 1
        longest = {"chars": max(longest["chars"], len(line.text)),
                   "bytes": max(longest["bytes"], len(line.text.encode("utf-8")))}  # fmt: skip
        yield {"image": png_bytes(image), "text": line.text, "family": line.family}
    return {"counts": counts, "families": families, "longest": longest}
