"""Nothing a user trained is lost: exact resume, kill -9 and resume, atomic checkpoints, a stop on NaN, safe
loading, export to safetensors."""

import json
import math
import os
import pickle
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightformer.cli.main import cli_main, main
from lightformer.training.callbacks import AtomicCheckpointIO, NonFiniteLossError, RandomStateCheckpoint
from tiny_runs import ALL_TASKS, build, last_checkpoint, start_cli, task_args


class StopAfterEpochs(Callback):
    """An interruption: the run ends after `epochs` epochs although it was configured for more."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch + 1 >= self.epochs:
            trainer.should_stop = True


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "options"),
    [
        *((task, []) for task in ALL_TASKS),
        # max_steps set (not reached) and the checkpoint written at the end of epoch 2 (validation once per epoch),
        # or at the end of training (no validation then): Lightning alone resumed these one epoch short
        ("vision", ["--trainer.max_steps=1000"]),
        ("vision", ["--trainer.max_steps=1000", "--trainer.check_val_every_n_epoch=3"]),
        # a new BPE-dropout segmentation of the train pairs each epoch (epochs 3-4 use the second of two again)
        ("translation", ["--data.tokenizer.bpe_dropout=0.1", "--data.tokenizer.bpe_dropout_segmentations=2"]),
        # late dropout that starts in epoch 3 (3 steps an epoch): the resumed run starts without dropout, as the
        # uninterrupted run was at that step, and turns it on at the same step
        (
            "translation",
            ["--trainer.callbacks+=lightformer.training.callbacks.LateDropout", "--trainer.callbacks.start_step=8"],
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "+".join(o.split(".")[-1] for o in value) or None,
)
def test_fit_4_epochs_equals_fit_2_then_resume_2(task, options, tmp_path):
    straight = build([*task_args(task, tmp_path / "straight"), "--trainer.max_epochs=4", *options])
    straight.trainer.fit(straight.model, straight.datamodule)

    args = [*task_args(task, tmp_path / "resumed"), "--trainer.max_epochs=4", *options]
    interrupted = build(args, StopAfterEpochs(2))
    interrupted.trainer.fit(interrupted.model, interrupted.datamodule)
    assert interrupted.trainer.current_epoch == 2
    resumed = build(args)
    resumed.trainer.fit(resumed.model, resumed.datamodule, ckpt_path=last_checkpoint(tmp_path / "resumed"))

    assert resumed.trainer.global_step == straight.trainer.global_step
    lr = [group["lr"] for group in resumed.trainer.optimizers[0].param_groups]
    assert lr == [group["lr"] for group in straight.trainer.optimizers[0].param_groups]
    expected, actual = straight.model.state_dict(), resumed.model.state_dict()
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=1e-6, atol=1e-7, msg=f"{task}: {name} differs")


@pytest.mark.slow
def test_without_the_random_state_a_resumed_run_diverges(tmp_path):
    """The control for the test above: Lightning alone restores weights and counters, not the generators."""
    straight = build([*task_args("vision", tmp_path / "straight"), "--trainer.max_epochs=3"])
    straight.trainer.fit(straight.model, straight.datamodule)

    args = [*task_args("vision", tmp_path / "resumed"), "--trainer.max_epochs=3"]
    interrupted = build(args, StopAfterEpochs(1))
    interrupted.trainer.fit(interrupted.model, interrupted.datamodule)
    resumed = build(args)
    resumed.trainer.callbacks = [c for c in resumed.trainer.callbacks if not isinstance(c, RandomStateCheckpoint)]
    resumed.trainer.fit(resumed.model, resumed.datamodule, ckpt_path=last_checkpoint(tmp_path / "resumed"))
    assert resumed.trainer.global_step == straight.trainer.global_step
    differs = [
        name
        for name, value in straight.model.state_dict().items()
        if not torch.allclose(resumed.model.state_dict()[name], value, rtol=1e-6, atol=1e-7)
    ]
    assert differs


def test_a_resumed_run_goes_on_in_its_own_run_folder(tmp_path):
    args = [*task_args("vision", tmp_path), "--trainer.max_epochs=2", "--trainer.log_every_n_steps=5"]
    interrupted = build(args, StopAfterEpochs(1))
    interrupted.trainer.fit(interrupted.model, interrupted.datamodule)
    stopped_at, checkpoint = interrupted.trainer.global_step, last_checkpoint(tmp_path)

    resumed = cli_main(["fit", *args, f"--ckpt_path={checkpoint}"])
    runs = tmp_path / "runs" / "vit_digits"
    assert [run.name for run in runs.iterdir()] == ["version_0"]  # not a version_1 beside it
    assert torch.load(checkpoint, weights_only=True)["global_step"] == resumed.trainer.global_step > stopped_at
    events = EventAccumulator(str(runs / "version_0"), size_guidance={"scalars": 0})
    events.Reload()
    steps = [event.step for event in events.Scalars("train/loss")]
    assert min(steps) < stopped_at < max(steps)  # one curve, before and after the resume

    # A checkpoint from another run family (another save_dir or name) starts a run of its own, as before.
    elsewhere = cli_main(["fit", *args, f"--ckpt_path={checkpoint}", f"--trainer.logger.init_args.save_dir={tmp_path}"])
    assert Path(elsewhere.trainer.log_dir) == tmp_path / "vit_digits" / "version_0"


@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_and_finishes(tmp_path):
    """SIGKILL mid-epoch; the resumed run starts from the last checkpoint's step and ends at max_steps."""
    max_steps, every = 200, 10
    overrides = tmp_path / "checkpoint_often.yaml"
    overrides.write_text(
        "trainer:\n"
        "  callbacks:\n"
        "    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
        f"      init_args: {{every_n_train_steps: {every}, monitor: null, save_top_k: -1, filename: '{{step}}'}}\n"
    )
    args = [
        *task_args("vision", tmp_path),
        f"--config={overrides}",
        f"--trainer.max_steps={max_steps}",
        "--trainer.max_epochs=-1",
        *("--model.net.dropout=0.0", "--model.net.drop_path=0.0", "--data.augment.policy=none"),  # learn fast
    ]
    process = start_cli(["fit", *args], tmp_path / "cli.log", threads=1)
    checkpoints = tmp_path / "runs" / "vit_digits" / "version_0" / "checkpoints"
    deadline = time.monotonic() + 120
    while not (checkpoints / "last.ckpt").exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, (
        "the run ended before it could be killed: " + (tmp_path / "cli.log").read_text()[-3000:]
    )
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL

    saved = torch.load(checkpoints / "last.ckpt", weights_only=True)  # complete, though the writer was killed
    assert 0 < saved["global_step"] < max_steps and saved["global_step"] % every == 0
    assert not [p for p in checkpoints.iterdir() if p.name.startswith(".")], "a temporary file was left behind"

    resumed = build(args)
    resumed.trainer.fit(resumed.model, resumed.datamodule, ckpt_path=checkpoints / "last.ckpt")
    assert resumed.trainer.global_step == max_steps
    metrics = resumed.trainer.callback_metrics
    assert math.isfinite(metrics["val/loss"]) and metrics["val/acc"] > 0.6  # chance: 0.1


