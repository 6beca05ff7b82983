"""Preparation once per job, on every core: tokenizers, shards, records (docs/data.md, "What preparation does")."""

from __future__ import annotations

import itertools
import json
import math
import os
import pickle
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache, partial
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import numpy as np
import torch
from filelock import FileLock
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from litdata import File, TokensLoader, optimize
from litdata.streaming.resolver import Dir

from lightformer.data.pieces import SPLITS, Piece, read_piece
from lightformer.data.preparation.caching import MANIFEST, content_hash, file_stamp, preparing, read_manifest
from lightformer.data.sources import Source
from lightformer.data.sources.corpora import source_files
from lightformer.data.sources.text import TextSource
from lightformer.errors import ConfigError, DataError
from lightformer.io.files import atomic_open, atomic_write_bytes, sha256_of
from lightformer.nn.checks import check_at_least
from lightformer.tokenization.text import MIN_BPE_VOCAB_SIZE, Tokenizer, token_dtype

FORMAT_VERSION = 1  # bump when what a prepared folder holds changes meaning
TOKENIZER = "tokenizer.json"
CHUNK_BYTES = "64MB"
SAMPLE_BYTES = 64_000_000  # a tokenizer's default sample, taken evenly from every piece of the corpus
LENGTHS = "lengths.npy"  # a records folder's field lengths (``write_records``)
REMOTE_SCHEMES = ("s3", "gs", "r2")  # the object stores LitData reads and writes (``litdata.streaming.fs_provider``)
REMOTE_WAIT_S = 5.0  # how often a process that does not prepare looks for the object store's ``prepared.json``


@dataclass(frozen=True)
class PrepareConfig:
    """Where and how raw data is prepared (``lightformer prepare``, or the first ``fit``).

    Args:
        dir: the folder of prepared data (a subfolder per source and tokenizer), or an object-store URL (``s3://...``).
        num_workers: parallel encoding processes; default: every core.
        cache_dir: for an object-store ``dir``: where rank 0 prepares, and every node keeps the small files and shards.
    """

    dir: str = "data/prepared"
    num_workers: int | None = None
    cache_dir: str = "data/prepared-cache"

    def __post_init__(self) -> None:
        if self.num_workers is not None and self.num_workers < 1:
            raise ValueError(f"data.prepare.num_workers={self.num_workers} must be at least 1, or null for every core")
        scheme = urlparse(self.dir).scheme
        if "://" in self.dir and scheme not in REMOTE_SCHEMES:
            valid = ", ".join(f"{name}://" for name in REMOTE_SCHEMES)
            raise ValueError(f"data.prepare.dir={self.dir!r}: {scheme}:// is not a store LitData writes; valid: a "
                             f"local folder, or {valid}")  # fmt: skip


