"""``Task`` stays a base that reads in one sitting: its hooks, with each concern in a module of its own
(``lightformer.tasks.data_contract``, ``warm_start``, ``compilation``, ``batch_costs``, ``optim``,
``hyperparameters``); and the hyperparameters a task stores are the arguments it was built with, read from the call
that built it, never from stack frames."""

from __future__ import annotations

import copy
import inspect
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from lightformer.models.gpt import GPTConfig
from lightformer.tasks import LanguageModelTask, OptimizerConfig
from lightformer.tasks.base import Task

SRC = Path(__file__).resolve().parents[1] / "src"
NET = GPTConfig(vocab_size=11, block_size=8, n_layers=1, d_model=16, n_heads=2)


def test_the_task_class_is_at_most_250_lines():
    lines, _ = inspect.getsourcelines(Task)
    assert len(lines) <= 250, f"Task is {len(lines)} lines: move a concern into a module of its own"


def test_no_source_reads_stack_frames():
    reading = re.compile(r"\b(currentframe|f_locals|f_back|_getframe)\b")
    found = [
        f"{path.relative_to(SRC)}:{number}"
        for path in sorted(SRC.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if reading.search(line)
    ]
    assert not found, f"stack frames read in: {found}"


class Changing(LanguageModelTask):
    """A task whose ``__init__`` changes its arguments before handing them on, and takes one positionally."""

    def __init__(self, net: GPTConfig = NET, width_note: str = "given", *extra: Any, **common: Any) -> None:
        width_note = "changed"  # noqa: F841  (what a frame would have shown)
        common["compile"] = True
        super().__init__(net, **common)


def test_a_task_stores_the_arguments_it_was_built_with():
    task = Changing(NET, "positional", optimizer=OptimizerConfig(lr=0.5), sample_tokens=3)
    hparams = dict(task.hparams)
    assert hparams["width_note"] == "positional" and hparams["sample_tokens"] == 3
    assert hparams["optimizer"] == asdict(OptimizerConfig(lr=0.5)) and hparams["net"] == asdict(NET)
    assert hparams["compile"] is True  # what reached Task.__init__: the task is built with it
    assert hparams["_class_path"].endswith("test_task_base.Changing") and "extra" not in hparams
    rebuilt = Changing(**{key: value for key, value in hparams.items()})
    assert dict(rebuilt.hparams) == hparams


def test_a_task_without_arguments_and_a_copy_store_the_defaults():
    task = LanguageModelTask(NET)
    copied = copy.deepcopy(task)  # built by __new__ alone, its state copied
    assert dict(copied.hparams) == dict(task.hparams) and "_given" not in vars(copied) | vars(task)
    assert task.hparams["sample_tokens"] == LanguageModelTask(net=NET).hparams["sample_tokens"]
    ids = torch.randint(0, 11, (1, 8))
    torch.testing.assert_close(copied.eval()(ids), task.eval()(ids), rtol=0, atol=0)


def test_the_command_line_reads_every_tasks_arguments_through_its_init():
    """LightningCLI (jsonargparse) follows a task's ``**common`` to ``Task.__init__``: the constructor hook that keeps
    the arguments (``KeptArguments.__new__``, on a base of ``Task``) hides no parameter from it."""
    from jsonargparse import ArgumentParser

    for task_class in (LanguageModelTask, Changing):
        parser = ArgumentParser(exit_on_error=False)
        parser.add_class_arguments(task_class, "model")
        parsed = parser.parse_args(["--model.optimizer.lr=0.25", "--model.init.freeze=[blocks]"])
        assert parsed.model.optimizer.lr == 0.25 and tuple(parsed.model.init.freeze) == ("blocks",)
