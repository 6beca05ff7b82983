"""The image-classification task end to end on scikit-learn's digits: fit and test through the CLI, TensorBoard
scalars and images, learning, a self-contained checkpoint, `classify` on image files, mixup/cutmix, rendering."""

from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_digits
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightformer.cli.main import cli_main, main
from lightformer.data import ImageDataModule
from lightformer.data.loading.streaming import LoaderConfig
from lightformer.data.sources.images import ImageSource
from lightformer.models import ViTConfig
from lightformer.models.vit import attention_rollout
from lightformer.tasks import ImageClassificationTask
from lightformer.training.tensorboard import confusion_figure, rollout_figure

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "vision" / "vit_digits.yaml"


def events(log_dir: Path) -> EventAccumulator:
    """Every event file of a run's folder (fit's, and test's when it tested a checkpoint of the run)."""
    accumulator = EventAccumulator(str(log_dir), size_guidance={"images": 0, "scalars": 0})
    accumulator.Reload()
    return accumulator


def run_cli(command: str, save_dir: Path, *extra: str):
    args = [command, "--config", str(CONFIG), "--trainer.logger.init_args.save_dir", str(save_dir)]
    args += ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", *extra]
    return cli_main(args)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """One fit of the digits config (8 epochs, a few seconds): the CLI object and the checkpoint path."""
    save_dir = tmp_path_factory.mktemp("runs")
    cli = run_cli("fit", save_dir)
    return cli, Path(cli.trainer.checkpoint_callback.last_model_path)


def test_fit_logs_scalars_and_attention_maps(fitted):
    cli, _ = fitted
    logged = events(Path(cli.trainer.logger.log_dir))
    scalars = set(logged.Tags()["scalars"])
    assert {"train/loss", "train/acc", "train/lr/decayed", "velocity/train/device/items_per_sec"} <= scalars
    assert {"velocity/train/device/flops_per_sec"} <= scalars
    assert {"val/loss", "val/acc", "val/acc_top5"} <= scalars
    assert len(logged.Scalars("val/acc")) >= 8  # one per epoch (plus the sanity check)
    (attention,) = logged.Images("val/attention_rollout")[-1:]
    assert attention.width > 96 and attention.height > 4 * 96  # 4 images × (image | map | overlay)
    assert len(logged.Images("val/attention_rollout")) == 8  # every validation but the sanity check


def test_model_learns_and_test_writes_into_the_tested_run(fitted, tmp_path):
    fit, checkpoint = fitted
    cli = run_cli("test", tmp_path, "--ckpt_path", str(checkpoint))
    accuracy = cli.trainer.callback_metrics["test/acc"].item()
    assert accuracy >= 0.8, f"digits test accuracy {accuracy:.3f} after a short fit (chance: 0.1)"
    assert cli.trainer.callback_metrics["test/acc_top5"].item() >= accuracy
    # the test joined the run it tested (not a run of its own), at the step of the tested weights
    assert cli.trainer.logger.log_dir == fit.trainer.logger.log_dir and not list(tmp_path.iterdir())
    logged = events(Path(cli.trainer.logger.log_dir))
    (test_acc,) = logged.Scalars("test/acc")
    trained_to = torch.load(checkpoint, weights_only=True)["global_step"]
    assert test_acc.step == trained_to - 1 == logged.Scalars("val/acc")[-1].step
    (confusion,) = logged.Images("test/confusion_matrix")
    assert confusion.width >= 500 and confusion.height >= 450 and confusion.step == test_acc.step


def test_checkpoint_is_self_contained(fitted):
    _, checkpoint = fitted
    raw = torch.load(checkpoint, weights_only=True)  # plain lists and strings only
    stored = raw["hyper_parameters"]["data_facts"]  # everything the data told the model
    assert stored["class_names"] == [str(digit) for digit in range(10)]
    assert stored["in_channels"] == 1 and stored["image_size"] == 8
    assert len(stored["normalize_mean"]) == len(stored["normalize_std"]) == 1

    task = ImageClassificationTask.load_from_checkpoint(checkpoint).eval()
    assert task.class_names == stored["class_names"]
    assert (task.normalize_mean, task.normalize_std) == (stored["normalize_mean"], stored["normalize_std"])
    datamodule = ImageDataModule(source=ImageSource(dataset="digits"), loader=LoaderConfig(batch_size=64))
    datamodule.setup()
    images, labels = datamodule.transform_batch(next(iter(datamodule.test_dataloader())), train=False)
    with torch.no_grad():
        out = task.predict_step((images, labels), 0)
    assert out["probabilities"].shape == (64, 10) and out["predictions"].shape == (64,)
    torch.testing.assert_close(out["probabilities"].sum(-1), torch.ones(64))
    assert (out["predictions"] == labels).float().mean() >= 0.75
    torch.testing.assert_close(task.predict_step(images)["probabilities"], out["probabilities"])


