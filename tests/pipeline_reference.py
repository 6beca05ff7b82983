"""Digests of what the record-preparing data modules prepare from tiny sources: the prepared folder's name (its
fingerprint's hash), its manifest, tokenizer files and every record split, for ``test_prepared_records``'s pin of what
b1bd12e's code prepared (each module with its own ``_build``), computed once by this file run against a worktree of
b1bd12e (``tokenizer_of`` took its config classes there): ``python tests/pipeline_reference.py <empty folder>
<data root>``."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from lightformer.data.loading.streaming import Records
from lightformer.data.modules import classification, image_text, image_text_files, translation
from lightformer.data.modules.images import ImageLoaderConfig
from lightformer.data.preparation.prepare import PrepareConfig, TokenizerConfig

LABELS = ("alpha", "beta", "gamma")
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Straße", "„laut“", "naïve", "café")


def tokenizer_of(family: str, **fields) -> TokenizerConfig:
    """A family's tokenizer config: its module's defaults (kind "bpe" for classification and translation, 8,000
    tokens for translation), with ``fields`` over them."""
    defaults = {"classification": {"kind": "bpe"}, "translation": {"kind": "bpe", "vocab_size": 8000}}
    return TokenizerConfig(**{**defaults.get(family, {}), **fields})


def sentence(rng: np.random.Generator, count: int) -> str:
    return " ".join(WORDS[i] for i in rng.integers(len(WORDS), size=count))


def stable_stamp(path: Path) -> list:
    """``file_stamp`` with the path relative to the working folder and no time: the same fingerprint anywhere."""
    return [os.path.relpath(Path(path).resolve()), Path(path).stat().st_size, 0]


def write_sources(root: Path) -> None:
    """The tiny sources, in ``root``: labelled texts, sentence pairs, images with captions."""
    rng = np.random.default_rng(0)
    (root / "labelled.tsv").write_text("".join(f"{sentence(rng, 3 + i % 7)} {i}\t{LABELS[i % 3]}\n"
                                               for i in range(240)), encoding="utf-8")  # fmt: skip
    (root / "pairs.tsv").write_text("".join(f"{sentence(rng, 2 + i % 6)} {i}\t{sentence(rng, 1 + i % 5)}\n"
                                            for i in range(300)), encoding="utf-8")  # fmt: skip
    rows = []
    for i in range(20):
        image = Image.new("L", (50 + 3 * i, 18 + i % 4), "white")
        ImageDraw.Draw(image).rectangle((2, 2, 10 + i, 12), fill=20 * (i % 10))
        (root / "img").mkdir(exist_ok=True)
        image.save(root / "img" / f"{i:02d}.png")
        rows += [{"file": f"img/{i:02d}.png", "text": sentence(rng, 1 + (i + k) % 4)} for k in range(1 + i % 3)]
    (root / "captions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def modules(data_root: str) -> dict[str, Callable[[], object]]:
    """The data modules whose preparation is pinned, over the sources of ``write_sources`` (relative paths), by name:
    each built when called."""
    prepare = PrepareConfig(dir="prepared", num_workers=2)
    tiny = dict(train_lines=40, val_lines=8, test_lines=8, data_root=data_root)
    render = image_text.RenderConfig(height=24, width=256)
    return {
        "classification": lambda: classification.TextClassificationDataModule(
            classification.PassageSource(corpus=None, tsv_files=["labelled.tsv"]),
            tokenizer_of("classification", vocab_size=400), max_tokens=32, prepare=prepare,
        ),
        "translation": lambda: translation.TranslationDataModule(
            translation.PairSource(tsv_files=["pairs.tsv"]),
            tokenizer_of("translation", vocab_size=300, joint_vocab=False, bpe_dropout=0.1,
                         bpe_dropout_segmentations=2),
            prepare=prepare, seed=1,
        ),
        "image_text": lambda: image_text.ImageTextDataModule(
            image_text.ImageTextSource(**tiny), render, tokenizer_of("image_text"),
            loader=ImageLoaderConfig(batch_size=8), prepare=prepare, seed=3,
        ),
        "image_text_ding": lambda: image_text.ImageTextDataModule(
            image_text.ImageTextSource(corpus="ding", **tiny), render, tokenizer_of("image_text"),
            loader=ImageLoaderConfig(batch_size=8), prepare=prepare, seed=3,
        ),
        "image_text_files": lambda: image_text_files.ImageTextFilesDataModule(
            image_text_files.ImageTextFiles(train="captions.jsonl", height=16, width=48, val_fraction=0.25),
            tokenizer_of("image_text_files", kind="char"), prepare=prepare,
        ),
    }  # fmt: skip


def value_bytes(value) -> bytes:
    if isinstance(value, np.ndarray):
        return str(value.dtype).encode() + value.tobytes()
    if isinstance(value, bytes):
        return value
    return repr(value).encode()


def digest(folder: Path) -> dict[str, str]:
    """The folder's name, and a hash of its manifest (its time left out), each tokenizer file and each record split
    (every record's fields in order, and ``lengths.npy``)."""
    manifest = {k: v for k, v in json.loads((folder / "prepared.json").read_text()).items() if k != "created"}
    found = {
        "folder": folder.name,
        "manifest": hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest(),
    }
    for path in sorted(folder.glob("tokenizer*.json")):
        found[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    for split in sorted(p for p in folder.iterdir() if p.is_dir()):
        records, h = Records(str(split)), hashlib.sha256()
        h.update(np.load(split / "lengths.npy").tobytes())
        for i in range(len(records)):
            for name, value in sorted(records[i].items()):
                h.update(name.encode() + value_bytes(value))
        found[split.name] = h.hexdigest()
    return found


def prepared_digests(root: Path, data_root: str, names=None) -> dict[str, dict[str, str]]:
    """Prepare each module (``names``: of them) over the sources in ``root`` (the working folder meanwhile), with
    file stamps made stable (``stable_stamp``); each one's ``digest``."""
    write_sources(root)
    saved = os.getcwd()
    patched = (classification, translation, image_text_files)  # the modules that stamp a user's files
    originals = [m.file_stamp for m in patched]
    os.chdir(root)
    try:
        for m in patched:
            m.file_stamp = stable_stamp
        builders = modules(data_root)
        return {name: digest(Path(builders[name]().prepared)) for name in (names or builders)}
    finally:
        for m, original in zip(patched, originals, strict=True):
            m.file_stamp = original
        os.chdir(saved)


if __name__ == "__main__":
    print(json.dumps(prepared_digests(Path(sys.argv[1]), sys.argv[2]), indent=1))
