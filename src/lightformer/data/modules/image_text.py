"""Image-to-text data (TrOCR-style OCR of printed lines): lines of Jane Austen's novels (or of the German sentences of
the Ding dictionary, ``source.corpus="ding"``) rendered in many typefaces, prepared once into records, streamed as
batches of (line image, token ids, text).

    Austen's novels ──sentences, split by position──> lines of 1-8 words ──render (``raw.rendering``), every core,
    in pieces──> <prepare.dir>/image-text-austen-<hash>/ train | val | test | test_seen records {"image": PNG bytes,
    "text", "family"}, prepared.json (the lines, families and redraws of each split, the pixels' mean and std)
    records ──decode, jitter (train), encode──> {"images": (B, 1, H, W) float32, "tgt": (B, T) int64, "text"}

**Text.** Each novel's sentences (``corpora.novel_sentences``: headings, title pages and editors' notes left
out) are split by position as the text classifier's passages are: the first 80% train, the next 10% val, the last
10% test. A line is a run of ``min_words`` to ``max_words`` consecutive words of one sentence of its split, drawn at
random, of at most ``max_chars`` characters; it is kept only if the md5 bucket of its own text (``corpora.split_of``)
is its split too, so that no line of val or test is ever a train line, even a line of one common word. Ding's German
sentences are split by that bucket alone (90% train, 5% val, 5% test), as the translation task splits its pairs.

**Typefaces.** Lines are drawn in the declared typefaces (``rendering.TYPEFACES``: 47 families, each file under
/usr/share/fonts with its Debian package, checked before any work: a missing one is named with ``apt-get install
<package>``) and in no other font installed, so the same options render the same lines on every machine; or, when
``source.font_dir`` names a folder of the user's own, in every text font in it (``rendering.discover_fonts``),
grouped by family. The ``held_out_families`` are never trained on: val and test are rendered in them alone, the
train split in every other family; every font used must draw every character of the corpus (checked before
rendering: a missing glyph would render as a box). ``test_seen`` is a second test split, of the same texts (line i
of both holds the same text, but for lines that had to be redrawn) rendered in the training families;
``source.test_fonts`` picks which of the two ``test`` reads, so the same model is tested on typefaces it has and has
not seen. Both are always prepared.

**Lines.** Line i of a split is drawn from (seed, split, i) alone: its text from one generator (the same for test and
test_seen), its family, style, size, letter spacing, rotation, shear, blur, noise, contrast and background from
another (``render``). A line too wide for the canvas at its size is drawn smaller, down to the smallest ``size``;
if it is still too wide, another style (``STYLE_TRIES``), then another text is drawn: the manifest counts both. So
the same seed renders the same images bit for bit, whatever the number of processes.

**Preparation** (``prepared_folder``: once per job, named by a hash of the corpus's file, the fonts' paths and sizes,
the options, the seed and the format version) renders each split in pieces of at most ``PIECE_LINES`` lines on
every core and writes the records as they are rendered (``write_records``): no process holds more than one image and
the records of the chunk it is writing, however many lines are prepared.

**Loading.** Training lines come in an order drawn from (seed, epoch), lightly jittered (brightness, contrast, a shift
of a pixel or two) by draws from (seed, epoch, index), through the resumable loader: a resumed run continues mid-epoch
with the same batches. Val and test lines are read in order, unjittered. ``tgt`` is [BOS] + ids + [EOS], padded with
the tokenizer's PAD to the batch's longest.

**Tokenizer.** By default the character tokenizer of the main job's Austen language model
(``configs/lm/austen_char.yaml``: ``TextDataModule`` with ``TokenizerConfig(kind="char")``), built by the same function
from the same text (``austen_char_tokenizer``), so that the decoder can be warm-started from that GPT; or
``tokenizer.file`` (a run's ``tokenizer.json``). For Ding, the characters of all its German sentences (written into
the prepared folder as ``tokenizer.json``).
"""

from __future__ import annotations

