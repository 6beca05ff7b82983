"""One place per task: a task registers itself once, beside its class (``lightformer.registry.register``), and the
command line reads the registry. A task written outside lightformer (a module and a config in a folder of their own)
trains, tests, runs its checkpoint command and exports in a layout of its own with no other file touched."""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from lightformer.cli.main import checkpoint_commands, main
from lightformer.registry import TASKS, built_in

TOY_TASK = '''
"""A bigram language model: the next character from the current one alone."""

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lightformer.tasks.command_support import load_task, require
from lightformer.data import TextDataModule
from lightformer.registry import Layout, register
from lightformer.tasks.base import TextTask


@dataclass(frozen=True)
class BigramConfig:
    vocab_size: int | None = None
    smoothing: float = 0.0


class Bigram(nn.Module):
    def __init__(self, config: BigramConfig) -> None:
        super().__init__()
        self.config = config
        self.logits = nn.Embedding(config.vocab_size, config.vocab_size)

    def forward(self, ids):
        return self.logits(ids)


class BigramTask(TextTask):
    """Next-character cross-entropy of a bigram table.

    Args:
        net: the table's shape.
    """

    model_class = Bigram
    net_from_data = {"vocab_size": "vocab_size"}
    items_name = "tokens"

    def __init__(self, net: BigramConfig = BigramConfig(), **common: Any) -> None:
        super().__init__(net, **common)

    def _loss(self, batch):
        x, y = batch
        return F.cross_entropy(self(x).flatten(0, 1).float(), y.flatten())

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log_train({"train/loss": loss})
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self._loss(batch))

    def test_step(self, batch, batch_idx):
        self.log("test/loss", self._loss(batch))

    def model_inputs(self, batch):
        return (batch[0],)

    def throughput_counts(self, batch):
        return len(batch[0]), batch[0].numel()


def likeliest(*, ckpt_path: str, after: str = "e") -> None:
    """The likeliest character after another, from a bigram checkpoint alone.

    Args:
        ckpt_path: a checkpoint written by ``fit`` with the bigram task.
        after: the character.
    """
    require(len(after) == 1, f"--after={after!r} must be one character")
    task = load_task(ckpt_path, BigramTask, "likeliest")
    ids = task.tokenizer.encode(after)
    best = int(task.model(torch.tensor(ids)).argmax(-1)[-1])
    print(f"after {after!r}: {task.tokenizer.decode([best])!r}")


def write_table(task, ckpt_path, checkpoint, output):
    """``export --layout numpy``: the bigram table as a NumPy array."""
    table = task.model.logits.weight.detach().numpy()
    with open(output, "wb") as file:
        np.save(file, table)
    return f"wrote {output} (a {table.shape[0]}x{table.shape[1]} bigram table, step {checkpoint['global_step']})"


register(BigramTask, data=TextDataModule, commands={"likeliest": likeliest},
         layouts={"numpy": Layout(write_table, "bigram tables")})
'''

TOY_CONFIG = """
trainer:
  max_steps: 40
  val_check_interval: 40
  limit_val_batches: 2
  limit_test_batches: 2
  precision: 32-true
  enable_progress_bar: false
  enable_model_summary: false
  logger:
    class_path: lightformer.training.tensorboard.TensorBoardLogger
    init_args: {save_dir: RUNS, name: bigram}
model:
  class_path: toy_bigram.BigramTask
  init_args:
    optimizer: {lr: 0.1, warmup_steps: 0, fit_to_max_time: false}
data:
  class_path: lightformer.data.TextDataModule
  init_args:
    source: {corpus: null, train_files: [CORPUS], val_fraction: 0.1, test_fraction: 0.1}
    tokenizer: {kind: char}
    loader: {batch_size: 8}
    prepare: {dir: PREPARED}
    block_size: 16
"""


@pytest.fixture
def toy_folder(tmp_path, monkeypatch):
    folder = tmp_path / "toy"
    folder.mkdir()
    (folder / "toy_bigram.py").write_text(textwrap.dedent(TOY_TASK))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat. the hat was the cat's.\n" * 200)
    config = TOY_CONFIG.replace("RUNS", str(tmp_path / "runs")).replace("CORPUS", str(corpus))
    (folder / "bigram.yaml").write_text(config.replace("PREPARED", str(tmp_path / "prepared")))
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    TASKS.pop("BigramTask", None)
    sys.modules.pop("toy_bigram", None)


