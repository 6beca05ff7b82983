"""Layer choices are declared once, as ``Literal`` types in the ``nn`` module that implements them: the model configs
use those types as field types (so the command line checks and lists the values from YAML), and every check reads
the valid values from them (``typing.get_args``), so a value added to a type is valid everywhere at once."""

import dataclasses
import typing

import pytest
import torch

from lightformer.cli.main import cli_main
from lightformer.models import EncoderDecoderConfig, GPTConfig, ViTConfig
from lightformer.models.bert import BertConfig, MaskedLMHead
from lightformer.nn import (
    Activation,
    FeedForward,
    NormKind,
    PointwiseActivation,
    PositionKind,
    absolute_position,
    make_norm,
    pointwise_activation,
)

CONFIGS = [GPTConfig, EncoderDecoderConfig, ViTConfig, BertConfig]


def literal_fields(config_class) -> dict[str, tuple]:
    """The fields of a config whose type is a ``Literal``, with their valid values."""
    hints = typing.get_type_hints(config_class)
    fields = {field.name: hints[field.name] for field in dataclasses.fields(config_class)}
    return {name: typing.get_args(hint) for name, hint in fields.items() if typing.get_origin(hint) is typing.Literal}


@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda c: c.__name__)
def test_every_choice_field_is_checked_against_its_type_naming_field_value_and_valid_values(config_class):
    choices = literal_fields(config_class)
    assert {"activation", "position"} <= set(choices)
    for name, valid in choices.items():
        supported = config_class.supported.get(name, valid)
        for value in valid:  # every value of the type is accepted, but those a model refuses by name
            if value in supported:
                config_class(**{name: value})
            else:
                with pytest.raises(ValueError, match=f"{name}={value!r} is not valid for {config_class.__name__}"):
                    config_class(**{name: value})
        with pytest.raises(ValueError) as error:
            config_class(**{name: "nonsense"})
        message = str(error.value)
        assert message.startswith(f"{name}='nonsense' is not valid; valid: ")
        assert all(repr(value) in message for value in valid), message


def test_the_configs_use_the_types_declared_in_nn():
    assert typing.get_type_hints(GPTConfig)["activation"] is Activation
    assert typing.get_type_hints(GPTConfig)["norm"] is NormKind
    assert typing.get_type_hints(GPTConfig)["position"] is PositionKind
    assert typing.get_type_hints(EncoderDecoderConfig)["position"] is PositionKind
    assert typing.get_type_hints(ViTConfig)["activation"] is Activation
    assert typing.get_type_hints(BertConfig)["activation"] is Activation  # LayerConfig's field
    # a model that offers fewer values offers a subset of the layer's (its type's, or the values it supports)
    assert set(literal_fields(BertConfig)["position"]) < set(typing.get_args(PositionKind))
    assert BertConfig.supported["activation"] == typing.get_args(PointwiseActivation)
    assert set(typing.get_args(PointwiseActivation)) < set(typing.get_args(Activation))


def test_the_layers_check_their_choice_naming_the_value_and_the_valid_ones():
    cases = [
        (lambda: FeedForward(8, activation="tanh"), "activation='tanh'", Activation),
        (lambda: pointwise_activation("swiglu"), "activation='swiglu'", PointwiseActivation),
        (lambda: MaskedLMHead(8, 10, activation="swiglu"), "activation='swiglu'", PointwiseActivation),
        (lambda: make_norm("batchnorm", 8), "norm='batchnorm'", NormKind),
        (lambda: absolute_position("alibi", 8, 16), "position='alibi'", PositionKind),
    ]
    for build, named, kind in cases:
        with pytest.raises(ValueError) as error:
            build()
        message = str(error.value)
        assert message.startswith(f"{named} is not valid; valid: ")
        assert message.endswith(", ".join(map(repr, typing.get_args(kind)))), message


def test_every_activation_of_the_type_is_implemented():
    x = torch.linspace(-3, 3, 16).reshape(2, 8)
    for activation in typing.get_args(Activation):
        assert FeedForward(8, 4, activation)(x).shape == (2, 8)
    torch.testing.assert_close(pointwise_activation("gelu_tanh")(x), torch.nn.GELU(approximate="tanh")(x))


def test_the_command_line_lists_the_valid_values_of_a_choice_from_its_type(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config=configs/lm/austen_char.yaml", "--model.net.activation=tanh"], run=False)
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert "net.activation" in err and "tanh" in err
    assert "Literal['relu', 'gelu', 'gelu_tanh', 'swiglu']" in err