@dataclass(frozen=True)
class TokenizerConfig:
    """The tokenizer text is prepared with (``data.tokenizer``); each module has its defaults and refuses unused fields.

    Args:
        kind: "char" (one id per character of every split's sample) or "bpe" (byte-level, trained on the train split's).
        vocab_size: the size of a trained BPE vocabulary (ignored for "char").
        file: load this tokenizer JSON (a run's ``tokenizer.json``) instead of training one; overrides ``kind``.
        sample_bytes: train on at most this many bytes of text, taken evenly from every piece of the corpus.
        joint_vocab: translation: one BPE on both sides of the train pairs (to share embeddings); False: one per side.
        bpe_dropout: translation: BPE-dropout's probability of skipping a train merge (0.1 in the paper; 0: off).
        bpe_dropout_segmentations: translation, with bpe_dropout: segmentations drawn of each train sentence.
        max_unknown: the share of the data's characters a loaded character tokenizer may lack: above it, refused.
    """

    kind: Literal["char", "bpe"] = "char"
    vocab_size: int = 8192
    file: str | None = None
    sample_bytes: int = SAMPLE_BYTES
    joint_vocab: bool = True
    bpe_dropout: float = 0.0
    bpe_dropout_segmentations: int = 8
    max_unknown: float = 0.001

    def __post_init__(self) -> None:
        if self.kind not in ("char", "bpe"):
            raise ValueError(f"data.tokenizer.kind={self.kind!r} is not a tokenizer kind; valid: 'char', 'bpe'")
        if self.kind == "bpe" and self.file is None and self.vocab_size < MIN_BPE_VOCAB_SIZE:
            raise ValueError(
                f"data.tokenizer.vocab_size={self.vocab_size} is too small for byte-level BPE: use at least "
                f"{MIN_BPE_VOCAB_SIZE}"
            )
        check_at_least("data.tokenizer.sample_bytes", self.sample_bytes, 1)
        if not 0.0 <= self.bpe_dropout < 1.0:
            raise ValueError(
                f"data.tokenizer.bpe_dropout={self.bpe_dropout} must be in [0, 1) (0.1 in the paper; 0 turns it off)"
            )
        check_at_least("data.tokenizer.bpe_dropout_segmentations", self.bpe_dropout_segmentations, 1)
        if not 0 <= self.max_unknown <= 1:
            raise ValueError(f"data.tokenizer.max_unknown={self.max_unknown} must be a share, in [0, 1]")
        if self.file is not None and not Path(self.file).is_file():
            raise FileNotFoundError(
                f"data.tokenizer.file: the tokenizer file {self.file!r} does not exist (a run writes its "
                "tokenizer.json beside its checkpoints/ folder: run it first, or point data.tokenizer.file at the run "
                "you have)"
            )

    def check_used_by(
        self, data_module: str, kinds: tuple[str, ...] = ("char", "bpe"), file: bool = True, pairs: bool = False
    ) -> None:
        """ConfigError naming a field ``data_module`` cannot use (a ``kind`` or ``file`` it refuses, pairs' fields)."""
        refused = None
        if self.kind not in kinds and self.file is None:
            valid = " or ".join(repr(kind) for kind in kinds)
            also = " (or a data.tokenizer.file)" if file else ""
            refused = f"data.tokenizer.kind={self.kind!r}: {data_module} prepares its text with kind {valid}{also}"
        elif self.file is not None and not file:
            refused = (f"data.tokenizer.file={self.file!r}: {data_module} trains its own tokenizers on its train "
                       "split; leave data.tokenizer.file unset")  # fmt: skip
        elif not pairs and not self.joint_vocab:
            refused = (f"data.tokenizer.joint_vocab=false applies to sentence pairs (TranslationDataModule); "
                       f"{data_module} has one text: leave it unset")  # fmt: skip
        elif not pairs and self.bpe_dropout:
            refused = (f"data.tokenizer.bpe_dropout={self.bpe_dropout} applies to sentence pairs "
                       f"(TranslationDataModule); {data_module} draws no segmentations: set it to 0")  # fmt: skip
        if refused is not None:
            raise ConfigError(refused)

    @property
    def segmentations(self) -> int:
        """Translation's BPE-dropout segmentations of the train split, each a record split (0 without BPE-dropout)."""
        return self.bpe_dropout_segmentations if self.bpe_dropout else 0


def as_tokenizer_config(value: TokenizerConfig | dict, default: TokenizerConfig) -> TokenizerConfig:
    """A module's tokenizer config, or a checkpoint's dict read over ``default`` (a translation one lacks ``kind``)."""
    return value if isinstance(value, TokenizerConfig) else replace(default, **value)


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
            raise DataError(f"{manifest} is corrupt ({error}): {_prepare_again(self.folder)}") from None

    @cached_property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_file(self.folder / TOKENIZER)

    def has(self, split: str) -> bool:
        return self.num_tokens(split) > 0

    def num_tokens(self, split: str) -> int:
        return self.manifest["tokens"].get(split, 0)

    def split_dir(self, split: str) -> str | Dir:
        return split_location(self.folder, split, self.manifest)


