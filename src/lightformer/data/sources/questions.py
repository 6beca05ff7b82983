"""The vision-language questions of the offline sources (``VisualQASource``, ``QUESTIONS``) and their records."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torchvision
from PIL import Image

from lightformer.data.objectives.chat import ChatTemplate
from lightformer.data.preparation.prepare import worker_tokenizer
from lightformer.data.sources import emoji, openclipart
from lightformer.data.sources.corpora import DEBIAN_FASHION_MNIST_DIR, install_debian_fashion_mnist
from lightformer.data.sources.lines import DEFAULT_HELD_OUT, ImageTextSource, LineDrawer
from lightformer.data.sources.rendering import SYSTEM_FONT_DIR, png_bytes
from lightformer.errors import DataError
from lightformer.nn.checks import check_at_least

QUESTIONS = {  # source → question kind → the question ("{n}": the word's number)
    "clipart": {"name": "What is this?", "category": "Which category?", "keywords": "Name its keywords."},
    "lines": {"read": "What does it say?", "word": "What is word {n}?"},
    "fashion_mnist": {"garment": "What kind of garment is this?"},
    "emoji": {"name": "What is this emoji?"},
}
# source → its images' kind (an image_fit name: how an image of another size is brought to the canvas)
CANVAS_OF = {"clipart": "drawing", "lines": "line", "fashion_mnist": "resize", "emoji": "drawing"}
LINE_HEIGHT = 32
KEYWORDS = 3  # keywords in a keywords answer
PIECE_IMAGES = 250  # images per piece a preparing process draws and writes before taking the next


@dataclass(frozen=True)
class VisualQASource:
    """Which sources, how many images of each, on which canvases (``data.source``).

    Args:
        sources: of "clipart", "lines", "fashion_mnist", "emoji" (``QUESTIONS``).
        seen: training images of each source also evaluated, as "<source>/<kind>/seen" groups of val and test.
        max_images: most images of a source in a split (clip art's a sample of every category); None: all.
        drawing_size: the square canvas of drawings and emoji, in pixels (a multiple of 16).
        line_width: the lines' canvas width (height 32), a multiple of 16.
        garment_size: Fashion-MNIST's square canvas (its 28×28 images resized to it), a multiple of 16.
        words: (fewest, most) words of a line.
        max_chars: most characters of an answer: a longer line is drawn again, a longer clip art answer cut.
        train_lines: lines rendered for training; val_lines, test_lines: for val and test (held-out typefaces).
        held_out_families: the typefaces never trained on (``ImageTextSource.held_out_families``).
        clipart_root: the Open Clip Art Library's folder (``png/``, ``svg/``).
        val_fraction, test_fraction: the clip art's drawings (by their variant's hash) held out for val and test.
        emoji_held_out_style: the emoji style of val and test ("symbola" or "noto").
        emoji_val_fraction: share of the held-out emoji (by name) in val; the rest are test.
        font_dir, data_root: the lines' typefaces (``ImageTextSource.font_dir``); where Austen and Fashion-MNIST are.
    """

    sources: tuple[str, ...] = ("clipart", "lines")
    seen: int = 100
    max_images: int | None = None
    drawing_size: int = 64
    line_width: int = 192
    garment_size: int = 32
    words: tuple[int, int] = (1, 4)
    max_chars: int = 62
    train_lines: int = 20_000
    val_lines: int = 500
    test_lines: int = 500
    held_out_families: tuple[str, ...] = DEFAULT_HELD_OUT
    clipart_root: str = openclipart.OPENCLIPART_ROOT
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    emoji_held_out_style: str = "symbola"
    emoji_val_fraction: float = 0.5
    font_dir: str = SYSTEM_FONT_DIR  # "/usr/share/fonts": the declared typefaces
    data_root: str = "data"

    def __post_init__(self) -> None:
        for name in ("sources", "held_out_families", "words"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        unknown = [s for s in self.sources if s not in QUESTIONS]
        if not self.sources or unknown or len(set(self.sources)) < len(self.sources):
            raise ValueError(f"data.source.sources={list(self.sources)}: give each of {list(QUESTIONS)} at most once, "
                             "one at least")  # fmt: skip
        check_at_least("data.source.seen", self.seen, 0)
        check_at_least("data.source.max_chars", self.max_chars, 8)
        if self.max_images is not None:
            check_at_least("data.source.max_images", self.max_images, 1)
        for name in ("drawing_size", "line_width", "garment_size"):
            if getattr(self, name) < 16 or getattr(self, name) % 16:
                raise ValueError(f"data.source.{name}={getattr(self, name)} must be a positive multiple of 16 (the "
                                 "patch grid: patch 8 × pixel shuffle 2)")  # fmt: skip
        if len(self.words) != 2 or not 1 <= self.words[0] <= self.words[1]:
            raise ValueError(f"data.source.words={list(self.words)} must be [fewest, most] with 1 <= fewest <= most")
        if self.emoji_held_out_style not in emoji.STYLES:
            raise ValueError(f"data.source.emoji_held_out_style={self.emoji_held_out_style!r}; valid: "
                             f"{list(emoji.STYLES)}")  # fmt: skip

    def line_source(self) -> ImageTextSource:
        return ImageTextSource(min_words=self.words[0], max_words=self.words[1], max_chars=self.max_chars,
                               train_lines=self.train_lines,
                               val_lines=self.val_lines, test_lines=self.test_lines,
                               held_out_families=self.held_out_families, font_dir=self.font_dir,
                               data_root=self.data_root)  # fmt: skip

    def groups(self) -> tuple[str, ...]:
        """Every group's name, in the order a record's "group" indexes them."""
        which = ("held-out", "seen") if self.seen else ("held-out",)
        return tuple(f"{s}/{kind}/{w}" for s in self.sources for kind in QUESTIONS[s] for w in which)

    def canvases(self) -> dict[str, list[int]]:
        """Each kind of image's [height, width]."""
        size = {"drawing": [self.drawing_size] * 2, "line": [LINE_HEIGHT, self.line_width],
                "resize": [self.garment_size] * 2}  # fmt: skip
        return {CANVAS_OF[s]: size[CANVAS_OF[s]] for s in self.sources}


