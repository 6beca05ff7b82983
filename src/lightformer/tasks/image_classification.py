"""Image classification: a Vision Transformer trained with label smoothing, mixup/cutmix and AdamW.

Logs loss and top-1/top-5 accuracy, the attention rollout of a few fixed validation images (titled with their true
and predicted classes) at every validation, and the test confusion matrix.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from lightformer.data.families.images import ImageDataModule
from lightformer.data.sources.image_files import read_images
from lightformer.errors import ConfigError
from lightformer.io.layouts import vit
from lightformer.models.vit import VisionTransformer, ViTConfig, attention_rollout
from lightformer.registry import register
from lightformer.tasks.base import Task
from lightformer.tasks.command_support import load_task, paths_of, require, unreadable_images
from lightformer.training.callbacks import raise_if_non_finite
from lightformer.training.tensorboard import (
    logging_step,
    rollout_figure,
    tensorboard_logger,
    tensorboard_writer,
)


class ImageClassificationTask(Task):
    """Cross-entropy on a ViT; the data module's class names and normalisation travel inside the checkpoint.

    The model's ``num_classes``, ``image_size`` and ``in_channels`` come from the data's facts, which the
    checkpoint keeps with the normalisation, so a checkpoint alone is enough to classify image files
    (``classify_files``, ``lightformer classify``).

    Args:
        net: the ViT's shape (``ViTConfig``).
        label_smoothing: of the training targets (also inside mixup/cutmix targets); validation and test
            losses are plain cross-entropy.
        mixup: alpha of timm's mixup; 0 disables it. With mixup or cutmix on, each batch is mixed with its
            reverse (an odd last batch loses one image) and trained on soft targets.
        cutmix: alpha of timm's cutmix; 0 disables it.
        test_time_flip: evaluate and predict on each image and its mirror image, averaging the two
            probabilities (test-time augmentation; doubles the cost of evaluation). Only for data whose
            mirrored images keep their labels (not digits), and training with flips.
        attention_images: how many fixed validation images get attention maps logged (0: none).
    """

    model_class = VisionTransformer
    net_from_data = {"num_classes": "num_classes", "image_size": "image_size", "in_channels": "in_channels"}

    def __init__(
        self,
        net: ViTConfig = ViTConfig(),
        label_smoothing: float = 0.1,
        mixup: float = 0.0,
        cutmix: float = 0.0,
        test_time_flip: bool = False,
        attention_images: int = 4,
        **common: Any,
    ) -> None:
        super().__init__(net, **common)
        num_classes = self.model.num_classes
        self.mixup = None
        if mixup > 0 or cutmix > 0:
            self.mixup = Mixup(
                mixup_alpha=mixup, cutmix_alpha=cutmix, label_smoothing=label_smoothing, num_classes=num_classes
            )
        self.soft_target_loss = SoftTargetCrossEntropy()

        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc_top5 = MulticlassAccuracy(num_classes, top_k=5, average="micro") if num_classes >= 5 else None
        self.test_acc_top5 = MulticlassAccuracy(num_classes, top_k=5, average="micro") if num_classes >= 5 else None
        self.test_confusion = MulticlassConfusionMatrix(num_classes)
        self._attention_batch: tuple[Tensor, Tensor] | None = None

    # --- preprocessing: the data's facts, kept in the checkpoint (the class names: ``Task.class_names``) -------

    @property
    def normalize_mean(self) -> list[float] | None:
        return self.fact("normalize_mean", list)

    @property
    def normalize_std(self) -> list[float] | None:
        return self.fact("normalize_std", list)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        resuming = "optimizer_states" in checkpoint
        if resuming and self.model.saved_without_layer_biases(checkpoint["state_dict"], prefix="model."):
            raise ConfigError(
                "this checkpoint was saved when model.net.qkv_bias=false also switched off the encoder layers' other "
                "biases (before model.net.bias existed), so its optimizer state has none for the biases today's model "
                "has, and its run cannot be resumed. Start a new run from its weights (--model.init.checkpoint=<it> "
                "instead of --ckpt_path, with --model.net.bias=false to keep the model as it was); test and predict "
                "read it as it is"
            )
        super().on_load_checkpoint(checkpoint)

    # --- training and evaluation --------------------------------------------------------------------------

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, labels = batch
        if self.mixup is None:
            logits = self(images)
            loss = F.cross_entropy(logits.float(), labels, label_smoothing=self.hparams.label_smoothing)
            metrics = {"train/acc": (logits.argmax(-1) == labels).float().mean()}
        else:
            if len(images) % 2:  # timm's Mixup pairs each image with the batch's reverse
                images, labels = images[:-1], labels[:-1]
            images, soft_targets = self.mixup(images, labels)
            loss = self.soft_target_loss(self(images).float(), soft_targets)
            metrics = {}
        self.log_train({"train/loss": loss, **metrics})
        return loss

    def model_inputs(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor]:
        return (batch[0],)

    def throughput_counts(self, batch: tuple[Tensor, Tensor]) -> tuple[int, int]:
        return len(batch[0]), len(batch[0])  # items: images

    def evaluation_logits(self, images: Tensor) -> Tensor:
        """Float32 logits for evaluation and prediction; with ``test_time_flip``, the log of the mean of the
        image's and its mirror's probabilities (a log-probability vector: softmax, loss and top-k apply)."""
        logits = self(images).float()
        if not self.hparams.test_time_flip:
            return logits
        mirrored = self(images.flip(-1)).float()
        return torch.stack([logits.log_softmax(-1), mirrored.log_softmax(-1)]).logsumexp(0) - math.log(2)

    def _evaluate(self, batch: tuple[Tensor, Tensor], loss: MeanMetric, acc: MulticlassAccuracy, top5) -> Tensor:
        images, labels = batch
        logits = self.evaluation_logits(images)
        loss.update(F.cross_entropy(logits, labels), weight=len(labels))
        acc.update(logits, labels)
        if top5 is not None:
            top5.update(logits, labels)
        return logits

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        if batch_idx == 0 and self._attention_batch is None and self.hparams.attention_images > 0:
            # the first validation images: the same at every validation
            n = self.hparams.attention_images
            self._attention_batch = (batch[0][:n].detach().clone(), batch[1][:n].detach().clone())
        self._evaluate(batch, self.val_loss, self.val_acc, self.val_acc_top5)

    items_name = "images"  # what throughput counts
    hparam_metrics = ("val/acc", "val/loss", "test/acc", "test/acc_top5", "test/loss")

    def _log_epoch_metrics(self, stage: str, loss: MeanMetric, acc: MulticlassAccuracy, top5) -> None:
        metrics = {f"{stage}/loss": loss.compute(), f"{stage}/acc": acc.compute()}
        raise_if_non_finite(self.trainer, f"{stage}/loss", metrics[f"{stage}/loss"])
        if top5 is not None:
            metrics[f"{stage}/acc_top5"] = top5.compute()
            top5.reset()
        loss.reset()
        acc.reset()
        self.log_dict(metrics, prog_bar=stage == "val")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch_metrics("val", self.val_loss, self.val_acc, self.val_acc_top5)
        self._log_attention_maps()

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        logits = self._evaluate(batch, self.test_loss, self.test_acc, self.test_acc_top5)
        self.test_confusion.update(logits, batch[1])

    def on_test_epoch_end(self) -> None:
        self._log_epoch_metrics("test", self.test_loss, self.test_acc, self.test_acc_top5)
        names = self.class_names or [str(i) for i in range(self.model.num_classes)]
        self.log_confusion(self.test_confusion, names, "images")

    def predict_step(self, batch: Tensor | tuple[Tensor, ...], batch_idx: int = 0) -> dict[str, Tensor]:
        """Preprocessed images ``(batch, C, H, W)`` (or a batch whose first element they are) → class
        ``probabilities`` ``(batch, num_classes)`` and ``predictions`` ``(batch,)``."""
        images = batch[0] if isinstance(batch, list | tuple) else batch
        probabilities = self.evaluation_logits(images).softmax(dim=-1)
        return {"probabilities": probabilities, "predictions": probabilities.argmax(dim=-1)}

    # --- attention maps -----------------------------------------------------------------------------------

    def _log_attention_maps(self) -> None:
        if tensorboard_logger(self) is None or self.trainer.sanity_checking or self._attention_batch is None:
            return
        images, labels = self._attention_batch  # every process draws: under FSDP2 a forward pass needs them all
        maps = attention_rollout(self.model, images)
        predicted = self.evaluation_logits(images).argmax(-1).tolist()
        names = self.class_names or [str(i) for i in range(self.model.num_classes)]
        titles = [f"true: {names[t]}, predicted: {names[p]}" for t, p in zip(labels.tolist(), predicted, strict=True)]
        writer = tensorboard_writer(self)
        if writer is not None:
            figure = rollout_figure(images, maps, titles)
            writer.add_figure("val/attention_rollout", figure, logging_step(self.trainer))

    # --- image files --------------------------------------------------------------------------------------

    def preprocess_files(self, paths: list[str | Path]) -> Tensor:
        """Read image files as the model's input ``(len(paths), C, H, W)``, as the data module did in evaluation."""
        if self.normalize_mean is None or self.normalize_std is None:
            raise RuntimeError(
                "this model does not know its input normalisation: train it with an ImageDataModule "
                "(or load a checkpoint written by one), or set normalize_mean and normalize_std"
            )
        config = self.model.config
        return read_images(paths, config.in_channels, config.image_size, self.normalize_mean, self.normalize_std)

    @torch.no_grad()
    def classify_files(self, paths: list[str | Path], top_k: int = 3) -> list[list[tuple[str, float]]]:
        """The ``top_k`` most likely (class name, probability) pairs of each image file, best first."""
        return self.classify_images(self.preprocess_files(paths), top_k)

    @torch.no_grad()
    def classify_images(self, images: Tensor, top_k: int = 3) -> list[list[tuple[str, float]]]:
        """The ``top_k`` most likely (class name, probability) pairs of each preprocessed image, best first."""
        was_training = self.training
        self.eval()
        probabilities = self.predict_step(images.to(self.device))["probabilities"]
        self.train(was_training)
        names = self.class_names or [str(i) for i in range(self.model.num_classes)]
        values, indices = probabilities.topk(min(top_k, probabilities.shape[-1]), dim=-1)
        return [
            [(names[i], p) for i, p in zip(row_indices.tolist(), row_values.tolist(), strict=True)]
            for row_values, row_indices in zip(values, indices, strict=True)
        ]


