"""The image-and-text family ``ImageTextData`` and its presets: printed lines, one's own files, clip art, emoji."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from functools import cached_property, partial
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from lightformer.config_groups import as_config
from lightformer.data.loading.pictures import CaptionedImages, LineImages, collate_captions, pixel_statistics
from lightformer.data.loading.sampling import EpochShuffleSampler, evaluation_sampler, map_loader
from lightformer.data.loading.streaming import LoaderConfig
from lightformer.data.module import DataModule
from lightformer.data.pieces import SPLITS, line_pieces
from lightformer.data.preparation.caching import content_hash, file_stamp, preparing
from lightformer.data.preparation.prepare import (
    TOKENIZER,
    PrepareConfig,
    TokenizerConfig,
    _tokenizer_key,
    as_tokenizer_config,
    piece_sample,
    piece_size,
    pieces,
    split_location,
    stem_of,
)
from lightformer.data.preparation.records import RecordSplit, TokenizerJob, prepare_records
from lightformer.data.sources import Source, emoji, openclipart
from lightformer.data.sources.captions import (
    Entry,
    ImageTextFiles,
    carved,
    image_records,
    is_shards,
    read_annotations,
    shard_files,
    shard_records,
    shard_samples,
    source_key,
)
from lightformer.data.sources.corpora import austen_text, ding_dictionary
from lightformer.data.sources.emoji import EmojiSource, emoji_records
from lightformer.data.sources.image_files import MIN_SIZE, fit_image, load_image
from lightformer.data.sources.lines import (
    PIECE_LINES,
    PREPARED_SPLITS,
    ImageTextSource,
    LineDrawer,
    RenderConfig,
    austen_char_tokenizer,
    check_glyphs,
    line_records,
    split_families,
    split_sentences,
)
from lightformer.data.sources.openclipart import ClipArtSource, clipart_records
from lightformer.data.sources.rendering import jpeg_bytes, typefaces
from lightformer.errors import DataError
from lightformer.facts import DataFacts
from lightformer.io.files import sha256_of
from lightformer.tokenization.text import PAD_ID, Tokenizer

# bump when what a prepared folder holds, or how a line is drawn, changes meaning (2: images as litdata File leaves)
LINES_FORMAT = 2
FAMILY_OPTIONS = ("image_size", "channels")  # the family's options that its presets set from their sources
SOURCE_FORMAT = 1  # bump when what a prepared folder of a source's own images holds changes meaning


class ImageTextData(DataModule):
    """Images with texts, of any ``Source`` of records ``{"image", "texts"}`` (docs/data.md, "Captioned images").

    Args:
        source: where the captioned images come from (a ``Source`` subclass, named by ``class_path``).
        tokenizer: a tokenizer file, or the kind trained on the texts (``TokenizerConfig``; default: characters).
        loader: images per batch, loader workers, pinned memory (``LoaderConfig``).
        prepare: where and with how many processes the images are prepared (``PrepareConfig``).
        image_size: the square canvas's side in pixels, each image resized to it.
        channels: 1 (grey) or 3 (RGB).
        augment: jitter training images (brightness, contrast, a shift of a pixel or two); never val or test.
        seed: seeds the training order, jitter and which text of an image each epoch trains on.
    """

    counted = "images"  # the manifest's records of each split, by split
    labels = False  # whether records hold a class ("label") that batches carry as "labels"
    image_fit = "resize"  # how an image of another size is brought to the canvas (``DataFacts.image_fit``)
    source_type: type = Source  # a preset's source class (its options given as a dict in a config)
    tokenizer_use: dict = {}  # ``TokenizerConfig.check_used_by``'s limits for this data

    def __init__(
        self,
        source: Source,
        tokenizer: TokenizerConfig = TokenizerConfig(),
        loader: LoaderConfig = LoaderConfig(batch_size=64, pin_memory=False),
        prepare: PrepareConfig = PrepareConfig(),
        image_size: int = 64,
        channels: int = 3,
        augment: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()  # a preset saves its own, ignoring image_size and channels
        self.source = source if isinstance(source, self.source_type) else as_config(self.source_type, source)
        self.tokenizer_config = as_tokenizer_config(tokenizer, TokenizerConfig())
        self.tokenizer_config.check_used_by(type(self).__name__, **self.tokenizer_use)
        self.loader, self.prepare_config = self.loader_config(loader), as_config(PrepareConfig, prepare)
        if image_size < MIN_SIZE:
            raise ValueError(f"data.image_size={image_size} must be at least {MIN_SIZE} pixels")
        if channels not in (1, 3):
            raise ValueError(f"data.channels={channels} must be 1 (grey) or 3 (RGB)")
        self.image_size, self.channels, self.augment, self.seed = image_size, channels, augment, seed

    def data_facts(self) -> DataFacts:
        tokenizer, manifest = self.tokenizer, self.manifest
        return DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                         image_size=(self.image_size, self.image_size), in_channels=self.channels,
                         image_fit=self.image_fit, normalize_mean=tuple(manifest["mean"]),
                         normalize_std=tuple(manifest["std"]), max_length=manifest["longest"] + 2,
                         class_names=tuple(manifest["class_names"]) if self.labels else None)  # fmt: skip

    def dataset(self, split: str) -> CaptionedImages:
        """A prepared split's images, its shards checked."""
        if split not in self.datasets:
            if not self.manifest["images"].get(split):
                raise DataError(f"data.source: the {split} split holds no image; give it a share of the data")
            self.datasets[split] = CaptionedImages(
                split_location(self.prepared, split), self.tokenizer.to_str(), self.augment and split == "train",
                self.seed, self.channels, cycle=split == "train", labels=self.labels,
            )  # fmt: skip
        return self.datasets[split]

    def _dataloader(self, split: str, shuffle: bool = False) -> DataLoader:
        dataset = self.dataset(split)
        sampler = EpochShuffleSampler(len(dataset), self.seed, with_epoch=True) if shuffle else None
        collate = partial(collate_captions, mean=self.manifest["mean"], std=self.manifest["std"], pad_id=PAD_ID)
        return map_loader(dataset, self.loader, sampler or evaluation_sampler(dataset), shuffle, collate_fn=collate)

    # --- a source's own images: its records fitted to the canvas (the presets prepare theirs in their own way) ---

    def _stem(self) -> str:
        return self.source.stem()

    def _fingerprint(self) -> dict:
        source = {"class": f"{type(self.source).__module__}.{type(self.source).__qualname__}",
                  **self.source.fingerprint()}  # fmt: skip
        return {"format": SOURCE_FORMAT, "source": source, "canvas": [self.image_size, self.channels],
                "tokenizer": _tokenizer_key(self.tokenizer_config, ())}  # fmt: skip

    def _build(self, folder: Path) -> dict:
        """The source's records through ``prepare_captioned``, each input's images read and fitted one at a time."""
        splits = [split for split in SPLITS if split in self.source.splits]
        rows = (
            (split, checked_texts(record, self.source, part, index))
            for split in splits
            for part in self.source.inputs(split)
            for index, record in enumerate(self.source.records(part))
        )
        fitted = partial(source_images, source=self.source, size=self.image_size, channels=self.channels)

        def record_splits(images: dict[str, int]) -> list[RecordSplit]:
            return [RecordSplit(split, self.source.inputs(split), fitted, expected=images[split])
                    for split in splits if images[split]]  # fmt: skip

        name = type(self.source).__name__
        return prepare_captioned(folder, rows, record_splits, self.tokenizer_config, self.prepare_config.num_workers,
                                 f"{name}'s images")  # fmt: skip

    def _splits_of(self, split_items: dict[str, list], records_of: dict[str, partial]):
        workers = self.prepare_config.num_workers

        def record_splits(images: dict[str, int]) -> list[RecordSplit]:
            return [RecordSplit(split, pieces(items, piece_size(len(items), DRAWN_PIECE_IMAGES, workers)),
                                records_of[split], expected=len(items))
                    for split, items in split_items.items() if items]  # fmt: skip

        return record_splits


