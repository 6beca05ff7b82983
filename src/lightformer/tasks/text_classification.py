"""Text classification: a BERT encoder, its pooled [CLS] state and a linear classifier, trained with cross-entropy,
from scratch or fine-tuned from a masked-LM pretraining run (``model.init.checkpoint``).

Logs loss and accuracy while training, loss, accuracy and macro-F1 in validation and test, and the test confusion
matrix. The tokenizer and the class names travel inside the checkpoint, so a checkpoint alone classifies texts
(``classify_texts``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix, MulticlassF1Score

from lightformer.data.families.labelled import TextClassificationDataModule
from lightformer.io.layouts import bert
from lightformer.models.bert import BertConfig, BertForSequenceClassification
from lightformer.registry import register
from lightformer.tasks.base import TextTask
from lightformer.tasks.data_contract import PositionTable
from lightformer.training.callbacks import raise_if_non_finite

Batch = dict[str, Tensor | list[str]]


class TextClassificationTask(TextTask):
    """Cross-entropy on ``BertForSequenceClassification``; the data's tokenizer and class names travel inside the
    checkpoint.

    The model's ``vocab_size``, ``pad_id`` and ``num_classes`` (in ``net``) come from the data's facts. To
    fine-tune, set ``init.checkpoint`` to a masked-LM pretraining run's checkpoint: its encoder (``bert.*``) and
    pooler (``pooler.*``) are loaded by name, the classifier starts new. The data must then be encoded
    with that run's tokenizer (``data.init_args.tokenizer.file``), which ``setup`` checks.

    Args:
        net: the BERT encoder's shape and its classifier's ``num_classes`` and ``classifier_dropout``
            (``BertConfig``); a pretraining checkpoint's encoder shape must be the same.
        label_smoothing: of the training targets, in [0, 1); validation and test losses are plain cross-entropy.
    """

    items_name = "tokens"  # what throughput counts (padding left out)
    variable_shapes = True  # batches padded to their longest sequence
    hparam_metrics = ("val/acc", "val/f1", "val/loss", "test/acc", "test/f1")

    model_class = BertForSequenceClassification
    net_from_data = {"vocab_size": "vocab_size", "pad_id": "pad_id", "num_classes": "num_classes"}
    position_table = PositionTable(
        "max_len",
        "texts",
        counted="[CLS] and [SEP] included",
        shorter=lambda positions: f"data.max_tokens <= {positions}",
    )

    def __init__(self, net: BertConfig = BertConfig(), label_smoothing: float = 0.0, **common: Any) -> None:
        if not 0 <= label_smoothing < 1:
            raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 1)")
        super().__init__(net, **common)
        num_classes = self.num_classes

        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_f1 = MulticlassF1Score(num_classes, average="macro")
        self.test_f1 = MulticlassF1Score(num_classes, average="macro")
        self.test_confusion = MulticlassConfusionMatrix(num_classes)

    @property
    def num_classes(self) -> int:
        return self.model.config.num_classes

    @property
    def max_tokens(self) -> int | None:
        """The longest text of the data in tokens, [CLS] and [SEP] included (``data.max_tokens``)."""
        return getattr(self.data_facts, "max_length", None)

    # --- training and evaluation ------------------------------------------------------------------------------

    def model_inputs(self, batch: Batch) -> tuple[Tensor]:
        return (batch["ids"],)

    def throughput_counts(self, batch: Batch) -> tuple[int, Tensor]:
        ids = batch["ids"]
        return len(ids), (ids != self.model.config.pad_id).sum()  # items: tokens, padding left out, on the device

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        labels = batch["labels"]
        logits = self(batch["ids"]).float()
        loss = F.cross_entropy(logits, labels, label_smoothing=self.hparams.label_smoothing)
        self.log_train({"train/loss": loss, "train/acc": (logits.argmax(-1) == labels).float().mean()})
        return loss

    def _evaluate(self, batch: Batch, loss: MeanMetric, acc: MulticlassAccuracy, f1: MulticlassF1Score) -> Tensor:
        labels = batch["labels"]
        logits = self(batch["ids"]).float()
        loss.update(F.cross_entropy(logits, labels), weight=len(labels))
        acc.update(logits, labels)
        f1.update(logits, labels)
        return logits

    def _log_epoch_metrics(self, stage: str, loss: MeanMetric, acc: MulticlassAccuracy, f1: MulticlassF1Score) -> None:
        metrics = {f"{stage}/loss": loss.compute(), f"{stage}/acc": acc.compute(), f"{stage}/f1": f1.compute()}
        raise_if_non_finite(self.trainer, f"{stage}/loss", metrics[f"{stage}/loss"])
        for metric in (loss, acc, f1):
            metric.reset()
        self.log_dict(metrics, prog_bar=stage == "val")

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, self.val_loss, self.val_acc, self.val_f1)

    def on_validation_epoch_end(self) -> None:
        self._log_epoch_metrics("val", self.val_loss, self.val_acc, self.val_f1)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        logits = self._evaluate(batch, self.test_loss, self.test_acc, self.test_f1)
        self.test_confusion.update(logits, batch["labels"])

    def on_test_epoch_end(self) -> None:
        self._log_epoch_metrics("test", self.test_loss, self.test_acc, self.test_f1)
        self.log_confusion(self.test_confusion, self._names(), "examples")

    def predict_step(self, batch: Batch | Tensor, batch_idx: int = 0) -> dict[str, Tensor]:
        """Token ids ``(batch, seq)`` (or a batch holding them as "ids") → class ``probabilities``
        ``(batch, num_classes)`` and ``predictions`` ``(batch,)``."""
        ids = batch["ids"] if isinstance(batch, dict) else batch
        probabilities = self(ids).float().softmax(dim=-1)
        return {"probabilities": probabilities, "predictions": probabilities.argmax(dim=-1)}

    # --- inference on texts -----------------------------------------------------------------------------------

    def _names(self) -> list[str]:
        return self.class_names or [str(i) for i in range(self.num_classes)]

    def encode_texts(self, texts: list[str]) -> Tensor:
        """Texts → ids ``(len(texts), T)`` as the data module made them: [CLS] tokens [SEP], cut to the data's
        ``max_tokens`` (or the model's ``max_len``) with [SEP] kept last, padded."""
        if self.tokenizer is None:
            raise RuntimeError("this model has no tokenizer: train it with a text data module or load a checkpoint")
        limit = min(self.max_tokens or self.model.config.max_len, self.model.config.max_len)
        rows = self.tokenizer.encode_batch(texts, add_bos=True, add_eos=True)
        rows = [row if len(row) <= limit else [*row[: limit - 1], self.tokenizer.eos_id] for row in rows]
        ids = torch.full((len(rows), max(map(len, rows), default=2)), self.model.config.pad_id, dtype=torch.int64)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.int64)
        return ids

    @torch.no_grad()
    def classify_texts(self, texts: list[str], top_k: int = 3, batch_size: int = 64) -> list[list[tuple[str, float]]]:
        """The ``top_k`` most likely (class name, probability) pairs of each text, best first."""
        if top_k < 1:
            raise ValueError(f"top_k={top_k} must be at least 1")
        was_training = self.training
        self.eval()
        ranked = []
        for start in range(0, len(texts), batch_size):
            ids = self.encode_texts(texts[start : start + batch_size]).to(self.device)
            probabilities = self.predict_step(ids)["probabilities"]
            values, indices = probabilities.topk(min(top_k, probabilities.shape[-1]), dim=-1)
            names = self._names()
            ranked += [
                [(names[i], p) for i, p in zip(row_indices.tolist(), row_values.tolist(), strict=True)]
                for row_values, row_indices in zip(values, indices, strict=True)
            ]
        self.train(was_training)
        return ranked


register(TextClassificationTask, data=TextClassificationDataModule, layouts={"hf": bert.CLASSIFIER_HF})