def prepare_text(
    source: TextSource, tokenizer: TokenizerConfig, prepare: PrepareConfig, extra_special_tokens: tuple[str, ...] = ()
) -> PreparedText:
    """Prepare ``source`` into ``prepare.dir``, or find it; ``extra_special_tokens`` follow PAD, BOS, EOS, UNK."""
    files = source_files(source)
    # A built-in or downloaded corpus is known by its content, a user's file by its stamp.
    identity = sha256_of if source.corpus is not None or source.url is not None else file_stamp
    fingerprint = {
        "format": FORMAT_VERSION,
        "sources": {split: [identity(path) for path in paths] for split, paths in files.items()},
        "val_fraction": None if files["val"] else source.val_fraction,
        "test_fraction": None if files["test"] else source.test_fraction,
        "split": source.split,
        "text_field": source.text_field,
        "tokenizer": _tokenizer_key(tokenizer, extra_special_tokens),
    }
    build = partial(_prepare_text, source=source, files=files, config=tokenizer, num_workers=prepare.num_workers,
                    extra_special_tokens=extra_special_tokens)  # fmt: skip
    return PreparedText(prepared_folder(prepare, stem_of(files["train"]), fingerprint, build))


def prepare_documents(
    source: Source, tokenizer: TokenizerConfig, prepare: PrepareConfig, extra_special_tokens: tuple[str, ...] = ()
) -> PreparedText:
    """Prepare any ``Source``'s documents (records ``{"text": str}``) as ``prepare_text`` does files."""
    fingerprint = {
        "format": FORMAT_VERSION,
        "source": f"{type(source).__module__}.{type(source).__qualname__}",
        "examples": source.fingerprint(),
        "tokenizer": _tokenizer_key(tokenizer, extra_special_tokens),
    }
    build = partial(_prepare_documents, source=source, config=tokenizer, num_workers=prepare.num_workers,
                    extra_special_tokens=extra_special_tokens)  # fmt: skip
    return PreparedText(prepared_folder(prepare, source.stem(), fingerprint, build))


def _prepare_documents(
    folder: Path, source: Source, config: TokenizerConfig, num_workers: int | None, extra_special_tokens: tuple
) -> dict:
    inputs = {split: list(source.inputs(split)) for split in SPLITS if split in source.splits}

    def sample(splits: tuple[str, ...]) -> Iterator[str]:
        left = config.sample_bytes
        for part in (part for split in splits for part in inputs.get(split, [])):
            for text in source_texts(source, part):
                if left <= 0:
                    return
                left -= len(text.encode("utf-8"))
                yield text

    tokenizer = load_or_train_tokenizer(config, sample, extra_special_tokens)
    tokenizer.save(folder / TOKENIZER)
    encode = partial(encode_documents, source=source, tokenizer_json=tokenizer.to_str())
    tokens = {}
    for split, parts in inputs.items():
        if parts:
            write_shards(folder / split, encode, parts, num_workers, TokensLoader())
            if (folder / split / "index.json").is_file() and (count := _count(folder / split, "dim")):
                tokens[split] = count
            else:
                shutil.rmtree(folder / split, ignore_errors=True)  # a split the source holds no document of
    if not tokens.get("train"):
        raise DataError(f"data.source: {type(source).__name__} gives no training document (records('train'))")
    rank_zero_info(f"prepared data: {folder} ({', '.join(f'{s} {n:,} tokens' for s, n in tokens.items())})")
    return {"tokens": tokens, "vocab_size": tokenizer.vocab_size}


def source_texts(source: Source, part: Any) -> Iterator[str]:
    """The texts of ``source.records(part)``, each record checked (a DataError naming source, part, record)."""
    for index, record in enumerate(source.records(part)):
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise DataError(
                f"data.source: {type(source).__name__}.records({part!r}) gave {record!r:.80} as its record {index}: "
                'a text source gives records {"text": str}'
            )
        if text:
            yield text


def encode_documents(part: Any, source: Source, tokenizer_json: str) -> Iterator[np.ndarray]:
    return documents_encoded(source_texts(source, part), worker_tokenizer(tokenizer_json))


