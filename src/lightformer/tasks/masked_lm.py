"""Masked-language-model pretraining (BERT): masked-LM and next-sentence cross-entropy on ``BertForPreTraining``.

The masking and the sentence pairs are data (``lightformer.data.families.text.MaskedLMDataModule``); this task
adds the loss, the metrics, TensorBoard samples of the model filling in masked passages, and ``fill_mask``.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric

from lightformer.data.families.text import MaskedLMDataModule
from lightformer.data.objectives.masking import IGNORE_INDEX
from lightformer.errors import ConfigError
from lightformer.facts import DataFacts
from lightformer.io.layouts import bert
from lightformer.models.bert import BertConfig, BertForPreTraining
from lightformer.registry import register
from lightformer.tasks.base import TextTask
from lightformer.tasks.command_support import check_texts, load_task, utf8_text
from lightformer.tasks.data_contract import PositionTable
from lightformer.tokenization.text import MASK, Tokenizer
from lightformer.training.callbacks import raise_if_non_finite
from lightformer.training.tensorboard import logging_step, render_masked, tensorboard_writer

Batch = dict[str, Tensor]
# What marks a masked position in the text given to ``fill_mask``: BERT's spelling or the tokenizer's own.
MASK_MARKERS = re.compile(r"\[MASK\]|" + re.escape(MASK))


class MaskedLanguageModelTask(TextTask):
    """BERT pretraining: cross-entropy of the masked tokens (+ ``nsp_weight`` × next-sentence cross-entropy).

    Batches come from ``MaskedLMDataModule``: {"ids", "segment_ids", "labels" (IGNORE_INDEX where no loss),
    "nsp_labels" (1 = B follows A, 0 = B is random; absent without NSP)}. The model's NSP head keeps BERT's (and
    Hugging Face's) order, class 0 = "B follows A", so its weights mean the same as imported BERT weights; the task
    maps the batch's labels onto it. The model's ``vocab_size`` and ``pad_id`` come from the data's facts; the
    tokenizer travels inside the checkpoint, so a checkpoint alone can ``fill_mask``.

    Args:
        net: the BERT encoder's shape (``BertConfig``).
        nsp_weight: weight of the next-sentence loss in the total loss (0 trains the masked LM alone).
        num_logged_samples: validation passages shown in TensorBoard with the model's fill-ins.
    """

    hparam_metrics = ("val/mlm_acc", "val/nsp_acc", "val/loss", "test/mlm_acc", "test/nsp_acc")
    items_name = "tokens"  # what throughput counts
    variable_shapes = True  # batches padded to their longest sequence

    model_class = BertForPreTraining
    net_from_data = {"vocab_size": "vocab_size", "pad_id": "pad_id"}
    position_table = PositionTable(
        "max_len",
        "examples",
        counted="two segments with [CLS] and [SEP]",
        shorter=lambda positions: f"data.segment_tokens <= {positions // 2}",
    )

    def __init__(
        self, net: BertConfig = BertConfig(), nsp_weight: float = 1.0, num_logged_samples: int = 4, **common: Any
    ) -> None:
        if nsp_weight < 0:
            raise ValueError(f"nsp_weight={nsp_weight} must be at least 0")
        if num_logged_samples < 0:
            raise ValueError(f"num_logged_samples={num_logged_samples} must be at least 0")
        super().__init__(net, **common)
        # Per split: the masked-LM loss (weighted by masked tokens), its accuracy, the NSP loss and accuracy.
        self.val_metrics = _Metrics(nsp_weight)
        self.test_metrics = _Metrics(nsp_weight)
        self._samples: tuple[Tensor, Tensor, Tensor] | None = None  # (inputs, labels, predictions) of val batch 0

    def check_data(self, facts: DataFacts, stage: str) -> None:
        super().check_data(facts, stage)
        if facts.tokenizer is not None:  # a ValueError naming it when the data's tokenizer has no mask token
            Tokenizer.from_str(facts.tokenizer, source="the data's tokenizer").token_id(MASK)

    # --- training and evaluation --------------------------------------------------------------------------

    def _losses(self, batch: Batch) -> dict[str, Tensor]:
        """The masked-LM loss and, with "nsp_labels", the NSP loss; with the logits the metrics need."""
        selected = batch["labels"] != IGNORE_INDEX
        mlm_logits, nsp_logits = self(batch["ids"], batch["segment_ids"], None, selected)
        out = {"mlm_logits": mlm_logits.float(), "mlm_targets": batch["labels"][selected]}
        out["mlm_loss"] = F.cross_entropy(out["mlm_logits"], out["mlm_targets"])
        out["loss"] = out["mlm_loss"]
        if "nsp_labels" in batch:
            out["nsp_logits"] = nsp_logits.float()
            out["nsp_targets"] = 1 - batch["nsp_labels"]  # the head's class 0 is "B follows A" (see the class)
            out["nsp_loss"] = F.cross_entropy(out["nsp_logits"], out["nsp_targets"])
            out["loss"] = out["loss"] + self.hparams.nsp_weight * out["nsp_loss"]
        return out

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        losses = self._losses(batch)
        self.log_train({f"train/{name}": losses[name] for name in ("loss", "mlm_loss", "nsp_loss") if name in losses})
        return losses["loss"]

    def model_inputs(self, batch: Batch) -> tuple[Tensor, Tensor]:
        return batch["ids"], batch["segment_ids"]

    def throughput_counts(self, batch: Batch) -> tuple[int, Tensor]:
        return len(batch["ids"]), (batch["ids"] != self.model.config.pad_id).sum()  # items: tokens, on the device

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        losses = self._losses(batch)
        self.val_metrics.update(losses)
        if batch_idx == 0:
            n = self.hparams.num_logged_samples
            predictions = torch.full_like(batch["labels"][:n], IGNORE_INDEX)
            selected = batch["labels"][:n] != IGNORE_INDEX
            predictions[selected] = losses["mlm_logits"][: int(selected.sum())].argmax(-1)  # rows first: in order
            self._samples = (batch["ids"][:n].cpu(), batch["labels"][:n].cpu(), predictions.cpu())

    def on_validation_epoch_end(self) -> None:
        metrics = self.val_metrics.compute("val")
        raise_if_non_finite(self.trainer, "val/loss", metrics["val/loss"])
        self.log_dict(metrics, prog_bar=True)
        self._log_samples()

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self.test_metrics.update(self._losses(batch))

    def on_test_epoch_end(self) -> None:
        self.log_dict(self.test_metrics.compute("test"))

    # --- filling in masks ----------------------------------------------------------------------------------

    @torch.no_grad()
    def fill_mask(self, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
        """The ``top_k`` most likely tokens (text, probability) at each mask marker ("[MASK]" or "<mask>") of
        ``text``, in order; special tokens are never candidates (their probability goes to the others). As
        RoBERTa's <mask>, a marker takes the space before it: "a [MASK] day" asks for one token after "a", spaces
        included (" fine").
        """
        if top_k < 1:
            raise ValueError(f"top_k={top_k} must be at least 1")
        ids, mask_id = self.mask_ids(text), self.tokenizer.token_id(MASK)
        if len(ids) > self.model.config.max_len:
            raise ValueError(
                f"the text is {len(ids)} tokens long with [CLS] and [SEP]; the model reads at most "
                f"{self.model.config.max_len}"
            )
        was_training = self.model.training
        self.model.eval()
        tensor = torch.tensor([ids], device=self.device)
        logits, _ = self.model(tensor, torch.zeros_like(tensor))
        self.model.train(was_training)
        logits = logits[0, tensor[0] == mask_id].float()
        special = [i for i in self.tokenizer.special_ids if i < logits.shape[-1]]
        logits[:, special] = float("-inf")  # a word is asked for: never a special token (<extra_id_93>, [MASK], ...)
        probabilities = logits.softmax(-1)
        top = probabilities.topk(min(top_k, probabilities.shape[-1] - len(special)), dim=-1)
        return [
            [(self.tokenizer.decode([i], skip_special=False), p) for i, p in zip(row_ids, row_p, strict=True)]
            for row_ids, row_p in zip(top.indices.tolist(), top.values.tolist(), strict=True)
        ]

    def mask_ids(self, text: str) -> list[int]:
        """The ids the model reads for ``text``: [CLS], its pieces with [MASK] at each marker (which takes the space
        before it), [SEP]."""
        if self.tokenizer is None:
            raise RuntimeError("this model has no tokenizer: train it with a text data module or load a checkpoint")
        pieces = MASK_MARKERS.split(text)
        if len(pieces) < 2:
            raise ValueError(f"the text has no mask marker ('[MASK]' or {MASK!r}) to fill in: {text!r}")
        ids = [self.tokenizer.bos_id]
        for piece in pieces[:-1]:
            ids += [*self.tokenizer.encode(piece.removesuffix(" ")), self.tokenizer.token_id(MASK)]
        return ids + [*self.tokenizer.encode(pieces[-1]), self.tokenizer.eos_id]

    def _log_samples(self) -> None:
        """A table of validation passages: the masked input, and the model's fill-in against the original."""
        writer = tensorboard_writer(self)
        if writer is None or self._samples is None or self.tokenizer is None or self.trainer.sanity_checking:
            return
        rows = [
            "Bold: the model's prediction at each masked position; in italics after it: the original token, where "
            "the prediction differs.",
            "",
            "| masked input | filled in by the model |",
            "|---|---|",
        ]
        for inputs, labels, predictions in zip(*self._samples, strict=True):
            masked, filled = render_masked(self.tokenizer, inputs.tolist(), labels.tolist(), predictions.tolist())
            rows.append(f"| {masked} | {filled} |")
        writer.add_text("val/fill_mask", "\n".join(rows), logging_step(self.trainer))


class _Metrics(torch.nn.Module):
    """The validation or test metrics of the task: torchmetrics, synchronised across processes."""

    def __init__(self, nsp_weight: float) -> None:
        super().__init__()
        self.mlm_loss, self.mlm_acc, self.nsp_loss, self.nsp_acc = (
            MeanMetric(),
            MeanMetric(),
            MeanMetric(),
            MeanMetric(),
        )
        self.nsp_weight = nsp_weight
        self.has_nsp = False  # whether the batches had next-sentence labels

    def update(self, losses: dict[str, Tensor]) -> None:
        targets = losses["mlm_targets"]
        self.mlm_loss.update(losses["mlm_loss"], weight=len(targets))
        self.mlm_acc.update((losses["mlm_logits"].argmax(-1) == targets).float())
        if "nsp_loss" in losses:
            self.has_nsp = True
            self.nsp_loss.update(losses["nsp_loss"], weight=len(losses["nsp_targets"]))
            self.nsp_acc.update((losses["nsp_logits"].argmax(-1) == losses["nsp_targets"]).float())

    def compute(self, split: str) -> dict[str, Tensor]:
        """{split/loss, split/mlm_loss, split/mlm_acc, split/mlm_ppl, and with NSP split/nsp_loss, split/nsp_acc}."""
        mlm_loss = self.mlm_loss.compute()
        values = {"mlm_loss": mlm_loss, "mlm_acc": self.mlm_acc.compute(), "mlm_ppl": torch.exp(mlm_loss)}
        values["loss"] = mlm_loss
        if self.has_nsp:
            values["nsp_loss"], values["nsp_acc"] = self.nsp_loss.compute(), self.nsp_acc.compute()
            values["loss"] = mlm_loss + self.nsp_weight * values["nsp_loss"]
        for metric in (self.mlm_loss, self.mlm_acc, self.nsp_loss, self.nsp_acc):
            metric.reset()
        return {f"{split}/{name}": value for name, value in values.items()}


# --- the commands that take this task's checkpoints alone ---------------------------------------------------


def fill_mask(*, ckpt_path: str, text: str, top_k: int = 5, device: str = "cpu") -> None:
    """The most likely words at each [MASK] of a sentence.

    Print the most likely tokens at each mask of TEXT, with a masked-language-model checkpoint alone: first the
    text with the most likely token in brackets at each mask, then per mask the ``top_k`` tokens and probabilities.

    Example: ``fill-mask --ckpt_path last.ckpt --text "It is a truth universally [MASK]."``

    Args:
        ckpt_path: a checkpoint written by ``fit`` with the masked-language-model task (its tokenizer travels
            inside).
        text: the text, with one or more mask markers: "[MASK]" or "<mask>" (a marker takes the space before it).
        top_k: how many tokens to print per mask, most likely first.
        device: "cpu", "cuda", "cuda:1", ...
    """
    if top_k < 1:
        raise ConfigError(f"--top_k={top_k} must be at least 1")
    text = utf8_text(text, "--text")
    if not MASK_MARKERS.search(text):
        raise ConfigError(f"--text={text!r} has no mask marker: put [MASK] (or {MASK}) where a token is to be filled")
    task = load_task(ckpt_path, MaskedLanguageModelTask, "fill-mask", device)
    check_texts(task.tokenizer, MASK_MARKERS.split(text), "the text's", ["--text"], [len(task.mask_ids(text))],
                task.model.config.max_len, "model.net.max_len", counted=" with [CLS] and [SEP]")  # fmt: skip
    ranked = task.fill_mask(text, top_k)
    best = iter([tokens[0][0] for tokens in ranked])

    def bracketed(match: re.Match) -> str:  # the most likely token, in brackets after its leading space
        token = next(best)
        core = token.removeprefix(" ")
        return f"{token[: len(token) - len(core)]}[{core}]"

    print(re.sub(f" ?(?:{MASK_MARKERS.pattern})", bracketed, text))  # the marker's space is the token's own
    for number, tokens in enumerate(ranked, 1):
        print(f"mask {number}: " + ", ".join(f"{token!r} ({probability:.1%})" for token, probability in tokens))


register(MaskedLanguageModelTask, data=MaskedLMDataModule, commands={"fill-mask": fill_mask},
         layouts={"hf": bert.PRETRAINING_HF})  # fmt: skip
