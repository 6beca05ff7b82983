"""Image-to-text data: the declared typefaces (an extra font installed beside them changes nothing) and a user's font
folder's fonts grouped by family, lines rendered the same for a seed and otherwise for another,
text and typefaces held out, batches of the contract's shapes that decode back to their text, the Austen LM's
character tokenizer, German lines of Ding's sentences with their own characters, fonts that cannot draw the text
refused, bad options refused naming their field, rendering one line at a time, jitter and an exact mid-epoch
resume."""

from __future__ import annotations

import io
import string
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import lightformer.data.sources.lines as image_text
from lightformer.data.families.image_text import ImageTextDataModule
from lightformer.data.families.text import TextDataModule
from lightformer.data.loading.streaming import LoaderConfig, Records
from lightformer.data.preparation.prepare import PrepareConfig, TokenizerConfig
from lightformer.data.sources import rendering
from lightformer.data.sources.corpora import DING_FILE, CorpusUnavailableError, austen_text, split_of
from lightformer.data.sources.lines import (
    DEFAULT_HELD_OUT,
    ImageTextSource,
    LineDrawer,
    RenderConfig,
    check_glyphs,
    line_records,
    split_families,
    split_sentences,
)
from lightformer.data.sources.rendering import (
    FONT_ROOT,
    SKIPPED_FAMILIES,
    TYPEFACES,
    LineStyle,
    LineTooWide,
    missing_typefaces,
    render_line,
    typefaces,
)
from lightformer.data.sources.text import TextSource
from lightformer.errors import ConfigError
from lightformer.tokenization.text import BOS_ID, EOS_ID, Tokenizer

REPO = Path(__file__).resolve().parents[1]
DATA_ROOT = str(REPO / "data")
TINY = dict(train_lines=160, val_lines=32, test_lines=32, data_root=DATA_ROOT)
RENDER = RenderConfig(height=24, width=256)

pytestmark = pytest.mark.skipif(bool(missing_typefaces()), reason="the declared typefaces are not all installed")


@pytest.fixture(scope="module")
def austen() -> str:
    try:
        return str(austen_text(Path(DATA_ROOT) / "austen"))
    except CorpusUnavailableError as error:
        pytest.skip(f"could not fetch the Austen corpus: {error}")


@pytest.fixture(scope="module")
def data(austen, tmp_path_factory) -> ImageTextDataModule:
    module = ImageTextDataModule(
        ImageTextSource(**TINY), RENDER, loader=LoaderConfig(batch_size=8),
        prepare=PrepareConfig(dir=str(tmp_path_factory.mktemp("prepared")), num_workers=2), seed=3,
    )  # fmt: skip
    module.prepare_data()
    module.setup()
    return module


def split_records(data: ImageTextDataModule, split: str) -> list[dict]:
    records = Records(str(data.prepared / split))
    return [records[i] for i in range(len(records))]


def drawer(austen: str, seed: int, **options) -> LineDrawer:
    source = ImageTextSource(**TINY, **options)
    families = split_families(source)
    return LineDrawer(source, RENDER, seed, austen, tuple(families.items()))


# --- fonts and rendering ---------------------------------------------------------------------------------------


def test_the_typefaces_are_the_declared_text_fonts_and_a_users_folder_is_searched(tmp_path):
    fonts = typefaces()  # data.source.font_dir's default
    assert len(fonts) == 47 and not SKIPPED_FAMILIES & set(fonts) and set(DEFAULT_HELD_OUT) <= set(fonts)
    for family in ("DejaVu Sans", "Liberation Serif", "Nimbus Roman"):
        assert len(fonts[family]) >= 4  # weights and slants of one family, one file each
    assert len({path for paths in fonts.values() for path in paths}) == sum(map(len, fonts.values())) == 234
    listed = set((REPO / "debian-packages.txt").read_text(encoding="utf-8").split())
    assert {package for packages in TYPEFACES.values() for package in packages} <= listed
    # a folder of the user's own: every text font in it, one file per (family, style), the .otf before the .t1;
    # dingbats and Go's small capitals (fonts-go installs them beside Go) left out
    for name in ("opentype/urw-base35/D050000L.otf", "opentype/urw-base35/P052-Roman.otf",
                 "type1/urw-base35/P052-Roman.t1", "fonts-go/Go-Smallcaps.ttf", "fonts-go/Go-Regular.ttf"):  # fmt: skip
        (tmp_path / Path(name).name).symlink_to(FONT_ROOT / name)
    assert typefaces(str(tmp_path)) == {"Go": (str(tmp_path / "Go-Regular.ttf"),),
                                        "P052": (str(tmp_path / "P052-Roman.otf"),)}  # fmt: skip


