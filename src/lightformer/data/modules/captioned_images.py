"""Built-in captioned images for contrastive image-text models (``ContrastiveTask``): the Open Clip Art Library's
drawings with their authors' captions (``ClipArtDataModule``), and emoji in two styles named by Unicode
(``EmojiDataModule``), prepared once into records through the pipeline of a user's own captioned images
(``image_text_files.prepare_captioned``), streamed as the same batches with "labels".

    /usr/share/openclipart/{png,svg} ──list, captions from each SVG's metadata, split by variant──> drawings
      ──each PNG on white, fitted to the square canvas, every core, in pieces──> <prepare.dir>/clipart-<hash>/
        train | val | test records {"image": PNG, "file", "texts": JSON list, "label"}, tokenizer.json, prepared.json
    Noto Color Emoji, Symbola ──the emoji both draw, each in both styles──> <prepare.dir>/emoji-<hash>/ (the same)
      records ──decode, jitter (train), encode──> {"images", "tgt", "text", "references", "labels"}

**Clip art** (``raw.openclipart`` says how captions are read and variants keyed). Each drawing's captions: its title;
its description where it differs; "title, keyword, keyword, ..." within ``max_chars``; in training, each keyword alone
too (``keyword_captions``); a drawing of none is left out and counted (``left_out``). The split is a stable hash of the
drawing's variant key (``val_fraction``, ``test_fraction``), so a drawing's variants are never on both sides. Its label
is its top-level folder's index among the classes: every top-level folder but ``EXCLUDED_CATEGORIES`` ("unsorted",
"special": names that say nothing of what they hold; "buttons", "logos": 3 and 7 drawings); a drawing of those trains
with label -1. ``class_names`` are the folders as prompts say them ("signs and symbols").

**Emoji** (``raw.emoji``): the 1,139 characters both Noto Color Emoji and Symbola map (symbols of a Unicode name,
outside ASCII), each drawn in both styles on white; caption its name in lower case ("red apple"), label its index in
``class_names`` (the captions). Training reads every emoji in the style not held out; val and test hold the other
style, val the emoji whose name hashes below ``val_fraction``, test the rest: zero-shot classification over all the
names on the held-out style, whose chance is 1 / the number of classes (1/1,139).

Training items draw their caption by (seed, epoch, index), the next one each epoch, jittered and resumable as a
user's captioned images; val and test come in order, ``text`` their first caption and ``references`` all of them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from functools import partial
from pathlib import Path

from lightformer.config_groups import as_config
from lightformer.data.loading.pictures import CaptionedImages, collate_captions
from lightformer.data.loading.sampling import EpochShuffleSampler, evaluation_sampler, map_loader
from lightformer.data.loading.streaming import ImageLoaderConfig
from lightformer.data.modules.image_text import ImageTextRecords
from lightformer.data.modules.image_text_files import prepare_captioned
from lightformer.data.pieces import SPLITS
from lightformer.data.preparation.caching import content_hash, file_stamp, preparing
from lightformer.data.preparation.prepare import (
    PrepareConfig,
    TokenizerConfig,
    _tokenizer_key,
    as_tokenizer_config,
    piece_size,
    pieces,
    split_location,
)
from lightformer.data.preparation.records import RecordSplit
from lightformer.data.sources import emoji, openclipart
from lightformer.data.sources.emoji import EmojiSource, emoji_records
from lightformer.data.sources.openclipart import ClipArtSource, clipart_records
from lightformer.errors import DataError
from lightformer.facts import DataFacts
from lightformer.tokenization.text import PAD_ID

FORMAT_VERSION = 1  # bump when what a prepared folder holds, or how an image is drawn, changes meaning
PIECE_IMAGES = 250  # images per piece a preparing process fits and writes before taking the next


# --- records ---------------------------------------------------------------------------------------------------


# --- the data modules ------------------------------------------------------------------------------------------


class LabelledCaptions(ImageTextRecords):
    """What the built-in captioned images share: RGB images on a square canvas, several captions each and a label,
    prepared by ``prepare_captioned``; batches {"images", "tgt", "text", "references", "labels"} and the facts with
    ``class_names``."""

    counted = "images"
    size: int

    def __init__(self, tokenizer, loader, prepare, augment: bool, seed: int, name: str) -> None:
        super().__init__(loader, prepare, augment, seed)
        self.tokenizer_config = as_tokenizer_config(tokenizer, TokenizerConfig())
        self.tokenizer_config.check_used_by(name)

    def data_facts(self) -> DataFacts:
        tokenizer, manifest = self.tokenizer, self.manifest
        return DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                         image_size=(self.size, self.size), in_channels=3, image_fit="drawing",
                         normalize_mean=tuple(manifest["mean"]), normalize_std=tuple(manifest["std"]),
                         max_length=manifest["longest"] + 2,
                         class_names=tuple(manifest["class_names"]))  # fmt: skip

    def dataset(self, split: str) -> CaptionedImages:
        """A prepared split's images, its shards checked."""
        if split not in self.datasets:
            if not self.manifest["images"][split]:
                raise DataError(f"data.source: the {split} split holds no image; give it a share of the data")
            self.datasets[split] = CaptionedImages(
                split_location(self.prepared, split), self.tokenizer.to_str(), self.augment and split == "train",
                self.seed, 3, cycle=split == "train", labels=True,
            )  # fmt: skip
        return self.datasets[split]

    def _dataloader(self, split: str, shuffle: bool = False):
        dataset = self.dataset(split)
        sampler = EpochShuffleSampler(len(dataset), self.seed, with_epoch=True) if shuffle else None
        collate = partial(collate_captions, mean=self.manifest["mean"], std=self.manifest["std"], pad_id=PAD_ID)
        return map_loader(dataset, self.loader, sampler or evaluation_sampler(dataset), shuffle, collate_fn=collate)

    def _splits_of(self, split_items: dict[str, list], records_of: dict[str, partial]):
        """``prepare_captioned``'s record splits of each split's items (pieces of them, on every core)."""
        workers = self.prepare_config.num_workers

        def record_splits(images: dict[str, int]) -> list[RecordSplit]:
            return [RecordSplit(split, pieces(items, piece_size(len(items), PIECE_IMAGES, workers)), records_of[split],
                                expected=len(items)) for split, items in split_items.items() if items]  # fmt: skip

        return record_splits


