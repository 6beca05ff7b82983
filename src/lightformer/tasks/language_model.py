"""Language modelling: a GPT trained on next-token prediction, with perplexity and text samples."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric

from lightformer.data.families.text import TextData
from lightformer.generation import generate as generate_tokens
from lightformer.io.layouts import gpt
from lightformer.models.gpt import GPT, GPTConfig
from lightformer.registry import register
from lightformer.tasks.base import TextTask
from lightformer.tasks.command_support import check_sampling_options, check_texts, load_task, require, utf8_text
from lightformer.training.callbacks import raise_if_non_finite
from lightformer.training.tensorboard import logging_step, tensorboard_writer


class LanguageModelTask(TextTask):
    """Next-token cross-entropy on a GPT; logs loss, perplexity and generated samples.

    The model's ``vocab_size`` and ``block_size`` come from the data (its tokenizer and window). The tokenizer
    travels inside the checkpoint, so a checkpoint alone is enough to generate.

    Args:
        net: the GPT's shape (``GPTConfig``).
        sample_prompt: the text the validation samples logged to TensorBoard continue.
        sample_tokens: length of each logged sample, in tokens.
        sample_temperature: sampling temperature of the logged samples.
        sample_top_k: sample among the k most likely tokens only (None: all).
    """

    model_class = GPT
    net_from_data = {"vocab_size": "vocab_size", "block_size": "max_length"}

    def __init__(
        self,
        net: GPTConfig = GPTConfig(),
        sample_prompt: str = "\n",
        sample_tokens: int = 200,
        sample_temperature: float = 0.8,
        sample_top_k: int | None = None,
        **common: Any,
    ) -> None:
        super().__init__(net, **common)
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()

    items_name = "tokens"  # what throughput counts
    hparam_metrics = ("val/loss", "val/ppl", "test/loss", "test/ppl")

    # --- training and evaluation --------------------------------------------------------------------------

    def _loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log_train({"train/loss": loss, "train/ppl": torch.exp(loss.detach())})
        return loss

    def model_inputs(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor]:
        return (batch[0],)

    def throughput_counts(self, batch: tuple[Tensor, Tensor]) -> tuple[int, int]:
        return len(batch[0]), batch[0].numel()  # items: tokens

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.val_loss.update(self._loss(batch), weight=batch[1].numel())

    def on_validation_epoch_end(self) -> None:
        loss = self.val_loss.compute()
        self.val_loss.reset()
        raise_if_non_finite(self.trainer, "val/loss", loss)  # before sampling from a broken model
        self.log_dict({"val/loss": loss, "val/ppl": torch.exp(loss)}, prog_bar=True, sync_dist=False)
        self._log_samples()

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.test_loss.update(self._loss(batch), weight=batch[1].numel())

    def on_test_epoch_end(self) -> None:
        loss = self.test_loss.compute()
        self.test_loss.reset()
        self.log_dict({"test/loss": loss, "test/ppl": torch.exp(loss)})

    # --- generation ---------------------------------------------------------------------------------------

    @torch.no_grad()
    def generate_text(
        self,
        prompt: str,
        max_new_tokens: int = 200,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        num_samples: int = 1,
        seed: int | None = None,
    ) -> list[str]:
        """Continue ``prompt`` ``num_samples`` times; returns the continuations (without the prompt)."""
        if self.tokenizer is None:
            raise RuntimeError("this model has no tokenizer: train it with a text data module or load a checkpoint")
        ids = self.tokenizer.encode(prompt) or [self.tokenizer.bos_id]
        prompt_ids = torch.tensor([ids] * num_samples, device=self.device)
        generator = torch.Generator(self.device).manual_seed(seed) if seed is not None else None
        was_training = self.model.training
        self.model.eval()
        out = generate_tokens(
            self.model,
            prompt_ids,
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            stop_tokens=[self.tokenizer.eos_id],
            generator=generator,
        )
        self.model.train(was_training)
        return self.tokenizer.decode_batch(out[:, len(ids) :].tolist())

    def _log_samples(self) -> None:
        writer = tensorboard_writer(self)
        if writer is None or self.tokenizer is None or self.trainer.sanity_checking:  # writer: rank zero only
            return
        hp = self.hparams
        sample = self.generate_text(hp.sample_prompt, hp.sample_tokens, hp.sample_temperature, hp.sample_top_k, seed=0)
        # TensorBoard renders text as Markdown: keep line breaks by indenting as a code block.
        text = "    " + (hp.sample_prompt + sample[0]).replace("\n", "\n    ")
        writer.add_text("val/sample", text, logging_step(self.trainer))


# --- the commands that take this task's checkpoints alone ---------------------------------------------------


def generate(
    *,
    ckpt_path: str,
    prompt: str = "\n",
    max_new_tokens: int = 500,
    temperature: float = 0.8,
    top_k: int | None = 200,
    top_p: float | None = None,
    num_samples: int = 1,
    seed: int | None = None,
    device: str = "cpu",
) -> None:
    """Continue a prompt with a language model.

    Print continuations of PROMPT from a language-model checkpoint (its tokenizer travels inside it).

    Args:
        ckpt_path: a checkpoint written by ``fit`` with the language-model task.
        prompt: the text to continue.
        max_new_tokens: how many tokens to generate at most (generation also stops at end-of-text).
        temperature: divides the logits; 0 is greedy decoding.
        top_k: sample among the k most likely tokens only.
        top_p: sample among the most likely tokens whose probabilities add up to p (nucleus sampling).
        num_samples: how many continuations to print.
        seed: seed of the sampler, for reproducible samples.
        device: "cpu", "cuda", "cuda:1", ...
    """
    check_sampling_options(temperature, top_k, top_p)
    require(max_new_tokens >= 1, f"--max_new_tokens={max_new_tokens} must be at least 1")
    require(num_samples >= 1, f"--num_samples={num_samples} must be at least 1")
    prompt = utf8_text(prompt, "--prompt")
    task = load_task(ckpt_path, LanguageModelTask, "generate", device)
    check_texts(task.tokenizer, [prompt], "the prompt's", ["--prompt"], [len(task.tokenizer.encode(prompt))],
                task.model.config.block_size, "model.net.block_size", cut="start")  # fmt: skip
    texts = task.generate_text(prompt, max_new_tokens, temperature, top_k, top_p, num_samples, seed)
    for i, text in enumerate(texts):
        if i:
            print("\n" + "-" * 40)
        print(prompt + text)


register(LanguageModelTask, data=TextData, commands={"generate": generate}, layouts={"hf": gpt.HF},
         carried=("tokenizer",))  # fmt: skip
