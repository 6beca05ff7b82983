"""A user's own source, one class written in their own package (``tests/data/user_sources/``, copied into a temporary
folder as a user's would be), named by ``class_path`` in a config, trains through ``fit``: the family does the rest —
for text (``lightformer.data.TextData``) the tokenizer, the token shards, the windows and the model's facts; for
captioned images (``lightformer.data.ImageTextData``) the images fitted to the canvas, the captions' tokenizer, the
pixels' statistics."""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from lightformer.cli.main import cli_main
from lightformer.data import ImageTextData, TextData
from lightformer.errors import ConfigError
from tiny_runs import quiet_run_args

SOURCES = Path(__file__).parent / "data" / "user_sources"
ARTICLES = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune must be in want of a "
    "wife.",
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, seemed to unite some "
    "of the best blessings of existence.",
    "The family of Dashwood had long been settled in Sussex.",
]


def source_package(tmp_path: Path, monkeypatch, module: str) -> None:
    """The user's package ``my_sources`` in ``tmp_path`` with the module ``module`` of ``SOURCES``, importable."""
    package = tmp_path / "my_sources"
    package.mkdir()
    (package / "__init__.py").write_text("")
    shutil.copy(SOURCES / module, package / module)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [name for name in sys.modules if name.split(".")[0] == "my_sources"]:  # another test's package
        monkeypatch.delitem(sys.modules, name)


def user_package(tmp_path: Path, monkeypatch) -> Path:
    """The user's package with their text source; a CSV of 240 articles beside it."""
    source_package(tmp_path, monkeypatch, "articles.py")
    with open(tmp_path / "articles.csv", "w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, ["id", "body"])
        writer.writeheader()
        writer.writerows({"id": f"a{i}", "body": ARTICLES[i % 3]} for i in range(240))
    return tmp_path / "articles.csv"


def config(tmp_path: Path, source: dict) -> Path:
    """The config a user would write: a small GPT, ``TextData`` over ``source``."""
    text = f"""
seed_everything: 0
trainer:
  accelerator: cpu
  max_steps: 120
  val_check_interval: 120
  check_val_every_n_epoch: null
  logger: {{class_path: lightformer.training.tensorboard.TensorBoardLogger, init_args: {{save_dir: runs, name: lm}}}}
model:
  class_path: lightformer.tasks.LanguageModelTask
  init_args:
    net: {{n_layers: 2, n_heads: 4, d_model: 64}}
    optimizer: {{lr: 5.0e-3, warmup_steps: 10}}
    sample_tokens: 8
data:
  class_path: lightformer.data.TextData
  init_args:
    source: {json.dumps(source)}
    tokenizer: {{kind: char}}
    block_size: 32
    loader: {{batch_size: 16}}
    prepare: {{dir: {tmp_path / "data"}}}
"""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_a_users_own_text_source_of_one_short_class_trains_a_language_model_through_fit(tmp_path, monkeypatch):
    lines = (SOURCES / "articles.py").read_text().splitlines()
    assert len(lines) <= 60 and "class CsvArticles(Source):" in lines  # the whole of what the user writes
    articles = user_package(tmp_path, monkeypatch)
    source = {"class_path": "my_sources.articles.CsvArticles", "init_args": {"files": [str(articles)]}}
    cli = cli_main(["fit", f"--config={config(tmp_path, source)}", *quiet_run_args(tmp_path)])
    data = cli.datamodule
    assert type(data) is TextData and type(data.source).__name__ == "CsvArticles"
    assert data.prepared.folder.name.startswith("csvarticles-")  # named by the source's stem and fingerprint
    assert data.prepared.num_tokens("train") > 8 * data.prepared.num_tokens("val") > 0  # about a tenth held out
    assert set(data.tokenizer.decode(range(4, data.tokenizer.vocab_size))) == set("".join(ARTICLES))
    last = cli.trainer.callback_metrics["val/loss"]
    assert float(last) < 1.5  # from ln(vocab) ≈ 3.6 nats per character, below the letters' own frequencies (≈ 2.9)


def test_a_source_whose_records_are_not_texts_is_refused_naming_it(tmp_path, monkeypatch):
    user_package(tmp_path, monkeypatch)
    (tmp_path / "my_sources" / "broken.py").write_text(
        "from dataclasses import dataclass\nfrom lightformer.data.sources import Source\n\n\n"
        "@dataclass(frozen=True)\nclass Numbers(Source):\n    def fingerprint(self):\n        return {}\n\n"
        "    def records(self, split):\n        yield {'text': 12}\n"
    )
    source = {"class_path": "my_sources.broken.Numbers"}
    with pytest.raises(ConfigError, match=r"Numbers.records\('train'\) gave \{'text': 12\} as its record 0: a text "
                                        r'source gives records \{"text": str\}'):  # fmt: skip
        cli_main(["fit", f"--config={config(tmp_path, source)}", *quiet_run_args(tmp_path)])


# --- a caption source for the contrastive task -----------------------------------------------------------------

COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 170, 60), "yellow": (230, 200, 20)}
SHAPES = ("circle", "square", "triangle")


