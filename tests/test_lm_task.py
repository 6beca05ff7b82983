"""The language-model task end to end through the CLI: TensorBoard events, checkpoint, generation."""

import glob
import json
import math

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightformer.cli.main import cli_main, main
from lightformer.facts import DataFacts
from lightformer.models import GPTConfig
from lightformer.tasks import LanguageModelTask
from tiny_runs import FactsOnly, with_data

CORPUS = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife.\n"
) * 40


def tiny_args(tmp_path, *extra: str) -> list[str]:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    return [
        "--config=configs/lm/austen_char.yaml",
        "--data.source.corpus=null",
        f"--data.source.train_files=[{corpus}]",
        f"--data.prepare.dir={tmp_path / 'prepared'}",
        "--data.block_size=32",
        "--data.loader.batch_size=8",
        "--model.net.n_layers=2",
        "--model.net.d_model=32",
        "--model.optimizer.warmup_steps=2",
        "--model.sample_tokens=20",
        "--trainer.max_steps=6",
        "--trainer.val_check_interval=3",
        "--trainer.log_every_n_steps=1",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        "--trainer.enable_progress_bar=false",
        *extra,
    ]


def fit_tiny(tmp_path, *extra: str) -> str:
    cli_main(["fit", *tiny_args(tmp_path, *extra)])
    return glob.glob(str(tmp_path / "runs" / "austen_char" / "version_0"))[0]


def test_training_scalars_reach_the_logs_on_the_logging_steps_with_those_steps_values(tmp_path, monkeypatch):
    """``Task.log_train``: every ``log_every_n_steps``, and at the step where a callback ends the run (as max_time's
    timer does), the logs get that step's own loss; ``self.log`` is called on those steps only."""
    cli = cli_main([*tiny_args(tmp_path, "--trainer.max_steps=12", "--trainer.log_every_n_steps=3")], run=False)

    class StopAtSeven(Callback):
        losses: list[float] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.losses.append(outputs["loss"].item())
            trainer.should_stop = len(self.losses) == 7

    cli.trainer.callbacks.append(StopAtSeven())
    logged, log = [], cli.model.log
    monkeypatch.setattr(
        cli.model, "log", lambda name, *args, **kwargs: (logged.append(name), log(name, *args, **kwargs))
    )
    cli.trainer.fit(cli.model, cli.datamodule)
    events = EventAccumulator(glob.glob(str(tmp_path / "runs" / "austen_char" / "version_0"))[0])
    events.Reload()
    losses = StopAtSeven.losses
    assert len(losses) == 7
    steps = [2, 5, 6]  # Lightning labels the n-th batch's logs n - 1: batches 3 and 6, and 7 where the run stopped
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(i, pytest.approx(losses[i])) for i in steps]
    assert [e.value for e in events.Scalars("train/ppl")] == [pytest.approx(math.exp(losses[i])) for i in steps]
    assert [name for name in logged if name.startswith("train/")] == ["train/loss", "train/ppl"] * len(steps)


@pytest.mark.slow
def test_fit_writes_tensorboard_scalars_and_samples_and_a_checkpoint_that_generates(tmp_path, capsys):
    throughput = {
        "class_path": "lightformer.training.callbacks.Throughput",
        "init_args": {"window_size": 2, "peak_flops": 1e12},
    }
    log_dir = fit_tiny(tmp_path, f"--trainer.callbacks+={json.dumps(throughput)}")
    events = EventAccumulator(log_dir)
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train/loss", "train/ppl", "train/lr/decayed", "train/lr/not_decayed", "val/loss", "val/ppl"} <= scalars
    # throughput: tokens (8 windows of 32 per batch) and FLOPs per second, and MFU against the given peak
    last = {tag: events.Scalars(tag)[-1].value for tag in scalars if tag.startswith("velocity/train/device/")}
    assert last["velocity/train/device/items_per_sec"] == pytest.approx(
        8 * 32 * last["velocity/train/device/batches_per_sec"]
    )
    assert last["velocity/train/device/mfu"] == pytest.approx(last["velocity/train/device/flops_per_sec"] / 1e12)
    flops_per_batch = last["velocity/train/device/flops_per_sec"] / last["velocity/train/device/batches_per_sec"]
    n_params = 2 * 12 * 32 * 32 + 85 * 32  # 2 layers of 12·d² (attention 4d², feed-forward 8d²) and the tied head
    estimate = 6 * n_params * 8 * 32  # forward + backward ≈ 6 FLOPs per parameter per token (Kaplan et al.)
    assert 1.0 < flops_per_batch / estimate < 1.5  # plus attention scores, which the estimate leaves out
    losses = [e.value for e in events.Scalars("train/loss")]
    assert all(math.isfinite(v) for v in losses) and len(losses) == 6
    val = events.Scalars("val/loss")
    assert [e.step for e in val] == [2, 5]
    assert math.exp(val[-1].value) == pytest.approx(events.Scalars("val/ppl")[-1].value, rel=1e-4)
    samples = [t for t in events.Tags()["tensors"] if t.startswith("val/sample")]
    assert samples, events.Tags()["tensors"]
    text = events.Tensors(samples[0])[-1].tensor_proto.string_val[0].decode()
    assert len(text.strip()) > 0

    # The tokenizer is saved with the run, and travels in the checkpoint too.
    assert glob.glob(f"{log_dir}/tokenizer.json")
    # The checkpoint alone (no config, no corpus) generates text with its own tokenizer.
    (tmp_path / "corpus.txt").unlink()
    ckpt = glob.glob(f"{log_dir}/checkpoints/last.ckpt")[0]
    capsys.readouterr()
    main(["generate", f"--ckpt_path={ckpt}", "--prompt=It is", "--max_new_tokens=30", "--seed=0"])
    printed = capsys.readouterr().out
    assert printed.startswith("It is") and len(printed) > len("It is")
    assert set(printed) <= set(CORPUS) | {"\n"}