def documents_encoded(texts: Iterable[str], tokenizer: Tokenizer) -> Iterator[np.ndarray]:
    """``texts`` as token ids, each followed by EOS, in 1-D arrays of up to 1,024 documents, read one at a time."""
    dtype = token_dtype(tokenizer.vocab_size)
    eos = np.array([tokenizer.eos_id], dtype=dtype)
    batch: list[str] = []
    for text in itertools.chain(texts, [None]):
        if text is not None:
            batch.append(text)
        if batch and (text is None or len(batch) == 1024):
            if tokenizer.kind == "char":  # the same ids as encode's, by a table lookup (``encode_to_array``)
                yield np.concatenate([ids for document in batch for ids in (tokenizer.encode_to_array(document), eos)])
            else:
                ids = tokenizer.encode_batch(batch, add_eos=True)
                yield np.fromiter((i for seq in ids for i in seq), dtype=dtype, count=sum(map(len, ids)))
            batch = []


def prepared_folder(prepare: PrepareConfig, stem: str, fingerprint: dict, build: Callable[[Path], dict]) -> Path:
    """The folder ``<prepare.dir>/<stem>-<hash of fingerprint>`` (or its mirror), prepared by ``build`` once per job."""
    name = f"{stem}-{content_hash(fingerprint)}"
    if urlparse(prepare.dir).scheme in REMOTE_SCHEMES:
        with _store_errors(prepare.dir):
            url = f"{prepare.dir.rstrip('/')}/{name}"
            return _in_object_store(url, Path(prepare.cache_dir) / name, fingerprint, build)
    return _local_folder(Path(prepare.dir) / name, fingerprint, build)


def split_location(folder: Path, split: str, manifest: dict | None = None) -> str | Dir:
    """Where LitData reads a split: the local folder, its shards checked; for a store's mirror, folder and URL."""
    manifest = read_manifest(folder) if manifest is None else manifest
    local = folder / split
    if "url" in manifest:
        return Dir(path=str(local), url=f"{manifest['url']}/{split}")
    try:
        chunks = json.loads((local / "index.json").read_text())["chunks"]
    except (OSError, ValueError, KeyError) as error:
        raise DataError(f"{local}/index.json is missing or corrupt ({error}): {_prepare_again(folder)}") from None
    for chunk in chunks:
        path = local / chunk["filename"]
        if not path.is_file() or path.stat().st_size < chunk["chunk_bytes"]:
            state = "missing" if not path.is_file() else f"cut short ({path.stat().st_size:,} bytes)"
            raise DataError(f"the shard {path} is {state}: {_prepare_again(folder)}")
    return str(local)


def _prepare_again(folder: Path) -> str:
    return f"delete {folder} and prepare again (`lightformer prepare`, or any `fit`)"


def _local_folder(folder: Path, fingerprint: dict, build: Callable[[Path], dict]) -> Path:
    if _prepared_here(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _lock(folder), _random_state_kept():
        if not _prepared_here(folder):  # prepared by another process while this one waited?
            with _removed_on_failure(folder):
                shutil.rmtree(folder, ignore_errors=True)  # half-written, or a mirror of a store that lost the folder
                folder.mkdir(parents=True)
                manifest = {**fingerprint, **build(folder), "created": time.time()}
                atomic_write_bytes(folder / MANIFEST, json.dumps(manifest, indent=1).encode())
    return folder


def _in_object_store(url: str, local: Path, fingerprint: dict, build: Callable[[Path], dict]) -> Path:
    """The job's rank 0 prepares and uploads; the others wait for ``prepared.json``, then mirror small files."""
    store = object_store(url)
    if not store.exists(f"{url}/{MANIFEST}"):
        if _job_rank_zero():
            _upload(_local_folder(local, fingerprint, build), url, store)
            return local
        rank_zero_info(f"preparing data: waiting for the job's rank 0 to prepare {url} ...")
        while not store.exists(f"{url}/{MANIFEST}"):
            time.sleep(REMOTE_WAIT_S)
    if _holds(local, url):
        return local
    local.parent.mkdir(parents=True, exist_ok=True)
    with _lock(local):
        if not _holds(local, url):
            with _removed_on_failure(local):
                shutil.rmtree(local, ignore_errors=True)
                local.mkdir(parents=True)
                store.download_file(f"{url}/{MANIFEST}", str(local / f".{MANIFEST}"))
                manifest = json.loads((local / f".{MANIFEST}").read_text())
                for name in manifest["small_files"]:
                    (local / name).parent.mkdir(parents=True, exist_ok=True)
                    store.download_file(f"{url}/{name}", str(local / name))
                atomic_write_bytes(local / MANIFEST, json.dumps({**manifest, "url": url}, indent=1).encode())
                (local / f".{MANIFEST}").unlink()
    return local


def object_store(url: str):
    """LitData's own client of ``url``'s store (``REMOTE_SCHEMES``): ``exists``, ``upload_file``, ``download_file``."""
    from litdata.streaming.fs_provider import GCPFsProvider, R2FsProvider, S3FsProvider

    return {"s3": S3FsProvider, "gs": GCPFsProvider, "r2": R2FsProvider}[urlparse(url).scheme]()


# Where a store's client finds credentials, by the store's scheme (r2: LitData's R2 client is an S3 client).
_CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE and ~/.aws/credentials; AWS_ENDPOINT_URL for an "
    "S3-compatible store",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS, or `gcloud auth application-default login`",
}
_CREDENTIALS["r2"] = _CREDENTIALS["s3"]


