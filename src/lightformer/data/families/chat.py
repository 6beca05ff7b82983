"""The conversation family ``ChatData`` and its presets ``VisualQADataModule``, ``ConversationFilesDataModule``."""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from functools import cached_property, partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from lightformer.config_groups import as_config
from lightformer.data.loading.pictures import QARecords, channel_statistics, collate_qa
from lightformer.data.loading.sampling import CanvasBatchSampler, map_loader
from lightformer.data.loading.streaming import LoaderConfig
from lightformer.data.module import DataModule
from lightformer.data.objectives.chat import ChatTemplate
from lightformer.data.pieces import SPLITS
from lightformer.data.preparation.caching import content_hash, file_stamp, preparing
from lightformer.data.preparation.prepare import (
    TOKENIZER,
    PrepareConfig,
    TokenizerConfig,
    _tokenizer_key,
    as_tokenizer_config,
    check_unknown_characters,
    piece_size,
    pieces,
    split_location,
)
from lightformer.data.preparation.records import RecordSplit, TokenizerJob, prepare_records
from lightformer.data.sources import emoji, openclipart
from lightformer.data.sources.captions import carved, source_key
from lightformer.data.sources.conversations import (
    ConversationFiles,
    conversation_records,
    piece_entries,
    read_pieces,
    turns_of,
)
from lightformer.data.sources.corpora import (
    DEBIAN_FASHION_MNIST_DIR,
    MNIST_RAW_FILES,
    austen_text,
    install_debian_fashion_mnist,
)
from lightformer.data.sources.lines import (
    LineDrawer,
    RenderConfig,
    austen_char_tokenizer,
    split_families,
    split_sentences,
)
from lightformer.data.sources.questions import (
    CANVAS_OF,
    KEYWORDS,
    LINE_HEIGHT,
    PIECE_IMAGES,
    QUESTIONS,
    Unit,
    VisualQASource,
    garments,
    qa_records,
)
from lightformer.data.sources.rendering import typefaces
from lightformer.errors import DataError
from lightformer.facts import DataFacts
from lightformer.tokenization.text import PAD_ID, Tokenizer


class ChatData(DataModule):
    """Question-answer records of images laid out by a chat template, batches of one canvas (docs/data.md).

    Args:
        loader: records per batch, loader workers, pinned memory (``LoaderConfig``).
        prepare: where and with how many processes the records are prepared (``PrepareConfig``).
        augment: jitter training images; never val or test.
        seed: seeds the training order and jitter.
    """

    counted = "records"
    template: ChatTemplate
    tokenizer: object

    def __init__(self, loader: LoaderConfig, prepare: PrepareConfig, augment: bool, seed: int) -> None:
        super().__init__()
        self.loader, self.prepare_config = self.loader_config(loader), as_config(PrepareConfig, prepare)
        self.augment, self.seed = augment, seed

    def canvases_of(self, split: str) -> np.ndarray:
        """Each record's canvas index (uint8): all a sampler holds per record."""
        runs = self.manifest["runs"][split]
        return np.repeat(np.asarray([c for c, _ in runs], np.uint8), [n for _, n in runs])

    def dataset(self, split: str) -> QARecords:
        """A prepared split's records, its shards checked."""
        if split not in self.datasets:
            if not self.manifest["records"][split]:
                raise DataError(f"data.source: the {split} split holds no record; give it images")
            self.datasets[split] = QARecords(split_location(self.prepared, split), self.tokenizer.to_str(),
                                             self.template, self.augment and split == "train", self.seed)  # fmt: skip
        return self.datasets[split]

    def _dataloader(self, split: str, shuffle: bool = False):
        dataset = self.dataset(split)
        sampler = CanvasBatchSampler(self.canvases_of(split), self.loader.batch_size, shuffle, self.seed,
                                     with_epoch=shuffle)  # fmt: skip
        collate = partial(collate_qa, mean=self.manifest["mean"], std=self.manifest["std"], pad_id=PAD_ID)
        return map_loader(dataset, self.loader, resumable=shuffle, batch_sampler=sampler, collate_fn=collate)


CONVERSATIONS_FORMAT = 1  # bump when what a prepared folder holds, or how an image is fitted, changes meaning
GROUP = "files/answer/held-out"


