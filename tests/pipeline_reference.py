"""Digests of what every data module prepares from tiny sources written here: the prepared folder's name (its
fingerprint's hash), its manifest (its keys in order, its time left out), every other file beside it (tokenizers,
``carve.json``) and every split (a record split's records and lengths, a token split's shards byte for byte), for
``test_prepared_records``'s pin of what the code of 42e7f06 prepared (before the data layer was reorganised into
families and sources), computed once by this file run against a worktree of 42e7f06:

    git worktree add /tmp/pin_head 42e7f06
    PYTHONPATH=/tmp/pin_head/src:/tmp/pin_head/tests python tests/pipeline_reference.py <empty folder> <repo>/data

(with this file copied into the worktree's tests/). It builds each module from its public name in ``lightformer.data``
and plain dicts of options (as a checkpoint's hyperparameters rebuild it), so that it runs on the code before and
after any of the classes and config groups move."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from lightformer.data import (
    ClipArtDataModule,
    ConversationFilesDataModule,
    EmojiDataModule,
    ImageDataModule,
    ImageTextDataModule,
    ImageTextFilesDataModule,
    ImageTokenDataModule,
    MaskedLMDataModule,
    SpanCorruptionDataModule,
    TextClassificationDataModule,
    TextDataModule,
    Tokenizer,
    TranslationDataModule,
    VisualQADataModule,
)
from lightformer.data.loading.streaming import Records

LABELS = ("alpha", "beta", "gamma")
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Straße", "„laut“", "naïve", "café")
MANIFEST = "prepared.json"
# The emoji fonts (Debian's fonts-noto-color-emoji, fonts-symbola) and the characters of their subsets, which the emoji
# module prepares from: every character is mapped by both and drawn by both (picked from the 1,139 of the fonts).
EMOJI_FONTS = {"noto": "/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf",
               "symbola": "/usr/share/fonts/truetype/ancient-scripts/Symbola_hint.ttf"}  # fmt: skip
EMOJI = (
    "\u00a9\u26bd\U0001f301\U0001f367\U0001f3d0\U0001f43c\U0001f4a0\U0001f505\U0001f58c\U0001f645\U0001f6f4\U0001f989"
)


def sentence(rng: np.random.Generator, count: int) -> str:
    return " ".join(WORDS[i] for i in rng.integers(len(WORDS), size=count))


def stable_stamp(path: Path) -> list:
    """``file_stamp`` with the path relative to the working folder and no time: the same fingerprint anywhere."""
    return [os.path.relpath(Path(path).resolve()), Path(path).stat().st_size, 0]


@contextmanager
def patched_everywhere(name: str, replacement: Callable[[Callable], Callable]) -> Iterator[int]:
    """Each loaded module of lightformer's that holds a function ``name`` (its own, or imported from where it is
    defined) holds ``replacement(that function)`` instead, until the block ends: wherever the function moves, every
    caller meets the replacement. Yields how many modules were patched."""
    patched, seen = [], set()
    for module in list(sys.modules.values()):
        module_name = getattr(module, "__name__", None)
        if not isinstance(module_name, str) or id(module) in seen:
            continue
        seen.add(id(module))  # an old name of a moved module is the same module: patched once
        if module_name == "lightformer" or module_name.startswith("lightformer."):
            real = vars(module).get(name)
            if callable(real):
                patched.append((module, real))
                setattr(module, name, replacement(real))
    try:
        yield len(patched)
    finally:
        for module, real in reversed(patched):
            setattr(module, name, real)


# --- the tiny sources -------------------------------------------------------------------------------------------


def write_sources(root: Path) -> None:
    """The tiny sources, in ``root``: labelled texts, sentence pairs, images with captions; a corpus and JSONL
    documents; a folder of image classes; LLaVA conversations about images; a clip art library."""
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
    write_texts(root, np.random.default_rng(1))
    write_image_folder(root / "images", np.random.default_rng(2))
    write_conversations(root / "chat", np.random.default_rng(3))
    write_library(root / "library", np.random.default_rng(4))


def write_texts(root: Path, rng: np.random.Generator) -> None:
    """``corpus.txt``: 200 lines of text in paragraphs; ``docs.jsonl`` and ``docs_val.jsonl``: documents of a few
    sentences, with another field beside the text."""
    lines = [sentence(rng, 2 + i % 9) + ("." if i % 4 == 3 else "") for i in range(200)]
    (root / "corpus.txt").write_text("".join(line + ("\n\n" if i % 25 == 24 else "\n") for i, line in
                                             enumerate(lines)), encoding="utf-8")  # fmt: skip
    for name, count in (("docs.jsonl", 90), ("docs_val.jsonl", 12)):
        docs = [{"id": i, "text": ". ".join(sentence(rng, 3 + (i + k) % 6) for k in range(1 + i % 3))}
                for i in range(count)]  # fmt: skip
        (root / name).write_text("".join(json.dumps(doc, ensure_ascii=False) + "\n" for doc in docs), encoding="utf-8")


def shape_image(rng: np.random.Generator, size: tuple[int, int], mode: str, kind: int) -> Image.Image:
    """A small drawing of a shape (``kind``: 0 an ellipse, 1 a rectangle, 2 stripes) in random colours."""
    background = "white" if mode != "RGBA" else (255, 255, 255, 0)
    image = Image.new(mode, size, background)
    draw = ImageDraw.Draw(image)
    colour = tuple(int(c) for c in rng.integers(0, 200, size=4 if mode == "RGBA" else 3))
    colour = colour if mode != "L" else colour[0]
    if mode == "RGBA":
        colour = (*colour[:3], 255)
    width, height = size
    box = (int(rng.integers(0, width // 3)), int(rng.integers(0, height // 3)), width - 2, height - 2)
    if kind == 0:
        draw.ellipse(box, fill=colour)
    elif kind == 1:
        draw.rectangle(box, fill=colour)
    else:
        for x in range(0, width, 4):
            draw.line((x, 0, x, height), fill=colour, width=2)
    return image


def write_image_folder(folder: Path, rng: np.random.Generator) -> None:
    """A folder of three classes of small images (``train/`` only: val and test are carved), PNG and JPEG, colour and
    grey, of several sizes."""
    for label, name in enumerate(("circle", "square", "stripes")):
        (folder / "train" / name).mkdir(parents=True, exist_ok=True)
        for i in range(9):
            image = shape_image(rng, (10 + 2 * i, 12 + i % 3), "L" if i % 4 == 3 else "RGB", label)
            suffix = ".jpg" if i % 3 == 2 else ".png"
            image.save(folder / "train" / name / f"{name}{i:02d}{suffix}", quality=90)


def write_conversations(folder: Path, rng: np.random.Generator) -> None:
    """LLaVA records about small images: ``train.jsonl`` (one or two turns a record; the image marker first, after
    the question, or absent) and ``test.json`` (a list of records)."""
    (folder / "img").mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(16):
        shape = ("ellipse", "box", "stripes")[i % 3]
        size = (12 + 3 * i, 10 + (5 * i) % 17)
        shape_image(rng, size, "RGB" if i % 5 else "L", i % 3).save(folder / "img" / f"{i:02d}.png")
        question = ("<image>\nWhat is drawn?", "What is drawn here? <image>", "Describe it.")[i % 3]
        turns = [question, f"A {shape}: {sentence(rng, 1 + i % 4)}."]
        if i % 2:
            turns += [f"Is it {sentence(rng, 1)}?", "Ja, „genau“." if i % 4 == 1 else "No."]
        roles = ("human", "gpt") * (len(turns) // 2)
        conversations = [{"from": role, "value": value} for role, value in zip(roles, turns, strict=True)]
        records.append({"id": f"r{i}", "image": f"img/{i:02d}.png", "conversations": conversations})
    (folder / "train.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records[:13]),
                                        encoding="utf-8")  # fmt: skip
    (folder / "test.json").write_text(json.dumps(records[13:], ensure_ascii=False, indent=1), encoding="utf-8")


# (category path and name, title, description, keywords) of the fake clip art library's drawings: three classes with
# variants, one drawing of "unsorted" (label -1), one without a caption (left out), titles beyond ASCII.
DRAWINGS = [
    ("animals/mammals/ram_ganson", "Dall Sheep Ram", "Dall Sheep Ram.", ["mammal", "animal", "ram"]),
    ("animals/crawfish1_ganson", "Crawfish", "A red crawfish", ["animal", "sea"]),
    ("animals/crawfish1_bw_ganson", "Crawfish", "A crawfish in black and white", ["animal"]),
    ("animals/owl_01", "Owl", "", ["bird", "night"]),
    ("food/apple_bitten_01", "Apple bitten", "An apple with a bite", ["fruit", "red", "food"]),
    ("food/burrito_ganson", "Burrito", "", ["food", "mexican"]),
    ("food/burrito_bw_ganson", "Burrito", "", ["food"]),
    ("food/cafe_creme", "Café crème", "Ein Kaffee „mit Milch“", ["café", "drink"]),
    ("computer/floppy", "Floppy disk", "A 3.5 inch floppy disk", []),
    ("computer/reload", "Reload", "", ["arrow", "icon"]),
    ("computer/browser", "", "", ["web", "icon"]),
    ("computer/clipboard_01", "Clipboard", "A clipboard", ["office"]),
    ("unsorted/duck", "Duck", "", ["bird"]),
    ("office/paper_01", "", "", []),
]
SVG = """<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"
  xmlns:cc="http://web.resource.org/cc/" xmlns:dc="http://purl.org/dc/elements/1.1/" width="20" height="20">
