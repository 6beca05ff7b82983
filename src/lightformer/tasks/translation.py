"""Translation: an encoder-decoder transformer trained with teacher forcing, evaluated with SacreBLEU."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.text import SacreBLEUScore

from lightformer.data.families.pairs import TranslationDataModule
from lightformer.errors import ConfigError
from lightformer.facts import DataFacts
from lightformer.generation import beam_search
from lightformer.io.checkpoints import require_file
from lightformer.io.files import read_lines
from lightformer.io.layouts import marian
from lightformer.models.seq2seq import EncoderDecoder, EncoderDecoderConfig
from lightformer.nn import record_attention
from lightformer.registry import register
from lightformer.tasks.base import Task
from lightformer.tasks.command_support import check_texts, load_task, read_stdin, require
from lightformer.tasks.data_contract import PositionTable
from lightformer.tokenization.text import Tokenizer
from lightformer.training.callbacks import raise_if_non_finite
from lightformer.training.tensorboard import attention_figure, logging_step, tensorboard_logger, tensorboard_writer

Batch = dict[str, Tensor | list[str]]


class TranslationTask(Task):
    """Label-smoothed cross-entropy on shifted targets; BLEU of greedy or beam-search translations.

    The model's ``src_vocab_size``, ``tgt_vocab_size`` and ``pad_id`` come from the data's facts; its tokenizers
    travel inside the checkpoint, so a checkpoint alone can translate. Validation decodes with ``val_beam_size``
    (1 = greedy, cheap), test with ``beam_size``.

    Args:
        net: the encoder-decoder's shape (``EncoderDecoderConfig``).
        label_smoothing: of the training targets.
        beam_size: beam width at test time and for ``translate`` (1 = greedy).
        val_beam_size: beam width of the validation BLEU.
        length_penalty: hypotheses are ranked by log p / length^length_penalty (fairseq's convention).
        max_len_a: a translation has at most max_len_a · source length + max_len_b tokens.
        max_len_b: see max_len_a.
        num_logged_samples: validation translations shown in TensorBoard.
    """

    model_class = EncoderDecoder
    net_from_data = {"src_vocab_size": "src_vocab_size", "tgt_vocab_size": "tgt_vocab_size", "pad_id": "pad_id"}
    position_table = PositionTable(
        "max_len",
        "sentences",
        counted="at most data.batches.max_sentence_tokens",
        shorter=lambda positions: (
            f"data.batches.max_sentence_tokens <= {positions} (longer train pairs are dropped, val/test ids cut)"
        ),
        absent_when={"position": "none"},
    )

    def __init__(
        self,
        net: EncoderDecoderConfig = EncoderDecoderConfig(),
        label_smoothing: float = 0.1,
        beam_size: int = 4,
        val_beam_size: int = 1,
        length_penalty: float = 1.0,
        max_len_a: float = 1.5,
        max_len_b: int = 10,
        num_logged_samples: int = 4,
        **common: Any,
    ) -> None:
        super().__init__(net, **common)
        self.pad_id = self.model.pad_id
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self.val_bleu, self.test_bleu = SacreBLEUScore(tokenize="13a"), SacreBLEUScore(tokenize="13a")
        self._samples: list[tuple[str, str, str]] = []

    # --- tokenizers: the data's facts, kept in the checkpoint --------------------------------------------------

    @property
    def src_tokenizer(self) -> Tokenizer | None:
        return self.fact_tokenizer("src_tokenizer")

    @property
    def tgt_tokenizer(self) -> Tokenizer | None:
        return self.fact_tokenizer("tgt_tokenizer")

    def positions_beyond(self, facts: DataFacts) -> list[tuple[int, str]]:
        """None: the data's ``max_length`` counts a batch's padding to ``length_multiple`` already; said so."""
        if facts.length_multiple is None:
            return [(0, "")]
        return [(0, f" once padded to a multiple of data.batches.length_multiple={facts.length_multiple}")]

    items_name = "target tokens"  # what throughput counts
    variable_shapes = True  # batches padded to their longest sequence
    hparam_metrics = ("val/bleu", "val/loss", "test/bleu", "test/loss")

    def on_fit_start(self) -> None:
        super().on_fit_start()
        log_dir = self.trainer.log_dir  # a broadcast under DDP: every process must ask, or rank 0 waits forever
        if self.src_tokenizer is not None and self.trainer.is_global_zero and log_dir:
            self.src_tokenizer.save(Path(log_dir) / "src_tokenizer.json")
            self.tgt_tokenizer.save(Path(log_dir) / "tgt_tokenizer.json")

    # --- training and evaluation ---------------------------------------------------------------------------

    def _loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """The teacher-forced loss of ``batch`` (compiled with the model when ``compile``) and its target tokens (a
        count on the device: reading it would wait for the device)."""
        loss = self.compiled(self._teacher_forced_loss)(batch["src"], batch["tgt"])
        return loss, (batch["tgt"][:, 1:] != self.pad_id).sum()

    def _teacher_forced_loss(self, src: Tensor, tgt: Tensor) -> Tensor:
        return self._target_loss(self.model(src, tgt[:, :-1]), tgt)

    def _target_loss(self, logits: Tensor, tgt: Tensor) -> Tensor:
        """Cross-entropy of the teacher-forced ``logits`` against ``tgt[:, 1:]``, label-smoothed, per target token."""
        return F.cross_entropy(
            logits.flatten(0, 1).float(),
            tgt[:, 1:].flatten(),
            ignore_index=self.pad_id,
            label_smoothing=self.hparams.label_smoothing,
        )

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        loss, _ = self._loss(batch)
        self.log_train({"train/loss": loss})
        return loss

    def model_inputs(self, batch: Batch) -> tuple[Tensor, Tensor]:
        return batch["src"], batch["tgt"][:, :-1]

    def throughput_counts(self, batch: Batch) -> tuple[int, Tensor]:
        # samples: the pairs (a batch padded to a length bucket has rows of none); items: target tokens, on the device
        return len(batch["tgt_text"]), (batch["tgt"][:, 1:] != self.pad_id).sum()

    def _evaluate(self, batch: Batch, loss_metric: MeanMetric, bleu: SacreBLEUScore, beam_size: int) -> list[str]:
        loss, n_tokens = self._loss(batch)
        loss_metric.update(loss, weight=n_tokens)
        hypotheses = self.translate_ids(batch["src"][: len(batch["tgt_text"])], beam_size)  # (not the padding rows)
        bleu.update(hypotheses, [[ref] for ref in batch["tgt_text"]])
        return hypotheses

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        hypotheses = self._evaluate(batch, self.val_loss, self.val_bleu, self.hparams.val_beam_size)
        if batch_idx == 0:
            n = self.hparams.num_logged_samples
            self._samples = list(zip(batch["src_text"][:n], batch["tgt_text"][:n], hypotheses[:n], strict=True))
            self._log_cross_attention(batch)

    def on_validation_epoch_end(self) -> None:
        loss = self.val_loss.compute()
        raise_if_non_finite(self.trainer, "val/loss", loss)
        self.log_dict({"val/loss": loss, "val/bleu": self.val_bleu.compute() * 100}, prog_bar=True)
        self.val_loss.reset()
        self.val_bleu.reset()
        writer = tensorboard_writer(self)
        if writer is not None and self._samples and not self.trainer.sanity_checking:
            rows = ["| source | reference | translation |", "|---|---|---|"]
            rows += [f"| {s} | {r} | {h} |" for s, r, h in self._samples]
            writer.add_text("val/translations", "\n".join(rows), logging_step(self.trainer))

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, self.test_loss, self.test_bleu, self.hparams.beam_size)

    def on_test_epoch_end(self) -> None:
        self.log_dict({"test/loss": self.test_loss.compute(), "test/bleu": self.test_bleu.compute() * 100})
        self.test_loss.reset()
        self.test_bleu.reset()

    # --- decoding ------------------------------------------------------------------------------------------

    @torch.no_grad()
    def decode_ids(self, src: Tensor, beam_size: int | None = None) -> list[list[int]]:
        """Beam-search (``beam_size`` 1: greedy) decodes of a padded batch of source ids ``(batch, src_len)``: the
        target ids after [BOS], up to and without [EOS]."""
        hp = self.hparams
        beam_size = hp.beam_size if beam_size is None else beam_size
        if beam_size < 1:
            raise ValueError(f"beam_size={beam_size} must be at least 1 (1 is greedy decoding)")
        src_len = int((src != self.pad_id).sum(1).max())
        max_new_tokens = min(int(hp.max_len_a * src_len + hp.max_len_b), self.model.max_len - 1)
        was_training = self.model.training
        self.model.eval()
        decoder = self.model.incremental_decoder(src, beam_size)
        bos, eos = self.tgt_tokenizer.bos_id, self.tgt_tokenizer.eos_id
        length_penalty = hp.length_penalty if beam_size > 1 else 1.0  # one hypothesis: nothing to rank
        hypotheses, _ = beam_search(
            decoder, src.shape[0], beam_size, bos, eos, max_new_tokens, length_penalty, device=src.device
        )
        self.model.train(was_training)
        return hypotheses

    def translate_ids(self, src: Tensor, beam_size: int | None = None) -> list[str]:
        """Translate a padded batch of source ids ``(batch, src_len)``; returns detokenized strings."""
        if self.tgt_tokenizer is None:
            raise RuntimeError(
                "this model has no tokenizer: train it with a translation data module or load a checkpoint"
            )
        return self.tgt_tokenizer.decode_batch(self.decode_ids(src, beam_size))

    def source_positions(self, sentences: list[str]) -> list[int]:
        """The positions each sentence takes in the encoder, its end of sentence counted (``translate`` keeps the
        first ``model.net.max_len``)."""
        return [len(ids) + 1 for ids in self.src_tokenizer.encode_batch([s.strip() for s in sentences])]

    def translate(self, sentences: list[str], beam_size: int | None = None) -> list[str]:
        """Translate raw source sentences (tokenized with the model's own source tokenizer)."""
        if self.src_tokenizer is None:
            raise RuntimeError(
                "this model has no tokenizer: train it with a translation data module or load a checkpoint"
            )
        eos, limit = self.src_tokenizer.eos_id, self.model.max_len - 1
        ids = [self.src_tokenizer.encode(s.strip())[:limit] + [eos] for s in sentences]  # as in training: ... EOS
        src = torch.full((len(ids), max(map(len, ids))), self.pad_id, dtype=torch.long, device=self.device)
        for i, row in enumerate(ids):
            src[i, : len(row)] = torch.tensor(row)
        return self.translate_ids(src, beam_size)

    def _log_cross_attention(self, batch: Batch) -> None:
        """The last decoder layer's cross-attention (mean over heads) for the first validation pair, as a heatmap
        with the source and target tokens on its axes."""
        if tensorboard_logger(self) is None or self.trainer.sanity_checking:
            return
        src, tgt = batch["src"][:1], batch["tgt"][:1]
        src, tgt = src[:, : int((src != self.pad_id).sum())], tgt[:, : int((tgt != self.pad_id).sum())]
        with record_attention(self.model) as weights:  # every process: under FSDP2 a forward pass needs them all
            self.model(src, tgt[:, :-1])
        writer = tensorboard_writer(self)
        if writer is None:
            return
        last = f"decoder.layers.{len(self.model.decoder.layers) - 1}.cross_attn"
        source = [self.src_tokenizer.decode([i], skip_special=False).strip() for i in src[0].tolist()]
        target = [self.tgt_tokenizer.decode([i], skip_special=False).strip() for i in tgt[0, :-1].tolist()]
        title = f"{batch['src_text'][0]}  →  {batch['tgt_text'][0]}"
        figure = attention_figure(weights[last][0].mean(0), source, target, title)
        writer.add_figure("val/cross_attention", figure, logging_step(self.trainer))


# --- the commands that take this task's checkpoints alone ---------------------------------------------------


def translate(
    *,
    ckpt_path: str,
    input: str = "-",
    beam_size: int | None = None,
    batch_size: int = 32,
    device: str = "cpu",
) -> None:
    """Translate the lines of a file or of standard input.

    Translate the lines of INPUT (a file, or - for standard input) with a translation checkpoint alone.

    Args:
        ckpt_path: a checkpoint written by ``fit`` with the translation task (its tokenizers travel inside).
        input: a UTF-8 text file with one source sentence per line, or "-" for standard input.
        beam_size: beam width (1 = greedy); default: the model's ``beam_size``.
        batch_size: sentences translated together.
        device: "cpu", "cuda", "cuda:1", ...
    """
    require(beam_size is None or beam_size >= 1, f"--beam_size={beam_size} must be at least 1 (1 is greedy)")
    require(batch_size >= 1, f"--batch_size={batch_size} must be at least 1")
    if input != "-":
        require_file(input, "--input: the file")
    task = load_task(ckpt_path, TranslationTask, "translate", device)
    try:
        lines = read_lines(input, "--input") if input != "-" else read_stdin().splitlines()
    except ValueError as error:  # not UTF-8: the message names the file, the byte and its line
        raise ConfigError(str(error)) from None
    names = [f"line {number} of --input" for number in range(1, len(lines) + 1)]
    check_texts(task.src_tokenizer, lines, "the input's", names, task.source_positions(lines), task.model.max_len,
                "model.net.max_len", cut="end", counted=" with its end of sentence")  # fmt: skip
    blank = [number for number, line in enumerate(lines) if not line.strip()]
    if blank:
        shown = ", ".join(str(number + 1) for number in blank[:10]) + (
            f", ... ({len(blank)} in all)" * (len(blank) > 10)
        )
        print(
            f"note: line{'s' * (len(blank) > 1)} {shown} of --input {'are' if len(blank) > 1 else 'is'} blank: not "
            "translated, printed as an empty line (the output stays aligned with the input line for line)",
            file=sys.stderr,
        )
    text = [(number, line) for number, line in enumerate(lines) if line.strip()]  # a model given nothing repeats words
    printed = 0  # input lines answered so far
    for start in range(0, len(text), batch_size):
        batch = text[start : start + batch_size]
        for (number, _), translation in zip(batch, task.translate([line for _, line in batch], beam_size), strict=True):
            print("\n" * (number - printed) + translation)  # the blank lines before this one, then its translation
            printed = number + 1
    print("\n" * (len(lines) - printed), end="")


register(TranslationTask, data=TranslationDataModule, commands={"translate": translate},
         layouts={"hf": marian.HF}, carried=("src_tokenizer",))  # fmt: skip