@contextmanager
def _store_errors(store_dir: str) -> Iterator[None]:
    """The store client's errors as a DataError naming ``data.prepare.dir``, the bucket, where credentials go."""
    errors: list[type[BaseException]] = []
    with suppress(ImportError):
        from botocore.exceptions import BotoCoreError, ClientError

        errors += [BotoCoreError, ClientError]
    with suppress(ImportError):
        from google.api_core.exceptions import GoogleAPIError
        from google.auth.exceptions import GoogleAuthError

        errors += [GoogleAPIError, GoogleAuthError]
    try:
        yield
    except tuple(errors) as error:
        where = urlparse(store_dir)
        raise DataError(
            f"data.prepare.dir={store_dir!r}: the bucket {where.netloc} cannot be used ({error}): give credentials "
            f"that may read and write it ({_CREDENTIALS[where.scheme]}), or a local folder as data.prepare.dir"
        ) from None


def _upload(folder: Path, url: str, store) -> None:
    """A prepared folder's files to ``url``, then its manifest, listing the small files (not shards) nodes mirror."""
    files = sorted(path for path in folder.rglob("*") if path.is_file() and path.name != MANIFEST)
    relative = [path.relative_to(folder).as_posix() for path in files]
    manifest = {**read_manifest(folder), "small_files": [name for name in relative if not name.endswith(".bin")]}
    uploaded_manifest = folder.with_name(f".{folder.name}-{MANIFEST}")
    with preparing(f"uploading {len(files)} files of {folder} to {url}"):
        for path, name in zip(files, relative, strict=True):
            store.upload_file(str(path), f"{url}/{name}")
        atomic_write_bytes(uploaded_manifest, json.dumps(manifest, indent=1).encode())
        store.upload_file(str(uploaded_manifest), f"{url}/{MANIFEST}")
        uploaded_manifest.unlink()


def _prepared_here(folder: Path) -> bool:
    """Whether ``folder`` is complete and was built here (not a mirror of a folder in an object store)."""
    return _complete(folder) and "url" not in read_manifest(folder)


def _holds(local: Path, url: str) -> bool:
    """Whether ``local`` holds the object store's folder at ``url``: prepared here, or mirrored from it before."""
    return _complete(local) and read_manifest(local).get("url", url) == url


def _complete(folder: Path) -> bool:
    return (folder / MANIFEST).is_file()


def _job_rank_zero() -> bool:
    """Whether this is the job's rank 0, before any process group: ``RANK``, ``SLURM_PROCID``, or node ranks."""
    env = os.environ
    for key in ("RANK", "SLURM_PROCID"):
        if key in env:
            return env[key] == "0"
    return env.get("NODE_RANK", env.get("GROUP_RANK", "0")) == "0" and env.get("LOCAL_RANK", "0") == "0"


