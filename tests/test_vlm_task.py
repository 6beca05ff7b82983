"""The vision-language task: its answer metrics, its warm start from a language model of fewer positions, and (slow)
a few-second fit whose checkpoint answers questions through ``ask``, in order, an unreadable image named."""

from __future__ import annotations

import math

import pytest
import torch

from lightformer.errors import ConfigError
from lightformer.models.gpt import GPT, GPTConfig, extend_positions
from lightformer.tasks.vision_language import GroupMeans, normalise_answer, read_questions, token_f1


def test_answers_compare_as_squad_does():
    assert normalise_answer("  Stop   Sign. ") == normalise_answer("stop sign")
    assert normalise_answer("stop") != normalise_answer("stop sign")
    assert token_f1("the red apple", "red apple") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert token_f1("a cat", "dog") == 0.0
    assert token_f1("cat, cat", "cat") == pytest.approx(2 * 0.5 * 1 / 1.5)  # a word counts as often as both hold it
    assert token_f1("", "") == 1.0 and token_f1("", "x") == 0.0


def test_group_means_weigh_each_value_in_its_group():
    metric = GroupMeans(3)
    metric.update(torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 0, 2]), torch.tensor([3.0, 1.0, 2.0]))
    metric.update(torch.tensor([1.0]), torch.tensor([2]))
    per_group, overall = metric.compute()
    assert per_group[0].item() == pytest.approx(0.75) and math.isnan(per_group[1].item())
    assert per_group[2].item() == pytest.approx((0.5 * 2 + 1) / 3)
    assert overall.item() == pytest.approx((3 + 1 + 1) / 7)


def test_questions_file_names_the_line_that_is_not_image_tab_question(tmp_path):
    good = tmp_path / "q.tsv"
    good.write_text("a.png\tWhat is this?\n\n/abs/b.png\tWhich category?\n", encoding="utf-8")
    assert read_questions(str(good)) == [(str(tmp_path / "a.png"), "What is this?"), ("/abs/b.png", "Which category?")]
    bad = tmp_path / "bad.tsv"
    bad.write_text("a.png\tWhat is this?\nb.png What is that?\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.tsv line 2 is not 'image<TAB>question'"):
        read_questions(str(bad))


def test_a_shorter_position_table_starts_the_first_positions():
    small = GPT(GPTConfig(vocab_size=11, block_size=8, d_model=16, n_heads=2, n_layers=1))
    large = GPT(GPTConfig(vocab_size=11, block_size=16, d_model=16, n_heads=2, n_layers=1))
    fresh = large.position.weight.detach().clone()
    weights = extend_positions(large, small.state_dict())
    large.load_state_dict(weights)
    assert torch.equal(large.position.weight[:8], small.position.weight)
    assert torch.equal(large.position.weight[8:], fresh[8:])
    ids = torch.randint(0, 11, (2, 8))
    assert torch.allclose(large(ids), small(ids), atol=1e-6)  # the first 8 positions behave as the small model's
