"""Parameter groups and learning-rate schedules shared by the tasks."""

import math

import pytest
import torch

from lightformer.models import GPT
from lightformer.tasks.optim import configure_adamw, inverse_sqrt, parameter_groups, warmup_cosine


def test_matrices_decay_and_biases_norms_do_not():
    model = GPT(50, block_size=8, n_layers=2, n_heads=2, d_model=16)
    decay, no_decay = parameter_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    # the tied embedding / LM head appears once, and every parameter is in exactly one group
    ids = [id(p) for group in (decay, no_decay) for p in group["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))


def test_no_weight_decay_names_are_respected():
    model = GPT(50, block_size=8, n_layers=1, n_heads=2, d_model=16)
    model.no_weight_decay = lambda: {"position.weight"}
    decay, no_decay = parameter_groups(model, 0.1)
    assert any(p is model.position.weight for p in no_decay["params"])
    assert not any(p is model.position.weight for p in decay["params"])


def test_warmup_cosine_schedule():
    factors = [warmup_cosine(s, warmup_steps=10, total_steps=110, min_ratio=0.1) for s in range(120)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert factors[110] == pytest.approx(0.1) and factors[119] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(factors[9:], factors[10:], strict=False))


def test_inverse_sqrt_schedule_peaks_after_warmup():
    factors = [inverse_sqrt(s, warmup_steps=100) for s in range(400)]
    assert max(factors) == pytest.approx(1.0) and factors.index(max(factors)) == 99
    assert factors[399] == pytest.approx(math.sqrt(100 / 400))


def test_configure_adamw_steps_the_schedule():
    model = torch.nn.Linear(4, 4)
    config = configure_adamw(model, 1e-3, 0.0, (0.9, 0.99), "cosine", 2, 10, min_lr=1e-4)
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert config["lr_scheduler"]["interval"] == "step"
    lrs = []
    for _ in range(10):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(5e-4) and lrs[1] == pytest.approx(1e-3)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="'cosine', 'inverse_sqrt', 'constant'"):
        configure_adamw(model, 1e-3, 0.0, (0.9, 0.99), "linear", 2, 10)
