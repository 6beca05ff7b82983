"""Scale-out: trainer presets compose with every task config; DDP on 2 CPU processes (gloo) shards the data
and synchronises the metrics; bf16-mixed on CPU; torch.compile; the training options a YAML can set.
GPU-only checks (FSDP, 16-mixed) skip where no GPU is present."""

import glob
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback

from lightformer.models import EncoderDecoderConfig, GPTConfig, ViTConfig
from lightformer.nn import DecoderLayer, EncoderLayer
from lightformer.tasks import ImageClassificationTask, LanguageModelTask, TranslationTask
from lightformer.tasks.optim import clip_gradients
from tiny_runs import ShardProbe, build, finish, last_checkpoint, resolved_config, run_cli, start_cli, task_args

TASK_CONFIGS = sorted(c for c in glob.glob("configs/*/*.yaml") if not c.startswith("configs/trainer/"))
PRESETS = sorted(glob.glob("configs/trainer/*.yaml"))
TASKS = ["vision", "lm", "translation"]
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
LIGHTNING = {"pytorch-lightning_version": "2.6.6"}


def assert_contains(resolved, expected, where: str) -> None:
    """Every value of ``expected`` (a nested dict) is in ``resolved``; other keys may hold defaults."""
    if isinstance(expected, dict):
        for key, value in expected.items():
            assert key in resolved, f"{where}.{key} missing"
            assert_contains(resolved[key], value, f"{where}.{key}")
    elif isinstance(expected, list):  # the presets' lists are sets of layer classes, printed in any order
        assert sorted(resolved) == sorted(expected), f"{where}: {resolved!r} != {expected!r}"
    else:
        assert resolved == expected, f"{where}: {resolved!r} != {expected!r}"


# --- presets ---------------------------------------------------------------------------------------------


def test_there_is_a_preset_per_rung():
    names = {Path(p).stem for p in PRESETS}
    assert {"cpu", "gpu", "ddp", "ddp_cpu", "fsdp", "multinode"} <= names


@pytest.mark.parametrize("task_config", TASK_CONFIGS)
def test_each_preset_composes_with_each_task_config(task_config, capsys):
    alone = resolved_config(capsys, task_config)
    for preset in PRESETS:
        composed = resolved_config(capsys, task_config, preset)
        assert_contains(composed["trainer"], yaml.safe_load(Path(preset).read_text())["trainer"], preset)
        assert composed["model"] == alone["model"], preset
        assert composed["data"] == alone["data"], preset
        for key in ("max_epochs", "max_steps", "callbacks", "logger"):  # the task's own trainer settings stay
            assert composed["trainer"][key] == alone["trainer"][key], f"{preset} changed trainer.{key}"


def test_multinode_adds_nodes_to_the_strategy_before_it(capsys):
    presets = ["configs/trainer/fsdp.yaml", "configs/trainer/multinode.yaml"]
    trainer = resolved_config(capsys, "configs/lm/austen_char.yaml", *presets)["trainer"]
    assert trainer["num_nodes"] == 2 and trainer["devices"] == 8
    assert trainer["strategy"]["class_path"] == "lightformer.training.distributed.FSDP2Strategy"


@pytest.fixture
def one_process_group(tmp_path):
    """A gloo process group of one: enough for FSDP2 to shard (over one process) in this process. Its rendezvous is a
    file, not a fixed TCP port, so that tests run in parallel (pytest -n) do not take each other's port."""
    store = tmp_path / "process_group"
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield torch.distributed.device_mesh.init_device_mesh("cpu", (1,))
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("task", TASKS)
def test_fsdp2_makes_each_layer_and_the_model_a_unit_and_activation_checkpointing_changes_no_gradient(
    task, one_process_group
):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from lightformer.training.distributed import shard_model

    torch.manual_seed(0)
    build_task, inputs = {
        "vision": (
            lambda: ImageClassificationTask(net=ViTConfig(num_classes=10, image_size=8, patch_size=2, n_layers=3)),
            (torch.randn(4, 3, 8, 8),),
        ),
        "lm": (
            lambda: LanguageModelTask(net=GPTConfig(vocab_size=50, n_layers=3, d_model=32, n_heads=2, dropout=0.1)),
            (torch.randint(0, 50, (4, 16)),),
        ),
        "translation": (
            lambda: TranslationTask(
                net=EncoderDecoderConfig(src_vocab_size=60, tgt_vocab_size=60, d_model=32, n_heads=2)
            ),
            (torch.randint(1, 60, (4, 10)), torch.randint(1, 60, (4, 9))),
        ),
    }[task]
    plain, checkpointed = build_task(), build_task()
    checkpointed.load_state_dict(plain.state_dict())
    checkpointed.activation_checkpointing = True
    checkpointed.configure_model()  # what Lightning calls: without a device mesh it only turns checkpointing on
    gradients = []
    for module in (plain, checkpointed):
        torch.manual_seed(1)  # the same dropout masks: checkpointing replays them in the backward pass
        module.train()(*inputs).float().square().mean().backward()
        gradients.append([p.grad for p in module.model.parameters() if p.grad is not None])
    for with_checkpoints, without in zip(gradients[1], gradients[0], strict=True):
        torch.testing.assert_close(with_checkpoints, without)

    model = plain.model
    layers = [m for m in model.modules() if isinstance(m, EncoderLayer | DecoderLayer)]
    shard_model(model, one_process_group, "bf16-mixed")
    assert len(layers) >= 3 and all(isinstance(m, FSDPModule) for m in [model, *layers])
    assert all(isinstance(p, DTensor) for p in model.parameters())
    shard_model(model, one_process_group, "bf16-mixed")  # idempotent: Lightning calls configure_model per stage
    with pytest.raises(ValueError, match="16-mixed' is not supported with FSDP2"):
        shard_model(build_task().model, one_process_group, "16-mixed")


