"""Next-token language-modelling data: text → tokenizer → token ids cached on disk → (x, y) windows.

The flow, with every expensive step cached under `cache_dir` and written atomically (so DDP ranks that
build the same cache at once are safe):

    text files / built-in corpus / URL ──split──> train | val | test text
        ──tokenizer (trained once, JSON)──> ids per split (.npy, memory-mapped) ──> windows of block_size+1

Splits are taken in characters from the END of the corpus, nanoGPT-style, in the order train | val | test,
unless `val_files` / `test_files` give them explicitly. For a character tokenizer this is exactly a split of
the token stream; for BPE the cut falls between characters, each side encoded separately.

Its length is one data module (three sources of text, two tokenizers, cached splits) with its checks.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import DataLoader, Dataset, Subset

from lightformer.data.caching import content_hash, file_stamp, preparing
from lightformer.data.corpora import austen_text, download
from lightformer.data.sampling import EpochShuffleSampler, evaluation_sampler
from lightformer.data.tokenizers import MIN_BPE_VOCAB_SIZE, Tokenizer
from lightformer.files import as_list, atomic_open, expand_patterns, read_utf8, sha256_of

SPLITS = ("train", "val", "test")
# Bump when the cached files' meaning changes, so old caches are not reused.
_CACHE_FORMAT_VERSION = 1


class _TokenWindows(Dataset):
    """Windows of `block_size + 1` consecutive ids from a 1-D token array, returned as (x, y).

    `tokens` is an array, or the path of a `.npy` file that is memory-mapped on first use (so a dataset
    sent to DataLoader worker processes carries only the path).
    """

    def __init__(self, tokens: np.ndarray | str | Path, block_size: int) -> None:
        self._path = None if isinstance(tokens, np.ndarray) else Path(tokens)
        self._tokens = tokens if isinstance(tokens, np.ndarray) else None
        self.block_size = block_size
        self.num_tokens = len(self.tokens)
        if self.num_tokens < block_size + 1:
            raise ValueError(
                f"{self._path or 'token array'} has {self.num_tokens} tokens, fewer than one window of "
                f"block_size + 1 = {block_size + 1}"
            )

    @property
    def tokens(self) -> np.ndarray:
        if self._tokens is None:
            self._tokens = np.load(self._path, mmap_mode="r")
        return self._tokens

    def window(self, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x = ids[offset : offset + block_size], y = the next id after each of x; both (block_size,) int64."""
        ids = torch.from_numpy(self.tokens[offset : offset + self.block_size + 1].astype(np.int64))
        return ids[:-1], ids[1:]

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        if self._path is not None:
            state["_tokens"] = None  # re-map the file in the receiving process instead of copying it
        return state


class RandomWindowDataset(_TokenWindows):
    """`num_samples` training windows at random offsets; item i's offset depends only on (seed, i).

    Map-style, so a DistributedSampler can shard it, and reproducible whatever the number of workers.
    """

    def __init__(self, tokens: np.ndarray | str | Path, block_size: int, num_samples: int, seed: int) -> None:
        super().__init__(tokens, block_size)
        self.num_samples = num_samples
        self.seed = seed

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"index {index} is out of range for {self.num_samples} samples")
        last_offset = self.num_tokens - (self.block_size + 1)
        offset = int(np.random.default_rng((self.seed, index)).integers(0, last_offset + 1))
        return self.window(offset)


class ContiguousWindowDataset(_TokenWindows):
    """Non-overlapping windows covering the token array in order (evaluation: deterministic, no shuffle).

    Window i predicts ids[i*block_size + 1 : (i+1)*block_size + 1]; a tail shorter than a window is left out.
    """

    def __len__(self) -> int:
        return (self.num_tokens - 1) // self.block_size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} windows")
        return self.window(index * self.block_size)