def test_a_font_installed_beside_the_declared_ones_never_changes_the_lines(austen, tmp_path, monkeypatch):
    """Before: every font under /usr/share/fonts was used, so a browser's fonts-liberation 1.07 beside
    fonts-liberation2 changed the lines' pixels (and the b1bd12e checkpoint's normalisation no longer matched)."""
    from fontTools.ttLib import TTFont

    declared = {family: [Path(p).relative_to(FONT_ROOT) for p in paths] for family, paths in typefaces().items()}
    before = [drawer(austen, 3).line(split, 0) for split in ("train", "val")]
    root = tmp_path / "fonts"  # the declared files, and another "Liberation Sans" "Regular" where 1.07's would be
    for file in (f for packages in TYPEFACES.values() for files in packages.values() for f in files):
        (root / file).parent.mkdir(parents=True, exist_ok=True)
        (root / file).symlink_to(FONT_ROOT / file)
    extra = root / "truetype" / "liberation" / "LiberationSans-Regular.ttf"
    ours = FONT_ROOT / "truetype" / "liberation2" / "LiberationSans-Regular.ttf"
    extra.parent.mkdir(parents=True)
    font = TTFont(FONT_ROOT / "fonts-go" / "Go-Regular.ttf")  # Go's design under Liberation Sans's name
    for record in font["name"].names:
        record.string = {1: "Liberation Sans", 16: "Liberation Sans", 2: "Regular", 17: "Regular"}.get(
            record.nameID, record.string)  # fmt: skip
    font.save(extra)
    assert rendering.font_family(extra) == rendering.font_family(ours)  # discovery took the first: this one

    def emma(path: Path) -> bytes:
        return render_line("Emma", str(path), LineStyle(size=0.9), 32, 128).tobytes()

    assert emma(extra) != emma(ours)  # and it draws other pixels

    monkeypatch.setattr(rendering, "FONT_ROOT", root)
    assert {family: [Path(p).relative_to(root) for p in paths] for family, paths in typefaces().items()} == declared
    after = [drawer(austen, 3).line(split, 0) for split in ("train", "val")]
    for (line, image), (line_after, image_after) in zip(before, after, strict=True):
        assert Path(line_after.font).relative_to(root) == Path(line.font).relative_to(FONT_ROOT)
        assert replace(line_after, font=line.font) == line and image_after.tobytes() == image.tobytes()


def test_a_line_is_dark_on_light_left_aligned_and_too_wide_refused():
    font = next(iter(typefaces().values()))[0]
    image = render_line("Emma", font, LineStyle(margin=3, contrast=1.0, background=1.0), 32, 256)
    pixels = np.asarray(image)
    assert image.mode == "L" and pixels.shape == (32, 256)
    assert pixels.min() < 80 and np.median(pixels) == 255
    ink_columns = np.flatnonzero((pixels < 128).any(axis=0))
    assert 2 <= ink_columns[0] <= 6 and ink_columns[-1] < 160  # left-aligned, the rest background
    with pytest.raises(LineTooWide):
        render_line("It is a truth universally acknowledged, that a single man", font, LineStyle(size=0.9), 32, 256)


