"""Image to text (TrOCR, captioning): a ViT encoder and a GPT decoder with cross-attention, trained with teacher
forcing; evaluated by the character and word error rates and the exact lines of greedy or beam-search readings."""

from __future__ import annotations

import csv
import difflib
import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from PIL import Image
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.text import CharErrorRate, SacreBLEUScore, WordErrorRate

from lightformer.data.families.image_text import ImageTextData
from lightformer.data.sources.image_files import fit_image, fit_line, load_image, to_normalised_tensor
from lightformer.errors import ConfigError, DataError
from lightformer.generation import beam_search
from lightformer.io.files import atomic_open
from lightformer.models.vision_text import VisionEncoderDecoder, VisionEncoderDecoderConfig
from lightformer.nn import record_attention
from lightformer.registry import register
from lightformer.tasks.base import Task
from lightformer.tasks.command_support import load_task, paths_of, require, unreadable_images
from lightformer.tasks.data_contract import PositionTable
from lightformer.tokenization.text import Tokenizer
from lightformer.training.callbacks import raise_if_non_finite
from lightformer.training.tensorboard import (
    attention_figure,
    logging_step,
    reading_figure,
    tensorboard_logger,
    tensorboard_writer,
    unnormalised,
)

Batch = dict[str, Tensor | list[str]]

WINDOW_OVERLAP = 0.25  # the share of the canvas's width that consecutive windows of a long line have in common
NARROWEST_LINE = 0.5  # width / height below which an image is no text line (training's lines are wider)
MOST_STRETCH = 2.0  # how far "resize" may change an image's aspect before ``read`` warns


def ink_columns(image: Image.Image) -> np.ndarray:
    """Which columns of a line image hold ink: a pixel that differs from the background (the median of the border)
    by more than a quarter of the image's largest difference from it."""
    pixels = np.asarray(image.convert("L"), dtype=np.float32)
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    difference = np.abs(pixels - np.median(border))
    return (difference > 0.25 * max(float(difference.max()), 1.0)).any(axis=0)