class TextDataModule(L.LightningDataModule):
    """Character- or BPE-level next-token prediction data: batches of (x, y), each (batch, block_size) int64.

    Give the text as exactly one of `train_files`, `corpus` or `url`. Files are read as UTF-8 and joined
    in order (a newline is added between files when one does not end with it); texts are held in memory
    while the tokenizer is trained and the ids are cached, so for corpora much larger than RAM tokenize
    ahead of time.

    Args:
        train_files: training text files: paths or glob patterns (`**` allowed; a glob's matches are sorted).
        val_files: validation text files; default: the last `val_fraction` of the training text.
        test_files: test text files; default: the last `test_fraction` of the training text.
        corpus: a built-in offline corpus: "austen" (Jane Austen's six novels, 4.0 M characters, fetched
            from a Debian package into `<data_root>/austen`).
        url: download the training text from this URL into `<data_root>/downloads/`.
        sha256: expected SHA-256 (hex) of the file at `url`; None skips the check.
        val_fraction: fraction of the training text held out for validation, in [0, 1); used when
            `val_files` is None. 0 means no validation.
        test_fraction: fraction held out for testing, in [0, 1); used when `test_files` is None.
        val_windows: validate during `fit` on this many of the validation split's windows, drawn once at random
            (from `seed`), instead of all of them: cheaper validations, always the same windows. `fit` then ends
            with one validation on the whole split (``LightformerCLI.after_fit``), as `validate` does. None: all.
        tokenizer: "char" (one id per character; vocabulary from ALL the text, val and test included, so
            that no validation character is unknown) or "bpe" (byte-level BPE trained on the train split only;
            it encodes any text).
        bpe_vocab_size: vocabulary size of a trained BPE tokenizer (ignored for "char"). The attribute
            `vocab_size` is the size of the tokenizer actually in use (linked into the model by the CLI).
        tokenizer_file: load this tokenizer JSON (from `Tokenizer.save`) instead of training one; it
            overrides `tokenizer` and `bpe_vocab_size`.
        block_size: tokens per training example (the model's context length).
        batch_size: examples per batch.
        num_workers: DataLoader worker processes.
        samples_per_epoch: training windows per epoch; default: train tokens // block_size (at least one
            batch).
        cache_dir: where the trained tokenizer and the token ids are cached.
        data_root: where built-in and downloaded corpora are stored.
        seed: seeds the training windows' offsets and the shuffling.
    """

    def __init__(
        self,
        train_files: list[str] | None = None,
        val_files: list[str] | None = None,
        test_files: list[str] | None = None,
        corpus: Literal["austen"] | None = None,
        url: str | None = None,
        sha256: str | None = None,
        val_fraction: float = 0.1,
        test_fraction: float = 0.0,
        val_windows: int | None = None,
        tokenizer: Literal["char", "bpe"] = "char",
        bpe_vocab_size: int = 8192,
        tokenizer_file: str | None = None,
        block_size: int = 64,
        batch_size: int = 12,
        num_workers: int = 0,
        samples_per_epoch: int | None = None,
        cache_dir: str = "data/cache",
        data_root: str = "data",
        seed: int = 1337,
    ) -> None:
        super().__init__()
        sources = {"train_files": train_files, "corpus": corpus, "url": url}
        given = [name for name, value in sources.items() if value is not None]
        if len(given) != 1:
            raise ValueError(
                "TextDataModule needs exactly one source of training text: train_files (paths or globs), "
                f"corpus ('austen') or url; got {', '.join(given) if given else 'none'}"
            )
        if corpus is not None and corpus != "austen":
            raise ValueError(f"corpus={corpus!r} is not a built-in corpus; valid: 'austen'")
        if tokenizer not in ("char", "bpe"):
            raise ValueError(f"tokenizer={tokenizer!r} is not a tokenizer kind; valid: 'char', 'bpe'")
        for name, fraction in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0 <= fraction < 1:
                raise ValueError(f"{name}={fraction} must be in [0, 1)")
        held_out = (val_fraction if val_files is None else 0) + (test_fraction if test_files is None else 0)
        if held_out >= 1:
            raise ValueError(
                f"val_fraction={val_fraction} + test_fraction={test_fraction} leaves no training text; "
                "their sum must be below 1"
            )
        if tokenizer == "bpe" and tokenizer_file is None and bpe_vocab_size < MIN_BPE_VOCAB_SIZE:
            raise ValueError(
                f"bpe_vocab_size={bpe_vocab_size} is too small for byte-level BPE: use at least {MIN_BPE_VOCAB_SIZE}"
            )
        for name, value in (("block_size", block_size), ("batch_size", batch_size)):
            if value < 1:
                raise ValueError(f"{name}={value} must be at least 1")
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be at least 0")
        if val_windows is not None and val_windows < 1:
            raise ValueError(f"val_windows={val_windows} must be at least 1, or null to validate on the whole split")
        if samples_per_epoch is not None and samples_per_epoch < batch_size:
            raise ValueError(
                f"samples_per_epoch={samples_per_epoch} is smaller than batch_size={batch_size}: an epoch "
                "would have no full batch"
            )
        self.save_hyperparameters()
        self.file_patterns = {"train": as_list(train_files), "val": as_list(val_files), "test": as_list(test_files)}
        self.corpus = corpus
        self.url = url
        self.sha256 = sha256
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.val_windows = val_windows
        self.tokenizer_kind = tokenizer
        self.bpe_vocab_size = bpe_vocab_size
        self.tokenizer_file = tokenizer_file
        self.block_size = block_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.samples_per_epoch = samples_per_epoch
        self.cache_dir = Path(cache_dir)
        self.data_root = Path(data_root)
        self.seed = seed
        self.datasets: dict[str, Dataset] = {}
        self._files: dict[str, list[Path]] | None = None
        self._fingerprint_value: dict | None = None
        self._texts: dict[str, str] | None = None
        self._tokenizer: Tokenizer | None = None

    # --- tokenizer: available right after construction (LightningCLI links `data.vocab_size`) ---

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer: loaded from `tokenizer_file` or the cache, or trained (and cached) on first use."""
        if self._tokenizer is None:
            self._tokenizer = self._load_or_train_tokenizer()
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Size of the tokenizer's vocabulary (the model's embedding and output size)."""
        return self.tokenizer.vocab_size

    def decode(self, ids: Sequence[int] | np.ndarray | torch.Tensor) -> str:
        """Text of a sequence of ids (list, array or 1-D tensor), special tokens dropped."""
        return self.tokenizer.decode(ids)

    # --- LightningDataModule hooks ---

    def prepare_data(self) -> None:
        """Fetch the corpus, train the tokenizer and write the token caches (once, on one process per node)."""
        self._write_token_caches()

    def setup(self, stage: str | None = None) -> None:
        """Memory-map the cached ids and build the datasets that `stage` needs (all of them for None)."""
        paths = self._write_token_caches()  # a no-op when prepare_data already ran
        needed = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ()}.get(stage, SPLITS)
        for split in needed:
            if split in self.datasets or (split != "train" and paths[split] is None):
                continue  # built already, or no such split (val_fraction=0, test_fraction=0)
            tokens = np.load(paths[split], mmap_mode="r")
            if len(tokens) < self.block_size + 1:
                raise ValueError(
                    f"the {split} split has {len(tokens)} tokens, fewer than block_size + 1 = "
                    f"{self.block_size + 1} for one window; lower block_size or give the {split} split more "
                    f"text ({self._split_hint(split)})"
                )
            if split == "train":
                num_samples = self.samples_per_epoch or max(len(tokens) // self.block_size, self.batch_size)
                self.datasets[split] = RandomWindowDataset(paths[split], self.block_size, num_samples, self.seed)
            else:
                self.datasets[split] = ContiguousWindowDataset(paths[split], self.block_size)

    def train_dataloader(self) -> DataLoader:
        dataset = self._dataset("train")
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=EpochShuffleSampler(len(dataset), self.seed),
            drop_last=True,  # constant batch shape; the windows are random, so nothing is lost
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
        )

    def val_dataloader(self) -> DataLoader | list:
        if self._split_paths()["val"] is None:
            return []  # no validation split: Lightning skips validation
        return self._eval_dataloader("val")

    @property
    def validates_on_a_subset(self) -> bool:
        """Whether `fit` validates on `val_windows` windows of the validation split rather than all of them."""
        if self.val_windows is None or self._split_paths()["val"] is None:
            return False
        return self.val_windows < len(self._dataset("val"))

    def test_dataloader(self) -> DataLoader:
        if self._split_paths()["test"] is None:
            raise ValueError("there is no test split: set test_files, or test_fraction above 0")
        return self._eval_dataloader("test")

    # --- internals ---

    def _dataset(self, split: str) -> Dataset:
        if split not in self.datasets:
            self.setup({"train": "fit", "val": "validate", "test": "test"}[split])
        return self.datasets[split]

    def _eval_dataloader(self, split: str) -> DataLoader:
        dataset = self._dataset(split)
        fitting = self.trainer is not None and self.trainer.state.fn == TrainerFn.FITTING
        if split == "val" and fitting and self.validates_on_a_subset:
            chosen = np.random.default_rng(self.seed).choice(len(dataset), self.val_windows, replace=False)
            dataset = Subset(dataset, np.sort(chosen).tolist())
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=evaluation_sampler(dataset),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
        )

    def _split_hint(self, split: str) -> str:
        if split == "train" or self.file_patterns[split]:
            return f"{split} files: {', '.join(str(p) for p in self._source_files()[split])}"
        return f"raise {split}_fraction={getattr(self, f'{split}_fraction')}"

    def _source_files(self) -> dict[str, list[Path]]:
        """The text files of each split (train: the corpus), fetching a built-in or downloaded corpus."""
        if self._files is None:
            files = {
                split: expand_patterns(patterns, f"{split}_files") for split, patterns in self.file_patterns.items()
            }
            if self.corpus == "austen":
                files["train"] = [austen_text(self.data_root / "austen")]
            elif self.url is not None:
                name = Path(self.url.split("?")[0]).name or "corpus.txt"
                files["train"] = [download(self.url, self.data_root / "downloads" / name, self.sha256)]
            self._files = files
        return self._files

    def _fingerprint(self) -> dict:
        """What the cached tokenizer and ids depend on: the corpus (content hash for a built-in or
        downloaded file, path + size + mtime for user files) and the split fractions."""
        if self._fingerprint_value is None:
            files = self._source_files()
            if self.corpus is not None or self.url is not None:
                sources = {"train": [sha256_of(files["train"][0])]}
            else:
                sources = {"train": [file_stamp(path) for path in files["train"]]}
            sources.update({split: [file_stamp(path) for path in files[split]] for split in ("val", "test")})
            self._fingerprint_value = {
                "format": _CACHE_FORMAT_VERSION,
                "sources": sources,
                "val_fraction": self.val_fraction if not files["val"] else None,
                "test_fraction": self.test_fraction if not files["test"] else None,
            }
        return self._fingerprint_value

    def _split_texts(self) -> dict[str, str]:
        """The text of each split ("" for a split that has none)."""
        if self._texts is None:
            files = self._source_files()
            corpus = read_texts(files["train"])
            if not corpus:
                raise ValueError(
                    f"the training text is empty: {', '.join(map(str, files['train']))}; it needs at least "
                    f"block_size + 1 = {self.block_size + 1} tokens"
                )
            val_fraction = 0 if files["val"] else self.val_fraction
            texts = split_by_fraction(corpus, val_fraction, 0 if files["test"] else self.test_fraction)
            for split in ("val", "test"):
                if files[split]:
                    texts[split] = read_texts(files[split])
            for split in ("val", "test"):
                if files[split] and not texts[split]:
                    raise ValueError(
                        f"the {split} text is empty: {', '.join(map(str, files[split]))}; it needs at least "
                        f"block_size + 1 = {self.block_size + 1} tokens"
                    )
            self._texts = texts
        return self._texts

    def _load_or_train_tokenizer(self) -> Tokenizer:
        if self.tokenizer_file is not None:
            return Tokenizer.from_file(self.tokenizer_file)
        key = {"fingerprint": self._fingerprint(), "kind": self.tokenizer_kind}
        if self.tokenizer_kind == "bpe":
            key["vocab_size"] = self.bpe_vocab_size
        path = self.cache_dir / f"tokenizer-{self.tokenizer_kind}-{content_hash(key)}.json"
        if self.tokenizer_kind == "bpe":
            return cached_bpe(path, self.bpe_vocab_size, lambda: self._split_texts()["train"])
        if path.exists():
            return Tokenizer.from_file(path)
        tokenizer = Tokenizer.train_char(self._split_texts().values())
        tokenizer.save(path)
        return tokenizer

    def _split_paths(self) -> dict[str, Path | None]:
        """Cache file of each split's ids; None for a split without text."""
        files = self._source_files()
        has_text = {
            "train": True,
            "val": bool(files["val"]) or self.val_fraction > 0,
            "test": bool(files["test"]) or self.test_fraction > 0,
        }
        return token_cache_paths(self.cache_dir, self._fingerprint(), self.tokenizer, has_text)

    def _write_token_caches(self) -> dict[str, Path | None]:
        """Encode each split once (``write_token_caches``)."""
        paths = self._split_paths()
        write_token_caches(paths, self.tokenizer, self._split_texts)
        self._texts = None  # everything is cached: free the text
        return paths


