"""Image-to-text data of printed lines (``ImageTextDataModule``): the source is ``sources.lines``."""

from __future__ import annotations

import os
from dataclasses import asdict
from functools import cached_property, partial
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from lightformer.config_groups import as_config
from lightformer.data.loading.pictures import LineImages, collate_lines, pixel_statistics
from lightformer.data.loading.sampling import EpochShuffleSampler, evaluation_sampler, map_loader
from lightformer.data.loading.streaming import ImageLoaderConfig
from lightformer.data.module import DataModule
from lightformer.data.pieces import stage_splits
from lightformer.data.preparation.caching import content_hash, preparing
from lightformer.data.preparation.prepare import (
    TOKENIZER,
    PrepareConfig,
    TokenizerConfig,
    as_tokenizer_config,
    piece_size,
    pieces,
    split_location,
)
from lightformer.data.preparation.records import RecordSplit, TokenizerJob, prepare_records
from lightformer.data.sources.corpora import (
    austen_text,
    ding_dictionary,
)
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
from lightformer.data.sources.rendering import (
    typefaces,
)
from lightformer.facts import DataFacts
from lightformer.io.files import sha256_of
from lightformer.tokenization.text import PAD_ID, Tokenizer

# bump when what a prepared folder holds, or how a line is drawn, changes meaning (2: images as litdata File leaves)
FORMAT_VERSION = 2


# --- options ---------------------------------------------------------------------------------------------------


# --- text and fonts --------------------------------------------------------------------------------------------


# --- loading ---------------------------------------------------------------------------------------------------


# --- the data modules ------------------------------------------------------------------------------------------


class ImageTextRecords(DataModule):
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
