"""Translation: an encoder-decoder transformer trained with teacher forcing, evaluated with SacreBLEU."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.text import SacreBLEUScore

from lightformer.callbacks import raise_if_non_finite
from lightformer.checkpoints import InitConfig, check_same_tokenizer
from lightformer.config_groups import as_config
from lightformer.data.modules.translation import PreparedPairs
from lightformer.data.preparation.tokenizers import Tokenizer
from lightformer.errors import ConfigError
from lightformer.generation import beam_search
from lightformer.models.seq2seq import EncoderDecoder, EncoderDecoderConfig
from lightformer.nn import record_attention
from lightformer.tasks.base import Task
from lightformer.tasks.optim import OptimizerConfig
from lightformer.tensorboard import attention_figure, logging_step, tensorboard_logger, tensorboard_writer

Batch = dict[str, Tensor | list[str]]


class TranslationTask(Task):
    """Label-smoothed cross-entropy on shifted targets; BLEU of greedy or beam-search translations.

    The model's ``src_vocab_size``, ``tgt_vocab_size`` and ``pad_id`` are linked from the data module by the
    CLI; its tokenizers travel inside the checkpoint, so a checkpoint alone can translate. Validation decodes
    with ``val_beam_size`` (1 = greedy, cheap), test with ``beam_size``.

    Args:
        net: the encoder-decoder's shape (``EncoderDecoderConfig``).
        optimizer: AdamW and its learning-rate schedule.
        compile: run the training and evaluation forward pass through ``torch.compile``.
        activation_checkpointing: recompute activations in the backward pass (less memory, more compute).
        init: start from another run's (or Hugging Face / timm) weights, freeze some, slow the loaded ones.
        label_smoothing: of the training targets.
        beam_size: beam width at test time and for ``translate`` (1 = greedy).
        val_beam_size: beam width of the validation BLEU.
        length_penalty: hypotheses are ranked by log p / length^length_penalty (fairseq's convention).
        max_len_a: a translation has at most max_len_a · source length + max_len_b tokens.
        max_len_b: see max_len_a.
        num_logged_samples: validation translations shown in TensorBoard.
    """

    def __init__(
        self,
        net: EncoderDecoderConfig = EncoderDecoderConfig(),
        optimizer: OptimizerConfig = OptimizerConfig(),
        compile: bool = False,
        activation_checkpointing: bool = False,
        init: InitConfig = InitConfig(),
        label_smoothing: float = 0.1,
        beam_size: int = 4,
        val_beam_size: int = 1,
        length_penalty: float = 1.0,
        max_len_a: float = 1.5,
        max_len_b: int = 10,
        num_logged_samples: int = 4,
    ) -> None:
        super().__init__(optimizer, compile, activation_checkpointing, init)
        self.save_hyperparameters()
        self.model = EncoderDecoder(as_config(EncoderDecoderConfig, net))
        self.pad_id = self.model.pad_id
        self.src_tokenizer: Tokenizer | None = None
        self.tgt_tokenizer: Tokenizer | None = None
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self.val_bleu, self.test_bleu = SacreBLEUScore(tokenize="13a"), SacreBLEUScore(tokenize="13a")
        self._samples: list[tuple[str, str, str]] = []

    # --- tokenizers, carried from the data module into the checkpoint --------------------------------------

    def setup(self, stage: str) -> None:
        super().setup(stage)
        datamodule = getattr(self.trainer, "datamodule", None)
        longest = _longest_sequence(datamodule)
        max_len = self.model.max_len
        if longest > max_len and self.model.config.position != "none":
            limit = getattr(getattr(datamodule, "batches", None), "max_sentence_tokens", "?")
            raise ConfigError(  # known only now: the longest sentence the data kept
                f"the data's longest sentence has {longest} positions (data.batches.max_sentence_tokens={limit}) but "
                f"model.net.max_len={max_len}, the length of the model's position table, which must hold it; set "
                f"data.batches.max_sentence_tokens <= {max_len} (longer train pairs are dropped, val/test ids cut) or "
                f"model.net.max_len >= {longest}"
            )
        if getattr(datamodule, "src_tokenizer", None) is not None:
            tokenizers = {"src": datamodule.src_tokenizer, "tgt": datamodule.tgt_tokenizer}
            for side, tokenizer in tokenizers.items():
                size = getattr(self.model.config, f"{side}_vocab_size")
                if tokenizer.vocab_size > size:
                    raise ConfigError(
                        f"the data's {side} tokenizer has {tokenizer.vocab_size} tokens but model.net."
                        f"{side}_vocab_size={size}; the model's vocabulary must hold every token id"
                    )
            if self.src_tokenizer is not None:  # loaded from a checkpoint, or set by an earlier run
                check_same_tokenizer(self.src_tokenizer, tokenizers["src"], "src ")
                check_same_tokenizer(self.tgt_tokenizer, tokenizers["tgt"], "tgt ")
            self.src_tokenizer, self.tgt_tokenizer = tokenizers["src"], tokenizers["tgt"]

    items_name = "target tokens"  # what throughput counts
    variable_shapes = True  # batches padded to their longest sequence
    hparam_metrics = ("val/bleu", "val/loss", "test/bleu", "test/loss")

    def on_fit_start(self) -> None:
        super().on_fit_start()
        log_dir = self.trainer.log_dir  # a broadcast under DDP: every process must ask, or rank 0 waits forever
        if self.src_tokenizer is not None and self.trainer.is_global_zero and log_dir:
            self.src_tokenizer.save(Path(log_dir) / "src_tokenizer.json")
            self.tgt_tokenizer.save(Path(log_dir) / "tgt_tokenizer.json")

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.src_tokenizer is not None:
            checkpoint["src_tokenizer"] = self.src_tokenizer.to_str()
            checkpoint["tgt_tokenizer"] = self.tgt_tokenizer.to_str()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "src_tokenizer" in checkpoint:
            saved = {
                side: Tokenizer.from_str(checkpoint[f"{side}_tokenizer"], source=f"the checkpoint's {side}_tokenizer")
                for side in ("src", "tgt")
            }
            if self.src_tokenizer is not None:  # `fit/validate/test --ckpt_path` run `setup` (data) before this
                check_same_tokenizer(saved["src"], self.src_tokenizer, "src ")
                check_same_tokenizer(saved["tgt"], self.tgt_tokenizer, "tgt ")
            self.src_tokenizer, self.tgt_tokenizer = saved["src"], saved["tgt"]

    # --- training and evaluation ---------------------------------------------------------------------------

    def _loss(self, batch: Batch) -> tuple[Tensor, int]:
        """The teacher-forced loss of ``batch`` (compiled with the model when ``compile``) and its target tokens."""
        loss = self.compiled(self._teacher_forced_loss)(batch["src"], batch["tgt"])
        return loss, int((batch["tgt"][:, 1:] != self.pad_id).sum())

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

    def throughput_counts(self, batch: Batch) -> tuple[int, int]:
        return len(batch["src"]), int((batch["tgt"][:, 1:] != self.pad_id).sum())  # items: target tokens

    def _evaluate(self, batch: Batch, loss_metric: MeanMetric, bleu: SacreBLEUScore, beam_size: int) -> list[str]:
        loss, n_tokens = self._loss(batch)
        loss_metric.update(loss, weight=n_tokens)
        hypotheses = self.translate_ids(batch["src"], beam_size)
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

    def too_long(self, sentences: list[str]) -> list[tuple[int, int]]:
        """(index, token count) of the sentences longer than the model reads (``translate`` cuts them)."""
        limit = self.model.max_len - 1
        lengths = [len(ids) + 1 for ids in self.src_tokenizer.encode_batch([s.strip() for s in sentences])]
        return [(i, length) for i, length in enumerate(lengths) if length > limit]

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


def _longest_sequence(datamodule: object) -> int:
    """Positions the model needs for the data module's encoded splits: the longest source, and the longest
    target less one (teacher forcing feeds ``tgt[:, :-1]``); 0 when it has none (yet)."""
    longest = 0
    for dataset in (getattr(datamodule, "datasets", None) or {}).values():
        if isinstance(dataset, PreparedPairs) and len(dataset):
            longest = max(longest, int(dataset.src_lengths.max()), int(dataset.tgt_lengths.max()) - 1)
    return longest