def write_shards(folder: Path, fn: Callable, inputs: list, workers: int | None, item_loader=None) -> None:
    """``litdata.optimize`` of ``fn(input)``'s items, in order, into ``folder``; ``fn``'s error is raised here."""
    workers = max(1, min(workers or len(os.sched_getaffinity(0)), len(inputs)))
    errors = folder.with_name(f".{folder.name}-errors")
    shutil.rmtree(errors, ignore_errors=True)
    errors.mkdir(parents=True)
    what = f"writing {len(inputs)} pieces into {folder} on {workers} processes"
    try:
        with preparing(what), _optimize_environment():
            optimize(
                fn=partial(_until_an_error, fn=fn, errors=str(errors)),
                inputs=inputs,
                output_dir=str(folder),
                chunk_bytes=CHUNK_BYTES,
                item_loader=item_loader,
                num_workers=workers,
                start_method="fork" if hasattr(os, "fork") else None,  # spawn re-imports torch: seconds per worker
                keep_data_ordered=True,  # contiguous runs of inputs per worker, chunks in worker order: items in order
                reorder_files=False,
                verbose=False,
            )
        raised = sorted(errors.glob("*.pickle"))
        error = pickle.loads(raised[0].read_bytes()) if raised else None
    finally:  # also when preparation is interrupted: nothing is left beside the user's folder
        shutil.rmtree(errors, ignore_errors=True)
    if error is not None:
        raise error


def _until_an_error(item: Any, fn: Callable, errors: str) -> Iterator:
    """``fn(item)``'s items unless a worker met an error; an error ``fn`` raises is saved in ``errors`` instead."""
    if os.listdir(errors):
        return
    try:
        yield from fn(item)
    except Exception as error:
        try:
            saved = pickle.dumps(error)
            pickle.loads(saved)  # some pickle but do not unpickle (an __init__ with other arguments)
        except Exception:  # then its type and message
            saved = pickle.dumps(RuntimeError(f"{type(error).__name__}: {error}"))
        with atomic_open(Path(errors) / f"{os.getpid()}.pickle") as f:
            f.write(saved)


def pieces(items: Sequence, size: int) -> list:
    """``items`` cut into consecutive pieces of ``size`` (the last one shorter): the inputs of preparing processes."""
    return [items[start : start + size] for start in range(0, len(items), size)]


def sample_limit(pieces: Sequence, sample_bytes: int) -> int | None:
    """The bytes to read of each of ``pieces`` for a sample of about ``sample_bytes`` from all; None: all of them."""
    total = sum(piece.weight for piece in pieces)
    return None if total <= sample_bytes else sample_bytes // len(pieces)


def piece_size(count: int, most: int, workers: int | None) -> int:
    """Items per piece of ``count``: at most ``most``, fewer to give each of ``workers`` (None: every core) a piece."""
    return max(1, min(most, math.ceil(count / (workers or len(os.sched_getaffinity(0))))))


def write_records(
    folder: Path,
    records_of: Callable[[Any], Iterable[dict]],
    inputs: list,
    workers: int | None,
    length_fields: tuple[str, ...],
    expected: int | None = None,
    summaries: list | None = None,
) -> int:
    """Each input's records into a split folder, with ``lengths.npy``; returns their count, fills ``summaries``."""
    side = folder.with_name(f".{folder.name}-lengths")
    shutil.rmtree(side, ignore_errors=True)
    side.mkdir(parents=True)
    fn = partial(_records_with_lengths, records_of=records_of, fields=length_fields, side=str(side))
    write_shards(folder, fn, list(enumerate(inputs)), workers)
    parts = [pickle.loads((side / f"{i:08d}.pickle").read_bytes()) for i in range(len(inputs))]
    lengths = np.concatenate([part for part, _ in parts]) if parts else np.zeros((0, len(length_fields)), np.int32)
    count = _count(folder, "chunk_size")
    if count != len(lengths) or (expected is not None and count != expected):
        raise RuntimeError(f"{folder}: {count:,} records were written, {len(lengths):,} lengths counted, {expected} "
                           "records expected")  # fmt: skip
    with atomic_open(folder / LENGTHS) as f:
        np.save(f, lengths)
    shutil.rmtree(side)
    if summaries is not None:
        summaries.extend(summary for _, summary in parts)
    return count


