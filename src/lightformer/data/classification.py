"""Text classification data: labelled texts → [CLS] text [SEP] token ids → padded batches with their labels.

The flow, with the expensive steps cached under `cache_dir` (atomic writes, so DDP ranks and parallel tests can
build the same cache at once):

    Austen's novels / TSV files ──passages, split──> train | val | test (text, label) examples (JSON)
        ──byte-level BPE (trained on train only, or a tokenizer file)──> ids ──> padded batches

**Austen: which novel is this passage from?** (`corpus="austen"`, six classes named as in
``corpora.AUSTEN_NOVELS``). ``austen.txt`` (``corpora.austen_text``) is cut into its six novels at their title lines,
and each novel into passages:

1. The novel's body runs from its first chapter heading (a line starting with "Chapter", any case) to its end mark
   (a line "THE END" or "FINIS") or an editor's "A NOTE ON THE TEXT", so title pages, the author's advertisement
   and editors' notes are left out.
2. Paragraphs are the blocks between blank lines, their line breaks and runs of spaces made single spaces.
   Headings are dropped: paragraphs that start with "Chapter" or "Volume" or have no lower-case letter.
3. Sentences: a paragraph is cut after each ".", "!" or "?" (and any closing quotes, brackets or "_" right after
   it) that is followed by whitespace, except after the abbreviations Mr., Mrs., Dr., St. and Messrs. A paragraph's
   end always ends a sentence. Fragments of fewer than three words ("Yes.", "* * *") are dropped.
4. Passages: `passage_sentences` consecutive sentences (across paragraph and chapter breaks); an incomplete last
   group is dropped.
5. Each novel is split BY POSITION: its first 80% of passages train, the next 10% validate, the last 10% test
   (``floor`` of 80% and 90% of the count). No passage straddles two splits and test is later text than train,
   so the classifier cannot score by remembering the neighbouring sentences of a test passage. With three
   sentences per passage: 10,485 passages, 8,385 train, 1,048 val, 1,052 test.

**TSV files** (`tsv_files`, with `corpus: null`): "text<TAB>label" lines, UTF-8; the label is what follows the
LAST tab (a text may hold tabs), both stripped; blank lines are skipped. The classes are the labels of
`tsv_files` (two or more), sorted; a val or test line with another label is an error. Without `val_tsv_files` /
`test_tsv_files`, the train lines are split by a hash of their text (``corpora.split_of``: md5 buckets, 5% test,
5% val), so a text never appears in two splits and keeps its split when the file grows.

**Tokenizer**: `tokenizer_file` (e.g. the `tokenizer.json` a masked-LM pretraining run wrote), or a byte-level BPE
of `bpe_vocab_size` tokens trained on the train texts with the same extra special tokens as the pretraining data
(MASK, then 100 T5 sentinels), so that a classifier from scratch and one fine-tuned from a pretraining run have the
same vocabulary size and special ids.

Its length is two sources of labelled text (Austen's novels cut into passages, TSV files) beside the data
module and the checks of its options.
"""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset

from lightformer.data.caching import cached, content_hash, file_stamp, preparing, write_json, write_tokenizer
from lightformer.data.corpora import AUSTEN_NOVELS, austen_text, split_austen_text, split_of
from lightformer.data.sampling import EpochShuffleSampler, evaluation_sampler
from lightformer.data.sequences import PackedSequences
from lightformer.data.tokenizers import MASK, MIN_BPE_VOCAB_SIZE, PAD_ID, Tokenizer, sentinel
from lightformer.files import as_list, expand_patterns, read_lines, read_utf8, sha256_of

SPLITS = ("train", "val", "test")
_PREFIX = {"train": "", "val": "val_", "test": "test_"}  # of each split's option: tsv_files, val_tsv_files, ...
# The special tokens a BERT / T5 pretraining run's BPE is trained with (after PAD, BOS = [CLS], EOS = [SEP], UNK).
EXTRA_SPECIAL_TOKENS = (MASK, *(sentinel(i) for i in range(100)))
MIN_VOCAB_SIZE = MIN_BPE_VOCAB_SIZE + len(EXTRA_SPECIAL_TOKENS)
TRAIN_SHARE, VAL_SHARE = 0.8, 0.1  # of each novel's passages, in order: train, val, then test
# Bump when the cached examples' or tokenizers' meaning changes (passage or split rules), so old caches are unused.
_CACHE_FORMAT_VERSION = 1

