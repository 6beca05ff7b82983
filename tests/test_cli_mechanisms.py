"""The command line on jsonargparse's own mechanisms: what a data module's config alone decides before any data is
prepared (``DataModule.facts_from_config``), and the jsonargparse 4.53 behaviours that the command line still works
around, each pinned here so that an upgrade that fixes one fails its test (then remove the workaround)."""

from __future__ import annotations

from argparse import ArgumentError
from dataclasses import dataclass

import lightning as L
import pytest
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, auto_cli

from lightformer.cli.checks import check_config_files, config_files, model_options_given
from lightformer.cli.main import _gather_list_option, null_group_fields
from lightformer.data import MaskedLMDataModule, SpanCorruptionDataModule, TextClassificationDataModule
from lightformer.data.module import ConfigFacts, DataModule
from lightformer.errors import ConfigError, raised_by_jsonargparse, user_error


def parsed_init_args(data_class: type, *options: str):
    """A data module's init arguments as the command line parses them (its signature's defaults filled in)."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(L.LightningDataModule, "data")
    return parser.parse_args([f"--data={data_class.__module__}.{data_class.__name__}", *options]).data.init_args


@pytest.mark.parametrize(
    ("data_class", "option", "value", "length", "within"),
    [
        (MaskedLMDataModule, "segment_tokens", 20, lambda m: m.max_length, "data.segment_tokens <= 8"),
        (SpanCorruptionDataModule, "segment_tokens", 64, lambda m: m.max_length, "data.segment_tokens <= 17"),
        (TextClassificationDataModule, "max_tokens", 40, lambda m: m.max_tokens, "data.max_tokens <= 16"),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else None,
)
def test_the_facts_a_config_decides_are_those_of_the_module_it_builds(data_class, option, value, length, within):
    found = data_class.facts_from_config(parsed_init_args(data_class, f"--data.{option}={value}"))
    assert found.facts.max_length == length(data_class(**{option: value}))
    assert found.options == {"max_length": f"data.{option}={value}"}
    assert found.within["max_length"](16) == within  # the largest value whose examples fit 16 positions


def test_values_a_module_refuses_decide_nothing_before_data():
    # the module's own message says why when it is built; the check before the data stays silent
    refused = parsed_init_args(SpanCorruptionDataModule, "--data.noise_density=1.5")
    assert SpanCorruptionDataModule.facts_from_config(refused) == ConfigFacts()
    assert DataModule.facts_from_config(refused) == ConfigFacts()  # the base decides nothing before its data


# --- the jsonargparse 4.53 behaviours the command line works around (each test fails once upstream fixes it) --------


@dataclass(frozen=True)
class Source:
    corpus: str | None = "austen"


class Base:
    pass


class Module(Base):
    def __init__(self, source: Source = Source(), size: int = 1) -> None:
        if size < 1:
            raise ValueError(f"data.size={size} must be at least 1")
        self.source = source


def subclass_parser() -> ArgumentParser:
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(Base, "data")
    return parser


def test_jsonargparse_reads_a_null_group_field_of_a_subclass_as_the_string_none():
    # The bug ``cli.null_group_fields`` works around: the same null as a dict is read as None.
    parser, module = subclass_parser(), f"--data={__name__}.Module"
    assert parser.parse_args([module, "--data.source.corpus=null"]).data.init_args.source.corpus == "None"
    assert parser.parse_args([module, '--data.source={"corpus": null}']).data.init_args.source.corpus is None
    for given in (["--data.source.corpus=null"], ["--data.source.corpus", "null"]):
        rewritten = null_group_fields([module, *given])
        assert parser.parse_args(rewritten).data.init_args.source.corpus is None
    assert null_group_fields(["--data.init_args.size=null", "--trainer.logger=null"]) == [
        "--data.init_args.size=null",
        "--trainer.logger=null",
    ]  # a field of the class itself, and the trainer's (read right), stay


def run(ckpt_path: str | None = None, images: list[str] | str | None = None) -> list[str] | str | None:
    """A checkpoint command with an option of several values."""
    return images


def test_jsonargparse_reads_no_list_of_words_for_a_list_parameter():
    # jsonargparse issue #550: what a shell's glob expands to (``--images a.png b.png``) is refused
    # (``cli._gather_list_option`` gathers it into the list form).
    with pytest.raises(SystemExit):
        auto_cli(run, args=["--images", "a.png", "b.png"])
    assert auto_cli(run, args=_gather_list_option(["--images", "a.png", "b.png"], "--images")) == ["a.png", "b.png"]
    assert auto_cli(run, args=_gather_list_option(["--images", "a.png"], "--images")) == "a.png"


def test_jsonargparse_reports_what_a_class_raised_in_a_plain_value_error_of_its_own():
    # ``errors.raised_by_jsonargparse`` tells its report from the class's error by where it was raised, as 4.53 has no
    # error type of its own for it: a typed one makes this fail (then catch it by type).
    parser = subclass_parser()
    with pytest.raises(ValueError) as caught:
        parser.instantiate_classes(parser.parse_args([f"--data={__name__}.Module", "--data.size=0"]))
    report = caught.value
    assert type(report) is ValueError and raised_by_jsonargparse(report)
    assert not raised_by_jsonargparse(report.__cause__) and str(report.__cause__) == "data.size=0 must be at least 1"
    assert user_error(report, "data") == "data: data.size=0 must be at least 1"


def test_jsonargparse_names_no_config_file_in_its_syntax_errors(tmp_path):
    # ``cli.checks.check_config_files`` reads each --config file first to name it.
    config = tmp_path / "broken.yaml"
    config.write_text("model:\n  init_args: {a: 1\n", encoding="utf-8")
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)
    with pytest.raises(ArgumentError) as caught:
        parser.parse_args([f"--config={config}"])
    assert "<unicode string>" in str(caught.value) and str(config) not in str(caught.value)
    with pytest.raises(ConfigError, match=rf"^--config {config}: not valid YAML at line 3, column 1: "):
        check_config_files(["fit", "-c", str(config)])


def test_jsonargparse_keeps_no_source_of_a_parsed_value(tmp_path):
    # jsonargparse pull request #975 records where each value came from (``__provenance__``); until then
    # ``cli.checks.model_options_given`` reads the command line's words.
    config = tmp_path / "config.yaml"
    config.write_text("size: 2\n", encoding="utf-8")
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_argument("--size", type=int, default=1)
    parser.add_argument("--beam", type=int, default=1)
    parsed = parser.parse_args([f"--config={config}", "--beam=4"])
    assert not hasattr(parsed, "__provenance__") and "__provenance__" not in getattr(Namespace, "__slots__", ())
    assert model_options_given([f"--config={config}", "--model.beam=4", "--model.init_args.net.dropout", "0.1"]) == [
        "model.init_args.beam",
        "model.init_args.net.dropout",
    ]


def test_config_files_are_read_as_jsonargparse_reads_the_option():
    assert config_files(["fit", "-c", "a.yaml", "--config=b.yaml", "--config", "c.yaml", "-cd.yaml"]) == [
        "a.yaml",
        "b.yaml",
        "c.yaml",
        "d.yaml",
    ]
    assert config_files(["fit", "--config"]) == []  # jsonargparse says what is missing


def test_lightningcli_adds_default_callbacks_beside_configured_ones():
    # Why ``runs.keep_last_checkpoint_current`` and ``runs.show_progress`` add their defaults to the parsed config
    # where it has none of their kind: ``trainer_defaults`` callbacks are added whatever the config gives.
    from lightning.pytorch.callbacks import LearningRateMonitor
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

    cli = LightningCLI(
        BoringModel,
        BoringDataModule,
        trainer_defaults={"callbacks": [LearningRateMonitor("epoch")]},
        save_config_callback=None,
        args=["--trainer.callbacks=LearningRateMonitor", "--trainer.logger=false"],
        run=False,
    )
    monitors = [c for c in cli.trainer.callbacks if isinstance(c, LearningRateMonitor)]
    assert [m.logging_interval for m in monitors] == [None, "epoch"]  # the configured one, then the default
