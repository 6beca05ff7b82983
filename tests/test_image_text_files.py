"""Image-to-text data of a user's own: a folder of drawn images with JSONL, CSV, TSV or COCO captions annotations,
prepared into records and read back, every caption trained on across epochs, all of them the references of val and
test, validation carved by a hash of the file name, each bad input refused naming the file and row, and a short fit
and test of the image-to-text task on it."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from lightformer.cli.main import main
from lightformer.data.families.image_text import ImageTextFilesDataModule
from lightformer.data.loading.streaming import LoaderConfig, Records
from lightformer.data.objectives.augment import jitter
from lightformer.data.preparation.prepare import PrepareConfig
from lightformer.data.sources.captions import ImageTextFiles, carved
from lightformer.data.sources.image_files import read_line_image
from lightformer.errors import DataError
from tiny_runs import events_of, quiet_run_args, tower_options

WORDS = ["red", "blue", "green", "sun", "moon", "star", "tree", "fish"]
IMAGES = 24


def draw(path: Path, index: int, mode: str) -> None:
    """An image of its own size: a word written and a shape drawn, in a colour of the index."""
    image = Image.new(mode, (60 + 7 * (index % 5), 20 + 3 * (index % 3)), "white")
    draw = ImageDraw.Draw(image)
    colour = (40 * (index % 6), 0, 255 - 30 * (index % 8)) if mode == "RGB" else 0
    draw.text((3, 3), WORDS[index % len(WORDS)], fill=colour)
    draw.rectangle((40, 4, 40 + index % 10, 14), fill=colour)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def captions(index: int) -> list[str]:
    """Image i's texts: two or three (one for every fourth image)."""
    word = WORDS[index % len(WORDS)]
    return [f"{word} {index}", f"a {word}, drawn", f'the "{word}"'][: 1 if index % 4 == 0 else 2 + index % 2]


def write_folder(root: Path, layout: str, count: int = IMAGES) -> Path:
    """``count`` images and their annotation file in ``layout``; returns the annotation file."""
    mode = "RGB" if layout == "coco" else "L"
    if layout == "coco":  # COCO's own: annotations/captions_train2017.json beside train2017/
        for i in range(count):
            draw(root / "train2017" / f"{i:012d}.jpg", i, mode)
        images = [{"id": 100 + i, "file_name": f"{i:012d}.jpg"} for i in range(count)]
        annotations = [{"id": len(images) * k + i, "image_id": 100 + i, "caption": text}
                       for i in range(count) for k, text in enumerate(captions(i))]  # fmt: skip
        path = root / "annotations" / "captions_train2017.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"images": images, "annotations": annotations}))
        return path
    rows = [(f"img/{i:03d}.png", text) for i in range(count) for text in captions(i)]
    for i in range(count):
        draw(root / f"img/{i:03d}.png", i, mode)
    path = root / f"train.{layout}"
    if layout == "jsonl":
        path.write_text("".join(json.dumps({"file": f, "text": t}) + "\n" for f, t in rows))
    else:
        with open(path, "w", newline="") as out:
            writer = csv.writer(out, delimiter="\t" if layout == "tsv" else ",")
            writer.writerow(["text", "file"])  # by name, in any order
            writer.writerows([(t, f) for f, t in rows])
    return path


def first_line(index: int, header: bool) -> int:
    """The line of an annotation table that first names image ``index``."""
    return 1 + header + sum(len(captions(i)) for i in range(index))


def module(train: Path, tmp_path: Path, **options) -> ImageTextFilesDataModule:
    loader = LoaderConfig(batch_size=options.pop("batch_size", 6))
    shape = dict(height=16, width=48, channels=3 if train.suffix == ".json" else 1)
    source = ImageTextFiles(train=str(train), **(shape | options))
    return ImageTextFilesDataModule(source, loader=loader, prepare=PrepareConfig(dir=str(tmp_path / "prepared"),
                                                                                 num_workers=2))  # fmt: skip


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> ImageTextFilesDataModule:
    root = tmp_path_factory.mktemp("coco")
    data = module(write_folder(root, "coco"), root, val_fraction=0.25)
    data.prepare_data()
    data.setup()
    return data


def read_back(data: ImageTextFilesDataModule, split: str) -> dict[str, tuple[list[str], tuple]]:
    records = Records(str(data.prepared / split))
    return {r["file"]: (json.loads(r["texts"]), np.asarray(Image.open(io.BytesIO(r["image"]))).shape)
            for r in (records[i] for i in range(len(records)))}  # fmt: skip


# --- layouts ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["jsonl", "csv", "tsv", "coco"])
def test_each_layout_is_prepared_into_records_of_each_image_with_all_its_texts(layout, tmp_path):
    data = module(write_folder(tmp_path, layout), tmp_path, val_fraction=0.25)
    data.prepare_data()
    found = read_back(data, "train") | read_back(data, "val")
    names = [f"{i:012d}.jpg" if layout == "coco" else f"img/{i:03d}.png" for i in range(IMAGES)]
    assert sorted(found) == sorted(names)
    shape = (16, 48, 3) if layout == "coco" else (16, 48)
    assert {name: found[name] for name in names} == {name: (captions(i), shape) for i, name in enumerate(names)}
    manifest = data.manifest
    assert manifest["images"]["train"] + manifest["images"]["val"] == IMAGES and manifest["images"]["test"] == 0
    facts = data.data_facts()
    channels = 3 if layout == "coco" else 1
    assert facts.image_size == (16, 48) and facts.in_channels == channels == len(facts.normalize_mean)
    assert facts.vocab_size == data.tokenizer.vocab_size
    longest = max(len(text) for i in range(IMAGES) for text in captions(i))
    assert facts.max_length == longest + 2  # characters, BOS and EOS


def test_photos_are_resized_stored_as_jpeg_and_read_by_a_model_the_same_way(tmp_path):
    data = module(write_folder(tmp_path, "coco", count=8), tmp_path, val_fraction=0, fit="resize")
    data.prepare_data()
    records = Records(str(data.prepared / "train"))
    assert all(records[i]["image"][:2] == b"\xff\xd8" for i in range(len(records)))  # JPEG
    facts = data.data_facts()
    assert facts.image_fit == "resize" and module(write_folder(tmp_path / "l", "jsonl"), tmp_path).source.fit == "line"
    original = tmp_path / "train2017" / f"{3:012d}.jpg"
    read = read_line_image(original, 3, (16, 48), facts.normalize_mean, facts.normalize_std, facts.image_fit)
    stretched = Image.open(original).convert("RGB").resize((48, 16), Image.Resampling.LANCZOS)
    expected = (torch.from_numpy(np.array(stretched)).permute(2, 0, 1) / 255 - torch.tensor(facts.normalize_mean)
                [:, None, None]) / torch.tensor(facts.normalize_std)[:, None, None]  # fmt: skip
    torch.testing.assert_close(read, expected)
    stored = np.asarray(Image.open(io.BytesIO(records[0]["image"])))
    assert stored.shape == (16, 48, 3)
    as_line = read_line_image(original, 3, (16, 48), facts.normalize_mean, facts.normalize_std, "line")
    assert not torch.allclose(as_line, read)  # a 81 x 20 image: a line keeps its aspect, a photo is stretched


def test_a_batch_has_the_contract_and_val_references_carry_every_caption(coco):
    facts = coco.data_facts()
    assert facts.in_channels == 3 and len(facts.normalize_std) == 3 and facts.pad_id == coco.tokenizer.pad_id
    train = next(iter(coco.train_dataloader()))
    assert train["images"].shape == (6, 3, 16, 48) and train["images"].dtype == torch.float32
    for text, references in zip(train["text"], train["references"], strict=True):
        assert text in references
    records = read_back(coco, "val")
    batch = next(iter(coco.val_dataloader()))
    expected = list(records.values())[: len(batch["text"])]
    assert batch["references"] == [texts for texts, _ in expected]
    assert batch["text"] == [texts[0] for texts, _ in expected]
    for row, text in zip(batch["tgt"].tolist(), batch["text"], strict=True):
        assert coco.tokenizer.decode(row) == text