def draw_pictures(folder: Path, per_pair: int = 10) -> None:
    """``per_pair`` pictures of each colour and shape, of a size and place drawn from their number, each beside a
    text file of two captions ("a red circle", "a circle")."""
    folder.mkdir()
    for shape in SHAPES:
        for colour, fill in COLOURS.items():
            for k in range(per_pair):
                image = Image.new("RGB", (32, 32), "white")
                draw, size, x, y = ImageDraw.Draw(image), 14 + k % 4 * 2, 1 + k % 3 * 3, 2 + k % 4 * 2
                if shape == "circle":
                    draw.ellipse((x, y, x + size, y + size), fill=fill)
                elif shape == "square":
                    draw.rectangle((x, y, x + size, y + size), fill=fill)
                else:
                    draw.polygon([(x, y + size), (x + size, y + size), (x + size // 2, y)], fill=fill)
                image.save(folder / f"{shape}-{colour}-{k}.png")
                (folder / f"{shape}-{colour}-{k}.txt").write_text(f"a {colour} {shape}\na {shape}\n")


def contrastive_config(tmp_path: Path, source: dict) -> Path:
    """The config a user would write: a small CLIP, ``ImageTextData`` over ``source``."""
    text = f"""
seed_everything: 0
trainer:
  accelerator: cpu
  max_steps: 200
  val_check_interval: 100
  check_val_every_n_epoch: null
  logger: {{class_path: lightformer.training.tensorboard.TensorBoardLogger, init_args: {{save_dir: runs, name: clip}}}}
model:
  class_path: lightformer.tasks.ContrastiveTask
  init_args:
    net: {{image: {{patch_size: 4, d_model: 32, n_layers: 1, n_heads: 2, d_ff: 64}},
           text: {{block_size: 24, d_model: 32, n_layers: 1, n_heads: 2, d_ff: 64}}, embed_dim: 32}}
    templates: ["a {{}}", "{{}}"]
    optimizer: {{lr: 3.0e-3, warmup_steps: 10, weight_decay: 0.0}}
data:
  class_path: lightformer.data.ImageTextData
  init_args:
    source: {json.dumps(source)}
    image_size: 16
    loader: {{batch_size: 24}}
    prepare: {{dir: {tmp_path / "data"}}}
"""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_a_users_own_caption_source_of_one_short_class_trains_a_contrastive_model_through_fit(tmp_path, monkeypatch):
    lines = (SOURCES / "pictures.py").read_text().splitlines()
    assert len(lines) <= 60 and "class CaptionedFolder(Source):" in lines  # the whole of what the user writes
    source_package(tmp_path, monkeypatch, "pictures.py")
    draw_pictures(tmp_path / "pictures")
    source = {"class_path": "my_sources.pictures.CaptionedFolder", "init_args": {"folder": str(tmp_path / "pictures")}}
    cli = cli_main(["fit", f"--config={contrastive_config(tmp_path, source)}", *quiet_run_args(tmp_path)])
    data = cli.datamodule
    assert type(data) is ImageTextData and type(data.source).__name__ == "CaptionedFolder"
    assert data.prepared.name.startswith("captionedfolder-")  # named by the source's stem and fingerprint
    images = data.manifest["images"]
    assert images["train"] + images["val"] == 120 and 0 < images["val"] < 40  # a fifth held out, by file name
    assert data.data_facts().image_size == (16, 16) and data.data_facts().in_channels == 3
    metrics = cli.trainer.callback_metrics
    # 15 distinct captions, two of each picture's (chance 2/15 for image→text recall@1)
    assert float(metrics["val/i2t_r1"]) > 0.5 and float(metrics["val/t2i_r1"]) > 0.5, metrics


def test_a_caption_source_whose_records_are_not_captioned_images_is_refused_naming_it(tmp_path, monkeypatch):
    source_package(tmp_path, monkeypatch, "pictures.py")
    (tmp_path / "my_sources" / "broken.py").write_text(
        "from dataclasses import dataclass\nfrom lightformer.data.sources import Source\n\n\n"
        "@dataclass(frozen=True)\nclass Named(Source):\n    def fingerprint(self):\n        return {}\n\n"
        "    def records(self, split):\n        yield {'image': 'a.png', 'texts': 'a red circle'}\n"
    )
    source = {"class_path": "my_sources.broken.Named"}
    given = r"\{'image': 'a.png', 'texts': 'a red circle'\}"
    with pytest.raises(ConfigError, match=rf"Named.records\('train'\) gave {given} as its record 0: an image-text "
                                        r'source gives records \{"image"'):  # fmt: skip
        cli_main(["fit", f"--config={contrastive_config(tmp_path, source)}", *quiet_run_args(tmp_path)])


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("channels=2", r"data.channels=2 must be 1 \(grey\) or 3 \(RGB\)"),
        ("image_size=8", "data.image_size=8 must be at least 16 pixels"),
    ],
)
def test_the_image_text_family_refuses_a_canvas_it_cannot_hold(tmp_path, monkeypatch, option, message):
    source_package(tmp_path, monkeypatch, "pictures.py")
    source = {"class_path": "my_sources.pictures.CaptionedFolder", "init_args": {"folder": str(tmp_path)}}
    with pytest.raises(ConfigError, match=message):
        cli_main(["fit", f"--config={contrastive_config(tmp_path, source)}", f"--data.{option}",
                  *quiet_run_args(tmp_path)])  # fmt: skip
