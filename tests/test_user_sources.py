"""A user's own source, one class written in their own package (``tests/data/user_sources/``, copied into a temporary
folder as a user's would be), named by ``class_path`` in a config, trains through ``fit``: the family
(``lightformer.data.TextData``) does the rest — the tokenizer, the token shards, the windows and the model's facts."""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import pytest

from lightformer.cli.main import cli_main
from lightformer.data import TextData
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


def user_package(tmp_path: Path, monkeypatch) -> Path:
    """The user's package ``my_sources`` in ``tmp_path``, importable; a CSV of 240 articles beside it."""
    package = tmp_path / "my_sources"
    package.mkdir()
    (package / "__init__.py").write_text("")
    shutil.copy(SOURCES / "articles.py", package / "articles.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [name for name in sys.modules if name.split(".")[0] == "my_sources"]:  # another test's package
        monkeypatch.delitem(sys.modules, name)
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