def checked_texts(record: object, source: Source, part, index: int) -> list[str]:
    """A source's record's texts, the record checked (else a ``DataError`` naming the source, part and record)."""
    texts = record.get("texts") if isinstance(record, dict) else None
    if not (isinstance(texts, list | tuple) and texts and all(isinstance(text, str) for text in texts)
            and isinstance(record.get("image"), str | bytes | Path)):  # fmt: skip
        raise DataError(
            f"data.source: {type(source).__name__}.records({part!r}) gave {record!r:.80} as its record {index}: an "
            'image-text source gives records {"image": a path or the file\'s bytes, "texts": [str, ...]}'
        )
    return list(texts)


def source_images(part, source: Source, size: int, channels: int) -> Iterator[dict]:
    """The records {"image": JPEG, "texts": JSON list} of ``source.records(part)``, each resized to the canvas."""
    for index, record in enumerate(source.records(part)):
        texts, image = checked_texts(record, source, part, index), record["image"]
        try:
            loaded = load_image(io.BytesIO(image) if isinstance(image, bytes) else image, channels)
        except (OSError, ValueError) as error:
            where = "its image's bytes" if isinstance(image, bytes) else str(image)
            raise DataError(f"data.source: {type(source).__name__}.records({part!r}), record {index}: {where}: "
                            f"{error}") from None  # fmt: skip
        yield {"image": jpeg_bytes(fit_image(loaded, size, size, "resize")),
               "texts": json.dumps(texts, ensure_ascii=False)}  # fmt: skip