class Unit(NamedTuple):
    """What one preparing process draws at a time: images of one source (one canvas) with their records."""

    source: str
    items: list | range
    questions: list  # per item: [(group, question, answer), ...]; lines': [] (read from the drawn line)
    groups: dict[str, int]  # lines: question kind → group
    line_split: str = ""  # lines: the split whose lines they are


def qa_records(unit: Unit, options: VisualQASource, drawer: LineDrawer | None, tokenizer_json: str, seed: int):
    """The records {"image": PNG, "question", "answer", "group", "text"} of ``unit``; returns the longest ids made."""
    tokenizer, longest = worker_tokenizer(tokenizer_json), 0
    for position, item in enumerate(unit.items):
        text = ""  # what the image shows, where the source knows it
        if unit.source == "clipart":
            path = Path(options.clipart_root) / "png" / f"{item}.png"
            try:
                image = openclipart.drawing_image(path, options.drawing_size)
            except (OSError, ValueError) as error:
                raise DataError(f"data.source.clipart_root: {path} is not a readable PNG ({error})") from None
            questions = unit.questions[position]
        elif unit.source == "fashion_mnist":
            official, index = item
            pixels = garments(options.data_root, official)[0][index]
            image = Image.fromarray(pixels).resize((options.garment_size,) * 2, Image.Resampling.BILINEAR)
            questions = unit.questions[position]
        elif unit.source == "emoji":
            character, style = item
            font = emoji.NOTO_EMOJI if style == "noto" else emoji.SYMBOLA
            image = emoji.draw(character, style, font, options.drawing_size)
            questions = unit.questions[position]
        else:
            split, index = unit.line_split, item
            line, image = drawer.line(split, index)
            text, words = line.text, line.text.split()
            rng = np.random.default_rng(np.random.SeedSequence((seed, 2, ("train", "val", "test").index(split), index)))
            n = int(rng.integers(1, len(words) + 1))
            questions = [(unit.groups["read"], QUESTIONS["lines"]["read"], line.text),
                         (unit.groups["word"], QUESTIONS["lines"]["word"].format(n=n), words[n - 1])]  # fmt: skip
        png = png_bytes(image.convert("RGB"))
        for group, question, answer in questions:
            longest = max(longest, len(ChatTemplate().encode(tokenizer, [(question, answer)], tokenizer.vocab_size)[0]))
            yield {"image": png, "question": question, "answer": answer, "group": group, "text": text}
    return {"longest": longest}


@lru_cache(maxsize=2)
def garments(root: str, official: str) -> tuple[np.ndarray, list[str]]:
    """Fashion-MNIST's official "train" or "test" split: (N, 28, 28) uint8 images and torchvision's class names."""
    install_debian_fashion_mnist(root)
    try:
        dataset = torchvision.datasets.FashionMNIST(root, train=official == "train", download=False)
    except (RuntimeError, OSError) as error:
        raise DataError(f"data.source.sources holds fashion_mnist but it is not under data.source.data_root={root!r} "
                        f"({error}): apt-get install dataset-fashion-mnist puts it in {DEBIAN_FASHION_MNIST_DIR}, "
                        "from where it is copied") from None  # fmt: skip
    names = [dataset.classes[int(label)] for label in dataset.targets]
    return dataset.data.numpy(), names