<metadata><rdf:RDF><cc:Work rdf:about="">{fields}
<dc:creator><cc:Agent><dc:title>An Author</dc:title></cc:Agent></dc:creator>
</cc:Work></rdf:RDF></metadata>
<rect x="2" y="2" width="16" height="16" fill="#336699"/>
</svg>
"""


def write_library(root: Path, rng: np.random.Generator) -> None:
    """A fake Open Clip Art Library (``png/`` and ``svg/``) of ``DRAWINGS``: PNGs on transparent paper (one large
    enough to be reduced in strips, one grey), SVGs with the RDF metadata the captions are read from."""
    for i, (name, title, description, keywords) in enumerate(DRAWINGS):
        for kind in ("png", "svg"):
            (root / kind / name).parent.mkdir(parents=True, exist_ok=True)
        size = (230, 170) if i == 0 else (20 + 3 * i, 16 + (7 * i) % 13)
        shape_image(rng, size, "L" if i == 5 else "RGBA", i % 3).save(root / "png" / f"{name}.png")
        fields = f"<dc:title>{title}</dc:title>" if title else ""
        fields += f"<dc:description>{description}</dc:description>" if description else ""
        if keywords:
            fields += "<dc:subject><rdf:Bag>" + "".join(f"<rdf:li>{k}</rdf:li>" for k in keywords) + "</rdf:Bag>"
            fields += "</dc:subject>"
        (root / "svg" / f"{name}.svg").write_text(SVG.format(fields=fields), encoding="utf-8")


def emoji_font_sizes() -> dict[str, int] | None:
    """The installed emoji fonts' sizes by style (which version is installed); None where one is absent."""
    if not all(Path(path).is_file() for path in EMOJI_FONTS.values()):
        return None
    return {style: Path(path).stat().st_size for style, path in EMOJI_FONTS.items()}