def test_loaded_checkpoint_keeps_tokenizer_and_weights(tmp_path):
    torch.manual_seed(0)
    from lightformer.tokenization.text import Tokenizer

    tokenizer = Tokenizer.train_char(["abcdef \n"])
    facts = DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size)
    task = LanguageModelTask(net=GPTConfig(block_size=16, n_layers=1, n_heads=2, d_model=16), data_facts=facts)
    checkpoint = {"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams)}
    task.on_save_checkpoint(checkpoint)
    path = tmp_path / "model.ckpt"
    torch.save(checkpoint | {"pytorch-lightning_version": "2.6.6"}, path)
    # a plain checkpoint holds only tensors, numbers and strings: loadable with weights_only=True
    torch.load(path, weights_only=True)
    loaded = LanguageModelTask.load_from_checkpoint(path)
    assert loaded.tokenizer.to_str() == task.tokenizer.to_str() == tokenizer.to_str()
    assert loaded.data_facts == facts and loaded.model.config == task.model.config
    ids = torch.tensor([[4, 5, 6]])
    torch.testing.assert_close(loaded(ids), task(ids))
    assert loaded.generate_text("abc", 5, temperature=0) == task.generate_text("abc", 5, temperature=0)


def test_tokenizer_larger_than_model_vocabulary_is_refused(tmp_path):
    from lightformer.errors import ConfigError
    from lightformer.tokenization.text import Tokenizer

    task = LanguageModelTask(net=GPTConfig(vocab_size=5, block_size=8, n_layers=1, n_heads=1, d_model=8))
    tokenizer = Tokenizer.train_char(["abcdef"])
    assert tokenizer.vocab_size == 10
    with_data(task, FactsOnly(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size))
    with pytest.raises(
        ConfigError,
        match="the data gives vocab_size=10 but the model has model.net.vocab_size=5, which must be at least",
    ):
        task.setup("fit")


def test_fit_help_works(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--help"])
    assert exit_info.value.code == 0
    assert "--config" in capsys.readouterr().out


def test_fit_validates_on_fixed_windows_and_ends_with_the_whole_split(tmp_path):
    log_dir = fit_tiny(tmp_path, "--data.loader.val_windows=3")
    events = EventAccumulator(log_dir)
    events.Reload()
    val = events.Scalars("val/loss")
    assert len(val) == 3 and val[0].step < val[1].step <= val[2].step  # two in fit, then the whole split
    # The last one is the whole split's loss of the last weights, as `validate` computes it.
    ckpt = f"{log_dir}/checkpoints/last.ckpt"
    corpus = tmp_path / "corpus.txt"
    options = [
        f"--data.source.train_files=[{corpus}]",
        f"--data.prepare.dir={tmp_path / 'prepared'}",
        "--data.block_size=32",
    ]
    config = ["--config=configs/lm/austen_char.yaml", "--data.source.corpus=null", *options, "--trainer.logger=false",
              f"--trainer.default_root_dir={tmp_path}"]  # fmt: skip
    validated = cli_main(["validate", *config, f"--ckpt_path={ckpt}"]).trainer.callback_metrics["val/loss"]
    assert val[2].value == pytest.approx(validated.item(), rel=1e-5)
    assert val[1].value != pytest.approx(val[2].value, rel=1e-5)  # three windows are not the whole split