# --- the commands that take this task's checkpoints alone ---------------------------------------------------


def classify(
    ckpt_path: str | None = None, images: list[str] | str | None = None, top_k: int = 3, device: str = "cpu"
) -> None:
    """The most likely classes of image files.

    Print the most likely classes of image files, with an image-classification checkpoint alone.

    Example: ``classify --ckpt_path best.ckpt --images "[a.png, b.png]" --top_k 3`` (also ``--images a.png``,
    ``--images+ a.png --images+ b.png``, or a quoted pattern ``--images "photos/*.jpg"``).

    Args:
        ckpt_path: a checkpoint written by ``fit`` with the image-classification task (its class names and
            preprocessing travel inside).
        images: image files (PNG, JPEG, ...) or glob patterns; each image is resized and normalised as in
            training. One that cannot be read is named on standard error and the others are classified, in
            order; when none can be read, the command fails.
        top_k: how many classes to print per image, most likely first.
        device: "cpu", "cuda", "cuda:1", ...
    """
    require(ckpt_path is not None and bool(images), "classify needs --ckpt_path CHECKPOINT and --images FILE ...")
    require(top_k >= 1, f"--top_k={top_k} must be at least 1")
    task = load_task(ckpt_path, ImageClassificationTask, "classify", device)
    paths = paths_of(images, "--images", "image file", ".png")
    loaded: list[Tensor | Exception] = []
    for path in paths:
        try:
            loaded.append(task.preprocess_files([path]))
        except (OSError, ValueError) as error:  # not a readable image: named, the others classified
            loaded.append(error)
    unreadable_images(paths, loaded, "classify")
    ranked = iter(task.classify_images(torch.cat([x for x in loaded if isinstance(x, Tensor)]), top_k))
    for path, image in zip(paths, loaded, strict=True):
        if isinstance(image, Tensor):
            print(f"{path}: " + ", ".join(f"{name} ({probability:.1%})" for name, probability in next(ranked)))


register(
    ImageClassificationTask,
    data=ImageDataModule,
    commands={"classify": classify},
    list_options={"classify": "--images"},
    layouts={"hf": vit.HF, "timm": vit.TIMM},
    carried=("image_classification",),
)