import io
import os
from collections import Counter
from collections.abc import Generator, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property, lru_cache, partial
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from lightformer.config_groups import as_config
from lightformer.data.loading.sampling import EpochShuffleSampler, Key, evaluation_sampler, index_and_epoch, map_loader
from lightformer.data.loading.streaming import ImageLoaderConfig, Records
from lightformer.data.modules.base import PreparedRecords
from lightformer.data.pieces import stage_splits
from lightformer.data.preparation.caching import content_hash, preparing
from lightformer.data.preparation.prepare import (
    TOKENIZER,
    PrepareConfig,
    TokenizerConfig,
    _tokenizer,
    as_tokenizer_config,
    piece_size,
    pieces,
    split_location,
    worker_tokenizer,
)
from lightformer.data.preparation.records import RecordSplit, TokenizerJob, prepare_records
from lightformer.data.sources.corpora import (
    DING_FILE,
    TRAIN_SHARE,
    VAL_SHARE,
    austen_text,
    ding_dictionary,
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
from lightformer.facts import DataFacts
from lightformer.io.files import read_utf8, sha256_of
from lightformer.nn.checks import check_at_least
from lightformer.tokenization.text import PAD_ID, Tokenizer

CORPORA = ("austen", "ding")
# bump when what a prepared folder holds, or how a line is drawn, changes meaning (2: images as litdata File leaves)
FORMAT_VERSION = 2
PREPARED_SPLITS = ("train", "val", "test", "test_seen")
TEXT_SPLIT = {"train": "train", "val": "val", "test": "test", "test_seen": "test"}  # whose sentences a split reads
SPLIT_CODE = {"train": 0, "val": 1, "test": 2, "test_seen": 3}  # in the seeds of a split's style draws
DEFAULT_HELD_OUT = ("DejaVu Serif", "P052", "URW Gothic")  # designs unlike any training family (Vera serif,
# Palatino, Avant Garde): the Liberation, Free and Nimbus families are metric clones of each other and stay together
PIECE_LINES = 1000  # lines per piece a preparing process renders and writes before taking the next
STYLE_TRIES = 4  # styles drawn for a text before another text is drawn, when the line is too wide
STATS_LINES = 512  # train lines the pixels' mean and standard deviation are measured on
MIN_HEIGHT = 16


# --- options ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageTextSource:
    """Which lines of text, how many, and in which typefaces (``data.source``).

    Args:
        corpus: "austen": Jane Austen's six novels (Debian's r-cran-janeaustenr, fetched into ``<data_root>/austen``);
            "ding": the German sentences of the Ding dictionary (Debian's trans-de-en, read from ``ding_file``), the
            translation task's, split as it splits them.
        min_words: fewest words of a line.
        max_words: most words of a line (fewer where a sentence is shorter).
        max_chars: most characters of a line, spaces included: a longer text is drawn again. The default, 62, keeps
            every line within a decoder of 64 positions (BOS and EOS added), the main job's language model's, which
            ``printed_lines_from_lm.yaml`` starts from; narrow typefaces would otherwise fit 70 and more.
        train_lines: lines rendered for training.
        val_lines: lines rendered for validation (held-out text, held-out typefaces); 0: no validation.
        test_lines: lines rendered for each of the two test splits (held-out text; held-out and training typefaces).
        held_out_families: font families never trained on: val and test (``test_fonts="unseen"``) are rendered in
            them. Names as the fonts give them ("DejaVu Serif", "Nimbus Roman", "URW Gothic", ...).
        test_fonts: "unseen": the test split is rendered in the held-out families; "seen": the same texts rendered
            in the training families (changing it prepares nothing again).
        font_dir: "/usr/share/fonts" (the default): the declared typefaces (``rendering.TYPEFACES``, installed by
            debian-packages.txt), nothing else there; another folder, of your own: every text font in it (.ttf, .otf,
            .t1, .pfb), grouped by family. Every font used must draw every character of the corpus (checked before
            rendering).
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
    """``value`` as a (low, high) pair within [low, high], or a ValueError naming ``data.<group>.<name>``."""
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


# --- text and fonts --------------------------------------------------------------------------------------------


def austen_char_tokenizer(data_root: str = "data") -> Tokenizer:
    """The character tokenizer of the main job's Austen language model, made by the function that makes it there
    (``prepare_text`` for ``TextSource(corpus="austen")``, ``TokenizerConfig(kind="char")``) from the same text: every
    split's characters, so the split's fractions do not change it."""
    source = TextSource(corpus="austen", val_fraction=0.1, data_root=data_root)
    return _tokenizer(TokenizerConfig(kind="char"), source.pieces(source_files(source)), source.text_field, ())


@lru_cache(maxsize=2)
def split_sentences(corpus: str, path: str) -> dict[str, tuple[str, ...]]:
    """Each split's sentences of a built-in ``corpus`` read from ``path``. Austen's novels: by position in each
    novel, 80% train, 10% val, 10% test. Ding's German sentences: by the md5 bucket of each (``split_of``; 90%, 5%,
    5%), as the translation task splits its pairs, so that neither task trains on the other's test sentences."""
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
    """The font families of each prepared split: val and test the held-out ones, train and test_seen the others.
    A held-out family that is not among the typefaces (``rendering.typefaces``), or none left to train on, is a
    ConfigError naming the field; a declared typeface's missing file, a DataError naming its package."""
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
    """A drawn line: its text, typeface and style, and how many draws it took (texts whose bucket was another
    split's; styles too wide; texts too long or too wide)."""

    text: str
    family: str
    font: str
    style: LineStyle
    other_split: int = 0
    style_redraws: int = 0
    text_redraws: int = 0