class ClipArtDataModule(LabelledCaptions):
    """The Open Clip Art Library's drawings and their authors' captions, for a contrastive image-text model:
    batches {"images": (B, 3, S, S) float32 normalised, "tgt": (B, T) int64 [BOS] ids [EOS] padded with PAD, "text",
    "references": each drawing's captions, "labels": (B,) int64, its top-level category's index in
    ``class_names`` or -1}. See the module docstring for captions, split and labels.

    Args:
        source: the library's folder, the canvas, the split's fractions, the captions' length (``ClipArtSource``).
        tokenizer: a tokenizer file, or the kind trained on the captions (``TokenizerConfig``; default characters).
        loader: images per batch, loader workers, pinned memory (``ImageLoaderConfig``).
        prepare: where and with how many processes the drawings are prepared (``PrepareConfig``).
        augment: jitter training images (brightness, contrast, a shift of a pixel or two); never val or test.
        seed: seeds the training order, jitter and which caption of a drawing each epoch trains on.
    """

    def __init__(
        self,
        source: ClipArtSource = ClipArtSource(),
        tokenizer: TokenizerConfig = TokenizerConfig(),
        loader: ImageLoaderConfig = ImageLoaderConfig(batch_size=64),
        prepare: PrepareConfig = PrepareConfig(),
        augment: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(tokenizer, loader, prepare, augment, seed, "ClipArtDataModule")
        self.save_hyperparameters()
        self.source = as_config(ClipArtSource, source)
        self.size = self.source.image_size
        root = Path(self.source.root)
        if not ((root / "png").is_dir() and (root / "svg").is_dir()):
            raise DataError(f"data.source.root={self.source.root!r} does not hold the Open Clip Art Library's png/ and "
                            "svg/ folders: apt-get install openclipart-png openclipart-svg, or point it at a folder "
                            "where they are unpacked")  # fmt: skip

    def _stem(self) -> str:
        return "clipart"

    def _fingerprint(self) -> dict:
        """What the records depend on: each PNG's and SVG's path, size and modification time, the options, the
        tokenizer's."""
        self._names = openclipart.drawing_names(self.source.root)
        if not self._names:
            raise DataError(f"data.source.root={self.source.root!r}: its png/ folder holds no drawing")
        stamps = hashlib.sha256()
        root = Path(self.source.root)
        for name in self._names:
            for kind in ("png", "svg"):
                stamps.update(json.dumps(file_stamp(root / kind / f"{name}.{kind}")[1:] + [name, kind]).encode())
        source = {k: v for k, v in asdict(self.source).items() if k != "root"}
        return {"format": FORMAT_VERSION, "files": stamps.hexdigest(), "source": source,
                "excluded": sorted(openclipart.EXCLUDED_CATEGORIES),
                "tokenizer": _tokenizer_key(self.tokenizer_config, ())}  # fmt: skip

    def _build(self, folder: Path) -> dict:
        """``prepared_folder``'s build through ``prepare_captioned``: captions read, split by variant, labelled; the
        PNGs fitted in pieces on every core; what it returns goes into the manifest."""
        s = self.source
        classes = openclipart.categories(self._names)
        index = {category: i for i, category in enumerate(classes)}
        splits: dict[str, list] = {split: [] for split in SPLITS}
        left_out = []
        with preparing(f"reading the captions of {len(self._names):,} drawings"):
            for drawing in openclipart.read_drawings(s.root, self._names, s.max_chars):
                if isinstance(drawing, str):
                    left_out.append(drawing)
                    continue
                split = openclipart.split_of(drawing.name, s.val_fraction, s.test_fraction)
                if split == "train" and s.keyword_captions:
                    drawing = drawing._replace(captions=list(dict.fromkeys([*drawing.captions, *drawing.keywords])))
                splits[split].append((drawing, index.get(drawing.category, -1)))
        rows = ((split, drawing.captions) for split in SPLITS for drawing, _ in splits[split])
        records_of = {split: partial(clipart_records, root=s.root, size=s.image_size) for split in SPLITS}
        manifest = prepare_captioned(folder, rows, self._splits_of(splits, records_of), self.tokenizer_config,
                                     self.prepare_config.num_workers, "clip art")  # fmt: skip
        per_class = {split: [sum(label == i for _, label in items) for i in range(len(classes))]
                     for split, items in splits.items()}  # fmt: skip
        return {**manifest, "class_names": [openclipart.class_name(c) for c in classes], "categories": classes,
                "per_class": per_class, "left_out": left_out}  # fmt: skip


class EmojiDataModule(LabelledCaptions):
    """Emoji named by Unicode in two styles, one held out, for a contrastive image-text model: batches as
    ``ClipArtDataModule``'s, "labels" each emoji's index in ``class_names`` (its name). Training in one style, val and
    test in the other (the module docstring).

    Args:
        source: the fonts, the style held out, the canvas (``EmojiSource``).
        tokenizer: a tokenizer file, or the kind trained on the names (``TokenizerConfig``; default characters).
        loader: images per batch, loader workers, pinned memory (``ImageLoaderConfig``).
        prepare: where and with how many processes the emoji are drawn (``PrepareConfig``).
        augment: jitter training images (brightness, contrast, a shift of a pixel or two); never val or test.
        seed: seeds the training order and jitter.
    """

    def __init__(
        self,
        source: EmojiSource = EmojiSource(),
        tokenizer: TokenizerConfig = TokenizerConfig(),
        loader: ImageLoaderConfig = ImageLoaderConfig(batch_size=64),
        prepare: PrepareConfig = PrepareConfig(),
        augment: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(tokenizer, loader, prepare, augment, seed, "EmojiDataModule")
        self.save_hyperparameters()
        self.source = as_config(EmojiSource, source)
        self.size = self.source.image_size
        for field, package in (("noto_font", "fonts-noto-color-emoji"), ("symbola_font", "fonts-symbola")):
            if not Path(getattr(self.source, field)).is_file():
                raise DataError(f"data.source.{field}={getattr(self.source, field)!r} does not exist: apt-get install "
                                f"{package}, or give the font's file")  # fmt: skip

    def _stem(self) -> str:
        return f"emoji-{self.source.held_out_style}"

    def fonts(self) -> dict[str, str]:
        """Each style's font file."""
        return {"noto": self.source.noto_font, "symbola": self.source.symbola_font}

    def _fingerprint(self) -> dict:
        """What the records depend on: the fonts (paths and sizes), the options, the tokenizer's."""
        fonts = {style: [path, Path(path).stat().st_size] for style, path in self.fonts().items()}
        return {"format": FORMAT_VERSION, "fonts": content_hash(fonts), "source": asdict(self.source),
                "tokenizer": _tokenizer_key(self.tokenizer_config, ())}  # fmt: skip

    def _build(self, folder: Path) -> dict:
        """The emoji both fonts draw, each split's pieces drawn on every core through ``prepare_captioned``."""
        s, fonts = self.source, self.fonts()
        with preparing("finding the emoji both fonts draw"):
            mapped = emoji.emoji_characters(fonts["noto"], fonts["symbola"])
            drawn = [c for c in mapped if all(emoji.draw(c, style, fonts[style], 16) for style in emoji.STYLES)]
        trained = "noto" if s.held_out_style == "symbola" else "symbola"

        def carved(character: str) -> bool:
            return int(hashlib.sha256(emoji.caption(character).encode()).hexdigest()[:12], 16) < s.val_fraction * 16**12

        splits = {"train": [(c, i) for i, c in enumerate(drawn)],
                  "val": [(c, i) for i, c in enumerate(drawn) if carved(c)],
                  "test": [(c, i) for i, c in enumerate(drawn) if not carved(c)]}  # fmt: skip
        style = {"train": trained, "val": s.held_out_style, "test": s.held_out_style}
        records_of = {split: partial(emoji_records, style=style[split], font=fonts[style[split]], size=s.image_size)
                      for split in SPLITS}  # fmt: skip
        rows = ((split, [emoji.caption(c)]) for split in SPLITS for c, _ in splits[split])
        manifest = prepare_captioned(folder, rows, self._splits_of(splits, records_of), self.tokenizer_config,
                                     self.prepare_config.num_workers, "emoji")  # fmt: skip
        return {**manifest, "class_names": [emoji.caption(c) for c in drawn], "styles": style,
                "not_drawn": [emoji.caption(c) for c in mapped if c not in drawn]}  # fmt: skip