Example = tuple[str, int, int]  # (text, class index, position: the passage's index in its novel, or line number)

_CHAPTER = re.compile(r"^chapter\b", re.IGNORECASE)
_HEADING = re.compile(r"^(?:chapter|volume)\b", re.IGNORECASE)
_END_MARK = re.compile(r"^(?:the end|finis|a note on the text)$", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?]['\"’”)\]_]*(?=\s)")
_ABBREVIATION = re.compile(r"\b(?:Mr|Mrs|Dr|St|Messrs)\.$")
MIN_SENTENCE_WORDS = 3


# --- Austen passages -------------------------------------------------------------------------------------------


def split_sentences(paragraph: str) -> list[str]:
    """A paragraph's sentences by the rule of the module docstring (step 3), short fragments included."""
    text = " ".join(paragraph.split())
    sentences, start = [], 0
    for end in _SENTENCE_END.finditer(text):
        sentence = text[start : end.end()].strip()
        if sentence and not _ABBREVIATION.search(sentence):  # "Mr. Darcy": an abbreviation ends no sentence
            sentences.append(sentence)
            start = end.end()
    if text[start:].strip():
        sentences.append(text[start:].strip())
    return sentences


def novel_sentences(novel: str) -> list[str]:
    """The sentences of a novel's body, headings and fragments of fewer than three words dropped (steps 1-3)."""
    lines = novel.split("\n")
    first = next((i for i, line in enumerate(lines) if _CHAPTER.match(line.strip())), 0)
    last = next((i for i in range(first, len(lines)) if _END_MARK.match(lines[i].strip())), len(lines))
    sentences = []
    for paragraph in re.split(r"\n[ \t]*\n", "\n".join(lines[first:last])):
        paragraph = " ".join(paragraph.split())
        if not paragraph or _HEADING.match(paragraph) or not re.search("[a-z]", paragraph):
            continue
        sentences += [s for s in split_sentences(paragraph) if len(s.split()) >= MIN_SENTENCE_WORDS]
    return sentences


def austen_passages(text: str, passage_sentences: int) -> dict[str, list[Example]]:
    """Each split's (passage, novel index, passage index in its novel), novel by novel (steps 4 and 5)."""
    splits: dict[str, list[Example]] = {split: [] for split in SPLITS}
    for label, novel in enumerate(split_austen_text(text).values()):
        sentences = novel_sentences(novel)
        count = len(sentences) // passage_sentences
        passages = [" ".join(sentences[i * passage_sentences : (i + 1) * passage_sentences]) for i in range(count)]
        n_train, n_val = int(count * TRAIN_SHARE), int(count * (TRAIN_SHARE + VAL_SHARE))
        for position, passage in enumerate(passages):
            split = "train" if position < n_train else "val" if position < n_val else "test"
            splits[split].append((passage, label, position))
    return splits


# --- TSV files -------------------------------------------------------------------------------------------------


def read_labelled_tsv(path: str | Path, what: str = "tsv_files") -> list[tuple[str, str, int]]:
    """(text, label, line number) of each non-blank "text<TAB>label" line of a UTF-8 file; a line without a tab,
    or with an empty text or label, raises ValueError naming ``what``, the file and the line (a file that is not
    UTF-8: the byte, its offset and line)."""
    rows = []
    for number, line in enumerate(read_lines(path, what), start=1):
        if not line.strip():
            continue
        text, tab, label = line.rpartition("\t")
        text, label = text.strip(), label.strip()
        if not tab:
            raise ValueError(
                f"{what}: {path}, line {number}: no tab; each line must be 'text<TAB>label' (line starts {line[:60]!r})"
            )
        if not text or not label:
            empty = "text" if not text else "label"
            raise ValueError(f"{what}: {path}, line {number}: the {empty} is empty; each line is 'text<TAB>label'")
        rows.append((text, label, number))
    return rows


# --- datasets and batches --------------------------------------------------------------------------------------


class TextClassificationDataset(Dataset):
    """Encoded texts with their labels; item i is {"ids": [BOS] + tokens + [EOS] (int32 array), "label", "text"}."""

    def __init__(self, ids: PackedSequences, labels: np.ndarray, texts: list[str]) -> None:
        if not len(ids) == len(labels) == len(texts):
            raise ValueError(f"{len(ids)} id sequences, {len(labels)} labels and {len(texts)} texts: need as many")
        self.ids, self.labels, self.texts = ids, np.asarray(labels, dtype=np.int64), texts

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} texts")
        return {"ids": self.ids[index], "label": int(self.labels[index]), "text": self.texts[index]}

    def __getitems__(self, indices: list[int]) -> list[dict]:
        return [self[i] for i in indices]