class CorruptWeights(Callback):
    """Make the model non-finite at a given step, before or after that step's loss is computed."""

    def __init__(self, step: int, before_loss: bool) -> None:
        self.step, self.before_loss = step, before_loss

    def _corrupt(self, trainer, pl_module) -> None:
        if trainer.global_step == self.step:
            with torch.no_grad():
                next(pl_module.parameters()).fill_(float("nan"))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.before_loss:
            self._corrupt(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.before_loss:
            self._corrupt(trainer, pl_module)


@pytest.mark.parametrize("before_loss", [True, False], ids=["nan-loss", "nan-weights-before-a-save"])
def test_non_finite_training_stops_and_keeps_the_last_good_checkpoint(before_loss, tmp_path):
    overrides = tmp_path / "checkpoint_often.yaml"
    overrides.write_text(
        "trainer:\n"
        "  callbacks:\n"
        "    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
        "      init_args: {every_n_train_steps: 5, monitor: null, filename: '{step}'}\n"
    )
    args = [*task_args("vision", tmp_path), f"--config={overrides}", "--trainer.max_steps=30"]
    # weights broken after step 10's update land in the checkpoint of step 10 unless it is refused
    cli = build(args, CorruptWeights(step=7 if before_loss else 10, before_loss=before_loss))
    with pytest.raises(NonFiniteLossError) as error:
        cli.trainer.fit(cli.model, cli.datamodule)
    last = last_checkpoint(tmp_path)
    message = str(error.value)
    assert f"last good checkpoint is {last}" in message
    assert ("training loss is nan at global step 7" if before_loss else "global step 10") in message
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["global_step"] == 5  # step 10's checkpoint of broken weights was refused
    assert all(torch.isfinite(v).all() for v in checkpoint["state_dict"].values())


def test_the_cli_reports_a_non_finite_loss_without_a_traceback(tmp_path, capsys):
    args = [
        *task_args("vision", tmp_path),
        "--model.optimizer.lr=1e30",
        "--model.optimizer.warmup_steps=0",
        "--trainer.max_steps=20",
    ]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args])
    assert str(exit_info.value).startswith("lightformer: the training loss is")
    assert "No checkpoint was written before this step" in str(exit_info.value)