def write_emoji_fonts(root: Path) -> dict[str, str]:
    """Subsets of the two emoji fonts holding only ``EMOJI``, written in ``root`` (fontTools; no time stamped):
    their paths, by style."""
    from fontTools import subset
    from fontTools.ttLib import TTFont

    written = {}
    for style, path in EMOJI_FONTS.items():
        font = TTFont(path, recalcTimestamp=False)
        subsetter = subset.Subsetter(subset.Options())
        subsetter.populate(unicodes=[ord(c) for c in EMOJI])
        subsetter.subset(font)
        font.save(root / f"{style}.ttf")
        written[style] = f"{style}.ttf"
    return written


def write_char_tokenizer(path: Path) -> str:
    """A character tokenizer (what a run's ``tokenizer.json`` would be) of printable ASCII and the characters of the
    fake library's captions, for the visual questions."""
    texts = [" ".join([name, title, description, *keywords]) for name, title, description, keywords in DRAWINGS]
    Tokenizer.train_char([*texts, "".join(map(chr, range(32, 127))) + "\n"]).save(path)
    return str(path)


# --- the data modules and their digests --------------------------------------------------------------------------


def modules(data_root: str) -> dict[str, Callable[[], object]]:
    """The data modules whose preparation is pinned, over the sources of ``write_sources`` (relative paths), by name:
    each built when called (in the folder of the sources), from its public name and plain dicts of options."""
    prepare = {"dir": "prepared", "num_workers": 2}
    tiny = dict(train_lines=40, val_lines=8, test_lines=8, data_root=data_root)
    render = {"height": 24, "width": 256}
    images = {"dataset": "image_folder", "image_folder": "images"}
    corpus = {"train_files": ["corpus.txt"], "val_fraction": 0.1, "test_fraction": 0.1}
    return {
        "classification": lambda: TextClassificationDataModule(
            {"corpus": None, "tsv_files": ["labelled.tsv"]}, {"kind": "bpe", "vocab_size": 400}, max_tokens=32,
            prepare=prepare,
        ),
        "translation": lambda: TranslationDataModule(
            {"tsv_files": ["pairs.tsv"]},
            {"kind": "bpe", "vocab_size": 300, "joint_vocab": False, "bpe_dropout": 0.1,
             "bpe_dropout_segmentations": 2},
            prepare=prepare, seed=1,
        ),
        "image_text": lambda: ImageTextDataModule(
            tiny, render, {"kind": "char"}, loader={"batch_size": 8}, prepare=prepare, seed=3,
        ),
        "image_text_ding": lambda: ImageTextDataModule(
            {"corpus": "ding", **tiny}, render, {"kind": "char"}, loader={"batch_size": 8}, prepare=prepare, seed=3,
        ),
        "image_text_files": lambda: ImageTextFilesDataModule(
            {"train": "captions.jsonl", "height": 16, "width": 48, "val_fraction": 0.25}, {"kind": "char"},
            prepare=prepare,
        ),
        "text_char": lambda: TextDataModule(corpus, {"kind": "char"}, prepare=prepare),
        "text_bpe": lambda: TextDataModule(
            {"train_files": ["docs.jsonl"], "val_files": ["docs_val.jsonl"]}, {"kind": "bpe", "vocab_size": 300},
            prepare=prepare,
        ),
        "masked_lm": lambda: MaskedLMDataModule(
            {**corpus, "split": "each_file"}, {"kind": "bpe", "vocab_size": 400}, prepare=prepare,
        ),
        "span_corruption": lambda: SpanCorruptionDataModule(corpus, {"kind": "char"}, prepare=prepare),
        "image_folder": lambda: ImageDataModule(images, prepare=prepare, image_size=16, seed=5),
        "image_tokens": lambda: ImageTokenDataModule(
            images, {"kind": "kmeans", "levels": 8}, prepare=prepare, image_size=8, seed=5,
        ),
        "conversations": lambda: ConversationFilesDataModule(
            {"train": "chat/train.jsonl", "test": "chat/test.json", "val_fraction": 0.3, "image_size": 16,
             "fit": "pad"},
            {"kind": "char"}, prepare=prepare,
        ),
        "clipart": lambda: ClipArtDataModule(
            {"root": "library", "image_size": 24, "val_fraction": 0.3, "test_fraction": 0.3}, prepare=prepare,
        ),
        "emoji": lambda: EmojiDataModule(
            {**{f"{style}_font": path for style, path in write_emoji_fonts(Path()).items()}, "image_size": 16,
             "val_fraction": 0.5},
            prepare=prepare,
        ),
        "visual_qa": lambda: VisualQADataModule(
            {"sources": ["clipart"], "seen": 2, "clipart_root": "library", "drawing_size": 16, "val_fraction": 0.3,
             "test_fraction": 0.3},
            {"file": write_char_tokenizer(Path("vqa-tokenizer.json"))}, prepare=prepare, seed=2,
        ),
        "visual_qa_lines": lambda: VisualQADataModule(
            {"sources": ["lines"], "seen": 1, "train_lines": 6, "val_lines": 2, "test_lines": 2, "line_width": 128,
             "data_root": "data"},
            {"file": write_char_tokenizer(Path("vqa-tokenizer.json"))}, prepare=prepare, seed=2,
        ),
    }  # fmt: skip


