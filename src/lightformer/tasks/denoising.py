"""Span-corruption pretraining (T5): the translation task's encoder-decoder learns to write the dropped spans.

The corruption is data (``lightformer.data.families.text.SpanCorruptionDataModule``, batches in the translation
format); the model, its teacher-forced loss, its checkpointed tokenizers and its decoding are ``TranslationTask``'s.
Only the evaluation differs: instead of BLEU, the share of dropped spans the model writes back exactly.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric

from lightformer.data.families.text import SpanCorruptionDataModule
from lightformer.models.seq2seq import EncoderDecoderConfig
from lightformer.nn.checks import check_at_least
from lightformer.registry import register
from lightformer.tasks.data_contract import PositionTable
from lightformer.tasks.translation import Batch, TranslationTask
from lightformer.tokenization.text import Tokenizer, sentinel
from lightformer.training.callbacks import raise_if_non_finite
from lightformer.training.tensorboard import logging_step, markdown_text, tensorboard_writer


class DenoisingTask(TranslationTask):
    """T5's span corruption on the encoder-decoder: cross-entropy of the targets (each sentinel and its span)
    given the corrupted input; evaluated by the loss and the exact-span accuracy of greedy decodes.

    ``val/span_acc`` (and ``test/span_acc``): of all the spans dropped from the evaluated segments, the share whose
    sentinel the greedy decode writes followed by exactly the span's tokens (decodes and targets are split at the
    sentinels as ``lightformer.data.objectives.masking.reconstruct_from_spans`` does). TensorBoard shows, at each
    validation, a few examples: the input, the target and the model's prediction, sentinels included.

    Args:
        net: the encoder-decoder's shape (``EncoderDecoderConfig``).
        label_smoothing: of the training targets (T5 uses none).
        encoder_loss_weight: weight of an auxiliary training loss that T5 does not have: the encoder's output at
            each sentinel predicts every token of that sentinel's span (a bag of words: the order is the decoder's
            to write) through the (tied) output layer, as a masked language model's does at ``[MASK]``. It gives
            the encoder a direct reason to say what was dropped at each sentinel, which otherwise reaches it only
            once the decoder has learnt to look there (``benchmarks/t5_sentinel_probe.py``). 0: T5's objective
            alone. Its floor is not 0: a span of n different tokens costs ln n per token. Validation and test
            losses are the decoder's only.
        max_len_a: a decode has at most max_len_a · source length + max_len_b tokens (a target is about a quarter
            of its source's length at noise_density 0.15; decoding stops earlier at [EOS]).
        max_len_b: see max_len_a.
        num_logged_samples: validation examples shown in TensorBoard.
    """

    hparam_metrics = ("val/span_acc", "val/loss", "test/span_acc", "test/loss")
    position_table = PositionTable(
        "max_len",
        "sources or targets",
        shorter=lambda positions: "lower data.segment_tokens",
        absent_when={"position": "none"},
    )

    def __init__(
        self,
        net: EncoderDecoderConfig = EncoderDecoderConfig(),
        label_smoothing: float = 0.0,
        encoder_loss_weight: float = 0.0,
        max_len_a: float = 0.5,
        max_len_b: int = 10,
        num_logged_samples: int = 4,
        **common: Any,
    ) -> None:
        # Greedy decoding everywhere: the span accuracy is defined on greedy decodes.
        super().__init__(
            net,
            label_smoothing=label_smoothing,
            beam_size=1,
            val_beam_size=1,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            num_logged_samples=num_logged_samples,
            **common,
        )
        check_at_least("encoder_loss_weight", encoder_loss_weight, 0.0)
        del self.val_bleu, self.test_bleu  # translation's metric: no BLEU for denoising
        self.val_span_acc, self.test_span_acc = MeanMetric(), MeanMetric()
        self._sentinel_ids: dict[int, int] | None = None  # sentinel id → its number, from the tokenizer
        self._sentinel_id_tensor: Tensor | None = None  # their ids, on the model's device

    # --- training: the decoder's loss, and optionally the encoder's at the sentinels ---------------------------

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        weight = self.hparams.encoder_loss_weight
        if not weight:
            return super().training_step(batch, batch_idx)
        src, tgt = batch["src"], batch["tgt"]
        at_sentinels, span_of, span_tokens = sentinel_spans(
            src, tgt, self._sentinel_tensor(), self.tgt_tokenizer.eos_id
        )
        logits, encoder_logits = self(src, tgt[:, :-1], at_sentinels)
        loss = self._target_loss(logits, tgt)
        encoder_loss = F.cross_entropy(encoder_logits.float()[span_of], span_tokens)
        self.log_train({"train/loss": loss, "train/encoder_loss": encoder_loss})
        return loss + weight * encoder_loss

    # --- evaluation: loss and exact-span accuracy (the translation task's BLEU is not computed) ---------------

    def _evaluate_spans(self, batch: Batch, loss_metric: MeanMetric, span_metric: MeanMetric) -> list[list[int]]:
        loss, n_tokens = self._loss(batch)
        loss_metric.update(loss, weight=n_tokens)
        decodes = self.decode_ids(batch["src"], beam_size=1)
        eos = self.tgt_tokenizer.eos_id
        correct = []
        for target, decode in zip(batch["tgt"].tolist(), decodes, strict=True):
            target = target[1 : target.index(eos)] if eos in target else target[1:]
            expected, written = self._spans(target), self._spans(decode)
            correct += [written.get(key) == span for key, span in expected.items()]
        if correct:
            span_metric.update(torch.tensor(correct, dtype=torch.float, device=self.device))
        return decodes

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        decodes = self._evaluate_spans(batch, self.val_loss, self.val_span_acc)
        if batch_idx == 0:
            n = self.hparams.num_logged_samples
            predictions = self.tgt_tokenizer.decode_batch(decodes[:n], skip_special=False)
            self._samples = list(zip(batch["src_text"][:n], batch["tgt_text"][:n], predictions, strict=True))

    def on_validation_epoch_end(self) -> None:
        loss = self.val_loss.compute()
        raise_if_non_finite(self.trainer, "val/loss", loss)
        self.log_dict({"val/loss": loss, "val/span_acc": self.val_span_acc.compute()}, prog_bar=True)
        self.val_loss.reset()
        self.val_span_acc.reset()
        writer = tensorboard_writer(self)
        if writer is not None and self._samples and not self.trainer.sanity_checking:
            blocks = [
                f"**input:** {markdown_text(s)}<br>**target:** {markdown_text(t)}<br>**prediction:** {markdown_text(p)}"
                for s, t, p in self._samples
            ]
            writer.add_text("val/denoising", "\n\n---\n\n".join(blocks), logging_step(self.trainer))

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate_spans(batch, self.test_loss, self.test_span_acc)

    def on_test_epoch_end(self) -> None:
        self.log_dict({"test/loss": self.test_loss.compute(), "test/span_acc": self.test_span_acc.compute()})
        self.test_loss.reset()
        self.test_span_acc.reset()

    # --- decoding ------------------------------------------------------------------------------------------

    def _sentinel_numbers(self) -> dict[int, int]:
        if self._sentinel_ids is None:
            self._sentinel_ids = sentinel_numbers(self.tgt_tokenizer)
        return self._sentinel_ids

    def _sentinel_tensor(self) -> Tensor:
        """The sentinel ids on the model's device, made once (not a copy to the device every training step)."""
        if self._sentinel_id_tensor is None or self._sentinel_id_tensor.device != self.device:
            self._sentinel_id_tensor = torch.tensor(list(self._sentinel_numbers()), device=self.device)
        return self._sentinel_id_tensor

    def _spans(self, ids: list[int]) -> dict[int, tuple[int, ...]]:
        """Sentinel number → the tokens after it up to the next sentinel or the end; the first occurrence of a
        sentinel counts and tokens before the first sentinel are ignored (``reconstruct_from_spans``'s parsing)."""
        numbers = self._sentinel_numbers()
        spans: dict[int, tuple[int, ...]] = {}
        starts = [i for i, token in enumerate(ids) if token in numbers] + [len(ids)]
        for start, end in zip(starts[:-1], starts[1:], strict=True):
            spans.setdefault(numbers[ids[start]], tuple(ids[start + 1 : end]))
        return spans


def sentinel_spans(src: Tensor, tgt: Tensor, sentinel_ids: Tensor, eos_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """The sentinels of a batch of corrupted inputs ``src`` ``(B, S)`` and the tokens each one hides, read from
    the targets ``tgt`` ``(B, T)`` ([BOS], each sentinel followed by its span, [EOS], padding): the i-th sentinel
    of a row of ``src`` is the i-th of the same row of ``tgt``, as ``span_corruption`` makes them.

    Returns where the sentinels are (a bool mask like ``src``, the ``encoder_positions`` of ``EncoderDecoder``),
    and for every dropped token, in order, its sentinel's number among the mask's ``n`` sentinels (row-major) and
    the token itself: two ``(m,)`` tensors."""
    at_sentinels = torch.isin(src, sentinel_ids)
    target = tgt[:, 1:]
    is_sentinel = torch.isin(target, sentinel_ids)
    per_row = at_sentinels.sum(1)
    if not torch.equal(per_row, is_sentinel.sum(1)):
        raise ValueError("src and tgt have different numbers of sentinels in some row: not span-corruption pairs")
    span_in_row = is_sentinel.cumsum(1) - 1  # -1 before a row's first sentinel
    in_span = ~is_sentinel & (span_in_row >= 0) & ((target == eos_id).cumsum(1) == 0)
    sentinel_number = (per_row.cumsum(0) - per_row)[:, None] + span_in_row
    return at_sentinels, sentinel_number[in_span], target[in_span]


def sentinel_numbers(tokenizer: Tokenizer) -> dict[int, int]:
    """{id of <extra_id_i>: i} for every sentinel of the tokenizer (they are numbered from 0 without gaps)."""
    numbers: dict[int, int] = {}
    while (found := tokenizer.hf_tokenizer.token_to_id(sentinel(len(numbers)))) is not None:
        numbers[found] = len(numbers)
    return numbers


register(DenoisingTask, data=SpanCorruptionDataModule)
