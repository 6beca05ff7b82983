"""Question-answer records about images for a vision-language model, built only from what the offline sources say:
the Open Clip Art Library's titles, categories and keywords, the text of printed lines, emoji's Unicode names.

    sources ──questions of QUESTIONS, answers read from the source──> units (one source, one canvas each)
      ──draw / fit each image, every core, in pieces (``prepare_records``)──> <prepare.dir>/visual-qa-<hash>/
        train | val | test records {"image": PNG (RGB, at its canvas), "question", "answer", "group", "text"},
        prepared.json
      records ──decode, chat template (``ChatTemplate``), one canvas per batch (``CanvasBatchSampler``)──>
        {"images", "ids", "labels", "prompt_length", "group", "answer", "question", "transcript"}

**Questions** (``QUESTIONS``; one (image, question, answer) per record):
- clip art: "What is this?" → its title (drawings that have one); "Which category?" → its top-level category as
  ``ClipArtDataModule`` names it ("signs and symbols"; drawings of one of its classes); "Name its keywords." → its
  first 3 keywords joined by ", " (drawings that have keywords); both cut at a word within ``max_chars``. Split by
  ``openclipart.split_of`` (a hash of the variant key: variants together), each drawing fitted on the square
  ``drawing_size`` canvas (``drawing_image``).
- lines: "What does it say?" → the line; "What is word N?" → its N-th word, N drawn from (seed, split, line). Lines
  of ``words`` words of Austen drawn and rendered by ``image_text.LineDrawer`` at height 32 on a ``line_width``
  canvas; train in the seen families, val and test in the held-out ones (``split_families``), text split by position.
- fashion_mnist: "What kind of garment is this?" → its class name as torchvision names it ("Ankle boot"); the 28×28
  grey images resized (bilinear) to ``garment_size`` (32: a grid of 4 × 4 patches of 8 after a pixel shuffle of 2)
  and made RGB; train the official train split, val the first half of the official test split, test the second.
- emoji: "What is this emoji?" → its Unicode name in lower case; training in the style not held out, val and test in
  the held-out style (val: the names that ``carved`` picks by ``emoji_val_fraction``).

**Text**: a record's "text" is the text its image shows, where the source knows it (a printed line's; "" for the
others): the target of the task's CTC loss on the image tower (``VisionLanguageTask``'s ``ctc_weight``).

**Groups**: "<source>/<kind>/held-out" for val and test records; with ``seen`` > 0, ``seen`` training images of each
source (evenly spaced) are also val and test records of "<source>/<kind>/seen". Training records carry their seen
group.

**Pixels**: RGB uint8 at the canvas; batches normalised with the mean and standard deviation of each channel over
``STATS_IMAGES`` training images spread evenly over the split (measured in preparation, in the facts).

**Tokenizer**: by default the Austen character language model's (``austen_char_tokenizer``, ``configs/lm/
austen_char.yaml``'s), so that the language model of the main job starts the text tower; or ``tokenizer.file``. The
characters of the questions and answers it lacks are encoded as UNK within ``tokenizer.max_unknown``, refused above it.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from functools import cached_property, lru_cache, partial
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import torchvision
from PIL import Image

from lightformer.config_groups import as_config
from lightformer.data.loading.pictures import channel_statistics
from lightformer.data.loading.streaming import ImageLoaderConfig
from lightformer.data.modules.chat_records import ChatRecords
from lightformer.data.objectives.chat import ChatTemplate
from lightformer.data.pieces import SPLITS
from lightformer.data.preparation.caching import content_hash, file_stamp, preparing
from lightformer.data.preparation.prepare import (
    PrepareConfig,
    TokenizerConfig,
    as_tokenizer_config,
    check_unknown_characters,
    piece_size,
    pieces,
    worker_tokenizer,
)
from lightformer.data.preparation.records import RecordSplit, prepare_records
from lightformer.data.sources import emoji, openclipart
from lightformer.data.sources.captions import carved
from lightformer.data.sources.corpora import (
    DEBIAN_FASHION_MNIST_DIR,
    MNIST_RAW_FILES,
    austen_text,
    install_debian_fashion_mnist,
)
from lightformer.data.sources.lines import (
    DEFAULT_HELD_OUT,
    ImageTextSource,
    LineDrawer,
    RenderConfig,
    austen_char_tokenizer,
    split_families,
    split_sentences,
)
from lightformer.data.sources.rendering import SYSTEM_FONT_DIR, png_bytes, typefaces
from lightformer.errors import DataError
from lightformer.facts import DataFacts
from lightformer.nn.checks import check_at_least
from lightformer.tokenization.text import Tokenizer

FORMAT_VERSION = 3  # bump when what a prepared folder holds, or how an image is drawn, changes meaning
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
        max_images: most images of a source in a split; None: all. Clip art's are then taken in the order of a hash
            of their names (a sample of every category), the others' in their sources' order.
        drawing_size: the square canvas of drawings and emoji, in pixels (a multiple of 16).
        line_width: the lines' canvas width (height 32), a multiple of 16.
        garment_size: Fashion-MNIST's square canvas (its 28×28 images resized to it), a multiple of 16.
        words: (fewest, most) words of a line.
        max_chars: most characters of an answer: a longer line is drawn again; a longer clip art title or keyword
            list is cut at a word (``openclipart.cut``).
        train_lines: lines rendered for training; val_lines, test_lines: for val and test (held-out typefaces).
        held_out_families: the typefaces never trained on (``ImageTextSource.held_out_families``).
        clipart_root: the Open Clip Art Library's folder (``png/``, ``svg/``).
        val_fraction, test_fraction: the clip art's drawings (by their variant's hash) held out for val and test.
        emoji_held_out_style: the emoji style of val and test ("symbola" or "noto").
        emoji_val_fraction: share of the held-out emoji (by name) in val; the rest are test.
        font_dir, data_root: the lines' typefaces (``ImageTextSource.font_dir``: the default, the declared ones); where
            the Austen corpus and Fashion-MNIST (``FashionMNIST/raw``, from Debian's dataset-fashion-mnist) are stored.
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
        """The printed lines' options as ``image_text`` reads them."""
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
    """What one preparing process draws at a time: images of one source (one canvas), each with its (group, question,
    answer) records. ``items``: clip art's drawing names, lines' indices in ``line_split`` (a range), Fashion-MNIST's
    (official split, index) pairs, emoji's (character, style) pairs."""

    source: str
    items: list | range
    questions: list  # per item: [(group, question, answer), ...]; lines': [] (read from the drawn line)
    groups: dict[str, int]  # lines: question kind → group
    line_split: str = ""  # lines: the split whose lines they are


