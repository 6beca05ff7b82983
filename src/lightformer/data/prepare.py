"""Preparation: raw text → a tokenizer and token shards, once per job, in parallel, with LitData's ``optimize``.

    source pieces (``data.sources``) ──bounded sample──> tokenizer (trained, or loaded from a file)
                  └──every core, one piece at a time──> <dir>/<name>/{train,val,test}/ chunk-*.bin + index.json
                                                         <dir>/<name>/tokenizer.json, prepared.json (written last)

The folder's name holds a hash of everything its content depends on (the source files' paths, sizes and times, or a
built-in corpus's checksum; the split; the tokenizer's options; the format version), so preparing again with the same
inputs does nothing and a change to any of them prepares a new folder. ``prepared.json`` is written last and
atomically: a folder without it is half-written (a killed run) and is prepared again from scratch.

**Once per job.** The process that takes ``<folder>.lock`` prepares; every other process of the job (DDP ranks, a
torchrun or srun launch on several nodes sharing a file system) waits on the lock, then finds the folder complete.
Nodes without a shared file system each prepare their own copy.

**Streaming.** Each split is a LitData dataset of token ids (``TokensLoader``: documents joined in one stream), which
``StreamingDataset`` reads as windows of any length without preparing again.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import Literal

import numpy as np
from filelock import FileLock
from lightning.fabric.utilities.seed import _collect_rng_states, _set_rng_states
from lightning.pytorch.utilities import rank_zero_info

from lightformer.data.caching import content_hash, file_stamp, preparing
from lightformer.data.sources import SPLITS, Piece, TextSource, read_piece
from lightformer.data.tokenizers import MIN_BPE_VOCAB_SIZE, Tokenizer, token_dtype
from lightformer.files import atomic_write_bytes, sha256_of

FORMAT_VERSION = 1  # bump when what a prepared folder holds changes meaning
MANIFEST = "prepared.json"
TOKENIZER = "tokenizer.json"
CHUNK_BYTES = "64MB"


@dataclass(frozen=True)
class TokenizerConfig:
    """The tokenizer a text corpus is prepared with.

    Args:
        kind: "char" (one id per character of the sample, every split's text included, so that no validation
            character is unknown; any other character encodes as UNK) or "bpe" (byte-level BPE trained on the train
            split's sample; it encodes any text).
        vocab_size: the size of a trained BPE vocabulary (ignored for "char").
        file: load this tokenizer JSON (``Tokenizer.save``, or a run's ``tokenizer.json``) instead of training one; it
            overrides ``kind`` and ``vocab_size``.
        sample_bytes: train the tokenizer on at most this many bytes of text, taken evenly from every piece of the
            corpus (a corpus up to this size is read whole).
    """

    kind: Literal["char", "bpe"] = "char"
    vocab_size: int = 8192
    file: str | None = None
    sample_bytes: int = 64_000_000

    def __post_init__(self) -> None:
        if self.kind not in ("char", "bpe"):
            raise ValueError(f"data.tokenizer.kind={self.kind!r} is not a tokenizer kind; valid: 'char', 'bpe'")
        if self.kind == "bpe" and self.file is None and self.vocab_size < MIN_BPE_VOCAB_SIZE:
            raise ValueError(
                f"data.tokenizer.vocab_size={self.vocab_size} is too small for byte-level BPE: use at least "
                f"{MIN_BPE_VOCAB_SIZE}"
            )
        if self.sample_bytes < 1:
            raise ValueError(f"data.tokenizer.sample_bytes={self.sample_bytes} must be at least 1")
        if self.file is not None and not Path(self.file).is_file():
            raise FileNotFoundError(f"data.tokenizer.file: the tokenizer file {self.file!r} does not exist")


class PreparedText:
    """A prepared folder: its tokenizer, and each split's LitData dataset of token ids (``split_dir``)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        manifest = self.folder / MANIFEST
        if not manifest.is_file():
            raise FileNotFoundError(
                f"{self.folder} is not a prepared folder (no {MANIFEST}): prepare it with `lightformer prepare`"
            )
        try:
            self.manifest = json.loads(manifest.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{manifest} is corrupt ({error}): delete {self.folder} and prepare again") from None

    @cached_property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_file(self.folder / TOKENIZER)

    def has(self, split: str) -> bool:
        return self.manifest["tokens"].get(split, 0) > 0

    def num_tokens(self, split: str) -> int:
        return self.manifest["tokens"].get(split, 0)

    def split_dir(self, split: str) -> str:
        """The split's LitData folder, its chunk files checked: a missing or cut-short shard is named here."""
        folder = self.folder / split
        try:
            chunks = json.loads((folder / "index.json").read_text())["chunks"]
        except (OSError, ValueError, KeyError) as error:
            raise ValueError(f"{folder}/index.json is missing or corrupt ({error}): {self._again}") from None
        for chunk in chunks:
            path = folder / chunk["filename"]
            if not path.is_file() or path.stat().st_size < chunk["chunk_bytes"]:
                state = "missing" if not path.is_file() else f"cut short ({path.stat().st_size:,} bytes)"
                raise ValueError(f"the shard {path} is {state}: {self._again}")
        return str(folder)

    @property
    def _again(self) -> str:
        return f"delete {self.folder} and prepare again (`lightformer prepare`, or any `fit`)"


def prepare_text(
    source: TextSource,
    tokenizer: TokenizerConfig,
    output_dir: str | Path,
    num_workers: int | None = None,
    extra_special_tokens: tuple[str, ...] = (),
) -> PreparedText:
    """Prepare ``source`` into ``output_dir`` (see the module docstring), or find it prepared; returns the folder.

    ``num_workers``: parallel encoding processes (default: every core this process may use).
    ``extra_special_tokens``: special tokens a trained tokenizer gets after PAD, BOS, EOS and UNK (``MASK``, ...).
    """
    files = source.files()
    fingerprint = {
        "format": FORMAT_VERSION,
        "sources": {split: [_identity(path, source) for path in paths] for split, paths in files.items()},
        "val_fraction": None if files["val"] else source.val_fraction,
        "test_fraction": None if files["test"] else source.test_fraction,
        "split": source.split,
        "text_field": source.text_field,
        "tokenizer": _tokenizer_key(tokenizer, extra_special_tokens),
    }
    folder = Path(output_dir) / f"{'-'.join(_stem(files['train']))}-{content_hash(fingerprint)}"
    if (folder / MANIFEST).is_file():
        return PreparedText(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _lock(folder), _random_state_kept():
        if not (folder / MANIFEST).is_file():  # another process may have prepared it while this one waited
            _prepare(folder, fingerprint, source, files, tokenizer, num_workers, extra_special_tokens)
    return PreparedText(folder)


def _prepare(
    folder: Path,
    fingerprint: dict,
    source: TextSource,
    files: dict[str, list[Path]],
    config: TokenizerConfig,
    num_workers: int | None,
    extra_special_tokens: tuple[str, ...],
) -> None:
    shutil.rmtree(folder, ignore_errors=True)  # what a killed preparation left
    folder.mkdir(parents=True)
    pieces = source.pieces(files)
    if not pieces["train"]:
        names = ", ".join(str(p) for p in files["train"])
        raise ValueError(f"data.source: the training text is empty ({names}); give files that hold text")
    tokenizer = _tokenizer(config, pieces, source.text_field, extra_special_tokens)
    tokenizer.save(folder / TOKENIZER)
    workers = num_workers or len(os.sched_getaffinity(0))
    tokens = {}
    for split in SPLITS:
        if pieces[split]:
            _encode_split(folder / split, pieces[split], tokenizer, source.text_field, workers)
            tokens[split] = _count_tokens(folder / split)
        if split == "train" and not tokens.get("train"):
            raise ValueError("data.source: the training text encodes to no token; give files that hold text")
    manifest = {**fingerprint, "tokens": tokens, "vocab_size": tokenizer.vocab_size, "created": time.time()}
    atomic_write_bytes(folder / MANIFEST, json.dumps(manifest, indent=1).encode())
    rank_zero_info(f"prepared data: {folder} ({', '.join(f'{s} {n:,} tokens' for s, n in tokens.items())})")


def _tokenizer(
    config: TokenizerConfig, pieces: dict[str, list[Piece]], text_field: str, extra_special_tokens: tuple[str, ...]
) -> Tokenizer:
    if config.file is not None:
        tokenizer = Tokenizer.from_file(config.file)
        specials = {tokenizer.decode([i], skip_special=False) for i in tokenizer.special_ids}
        missing = [token for token in extra_special_tokens if token not in specials]
        if missing:
            raise ValueError(
                f"data.tokenizer.file: the tokenizer {config.file} lacks the special tokens {missing[:3]}"
                f"{' ...' if len(missing) > 3 else ''} ({len(missing)} of them) that this data needs; train one here "
                "(data.tokenizer.file=null)"
            )
        return tokenizer
    sampled = pieces["train"] if config.kind == "bpe" else [p for split in SPLITS for p in pieces[split]]
    total = sum(piece.weight for piece in sampled)
    limit = None if total <= config.sample_bytes else config.sample_bytes // len(sampled)
    sample = (text for piece in sampled for text in read_piece(piece, text_field, limit))
    what = f"a {config.kind} tokenizer on a sample of at most {config.sample_bytes:,} bytes"
    with preparing(what):
        if config.kind == "char":
            return Tokenizer.train_char(sample, extra_special_tokens)
        return Tokenizer.train_bpe(sample, config.vocab_size, extra_special_tokens=extra_special_tokens)


def _encode_split(folder: Path, pieces: list[Piece], tokenizer: Tokenizer, text_field: str, workers: int) -> None:
    from litdata import TokensLoader, optimize

    size = sum(piece.weight for piece in pieces)
    workers = max(1, min(workers, len(pieces)))
    what = f"encoding {len(pieces)} pieces ({size:,} bytes or rows) into {folder} on {workers} processes"
    with preparing(what), _tokenizers_single_threaded():
        optimize(
            fn=partial(encode_piece, tokenizer_json=tokenizer.to_str(), text_field=text_field),
            inputs=pieces,
            output_dir=str(folder),
            chunk_bytes=CHUNK_BYTES,
            item_loader=TokensLoader(),
            num_workers=workers,
            start_method="fork" if hasattr(os, "fork") else None,  # spawn re-imports torch: seconds per worker
            keep_data_ordered=True,
            reorder_files=False,
            verbose=False,
        )


_TOKENIZERS: dict[str, Tokenizer] = {}


def encode_piece(piece: Piece, tokenizer_json: str, text_field: str = "text"):
    """The token ids of a piece as 1-D arrays (what ``optimize`` writes): a text piece's running text, or each
    document of a JSONL or Parquet piece followed by EOS."""
    key = content_hash(tokenizer_json)
    if key not in _TOKENIZERS:  # once per worker process
        _TOKENIZERS[key] = Tokenizer.from_str(tokenizer_json)
    tokenizer = _TOKENIZERS[key]
    dtype = token_dtype(tokenizer.vocab_size)
    if piece.format == "text":
        for text in read_piece(piece, text_field):
            if text:
                yield tokenizer.encode_to_array(text)
        return
    batch: list[str] = []
    for text in (*read_piece(piece, text_field), None):
        if text is not None:
            batch.append(text)
        if batch and (text is None or len(batch) == 1024):
            ids = tokenizer.encode_batch(batch, add_eos=True)
            yield np.fromiter((i for seq in ids for i in seq), dtype=dtype, count=sum(map(len, ids)))
            batch = []


def _count_tokens(folder: Path) -> int:
    return sum(chunk["dim"] for chunk in json.loads((folder / "index.json").read_text())["chunks"])


def _identity(path: Path, source: TextSource) -> list | str:
    """What identifies a source file: a built-in or downloaded corpus by its content, a user's file by its stamp."""
    return sha256_of(path) if source.corpus is not None or source.url is not None else file_stamp(path)


def _stem(paths: list[Path]) -> list[str]:
    name = paths[0].stem if len(paths) == 1 else f"{paths[0].stem}+{len(paths) - 1}"
    return ["".join(c if c.isalnum() or c in "+_." else "_" for c in name)[:40]]


def _tokenizer_key(config: TokenizerConfig, extra_special_tokens: tuple[str, ...]) -> dict:
    if config.file is not None:
        text = Path(config.file).read_text(encoding="utf-8", errors="replace")
        return {"file": content_hash(text), "special": list(extra_special_tokens)}
    key = {"kind": config.kind, "sample_bytes": config.sample_bytes, "special": list(extra_special_tokens)}
    return {**key, "vocab_size": config.vocab_size} if config.kind == "bpe" else key


@contextmanager
def _lock(folder: Path):
    lock = FileLock(f"{folder}.lock")
    try:
        lock.acquire(timeout=0)
    except TimeoutError:
        rank_zero_info(f"preparing data: waiting for another process that prepares {folder} ...")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


@contextmanager
def _random_state_kept():
    """Preparation runs in whichever process gets there first, before the model is built: it must not move the
    random generators, or that process would start from other weights than the others (and than a rerun that finds
    the data prepared)."""
    states = _collect_rng_states()
    try:
        yield
    finally:
        _set_rng_states(states)


@contextmanager
def _tokenizers_single_threaded():
    """The encoding processes are the parallelism: Hugging Face tokenizers' own threads would oversubscribe the
    cores (and it warns when a process that used them forks)."""
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM")
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved
