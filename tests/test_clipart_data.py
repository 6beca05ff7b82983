"""The Open Clip Art Library as captioned images: captions read from the SVGs' metadata (the author's title, not the
author's name), drawings without any left out, a split that keeps a drawing's variants together and is stable,
labels over the categories whose names say what they hold, and the contrastive batches, resumable mid-epoch."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lightformer.data import ClipArtDataModule
from lightformer.data.loading.streaming import LoaderConfig, Records
from lightformer.data.preparation.prepare import PrepareConfig
from lightformer.data.sources import openclipart
from lightformer.data.sources.openclipart import ClipArtSource, captions_of, cut, split_of, svg_metadata, variant_key
from lightformer.errors import DataError

ROOT = Path(openclipart.OPENCLIPART_ROOT)
needs_library = pytest.mark.skipif(not (ROOT / "svg").is_dir() or not (ROOT / "png").is_dir(),
                                   reason="apt-get install openclipart-png openclipart-svg")  # fmt: skip
SHEEP = "animals/mammals/dall_sheep_ram_ganson"
# A small library: drawings of three classes, a variant pair, one of "unsorted" (label -1), one without a caption.
PICKED = [SHEEP, "animals/crawfish1_ganson", "animals/crawfish1_bw_ganson", "food/apple_bitten_dan_gerhard_01",
          "food/burrito_ganson", "food/burrito_bw_ganson", "food/bowl_chaspo_", "computer/floppy", "computer/reload",
          "computer/browser", "computer/clipboard_01", "unsorted/Anatra", "office/milimetered_paper_01"]  # fmt: skip


def test_captions_are_cut_at_a_word_and_keywords_listed_after_the_title():
    assert cut("a long description of a drawing", 16) == "a long"
    assert cut("abcdefghij", 4) == "abcd"
    assert captions_of("Apple", "Apple", ["apple", "fruit", "red"], 96) == ["Apple", "Apple, fruit, red"]
    assert captions_of("", "", ["cat", "pet"], 96) == ["cat, pet"]
    assert captions_of("Cat", "A cat asleep", ["pet", "x" * 90], 20) == ["Cat", "A cat asleep", "Cat, pet"]
    assert captions_of("", "", [], 96) == []


def test_variants_share_a_key_and_the_split_is_stable():
    keys = {name: variant_key(name) for name in ["animals/crawfish1_ganson", "animals/crawfish1_bw_ganson",
                                                  "shapes/jigsaw/jigsaw_blue_01", "shapes/jigsaw/jigsaw_blue_09",
                                                  "computer/switch_cisco_nico1", "computer/switch_cisco_nico_",
                                                  "music/violin_colour_ganson", "music/violin_ganson"]}  # fmt: skip
    assert len(set(keys.values())) == 4
    assert variant_key("animals/crawfish2_ganson") != keys["animals/crawfish1_ganson"]
    names = [f"animals/drawing{i}x_{v}" for i in range(300) for v in ("01", "02", "bw")]
    splits = [split_of(name, 0.1, 0.1) for name in names]
    assert splits == [split_of(name, 0.1, 0.1) for name in names]  # the same every time
    for i in range(300):  # the three variants of drawing i in one split
        assert len(set(splits[3 * i : 3 * i + 3])) == 1
    assert {"train", "val", "test"} == set(splits) and splits.count("train") > splits.count("val")


@needs_library
def test_the_titles_descriptions_and_keywords_of_known_drawings():
    title, description, keywords = svg_metadata(ROOT / "svg" / f"{SHEEP}.svg")
    assert (title, description, keywords) == ("Dall Sheep Ram", "Dall Sheep Ram.", ["mammal", "animal", "ram"])
    drawings = list(openclipart.read_drawings(ROOT, [SHEEP, "office/milimetered_paper_01"], 96))
    assert drawings == [openclipart.Drawing(SHEEP, "animals", ["Dall Sheep Ram", "Dall Sheep Ram.",
                                                               "Dall Sheep Ram, mammal, animal, ram"],
                                            ("mammal", "animal", "ram")),
                        "office/milimetered_paper_01"]  # fmt: skip
    # the second dc:title of every SVG is its author's (here Gerald G.): never a caption
    assert "Gerald G." not in drawings[0].captions


@pytest.fixture(scope="module")
def clipart(tmp_path_factory) -> ClipArtDataModule:
    if not (ROOT / "svg").is_dir() or not (ROOT / "png").is_dir():
        pytest.skip("apt-get install openclipart-png openclipart-svg")
    root = tmp_path_factory.mktemp("clipart")
    for name in PICKED:
        for kind in ("png", "svg"):
            (root / "library" / kind / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / kind / f"{name}.{kind}", root / "library" / kind / f"{name}.{kind}")
    source = ClipArtSource(root=str(root / "library"), image_size=24, val_fraction=0.3, test_fraction=0.3)
    data = ClipArtDataModule(source, loader=LoaderConfig(batch_size=4),
                             prepare=PrepareConfig(dir=str(root / "prepared"), num_workers=2))  # fmt: skip
    data.prepare_data()
    data.setup()
    return data


def records_of(data: ClipArtDataModule) -> dict[str, dict]:
    found = {}
    for split in ("train", "val", "test"):
        records = Records(str(data.prepared / split)) if data.manifest["images"][split] else []
        for i in range(len(records)):
            record = records[i]
            found[record["file"]] = {"split": split, "texts": json.loads(record["texts"]), "label": record["label"],
                                     "image": np.asarray(Image.open(io.BytesIO(record["image"])))}  # fmt: skip
    return found


def test_each_drawing_is_a_record_of_its_captions_label_and_square_image_on_white(clipart):
    found = records_of(clipart)
    assert sorted(found) == sorted(PICKED[:-1])  # the drawing of no caption left out, and counted
    assert clipart.manifest["left_out"] == ["office/milimetered_paper_01"]
    facts = clipart.data_facts()
    assert facts.class_names == ("animals", "computer", "food", "office")  # not "unsorted"
    assert facts.image_size == (24, 24) and facts.in_channels == 3 and facts.image_fit == "drawing"
    sheep = found[SHEEP]
    listed = ["Dall Sheep Ram", "Dall Sheep Ram.", "Dall Sheep Ram, mammal, animal, ram"]
    assert sheep["texts"] == listed + (["mammal", "animal", "ram"] if sheep["split"] == "train" else [])
    for name, record in found.items():  # in training each keyword is a caption alone too; not in val and test
        keywords = svg_metadata(clipart.source.root + f"/svg/{name}.svg")[2]
        assert (set(keywords) <= set(record["texts"])) == (record["split"] == "train" or not keywords), name
    assert sheep["label"] == 0 and sheep["image"].shape == (24, 24, 3)
    assert (sheep["image"][0, 0] == 255).all()  # transparent corners on white
    assert found["unsorted/Anatra"]["label"] == -1 and found["food/burrito_ganson"]["label"] == 2
    for a, b in [("animals/crawfish1_ganson", "animals/crawfish1_bw_ganson"),
                 ("food/burrito_ganson", "food/burrito_bw_ganson")]:  # fmt: skip
        assert found[a]["split"] == found[b]["split"]
    assert facts.max_length == max(len(t) for r in found.values() for t in r["texts"]) + 2


def test_batches_have_the_contract_and_training_resumes_mid_epoch_exactly(clipart):
    batch = next(iter(clipart.val_dataloader()))
    assert set(batch) == {"images", "tgt", "text", "references", "labels"}
    assert batch["images"].shape[1:] == (3, 24, 24) and batch["labels"].dtype == torch.int64
    assert batch["text"] == [references[0] for references in batch["references"]]
    whole = [b for _, b in zip(range(3), clipart.train_dataloader(), strict=False)]
    resumed = clipart.train_dataloader()
    resumed.load_state_dict({"epoch": 0, "batches": 1})
    again = next(iter(resumed))
    assert again["text"] == whole[1]["text"] and torch.equal(again["images"], whole[1]["images"])
    assert torch.equal(again["labels"], whole[1]["labels"])


@needs_library
def test_the_largest_pngs_are_read_knowingly_and_fitted():
    """A stop sign of 20,990 × 29,700 pixels (over Pillow's decompression-bomb limit) is read, put on white in strips
    of rows and fitted; Pillow's limit is restored after."""
    limit = Image.MAX_IMAGE_PIXELS
    image = openclipart.drawing_image(ROOT / "png/signs_and_symbols/stop_sign_miguel_s_nchez_.png", 32)
    assert image.size == (32, 32) and limit == Image.MAX_IMAGE_PIXELS
    pixels = np.asarray(image).astype(int)
    assert (pixels[..., 0] - pixels[..., 1] > 100).sum() > 100  # red, the sign's


def test_strips_put_on_white_and_reduced_as_the_whole_image_is():
    rng = np.random.default_rng(0)
    rgba = Image.fromarray(rng.integers(0, 256, (50, 37, 4), dtype=np.uint8), "RGBA")
    whole = openclipart.on_white(rgba).reduce(4)
    assert np.array_equal(np.asarray(openclipart.reduced_on_white(rgba, 4, strip_pixels=200)), np.asarray(whole))


def test_a_folder_without_the_library_is_refused_naming_the_option(tmp_path):
    with pytest.raises(DataError, match="data.source.root=.*openclipart-png openclipart-svg"):
        ClipArtDataModule(ClipArtSource(root=str(tmp_path)))


def test_the_commands_see_a_drawing_file_as_training_saw_it(clipart):
    """``zero-shot`` and ``embed`` fit an image file the data's way (``image_fit`` "drawing": on white, cropped to its
    ink, centred), so a drawing's file gives the model the pixels of its prepared record."""
    from lightformer.data.sources.image_files import to_normalised_tensor
    from lightformer.tasks.contrastive import ContrastiveTask

    facts = clipart.data_facts()
    tiny = dict(d_model=16, n_layers=1, n_heads=2, d_ff=32)
    task = ContrastiveTask(net=dict(image=dict(patch_size=8, **tiny), text=dict(block_size=facts.max_length, **tiny)),
                           data_facts=facts)  # fmt: skip
    normalise = to_normalised_tensor(facts.normalize_mean, facts.normalize_std)
    for name, record in records_of(clipart).items():
        from_file = task.image_tensor(f"{clipart.source.root}/png/{name}.png")
        torch.testing.assert_close(from_file, normalise(Image.fromarray(record["image"])), atol=0, rtol=0)
