"""Emoji in two styles as captioned images: the characters both fonts draw, named by Unicode, trained in one style
and validated and tested in the held-out other, labels the index of each name among the class names."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lightformer.data import EmojiDataModule
from lightformer.data.loading.streaming import LoaderConfig, Records
from lightformer.data.preparation.prepare import PrepareConfig
from lightformer.data.sources import emoji
from lightformer.data.sources.emoji import EmojiSource
from lightformer.errors import DataError

pytestmark = pytest.mark.skipif(not (Path(emoji.NOTO_EMOJI).is_file() and Path(emoji.SYMBOLA).is_file()),
                                reason="apt-get install fonts-noto-color-emoji fonts-symbola")  # fmt: skip


def test_the_emoji_both_fonts_draw_named_by_unicode_in_two_styles():
    characters = emoji.emoji_characters()
    assert "\U0001f34e" in characters and "\U0001f436" in characters  # red apple, dog face
    assert not {c for c in characters if ord(c) < 0x80 or 0x1F1E6 <= ord(c) <= 0x1F1FF or c == "\u200d"}
    assert emoji.caption("\U0001f34e") == "red apple"
    noto = np.asarray(emoji.draw("\U0001f34e", "noto", emoji.NOTO_EMOJI, 32)).astype(int)
    symbola = np.asarray(emoji.draw("\U0001f34e", "symbola", emoji.SYMBOLA, 32)).astype(int)
    assert noto.shape == symbola.shape == (32, 32, 3)
    assert (noto[..., 0] - noto[..., 2] > 100).sum() > 50  # a red apple in colour
    assert np.abs(symbola[..., 0] - symbola[..., 2]).max() < 30 and symbola.min() < 60  # a black outline
    assert (noto[0, 0] == 255).all() and (symbola[0, 0] == 255).all()


@pytest.fixture(scope="module")
def emoji_data(tmp_path_factory) -> EmojiDataModule:
    root = tmp_path_factory.mktemp("emoji")
    data = EmojiDataModule(EmojiSource(held_out_style="symbola", image_size=20),
                           loader=LoaderConfig(batch_size=32),
                           prepare=PrepareConfig(dir=str(root / "prepared"), num_workers=2))  # fmt: skip
    data.prepare_data()
    data.setup()
    return data


def test_training_is_in_one_style_val_and_test_in_the_held_out_one(emoji_data):
    facts = emoji_data.data_facts()
    names = facts.class_names
    assert len(names) == len(set(names)) > 1000 and "red apple" in names
    images = emoji_data.manifest["images"]
    assert images["train"] == len(names) == images["val"] + images["test"]
    assert emoji_data.manifest["styles"] == {"train": "noto", "val": "symbola", "test": "symbola"}
    for split, coloured in (("train", True), ("val", False), ("test", False)):
        records = Records(str(emoji_data.prepared / split))
        picked = [records[i] for i in range(0, len(records), 50)]
        for record in picked:
            assert json.loads(record["texts"]) == [names[record["label"]]]  # the label is the name's index
        pixels = np.stack([np.asarray(Image.open(io.BytesIO(r["image"]))) for r in picked]).astype(int)
        spread = np.abs(pixels[..., 0] - pixels[..., 2]).mean()
        assert (spread > 5) == coloured, (split, spread)  # Noto's colours; Symbola's black on white
    val = {Records(str(emoji_data.prepared / "val"))[i]["label"] for i in range(images["val"])}
    test = {Records(str(emoji_data.prepared / "test"))[i]["label"] for i in range(images["test"])}
    assert not val & test and len(val | test) == len(names)


def test_a_batch_carries_each_emoji_s_name_and_label(emoji_data):
    batch = next(iter(emoji_data.val_dataloader()))
    names = emoji_data.data_facts().class_names
    assert set(batch) == {"images", "tgt", "text", "references", "labels"}
    assert batch["images"].shape == (32, 3, 20, 20) and batch["labels"].dtype == torch.int64
    assert batch["text"] == [names[label] for label in batch["labels"].tolist()]


def test_bad_emoji_options_are_refused_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match="data.source.held_out_style='outline'"):
        EmojiSource(held_out_style="outline")
    with pytest.raises(ValueError, match="data.source.val_fraction=1"):
        EmojiSource(val_fraction=1)
    with pytest.raises(DataError, match="data.source.symbola_font=.*fonts-symbola"):
        EmojiDataModule(EmojiSource(symbola_font=str(tmp_path / "none.ttf")))
