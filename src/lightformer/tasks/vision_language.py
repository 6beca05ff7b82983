"""Vision-language (LLaVA, nanoVLM): a GPT that reads an image's projected patches as a prefix of its text, trained on
the answers of question-answer turns; evaluated, per group of the data (source, question, seen or held-out), by the
exact match, token F1, character error rate and BLEU of its answers (greedy in validation, ``beam_size`` in test)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Metric
from torchmetrics.functional.text import char_error_rate
from torchmetrics.text import SacreBLEUScore

from lightformer.data.families.chat import ChatData
from lightformer.data.loading.pictures import image_input
from lightformer.data.objectives.chat import ChatTemplate
from lightformer.errors import ConfigError
from lightformer.facts import DataFacts
from lightformer.generation import beam_search
from lightformer.io.layouts import llava
from lightformer.models.gpt import GPT
from lightformer.models.vlm import VisionLanguageConfig, VisionLanguageModel
from lightformer.registry import register
from lightformer.tasks.base import TextTask
from lightformer.tasks.command_support import (
    check_texts,
    load_task,
    paths_of,
    quote,
    require,
    unreadable_images,
    utf8_text,
)
from lightformer.tasks.data_contract import PositionTable
from lightformer.tasks.image_text import ctc_per_character
from lightformer.training.callbacks import raise_if_non_finite
from lightformer.training.flops import FlopCounter
from lightformer.training.tensorboard import (
    attention_figure,
    logging_step,
    markdown_text,
    reading_figure,
    tensorboard_logger,
    tensorboard_writer,
    unnormalised,
)

Batch = dict[str, Any]
IGNORE = -100  # the labels of the tokens that are not answers
FITS = ("drawing", "line", "resize", "pad")  # how ``ask`` may bring an image to a canvas (``DataFacts.image_fit``)


def normalise_answer(text: str) -> str:
    """An answer as exact match compares it: lower case, runs of white space as one space, no end punctuation."""
    return " ".join(text.lower().split()).rstrip(".!?")


def answer_words(text: str) -> list[str]:
    """The words of an answer, as token F1 counts them (SQuAD's way: lower case, punctuation left out)."""
    return re.findall(r"\w+", text.lower())


def token_f1(answer: str, reference: str) -> float:
    """SQuAD's token F1: the harmonic mean of the precision and recall of the answer's words against the
    reference's, each word counted as often as both hold it; 1 when both have no word."""
    said, meant = answer_words(answer), answer_words(reference)
    if not said or not meant:
        return float(said == meant)
    common = sum((Counter(said) & Counter(meant)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(said), common / len(meant)
    return 2 * precision * recall / (precision + recall)


class GroupMeans(Metric):
    """Weighted means of a value per group (the data's groups), synchronised across processes as sums."""

    full_state_update = False

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.add_state("total", torch.zeros(groups), dist_reduce_fx="sum")
        self.add_state("weight", torch.zeros(groups), dist_reduce_fx="sum")

    def update(self, values: Tensor, groups: Tensor, weights: Tensor | None = None) -> None:
        weights = torch.ones_like(values) if weights is None else weights
        self.total.index_add_(0, groups, (values * weights).to(self.total))
        self.weight.index_add_(0, groups, weights.to(self.weight))

    def compute(self) -> tuple[Tensor, Tensor]:
        """Each group's mean (NaN where it has no value) and, over all groups, the mean of every value."""
        return self.total / self.weight, self.total.sum() / self.weight.sum()


class ImageHalf(nn.Module):
    """A vision-language model's image tower and projector as a module of their own (``batch_flops``)."""

    def __init__(self, config: VisionLanguageConfig) -> None:
        super().__init__()
        self.vlm = VisionLanguageModel(config)

    def forward(self, images: Tensor) -> Tensor:
        return self.vlm.image_tokens(images)


class VisionLanguageTask(TextTask):
    """Cross-entropy of the answers given the image and the question (the image's tokens and the questions bear no
    loss); exact match, token F1, CER and BLEU of the model's first answer of each evaluated record, per group.

    The model's image size, channels and vocabulary come from the data's facts; the tokenizer, the chat template and
    the images' normalisation travel inside the checkpoint, so a checkpoint alone answers questions
    (``lightformer ask``).

    Args:
        net: the model's shape (``VisionLanguageConfig``).
        label_smoothing: of the answers' targets.
        ctc_weight: the weight of a CTC loss of the image tower's patches (the model's ``ctc_head``, in reading order)
            against the text each image shows (the batch's "transcript": a printed line's; records without one bear
            none), added in training to the answers' loss (joint CTC-attention training: the tower learns to tell
            characters apart while the language model has yet to look).
        beam_size: beam width at test time and for ``ask`` (1 = greedy).
        max_answer_tokens: the longest answer generated, in tokens (None: as many as the positions hold).
        num_logged_samples: validation images shown in TensorBoard with their question, answer and reference.
    """

    model_class = VisionLanguageModel
    net_from_data = {
        "image.image_size": "image_size",
        "image.in_channels": "in_channels",
        "text.vocab_size": "vocab_size",
    }
    position_table = PositionTable("text.block_size", "texts")  # and their image's tokens: ``positions_beyond``
    items_name = "images"
    variable_shapes = True  # texts padded to the batch's longest; images of a few shapes
    token_modules = ("text",)  # the image tower and projector read no token id
    hparam_metrics = ("val/loss", "val/exact", "test/exact")

    def __init__(
        self,
        net: VisionLanguageConfig = VisionLanguageConfig(),
        label_smoothing: float = 0.0,
        ctc_weight: float = 0.0,
        beam_size: int = 1,
        max_answer_tokens: int | None = None,
        num_logged_samples: int = 4,
        **common: Any,
    ) -> None:
        super().__init__(net, **common)
        if ctc_weight < 0 or (ctc_weight > 0 and self.model.ctc_head is None):
            raise ConfigError(
                f"model.ctc_weight={ctc_weight} must be at least 0, and above 0 only with model.net.ctc_head=true"
            )
        if self.model.ctc_head is not None and ctc_weight == 0:
            self.model.ctc_head.requires_grad_(False)  # unused: frozen, as DDP wants every trained parameter used
        if beam_size < 1:
            raise ConfigError(f"model.beam_size={beam_size} must be at least 1 (1 is greedy decoding)")
        if max_answer_tokens is not None and max_answer_tokens < 1:
            raise ConfigError(f"model.max_answer_tokens={max_answer_tokens} must be at least 1 (or null: no limit)")
        self.metrics: torch.nn.ModuleDict | None = None
        if self.data_facts is not None and self.data_facts.groups:
            self.make_metrics(self.data_facts.groups)
        self._samples: list[tuple[Tensor, str, str, str]] = []
        self._part_counters: tuple[FlopCounter, FlopCounter] | None = None  # batch_flops'

    def make_metrics(self, groups: Sequence[str]) -> None:
        """The evaluation metrics of ``groups``: per split, the loss and, per group, exact match, token F1 and CER
        (``GroupMeans``) and BLEU."""
        if self.metrics is not None and len(self.metrics["val_exact"].total) == len(groups):
            return
        metrics: dict[str, Metric] = {}
        for split in ("val", "test"):
            metrics[f"{split}_loss"] = GroupMeans(1)
            for name in ("exact", "f1", "cer"):
                metrics[f"{split}_{name}"] = GroupMeans(len(groups))
            for g in range(len(groups)):
                metrics[f"{split}_bleu_{g}"] = SacreBLEUScore(tokenize="13a")
        self.metrics = torch.nn.ModuleDict(metrics).to(self.device)

    @property
    def template(self) -> ChatTemplate:
        """The chat template the model was trained with (the data's, in the checkpoint)."""
        stored = self.data_facts.chat_template if self.data_facts is not None else None
        return ChatTemplate.from_dict(stored) if stored else ChatTemplate()

    @property
    def groups(self) -> tuple[str, ...]:
        return tuple(self.data_facts.groups or ()) if self.data_facts is not None else ()

    def canvases(self, facts: DataFacts | None = None) -> dict[str, tuple[int, int]]:
        """Each kind of image of ``facts`` (default: the model's; ``DataFacts.image_fit`` names) → its canvas (height,
        width)."""
        facts, size = facts or self.data_facts, self.model.config.image.image_size
        default = (size, size) if isinstance(size, int) else tuple(size)
        found = {name: tuple(value) for name, value in (facts.canvases or {}).items()} if facts is not None else {}
        if facts is not None and facts.image_fit and facts.image_fit not in found:
            found[facts.image_fit] = default
        return found or {"resize": default}

    def check_data(self, facts: DataFacts, stage: str) -> None:
        """The contract's checks (the text tower's positions hold the longest text with its image's tokens:
        ``positions_beyond``); then the metrics of the data's groups."""
        super().check_data(facts, stage)
        if facts.groups:
            self.make_metrics(facts.groups)

    def positions_beyond(self, facts: DataFacts) -> list[tuple[int, str]]:
        """A record's text and its image's tokens share the text tower's positions: for each kind of image of
        ``facts``, its tokens less the placeholder they take the place of. A canvas the model's patches and pixel
        shuffle do not tile is refused."""
        beyond = []
        for kind, (height, width) in self.canvases(facts).items():
            try:
                tokens = self.model.num_image_tokens(height, width)
            except ValueError as error:
                raise ConfigError(f"the data's {kind} images ({height} × {width} pixels): {error}") from None
            words = f" ({facts.max_length} tokens and {tokens} image tokens of its {kind} images of {height} × {width}"
            beyond.append((tokens - 1, words + " pixels, the image placeholder counted once)"))
        return beyond

    # --- training and evaluation ---------------------------------------------------------------------------

    def _loss(self, batch: Batch) -> Tensor:
        """The answers' mean cross-entropy (compiled with the model when ``compile``)."""
        return self.compiled(self._answer_loss)(batch["ids"], batch["images"], batch["labels"])

    def _answer_loss(self, ids: Tensor, images: Tensor, labels: Tensor) -> Tensor:
        return self._cross_entropy(self.model(ids, images), labels)

    def _cross_entropy(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE,
                               label_smoothing=self.hparams.label_smoothing)  # fmt: skip

    def _joint_loss(
        self, ids: Tensor, images: Tensor, labels: Tensor, transcript: Tensor, lengths: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The answers' cross-entropy and the CTC loss of the patches against each image's transcript (PAD as CTC's
        blank; per character, averaged over the rows that have a transcript; 0 where none has; a text longer than the
        patches can spell counts zero), from one pass of the tower."""
        logits, reading = self.model(ids, images, ctc=True)
        per_row = ctc_per_character(reading, transcript, lengths, self.data_facts.pad_id)
        has_text = (lengths > 0).float()
        ctc = (per_row * has_text).sum() / has_text.sum().clamp(min=1)
        return self._cross_entropy(logits, labels), ctc

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        weight = self.hparams.ctc_weight
        if weight == 0:
            loss = self._loss(batch)
            self.log_train({"train/loss": loss})
            return loss
        inputs = (batch[key] for key in ("ids", "images", "labels", "transcript", "transcript_length"))
        answers, ctc = self.compiled(self._joint_loss)(*inputs)
        self.log_train({"train/loss": answers, "train/ctc_loss": ctc})
        return answers + weight * ctc

    def model_inputs(self, batch: Batch) -> tuple[Tensor, Tensor]:
        return batch["ids"], batch["images"]

    def batch_flops(self, batch: Batch, backward: bool) -> int:
        """The FLOPs of the image half (tower and projector, counted per image shape) and of the text tower over the
        joined sequence (a polynomial in its length), each on a copy on the meta device (``training.flops``): the
        whole model's forward finds its placeholders by value, which a meta tensor has not."""
        if self._part_counters is None:
            config = self.model.config
            self._part_counters = (FlopCounter(lambda: ImageHalf(config)), FlopCounter(lambda: GPT(config.text)))
        images, ids = batch["images"], batch["ids"]
        joined = ids.shape[1] - 1 + self.model.num_image_tokens(*images.shape[-2:])
        image_half, text_tower = self._part_counters
        per_example = image_half.per_example([images], backward) + text_tower.per_example(
            [torch.empty(1, joined, dtype=torch.long, device="meta")], backward
        )
        return per_example * len(ids)

    def throughput_counts(self, batch: Batch) -> tuple[int, int]:
        return len(batch["images"]), len(batch["images"])

    def _evaluate(self, batch: Batch, split: str, beam_size: int) -> list[str]:
        """Update ``split``'s metrics with ``batch``'s: the loss, and each record's first answer against its reference
        in its group."""
        loss = self._loss(batch)
        m = self.metrics
        zero = torch.zeros(1, dtype=torch.long, device=self.device)
        m[f"{split}_loss"].update(loss.detach()[None], zero, (batch["labels"] != IGNORE).sum()[None].float())
        answers = self.answer(batch["ids"], batch["prompt_length"], batch["images"], beam_size)
        groups = batch["group"].to(self.device)
        references = batch["answer"]
        exact = [float(normalise_answer(a) == normalise_answer(r)) for a, r in zip(answers, references, strict=True)]
        f1 = [token_f1(a, r) for a, r in zip(answers, references, strict=True)]
        lengths = [max(len(r), 1) for r in references]
        errors = [float(char_error_rate([a], [r])) * n if r else float(bool(a))
                  for a, r, n in zip(answers, references, lengths, strict=True)]  # fmt: skip
        as_tensor = lambda values: torch.tensor(values, dtype=torch.float32, device=self.device)  # noqa: E731
        m[f"{split}_exact"].update(as_tensor(exact), groups)
        m[f"{split}_f1"].update(as_tensor(f1), groups)
        m[f"{split}_cer"].update(as_tensor(errors) / as_tensor(lengths), groups, as_tensor(lengths))
        for g in sorted(set(groups.tolist())):
            rows = [i for i, group in enumerate(groups.tolist()) if group == g]
            m[f"{split}_bleu_{g}"].update([answers[i] for i in rows], [[references[i]] for i in rows])
        return answers

    def _log_metrics(self, split: str) -> dict[str, Tensor]:
        """``split``'s loss, its overall exact match, and each group's exact match, F1, CER and BLEU (groups that had
        records in it); the metrics reset."""
        m = self.metrics
        values = {f"{split}/loss": m[f"{split}_loss"].compute()[1]}
        for name in ("exact", "f1", "cer"):
            per_group, overall = m[f"{split}_{name}"].compute()
            per_group = per_group.reshape(-1)  # (torchmetrics squeezes a one-group tensor)
            values[f"{split}/{name}"] = overall
            for g, group in enumerate(self.groups):
                if m[f"{split}_{name}"].weight[g] > 0:
                    values[f"{split}/{group}/{name}"] = per_group[g]
        for g, group in enumerate(self.groups):
            if m[f"{split}_exact"].weight[g] > 0:
                values[f"{split}/{group}/bleu"] = m[f"{split}_bleu_{g}"].compute() * 100
        for name, metric in m.items():
            if name.startswith(split):
                metric.reset()
        self.log_dict(values, prog_bar=False)
        return values

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        answers = self._evaluate(batch, "val", 1)
        if batch_idx == 0:
            n = self.hparams.num_logged_samples
            self._samples = list(zip(batch["images"][:n].cpu(), batch["question"][:n], answers[:n],
                                     batch["answer"][:n], strict=True))  # fmt: skip
            self._log_image_attention(batch, answers[0])

    def on_validation_epoch_end(self) -> None:
        values = self._log_metrics("val")
        raise_if_non_finite(self.trainer, "val/loss", values["val/loss"])
        writer = tensorboard_writer(self)
        if writer is not None and self._samples and not self.trainer.sanity_checking:
            step = logging_step(self.trainer)
            rows = ["| image | question | answer | reference |", "|---|---|---|---|"]
            for i, (image, question, answer, reference) in enumerate(self._samples):
                writer.add_image(f"val/sample_{i}", unnormalised(image, self.data_facts), step)
                cells = (markdown_text(text) for text in (question, answer, reference))
                rows.append(f"| sample_{i} | " + " | ".join(cells) + " |")
            writer.add_text("val/answers", "\n".join(rows), step)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "test", self.hparams.beam_size)

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")

    # --- answering -----------------------------------------------------------------------------------------

    @torch.no_grad()
    def answer(self, ids: Tensor, prompt_length: Tensor, images: Tensor, beam_size: int | None = None) -> list[str]:
        """The answer to each row's first question: generated (beam search, 1 = greedy) from ``ids[i,
        :prompt_length[i]]`` (the image's placeholder, the question, the template's answer prefix) and ``images``
        (one shape), rows of one prompt length together."""
        if self.tokenizer is None:
            raise RuntimeError(
                "this model has no tokenizer: train it with a visual QA data module or load a checkpoint"
            )
        beam_size = self.hparams.beam_size if beam_size is None else beam_size
        was_training = self.model.training
        self.model.eval()
        answers: list[str] = [""] * len(ids)
        lengths = prompt_length.tolist()
        for length in sorted(set(lengths)):
            rows = [i for i, n in enumerate(lengths) if n == length]
            index = torch.tensor(rows, device=ids.device)
            decoder = self.model.incremental_decoder(images[index], beam_size)
            room = decoder.block_size - length
            most = room if self.hparams.max_answer_tokens is None else min(room, self.hparams.max_answer_tokens)
            if most < 1:
                continue  # no position left for an answer: the empty answer
            hypotheses, _ = beam_search(decoder, len(rows), beam_size, self.tokenizer.bos_id, self.tokenizer.eos_id,
                                        most, 1.0, device=ids.device, prompt=ids[index, :length])  # fmt: skip
            for row, text in zip(rows, self.tokenizer.decode_batch(hypotheses), strict=True):
                answers[row] = text
        self.model.train(was_training)
        return answers

    def prompt_ids(self, question: str) -> list[int]:
        """The ids that ask ``question`` of an image: the chat template's prompt, with the image's placeholder."""
        return self.template.prompt(self.tokenizer, question, self.model.image_token_id)

    def canvas(self, fit: str | None = None) -> tuple[str, int, int]:
        """The way an image is fitted (``fit``; default: the data's way) and the height and width of its canvas."""
        canvases = self.canvases()
        fit = fit or self.data_facts.image_fit or next(iter(canvases))
        return fit, *canvases.get(fit, next(iter(canvases.values())))

    def prompt_positions(self, question: str, fit: str | None = None) -> int:
        """The text positions that asking ``question`` of an image fitted as ``fit`` takes, one for the answer counted:
        the chat template's prompt with the image's tokens in place of its placeholder."""
        _, height, width = self.canvas(fit)
        return len(self.prompt_ids(question)) - 1 + self.model.num_image_tokens(height, width) + 1

    def image_tensor(self, path: str, fit: str | None = None) -> Tensor:
        """An image file as the model's input ``(3, H, W)``: fitted as ``fit`` says (default: the data's way) to that
        kind's canvas, as in training, and normalised."""
        facts = self.data_facts
        fit, height, width = self.canvas(fit)
        channels = self.model.config.image.in_channels
        return image_input(path, fit, height, width, channels, facts.normalize_mean, facts.normalize_std)

    def ask_files(
        self,
        pairs: Sequence[tuple[str, str]],
        fit: str | None = None,
        beam_size: int | None = None,
        batch_size: int = 16,
    ) -> list[str | Exception]:
        """The answer to each (image file, question), in order; an image that cannot be read is its error instead,
        and the other questions are answered all the same. Questions of one image shape and prompt length are
        answered together, ``batch_size`` at a time."""
        images: dict[str, Tensor | Exception] = {}
        for path, _ in pairs:
            if path not in images:
                try:
                    images[path] = self.image_tensor(path, fit)
                except (OSError, ValueError) as error:  # missing, not an image: named, the others go on
                    images[path] = error
        results: list[str | Exception] = [images[p] if isinstance(images[p], Exception) else "" for p, _ in pairs]
        asked: dict[tuple, list[int]] = {}
        prompts = {}
        for i, (path, question) in enumerate(pairs):
            if isinstance(images[path], Exception):
                continue
            prompts[i] = self.prompt_ids(question)
            asked.setdefault((tuple(images[path].shape), len(prompts[i])), []).append(i)
        for rows in asked.values():
            for start in range(0, len(rows), batch_size):
                chunk = rows[start : start + batch_size]
                ids = torch.tensor([prompts[i] for i in chunk], device=self.device)
                pixels = torch.stack([images[pairs[i][0]] for i in chunk]).to(self.device)
                lengths = torch.full((len(chunk),), ids.shape[1], device=self.device)
                for i, text in zip(chunk, self.answer(ids, lengths, pixels, beam_size), strict=True):
                    results[i] = text
        return results

    # --- TensorBoard: where the answer looked -----------------------------------------------------------------

    @torch.no_grad()
    def answer_attention(self, ids: Tensor, prompt_length: int, image: Tensor, answer: str) -> tuple[list[str], Tensor]:
        """The tokens of ``answer`` (the model's answer to the prompt ``ids[:prompt_length]`` about ``image``, then
        EOS) and the last block's attention (mean over heads) from each to the image's tokens, ``(tokens, grid
        height, grid width)``: teacher-forcing the model on its own answer gives the weights it had as it wrote it."""
        room = self.model.block_size - (self.model.num_image_tokens(*image.shape[-2:]) - 1) - prompt_length
        answer_ids = (self.tokenizer.encode(answer) + [self.tokenizer.eos_id])[:room]  # an answer the block cut short
        full = torch.cat([ids[:prompt_length], torch.tensor(answer_ids, device=ids.device)])[None]
        weights = self.model.image_attention(full, image[None])[0]  # (T, K)
        rows = weights[prompt_length - 1 : prompt_length - 1 + len(answer_ids)]  # the positions that wrote the answer
        tokens = [self.tokenizer.decode([i], skip_special=False) for i in answer_ids]
        (height, width), s = self.model.grid(*image.shape[-2:]), self.model.config.pixel_shuffle
        return tokens, rows.float().reshape(len(tokens), height // s, width // s)

    def _log_image_attention(self, batch: Batch, answer: str) -> None:
        """Where the model looked as it answered the first validation question: a panel per answer token over the
        image (``val/answer_attention``), and the tokens × image tokens matrix (``val/image_attention``)."""
        if tensorboard_logger(self) is None or self.trainer.sanity_checking:
            return
        length = int(batch["prompt_length"][0])
        tokens, maps = self.answer_attention(batch["ids"][0], length, batch["images"][0], answer)  # every process
        writer = tensorboard_writer(self)
        if writer is None:
            return
        title = f"{batch['question'][0]}  |  answer: {answer}  |  reference: {batch['answer'][0]}"
        step = logging_step(self.trainer)
        writer.add_figure("val/answer_attention", reading_figure(batch["images"][0], maps, tokens, title), step)
        rows, columns = maps.shape[1:]
        places = [f"{r},{c}" for r in range(rows) for c in range(columns)]
        writer.add_figure("val/image_attention", attention_figure(maps.flatten(1), places, tokens, title), step)


# --- the commands that take this task's checkpoints alone ---------------------------------------------------


def read_questions(path: str) -> list[tuple[str, str]]:
    """``--questions``: a file of one "image<TAB>question" a line (an image relative to the file's folder; blank
    lines left out); ``ConfigError`` naming the line that is not."""
    file = Path(path)
    require(file.is_file(), f"--questions: {path} is not a file (give a file of 'image<TAB>question' lines)")
    pairs = []
    for number, line in enumerate(utf8_text(file.read_text(encoding="utf-8", errors="surrogateescape"),
                                            f"--questions {path}").splitlines(), 1):  # fmt: skip
        if not line.strip():
            continue
        image, tab, question = line.partition("\t")
        require(bool(tab and image.strip() and question.strip()),
                f"--questions: {path} line {number} is not 'image<TAB>question': {line[:80]!r}")  # fmt: skip
        image_path = Path(image.strip())
        pairs.append((str(image_path if image_path.is_absolute() else file.parent / image_path), question.strip()))
    require(bool(pairs), f"--questions: {path} holds no 'image<TAB>question' line")
    return pairs


def check_questions(task: VisionLanguageTask, questions: Sequence[str], fit: str | None, file: str | None) -> None:
    """``check_texts``, the rule of every command over texts, for ``ask``'s questions (of ``--questions file`` or
    ``--question``): characters outside the vocabulary named in a warning; a question that leaves no position for
    the answer, with the chat template and the image's tokens, refused naming it and the limit (a question cut
    short would be another question)."""
    asked = list(dict.fromkeys(questions))
    _, height, width = task.canvas(fit)
    k = task.model.num_image_tokens(height, width)
    names = [f"--questions {file}: the question {quote(q)}" if file else f"--question {quote(q)}" for q in asked]
    check_texts(task.tokenizer, asked, "the question's" if len(asked) == 1 else "the questions'", names,
                [task.prompt_positions(q, fit) for q in asked], task.model.block_size, "model.net.text.block_size",
                counted=f" with the chat template's, the image's {k} token{'s' * (k != 1)} in place of its placeholder "
                "and one for the answer")  # fmt: skip


def ask(
    ckpt_path: str | None = None,
    images: list[str] | str | None = None,
    question: list[str] | str | None = None,
    questions: str | None = None,
    fit: str | None = None,
    beam_size: int | None = None,
    batch_size: int = 16,
    device: str = "cpu",
) -> None:
    """Answers to questions about images.

    Print one line per question, in order: the model's answer, with a vision-language checkpoint alone. Each
    ``--question`` is asked of each of ``--images`` (image by image, question by question); or ``--questions`` gives
    one image and its question a line. Each image is fitted to the model's canvas as in training. A file that is not a
    readable image prints an empty line for each of its questions (and its reason on standard error), and the other
    questions are answered all the same; when no image could be read, the command fails (exit status 1). A question
    that leaves the model no position for its answer is refused, and characters outside the model's vocabulary are
    named in a warning (the rule of every command over texts).

    Example: ``ask --ckpt_path best.ckpt --images photo.png --question "What is this?"``.

    Args:
        ckpt_path: a checkpoint written by ``fit`` with the vision-language task.
        images: image files (PNG, JPEG, ...) or glob patterns (a pattern's matches sorted).
        question: the questions asked of each image.
        questions: a file of one "image<TAB>question" a line (images relative to its folder), instead of
            ``--images`` and ``--question``.
        fit: how an image is brought to the canvas: "drawing" (on white, cropped to its ink, centred), "line" (a text
            line at the canvas's height), "resize" (stretched) or "pad" (padded to a square, then resized); default:
            the way of the data the model was trained on.
        beam_size: beam width (1 = greedy); default: the model's ``beam_size``.
        batch_size: questions answered together.
        device: "cpu", "cuda", "cuda:1", ...
    """
    require(ckpt_path is not None, "ask needs --ckpt_path CHECKPOINT")
    require(
        bool(questions) != bool(images or question),
        "ask takes --images FILE ... with --question 'text' ..., or --questions FILE (image<TAB>question lines)",
    )
    require(fit is None or fit in FITS, f"--fit={fit!r} is not a way to fit an image; valid: {', '.join(FITS)}")
    require(beam_size is None or beam_size >= 1, f"--beam_size={beam_size} must be at least 1 (1 is greedy)")
    require(batch_size >= 1, f"--batch_size={batch_size} must be at least 1")
    if questions:
        pairs = read_questions(questions)
    else:
        require(bool(images) and bool(question), "ask needs both --images FILE ... and --question 'text' ...")
        asked = [utf8_text(q, "--question") for q in ([question] if isinstance(question, str) else question)]
        pairs = [(path, q) for path in paths_of(images, "--images", "image file", ".png") for q in asked]
    task = load_task(ckpt_path, VisionLanguageTask, "ask", device)
    task.eval()
    check_questions(task, [q for _, q in pairs], fit, questions)
    answers = task.ask_files(pairs, fit, beam_size, batch_size)
    per_image = {path: answer for (path, _), answer in zip(pairs, answers, strict=True)}  # its error, or an answer
    unreadable_images(list(per_image), list(per_image.values()), "ask")  # named; refused when none could be read
    for answer in answers:
        print("" if isinstance(answer, Exception) else answer, flush=True)


register(
    VisionLanguageTask,
    data=ChatData,
    commands={"ask": ask},
    list_options={"ask": ("--images", "--question")},
    layouts={"hf": llava.HF},
)