def collate_classification(items: list[dict], pad_id: int = PAD_ID, multiple: int = 8) -> dict:
    """Dataset items → {"ids": (B, T) int64 padded on the right with ``pad_id``, "labels": (B,) int64, "texts"}.

    T is the batch's longest sequence rounded up to a multiple of ``multiple``: fewer distinct shapes (compiled
    graphs, FLOP counts), and padding is masked out of attention anyway.
    """
    longest = max(len(item["ids"]) for item in items)
    width = -(-longest // multiple) * multiple
    ids = torch.full((len(items), width), pad_id, dtype=torch.int64)
    for row, item in enumerate(items):
        ids[row, : len(item["ids"])] = torch.from_numpy(np.asarray(item["ids"], dtype=np.int64))
    labels = torch.tensor([item["label"] for item in items], dtype=torch.int64)
    return {"ids": ids, "labels": labels, "texts": [item["text"] for item in items]}


class TextClassificationDataModule(L.LightningDataModule):
    """Labelled texts for a BERT classifier: batches {"ids": (B, T), "labels": (B,), "texts": list[str]}.

    Each text is encoded as [CLS] tokens [SEP] (the tokenizer's BOS and EOS), cut to `max_tokens` with [SEP] kept
    last, and padded with `pad_id` (to the batch's longest, rounded up to a multiple of 8). Give the texts as
    `corpus` (the default, Jane Austen's six novels: which novel does a passage come from) or as `tsv_files` with
    `corpus: null`; see the module docstring for how passages are made and the splits drawn. `num_classes`,
    `class_names`, `vocab_size` and `pad_id` are available right after construction (the command line links them
    into the model); `class_counts` and `chance_accuracy` describe the splits, whose class counts `setup` logs.

    Args:
        corpus: "austen": passages of Jane Austen's six novels labelled with their novel (fetched from Debian's
            r-cran-janeaustenr into `<data_root>/austen`, see ``corpora.austen_text``); null to read `tsv_files`.
        tsv_files: training texts as "text<TAB>label" lines (UTF-8; paths or glob patterns); needs `corpus: null`.
        val_tsv_files: validation texts in the same form; default: the md5 bucket split of `tsv_files` (5%).
        test_tsv_files: test texts in the same form; default: the md5 bucket split of `tsv_files` (5%).
        passage_sentences: consecutive sentences per Austen passage.
        train_examples: label only this many training texts, drawn at random once (the same ones for every run and
            seed; in their order); None: all of them. For learning curves, and for pretraining on more text than is
            labelled, the case pretraining is for. Val and test stay whole.
        tokenizer_file: use this tokenizer JSON (``Tokenizer.save``; e.g. `runs/<pretraining run>/version_0/
            tokenizer.json`) instead of training one: needed to fine-tune from a run that was trained with it.
        bpe_vocab_size: size of the byte-level BPE trained on the train texts (when no `tokenizer_file`), with the
            special tokens of masked-LM / T5 pretraining (at least 361: 256 bytes and 105 special tokens).
        max_tokens: longest sequence in tokens, [CLS] and [SEP] included; longer texts are cut (at most the
            model's `max_len`).
        batch_size: texts per batch.
        num_workers: DataLoader worker processes.
        cache_dir: where the passages and the trained tokenizer are cached.
        data_root: where the built-in corpus is stored.
        seed: seeds the order of the training texts in each epoch (the splits do not depend on it).
    """

    def __init__(
        self,
        corpus: Literal["austen"] | None = "austen",
        tsv_files: list[str] | None = None,
        val_tsv_files: list[str] | None = None,
        test_tsv_files: list[str] | None = None,
        passage_sentences: int = 3,
        train_examples: int | None = None,
        tokenizer_file: str | None = None,
        bpe_vocab_size: int = 8192,
        max_tokens: int = 128,
        batch_size: int = 32,
        num_workers: int = 0,
        cache_dir: str = "data/cache",
        data_root: str = "data",
        seed: int = 0,
    ) -> None:
        super().__init__()
        if corpus is not None and corpus != "austen":
            raise ValueError(f"corpus={corpus!r} is not a built-in corpus; valid: 'austen', or null with tsv_files")
        if (corpus is None) == (tsv_files is None):
            raise ValueError(
                "TextClassificationDataModule needs exactly one source of labelled texts: corpus ('austen', the "
                "default) or tsv_files with corpus: null; "
                + ("got both: set corpus to null to read tsv_files" if corpus else "got neither")
            )
        for name, files in (
            ("tsv_files", tsv_files),
            ("val_tsv_files", val_tsv_files),
            ("test_tsv_files", test_tsv_files),
        ):
            if files is not None and not as_list(files):
                raise ValueError(f"{name} is an empty list; give paths or glob patterns, or leave it unset")
            if files is not None and corpus is not None:
                raise ValueError(
                    f"corpus={corpus!r} has its own val/test split (by position in each novel); remove {name}"
                )
        for name, value, least in (
            ("passage_sentences", passage_sentences, 1),
            ("max_tokens", max_tokens, 3),
            ("batch_size", batch_size, 1),
            ("num_workers", num_workers, 0),
        ):
            if value < least:
                what = " ([CLS], a token, [SEP])" if name == "max_tokens" else ""
                raise ValueError(f"{name}={value} must be at least {least}{what}")
        if train_examples is not None and train_examples < 1:
            raise ValueError(f"train_examples={train_examples} must be at least 1, or null to use every training text")
        if tokenizer_file is None and bpe_vocab_size < MIN_VOCAB_SIZE:
            raise ValueError(
                f"bpe_vocab_size={bpe_vocab_size} is too small: the byte-level BPE holds 256 bytes and "
                f"{len(EXTRA_SPECIAL_TOKENS) + 4} special tokens; use at least {MIN_VOCAB_SIZE}"
            )
        if tokenizer_file is not None and not Path(tokenizer_file).is_file():
            raise FileNotFoundError(
                f"tokenizer_file: {tokenizer_file!r} does not exist (a pretraining run writes its tokenizer.json "
                "beside its checkpoints/ folder: run it first, or point tokenizer_file at the run you have)"
            )
        self.save_hyperparameters()
        self.corpus = corpus
        patterns = {"train": tsv_files, "val": val_tsv_files, "test": test_tsv_files}
        self.files = {  # missing files and patterns without matches are refused here, naming the option
            split: expand_patterns(as_list(patterns[split]), f"{_PREFIX[split]}tsv_files") for split in SPLITS
        }
        self.passage_sentences = passage_sentences
        self.train_examples = train_examples
        self.tokenizer_file = tokenizer_file
        self.bpe_vocab_size = bpe_vocab_size
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.cache_dir = Path(cache_dir)
        self.data_root = Path(data_root)
        self.seed = seed
        self.datasets: dict[str, TextClassificationDataset] = {}
        self._examples: dict[str, list[Example]] | None = None
        self._class_names: list[str] | None = None
        self._tokenizer: Tokenizer | None = None
        self._logged_counts = False

    # --- what the model needs: available right after construction (LightningCLI links them) ---

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer: loaded from `tokenizer_file` or the cache, or trained (and cached) on first use."""
        if self._tokenizer is None:
            self._tokenizer = self._load_or_train_tokenizer()
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Size of the tokenizer's vocabulary (the model's embedding size)."""
        return self.tokenizer.vocab_size

    @property
    def pad_id(self) -> int:
        """The padding id of the batches (the model's ``pad_id``, masked out of attention)."""
        return PAD_ID

    @property
    def class_names(self) -> list[str]:
        """Name of each class, by index: the novels' titles in ``AUSTEN_NOVELS`` order, or the sorted TSV labels."""
        self.examples()
        return list(self._class_names)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def class_counts(self) -> dict[str, dict[str, int]]:
        """{split: {class name: texts}}."""
        names = self.class_names
        counts = {}
        for split, examples in self.examples().items():
            per_class = np.bincount([label for _, label, _ in examples], minlength=len(names))
            counts[split] = {name: int(count) for name, count in zip(names, per_class, strict=True)}
        return counts

    @property
    def chance_accuracy(self) -> float:
        """The test accuracy of always answering the test split's largest class (its share of the test texts)."""
        counts = self.class_counts["test"].values()
        return max(counts) / max(sum(counts), 1)

    def examples(self) -> dict[str, list[Example]]:
        """Each split's (text, class index, position) examples, from the cache or read (and cached)."""
        if self._examples is None:
            key = content_hash(self._fingerprint())
            path = self.cache_dir / f"classification-examples-{key}.json"

            def read() -> dict:
                with preparing(f"reading the labelled texts of {self._describe_source()}"):
                    return self._read_examples()

            found = cached(path, _load_examples, read, write_json)
            self._class_names = found["class_names"]
            self._examples = {split: [tuple(example) for example in found[split]] for split in SPLITS}
            train = self._examples["train"]
            if self.train_examples is not None and self.train_examples < len(train):
                chosen = np.random.default_rng(0).choice(len(train), self.train_examples, replace=False)
                self._examples["train"] = [train[i] for i in np.sort(chosen)]
        return self._examples

    # --- LightningDataModule hooks ---

    def prepare_data(self) -> None:
        """Fetch the corpus, cut the passages and train the tokenizer into the cache (once per node)."""
        self._tokenizer = self.tokenizer

    def setup(self, stage: str | None = None) -> None:
        """Encode the splits that `stage` needs (all of them for None) and log the class counts."""
        if not self._logged_counts:
            self._logged_counts = True
            lines = [f"TextClassificationDataModule: {self.num_classes} classes ({self._describe_source()})"]
            for split, counts in self.class_counts.items():
                per_class = ", ".join(f"{name} {count}" for name, count in counts.items())
                lines.append(f"  {split}: {sum(counts.values())} texts ({per_class})")
            lines.append(f"  chance accuracy (the largest test class): {self.chance_accuracy:.1%}")
            rank_zero_info("\n".join(lines))
        needed = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ()}.get(stage, SPLITS)
        for split in needed:
            if split not in self.datasets:
                self.datasets[split] = self._encode_split(split)

    def train_dataloader(self) -> DataLoader:
        dataset = self._dataset("train")
        return self._dataloader(dataset, EpochShuffleSampler(len(dataset), self.seed))

    def val_dataloader(self) -> DataLoader | list:
        if not self.examples()["val"]:
            return []  # no validation texts: Lightning skips validation
        dataset = self._dataset("val")
        return self._dataloader(dataset, evaluation_sampler(dataset))

    def test_dataloader(self) -> DataLoader:
        dataset = self._dataset("test")
        return self._dataloader(dataset, evaluation_sampler(dataset))

    # --- internals ---

    def _dataset(self, split: str) -> TextClassificationDataset:
        if split not in self.datasets:
            self.setup({"train": "fit", "val": "validate", "test": "test"}[split])
        dataset = self.datasets[split]
        if len(dataset) == 0:
            raise ValueError(f"the {split} split has no texts ({self._describe_source()})")
        return dataset

    def _dataloader(self, dataset: TextClassificationDataset, sampler) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            collate_fn=partial(collate_classification, pad_id=self.pad_id),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
        )

    def _encode_split(self, split: str) -> TextClassificationDataset:
        examples = self.examples()[split]
        texts = [text for text, _, _ in examples]
        ids = PackedSequences.from_lists(self.tokenizer.encode_batch(texts))
        ids = ids.framed(bos=True, eos=True).truncated(self.max_tokens)
        return TextClassificationDataset(ids, np.array([label for _, label, _ in examples], dtype=np.int64), texts)

    def _describe_source(self) -> str:
        if self.corpus == "austen":
            return f"Austen's novels, passages of {self.passage_sentences} sentences"
        return ", ".join(str(path) for paths in self.files.values() for path in paths)

    def _fingerprint(self) -> dict:
        """What the cached examples depend on: the corpus's content or the files' path, size and time, the rules."""
        if self.corpus == "austen":
            sources = {"austen": sha256_of(austen_text(self.data_root / "austen"))}
            return {"format": _CACHE_FORMAT_VERSION, **sources, "passage_sentences": self.passage_sentences}
        files = {split: [file_stamp(path) for path in paths] for split, paths in self.files.items()}
        return {"format": _CACHE_FORMAT_VERSION, "tsv": files}

    def _read_examples(self) -> dict:
        """{"class_names": [...], "train" / "val" / "test": [[text, class index, position], ...]}."""
        if self.corpus == "austen":
            text = read_utf8(austen_text(self.data_root / "austen"))
            return {
                "class_names": [title for _, title in AUSTEN_NOVELS],
                **austen_passages(text, self.passage_sentences),
            }
        rows = {
            split: [(path, row) for path in paths for row in read_labelled_tsv(path, f"{_PREFIX[split]}tsv_files")]
            for split, paths in self.files.items()
        }
        if not rows["train"]:
            raise ValueError(f"tsv_files: no labelled line in {', '.join(map(str, self.files['train']))}")
        class_names = sorted({label for _, (_, label, _) in rows["train"]})
        if len(class_names) < 2:
            raise ValueError(f"tsv_files: every line has the label {class_names[0]!r}; a classifier needs two or more")
        index = {name: i for i, name in enumerate(class_names)}
        examples: dict[str, list[Example]] = {split: [] for split in SPLITS}
        held_out = {split for split in ("val", "test") if not self.files[split]}  # drawn from the train lines
        for split, split_rows in rows.items():
            for path, (text, label, number) in split_rows:
                if label not in index:
                    raise ValueError(
                        f"{_PREFIX[split]}tsv_files: {path}, line {number}: the label "
                        f"{label!r} is not one of the training labels {class_names}"
                    )
                target = split
                if split == "train" and (bucket := split_of(text)) in held_out:
                    target = bucket
                examples[target].append((text, index[label], number))
        return {"class_names": class_names, **examples}

    def _load_or_train_tokenizer(self) -> Tokenizer:
        if self.tokenizer_file is not None:
            return Tokenizer.from_file(self.tokenizer_file)
        train = [text for text, _, _ in self.examples()["train"]]
        key = {
            "texts": content_hash("\n".join(train)),
            "vocab_size": self.bpe_vocab_size,
            "special": list(EXTRA_SPECIAL_TOKENS),
            "format": _CACHE_FORMAT_VERSION,
        }
        path = self.cache_dir / f"classification-tokenizer-{content_hash(key)}.json"

        def train_tokenizer() -> Tokenizer:
            characters = sum(map(len, train))
            with preparing(f"training a byte-level BPE of {self.bpe_vocab_size} tokens on {characters:,} characters"):
                return Tokenizer.train_bpe(train, self.bpe_vocab_size, extra_special_tokens=EXTRA_SPECIAL_TOKENS)

        return cached(path, Tokenizer.from_file, train_tokenizer, write_tokenizer)


def _load_examples(path: Path) -> dict:
    found = json.loads(path.read_text(encoding="utf-8"))
    if not {"class_names", *SPLITS} <= set(found):
        raise ValueError(f"expected the class names and the examples of {SPLITS}, found {sorted(found)}")
    return found