def _records_with_lengths(item: tuple[int, Any], records_of: Callable, fields: tuple[str, ...], side: str):
    """One input's records; then their lengths and what ``records_of`` returned, saved in ``<side>/<index>.pickle``."""
    index, source = item
    lengths, records = [], iter(records_of(source))
    while True:
        try:
            record = next(records)
        except StopIteration as stop:
            summary = stop.value
            break
        lengths.append([len(record[name]) for name in fields])
        yield {name: File(bytes=value) if isinstance(value, bytes) else value for name, value in record.items()}
    with atomic_open(Path(side) / f"{index:08d}.pickle") as f:
        f.write(pickle.dumps((np.asarray(lengths, dtype=np.int32).reshape(-1, len(fields)), summary)))


def _prepare_text(
    folder: Path,
    source: TextSource,
    files: dict[str, list[Path]],
    config: TokenizerConfig,
    num_workers: int | None,
    extra_special_tokens: tuple[str, ...],
) -> dict:
    pieces = source.pieces(files)
    if not pieces["train"]:
        names = ", ".join(str(p) for p in files["train"])
        raise ValueError(f"data.source: the training text is empty ({names}); give files that hold text")
    tokenizer = _tokenizer(config, pieces, source.text_field, extra_special_tokens)  # reading: UTF-8 errors first
    source.check_held_out(files, pieces)
    tokenizer.save(folder / TOKENIZER)
    encode = partial(encode_piece, tokenizer_json=tokenizer.to_str(), text_field=source.text_field)
    tokens = {}
    for split in SPLITS:
        if pieces[split]:
            write_shards(folder / split, encode, pieces[split], num_workers, TokensLoader())
            tokens[split] = _count(folder / split, "dim")
        if split == "train" and not tokens.get("train"):
            raise ValueError("data.source: the training text encodes to no token; give files that hold text")
    rank_zero_info(f"prepared data: {folder} ({', '.join(f'{s} {n:,} tokens' for s, n in tokens.items())})")
    return {"tokens": tokens, "vocab_size": tokenizer.vocab_size}


def _tokenizer(
    config: TokenizerConfig, pieces: dict[str, list[Piece]], text_field: str, extra_special_tokens: tuple[str, ...]
) -> Tokenizer:
    return load_or_train_tokenizer(config, piece_sample(pieces, text_field, config.sample_bytes), extra_special_tokens)


def piece_sample(
    pieces: dict[str, list[Piece]], text_field: str, sample_bytes: int
) -> Callable[[tuple[str, ...]], Iterator[str]]:
    """``sample(splits)``: at most ``sample_bytes`` of those splits' text, evenly from every piece's start."""

    def sample(splits: tuple[str, ...]) -> Iterator[str]:
        sampled = [piece for split in splits for piece in pieces[split]]
        limit = sample_limit(sampled, sample_bytes)
        return (text for piece in sampled for text in read_piece(piece, text_field, limit))

    return sample


def load_or_train_tokenizer(
    config: TokenizerConfig,
    sample: Callable[[tuple[str, ...]], Iterable[str]],
    extra_special_tokens: tuple[str, ...] = (),
    needed: tuple[str, ...] | None = None,
    what: str | None = None,
) -> Tokenizer:
    """``config.file``'s tokenizer (with the special tokens ``needed``), or one trained on ``sample(splits)``."""
    if config.file is not None:
        tokenizer = Tokenizer.from_file(config.file)
        specials = {tokenizer.decode([i], skip_special=False) for i in tokenizer.special_ids}
        missing = [token for token in (extra_special_tokens if needed is None else needed) if token not in specials]
        if missing:
            raise ValueError(
                f"data.tokenizer.file: the tokenizer {config.file} lacks the special tokens {missing[:3]}"
                f"{' ...' if len(missing) > 3 else ''} ({len(missing)} of them) that this data needs; train one here "
                "(data.tokenizer.file=null)"
            )
        check_unknown_characters(tokenizer, config, sample(SPLITS))
        return tokenizer
    texts = sample(SPLITS if config.kind == "char" else ("train",))
    with preparing(what or f"a {config.kind} tokenizer on a sample of at most {config.sample_bytes:,} bytes"):
        if config.kind == "char":
            return Tokenizer.train_char(texts, extra_special_tokens)
        return Tokenizer.train_bpe(texts, config.vocab_size, extra_special_tokens=extra_special_tokens)