def read_texts(paths: list[Path]) -> str:
    """The files' UTF-8 text, joined in order with a newline between files that lack a final one."""
    texts = []
    for path in paths:
        text = read_utf8(path)
        if texts and not texts[-1].endswith("\n"):
            texts.append("\n")
        texts.append(text)
    return "".join(texts)


def split_by_fraction(text: str, val_fraction: float, test_fraction: float) -> dict[str, str]:
    """train | val | test, cut in characters: the last ``test_fraction`` of ``text`` for test, the
    ``val_fraction`` before it for validation, the rest for training."""
    n = len(text)
    n_val, n_test = int(n * val_fraction), int(n * test_fraction)
    return {
        "train": text[: n - n_val - n_test],
        "val": text[n - n_val - n_test : n - n_test],
        "test": text[n - n_test :],
    }


def cached_bpe(
    path: Path, vocab_size: int, train_text: Callable[[], str], special_tokens: Sequence[str] = ()
) -> Tokenizer:
    """The byte-level BPE cached at ``path``, or trained on ``train_text()`` (with ``special_tokens`` after PAD,
    BOS, EOS, UNK) and cached there."""
    if path.exists():
        return Tokenizer.from_file(path)
    text = train_text()
    extra = f" with {len(special_tokens)} extra special tokens" if special_tokens else ""
    with preparing(f"training a byte-level BPE of {vocab_size} tokens{extra} on {len(text):,} characters"):
        tokenizer = Tokenizer.train_bpe(io.StringIO(text), vocab_size, extra_special_tokens=list(special_tokens))
    tokenizer.save(path)
    return tokenizer


def token_cache_paths(
    cache_dir: Path, fingerprint: dict, tokenizer: Tokenizer, has_text: dict[str, bool]
) -> dict[str, Path | None]:
    """The cache file of each split's ids, named by what they depend on (the text and the tokenizer); None for a
    split without text."""
    key = content_hash({"fingerprint": fingerprint, "tokenizer": content_hash(tokenizer.to_str())})
    return {split: cache_dir / f"tokens-{key}-{split}.npy" if has_text[split] else None for split in SPLITS}


def write_token_caches(
    paths: dict[str, Path | None], tokenizer: Tokenizer, split_texts: Callable[[], dict[str, str]]
) -> None:
    """Encode each split whose cache file is missing and save its ids as .npy (uint16 for vocabularies up to
    65,536), atomically; ``split_texts`` is called only then."""
    for split, path in paths.items():
        if path is not None and not path.exists():
            text = split_texts()[split]
            with preparing(f"encoding the {split} split ({len(text):,} characters) into {path}"):
                ids = tokenizer.encode_to_array(text)
            with atomic_open(path) as f:
                np.save(f, ids)