def test_the_same_seed_renders_the_same_lines_another_seed_others(austen, data):
    first, again, other = drawer(austen, 3), drawer(austen, 3), drawer(austen, 4)
    for split in ("train", "val"):
        for index in range(4):
            line, image = first.line(split, index)
            line_again, image_again = again.line(split, index)
            assert line == line_again and image.tobytes() == image_again.tobytes()
            assert image.tobytes() != other.line(split, index)[1].tobytes()
    # the prepared records, rendered by two processes, are these lines bit for bit
    for index, record in enumerate(split_records(data, "val")[:5]):
        line, image = first.line("val", index)
        assert record["text"] == line.text and record["family"] == line.family
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(record["image"]))), np.asarray(image))


# --- held out by text and typeface -----------------------------------------------------------------------------


def test_no_line_is_longer_than_max_chars(austen):
    drawn = [drawer(austen, 0, max_chars=20).line("train", i)[0] for i in range(40)]
    assert max(len(line.text) for line in drawn) <= 20
    assert sum(line.text_redraws for line in drawn) > 0  # 1-8 words are often longer: they were drawn again
    assert max(len(drawer(austen, 0).line("train", i)[0].text) for i in range(40)) > 20


def test_val_and_test_are_held_out_by_typeface_and_text(data):
    records = {split: split_records(data, split) for split in ("train", "val", "test", "test_seen")}
    families = {split: {r["family"] for r in rows} for split, rows in records.items()}
    held_out = set(ImageTextSource().held_out_families)
    assert families["val"] <= held_out and families["test"] <= held_out
    assert not families["train"] & held_out and families["test_seen"] <= set(data.families["train"])
    assert set(data.manifest["families"]["val"]) <= held_out
    train_texts = {r["text"] for r in records["train"]}
    for split in ("val", "test", "test_seen"):
        assert not train_texts & {r["text"] for r in records[split]}
    same = sum(a["text"] == b["text"] for a, b in zip(records["test"], records["test_seen"], strict=True))
    assert same >= 0.8 * len(records["test"])  # the same texts, but for lines redrawn to fit
    words = [len(r["text"].split()) for rows in records.values() for r in rows]
    assert min(words) >= 1 and max(words) <= 8
    assert data.manifest["lines"] == {"train": 160, "val": 32, "test": 32, "test_seen": 32}


def test_test_fonts_seen_reads_the_seen_test_split(data, tmp_path):
    seen = ImageTextDataModule(ImageTextSource(**TINY, test_fonts="seen"), RENDER,
                               prepare=replace(data.prepare_config), seed=3)  # fmt: skip
    assert seen.prepared == data.prepared  # nothing prepared again
    families = {r["family"] for r in split_records(data, "test_seen")}
    batch = next(iter(seen.test_dataloader()))
    assert batch["text"][0] == split_records(data, "test_seen")[0]["text"]
    assert families <= set(data.families["train"])


# --- batches and facts -----------------------------------------------------------------------------------------


def test_a_batch_has_the_contract_and_decodes_back_to_its_text(data):
    facts = data.data_facts()
    assert facts.image_size == (24, 256) and facts.in_channels == 1 and facts.pad_id == data.tokenizer.pad_id
    assert facts.vocab_size == data.tokenizer.vocab_size and 0 < facts.normalize_mean[0] < 1
    for loader in (data.train_dataloader(), data.val_dataloader(), data.test_dataloader()):
        batch = next(iter(loader))
        images, tgt, texts = batch["images"], batch["tgt"], batch["text"]
        assert images.dtype == torch.float32 and images.shape == (8, 1, 24, 256)
        assert tgt.dtype == torch.int64 and tgt.shape[0] == 8 and len(texts) == 8
        assert tgt.shape[1] == max(len(t) for t in texts) + 2 <= facts.max_length
        assert (tgt[:, 0] == BOS_ID).all()
        for row, text in zip(tgt.tolist(), texts, strict=True):
            assert row[len(text) + 1] == EOS_ID and set(row[len(text) + 2 :]) <= {facts.pad_id}
            assert data.tokenizer.decode(row) == text
    val = next(iter(data.val_dataloader()))["images"]
    assert abs(val.mean().item()) < 1.5 and 0.3 < val.std().item() < 3


