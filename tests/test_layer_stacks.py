"""A model names its layer stacks once, beside its class (``layer_stacks``): FSDP2 shards each of their layers as one
unit and activation checkpointing recomputes them (``lightformer.training.distributed``). Every model's names reach
every stack it has, so the units are what walking the model for ``Encoder`` / ``Decoder`` stacks found before."""

from __future__ import annotations

import pytest
from torch import nn

from lightformer.cli import commands
from lightformer.nn import Decoder, Encoder
from lightformer.training.distributed import layer_stacks
from test_old_checkpoints import FIXTURE_NAMES, fixture, task_class
from tiny_runs import build, task_args


def stacks_found(model: nn.Module) -> list[nn.Module]:
    return [module for module in model.modules() if isinstance(module, Encoder | Decoder)]


@pytest.mark.parametrize(("commit", "task"), FIXTURE_NAMES)
def test_each_models_layer_stacks_are_every_stack_it_has(commit, task):
    model = commands.load_task(fixture(task, commit), task_class(task), "test").model
    assert layer_stacks(model) and [id(m) for m in layer_stacks(model)] == [id(m) for m in stacks_found(model)]


def test_the_image_to_text_models_stacks_are_its_encoders_and_its_decoders(tmp_path):
    model = build(task_args("image_text", tmp_path)).model.model
    assert [id(m) for m in layer_stacks(model)] == [id(m) for m in stacks_found(model)]
    assert len(layer_stacks(model)) == 2


def test_a_model_that_names_no_stack_is_one_unit():
    assert layer_stacks(nn.Linear(2, 2)) == []
