"""Image-to-text data of a user's own images and texts (``ImageTextFilesDataModule``): the source is
``sources.captions``."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_info

from lightformer.config_groups import as_config
from lightformer.data.loading.pictures import CaptionedImages, pixel_statistics
from lightformer.data.loading.streaming import ImageLoaderConfig
from lightformer.data.modules.image_text import ImageTextRecords
from lightformer.data.pieces import SPLITS, line_pieces
from lightformer.data.preparation.caching import file_stamp
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
from lightformer.errors import DataError
from lightformer.facts import DataFacts
from lightformer.io.files import sha256_of

FORMAT_VERSION = 2  # bump when what a prepared folder holds changes meaning (2: images as litdata File leaves)
PIECE_IMAGES = 500  # images per piece a preparing process fits and writes before taking the next


# --- reading the annotations -----------------------------------------------------------------------------------


# --- webdataset shards ----------------------------------------------------------------------------------------


# --- preparation and loading -----------------------------------------------------------------------------------


def written_texts(folder: Path, rows: Iterable[tuple[str, list[str]]]) -> tuple[dict[str, Path], dict, dict]:
    """Each split's texts written to ``<folder>/.texts-<split>.jsonl`` ({"text"} a line) from (split, an image's
    texts) rows read once; returns the files and each split's images and texts counted."""
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
    """A folder of captioned images through ``prepare_records``: the texts of ``rows`` ((split, an image's texts),
    read once) written to disk and sampled for the tokenizer, each split of ``record_splits(images counted)`` written
    on every core, then the longest text and the train pixels' statistics. Returns the manifest's {"images",
    "texts", "mean", "std", "longest"}."""
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


class ImageTextFilesDataModule(ImageTextRecords):
    """A user's own images and texts for an image-to-text model: batches {"images": (B, C, H, W) float32
    normalised, "tgt": (B, T) int64 [BOS] ids [EOS] padded with PAD, "text": B strings, "references": each image's
    texts}. See the module docstring for the layouts, splits, preparation and loading; ``data_facts()`` (after
    preparation) tells the model the tokenizer, the canvas (H, W), the channels, each channel's mean and std, and the
    longest ``tgt``.

    Args:
        source: the annotation files, the image folder and the canvas (``ImageTextFiles``).
        tokenizer: a tokenizer file, or the kind trained on the texts (``TokenizerConfig``; default: characters).
        loader: images per batch, loader workers, pinned memory (``ImageLoaderConfig``).
        prepare: where and with how many processes the images are prepared (``PrepareConfig``).
        augment: jitter training images (brightness, contrast, a shift of a pixel or two); never val or test.
        seed: seeds the training order, jitter and which text of an image each epoch trains on.
    """

    counted = "images"

    def __init__(
        self,
        source: ImageTextFiles,
        tokenizer: TokenizerConfig = TokenizerConfig(),
        loader: ImageLoaderConfig = ImageLoaderConfig(batch_size=64),
        prepare: PrepareConfig = PrepareConfig(),
        augment: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(loader, prepare, augment, seed)
        self.save_hyperparameters()
        self.source = as_config(ImageTextFiles, source)
        self.tokenizer_config = as_tokenizer_config(tokenizer, TokenizerConfig())
        self.tokenizer_config.check_used_by("ImageTextFilesDataModule")

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
        """Each split's images and texts, read from the annotation files (val carved from train when not given); a
        split of webdataset shards has none here (``shards``)."""
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
        """The webdataset shards of each split given as shards (``shard_files``)."""
        s = self.source
        return {split: shard_files(getattr(s, split), split) for split in SPLITS
                if getattr(s, split) and is_shards(getattr(s, split))}  # fmt: skip

    def _carves_shards(self) -> bool:
        """Whether validation is carved from the training shards (by the hash of each sample's key)."""
        return not self.source.val and bool(self.source.val_fraction) and is_shards(self.source.train)

    def _fingerprint(self) -> dict:
        """What the records depend on: the annotation files' contents, each image's path, size and modification
        time (hashed as they are read: not held), each shard's path, size and modification time, the options, the
        tokenizer's."""
        self._entries = splits = self.splits()  # read once: what ``_build`` prepares
        self._shards = shards = self.shards()
        annotations = {split: sha256_of(getattr(self.source, split)) for split in SPLITS
                       if getattr(self.source, split) and split not in shards}  # fmt: skip
        images = hashlib.sha256()
        for split in SPLITS:
            for entry in splits[split]:
                images.update(json.dumps([split, *file_stamp(Path(entry.path))]).encode())
        stamps = {"shards": {split: [file_stamp(path) for path in paths] for split, paths in shards.items()}}
        return {"format": FORMAT_VERSION, "annotations": annotations, "images": images.hexdigest(),
                **(stamps if shards else {}), "source": source_key(self.source),
                "tokenizer": _tokenizer_key(self.tokenizer_config, ())}  # fmt: skip

    def _rows(self) -> Iterator[tuple[str, list[str]]]:
        """(split, an image's texts) of every image: the annotations' entries, then the shards' samples, read as a
        stream (the carved ones as val)."""
        for split in SPLITS:
            for entry in self._entries[split]:
                yield split, entry.texts
        carve, fraction = self._carves_shards(), self.source.val_fraction
        for split, paths in self._shards.items():
            for path in paths:
                for key, _, caption in shard_samples(path, split, images=False, max_tokens=self.source.max_tokens):
                    yield ("val" if carve and split == "train" and carved(key, fraction) else split), [caption]

    def _build(self, folder: Path) -> dict:
        """``prepared_folder``'s build through ``prepare_captioned``: the tokenizer, each split's records in pieces
        (of images; of shards, one a piece) on every core; then the train pixels' statistics, the longest text; what
        it returns goes into the manifest."""
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
                    out.append(RecordSplit(split, pieces(entries, piece_size(len(entries), PIECE_IMAGES, workers)),
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
        """A prepared split's images, its shards checked."""
        if split not in self.datasets:
            if not self.manifest["images"][split]:
                raise DataError(f"data.source: there is no {split} split; give data.source.{split}")
            self.datasets[split] = CaptionedImages(
                split_location(self.prepared, split), self.tokenizer.to_str(), self.augment and split == "train",
                self.seed, self.source.channels, cycle=split == "train",
            )  # fmt: skip
        return self.datasets[split]
