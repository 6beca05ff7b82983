"""The command line on jsonargparse's own mechanisms: what a data module's config alone decides before any data is
prepared (``DataModule.facts_from_config``), and the jsonargparse 4.53 behaviours that the command line still works
around, each pinned here so that an upgrade that fixes one fails its test (then remove the workaround)."""

from __future__ import annotations

import lightning as L
import pytest
from jsonargparse import ArgumentParser

from lightformer.data import MaskedLMDataModule, SpanCorruptionDataModule, TextClassificationDataModule
from lightformer.data.modules.base import ConfigFacts, DataModule


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