class ConversationFilesDataModule(ChatData):
    """A user's images and LLaVA conversations, for a vision-language model: one canvas, one group.

    Args:
        source: the files, the image folder, the canvas (``ConversationFiles``).
        tokenizer: ``file``: the language model run's ``tokenizer.json``; unset: trained on the conversations.
        template: the chat template (``ChatTemplate``), stored in the facts.
        loader: records per batch, loader workers, pinned memory (``LoaderConfig``).
        prepare: where and with how many processes the records are prepared (``PrepareConfig``).
        augment: jitter training images; never val or test.
        seed: seeds the training order and jitter.
    """

    def __init__(
        self,
        source: ConversationFiles,
        tokenizer: TokenizerConfig = TokenizerConfig(),
        template: ChatTemplate = ChatTemplate(),
        loader: LoaderConfig = LoaderConfig(batch_size=32, pin_memory=False),
        prepare: PrepareConfig = PrepareConfig(),
        augment: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__(loader, prepare, augment, seed)
        self.save_hyperparameters()
        self.source, self.template = as_config(ConversationFiles, source), as_config(ChatTemplate, template)
        self.tokenizer_config = as_tokenizer_config(tokenizer, TokenizerConfig())

    def data_facts(self) -> DataFacts:
        tokenizer, manifest, s = self.tokenizer, self.manifest, self.source
        return DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                         image_size=(s.image_size, s.image_size), in_channels=3, image_fit=s.fit,
                         normalize_mean=tuple(manifest["mean"]), normalize_std=tuple(manifest["std"]),
                         max_length=manifest["longest"], chat_template=self.template.as_dict(), groups=(GROUP,),
                         canvases={s.fit: [s.image_size, s.image_size]})  # fmt: skip

    def _stem(self) -> str:
        return "conversations"

    def _files(self) -> dict[str, tuple[Path, str, str | None]]:
        """Each split's (file, field, which part of it it keeps)."""
        s = self.source
        carve = s.val is None and s.val_fraction > 0
        files = {"train": (Path(s.train), "train", "train" if carve else None)}
        if s.val is not None or carve:
            files["val"] = (Path(s.val), "val", None) if s.val is not None else (Path(s.train), "train", "val")
        if s.test is not None:
            files["test"] = (Path(s.test), "test", None)
        return files

    def _fingerprint(self) -> dict:
        """The files (paths, sizes, times; they name the images), the options, the tokenizer, the template."""
        stamps = {split: file_stamp(path) if path.is_file() else str(path) for split, (path, _, _) in
                  self._files().items()}  # fmt: skip
        tokenizer = _tokenizer_key(self.tokenizer_config, ())
        return {"format": CONVERSATIONS_FORMAT, "files": stamps, "source": source_key(self.source),
                "tokenizer": tokenizer, "template": self.template.as_dict()}  # fmt: skip

    def _build(self, folder: Path) -> dict:
        """The tokenizer loaded or trained; each split's pieces read, checked and fitted on every core."""
        files = self._files()
        split_pieces = {split: read_pieces(path, field, self.source.max_tokens) for split, (path, field, _) in
                        files.items()}  # fmt: skip

        def sample(splits: tuple[str, ...]):
            for split in splits:
                for piece in split_pieces.get(split, []):
                    for where, record in piece_entries(piece, files[split][1]):
                        for question, answer in turns_of(record, where, self.source.max_tokens):
                            yield question.replace(self.template.image, "")
                            yield answer
            yield self.template.user + self.template.assistant

        jobs = [TokenizerJob(TOKENIZER, self.tokenizer_config, sample, what="a tokenizer of the conversations")]

        def splits(tokenizers: dict[str, str]) -> list[RecordSplit]:
            return [RecordSplit(split, split_pieces[split],
                                partial(conversation_records, field=field, keep=keep, source=self.source,
                                        template=self.template, tokenizer_json=tokenizers[TOKENIZER]))
                    for split, (_, field, keep) in files.items()]  # fmt: skip

        _, parts = prepare_records(folder, jobs, splits, ("turns",), self.prepare_config.num_workers,
                                   maxima=("longest",))  # fmt: skip
        records = {split: parts.get(split, {}).get("records", 0) for split in SPLITS}
        if not records["train"]:
            raise DataError(f"data.source.train: {self.source.train} holds no training record")
        mean, std = channel_statistics(folder / "train", records["train"])
        longest = max(part.get("longest", 0) for part in parts.values())
        runs = {split: [[0, n]] if n else [] for split, n in records.items()}  # one canvas
        return {"records": records, "runs": runs, "mean": mean, "std": std, "longest": longest}


QUESTIONS_FORMAT = 3  # bump when what a prepared folder holds, or how an image is drawn, changes meaning


class VisualQADataModule(ChatData):
    """Questions and answers about what the offline sources' images show, for a vision-language model.

    Args:
        source: the sources, images per source, canvases, lines and typefaces (``VisualQASource``).
        tokenizer: ``file``: a run's ``tokenizer.json``; unset: the Austen character LM's (``TokenizerConfig``).
        template: the chat template (``ChatTemplate``), stored in the facts.
        loader: records per batch, loader workers, pinned memory (``LoaderConfig``).
        prepare: where and with how many processes the images are drawn (``PrepareConfig``).
        augment: jitter training images (brightness, contrast, a shift of a pixel or two); never val or test.
        seed: seeds the lines, the word asked for, the training order and jitter.
    """

    def __init__(
        self,
        source: VisualQASource = VisualQASource(),
        tokenizer: TokenizerConfig = TokenizerConfig(),
        template: ChatTemplate = ChatTemplate(),
        loader: LoaderConfig = LoaderConfig(batch_size=64, pin_memory=False),
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
        """The drawings' and fonts' files, the text, the options, the seed, the tokenizer and the template."""
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
        return {"format": QUESTIONS_FORMAT, "files": content_hash(files), "source": asdict(s), "seed": self.seed,
                "families": {split: list(f) for split, f in self.families.items()},
                "tokenizer": content_hash(self.tokenizer.to_str()), "template": self.template.as_dict()}  # fmt: skip

    def _clipart_units(self, index: dict[str, int]) -> dict[str, list[tuple[str, list]]]:
        """Each split's drawings with their questions; the seen ones added to val and test."""
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
        """``found`` with ``seen`` of its training items, evenly spaced over them, added to val and test."""
        train, count = found["train"], self.source.seen
        seen = train[:: max(1, len(train) // count)][:count] if count else []
        for split in ("val", "test"):
            found[split] = found[split] + seen
        return found

    def _build(self, folder: Path) -> dict:
        """Each source's units of each split drawn in pieces on every core; returns the manifest's fields."""
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