def test_an_interrupted_checkpoint_write_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(3)}, path)

    def crash(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt  # a Ctrl-C (or a crash) in the middle of the write

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"step": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert io.load_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


class Exploit:
    """A pickle that runs a shell command when it is unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_malicious_checkpoint_is_refused_everywhere(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": Exploit(marker), "global_step": 0}, evil)
    with pytest.raises(pickle.UnpicklingError):
        AtomicCheckpointIO().load_checkpoint(evil)
    with pytest.raises(SystemExit, match=r"evil\.ckpt is not a readable lightformer checkpoint \(Weights only load"):
        main(["generate", f"--ckpt_path={evil}"])
    cli = build([*task_args("vision", tmp_path), "--trainer.max_steps=2"])
    with pytest.raises(pickle.UnpicklingError):
        cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=evil)
    assert not marker.exists()


def test_lightning_module_checkpoints_hold_only_safe_types(tmp_path):
    """Every checkpoint lightformer writes loads with weights_only=True (so refusing pickles costs nothing)."""
    cli = build([*task_args("vision", tmp_path), "--trainer.max_steps=3"])
    cli.trainer.fit(cli.model, cli.datamodule)
    checkpoint = torch.load(last_checkpoint(tmp_path), weights_only=True)
    assert "RandomStateCheckpoint" in checkpoint["callbacks"]
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)


def test_a_task_built_in_python_stores_its_configs_as_plain_dicts_and_its_class_path(tmp_path):
    from dataclasses import asdict

    from lightformer.models.gpt import GPTConfig
    from lightformer.tasks import ImageGPTTask, LanguageModelTask, OptimizerConfig

    net = GPTConfig(vocab_size=11, block_size=8, n_layers=1, d_model=16, n_heads=2)
    task = LanguageModelTask(net, optimizer=OptimizerConfig(lr=0.01), sample_tokens=5)
    assert task.hparams["net"] == asdict(net) and task.hparams["optimizer"]["lr"] == 0.01
    assert task.hparams["sample_tokens"] == 5 and task.hparams["init"]["checkpoint"] is None
    assert task.hparams["_class_path"] == "lightformer.tasks.language_model.LanguageModelTask"
    torch.save({"hyper_parameters": dict(task.hparams)}, tmp_path / "h.ckpt")
    assert torch.load(tmp_path / "h.ckpt", weights_only=True)["hyper_parameters"]["net"] == asdict(net)
    image_gpt = ImageGPTTask(net, num_samples=2)  # a subclass's task: the configs it was built with, as dicts
    assert image_gpt.hparams["num_samples"] == 2 and image_gpt.hparams["net"] == asdict(net)


def test_export_writes_safetensors_that_rebuild_the_model(tmp_path):
    """LM (tied embeddings): the weights and the tokenizer come back from the safetensors file alone."""
    from safetensors import safe_open
    from safetensors.torch import load_model

    from lightformer.tasks import LanguageModelTask

    cli = build([*task_args("lm", tmp_path), "--trainer.max_steps=3"])
    cli.trainer.fit(cli.model, cli.datamodule)
    output = tmp_path / "gpt.safetensors"
    main(["export", f"--ckpt_path={last_checkpoint(tmp_path)}", f"--output={output}"])

    with safe_open(output, "pt") as f:
        metadata = f.metadata()
    assert metadata["lightformer.task"] == "LanguageModelTask"
    rebuilt = LanguageModelTask(**json.loads(metadata["lightformer.hyper_parameters"])).eval()
    load_model(rebuilt.model, output)
    ids = torch.randint(0, rebuilt.model.vocab_size, (2, 16))
    torch.testing.assert_close(rebuilt(ids), cli.model.eval()(ids), rtol=0, atol=0)
    assert rebuilt.tokenizer.difference(cli.model.tokenizer) is None  # in the hyperparameters' data_facts


def test_export_in_timm_layout_loads_into_timm(tmp_path):
    from safetensors.torch import load_file
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    cli = build([*task_args("vision", tmp_path), "--trainer.max_steps=3"])
    cli.trainer.fit(cli.model, cli.datamodule)
    output = tmp_path / "vit.safetensors"
    main(["export", f"--ckpt_path={last_checkpoint(tmp_path)}", f"--output={output}", "--layout=timm"])
    hp = cli.model.model.config
    timm = TimmViT(
        img_size=hp.image_size, patch_size=hp.patch_size, in_chans=1, num_classes=10, embed_dim=hp.d_model,
        depth=hp.n_layers, num_heads=hp.n_heads, mlp_ratio=hp.d_ff / hp.d_model, class_token=False, global_pool="avg",
    ).eval()  # fmt: skip
    timm.load_state_dict(load_file(output), strict=True)
    images = torch.randn(4, 1, hp.image_size, hp.image_size)
    torch.testing.assert_close(timm(images), cli.model.model.eval()(images), rtol=1e-5, atol=1e-5)
    with pytest.raises(SystemExit, match="not to a LanguageModelTask"):
        lm = build([*task_args("lm", tmp_path / "lm"), "--trainer.max_steps=1"])
        lm.trainer.fit(lm.model, lm.datamodule)
        main(["export", f"--ckpt_path={last_checkpoint(tmp_path / 'lm')}", f"--output={output}", "--layout=timm"])


def test_average_writes_the_mean_of_the_last_checkpoints(tmp_path, capsys):
    overrides = tmp_path / "keep_all.yaml"
    overrides.write_text(
        "trainer:\n"
        "  callbacks:\n"
        "    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
        "      init_args: {every_n_train_steps: 2, monitor: null, save_top_k: -1, filename: '{step}'}\n"
    )
    args = [*task_args("vision", tmp_path), f"--config={overrides}", "--trainer.max_steps=8"]
    cli = build(args)
    cli.trainer.fit(cli.model, cli.datamodule)
    folder = Path(last_checkpoint(tmp_path)).parent
    output = tmp_path / "average.ckpt"
    main(["average", f"--ckpt_paths={folder}/step=*.ckpt", "--last=3", f"--output={output}"])
    assert "the mean of 3 checkpoints (global steps 4, 6, 8)" in capsys.readouterr().out

    averaged = torch.load(output, weights_only=True)
    states = [torch.load(folder / f"step={step}.ckpt", weights_only=True)["state_dict"] for step in (4, 6, 8)]
    for name, value in averaged["state_dict"].items():
        torch.testing.assert_close(value, sum(state[name] for state in states) / 3, msg=name)
    assert "optimizer_states" not in averaged
    tested = build([*task_args("vision", tmp_path), "--trainer.max_steps=8"])
    (metrics,) = tested.trainer.test(tested.model, tested.datamodule, ckpt_path=output)
    assert 0 <= metrics["test/acc"] <= 1

    lm = build([*task_args("lm", tmp_path / "lm"), "--trainer.max_steps=1"])
    lm.trainer.fit(lm.model, lm.datamodule)
    with pytest.raises(SystemExit, match="does not hold the same model"):
        main(["average", f"--ckpt_paths=[{output}, {last_checkpoint(tmp_path / 'lm')}]", f"--output={tmp_path / 'x'}"])


def test_a_model_starts_from_another_runs_weights_with_a_new_head_frozen_and_slowed_parts(tmp_path, caplog):
    """Fine-tuning: the matching parameters are loaded (a run's checkpoint or timm's weights), the head of another
    size is new, the report says so; frozen parameters do not train; loaded ones learn at a tenth of the rate."""
    from types import SimpleNamespace

    from safetensors.torch import save_file
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    from lightformer.io.checkpoints import InitConfig
    from lightformer.models import ViTConfig
    from lightformer.models.vit import lightformer_to_timm
    from lightformer.tasks import ImageClassificationTask

    cli = build([*task_args("vision", tmp_path), "--trainer.max_steps=3"])
    cli.trainer.fit(cli.model, cli.datamodule)
    shape = {k: v for k, v in cli.model.hparams["net"].items() if k not in ("num_classes",)}
    init = InitConfig(checkpoint=last_checkpoint(tmp_path), freeze=("patch_embed",), pretrained_lr_scale=0.1)
    task = ImageClassificationTask(net=ViTConfig(**shape, num_classes=3), init=init)
    task._trainer = SimpleNamespace(ckpt_path=None, datamodule=None)
    caplog.set_level("INFO")
    task.setup("fit")
    assert f"initialised from model.init.checkpoint {init.checkpoint}: loaded " in caplog.text
    assert "; new 2 (head.bias, head.weight); dropped 2 (head.bias, head.weight)" in caplog.text
    caplog.clear()
    trained = cli.model.model.state_dict()
    for name, value in task.model.state_dict().items():
        if not name.startswith("head"):
            torch.testing.assert_close(value, trained[name], msg=name)
    assert not task.model.patch_embed.proj.weight.requires_grad and task.model.head.weight.requires_grad
    task._trainer = SimpleNamespace(ckpt_path=None, datamodule=None, estimated_stepping_batches=10)
    optimizer = task.configure_optimizers()["optimizer"]
    rates = {group["name"]: group["lr"] for group in optimizer.param_groups}
    lr = task.optimizer_config.lr
    assert rates["decayed_new"] == pytest.approx(lr) and rates["decayed_pretrained"] == pytest.approx(0.1 * lr)
    frozen = {id(p) for p in task.model.patch_embed.parameters()}
    assert not frozen & {id(p) for group in optimizer.param_groups for p in group["params"]}

    # timm's weights, in safetensors, start a lightformer ViT the same way
    net = task.model.config
    timm = TimmViT(img_size=8, patch_size=net.patch_size, in_chans=1, num_classes=3, embed_dim=net.d_model,
                   depth=net.n_layers, num_heads=net.n_heads, mlp_ratio=net.d_ff / net.d_model, class_token=False,
                   global_pool="avg")  # fmt: skip
    path = tmp_path / "timm.safetensors"
    save_file({k: v.contiguous() for k, v in timm.state_dict().items()}, path)
    from_timm = ImageClassificationTask(net=ViTConfig(**shape, num_classes=3), init=InitConfig(checkpoint=str(path)))
    from_timm._trainer = SimpleNamespace(ckpt_path=None, datamodule=None)
    from_timm.setup("fit")
    assert "nothing new; nothing dropped" in caplog.text
    expected = lightformer_to_timm(from_timm.model.state_dict())
    for name, value in timm.state_dict().items():
        torch.testing.assert_close(expected[name], value, msg=name)
    # skip: those weights are not loaded but keep their fresh initialisation, reported as new, at the new rate
    caplog.clear()
    init = InitConfig(checkpoint=init.checkpoint, skip=("encoder.layers.1",), pretrained_lr_scale=0.1)
    reinit = ImageClassificationTask(net=ViTConfig(**shape, num_classes=3), init=init)
    fresh = {name: value.clone() for name, value in reinit.model.state_dict().items()}
    reinit._trainer = SimpleNamespace(ckpt_path=None, datamodule=None, estimated_stepping_batches=10)
    reinit.setup("fit")
    for name, value in reinit.model.state_dict().items():
        expected = fresh[name] if name.startswith(("encoder.layers.1.", "head.")) else trained[name]
        torch.testing.assert_close(value, expected, msg=name)
    skipped = [name for name in fresh if name.startswith("encoder.layers.1.")]
    report = f"; new {len(skipped) + 2} (encoder.layers.1, encoder.layers.1.ffn, encoder.layers.1.self_attn, head.bias"
    assert report + ", head.weight); dropped 2 (head.bias, head.weight)" in caplog.text
    new_weights = {id(p) for n, p in reinit.model.named_parameters() if n.startswith("encoder.layers.1.")}
    groups = reinit.configure_optimizers()["optimizer"].param_groups
    assert new_weights <= {id(p) for group in groups if group["name"].endswith("_new") for p in group["params"]}
    with pytest.raises(
        ValueError,
        match=r"model.init.skip: no weight of .* is under 'encoder.layer' \(its modules: .*encoder.layers.0",
    ):
        bad = ImageClassificationTask(
            net=ViTConfig(**shape, num_classes=3), init=replace(init, skip=("encoder.layer",))
        )
        bad._trainer = SimpleNamespace(ckpt_path=None, datamodule=None)
        bad.setup("fit")
    with pytest.raises(ValueError, match="model.init.freeze: no parameter of the model is under 'encder'"):
        bad = ImageClassificationTask(net=ViTConfig(**shape, num_classes=3), init=InitConfig(freeze=("encder",)))
        bad._trainer = SimpleNamespace(ckpt_path=None, datamodule=None)
        bad.setup("fit")


def test_a_run_resumes_exactly_after_its_prepared_data_moved(tmp_path):
    """LitData's loader state holds the absolute folder of the shards it read: a run whose prepared data moved
    (another checkout, machine or data.prepare.dir) was refused mid-epoch ("input_dir path state doesn't match"). It
    resumes now, with the weights of an uninterrupted run; the data is the same one (its fingerprint is checked)."""
    import shutil

    args = [*task_args("lm", tmp_path), "--model.optimizer.schedule=constant", "--trainer.limit_val_batches=1"]
    whole = build([*args, "--trainer.max_steps=6"])
    whole.trainer.fit(whole.model, whole.datamodule)
    shutil.rmtree(tmp_path / "runs")

    cut = build([*args, "--trainer.max_steps=3"])  # mid-epoch: the loader's state holds its position
    cut.trainer.fit(cut.model, cut.datamodule)
    shutil.move(tmp_path / "prepared", tmp_path / "moved")
    resumed = build([*args, "--trainer.max_steps=6", f"--data.prepare.dir={tmp_path / 'moved'}"])
    resumed.trainer.fit(resumed.model, resumed.datamodule, ckpt_path=last_checkpoint(tmp_path))
    assert resumed.trainer.global_step == 6
    for name, expected in whole.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], expected, rtol=0, atol=0, msg=name)