@dataclass(frozen=True)
class LineDrawer:
    """Draws and renders line i of a split from (seed, split, i) alone: what a preparing process needs, small to
    pickle (the sentences are read once per process, ``split_sentences``)."""

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
    """The records of lines [start, stop) of ``split``, rendered one at a time: {"image": PNG bytes, "text",
    "family"}; returns the piece's counts (redraws, families, longest text)."""
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


# --- loading ---------------------------------------------------------------------------------------------------


def jitter(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A training image ``(H, W)`` or ``(H, W, 3)`` uint8, lightly changed: contrast ×[0.8, 1.2] about its mean,
    brightness ±20 levels, a shift of up to 2 pixels across and 1 down or up (the edges repeated)."""
    pixels = image.astype(np.float32)
    mean = pixels.mean()
    pixels = (pixels - mean) * rng.uniform(0.8, 1.2) + mean + rng.uniform(-20, 20)
    dx, dy = int(rng.integers(-2, 3)), int(rng.integers(-1, 2))
    padded = np.pad(pixels, ((1, 1), (2, 2)) + ((0, 0),) * (image.ndim - 2), mode="edge")
    h, w = image.shape[:2]
    pixels = padded[1 - dy : 1 - dy + h, 2 - dx : 2 - dx + w]
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)


class LineImages(Dataset):
    """A prepared split by index: item i is {"image": uint8 (C, H, W), "ids": [BOS] + ids + [EOS] (int64), "text"};
    with ``augment``, the image jittered by draws from (seed, epoch, i) (``EpochShuffleSampler(with_epoch=True)``
    hands the epoch with the index), the same whatever the number of loader workers. ``mode``: the PIL mode the
    images are read in ("L": one channel; "RGB": three)."""

    mode = "L"

    def __init__(self, split_dir, tokenizer_json: str, augment: bool = False, seed: int = 0) -> None:
        self.records = Records(split_dir)
        self.tokenizer_json = tokenizer_json
        self.augment, self.seed = augment, seed

    def __len__(self) -> int:
        return len(self.records)

    def _item(self, record: dict, index: int, epoch: int) -> dict:
        return self._encoded(record["image"], record["text"], index, epoch)

    def _encoded(self, png: bytes, text: str, index: int, epoch: int) -> dict:
        """An item of the image ``png`` (jittered by draws from (seed, epoch, index) when ``augment``) and ``text``."""
        image = np.asarray(Image.open(io.BytesIO(png)).convert(self.mode))
        if self.augment:
            image = jitter(image, np.random.default_rng(np.random.SeedSequence((self.seed, epoch, index))))
        ids = worker_tokenizer(self.tokenizer_json).encode(text, add_bos=True, add_eos=True)
        pixels = np.atleast_3d(image).transpose(2, 0, 1).copy()  # (H, W[, C]) -> (C, H, W), writable
        return {"image": torch.from_numpy(pixels), "ids": torch.tensor(ids, dtype=torch.int64), "text": text}

    def __getitem__(self, key: Key) -> dict:
        index, epoch = index_and_epoch(key)
        return self._item(self.records[index], index, epoch)

    def __getitems__(self, keys: list[Key]) -> list[dict]:
        pairs = [index_and_epoch(key) for key in keys]
        records = self.records.__getitems__([index for index, _ in pairs])
        return [self._item(record, *pair) for record, pair in zip(records, pairs, strict=True)]


def collate_lines(items: list[dict], mean: float | Sequence[float], std: float | Sequence[float], pad_id: int) -> dict:
    """Items → {"images": (B, C, H, W) float32, (pixels / 255 - mean) / std (one value, or one per channel); "tgt":
    (B, T) int64 padded with ``pad_id`` to the longest; "text": the B texts; "references": each item's texts that a
    reading is scored against (its "references", or its text alone)}."""
    if not isinstance(mean, float | int):
        mean, std = (torch.tensor(v, dtype=torch.float32).view(-1, 1, 1) for v in (mean, std))
    images = torch.stack([item["image"] for item in items]).float().div_(255).sub_(mean).div_(std)
    longest = max(len(item["ids"]) for item in items)
    tgt = torch.full((len(items), longest), pad_id, dtype=torch.int64)
    for row, item in enumerate(items):
        tgt[row, : len(item["ids"])] = item["ids"]
    texts = [item["text"] for item in items]
    references = [item.get("references", [text]) for item, text in zip(items, texts, strict=True)]
    return {"images": images, "tgt": tgt, "text": texts, "references": references}


def pixel_statistics(train: Path, count: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Each channel's mean and standard deviation of the pixels (on [0, 1]) of ``STATS_LINES`` images spread evenly
    over the ``count`` records of a prepared ``train`` split (records {"image": PNG bytes, ...})."""
    records = Records(str(train))
    indices = np.unique(np.linspace(0, count - 1, min(count, STATS_LINES)).round().astype(int))
    pixels = np.stack([np.asarray(Image.open(io.BytesIO(records[int(i)]["image"]))) for i in indices])
    pixels = pixels.astype(np.float64) / 255
    if pixels.ndim == 3:  # one channel
        return (round(float(pixels.mean()), 6),), (round(float(pixels.std()), 6),)
    flat = pixels.reshape(-1, pixels.shape[-1])
    return tuple(round(float(v), 6) for v in flat.mean(0)), tuple(round(float(v), 6) for v in flat.std(0))


# --- the data modules ------------------------------------------------------------------------------------------


class ImageTextRecords(PreparedRecords):
    """What the image-text data modules share once their records are prepared (``dataset(split)`` is each one's
    own): set-up, and the loaders of ``collate_lines``'s batches: training in an order drawn from (seed, epoch),
    resumable mid-epoch; val and test in order.

    Args:
        loader: images per batch, loader workers, pinned memory (``ImageLoaderConfig``).
        prepare: where and with how many processes the records are prepared (``PrepareConfig``).
        augment: jitter training images; never val or test.
        seed: seeds the training order and jitter.
    """

    counted = "lines"  # the manifest's records of each split, by split

    def __init__(self, loader: ImageLoaderConfig, prepare: PrepareConfig, augment: bool, seed: int) -> None:
        super().__init__()
        self.loader, self.prepare_config = as_config(ImageLoaderConfig, loader), as_config(PrepareConfig, prepare)
        self.augment, self.seed = augment, seed

    def setup(self, stage: str | None = None) -> None:
        for split in stage_splits(stage):
            if self._has(split):
                self.dataset(split)

    def _has(self, split: str) -> bool:
        return bool(self.manifest[self.counted][split])

    def _dataloader(self, split: str, shuffle: bool = False) -> DataLoader:
        dataset = self.dataset(split)
        sampler = EpochShuffleSampler(len(dataset), self.seed, with_epoch=True) if shuffle else None
        collate = partial(collate_lines, mean=self.manifest["mean"], std=self.manifest["std"], pad_id=PAD_ID)
        return map_loader(dataset, self.loader, sampler or evaluation_sampler(dataset), shuffle, collate_fn=collate)

    def predict_dataloader(self) -> DataLoader:
        return self.test_dataloader()


class ImageTextDataModule(ImageTextRecords):
    """Printed lines of Austen's novels (or Ding's German sentences) and their text, for an image-to-text model:
    batches {"images": (B, 1, H, W) float32 normalised, "tgt": (B, T) int64 [BOS] ids [EOS] padded with PAD, "text":
    list of B strings}. See the module docstring for how lines are drawn, split, prepared and loaded; ``data_facts()``
    (after preparation) tells the model the tokenizer, the image size (H, W), one channel, the pixels' mean and std,
    and the longest ``tgt``.

    Args:
        source: the lines, their counts, the held-out typefaces (``ImageTextSource``).
        render: the image size and the ranges of every style draw (``RenderConfig``).
        tokenizer: ``file``: a tokenizer JSON (``Tokenizer.save``; a run's ``tokenizer.json``); unset: for Austen,
            the character tokenizer of the Austen language model (``configs/lm/austen_char.yaml``), whose GPT can
            warm-start the decoder; for Ding, a character tokenizer of all its German sentences, made in preparation
            (``TokenizerConfig``; kind "char").
        loader: lines per batch, loader workers, pinned memory (``ImageLoaderConfig``).
        prepare: where and with how many processes the lines are rendered (``PrepareConfig``).
        augment: jitter training lines (brightness, contrast, a shift of a pixel or two); never val or test.
        seed: seeds every line's text and style, and the training order.
    """

    def __init__(
        self,
        source: ImageTextSource = ImageTextSource(),
        render: RenderConfig = RenderConfig(),
        tokenizer: TokenizerConfig = TokenizerConfig(),
        loader: ImageLoaderConfig = ImageLoaderConfig(batch_size=64),
        prepare: PrepareConfig = PrepareConfig(),
        augment: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(loader, prepare, augment, seed)
        self.save_hyperparameters()
        self.source, self.render = as_config(ImageTextSource, source), as_config(RenderConfig, render)
        self.tokenizer_config = as_tokenizer_config(tokenizer, TokenizerConfig())
        self.tokenizer_config.check_used_by("ImageTextDataModule", kinds=("char",))
        self.families = split_families(self.source)  # refuses families that are not installed, before any work

    # --- what the model needs to know ---

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """``tokenizer.file``'s; else for Austen the character LM's (``austen_char_tokenizer``), not a file of the
        prepared folder; for Ding the characters of its sentences, the prepared folder's ``tokenizer.json``."""
        file = self.tokenizer_config.file
        if file:
            return Tokenizer.from_file(file)
        return super().tokenizer if self.source.corpus == "ding" else austen_char_tokenizer(self.source.data_root)

    def data_facts(self) -> DataFacts:
        tokenizer, manifest = self.tokenizer, self.manifest
        unknown = tokenizer.unknown_characters(manifest.get("characters", ""))  # [] for BPE: it encodes any text
        if unknown:
            raise ValueError(
                f"data.tokenizer.file: {self.tokenizer_config.file} has no token for {''.join(unknown)!r}, characters "
                f"of the {self.source.corpus} text: leave data.tokenizer.file unset for the corpus's own characters"
            )
        longest = manifest["longest"]["chars" if tokenizer.kind == "char" else "bytes"]  # bytes: BPE's bound
        return DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                         image_size=(self.render.height, self.render.width), in_channels=1, image_fit="line",
                         normalize_mean=(manifest["mean"],), normalize_std=(manifest["std"],),
                         max_length=longest + 2)  # fmt: skip

    # --- the prepared data (see the module docstring) ---

    def _stem(self) -> str:
        return f"image-text-{self.source.corpus}"

    # ``manifest``: the fingerprint, each split's "lines", "families", "redraws", the "longest" text (chars, bytes),
    # the train pixels' "mean" and "std", the text's "characters"

    def _text_path(self) -> str:
        """The corpus's file (Austen's fetched first)."""
        if self.source.corpus == "ding":
            return str(ding_dictionary(self.source.ding_file))
        return str(austen_text(Path(self.source.data_root) / "austen"))

    def _drawer(self) -> LineDrawer:
        families = tuple((split, self.families[split]) for split in PREPARED_SPLITS)
        return LineDrawer(self.source, self.render, self.seed, self._text_path(), families)

    def _lines(self) -> dict[str, int]:
        s = self.source
        return {"train": s.train_lines, "val": s.val_lines, "test": s.test_lines, "test_seen": s.test_lines}

    def _fingerprint(self) -> dict:
        """What the rendered lines depend on: the text, the fonts (paths and sizes), the options, the seed."""
        installed = typefaces(self.source.font_dir)  # declared: the paths discovery found, so fingerprints stay
        used = sorted({family for families in self.families.values() for family in families})
        fonts = {family: [[path, os.path.getsize(path)] for path in installed[family]] for family in used}
        ignored = ("test_fonts", "data_root", "font_dir", "ding_file")  # the file's content is hashed
        source = {k: v for k, v in asdict(self.source).items() if k not in ignored}
        text = {self.source.corpus: sha256_of(self._text_path())}
        return {"format": FORMAT_VERSION, **text, "fonts": content_hash(fonts),
                "families": {split: list(f) for split, f in self.families.items()}, "source": source,
                "render": asdict(self.render), "seed": self.seed}  # fmt: skip

    def _build(self, folder: Path) -> dict:
        """``prepared_folder``'s build through ``prepare_records``: each split's records, rendered in pieces on every
        core; what it returns goes into the manifest."""
        drawer = self._drawer()
        corpus = self.source.corpus
        with preparing(f"cutting {'Ding' if corpus == 'ding' else 'Austen'}'s text into sentences"):
            sentences = split_sentences(corpus, drawer.text_path)  # read once here: forked processes inherit it
        characters = "".join(sorted({c for split in sentences.values() for text in split for c in text}))
        check_glyphs({family: paths for split in PREPARED_SPLITS for family, paths in drawer.fonts(split)}, characters)
        # Ding's default tokenizer, its characters (``tokenizer.file``, if set, is used instead); Austen's is the LM's
        what = f"a character tokenizer of the {len(characters)} characters of Ding's sentences"
        jobs = [TokenizerJob(TOKENIZER, TokenizerConfig(kind="char"), lambda splits: [characters], what=what)]
        workers = self.prepare_config.num_workers
        lines = self._lines()

        def splits(tokenizers: dict[str, str]) -> list[RecordSplit]:
            ranges = {split: [(piece.start, piece.stop) for piece in
                              pieces(range(lines[split]), piece_size(lines[split], PIECE_LINES, workers))]
                      for split in PREPARED_SPLITS}  # fmt: skip
            return [RecordSplit(split, ranges[split], partial(line_records, drawer=drawer, split=split), lines[split])
                    for split in PREPARED_SPLITS if lines[split]]  # fmt: skip

        _, parts = prepare_records(folder, jobs if corpus == "ding" else [], splits, ("text",), workers,
                                   maxima=("longest",))  # fmt: skip
        redraws = {split: dict(part["counts"]) for split, part in parts.items()}
        families = {split: dict(sorted(part["families"].items())) for split, part in parts.items()}
        longest = {key: max([0, *(part["longest"][key] for part in parts.values())]) for key in ("chars", "bytes")}
        (mean,), (std,) = pixel_statistics(folder / "train", lines["train"])
        rank_zero_info(f"prepared image-text lines: {folder} ({', '.join(f'{s} {n:,}' for s, n in lines.items())})")
        return {"lines": lines, "families": families, "redraws": redraws, "longest": longest, "mean": mean,
                "std": std, "characters": characters}  # fmt: skip

    # --- LightningDataModule hooks ---

    def dataset(self, split: str) -> LineImages:
        """A prepared split's lines ("test": the one ``source.test_fonts`` picks), its shards checked."""
        name = "test_seen" if split == "test" and self.source.test_fonts == "seen" else split
        if name not in self.datasets:
            if not self.manifest["lines"][name]:
                raise ValueError(f"data.source: the {split} split has no lines; set data.source.{split}_lines")
            self.datasets[name] = LineImages(split_location(self.prepared, name), self.tokenizer.to_str(),
                                             augment=self.augment and name == "train", seed=self.seed)  # fmt: skip
        return self.datasets[name]