def test_classify_prints_the_classes_of_image_files(fitted, tmp_path, capsys):
    _, checkpoint = fitted
    digits = load_digits()
    datamodule = ImageDataModule(source=ImageSource(dataset="digits"))
    datamodule.setup()
    picks = datamodule.test_dataset.indices[:20]  # images the model never trained on
    paths = []
    for index in picks:
        path = tmp_path / f"digit_{index}.png"
        Image.fromarray(np.round(digits.images[index] * 255 / 16).astype(np.uint8)).save(path)
        paths.append(str(path))
    capsys.readouterr()
    main(["classify", "--ckpt_path", str(checkpoint), "--images", "[" + ", ".join(paths) + "]", "--top_k", "2"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(paths)
    correct = 0
    for line, path, index in zip(lines, paths, picks, strict=True):
        assert line.startswith(f"{path}: ")
        ranked = line.removeprefix(f"{path}: ").split(", ")
        assert len(ranked) == 2 and all(entry.endswith("%)") for entry in ranked)
        correct += ranked[0].split(" ")[0] == str(digits.target[index])
    assert correct >= 15, f"{correct}/20 image files classified right"

    main(["classify", "--ckpt_path", str(checkpoint), "--images", str(tmp_path / "digit_*.png"), "--top_k", "1"])
    assert len(capsys.readouterr().out.strip().splitlines()) == len(paths)
    # several files the way a shell passes them (`--images photos/*.png` expands to many arguments)
    main(["classify", "--ckpt_path", str(checkpoint), "--images", *paths[:3], "--top_k", "1"])
    assert [line.split(":")[0] for line in capsys.readouterr().out.strip().splitlines()] == paths[:3]


def test_mixup_and_cutmix_train_on_odd_batches():
    torch.manual_seed(0)
    datamodule = ImageDataModule(source=ImageSource(dataset="digits"), loader=LoaderConfig(batch_size=33), image_size=8)
    net = ViTConfig(num_classes=10, image_size=8, in_channels=1, patch_size=2, d_model=32, n_layers=1, n_heads=2)
    task = ImageClassificationTask(net=net, mixup=0.8, cutmix=1.0)
    trainer = L.Trainer(
        fast_dev_run=3, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
    )
    trainer.fit(task, datamodule=datamodule)
    assert torch.isfinite(trainer.callback_metrics["train/loss"])


def test_test_time_flip_averages_the_probabilities_of_an_image_and_its_mirror():
    net = ViTConfig(num_classes=10, image_size=8, in_channels=1, patch_size=2, d_model=32, n_layers=1, n_heads=2)
    torch.manual_seed(0)
    plain = ImageClassificationTask(net=net).eval()
    flipping = ImageClassificationTask(net=net, test_time_flip=True).eval()
    flipping.load_state_dict(plain.state_dict())
    images = torch.randn(5, 1, 8, 8)
    with torch.no_grad():
        expected = (plain(images).softmax(-1) + plain(images.flip(-1)).softmax(-1)) / 2
        torch.testing.assert_close(flipping.predict_step(images)["probabilities"], expected)
        assert not torch.allclose(plain.predict_step(images)["probabilities"], expected)
        symmetric = torch.cat([images[..., :4], images[..., :4].flip(-1)], dim=-1)  # its own mirror image
        torch.testing.assert_close(flipping.evaluation_logits(symmetric).exp(), plain(symmetric).softmax(-1))


def test_mismatched_data_is_refused():
    datamodule = ImageDataModule(source=ImageSource(dataset="digits"), image_size=8)
    net = ViTConfig(num_classes=10, image_size=16, in_channels=1, patch_size=4, d_model=32, n_layers=1, n_heads=2)
    task = ImageClassificationTask(net=net)
    trainer = L.Trainer(fast_dev_run=1, logger=False, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(ValueError, match="the data gives image_size=8 but the model has model.net.image_size=16"):
        trainer.fit(task, datamodule=datamodule)


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_attention_rollout_and_its_figure(pool):
    task = ImageClassificationTask(
        net=ViTConfig(num_classes=10, image_size=8, in_channels=1, patch_size=2, d_model=32, n_heads=4, pool=pool)
    )
    images = torch.randn(3, 1, 8, 8)
    maps = attention_rollout(task.model, images)
    assert maps.shape == (3, 4, 4)
    torch.testing.assert_close(maps.sum(dim=(1, 2)), torch.ones(3))
    figure = rollout_figure(images, maps, [f"true: {i}, predicted: {i}" for i in range(3)])
    assert len(figure.axes) == 9 and figure.axes[0].get_title(loc="left") == "true: 0, predicted: 0"


def test_the_confusion_matrix_shows_counts_and_shares():
    confusion = torch.tensor([[5, 1, 0], [0, 6, 0], [2, 0, 4]])
    figure = confusion_figure(confusion, ["cat", "dog", "T-shirt/top"], "images")
    axes = figure.axes[0]
    assert [label.get_text() for label in axes.get_xticklabels()] == ["cat", "dog", "T-shirt/top"]
    texts = {text.get_text() for text in axes.texts}
    assert {"5\n83%", "6\n100%", "2\n33%", "4\n67%"} <= texts and "0\n0%" not in texts  # empty cells stay blank
    assert axes.get_title() == "18 images, accuracy 83.3%"
    width, height = figure.get_size_inches()
    assert width >= 5 and height >= 4.5  # legible at TensorBoard's default card size