def test_the_default_tokenizer_is_the_austen_char_lms(data, tmp_path):
    source = TextSource(corpus="austen", val_fraction=0.1, data_root=DATA_ROOT)  # configs/lm/austen_char.yaml's
    lm = TextDataModule(source, TokenizerConfig(kind="char"), prepare=PrepareConfig(dir=str(tmp_path), num_workers=2))
    mine, theirs = data.tokenizer, lm.tokenizer
    assert mine.difference(theirs) is None and mine.to_str() == theirs.to_str()
    assert data.data_facts().tokenizer == lm.data_facts().tokenizer


def test_a_tokenizer_file_is_used(data, tmp_path):
    path = data.tokenizer.save(tmp_path / "tokenizer.json")
    module = ImageTextDataModule(ImageTextSource(**TINY), RENDER, TokenizerConfig(file=str(path)),
                                 prepare=replace(data.prepare_config), seed=3)  # fmt: skip
    assert module.data_facts() == data.data_facts()
    with pytest.raises(FileNotFoundError, match="data.tokenizer.file"):
        TokenizerConfig(file=str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="data.tokenizer.kind='bpe': ImageTextDataModule prepares its text with kind "
                                          "'char' \\(or a data.tokenizer.file\\)"):  # fmt: skip
        ImageTextDataModule(ImageTextSource(**TINY), RENDER, {"kind": "bpe"})


# --- German: Ding's sentences ---------------------------------------------------------------------------------


@pytest.mark.skipif(not Path(DING_FILE).is_file(), reason="the Ding dictionary (apt-get install trans-de-en)")
def test_german_lines_are_ding_sentences_of_their_split_in_their_own_characters(tmp_path):
    source = ImageTextSource(corpus="ding", **TINY)
    data = ImageTextDataModule(source, RENDER, loader=LoaderConfig(batch_size=8),
                               prepare=PrepareConfig(dir=str(tmp_path), num_workers=2), seed=1)  # fmt: skip
    data.prepare_data()
    data.setup()
    assert data.prepared.name.startswith("image-text-ding-") and (data.prepared / "tokenizer.json").is_file()
    sentences = split_sentences("ding", DING_FILE)
    assert 800 < len(sentences["val"]) < 1000 < len(sentences["train"])  # 17,103 sentences, 5% / 5% / 90%
    every = "".join({c for split in sentences.values() for text in split for c in text})
    tokenizer = data.tokenizer
    assert tokenizer.unknown_characters(every) == [] and tokenizer.unknown_characters("äöüÄÖÜß€") == []
    lines = {split: [r["text"] for r in split_records(data, split)] for split in ("train", "val", "test")}
    assert any(set(text) & set("äöüß") for text in lines["train"])
    for split, texts in lines.items():  # a run of words of one of its split's sentences, its own bucket its split
        assert len(texts) == TINY[f"{split}_lines"]
        assert all(split_of(text) == split for text in texts)
        assert all(any(text in sentence for sentence in sentences[split]) for text in texts[:20])
    batch = next(iter(data.train_dataloader()))
    assert tokenizer.decode_batch(batch["tgt"].tolist()) == batch["text"]
    assert data.data_facts().vocab_size == tokenizer.vocab_size
    english = Tokenizer.train_char([string.printable]).save(tmp_path / "english.json")
    other = ImageTextDataModule(source, RENDER, TokenizerConfig(file=str(english)),
                                prepare=PrepareConfig(dir=str(tmp_path)), seed=1)  # fmt: skip
    assert other.prepared == data.prepared  # the tokenizer is not part of what is rendered
    with pytest.raises(ValueError, match=r"data\.tokenizer\.file: .*english\.json has no token for '.*ä.*'"):
        other.data_facts()