def window_spans(ink: np.ndarray, width: int, overlap: int) -> list[tuple[int, int]]:
    """The columns ``[start, end)`` of the windows, at most ``width`` wide, that read a line whose columns ``ink``
    marks: consecutive windows share about ``overlap`` columns, and each cut falls in the widest stretch without ink
    near it (between words where there is such a space, else between letters), so that no window starts or ends
    inside a letter and, where it can, none inside a word: the model was trained on lines of whole words."""
    total, spans, start = len(ink), [], 0
    while total - start > width:
        cut = widest_gap(ink, start + width - overlap // 2, start + width, start + width)
        end = start + width if cut is None else cut
        target = end - overlap
        spans.append((start, end))
        cut = widest_gap(ink, max(start + 1, target - overlap // 2), max(start + 2, end - overlap // 2), target)
        start = max(start + 1, target) if cut is None else cut
    return [*spans, (start, total)]


def widest_gap(ink: np.ndarray, lo: int, hi: int, target: int) -> int | None:
    """The middle column of the widest run of columns without ink that lies in ``[lo, hi)`` (the one nearest
    ``target`` of equal width), or None where every column there holds ink."""
    runs, run_start = [], None
    for column in range(lo, hi):
        if not ink[column] and run_start is None:
            run_start = column
        elif ink[column] and run_start is not None:
            runs.append((run_start, column))
            run_start = None
    if run_start is not None:
        runs.append((run_start, hi))
    if not runs:
        return None
    a, b = max(runs, key=lambda run: (run[1] - run[0], -abs((run[0] + run[1]) // 2 - target)))
    return (a + b) // 2


def join_readings(left: str, right: str, shared: int) -> str:
    """``left`` and ``right``, the readings of two windows of a line whose ``shared`` characters (about) both
    windows hold, as one reading, what both read written once: the end of ``left`` is laid over the start of
    ``right`` as far as agrees best (each character that agrees counts one, each that does not one against), and the
    two are joined in the middle of that stretch, away from either window's edge. Where they agree on nothing, the
    first ``shared`` characters of ``right`` go."""
    best, overlap = 0, 0
    for k in range(1, min(len(left), len(right), 2 * shared + 2) + 1):
        blocks = difflib.SequenceMatcher(None, left[-k:], right[:k], autojunk=False).get_matching_blocks()
        score = 2 * sum(block.size for block in blocks) - k
        if score > best:
            best, overlap = score, k
    if best < min(3, max(1, shared // 2)):
        return left + right[shared:]
    half = overlap // 2
    return left[: len(left) - overlap + half] + right[half:]


def line_canvases(
    image: Image.Image, height: int, width: int, fit: str | None, overlap: float = WINDOW_OVERLAP
) -> tuple[list[Image.Image], list[tuple[int, int]], str | None]:
    """``image`` on the model's ``height`` × ``width`` canvas as ``read`` reads it: a text line (``fit`` "line")
    wider than the canvas at the canvas's height is cut into overlapping windows at that height (``window_spans``) of
    its inked stretch (blank margins left out), each on a canvas as in training; otherwise one canvas
    (``fit_image``). Returns the canvases, their spans of the line (columns at the canvas's height) and a warning
    when the image is distorted beyond what training saw."""
    aspect = image.width / image.height
    if fit != "line":
        stretch = aspect / (width / height)
        warning = None
        if max(stretch, 1 / stretch) > MOST_STRETCH:
            way = "narrowed" if stretch > 1 else "widened"
            warning = (f"{image.width}×{image.height} pixels is {way} {max(stretch, 1 / stretch):.0f}× to the model's "
                       f"{width}×{height} canvas: crop it nearer to that shape for a reading the model was trained "
                       "for")  # fmt: skip
        return [fit_image(image, height, width, fit)], [(0, width)], warning
    if aspect < NARROWEST_LINE:
        warning = (f"{image.width}×{image.height} pixels is taller than a line of text: it shrinks "
                   f"{image.height / height:.0f}× to the model's line height of {height} pixels (and a page or "
                   "column of lines is not read as such): give one line per image, cropped to its height")  # fmt: skip
        return [fit_line(image, height, width)], [(0, width)], warning
    scaled_width = max(1, round(image.width * height / image.height))
    if scaled_width <= width:
        return [fit_line(image, height, width)], [(0, scaled_width)], None
    line = image.resize((scaled_width, height), Image.Resampling.LANCZOS)
    ink = ink_columns(line)
    inked = np.flatnonzero(ink)  # blank margins are left out: a window of nothing would be read as something
    first, last = max(0, int(inked[0]) - height // 4), min(scaled_width, int(inked[-1]) + 1 + height // 4)
    if last - first <= width:
        return [fit_line(line.crop((first, 0, last, height)), height, width)], [(first, last)], None
    line, ink = line.crop((first, 0, last, height)), ink[first:last]
    spans = window_spans(ink, width, round(overlap * width))
    return [fit_line(line.crop((start, 0, end, height)), height, width) for start, end in spans], spans, None


def read_line_windows(readings: list[str], spans: list[tuple[int, int]]) -> str:
    """One line's reading from the readings of its windows (``line_canvases``' spans), joined at each overlap."""
    joined = readings[0]
    for (_, end), (start, next_end), reading in zip(spans, spans[1:], readings[1:], strict=False):
        shared = round(len(reading) * max(0, end - start) / max(1, next_end - start))
        joined = join_readings(joined, reading, shared)
    return joined


def ctc_per_character(patch_logits: Tensor, targets: Tensor, lengths: Tensor, blank: int) -> Tensor:
    """Each row's CTC loss of its patches' logits ``(batch, patches, vocab)`` (in reading order) against the first
    ``lengths`` ids of its row of ``targets`` ``(batch, L)``, per character ``(batch,)`` (a row of no target: over one);
    ``blank`` is CTC's blank; a text longer than the patches can spell counts zero. Their mean is ``F.ctc_loss``'s
    "mean"."""
    log_probs = patch_logits.float().log_softmax(-1).transpose(0, 1)  # (patches, batch, vocab)
    patches = torch.full_like(lengths, log_probs.shape[0])
    per_row = F.ctc_loss(log_probs, targets, patches, lengths, blank=blank, reduction="none", zero_infinity=True)
    return per_row / lengths.clamp(min=1)


def image_text_loss(
    logits: Tensor,
    tgt: Tensor,
    pad_id: int,
    label_smoothing: float,
    patch_logits: Tensor | None = None,
    ctc_weight: float = 0.0,
) -> Tensor:
    """The decoder's label-smoothed cross-entropy per target token of ``tgt`` ([BOS] ids [EOS], padded with
    ``pad_id``); with ``patch_logits`` ``(batch, patches, vocab)``, plus ``ctc_weight`` times the CTC loss of the
    encoder's patches against the text (PAD as CTC's blank; a line with more characters and repeats than patches
    counts zero)."""
    loss = F.cross_entropy(
        logits.flatten(0, 1).float(), tgt[:, 1:].flatten(), ignore_index=pad_id, label_smoothing=label_smoothing
    )
    if patch_logits is None:
        return loss
    lengths = (tgt != pad_id).sum(1) - 2  # the text's tokens, BOS and EOS left out
    return loss + ctc_weight * ctc_per_character(patch_logits, tgt[:, 1:-1], lengths, pad_id).mean()


class ImageToTextTask(Task):
    """Label-smoothed cross-entropy of the text given the image; the character error rate (CER), word error rate
    (WER), exact lines and BLEU of the model's readings (greedy in validation, ``beam_size`` in test).

    The model's image size, channels and vocabulary come from the data's facts; the tokenizer and the images'
    normalisation travel inside the checkpoint, so a checkpoint alone reads images (``lightformer read``).

    Args:
        net: the model's shape (``VisionEncoderDecoderConfig``).
        label_smoothing: of the training targets.
        ctc_weight: the weight of a CTC loss on the encoder's patches (the model's ``ctc_head``), added to the
            decoder's cross-entropy in training; 0: none. The readings are the decoder's all the same.
        beam_size: beam width at test time and for ``read`` (1 = greedy).
        val_beam_size: beam width of validation's readings.
        num_logged_samples: validation images shown in TensorBoard with their reading and reference.
    """

    model_class = VisionEncoderDecoder
    net_from_data = {
        "encoder.image_size": "image_size",
        "encoder.in_channels": "in_channels",
        "decoder.vocab_size": "vocab_size",
    }
    position_table = PositionTable("decoder.block_size", "lines", counted="BOS and EOS included")
    items_name = "images"
    variable_shapes = True  # texts padded to the batch's longest
    hparam_metrics = ("val/cer", "val/loss", "test/cer", "test/wer", "test/exact")

    def __init__(
        self,
        net: VisionEncoderDecoderConfig = VisionEncoderDecoderConfig(),
        label_smoothing: float = 0.1,
        ctc_weight: float = 0.0,
        beam_size: int = 1,
        val_beam_size: int = 1,
        num_logged_samples: int = 4,
        **common: Any,
    ) -> None:
        # a dict is a checkpoint's hyperparameters: those of b1bd12e and before are flat
        super().__init__(VisionEncoderDecoderConfig.from_saved(net) if isinstance(net, dict) else net, **common)
        if ctc_weight < 0 or (ctc_weight > 0 and self.model.ctc_head is None):
            raise ConfigError(
                f"model.ctc_weight={ctc_weight} must be at least 0, and above 0 only with model.net.ctc_head=true"
            )
        self.metrics = torch.nn.ModuleDict(
            {
                f"{split}_{name}": metric()
                for split in ("val", "test")
                for name, metric in (
                    ("loss", MeanMetric),
                    ("cer", CharErrorRate),
                    ("wer", WordErrorRate),
                    ("exact", MeanMetric),
                    ("bleu", lambda: SacreBLEUScore(tokenize="13a")),
                )
            }
        )
        self._samples: list[tuple[Tensor, str, str]] = []
        self._predictions: list[tuple[str, str]] = []  # (reading, reference) of each predicted image

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.fact_tokenizer("tokenizer")

    @property
    def pad_id(self) -> int:
        return self.data_facts.pad_id

    # --- training and evaluation ---------------------------------------------------------------------------

    def _loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """The teacher-forced loss of ``batch`` (compiled with the model when ``compile``) and its target tokens (a
        count on the device: reading it would wait for the device)."""
        loss = self.compiled(self._teacher_forced_loss)(batch["images"], batch["tgt"])
        return loss, (batch["tgt"][:, 1:] != self.pad_id).sum()

    def _teacher_forced_loss(self, images: Tensor, tgt: Tensor) -> Tensor:
        """The decoder's label-smoothed cross-entropy per target token; in training with ``ctc_weight``, plus that
        weight times the CTC loss of the encoder's patches against the text (PAD as CTC's blank; a line with more
        characters and repeats than patches counts zero)."""
        ctc = self.training and self.hparams.ctc_weight > 0
        outputs = self.model(images, tgt[:, :-1], ctc=ctc)
        logits, patch_logits = outputs if ctc else (outputs, None)
        h = self.hparams
        return image_text_loss(logits, tgt, self.pad_id, h.label_smoothing, patch_logits, h.ctc_weight)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        loss, _ = self._loss(batch)
        self.log_train({"train/loss": loss})
        return loss

    def model_inputs(self, batch: Batch) -> tuple[Tensor, Tensor]:
        return batch["images"], batch["tgt"][:, :-1]

    def throughput_counts(self, batch: Batch) -> tuple[int, int]:
        return len(batch["images"]), len(batch["images"])

    def _evaluate(self, batch: Batch, split: str, beam_size: int) -> list[str]:
        """Update ``split``'s metrics with ``batch``'s: CER and WER against each image's ``text``; BLEU and exact
        readings against all its ``references`` (an image's captions: a reading equal to any of them is exact)."""
        loss, n_tokens = self._loss(batch)
        readings, texts = self.read_images(batch["images"], beam_size), batch["text"]
        references = batch.get("references") or [[text] for text in texts]
        m = self.metrics
        m[f"{split}_loss"].update(loss, weight=n_tokens)
        m[f"{split}_cer"].update(readings, texts)
        m[f"{split}_wer"].update(readings, texts)
        m[f"{split}_exact"].update(
            torch.tensor([r in refs for r, refs in zip(readings, references, strict=True)]).float()
        )
        m[f"{split}_bleu"].update(readings, references)
        return readings

    def _log_metrics(self, split: str) -> dict[str, Tensor]:
        values = {f"{split}/{name}": self.metrics[f"{split}_{name}"].compute() for name in ("loss", "cer", "wer")}
        values[f"{split}/exact"] = self.metrics[f"{split}_exact"].compute()
        values[f"{split}/bleu"] = self.metrics[f"{split}_bleu"].compute() * 100
        for name, metric in self.metrics.items():
            if name.startswith(split):
                metric.reset()
        self.log_dict(values, prog_bar=split == "val")
        return values

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        readings = self._evaluate(batch, "val", self.hparams.val_beam_size)
        if batch_idx == 0:
            n = self.hparams.num_logged_samples
            self._samples = list(zip(batch["images"][:n].cpu(), batch["text"][:n], readings[:n], strict=True))
            self._log_cross_attention(batch, readings[0])

    def on_validation_epoch_end(self) -> None:
        values = self._log_metrics("val")
        raise_if_non_finite(self.trainer, "val/loss", values["val/loss"])
        writer = tensorboard_writer(self)
        if writer is not None and self._samples and not self.trainer.sanity_checking:
            step = logging_step(self.trainer)
            for i, (image, _, _) in enumerate(self._samples):
                writer.add_image(f"val/sample_{i}", unnormalised(image, self.data_facts), step)
            rows = ["| reference | reading |", "|---|---|"] + [f"| {t} | {r} |" for _, t, r in self._samples]
            writer.add_text("val/readings", "\n".join(rows), step)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "test", self.hparams.beam_size)

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")

    def on_predict_epoch_start(self) -> None:
        self._predictions = []

    def predict_step(self, batch: Batch, batch_idx: int) -> list[str]:
        """The readings of ``batch`` (``beam_size``), kept with their references for ``predictions.tsv``."""
        readings = self.read_images(batch["images"])
        self._predictions += zip(readings, batch["text"], strict=True)
        return readings

    def on_predict_epoch_end(self) -> None:
        """Write ``predictions.tsv`` in the run's folder: a header, then one row per image of the data's predict
        split, in its order (from every process): its index, the reading, the reference (tab-separated, quoted
        where a text holds a tab, a quote or a line break)."""
        world = self.trainer.world_size  # process r read images r, r + world, ... (evaluation_sampler)
        rows = [(self.global_rank + i * world, *row) for i, row in enumerate(self._predictions)]
        if world > 1:
            gathered: list[list] = [[] for _ in range(world)]
            torch.distributed.all_gather_object(gathered, rows)
            rows = sorted(row for part in gathered for row in part)
        if self.trainer.is_global_zero:
            path = Path(self.trainer.log_dir or ".") / "predictions.tsv"
            text = io.StringIO()
            csv.writer(text, dialect="excel-tab", lineterminator="\n").writerows(
                [("index", "reading", "reference")] + rows
            )
            with atomic_open(path) as f:
                f.write(text.getvalue().encode())
            rank_zero_info(f"wrote {path}: {len(rows)} readings")

    # --- reading -------------------------------------------------------------------------------------------

    @torch.no_grad()
    def read_images(self, images: Tensor, beam_size: int | None = None) -> list[str]:
        """The text of each image of a normalised batch ``(batch, C, H, W)``, by beam search (1: greedy)."""
        if self.tokenizer is None:
            raise RuntimeError(
                "this model has no tokenizer: train it with an image-text data module or load a checkpoint"
            )
        beam_size = self.hparams.beam_size if beam_size is None else beam_size
        if beam_size < 1:
            raise ValueError(f"beam_size={beam_size} must be at least 1 (1 is greedy decoding)")
        was_training = self.model.training
        self.model.eval()
        decoder = self.model.incremental_decoder(images, beam_size)
        hypotheses, _ = beam_search(
            decoder,
            images.shape[0],
            beam_size,
            self.tokenizer.bos_id,
            self.tokenizer.eos_id,
            self.model.block_size - 1,
            1.0,
            device=images.device,
        )
        self.model.train(was_training)
        return self.tokenizer.decode_batch(hypotheses)

    def read_files(
        self, paths: list[str], beam_size: int | None = None, warn: Callable[[str], None] | None = None
    ) -> list[str | Exception]:
        """The text of each image file, in order; an image that cannot be read is its error instead, and the others
        are read all the same. A line wider than the canvas at its height is read in overlapping windows at that
        height, joined (``line_canvases``); ``warn`` (default: standard error) is told of an image distorted beyond
        what training saw."""
        c, facts = self.model.config.encoder, self.data_facts
        normalise = to_normalised_tensor(facts.normalize_mean, facts.normalize_std)
        warn = warn or (lambda text: print(f"warning: {text}", file=sys.stderr))
        loaded: list[tuple[list[Tensor], list[tuple[int, int]]] | Exception] = []
        for path in paths:
            try:
                image = load_image(path, c.in_channels)
                pixels = np.asarray(image)
                if pixels.min() == pixels.max():
                    raise DataError(f"{path} is blank (every pixel has one value): it holds nothing to read")
                canvases, spans, warning = line_canvases(image, *c.image_size, facts.image_fit or "line")
            except (OSError, ValueError) as error:  # missing, not an image, blank: named, the batch goes on
                loaded.append(error)
                continue
            if warning is not None:
                warn(f"{path}: {warning}")
            loaded.append(([normalise(canvas) for canvas in canvases], spans))
        images = [canvas for item in loaded if not isinstance(item, Exception) for canvas in item[0]]
        readings = iter(self.read_images(torch.stack(images).to(self.device), beam_size) if images else [])
        return [
            item if isinstance(item, Exception) else read_line_windows([next(readings) for _ in item[0]], item[1])
            for item in loaded
        ]

    @torch.no_grad()
    def reading_attention(self, image: Tensor, reading: str) -> tuple[list[str], Tensor]:
        """The tokens of ``reading`` (the model's reading of one normalised image ``(C, H, W)``, then EOS) and where
        the model looked as it wrote each: the last decoder block's cross-attention over the patches, mean over
        heads, ``(tokens, grid height, grid width)``. Teacher-forcing the model on its own reading gives the weights
        it had when it generated it (each position attends to the ones before it alone). Every process of a sharded
        model calls it (a forward pass)."""
        ids = self.tokenizer.encode(reading, add_bos=True, add_eos=True)[: self.model.block_size + 1]
        tgt = torch.tensor([ids], device=image.device)
        with record_attention(self.model) as weights:
            self.model(image[None], tgt[:, :-1])
        last = f"decoder.decoder.layers.{len(self.model.decoder.decoder.layers) - 1}.cross_attn"
        tokens = [self.tokenizer.decode([i], skip_special=False) for i in ids[1:]]
        return tokens, weights[last][0].float().mean(0).reshape(len(tokens), *self.model.encoder.grid)

    def _log_cross_attention(self, batch: Batch, reading: str) -> None:
        """Where the model looked as it wrote its reading of the first validation image (``reading_attention``): a
        panel per token, the attention over the image (``val/reading_attention``), and the tokens × patches matrix
        (``val/cross_attention``)."""
        if tensorboard_logger(self) is None or self.trainer.sanity_checking:
            return
        tokens, maps = self.reading_attention(batch["images"][0], reading)  # every process (FSDP2)
        writer = tensorboard_writer(self)
        if writer is None:
            return
        title, step = f"reference: {batch['text'][0]}  |  reading: {reading}", logging_step(self.trainer)
        writer.add_figure("val/reading_attention", reading_figure(batch["images"][0], maps, tokens, title), step)
        grid = self.model.encoder.grid
        patches = [f"{row},{col}" if grid[0] > 1 else str(col) for row in range(grid[0]) for col in range(grid[1])]
        writer.add_figure("val/cross_attention", attention_figure(maps.flatten(1), patches, tokens, title), step)


# --- the commands that take this task's checkpoints alone ---------------------------------------------------


def read(
    ckpt_path: str | None = None,
    images: list[str] | str | None = None,
    beam_size: int | None = None,
    batch_size: int = 32,
    device: str = "cpu",
) -> None:
    """The text of line images.

    Print the text of each image, one line per image in the order given, with an image-to-text checkpoint alone.
    A line image is scaled to the model's canvas height as in training; a line wider than the canvas at that height
    is read in overlapping windows of the canvas's width, whose readings are joined. An image distorted beyond what
    training saw (a page or column scaled to one line's height, a photo stretched 2× or more) is read with a warning.
    A file that is not a readable image, or a blank image, prints an empty line (and its reason on standard error),
    and the other images are read all the same; when no image could be read, the command fails (exit status 1).

    Example: ``read --ckpt_path best.ckpt --images "scans/*.png" --beam_size 4``.

    Args:
        ckpt_path: a checkpoint written by ``fit`` with the image-to-text task (its tokenizer and preprocessing
            travel inside).
        images: image files (PNG, JPEG, ...) or glob patterns, read in the order given (a pattern's matches sorted).
        beam_size: beam width (1 = greedy); default: the model's ``beam_size``.
        batch_size: images read together.
        device: "cpu", "cuda", "cuda:1", ...
    """
    require(ckpt_path is not None and bool(images), "read needs --ckpt_path CHECKPOINT and --images FILE ...")
    require(beam_size is None or beam_size >= 1, f"--beam_size={beam_size} must be at least 1 (1 is greedy)")
    require(batch_size >= 1, f"--batch_size={batch_size} must be at least 1")
    task = load_task(ckpt_path, ImageToTextTask, "read", device)
    paths = paths_of(images, "--images", "image file", ".png")
    held: list[tuple[str, Exception]] = []  # the unreadable images before the first one read: none may be read
    for start in range(0, len(paths), batch_size):
        batch = paths[start : start + batch_size]
        readings = held + list(zip(batch, task.read_files(batch, beam_size), strict=True))
        if all(isinstance(reading, Exception) for _, reading in readings):
            held = readings
            continue
        held = []
        unreadable_images(*zip(*readings, strict=True), "read")
        for _, reading in readings:
            print("" if isinstance(reading, Exception) else reading, flush=True)
    if held:
        unreadable_images(*zip(*held, strict=True), "read")  # none could be read: refused, not empty readings


register(
    ImageToTextTask,
    data=ImageTextData,
    commands={"read": read},
    list_options={"read": "--images"},
)