def check_unknown_characters(tokenizer: Tokenizer, config: TokenizerConfig, texts: Iterable[str]) -> None:
    """A DataError above ``data.tokenizer.max_unknown`` of ``texts``' characters a char tokenizer lacks, else warned."""
    if tokenizer.kind != "char":
        return  # byte-level BPE encodes anything
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(text)
    unknown = sorted(((counts[c], c) for c in tokenizer.unknown_characters("".join(counts))), reverse=True)
    if not unknown:
        return
    missing, total = sum(n for n, _ in unknown), sum(counts.values())
    named = ", ".join(f"{c!r} ({n:,} times)" for n, c in unknown[:10]) + (" ..." if len(unknown) > 10 else "")
    found = (f"data.tokenizer.file: the tokenizer {config.file} lacks {len(unknown)} of the data's characters, which "
             f"it encodes as <unk>: {named}; {missing / total:.2%} of the {total:,} characters read")  # fmt: skip
    if missing / total > config.max_unknown:
        raise DataError(
            f"{found}, more than data.tokenizer.max_unknown={config.max_unknown:g} allows. Give a tokenizer that has "
            "them, or train one on this data (data.tokenizer.file=null), or raise data.tokenizer.max_unknown to train "
            "with them as <unk>"
        )
    rank_zero_warn(f"{found} (data.tokenizer.max_unknown={config.max_unknown:g} allows it)")


@lru_cache(maxsize=4)
def worker_tokenizer(tokenizer_json: str) -> Tokenizer:
    """The tokenizer of a JSON string, built once per encoding process (the workers get the JSON by pickling)."""
    return Tokenizer.from_str(tokenizer_json)


def encode_piece(piece: Piece, tokenizer_json: str, text_field: str = "text"):
    """A piece's token ids as 1-D arrays: a text piece's running text, or each JSONL / Parquet document and EOS."""
    tokenizer = worker_tokenizer(tokenizer_json)
    if piece.format == "text":
        for text in read_piece(piece, text_field):
            if text:
                yield tokenizer.encode_to_array(text)
        return
    yield from documents_encoded(read_piece(piece, text_field), tokenizer)


def _count(folder: Path, what: str) -> int:
    """A LitData folder's count of tokens ("dim", a ``TokensLoader`` folder's) or items ("chunk_size")."""
    return sum(chunk[what] for chunk in json.loads((folder / "index.json").read_text())["chunks"])


def stem_of(paths: list[Path]) -> str:
    """A prepared folder's readable name for its source files: the first file's stem, "+N" for N more."""
    name = paths[0].stem if len(paths) == 1 else f"{paths[0].stem}+{len(paths) - 1}"
    return "".join(c if c.isalnum() or c in "+_." else "_" for c in name)[:40]


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
def _removed_on_failure(folder: Path):
    """A failing block removes ``folder`` and its lock file (unlinked while held: a waiting process takes a new one)."""
    try:
        yield
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        Path(f"{folder}.lock").unlink(missing_ok=True)
        raise


@contextmanager
def _random_state_kept():
    """torch's, CUDA's, NumPy's and Python's generators as they were: the ranks start from one model."""
    torch_state, python_state, numpy_state = torch.get_rng_state(), random.getstate(), np.random.get_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        torch.cuda.set_rng_state_all(cuda_states)
        np.random.set_state(numpy_state)
        random.setstate(python_state)


@contextmanager
def _optimize_environment() -> Iterator[None]:
    """Tokenizers single-threaded and LitData's cache folders of this call's own, for ``optimize``."""
    with tempfile.TemporaryDirectory(prefix="lightformer-optimize-") as cache:
        values = {
            "TOKENIZERS_PARALLELISM": "false",
            "DATA_OPTIMIZER_CACHE_FOLDER": os.environ.get("DATA_OPTIMIZER_CACHE_FOLDER", f"{cache}/chunks"),
            "DATA_OPTIMIZER_DATA_CACHE_FOLDER": os.environ.get("DATA_OPTIMIZER_DATA_CACHE_FOLDER", f"{cache}/data"),
        }
        saved = {key: os.environ.get(key) for key in values}
        os.environ.update(values)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key)
                else:
                    os.environ[key] = value
