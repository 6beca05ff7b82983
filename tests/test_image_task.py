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

from lightformer.cli import cli_main, main
from lightformer.data import ImageDataModule
from lightformer.models import ViTConfig
from lightformer.tasks import ImageClassificationTask
from lightformer.tasks.image_classification import colormap, render_attention_maps, render_confusion_matrix

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "vision" / "vit_digits.yaml"


def events(log_dir: Path) -> EventAccumulator:
    (event_file,) = log_dir.glob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(event_file), size_guidance={"images": 0, "scalars": 0})
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
    assert {"train/loss", "train/acc", "train/lr/decayed", "train/device/items_per_sec"} <= scalars
    assert {"train/device/flops_per_sec"} <= scalars
    assert {"val/loss", "val/acc", "val/acc_top5"} <= scalars
    assert len(logged.Scalars("val/acc")) >= 8  # one per epoch (plus the sanity check)
    (attention,) = logged.Images("val/attention_rollout")[-1:]
    assert attention.width > 96 and attention.height > 4 * 96  # 4 images × (image | map | overlay)
    assert len(logged.Images("val/attention_rollout")) == 8  # every validation but the sanity check


def test_model_learns_and_test_writes_the_confusion_matrix(fitted, tmp_path):
    _, checkpoint = fitted
    cli = run_cli("test", tmp_path, "--ckpt_path", str(checkpoint))
    accuracy = cli.trainer.callback_metrics["test/acc"].item()
    assert accuracy >= 0.8, f"digits test accuracy {accuracy:.3f} after a short fit (chance: 0.1)"
    assert cli.trainer.callback_metrics["test/acc_top5"].item() >= accuracy
    logged = events(Path(cli.trainer.logger.log_dir))
    assert "test/acc" in logged.Tags()["scalars"]
    (confusion,) = logged.Images("test/confusion_matrix")
    assert confusion.width > 10 * 36 and confusion.height > 10 * 36


def test_checkpoint_is_self_contained(fitted):
    _, checkpoint = fitted
    raw = torch.load(checkpoint, weights_only=True)  # plain lists and strings only
    stored = raw["image_classification"]
    assert stored["class_names"] == [str(digit) for digit in range(10)]
    assert stored["in_channels"] == 1 and stored["image_size"] == 8
    assert len(stored["normalize_mean"]) == len(stored["normalize_std"]) == 1

    task = ImageClassificationTask.load_from_checkpoint(checkpoint).eval()
    assert task.class_names == stored["class_names"]
    datamodule = ImageDataModule(dataset="digits", batch_size=64)
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
    datamodule = ImageDataModule(dataset="digits")
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


def test_mixup_and_cutmix_train_on_odd_batches():
    torch.manual_seed(0)
    datamodule = ImageDataModule(dataset="digits", batch_size=33, image_size=8)
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
    datamodule = ImageDataModule(dataset="digits", image_size=8)
    net = ViTConfig(num_classes=10, image_size=16, in_channels=1, patch_size=4, d_model=32, n_layers=1, n_heads=2)
    task = ImageClassificationTask(net=net)
    trainer = L.Trainer(fast_dev_run=1, logger=False, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(ValueError, match="image_size=8 but model.net.image_size=16"):
        trainer.fit(task, datamodule=datamodule)


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_attention_rollout_and_rendering(pool):
    task = ImageClassificationTask(
        net=ViTConfig(num_classes=10, image_size=8, in_channels=1, patch_size=2, d_model=32, n_heads=4, pool=pool)
    )
    images = torch.randn(3, 1, 8, 8)
    maps = task.attention_rollout(images)
    assert maps.shape == (3, 4, 4)
    torch.testing.assert_close(maps.sum(dim=(1, 2)), torch.ones(3))
    picture = render_attention_maps(images, maps, display_size=32)
    assert picture.shape == (3, 3 * 34 + 2, 3 * 34 + 2)
    assert picture.min() >= 0 and picture.max() <= 1


def test_confusion_matrix_and_colormap_rendering():
    confusion = torch.tensor([[5, 1, 0], [0, 6, 0], [2, 0, 4]])
    picture = render_confusion_matrix(confusion, ["cat", "dog", "T-shirt/top"], cell=30)
    assert picture.shape[0] == 3 and picture.shape[1] > 90 and picture.shape[2] > 90
    assert picture.min() >= 0 and picture.max() <= 1
    ends = colormap(torch.tensor([0.0, 1.0, 2.0]))
    assert ends.shape == (3, 3)
    assert ends[0].sum() < 0.1 and ends[1].sum() > 2.5
    torch.testing.assert_close(ends[1], ends[2])  # clamped