def test_every_caption_is_trained_on_across_epochs(coco):
    train = coco.dataset("train")
    records = Records(str(coco.prepared / "train"))
    for index in range(len(train)):
        texts = json.loads(records[index]["texts"])
        seen = {train[(index, epoch)]["text"] for epoch in range(len(texts))}
        assert seen == set(texts)
        assert train[(index, 0)]["references"] == texts
    trained: list[str] = []
    loader = coco.train_dataloader()
    for epoch in range(3):  # through the loader too: each image's next caption each epoch
        loader.sampler.set_epoch(epoch)
        trained += [text for batch in loader for text in batch["text"]]
    assert set(trained) == {t for i in range(len(records)) for t in json.loads(records[i]["texts"])}


def test_validation_is_carved_by_a_hash_of_the_file_name_disjoint_and_stable(coco, tmp_path):
    train, val = read_back(coco, "train"), read_back(coco, "val")
    assert val and not set(train) & set(val)
    assert set(val) == {f"{i:012d}.jpg" for i in range(IMAGES) if carved(f"{i:012d}.jpg", 0.25)}
    # the same images whatever the order of the rows, and however many other images there are
    path = write_folder(tmp_path, "jsonl", count=40)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(reversed(lines)) + "\n")
    other = module(path, tmp_path, val_fraction=0.25)
    splits = other.splits()
    assert {e.name for e in splits["val"]} == {
        f"img/{i:03d}.png" for i in range(40) if carved(f"img/{i:03d}.png", 0.25)
    }
    assert {e.name for e in splits["val"]} >= {
        f"img/{i:03d}.png" for i in range(IMAGES) if carved(f"img/{i:03d}.png", 0.25)
    }
    assert not {e.name for e in splits["val"]} & {e.name for e in splits["train"]}


def test_the_training_loader_resumes_mid_epoch_exactly_and_rgb_is_jittered(coco):
    whole = [batch for _, batch in zip(range(3), coco.train_dataloader(), strict=False)]
    resumed = coco.train_dataloader()
    resumed.load_state_dict({"epoch": 0, "batches": 1})
    batch = next(iter(resumed))
    assert batch["text"] == whole[1]["text"] and torch.equal(batch["images"], whole[1]["images"])
    image = np.random.default_rng(0).integers(0, 256, (16, 48, 3), dtype=np.uint8)
    moved = jitter(image, np.random.default_rng(1))
    assert moved.shape == image.shape and moved.dtype == np.uint8 and not np.array_equal(moved, image)


def test_images_are_fitted_and_written_one_at_a_time(tmp_path, monkeypatch):
    """Records leave the generator as each image is fitted: a piece's images are never held together."""
    import lightformer.data.sources.captions as image_text_files

    data = module(write_folder(tmp_path, "csv"), tmp_path, val_fraction=0)
    loaded = []
    real = image_text_files.load_image
    monkeypatch.setattr(image_text_files, "load_image", lambda *a: loaded.append(a) or real(*a))
    records = image_text_files.image_records(data.splits()["train"], data.source, "train.csv")
    for count in range(1, 4):
        assert isinstance(next(records)["image"], bytes) and len(loaded) == count
    assert len(list(records)) == IMAGES - 3


# --- bad inputs and options ------------------------------------------------------------------------------------