def value_bytes(value) -> bytes:
    if isinstance(value, np.ndarray):
        return str(value.dtype).encode() + value.tobytes()
    if isinstance(value, bytes):
        return value
    return repr(value).encode()


def record_split(split: Path) -> str:
    """A record split's hash: ``lengths.npy``, then every record's fields (by name) in order."""
    records, h = Records(str(split)), hashlib.sha256()
    h.update(np.load(split / "lengths.npy").tobytes())
    for i in range(len(records)):
        for name, value in sorted(records[i].items()):
            h.update(name.encode() + value_bytes(value))
    return h.hexdigest()


def token_split(split: Path) -> str:
    """A token split's hash: its ``index.json`` (its time left out), then each shard's bytes, in the index's order."""
    index = json.loads((split / "index.json").read_text())
    index.pop("updated_at", None)
    h = hashlib.sha256(json.dumps(index, sort_keys=True).encode())
    for chunk in index["chunks"]:
        h.update((split / chunk["filename"]).read_bytes())
    return h.hexdigest()


def digest(folder: Path) -> dict[str, str]:
    """The folder's name; a hash of its manifest (keys in their order, values with their JSON types; its time left
    out), of each other file beside it (tokenizers, ``carve.json``) and of each split (``record_split``, or
    ``token_split`` for token shards)."""
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest.pop("created")
    found = {"folder": folder.name, "manifest": hashlib.sha256(json.dumps(manifest, indent=1).encode()).hexdigest()}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name != MANIFEST:
            found[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir():
            found[path.name] = record_split(path) if (path / "lengths.npy").is_file() else token_split(path)
    return found


def palette(data) -> dict[str, str]:
    """An Image GPT data module's palette (fitted on its prepared training images), hashed."""
    fitted = json.dumps(data.pixel_tokenizer.to_dict(), sort_keys=True)
    return {"palette": hashlib.sha256(fitted.encode()).hexdigest()}


# What a module's data decides besides its prepared folder, by pin name.
EXTRAS: dict[str, Callable[[object], dict[str, str]]] = {"image_tokens": palette}


def prepared_digests(root: Path, data_root: str, names=None) -> dict[str, dict[str, str]]:
    """Prepare each module (``names``: of them) over the sources in ``root`` (the working folder meanwhile), with
    file stamps made stable (``stable_stamp``, wherever ``file_stamp`` is called from); each one's ``digest`` (and
    its ``EXTRAS``)."""
    root = Path(root).resolve()
    write_sources(root)
    if not (root / "data").exists():  # the data root by a relative name, which the visual questions' fingerprint holds
        (root / "data").symlink_to(Path(data_root).resolve(), target_is_directory=True)
    saved = os.getcwd()
    os.chdir(root)
    try:
        with patched_everywhere("file_stamp", lambda real: stable_stamp) as count:
            assert count, "no module of lightformer's holds file_stamp: the fingerprints would hold times"
            builders, found = modules(data_root), {}
            for name in names or builders:
                data = builders[name]()
                prepared = data.prepared
                folder = Path(getattr(prepared, "folder", prepared))  # a PreparedText, or the folder
                assert str(root) not in (folder / MANIFEST).read_text(encoding="utf-8"), (
                    f"{name}: a source's absolute path is in the fingerprint of {folder.name}: file_stamp was called "
                    "where patched_everywhere did not patch it"
                )
                found[name] = digest(folder)
                found[name].update(EXTRAS[name](data) if name in EXTRAS else {})
            return found
    finally:
        os.chdir(saved)


if __name__ == "__main__":
    print(json.dumps(prepared_digests(Path(sys.argv[1]), sys.argv[2]), indent=1))