def test_the_ding_corpus_missing_says_how_to_install_it(tmp_path):
    source = ImageTextSource(corpus="ding", ding_file=str(tmp_path / "de-en"), **TINY)
    data = ImageTextDataModule(source, RENDER, prepare=PrepareConfig(dir=str(tmp_path)))
    with pytest.raises(CorpusUnavailableError, match=r"data\.source\.ding_file.*apt-get install trans-de-en"):
        data.prepare_data()


def test_a_font_that_cannot_draw_the_text_is_refused_naming_it_and_the_characters():
    font = typefaces()["DejaVu Sans"][0]
    check_glyphs({"DejaVu Sans": (font,)}, "Grüße, Anne!")  # draws all of these
    with pytest.raises(ValueError, match=rf"data\.source\.font_dir: 1 font.*{font}: '漢字'"):
        check_glyphs({"DejaVu Sans": (font,)}, "Grüße 漢字")


# --- options refused -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: ImageTextSource(held_out_families=("Comic Sans MS",)), "data.source.held_out_families"),
        (lambda: ImageTextSource(held_out_families=tuple(typefaces())), "data.source.held_out_families"),
        (lambda: ImageTextSource(min_words=5, max_words=3), "data.source.max_words"),
        (lambda: ImageTextSource(min_words=0), "data.source.min_words"),
        (lambda: ImageTextSource(max_chars=0), "data.source.max_chars"),
        (lambda: ImageTextSource(test_fonts="both"), "data.source.test_fonts"),
        (lambda: ImageTextSource(corpus="bible"), "data.source.corpus"),
        (lambda: RenderConfig(height=8), "data.render.height"),
        (lambda: RenderConfig(size=(0.9, 0.5)), "data.render.size"),
        (lambda: RenderConfig(contrast=(0.0, 2.0)), "data.render.contrast"),
    ],
)
def test_bad_options_are_refused_naming_the_field(make, field, tmp_path):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        source = make()
        ImageTextDataModule(source, prepare=PrepareConfig(dir=str(tmp_path)))  # the installed fonts, checked here


# --- memory, augmentation, resume ------------------------------------------------------------------------------


def test_lines_are_rendered_and_written_one_at_a_time(austen, monkeypatch):
    """Records leave the generator as they are rendered: the piece's images are never held together."""
    rendered = []
    real = image_text.LineDrawer.line
    monkeypatch.setattr(image_text.LineDrawer, "line", lambda self, *a: rendered.append(a) or real(self, *a))
    records = line_records((0, 50), drawer(austen, 0), "train")
    for count in range(1, 4):
        record = next(records)
        assert len(rendered) == count and isinstance(record["image"], bytes)
    rest = []
    with pytest.raises(StopIteration) as done:  # the piece's counts are returned once it is done
        while True:
            rest.append(next(records))
    assert len(rest) == 47 and sum(done.value.value["families"].values()) == 50
    assert image_text.PIECE_LINES <= 1000


def test_training_lines_are_jittered_by_seed_epoch_and_index_and_evaluation_lines_not(data):
    train, val = data.dataset("train"), data.dataset("val")
    stored = np.asarray(Image.open(io.BytesIO(train.records[5]["image"])))
    first, again, later = train[(5, 0)]["image"], train[(5, 0)]["image"], train[(5, 1)]["image"]
    assert torch.equal(first, again) and not torch.equal(first, later)
    assert not np.array_equal(first[0].numpy(), stored)
    assert np.array_equal(val[2]["image"][0].numpy(), np.asarray(Image.open(io.BytesIO(val.records[2]["image"]))))


def test_the_training_loader_resumes_mid_epoch_exactly(data):
    whole = []
    for i, batch in enumerate(data.train_dataloader()):
        whole.append(batch)
        if i == 3:
            break
    resumed = data.train_dataloader()
    resumed.load_state_dict({"epoch": 0, "batches": 2})
    batch = next(iter(resumed))
    assert batch["text"] == whole[2]["text"] and torch.equal(batch["images"], whole[2]["images"])
    assert torch.equal(batch["tgt"], whole[2]["tgt"])