def test_a_task_of_ones_own_fits_tests_and_runs_its_checkpoint_command(toy_folder, tmp_path, capsys):
    main(["fit", f"--config={toy_folder / 'bigram.yaml'}"])
    checkpoint = tmp_path / "runs" / "bigram" / "version_0" / "checkpoints" / "last.ckpt"
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["global_step"] == 40
    assert saved["hyper_parameters"]["net"]["vocab_size"] == saved["hyper_parameters"]["data_facts"]["vocab_size"]

    main(["test", f"--config={toy_folder / 'bigram.yaml'}", f"--ckpt_path={checkpoint}"])
    assert "test/loss" in capsys.readouterr().out

    main(["likeliest", f"--ckpt_path={checkpoint}", "--after=t"])
    assert capsys.readouterr().out.strip() == "after 't': 'h'"  # "the", "that", "hat": a bigram learns "th"

    table = tmp_path / "exported" / "table.npy"  # its own layout, by the generic command; the folder made first
    main(["export", f"--ckpt_path={checkpoint}", "--layout=numpy", f"--output={table}"])
    assert capsys.readouterr().out.strip().endswith("bigram table, step 40)")
    np.testing.assert_array_equal(np.load(table), saved["state_dict"]["model.logits.weight"].numpy())
    lm = tmp_path / "lm.ckpt"  # another task's checkpoint is refused by the layout's own words
    torch.save({"hyper_parameters": {"_class_path": "lightformer.tasks.LanguageModelTask"}}, lm)
    with pytest.raises(SystemExit, match="--layout numpy applies to bigram tables, not to a LanguageModelTask"):
        main(["export", f"--ckpt_path={lm}", "--layout=numpy", f"--output={tmp_path / 'lm.npy'}"])


def test_the_command_line_lists_every_registered_command_and_refuses_the_wrong_data():
    assert {"generate", "translate", "classify", "fill-mask", "sample-images", "probe"} <= set(checkpoint_commands())
    assert {"export", "average"} <= set(checkpoint_commands())
    specs = built_in()
    assert {spec.task.__name__ for spec in specs.values()} >= {"LanguageModelTask", "DenoisingTask"}
    with pytest.raises(SystemExit, match="data: MaskedLanguageModelTask trains on lightformer.data.families.text."
                                         "MaskedLMDataModule .*, not on TextDataModule"):  # fmt: skip
        main(["fit", "--config=configs/lm/austen_char.yaml", "--model=lightformer.tasks.MaskedLanguageModelTask",
              "--model.net.d_model=32", "--trainer.logger=false"])  # fmt: skip


def test_a_command_name_is_one_tasks():
    from lightformer.registry import register

    spec = built_in()["LanguageModelTask"]

    class Other:
        pass

    with pytest.raises(ValueError, match="the command 'generate' of Other is LanguageModelTask's already"):
        register(Other, data=spec.data, commands={"generate": spec.commands["generate"]})


def test_repo_root_is_the_working_directory():
    assert Path("configs/lm/austen_char.yaml").is_file()


def registered_task_names() -> set[str]:
    return {spec.task.__name__ for spec in built_in().values()} | {"Task", "TextTask"}


def test_no_module_names_a_task_class_by_a_string():
    """Which task has a layout, a command or an old checkpoint's keys is its registration's to say: no string of
    ``src/`` is a task class's name (``__all__`` lists, which name what a package exports, aside)."""
    names, found = registered_task_names(), []
    for path in sorted(Path("src/lightformer").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        exports = {id(node) for assign in ast.walk(tree) if isinstance(assign, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "__all__" for t in assign.targets)
                   for node in ast.walk(assign.value)}  # fmt: skip
        found += [f"{path}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and node.value in names and id(node) not in exports]  # fmt: skip
    assert len(names) > 8 and not found, "\n".join(found)


def test_a_hugging_face_model_type_is_read_by_one_reader():
    from lightformer.registry import HFReader, Layout, hf_readers, register

    spec = built_in()["LanguageModelTask"]
    gpt2 = hf_readers()["gpt2"]

    class Other:
        pass

    other_reader = HFReader(gpt2.net, gpt2.net_fields, lambda weights, config: weights)
    with pytest.raises(ValueError, match="the Hugging Face model type 'gpt2' of Other's layouts is read by "
                                         "LanguageModelTask's already"):  # fmt: skip
        register(Other, data=spec.data, layouts={"hf": Layout(print, "others", reads={"gpt2": other_reader})})
    assert "Other" not in TASKS and hf_readers()["gpt2"] is gpt2
