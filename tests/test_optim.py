"""The optimizer every task shares: decay groups, the schedules, and the schedule a resumed run keeps; late dropout."""

import json
import math

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from lightformer.cli.main import cli_main
from lightformer.models import GPT, GPTConfig
from lightformer.tasks.optim import OptimizerConfig, WarmupSchedule, configure_adamw
from lightformer.training.callbacks import LateDropout, drop_rates
from tiny_runs import events_of, last_checkpoint, task_args


def groups(model, weight_decay=0.1):
    optimizer = configure_adamw(model, OptimizerConfig(weight_decay=weight_decay), total_steps=10)["optimizer"]
    decay = [p for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]]
    no_decay = [p for g in optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]]
    return decay, no_decay


def test_matrices_decay_and_biases_norms_do_not():
    model = GPT(GPTConfig(vocab_size=50, block_size=8, n_layers=2, n_heads=2, d_model=16))
    decay, no_decay = groups(model)
    assert all(p.ndim >= 2 for p in decay) and all(p.ndim == 1 for p in no_decay)
    # the tied embedding / LM head appears once, and every parameter is in exactly one group
    ids = [id(p) for p in decay + no_decay]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))


def test_no_weight_decay_names_are_respected():
    model = GPT(GPTConfig(vocab_size=50, block_size=8, n_layers=1, n_heads=2, d_model=16))
    model.no_weight_decay = lambda: {"position.weight"}
    decay, no_decay = groups(model)
    assert any(p is model.position.weight for p in no_decay)
    assert not any(p is model.position.weight for p in decay)


def test_the_optimizer_is_fused_on_the_cpu_too():
    optimizer = configure_adamw(torch.nn.Linear(4, 4), OptimizerConfig(), total_steps=10)["optimizer"]
    assert optimizer.defaults["fused"] is True


def test_warmup_cosine_schedule():
    schedule = WarmupSchedule("cosine", warmup_steps=10, total_steps=110, min_ratio=0.1)
    factors = [schedule(s) for s in range(120)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert factors[110] == pytest.approx(0.1) and factors[119] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(factors[9:], factors[10:], strict=False))


def test_inverse_sqrt_schedule_peaks_after_warmup():
    schedule = WarmupSchedule("inverse_sqrt", warmup_steps=100, total_steps=0, min_ratio=0.0)
    factors = [schedule(s) for s in range(400)]
    assert max(factors) == pytest.approx(1.0) and factors.index(max(factors)) == 99
    assert factors[399] == pytest.approx(math.sqrt(100 / 400))


def test_configure_adamw_steps_the_schedule():
    model = torch.nn.Linear(4, 4)
    config = configure_adamw(model, OptimizerConfig(lr=1e-3, min_lr=1e-4, warmup_steps=2, weight_decay=0.0), 10)
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert config["lr_scheduler"]["interval"] == "step"
    lrs = []
    for _ in range(10):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(5e-4) and lrs[1] == pytest.approx(1e-3)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-4)


def test_a_resumed_scheduler_keeps_the_schedule_it_was_planned_with():
    model = torch.nn.Linear(4, 4)
    first = configure_adamw(model, OptimizerConfig(warmup_steps=2), total_steps=10)["lr_scheduler"]["scheduler"]
    resumed = configure_adamw(model, OptimizerConfig(warmup_steps=2), total_steps=40)["lr_scheduler"]["scheduler"]
    resumed.load_state_dict(first.state_dict())
    assert resumed.lr_lambdas[0].total_steps == 10


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("lr", -1.0, "lr=-1.0 must be positive"),
        ("min_lr", 0.1, r"min_lr=0.1 must be in \[0, lr=0.001\]"),
        ("warmup_steps", -5, "warmup_steps=-5 must be at least 0"),
        ("schedule", "linear", "schedule='linear' is not valid; valid: 'cosine', 'inverse_sqrt', 'constant'"),
        ("weight_decay", -0.1, "weight_decay=-0.1 must be at least 0"),
        ("betas", (0.9, 1.0), r"betas\[1\]=1.0 must be in \[0, 1\)"),
        ("fit_to_max_time", True, "fit_to_max_time plans a cosine decay's length; schedule='constant' has none"),
    ],
)
def test_invalid_optimizer_settings_are_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        OptimizerConfig(**{field: value, **({"schedule": "constant"} if field == "fit_to_max_time" else {})})


