"""The one contract between data and model (``lightformer.facts.DataFacts``): every data module states its facts
through ``data_facts()``, every task reads nothing else of it, builds its model from them, keeps them in its
checkpoints, and refuses data whose facts differ, naming each difference."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

from lightformer import tasks
from lightformer.data.module import DataModule
from lightformer.errors import CheckpointError, ConfigError
from lightformer.facts import DataFacts
from lightformer.io.checkpoints import facts_of_checkpoint
from lightformer.models.gpt import GPTConfig
from lightformer.tasks import LanguageModelTask
from lightformer.tokenization.text import Tokenizer

SRC = Path(__file__).resolve().parents[1] / "src" / "lightformer"
TINY_GPT = GPTConfig(n_layers=1, n_heads=2, d_model=16)


def char_facts(text: str = "abcdef \n", block_size: int = 16) -> DataFacts:
    tokenizer = Tokenizer.train_char([text])
    return DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, max_length=block_size)


class RecordingDataModule(DataModule):
    """A data module that records which of its attributes are read."""

    def __init__(self, facts: DataFacts) -> None:
        super().__init__()
        object.__setattr__(self, "read", [])
        object.__setattr__(self, "_facts", facts)

    def __getattribute__(self, name: str):
        if not name.startswith("__") and name not in ("read", "_facts"):
            object.__getattribute__(self, "read").append(name)
        return object.__getattribute__(self, name)

    def data_facts(self) -> DataFacts:
        return object.__getattribute__(self, "_facts")


def set_up(task, datamodule, stage: str = "fit") -> None:
    from types import SimpleNamespace

    task._trainer = SimpleNamespace(datamodule=datamodule, ckpt_path=None)
    task.setup(stage)


def test_a_task_builds_its_model_from_the_facts_and_keeps_them_in_its_hyperparameters():
    facts = char_facts(block_size=12)
    task = LanguageModelTask(net=TINY_GPT, data_facts=facts)
    assert (task.model.config.vocab_size, task.model.config.block_size) == (facts.vocab_size, 12)
    assert task.hparams["net"]["vocab_size"] == facts.vocab_size  # the shape as built
    assert DataFacts.of(task.hparams["data_facts"]) == facts
    assert task.tokenizer.to_str() == facts.tokenizer


def test_setup_reads_nothing_of_the_data_module_but_its_facts():
    """Every task: its setup asks the data module for ``data_facts`` and nothing else (a renamed data-module
    property could otherwise silently switch a check off)."""
    facts = char_facts()
    task = LanguageModelTask(net=TINY_GPT, data_facts=facts)
    datamodule = RecordingDataModule(facts)
    set_up(task, datamodule)
    assert datamodule.read == ["data_facts"]


def test_no_task_module_reads_a_data_module_attribute():
    """Statically, over every task module: no ``getattr(datamodule, ...)`` and no ``datamodule.<attribute>`` but
    ``data_facts`` (and Lightning's own ``hparams``)."""
    allowed = {"data_facts", "hparams"}
    for path in sorted((SRC / "tasks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "datamodule":
                assert node.attr in allowed, f"{path.name}:{node.lineno} reads datamodule.{node.attr}"
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and node.args:
                assert "datamodule" not in ast.unparse(node.args[0]), f"{path.name}:{node.lineno}: {ast.unparse(node)}"


def test_every_data_module_states_its_facts():
    from lightformer import data
    from lightformer.data.module import DataModule

    modules = [getattr(data, name) for name in data.__all__ if inspect.isclass(getattr(data, name))]
    modules = [module for module in modules if issubclass(module, DataModule) and module is not DataModule]
    assert len(modules) == 15  # the 13 presets and the families over any source (TextData, ImageTextData)
    for module in modules:
        assert module.data_facts is not DataModule.data_facts, f"{module.__name__} does not state its facts"


def test_data_whose_facts_differ_from_the_models_is_refused_naming_each_fact():
    task = LanguageModelTask(net=TINY_GPT, data_facts=char_facts("abcdef \n"))
    other = char_facts("ghijkl \n")
    with pytest.raises(CheckpointError, match=r"tokenizer: char tokenizer of \d+ tokens vs char tokenizer of \d+ "
                                              r"tokens; id \d+ is 'a' in the first, 'g' in the second"):  # fmt: skip
        set_up(task, RecordingDataModule(other))


def test_shorter_examples_than_the_model_reads_are_fine_longer_ones_are_refused():
    task = LanguageModelTask(net=TINY_GPT, data_facts=char_facts(block_size=16))
    set_up(task, RecordingDataModule(char_facts(block_size=8)), "validate")
    with pytest.raises(ConfigError, match="the data gives block_size=32 but the model has model.net.block_size=16"):
        set_up(task, RecordingDataModule(char_facts(block_size=32)), "validate")


def test_a_task_built_without_facts_takes_the_datas_and_checks_its_model_holds_them():
    small = LanguageModelTask(net=GPTConfig(vocab_size=5, block_size=16, n_layers=1, n_heads=1, d_model=8))
    with pytest.raises(ConfigError, match=r"the data gives vocab_size=\d+ but the model has model.net.vocab_size=5, "
                                          "which must be at least it"):  # fmt: skip
        set_up(small, RecordingDataModule(char_facts()))
    roomy = LanguageModelTask(net=GPTConfig(vocab_size=64, block_size=16, n_layers=1, n_heads=1, d_model=8))
    facts = char_facts()
    set_up(roomy, RecordingDataModule(facts))
    assert roomy.data_facts == facts and roomy.hparams["data_facts"]["tokenizer"] == facts.tokenizer


def test_a_model_size_set_against_the_data_is_refused():
    with pytest.raises(ConfigError, match=r"model.net.vocab_size=500 is set, but it comes from the data, which gives "
                                          r"vocab_size=\d+"):  # fmt: skip
        LanguageModelTask(net=GPTConfig(vocab_size=500, n_layers=1, n_heads=2, d_model=16), data_facts=char_facts())


def test_a_checkpoint_rebuilds_its_model_and_tokenizer_with_no_data(tmp_path):
    torch.manual_seed(0)
    task = LanguageModelTask(net=TINY_GPT, data_facts=char_facts())
    path = tmp_path / "model.ckpt"
    torch.save({"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams),
                "pytorch-lightning_version": "2.6.6"}, path)  # fmt: skip
    assert facts_of_checkpoint(torch.load(path, weights_only=True)) == task.data_facts
    loaded = LanguageModelTask.load_from_checkpoint(path, weights_only=True)
    assert loaded.tokenizer.to_str() == task.tokenizer.to_str()
    ids = torch.tensor([[4, 5, 6]])
    torch.testing.assert_close(loaded(ids), task(ids))


def test_normalisation_computed_with_another_number_of_threads_is_the_same_fact():
    """The digits' float32 pixel mean differs in its last bits with the number of threads that sum it."""
    saved = DataFacts(class_names=("0", "1"), normalize_mean=(0.30548396706581116,), normalize_std=(0.4,))
    data = DataFacts(class_names=["0", "1"], normalize_mean=[0.30548393726348877], normalize_std=[0.4])
    assert saved.differences(data) == []
    assert saved.differences(DataFacts(class_names=("0", "2"))) == ["class_names: ['0', '1'] vs ['0', '2']"]


def test_the_tasks_are_exported():
    assert {"LanguageModelTask", "TranslationTask", "ImageClassificationTask"} <= set(tasks.__all__)


def test_a_fine_tuning_config_takes_the_shape_of_the_checkpoint_it_starts_from(tmp_path):
    """The fields of model.net that the command line does not give come from init.checkpoint's model (not those the
    data fills); the ones it gives stay."""
    import lightning as L
    from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

    from lightformer.cli.checks import net_fields_given, take_shape_from_init_checkpoint

    path = tmp_path / "mlm.ckpt"
    saved = {"d_model": 256, "n_layers": 4, "dropout": 0.0, "vocab_size": 300, "max_len": 128}
    torch.save({"hyper_parameters": {"net": saved}, "state_dict": {}}, path)
    config = tmp_path / "finetune.yaml"
    config.write_text("model:\n  init_args:\n    net:\n      dropout: 0.1\n")
    parser = ArgumentParser(exit_on_error=False)  # as the command line parses: its config files, then its options
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_subclass_arguments(L.LightningModule, "model")
    task = "--model=lightformer.tasks.TextClassificationTask"
    given = net_fields_given(parser.parse_args([task, f"--config={config}", "--model.net.n_layers=2"], defaults=False))
    assert given == {"dropout", "n_layers"}
    net = Namespace(d_model=128, n_layers=2, dropout=0.1, vocab_size=None, max_len=512)
    model = Namespace(class_path="lightformer.tasks.TextClassificationTask",
                      init_args=Namespace(net=net, init=Namespace(checkpoint=str(path))))  # fmt: skip
    take_shape_from_init_checkpoint(model, given)
    assert net == Namespace(d_model=256, n_layers=2, dropout=0.1, vocab_size=None, max_len=128)


def test_every_registered_task_declares_a_position_table_its_model_has():
    """A task's ``position_table`` names a size of its model's config (a dotted path into a tower), and the fields
    under which the model has none are fields of it too: no task checks the data against a field its model lacks."""
    from lightformer.registry import built_in
    from lightformer.tasks.config_values import config_defaults

    declaring = set()
    for name, spec in built_in().items():
        table = spec.task.position_table
        if table is None:
            continue
        declaring.add(name)
        for path in (table.net_field, *table.absent_when):
            value = config_defaults(spec.task.net_class())
            for part in path.split("."):
                assert isinstance(value, dict) and part in value, f"{name}: model.net.{path} is no field of its model"
                value = value[part]
            if path == table.net_field:
                assert isinstance(value, int), f"{name}: model.net.{path}={value!r} is not a size"
    assert declaring >= {"ContrastiveTask", "DenoisingTask", "ImageToTextTask", "MaskedLanguageModelTask",
                         "TextClassificationTask", "TranslationTask", "VisionLanguageTask"}  # fmt: skip


def test_the_position_table_is_checked_from_the_config_alone_before_the_data():
    """The one check, before the data is prepared: the data module's options and their bound (``ConfigFacts``) in
    the message; no table where the model has none; a tower's field given nested or dotted (a ``Namespace``)."""
    from jsonargparse import Namespace

    from lightformer.data.module import ConfigFacts
    from lightformer.tasks import ContrastiveTask, DenoisingTask

    data = ConfigFacts(DataFacts(max_length=58), {"max_length": "data.segment_tokens=64"},
                       {"max_length": lambda bound: f"data.segment_tokens <= {bound // 4}"})  # fmt: skip
    with pytest.raises(ConfigError, match=r"^model.net.max_len=16 is shorter than the data's sources or targets: data."
                                          r"segment_tokens=64 makes sources or targets of up to 58 positions, and the "
                                          r"model's position table must hold them; set model.net.max_len >= 58 or "
                                          r"data.segment_tokens <= 4$"):  # fmt: skip
        DenoisingTask.check_lengths_before_data(Namespace(max_len=16), data)
    DenoisingTask.check_lengths_before_data(Namespace(max_len=16, position="none"), data)  # no position table
    DenoisingTask.check_lengths_before_data(Namespace(max_len=58), data)
    with pytest.raises(ConfigError, match=r"^model.net.text.block_size=8 is shorter .* >= 58 or data.segment_tokens"):
        ContrastiveTask.check_lengths_before_data({"text": {"block_size": 8}}, data)
    with pytest.raises(ConfigError, match=r"^model.net.text.block_size=9 is shorter .* >= 58 or data.segment_tokens"):
        ContrastiveTask.check_lengths_before_data(Namespace(text=Namespace(block_size=9)), data)
    ContrastiveTask.check_lengths_before_data(Namespace(), data)  # the default tower: 64 positions