def qa_records(unit: Unit, options: VisualQASource, drawer: LineDrawer | None, tokenizer_json: str, seed: int):
    """The records {"image": PNG, "question", "answer", "group", "text"} of ``unit``, one image at a time; returns the
    longest ids (the chat template's, of one turn) it made."""
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
    """Fashion-MNIST's official "train" or "test" split under ``root`` as (N, 28, 28) uint8 images and their class
    names as torchvision names them (read once per preparing process); a DataError saying how to install it."""
    install_debian_fashion_mnist(root)
    try:
        dataset = torchvision.datasets.FashionMNIST(root, train=official == "train", download=False)
    except (RuntimeError, OSError) as error:
        raise DataError(f"data.source.sources holds fashion_mnist but it is not under data.source.data_root={root!r} "
                        f"({error}): apt-get install dataset-fashion-mnist puts it in {DEBIAN_FASHION_MNIST_DIR}, "
                        "from where it is copied") from None  # fmt: skip
    names = [dataset.classes[int(label)] for label in dataset.targets]
    return dataset.data.numpy(), names


class VisualQADataModule(ChatRecords):
    """Questions and answers about images (the module docstring), for a vision-language model: batches of one canvas
    {"images": (B, 3, H, W) float32 normalised, "ids": (B, T) int64 (one placeholder == vocab_size per row), "labels",
    "prompt_length", "group", "answer", "question"}; the facts add the chat template, the groups and the canvases.

    Args:
        source: the sources, images per source, canvases, lines and typefaces (``VisualQASource``).
        tokenizer: ``file``: a run's ``tokenizer.json``; unset: the Austen character LM's (``TokenizerConfig``).
        template: the chat template (``ChatTemplate``), stored in the facts.
        loader: records per batch, loader workers, pinned memory (``ImageLoaderConfig``).
        prepare: where and with how many processes the images are drawn (``PrepareConfig``).
        augment: jitter training images (brightness, contrast, a shift of a pixel or two); never val or test.
        seed: seeds the lines, the word asked for, the training order and jitter.
    """

    def __init__(
        self,
        source: VisualQASource = VisualQASource(),
        tokenizer: TokenizerConfig = TokenizerConfig(),
        template: ChatTemplate = ChatTemplate(),
        loader: ImageLoaderConfig = ImageLoaderConfig(batch_size=64),
        prepare: PrepareConfig = PrepareConfig(),
        augment: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(loader, prepare, augment, seed)
        self.save_hyperparameters()
        self.source, self.template = as_config(VisualQASource, source), as_config(ChatTemplate, template)
        self.tokenizer_config = as_tokenizer_config(tokenizer, TokenizerConfig())
        self.tokenizer_config.check_used_by("VisualQADataModule", kinds=("char",))
        s = self.source
        if "clipart" in s.sources:
            root = Path(s.clipart_root)
            if not ((root / "png").is_dir() and (root / "svg").is_dir()):
                raise DataError(f"data.source.clipart_root={s.clipart_root!r} does not hold the Open Clip Art "
                                "Library's png/ and svg/ folders: apt-get install openclipart-png openclipart-svg, or "
                                "leave clipart out of data.source.sources")  # fmt: skip
        self.families = split_families(s.line_source()) if "lines" in s.sources else {}
        if "fashion_mnist" in s.sources and not install_debian_fashion_mnist(s.data_root):
            raise DataError(f"data.source.sources holds fashion_mnist but it is not under data.source.data_root="
                            f"{s.data_root!r}/FashionMNIST/raw: apt-get install dataset-fashion-mnist puts it in "
                            f"{DEBIAN_FASHION_MNIST_DIR}, from where it is copied")  # fmt: skip
        if "emoji" in s.sources:
            for font, package in ((emoji.NOTO_EMOJI, "fonts-noto-color-emoji"), (emoji.SYMBOLA, "fonts-symbola")):
                if not Path(font).is_file():
                    raise DataError(f"data.source.sources holds emoji but {font} does not exist: apt-get install "
                                    f"{package}")  # fmt: skip

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """``tokenizer.file``'s, else the Austen character language model's."""
        file = self.tokenizer_config.file
        return Tokenizer.from_file(file) if file else austen_char_tokenizer(self.source.data_root)

    def data_facts(self) -> DataFacts:
        tokenizer, manifest, s = self.tokenizer, self.manifest, self.source
        kind = CANVAS_OF[s.sources[0]]
        return DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                         image_size=tuple(s.canvases()[kind]), in_channels=3, image_fit=kind,
                         normalize_mean=tuple(manifest["mean"]), normalize_std=tuple(manifest["std"]),
                         max_length=manifest["longest"], chat_template=self.template.as_dict(), groups=s.groups(),
                         canvases=s.canvases())  # fmt: skip

    # --- the prepared data ---

    def _stem(self) -> str:
        return "visual-qa"

    def _drawer(self) -> LineDrawer:
        families = tuple(self.families.items())
        render = RenderConfig(height=LINE_HEIGHT, width=self.source.line_width)
        return LineDrawer(self.source.line_source(), render, self.seed, str(self._austen()), families)

    def _austen(self) -> Path:
        return austen_text(Path(self.source.data_root) / "austen")

    def _fingerprint(self) -> dict:
        """What the records depend on: the drawings' and fonts' files (paths, sizes, times), the text, the options,
        the seed, the tokenizer and template (the longest ids)."""
        s, files = self.source, []
        if "clipart" in s.sources:
            root = Path(s.clipart_root)
            files += [file_stamp(root / kind / f"{name}.{kind}")[1:] + [name, kind]
                      for name in openclipart.drawing_names(root) for kind in ("png", "svg")]  # fmt: skip
        if "lines" in s.sources:
            installed = typefaces(s.font_dir)
            used = sorted({family for families in self.families.values() for family in families})
            files += [file_stamp(Path(path))[1:] + [family] for family in used for path in installed[family]]
            files.append(file_stamp(self._austen())[1:])
        if "fashion_mnist" in s.sources:
            files += [file_stamp(Path(s.data_root) / "FashionMNIST" / "raw" / name)[1:] for name in MNIST_RAW_FILES]
        if "emoji" in s.sources:
            files += [file_stamp(Path(font))[1:] for font in (emoji.NOTO_EMOJI, emoji.SYMBOLA)]
        return {"format": FORMAT_VERSION, "files": content_hash(files), "source": asdict(s), "seed": self.seed,
                "families": {split: list(f) for split, f in self.families.items()},
                "tokenizer": content_hash(self.tokenizer.to_str()), "template": self.template.as_dict()}  # fmt: skip

    def _clipart_units(self, index: dict[str, int]) -> dict[str, list[tuple[str, list]]]:
        """Each split's drawings with their questions (the module docstring); the seen ones added to val and test."""
        s = self.source
        names = openclipart.drawing_names(s.clipart_root)
        classes = set(openclipart.categories(names))
        if s.max_images is not None:  # a sample spread over the categories, not the first folders' drawings
            names = sorted(names, key=lambda name: hashlib.sha256(name.encode("utf-8")).digest())
        asked = QUESTIONS["clipart"]
        found: dict[str, list[tuple[str, list]]] = {split: [] for split in SPLITS}
        with preparing(f"reading the titles, categories and keywords of {len(names):,} drawings"):
            for name in names:
                split = openclipart.split_of(name, s.val_fraction, s.test_fraction)
                if s.max_images is not None and len(found[split]) >= s.max_images:
                    continue
                title, _, keywords = openclipart.svg_metadata(Path(s.clipart_root) / "svg" / f"{name}.svg")
                category = name.split("/", 1)[0]
                keywords = list(dict.fromkeys(keywords))[:KEYWORDS]
                answers = {"name": openclipart.cut(title, s.max_chars),
                           "category": openclipart.class_name(category) if category in classes else "",
                           "keywords": openclipart.cut(", ".join(keywords), s.max_chars)}  # fmt: skip
                which = "seen" if split == "train" else "held-out"
                questions = [(index[f"clipart/{kind}/{which}"], asked[kind], answer)
                             for kind, answer in answers.items() if answer]  # fmt: skip
                if questions:
                    found[split].append((name, questions))
        return self._with_seen(found, index)

    def _emoji_units(self, index: dict[str, int]) -> dict[str, list[tuple[tuple[str, str], list]]]:
        """Each split's (emoji, style) with its question; the seen ones added to val and test."""
        s = self.source
        held_out = s.emoji_held_out_style
        trained = next(style for style in emoji.STYLES if style != held_out)
        fonts = {"noto": emoji.NOTO_EMOJI, "symbola": emoji.SYMBOLA}
        with preparing("finding the emoji both fonts draw"):
            drawn = [c for c in emoji.emoji_characters() if all(emoji.draw(c, style, fonts[style], 16)
                                                                 for style in emoji.STYLES)]  # fmt: skip
        question = QUESTIONS["emoji"]["name"]
        found: dict[str, list] = {split: [] for split in SPLITS}
        for character in drawn:
            name = emoji.caption(character)
            evaluated = "val" if carved(name, s.emoji_val_fraction) else "test"
            for split, style in (("train", trained), (evaluated, held_out)):
                if s.max_images is None or len(found[split]) < s.max_images:
                    which = "seen" if split == "train" else "held-out"
                    found[split].append(((character, style), [(index[f"emoji/name/{which}"], question, name)]))
        return self._with_seen(found, index)

    def _garment_units(self, index: dict[str, int]) -> dict[str, list[tuple[tuple[str, int], list]]]:
        """Each split's (official split, index) with its question; the seen ones added to val and test."""
        s, question = self.source, QUESTIONS["fashion_mnist"]["garment"]
        found: dict[str, list] = {split: [] for split in SPLITS}
        for official in ("train", "test"):
            names = garments(s.data_root, official)[1]
            for i, name in enumerate(names):
                split = "train" if official == "train" else "val" if i < len(names) // 2 else "test"
                if s.max_images is None or len(found[split]) < s.max_images:
                    which = "seen" if split == "train" else "held-out"
                    found[split].append(((official, i), [(index[f"fashion_mnist/garment/{which}"], question, name)]))
        return self._with_seen(found, index)

    def _with_seen(self, found: dict[str, list], index: dict[str, int]) -> dict[str, list]:
        """``found`` with ``seen`` of its training items, evenly spaced over them (every category's drawings, not the
        first folder's), added to val and test (their seen groups)."""
        train, count = found["train"], self.source.seen
        seen = train[:: max(1, len(train) // count)][:count] if count else []
        for split in ("val", "test"):
            found[split] = found[split] + seen
        return found

    def _build(self, folder: Path) -> dict:
        """``prepared_folder``'s build through ``prepare_records``: each source's units of each split, drawn in pieces
        on every core; what it returns goes into the manifest."""
        s, tokenizer = self.source, self.tokenizer
        groups = s.groups()
        index = {name: i for i, name in enumerate(groups)}
        canvas_index = {kind: i for i, kind in enumerate(s.canvases())}
        workers = self.prepare_config.num_workers
        units: dict[str, list[tuple[Unit, int]]] = {split: [] for split in SPLITS}  # (unit, its records)
        texts: list[str] = [q.format(n=1) for source in s.sources for q in QUESTIONS[source].values()]
        for source, read in (("clipart", self._clipart_units), ("fashion_mnist", self._garment_units),
                             ("emoji", self._emoji_units)):  # fmt: skip
            if source in s.sources:
                for split, items in read(index).items():
                    texts += [answer for _, questions in items for _, _, answer in questions]
                    for piece in pieces(items, piece_size(len(items), PIECE_IMAGES, workers)):
                        unit = Unit(source, [item for item, _ in piece], [q for _, q in piece], {})
                        units[split].append((unit, sum(len(q) for _, q in piece)))
        drawer = None
        if "lines" in s.sources:
            drawer = self._drawer()
            texts += list(split_sentences("austen", drawer.text_path)["train"][:2000])
            counts = {"train": s.train_lines, "val": s.val_lines, "test": s.test_lines}
            for split in SPLITS:
                ranges = [("held-out" if split != "train" else "seen", split, range(counts[split]))]
                if split != "train":
                    ranges.append(("seen", "train", range(min(s.seen, s.train_lines))))
                for which, drawn, lines in ranges:
                    kinds = {kind: index[f"lines/{kind}/{which}"] for kind in QUESTIONS["lines"]}
                    for piece in pieces(lines, piece_size(len(lines), PIECE_IMAGES, workers)):
                        units[split].append((Unit("lines", piece, [], kinds, drawn), 2 * len(piece)))
        file = self.tokenizer_config.file or "(unset: the Austen character language model's)"
        named = SimpleNamespace(file=file, max_unknown=self.tokenizer_config.max_unknown)  # how the rule names it
        check_unknown_characters(tokenizer, named, texts)
        del texts
        records_of = partial(qa_records, options=s, drawer=drawer, tokenizer_json=tokenizer.to_str(), seed=self.seed)

        def splits(_: dict[str, str]) -> list[RecordSplit]:
            return [RecordSplit(split, [unit for unit, _ in units[split]], records_of,
                                sum(n for _, n in units[split])) for split in SPLITS if units[split]]  # fmt: skip

        _, parts = prepare_records(folder, [], splits, ("answer",), workers, maxima=("longest",))
        records = {split: parts.get(split, {}).get("records", 0) for split in SPLITS}
        if not records["train"]:
            raise DataError(f"data.source: no training record from {list(s.sources)}; give the sources images")
        runs = {split: [[canvas_index[CANVAS_OF[unit.source]], n] for unit, n in units[split]] for split in SPLITS}
        mean, std = channel_statistics(folder / "train", records["train"])
        longest = max([0, *(part.get("longest", 0) for part in parts.values())])
        return {"records": records, "runs": runs, "mean": mean, "std": std, "longest": longest}