# --- DDP on 2 CPU processes ------------------------------------------------------------------------------


def probe(out_dir: Path) -> str:
    callback = {"class_path": "tiny_runs.ShardProbe", "init_args": {"out_dir": str(out_dir)}}
    return f"--trainer.callbacks+={json.dumps(callback)}"


# One task per data pipeline and model family, each on 2 processes (about 40 s of CI each): images in memory and
# ViT, the streamed token shards and GPT, token-budget batches and the encoder-decoder, segments of the shards and
# BERT, and the vision-language model's batches of one canvas (CanvasBatchSampler) with its generated answers. The
# other tasks combine these: T5 (the masked LM's data module, the translator's model), text
# classification (a map-style data set like the images', BERT), Image GPT (a map-style data set, GPT).
DISTRIBUTED_TASKS = ["vision", "lm", "translation", "mlm", "vlm"]


@pytest.mark.slow
@pytest.mark.parametrize("task", DISTRIBUTED_TASKS)
def test_ddp_on_two_cpu_processes_shards_the_data_and_matches_one_process(task, tmp_path):
    args = [
        *task_args(task, tmp_path),
        "--config=configs/trainer/ddp_cpu.yaml",
        "--trainer.max_epochs=2",
        "--trainer.gradient_clip_val=0.5",
        "--trainer.limit_val_batches=1.0",  # the whole validation set: DDP splits it, one process takes all
    ]
    # The FSDP2 run below is started now: each launch leaves a core idle while its second process imports.
    fsdp_dir = tmp_path / "fsdp"
    fsdp_args = [*task_args(task, fsdp_dir), *args[len(task_args(task, tmp_path)) :]]
    fsdp_args[fsdp_args.index("--config=configs/trainer/ddp_cpu.yaml")] = "--config=configs/trainer/fsdp_cpu.yaml"
    fsdp_run = start_cli(["fit", *fsdp_args, probe(fsdp_dir / "probe")], fsdp_dir / "cli.log")
    run_cli(["fit", *args, probe(tmp_path / "ddp")], tmp_path / "cli.log")
    ranks = [json.loads((tmp_path / "ddp" / f"rank{r}.json").read_text()) for r in (0, 1)]

    assert [r["world_size"] for r in ranks] == [2, 2]
    shards = [set(r["train_indices"]) for r in ranks]
    # DistributedSampler repeats at most one example (world size - 1) so that both get as many batches
    assert shards[0] and shards[1] and len(shards[0] & shards[1]) <= 1, "the processes trained on the same examples"
    assert [r["train_examples"] for r in ranks] == [len(r["train_indices"]) for r in ranks]
    assert ranks[0]["metrics"] == ranks[1]["metrics"], "validation metrics differ between the processes"

    # One process validating the same weights on the same data gets the same numbers.
    single = build([*task_args(task, tmp_path / "single"), "--trainer.limit_val_batches=1.0"], ShardProbe(tmp_path))
    single.trainer.validate(single.model, single.datamodule, ckpt_path=last_checkpoint(tmp_path))
    one = json.loads((tmp_path / "rank0.json").read_text())["metrics"]
    assert one.keys() == ranks[0]["metrics"].keys() and one
    for name, value in one.items():
        assert ranks[0]["metrics"][name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    # and the shards together are the whole training set
    if task == "vision":
        single.datamodule.setup("fit")
        assert len(shards[0] | shards[1]) == len(single.datamodule.train_dataloader().dataset)

    # FSDP2 on the same 2 processes, same data and clipping: every layer sharded (DTensor gradients, their global
    # norm clipped, the fused AdamW stepping shards), the checkpoint gathered into one file: the same weights.
    finish(fsdp_run, fsdp_dir / "cli.log")
    sharded = torch.load(last_checkpoint(fsdp_dir), weights_only=True)["state_dict"]
    replicated = torch.load(last_checkpoint(tmp_path), weights_only=True)["state_dict"]
    assert sharded.keys() == replicated.keys()
    for name, value in replicated.items():
        if name.endswith(("qkv.bias", "cross_attn.kv.bias")):
            # The key bias shifts every score of a query equally, which softmax ignores: its true gradient is 0, so
            # Adam amplifies rounding noise (which differs between all-reduce and reduce-scatter) into its updates.
            # It is the second third of a qkv bias, the first half of a cross-attention's kv bias.
            d = value.shape[0] // (3 if name.endswith("qkv.bias") else 2)
            start = d if name.endswith("qkv.bias") else 0
            value, sharded[name] = (
                torch.cat([value[:start], value[start + d :]]),
                torch.cat([sharded[name][:start], sharded[name][start + d :]]),
            )
        torch.testing.assert_close(sharded[name], value, rtol=1e-4, atol=1e-5, msg=name)
    fsdp_metrics = json.loads((fsdp_dir / "probe" / "rank0.json").read_text())["metrics"]
    for name, value in ranks[0]["metrics"].items():
        assert fsdp_metrics[name] == pytest.approx(value, rel=1e-4, abs=1e-5), name


@pytest.mark.slow
def test_ddp_processes_share_the_schedule_fitted_to_max_time(tmp_path):
    """Each process measures its own pace (here, on a simulated clock, rank 1 at half rank 0's); rank 0's plan is
    broadcast, so both step with the same learning rate, and stop together at rank 0's max_time."""
    record = {"class_path": "tiny_runs.RecordSchedule", "init_args": {"out_dir": str(tmp_path / "plan")}}
    clock = {"class_path": "tiny_runs.StepClock", "init_args": {"seconds_per_step": [0.02, 0.04]}}
    args = [
        *task_args("lm", tmp_path),
        "--config=configs/trainer/ddp_cpu.yaml",
        "--trainer.max_time=00:00:00:04",
        "--trainer.max_steps=1000000",
        "--trainer.max_epochs=-1",
        "--trainer.check_val_every_n_epoch=100",  # epochs of a few steps: validations would take most of the time
        "--model.optimizer.fit_to_max_time=true",
        f"--trainer.callbacks+={json.dumps(record)}",
        f"--trainer.callbacks+={json.dumps(clock)}",
    ]
    run_cli(["fit", *args], tmp_path / "cli.log")
    ranks = [json.loads((tmp_path / "plan" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1] == {**ranks[0], "step": 200, "planned_steps": 200}, ranks  # rank 1 alone: 100


# --- precision -------------------------------------------------------------------------------------------


class RecordSteps(Callback):
    """Losses of the training steps and the dtype of the model's output."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.output_dtypes: set[torch.dtype] = set()

    def on_fit_start(self, trainer, pl_module) -> None:
        pl_module.model.register_forward_hook(lambda module, args, out: self.output_dtypes.add(out.dtype))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.losses.append(float(outputs["loss"]))


def train_a_few_steps(task: str, tmp_path: Path, precision: str, accelerator: str = "cpu") -> RecordSteps:
    record = RecordSteps()
    args = [
        *task_args(task, tmp_path),
        f"--trainer.precision={precision}",
        f"--trainer.accelerator={accelerator}",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=3",
        "--trainer.limit_val_batches=0",
    ]
    cli = build(args, record)
    cli.trainer.fit(cli.model, cli.datamodule)
    return record


@pytest.mark.parametrize("task", TASKS)
def test_bf16_mixed_on_cpu_trains_each_task_with_finite_loss(task, tmp_path):
    record = train_a_few_steps(task, tmp_path, "bf16-mixed")
    assert len(record.losses) == 3 and all(math.isfinite(loss) for loss in record.losses)
    assert record.output_dtypes == {torch.bfloat16}, "the forward pass did not run in bfloat16"


# On a CPU Lightning turns "16-mixed" into bf16-mixed; this plugin runs fp16 autocast with a loss scaler instead,
# the code path of 16-mixed on a GPU.
CPU_FP16 = {
    "class_path": "lightning.pytorch.plugins.MixedPrecision",
    "init_args": {
        "precision": "16-mixed",
        "device": "cpu",
        "scaler": {"class_path": "torch.amp.GradScaler", "init_args": {"device": "cpu", "init_scale": 1024.0}},
    },
}


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed"])
def test_the_fused_adamw_clips_gradients_under_every_precision(precision, tmp_path):
    """Lightning's mixed-precision plugins refuse to clip for a fused optimizer; every task uses one, on every
    device, and clips through ``Task.configure_gradient_clipping``."""
    args = [*task_args("vision", tmp_path), "--trainer.max_steps=8", "--trainer.gradient_clip_val=0.01"]
    if precision == "16-mixed":
        args += ["--trainer.precision=null", f"--trainer.plugins=[{json.dumps(CPU_FP16)}]"]
    else:
        args.append(f"--trainer.precision={precision}")
    clipped = ClipProbe()
    cli = build(args, clipped)
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.trainer.global_step == 8 and cli.trainer.optimizers[0].defaults["fused"] is True
    finite = [norm for norm in clipped.norms if math.isfinite(norm)]  # fp16: the scaler skips overflowing steps
    assert len(finite) >= 4
    assert all(norm <= 0.01 * 1.001 for norm in finite) and max(finite) >= 0.0099  # the true norm is far above


def test_clipping_under_loss_scaling_clips_the_true_gradients():
    """16-mixed with a fused optimizer: ``clip_gradients`` unscales before clipping, so the step equals that of the
    true gradients clipped; clipping the scaled gradients (what Lightning leaves to a fused optimizer) does not."""
    torch.manual_seed(0)
    x, initial = torch.randn(16, 8), torch.nn.Linear(8, 8).state_dict()
    trainer = SimpleNamespace(strategy=None, precision_plugin=SimpleNamespace(scaler=None))
    results = []
    for unscale_first in (True, False, None):  # None: the reference, fp32 without a scaler
        model = torch.nn.Linear(8, 8)
        model.load_state_dict(initial)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0, fused=True)
        loss = model(x).square().mean()
        if unscale_first is None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
            optimizer.step()
        else:
            scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
            scaler.scale(loss).backward()
            if unscale_first:
                trainer.precision_plugin.scaler = scaler
                clip_gradients(trainer, optimizer, 0.01, "norm")
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
            scaler.step(optimizer)
        results.append(model.weight.detach().clone())
    torch.testing.assert_close(results[0], results[2])
    assert not torch.allclose(results[1], results[2], atol=1e-4)


@gpu
@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed"])
@pytest.mark.parametrize("task", TASKS)
def test_mixed_precision_on_gpu_trains_each_task_with_finite_loss(task, precision, tmp_path):
    record = train_a_few_steps(task, tmp_path, precision, accelerator="gpu")
    assert len(record.losses) == 3 and all(math.isfinite(loss) for loss in record.losses)
    assert record.output_dtypes == {torch.float16 if precision == "16-mixed" else torch.bfloat16}


@gpu
@pytest.mark.parametrize("task", TASKS)
def test_fsdp_preset_trains_and_writes_a_checkpoint_that_loads(task, tmp_path):
    args = [*task_args(task, tmp_path), "--config=configs/trainer/fsdp.yaml", "--trainer.devices=1"]
    args.append("--trainer.gradient_clip_val=1.0")
    run_cli(["fit", *args, "--trainer.max_epochs=1"], tmp_path / "cli.log")
    checkpoint = torch.load(last_checkpoint(tmp_path), weights_only=True)
    assert all(torch.isfinite(v).all() for v in checkpoint["state_dict"].values() if v.is_floating_point())


# --- torch.compile ---------------------------------------------------------------------------------------


def compiled_and_eager(task_class, net):
    eager = task_class(net=net)
    compiled = task_class(net=net, compile=True)
    compiled.load_state_dict(eager.state_dict())
    return eager, compiled


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_compiled_and_eager_models_agree(task):
    """Training mode without dropout (compiled dropout draws other random numbers): outputs and gradients."""
    torch.manual_seed(0)
    if task == "vision":
        net = ViTConfig(num_classes=10, image_size=8, patch_size=2, n_layers=2, in_channels=1)
        pair = compiled_and_eager(ImageClassificationTask, net)
        inputs = (torch.randn(4, 1, 8, 8),)
    elif task == "lm":
        net = GPTConfig(vocab_size=50, block_size=16, n_layers=2, d_model=32, n_heads=2)
        pair = compiled_and_eager(LanguageModelTask, net)
        inputs = (torch.randint(0, 50, (4, 16)),)
    else:
        net = EncoderDecoderConfig(
            src_vocab_size=60, tgt_vocab_size=60, n_encoder_layers=2, n_decoder_layers=2, d_model=32, n_heads=2,
            d_ff=64, dropout=0.0,
        )  # fmt: skip
        pair = compiled_and_eager(TranslationTask, net)
        src = torch.randint(1, 60, (4, 10))
        src[0, 7:] = 0  # padding, so the mask path is compiled too
        inputs = (src, torch.randint(1, 60, (4, 9)))
    outputs, grads = [], []
    for task_module in pair:
        task_module.train()
        out = task_module(*inputs)
        out.float().square().mean().backward()
        outputs.append(out.detach())
        grads.append([p.grad for p in task_module.parameters()])
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-4, atol=1e-5)
    for compiled_grad, eager_grad in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(compiled_grad, eager_grad, rtol=1e-3, atol=1e-5)


def test_a_compiled_task_saves_the_eager_task_keys(tmp_path):
    net = GPTConfig(vocab_size=50, block_size=8, n_layers=1, d_model=32, n_heads=2)
    eager, compiled = compiled_and_eager(LanguageModelTask, net)
    compiled(torch.randint(0, 50, (2, 8)))  # the compiled forward exists now
    assert list(compiled.state_dict()) == list(eager.state_dict())
    assert all(key.startswith(("model.", "val_", "test_")) for key in eager.state_dict())
    path = tmp_path / "compiled.ckpt"
    torch.save({"state_dict": compiled.state_dict(), "hyper_parameters": dict(compiled.hparams)} | LIGHTNING, path)
    loaded = LanguageModelTask.load_from_checkpoint(path, weights_only=True)
    torch.testing.assert_close(loaded.model.embed.weight, compiled.model.embed.weight)
    assert loaded.compile


# --- training options from YAML --------------------------------------------------------------------------


class ClipProbe(Callback):
    """Gradient norms the optimizer stepped with (after Lightning's clipping), and the batches seen."""

    def __init__(self) -> None:
        self.norms: list[float] = []
        self.batches = 0

    def on_train_start(self, trainer, pl_module) -> None:
        def record(optimizer, args, kwargs) -> None:
            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            self.norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

        trainer.optimizers[0].register_step_post_hook(record)  # the step runs the closure, clipping included

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.batches += 1


def test_accumulation_clipping_checkpoints_and_lr_monitor_come_from_yaml(tmp_path):
    overrides = tmp_path / "options.yaml"
    overrides.write_text(
        yaml.safe_dump(
            {
                "trainer": {
                    "max_epochs": 1,
                    "accumulate_grad_batches": 2,
                    "gradient_clip_val": 0.01,
                    "gradient_clip_algorithm": "norm",
                    "callbacks": [
                        {
                            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                            "init_args": {"every_n_train_steps": 2, "save_top_k": -1, "filename": "{step}"},
                        },
                        {
                            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                            "init_args": {"monitor": "val/acc", "mode": "max", "filename": "best", "save_last": True},
                        },
                        {
                            "class_path": "lightning.pytorch.callbacks.LearningRateMonitor",
                            "init_args": {"logging_interval": "step"},
                        },
                    ],
                }
            }
        )
    )
    probe = ClipProbe()
    cli = build([*task_args("vision", tmp_path), f"--config={overrides}", "--trainer.log_every_n_steps=1"], probe)
    cli.trainer.fit(cli.model, cli.datamodule)

    assert cli.trainer.global_step == probe.batches // 2  # an optimizer step every 2 batches
    assert len(probe.norms) == cli.trainer.global_step and max(probe.norms) <= 0.01 * 1.001
    folder = Path(last_checkpoint(tmp_path)).parent
    steps = sorted(int(p.stem.split("=")[1]) for p in folder.glob("step=*.ckpt"))
    assert steps == list(range(2, cli.trainer.global_step + 1, 2))
    assert (folder / "best.ckpt").is_file() and (folder / "last.ckpt").is_file()
    best = [c for c in cli.trainer.checkpoint_callbacks if c.monitor == "val/acc"][0]
    assert best.best_model_path.endswith("best.ckpt") and best.best_model_score is not None
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = glob.glob(str(Path(cli.trainer.log_dir) / "events.out.tfevents.*"))
    accumulator = EventAccumulator(events)
    accumulator.Reload()
    learning_rates = [e.value for e in accumulator.Scalars("train/lr/decayed")]
    assert len(learning_rates) >= cli.trainer.global_step - 1 and len(set(learning_rates)) > 1  # warm-up