def test_each_bad_input_is_refused_naming_the_annotation_file_the_row_and_the_image(tmp_path):
    def refused(path: Path, *patterns: str) -> None:
        with pytest.raises(DataError) as error:
            module(path, path.parent, val_fraction=0).prepare_data()
        for pattern in patterns:
            assert pattern in str(error.value), str(error.value)

    path = write_folder(tmp_path / "missing", "jsonl")
    (tmp_path / "missing/img/002.png").unlink()
    refused(path, str(path), f"line {first_line(2, False)}", "'img/002.png' is not found")
    path = write_folder(tmp_path / "unreadable", "csv")
    (tmp_path / "unreadable/img/005.png").write_bytes(b"\x89PNG not really")
    refused(path, str(path), f"line {first_line(5, True)}", "img/005.png", "not a readable image")
    path = write_folder(tmp_path / "cut", "tsv")
    data = (tmp_path / "cut/img/007.png").read_bytes()
    (tmp_path / "cut/img/007.png").write_bytes(data[: len(data) // 2])
    refused(path, str(path), f"line {first_line(7, True)}", "img/007.png")
    path = write_folder(tmp_path / "column", "csv")
    path.write_text(path.read_text().replace("text,file", "caption,file", 1))
    refused(path, str(path), "lacks the column 'file' or 'text'")
    path = write_folder(tmp_path / "row", "jsonl")
    path.write_text(path.read_text() + json.dumps({"file": "img/001.png"}) + "\n")
    refused(path, str(path), f"line {len(path.read_text().splitlines())}", "no text")
    path = write_folder(tmp_path / "coco", "coco")
    content = json.loads(path.read_text())
    content["annotations"][5]["image_id"] = 99999
    path.write_text(json.dumps(content))
    refused(path, str(path), "annotations[5]", "image_id 99999")


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (dict(train="train.txt"), "data.source.train"),
        (dict(train="a.jsonl", val="v.parquet"), "data.source.val"),
        (dict(train="a.jsonl", val_fraction=1.0), "data.source.val_fraction"),
        (dict(train="a.jsonl", height=8), "data.source.height"),
        (dict(train="a.jsonl", channels=2), "data.source.channels"),
        (dict(train="a.jsonl", fit="crop"), "data.source.fit"),
    ],
)
def test_bad_options_are_refused_naming_the_field(options, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        ImageTextFiles(**options)


# --- the task on a user's folder -------------------------------------------------------------------------------


def test_fit_and_test_on_a_folder_of_ones_own_log_bleu(tmp_path, capsys):
    train = write_folder(tmp_path, "coco")
    args = [
        "--config=configs/image_text/captions.yaml",
        *quiet_run_args(tmp_path),
        "--trainer.accelerator=cpu",
        f"--data.source.train={train}",
        f"--data.source.test={train}",
        "--data.source.val=null",
        "--data.source.images=null",
        "--data.source.val_fraction=0.25",
        "--data.source.height=16",
        "--data.source.width=32",
        "--data.tokenizer.kind=char",
        "--data.loader.batch_size=8",
        "--data.loader.num_workers=0",
        "--data.loader.pin_memory=false",
        f"--data.prepare.dir={tmp_path / 'prepared'}",
        "--model.net.encoder.patch_size=8",
        *tower_options("n_layers=1", "d_model=32", "n_heads=2", "d_ff=64"),
        "--model.net.decoder.block_size=24",
        "--model.beam_size=1",
        "--model.num_logged_samples=1",
        "--model.optimizer.warmup_steps=2",
        "--trainer.max_steps=2",
        "--trainer.val_check_interval=2",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.limit_val_batches=1",
        "--trainer.limit_test_batches=1",
    ]
    main(["fit", *args])
    _, events = events_of(tmp_path, "captions")
    assert "val/bleu" in events.Tags()["scalars"] and "val/exact" in events.Tags()["scalars"]
    assert {"val/sample_0", "val/reading_attention", "val/cross_attention"} <= set(events.Tags()["images"])
    capsys.readouterr()
    checkpoint = next((tmp_path / "runs").rglob("last.ckpt"))
    main(["test", *args, f"--ckpt_path={checkpoint}"])
    out = capsys.readouterr().out
    for metric in ("test/bleu", "test/cer", "test/exact"):
        assert metric in out


def test_bleu_and_exact_readings_count_against_every_reference(monkeypatch):
    from test_vision_text import digit_batch, digit_task

    task, tokenizer = digit_task()
    batch = digit_batch(["123", "456"], tokenizer)
    second = "a reading equal to the second caption"
    batch["text"] = ["the first caption of the image", "six seven eight nine ten"]
    batch["references"] = [[batch["text"][0], second], [batch["text"][1]]]
    monkeypatch.setattr(task, "read_images", lambda images, beam_size: [second, "six seven eight nine ten"])
    task._evaluate(batch, "val", 1)
    assert float(task.metrics["val_exact"].compute()) == 1.0
    assert float(task.metrics["val_bleu"].compute()) == pytest.approx(1.0)
    assert float(task.metrics["val_cer"].compute()) > 0.2  # against "text", the first caption