def test_a_schedule_fitted_to_max_time_decays_over_the_whole_run_and_ends_at_min_lr(tmp_path):
    """max_steps is far out of reach; the 4-second max_time (at 0.02 s a step, on a simulated
    clock) ends the run at step 200, and the
    cosine decay with it."""
    clock = {"class_path": "tiny_runs.StepClock", "init_args": {"seconds_per_step": 0.02}}
    trainer = cli_main(
        [
            "fit",
            *task_args("lm", tmp_path),
            "--trainer.max_time=00:00:00:04",
            "--trainer.max_steps=1000000",
            "--trainer.max_epochs=-1",
            "--trainer.log_every_n_steps=5",
            "--model.optimizer.fit_to_max_time=true",
            "--model.optimizer.min_lr=0",
            f"--trainer.callbacks+={json.dumps(clock)}",
        ]
    ).trainer
    lr = {e.step: e.value for e in events_of(tmp_path, "austen_char")[1].Scalars("train/lr/decayed")}
    schedule = trainer.lr_scheduler_configs[0].scheduler.lr_lambdas[0]
    assert trainer.global_step == 200 and schedule.total_steps == 200  # the plan made at steps 50, 100 and 150
    peak = max(lr.values())
    halfway = lr[min(lr, key=lambda step: abs(step - 100))]
    assert 0.45 * peak < halfway < 0.55 * peak and lr[max(lr)] < 0.01 * peak, (halfway, lr[max(lr)], peak)


def test_fit_to_max_time_without_max_time_says_the_decay_ends_at_max_steps(tmp_path):
    with pytest.warns(UserWarning, match=r"trainer.max_time, which is not set: the decay ends at step 5 \(max_steps"):
        cli_main(["fit", *task_args("lm", tmp_path), "--trainer.max_steps=5", "--model.optimizer.fit_to_max_time=true"])
    checkpoint = torch.load(last_checkpoint(tmp_path), map_location="cpu", weights_only=False)
    assert checkpoint["lr_schedulers"][0]["lr_lambdas"][0]["total_steps"] == 5


LATE_DROPOUT_FROM_STEP_5 = [
    "--trainer.callbacks+=lightformer.training.callbacks.LateDropout",
    "--trainer.callbacks.start_step=5",
]


def named_drop_rates(model) -> dict[str, float]:
    rates = drop_rates(model)
    return {name: rates[module][1] for name, module in model.named_modules() if module in rates}


class DropRateProbe(Callback):
    """The drop rate of every module at each training step, as the step's forward pass sees it."""

    def __init__(self) -> None:
        self.rates = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.rates[trainer.global_step] = named_drop_rates(pl_module)


def test_late_dropout_turns_every_dropout_on_at_its_step_and_leaves_the_model_as_configured(tmp_path, caplog):
    args = [*task_args("vision", tmp_path), "--trainer.max_epochs=1", "--model.net.attn_dropout=0.1"]
    cli = cli_main([*args, *LATE_DROPOUT_FROM_STEP_5], run=False)
    probe = DropRateProbe()
    cli.trainer.callbacks.append(probe)  # after LateDropout: it sees the rates the step trains with
    configured = named_drop_rates(cli.model)
    dropping = {type(module).__name__ for module, (_, rate) in drop_rates(cli.model).items() if rate > 0}
    assert dropping == {"Dropout", "DropPath", "MultiHeadAttention"}, dropping
    caplog.set_level("INFO")
    cli.trainer.fit(cli.model, cli.datamodule)

    assert max(probe.rates) > 5
    for step, rates in probe.rates.items():
        assert rates == (configured if step >= 5 else dict.fromkeys(configured, 0.0)), step
    assert "LateDropout: dropout on from step 5" in caplog.text
    assert named_drop_rates(cli.model) == configured


def test_late_dropout_without_dropout_or_with_a_negative_step_says_so(tmp_path):
    with pytest.raises(ValueError, match=r"start_step must be a training step >= 0, got -1"):
        LateDropout(start_step=-1)
    args = [*task_args("vision", tmp_path), "--model.net.dropout=0", "--model.net.drop_path=0"]
    cli = cli_main([*args, *LATE_DROPOUT_FROM_STEP_5], run=False)
    with pytest.raises(ValueError, match=r"LateDropout\(start_step=5\): the model has no dropout to start late"):
        cli.trainer.fit(cli.model, cli.datamodule)