class ImageTextDataModule(ImageTextData):
    """Printed lines of Austen (or Ding), batches {"images", "tgt", "text"} (docs/data.md, "Printed lines").

    Args:
        source: the lines, their counts, the held-out typefaces (``ImageTextSource``).
        render: the image size and the ranges of every style draw (``RenderConfig``).
        tokenizer: ``file``: a run's ``tokenizer.json``; unset: the Austen LM's, or Ding's characters (kind "char").
        loader: lines per batch, loader workers, pinned memory (``LoaderConfig``).
        prepare: where and with how many processes the lines are rendered (``PrepareConfig``).
        augment: jitter training lines (brightness, contrast, a shift of a pixel or two); never val or test.
        seed: seeds every line's text and style, and the training order.
    """

    counted = "lines"
    source_type = ImageTextSource
    tokenizer_use = {"kinds": ("char",)}

    def __init__(
        self,
        source: ImageTextSource = ImageTextSource(),
        render: RenderConfig = RenderConfig(),
        tokenizer: TokenizerConfig = TokenizerConfig(),
        loader: LoaderConfig = LoaderConfig(batch_size=64, pin_memory=False),
        prepare: PrepareConfig = PrepareConfig(),
        augment: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(source, tokenizer, loader, prepare, channels=1, augment=augment, seed=seed)
        self.save_hyperparameters(ignore=FAMILY_OPTIONS)
        self.render = as_config(RenderConfig, render)
        self.families = split_families(self.source)  # refuses families that are not installed, before any work

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """``tokenizer.file``'s; else Austen's character LM's (no file of the folder), or Ding's ``tokenizer.json``."""
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

    def _stem(self) -> str:
        return f"image-text-{self.source.corpus}"

    # manifest: each split's "lines", "families", "redraws"; "longest" (chars, bytes), "mean", "std", "characters"

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
        return {"format": LINES_FORMAT, **text, "fonts": content_hash(fonts),
                "families": {split: list(f) for split, f in self.families.items()}, "source": source,
                "render": asdict(self.render), "seed": self.seed}  # fmt: skip

    def _build(self, folder: Path) -> dict:
        """Each split's lines rendered in pieces on every core (``prepare_records``); returns the manifest's fields."""
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

    def dataset(self, split: str) -> LineImages:
        """A prepared split's lines ("test": the one ``source.test_fonts`` picks), its shards checked."""
        name = "test_seen" if split == "test" and self.source.test_fonts == "seen" else split
        if name not in self.datasets:
            if not self.manifest["lines"][name]:
                raise ValueError(f"data.source: the {split} split has no lines; set data.source.{split}_lines")
            self.datasets[name] = LineImages(split_location(self.prepared, name), self.tokenizer.to_str(),
                                             augment=self.augment and name == "train", seed=self.seed)  # fmt: skip
        return self.datasets[name]


FILES_FORMAT = 2  # bump when what a prepared folder holds changes meaning (2: images as litdata File leaves)
FILES_PIECE_IMAGES = 500  # images per piece a preparing process fits and writes before taking the next


def written_texts(folder: Path, rows: Iterable[tuple[str, list[str]]]) -> tuple[dict[str, Path], dict, dict]:
    """(split, an image's texts) rows written to ``<folder>/.texts-<split>.jsonl``: the files, images and texts."""
    files = {split: folder / f".texts-{split}.jsonl" for split in SPLITS}
    images, texts = dict.fromkeys(SPLITS, 0), dict.fromkeys(SPLITS, 0)
    with contextlib.ExitStack() as stack:
        handles = {split: stack.enter_context(open(path, "w", encoding="utf-8")) for split, path in files.items()}
        for split, image_texts in rows:
            handles[split].writelines(json.dumps({"text": t}) + "\n" for t in image_texts)
            images[split] += 1
            texts[split] += len(image_texts)
    return files, images, texts


def longest_text(tokenizer, files: Iterable[Path]) -> int:
    """The most tokens of any text of the ``.texts-*.jsonl`` files, encoded 1,024 at a time (never all held)."""
    longest = 0
    for path in files:
        with open(path, encoding="utf-8") as f:
            while batch := [json.loads(line)["text"] for line in [f.readline() for _ in range(1024)] if line]:
                longest = max(longest, *map(len, tokenizer.encode_batch(batch)))
    return longest


def prepare_captioned(
    folder: Path,
    rows: Iterable[tuple[str, list[str]]],
    record_splits: Callable[[dict[str, int]], list[RecordSplit]],
    tokenizer_config: TokenizerConfig,
    workers: int | None,
    what: str,
) -> dict:
    """A folder of captioned images through ``prepare_records``; returns the manifest's counts and statistics."""
    files, images, texts = written_texts(folder, rows)
    text_pieces = {split: line_pieces(path) if images[split] else [] for split, path in files.items()}
    job = TokenizerJob(TOKENIZER, tokenizer_config, piece_sample(text_pieces, "text", tokenizer_config.sample_bytes))
    tokenizers, _ = prepare_records(folder, [job], lambda _: record_splits(images), ("texts",), workers)
    longest = longest_text(tokenizers[TOKENIZER], [files[split] for split in SPLITS if images[split]])
    for path in files.values():
        path.unlink()
    mean, std = pixel_statistics(folder / "train", images["train"])
    rank_zero_info(f"prepared {what}: {folder} ({', '.join(f'{s} {n:,}' for s, n in images.items())})")
    return {"images": images, "texts": texts, "mean": mean, "std": std, "longest": longest}


class ImageTextFilesDataModule(ImageTextData):
    """A user's own images and texts, annotations or webdataset shards (docs/data.md, "Captioned images of one's own").

    Args:
        source: the annotation files, the image folder and the canvas (``ImageTextFiles``).
        tokenizer: a tokenizer file, or the kind trained on the texts (``TokenizerConfig``; default: characters).
        loader: images per batch, loader workers, pinned memory (``LoaderConfig``).
        prepare: where and with how many processes the images are prepared (``PrepareConfig``).
        augment: jitter training images (brightness, contrast, a shift of a pixel or two); never val or test.
        seed: seeds the training order, jitter and which text of an image each epoch trains on.
    """

    source_type = ImageTextFiles

    def __init__(
        self,
        source: ImageTextFiles,
        tokenizer: TokenizerConfig = TokenizerConfig(),
        loader: LoaderConfig = LoaderConfig(batch_size=64, pin_memory=False),
        prepare: PrepareConfig = PrepareConfig(),
        augment: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(source, tokenizer, loader, prepare, channels=as_config(ImageTextFiles, source).channels,
                         augment=augment, seed=seed)  # fmt: skip
        self.save_hyperparameters(ignore=FAMILY_OPTIONS)

    def data_facts(self) -> DataFacts:
        tokenizer, manifest = self.tokenizer, self.manifest
        return DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                         image_size=(self.source.height, self.source.width), in_channels=self.source.channels,
                         image_fit=self.source.fit,
                         normalize_mean=tuple(manifest["mean"]), normalize_std=tuple(manifest["std"]),
                         max_length=manifest["longest"] + 2)  # fmt: skip

    def _stem(self) -> str:
        return f"image-text-{stem_of([Path(self.source.train)])}"

    def splits(self) -> dict[str, list[Entry]]:
        """Each split's images and texts from the annotation files (val carved from train when not given)."""
        s = self.source
        splits = {split: read_annotations(Path(getattr(s, split)), s.images, split, s.max_tokens)
                  if getattr(s, split) and not is_shards(getattr(s, split)) else [] for split in SPLITS}  # fmt: skip
        if not s.val and s.val_fraction and not is_shards(s.train):
            train = splits["train"]
            splits["val"] = [entry for entry in train if carved(entry.name, s.val_fraction)]
            splits["train"] = [entry for entry in train if not carved(entry.name, s.val_fraction)]
            if not splits["val"] or not splits["train"]:
                raise DataError(
                    f"data.source.val_fraction={s.val_fraction} carves {len(splits['val'])} of the {len(train)} "
                    "training images for validation: give more images, a data.source.val file, or another fraction "
                    "(0: no validation)"
                )
        return splits

    def shards(self) -> dict[str, list[Path]]:
        s = self.source
        return {split: shard_files(getattr(s, split), split) for split in SPLITS
                if getattr(s, split) and is_shards(getattr(s, split))}  # fmt: skip

    def _carves_shards(self) -> bool:
        """Whether validation is carved from the training shards (by the hash of each sample's key)."""
        return not self.source.val and bool(self.source.val_fraction) and is_shards(self.source.train)

    def _fingerprint(self) -> dict:
        """The annotation files' contents, each image's and shard's path, size and time, the options, the tokenizer."""
        self._entries = splits = self.splits()  # read once: what ``_build`` prepares
        self._shards = shards = self.shards()
        annotations = {split: sha256_of(getattr(self.source, split)) for split in SPLITS
                       if getattr(self.source, split) and split not in shards}  # fmt: skip
        images = hashlib.sha256()
        for split in SPLITS:
            for entry in splits[split]:
                images.update(json.dumps([split, *file_stamp(Path(entry.path))]).encode())
        stamps = {"shards": {split: [file_stamp(path) for path in paths] for split, paths in shards.items()}}
        return {"format": FILES_FORMAT, "annotations": annotations, "images": images.hexdigest(),
                **(stamps if shards else {}), "source": source_key(self.source),
                "tokenizer": _tokenizer_key(self.tokenizer_config, ())}  # fmt: skip

    def _rows(self) -> Iterator[tuple[str, list[str]]]:
        """(split, an image's texts) of every image: the annotations' entries, then the shards' samples (streamed)."""
        for split in SPLITS:
            for entry in self._entries[split]:
                yield split, entry.texts
        carve, fraction = self._carves_shards(), self.source.val_fraction
        for split, paths in self._shards.items():
            for path in paths:
                for key, _, caption in shard_samples(path, split, images=False, max_tokens=self.source.max_tokens):
                    yield ("val" if carve and split == "train" and carved(key, fraction) else split), [caption]

    def _build(self, folder: Path) -> dict:
        """Through ``prepare_captioned``: each split's records in pieces (of images; a shard a piece) on every core."""
        splits, shards, workers = self._entries, self._shards, self.prepare_config.num_workers
        carve = self._carves_shards()

        def record_splits(images: dict[str, int]) -> list[RecordSplit]:
            if carve and not (images["val"] and images["train"]):
                raise DataError(
                    f"data.source.val_fraction={self.source.val_fraction} carves {images['val']} of the "
                    f"{images['val'] + images['train']} training images of the shards for validation: give more "
                    "images, a data.source.val, or another fraction (0: no validation)"
                )
            out = []
            for split, entries in splits.items():
                if entries:
                    records = partial(image_records, source=self.source, annotation=self._annotation(split))
                    size = piece_size(len(entries), FILES_PIECE_IMAGES, workers)
                    out.append(RecordSplit(split, pieces(entries, size),
                                           records, expected=len(entries)))  # fmt: skip
                elif images[split] and (split in shards or carve and split == "val"):
                    field = split if split in shards else "train"
                    keep = ("train" if split == "train" else "val") if carve and field == "train" else None
                    out.append(RecordSplit(split, [str(path) for path in shards[field]],
                                           partial(shard_records, field=field, keep=keep,
                                                   fraction=self.source.val_fraction, source=self.source),
                                           expected=images[split]))  # fmt: skip
            return out

        return prepare_captioned(folder, self._rows(), record_splits, self.tokenizer_config, workers,
                                 "image-text files")  # fmt: skip

    def _annotation(self, split: str) -> str:
        """The option and annotation file a split's images come from (val's: train's, when carved), for errors."""
        return f"data.source.{split}: {getattr(self.source, split) or self.source.train}"

    def dataset(self, split: str) -> CaptionedImages:
        if split not in self.datasets:
            if not self.manifest["images"][split]:
                raise DataError(f"data.source: there is no {split} split; give data.source.{split}")
            self.datasets[split] = CaptionedImages(
                split_location(self.prepared, split), self.tokenizer.to_str(), self.augment and split == "train",
                self.seed, self.source.channels, cycle=split == "train",
            )  # fmt: skip
        return self.datasets[split]


DRAWN_FORMAT = 1  # bump when what a prepared folder holds, or how an image is drawn, changes meaning
DRAWN_PIECE_IMAGES = 250  # images per piece a preparing process fits and writes before taking the next


class ClipArtDataModule(ImageTextData):
    """The Open Clip Art Library's drawings and their captions, for a contrastive image-text model; "labels": the
    top-level category's index in ``class_names`` or -1 (docs/data.md, "Captioned images").

    Args:
        source: the library's folder, the canvas, the split's fractions, the captions' length (``ClipArtSource``).
        tokenizer: a tokenizer file, or the kind trained on the captions (``TokenizerConfig``; default characters).
        loader: images per batch, loader workers, pinned memory (``LoaderConfig``).
        prepare: where and with how many processes the drawings are prepared (``PrepareConfig``).
        augment: jitter training images (brightness, contrast, a shift of a pixel or two); never val or test.
        seed: seeds the training order, jitter and which caption of a drawing each epoch trains on.
    """

    labels, image_fit, source_type = True, "drawing", ClipArtSource

    def __init__(
        self,
        source: ClipArtSource = ClipArtSource(),
        tokenizer: TokenizerConfig = TokenizerConfig(),
        loader: LoaderConfig = LoaderConfig(batch_size=64, pin_memory=False),
        prepare: PrepareConfig = PrepareConfig(),
        augment: bool = True,
        seed: int = 0,
    ) -> None:
        size = as_config(ClipArtSource, source).image_size
        super().__init__(source, tokenizer, loader, prepare, size, augment=augment, seed=seed)
        self.save_hyperparameters(ignore=FAMILY_OPTIONS)
        root = Path(self.source.root)
        if not ((root / "png").is_dir() and (root / "svg").is_dir()):
            raise DataError(f"data.source.root={self.source.root!r} does not hold the Open Clip Art Library's png/ and "
                            "svg/ folders: apt-get install openclipart-png openclipart-svg, or point it at a folder "
                            "where they are unpacked")  # fmt: skip

    def _stem(self) -> str:
        return "clipart"

    def _fingerprint(self) -> dict:
        """Each PNG's and SVG's path, size and modification time, the options, the tokenizer."""
        self._names = openclipart.drawing_names(self.source.root)
        if not self._names:
            raise DataError(f"data.source.root={self.source.root!r}: its png/ folder holds no drawing")
        stamps = hashlib.sha256()
        root = Path(self.source.root)
        for name in self._names:
            for kind in ("png", "svg"):
                stamps.update(json.dumps(file_stamp(root / kind / f"{name}.{kind}")[1:] + [name, kind]).encode())
        source = {k: v for k, v in asdict(self.source).items() if k != "root"}
        return {"format": DRAWN_FORMAT, "files": stamps.hexdigest(), "source": source,
                "excluded": sorted(openclipart.EXCLUDED_CATEGORIES),
                "tokenizer": _tokenizer_key(self.tokenizer_config, ())}  # fmt: skip

    def _build(self, folder: Path) -> dict:
        """Captions read, split by variant, labelled; PNGs fitted in pieces on every core (``prepare_captioned``)."""
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


class EmojiDataModule(ImageTextData):
    """Emoji named by Unicode in two styles, training in one and val and test in the other, for a contrastive model;
    "labels": each emoji's index in ``class_names`` (docs/data.md, "Captioned images").

    Args:
        source: the fonts, the style held out, the canvas (``EmojiSource``).
        tokenizer: a tokenizer file, or the kind trained on the names (``TokenizerConfig``; default characters).
        loader: images per batch, loader workers, pinned memory (``LoaderConfig``).
        prepare: where and with how many processes the emoji are drawn (``PrepareConfig``).
        augment: jitter training images (brightness, contrast, a shift of a pixel or two); never val or test.
        seed: seeds the training order and jitter.
    """

    labels, image_fit, source_type = True, "drawing", EmojiSource

    def __init__(
        self,
        source: EmojiSource = EmojiSource(),
        tokenizer: TokenizerConfig = TokenizerConfig(),
        loader: LoaderConfig = LoaderConfig(batch_size=64, pin_memory=False),
        prepare: PrepareConfig = PrepareConfig(),
        augment: bool = True,
        seed: int = 0,
    ) -> None:
        size = as_config(EmojiSource, source).image_size
        super().__init__(source, tokenizer, loader, prepare, size, augment=augment, seed=seed)
        self.save_hyperparameters(ignore=FAMILY_OPTIONS)
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
        """The fonts (paths and sizes), the options, the tokenizer."""
        fonts = {style: [path, Path(path).stat().st_size] for style, path in self.fonts().items()}
        return {"format": DRAWN_FORMAT, "fonts": content_hash(fonts), "source": asdict(self.source),
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
