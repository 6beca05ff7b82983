"""What a run shows in TensorBoard: the logger, and the figures the tasks draw (with matplotlib).

``TensorBoardLogger`` is Lightning's with these changes, so that TensorBoard opens on the answer:

- no placeholder ``hp_metric`` and no ``epoch`` curve (the epoch is in each event's wall time and step);
- the Scalars tab opens on the loss and the task's metrics: TensorBoard groups curves by the part of their name
  before the first ``/`` and orders the groups by name, so the throughput curves of Lightning's
  ``ThroughputMonitor`` (``train/device/items_per_sec``, ...) move to a group of their own that sorts after
  ``test/``, ``train/`` and ``val/``: ``velocity/train/device/items_per_sec``, ... (``THROUGHPUT_GROUP``);
- the HParams table shows each run's final validation and test metrics beside its name, so a sweep of runs sorts
  by BLEU or accuracy: its columns are the hyperparameters named in ``hparam_columns`` (the table shows its first
  five hyperparameter columns before any metric), and every hyperparameter (each field of ``model.net``,
  ``model.optimizer``, the data's options, flattened) is recorded with the run;
- ``test`` run on a checkpoint of a run writes into that run's folder (see ``lightformer.cli.main``), and every task
  logs test metrics at the step of the tested weights (``Task.on_test_start``), beside the training curves.

Images and text are written at the step Lightning logs scalars at (``logging_step``), so a validation's metrics,
pictures and samples line up; one picture or sample per step: the validation on the whole split that ends a run
validated on a subset draws none when the fit's last validation drew them from the same weights
(``samples_already_drawn``). The pictures and text the tasks show are drawn here: matplotlib figures (attention
maps, rollouts, confusion matrices), grids of images (``image_grid``), Markdown of masked text (``render_masked``).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch import loggers
from torch import Tensor
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams as hparams_summary

from lightformer.data.objectives.masking import IGNORE_INDEX
from lightformer.training import internals

if TYPE_CHECKING:
    from lightformer.tokenization.text import Tokenizer

# Curves that only count up (the epoch; ThroughputMonitor's running totals of time, batches, samples and items):
# their rates are logged, so they would only push the curves that matter down the page.
COUNTERS = ("epoch", "time", "batches", "samples", "lengths")
# The group of the throughput curves: after the groups of the loss and metrics (test/, train/, val/) in TensorBoard's
# order of groups (by name; letters after the separators "/" and "_"), and after Lightning's "validate/".
THROUGHPUT_GROUP = "velocity"
_THROUGHPUT = re.compile(r"(?:[a-z_]+)/(?:device/)?(?:batches_per_sec|samples_per_sec|items_per_sec|flops_per_sec|mfu)")


class TensorBoardLogger(loggers.TensorBoardLogger):
    """Lightning's ``TensorBoardLogger`` without ``hp_metric`` and counter curves (``COUNTERS``), with an HParams
    summary whose metric columns each task names (``Task.hparam_metrics``).

    Args:
        save_dir: where runs are written: ``<save_dir>/<name>/<version>``.
        name: the run's name (the config's).
        version: the run's folder under the name; None: the next ``version_N``.
        default_hp_metric: log Lightning's placeholder ``hp_metric`` (-1) for TensorBoard's HParams tab.
        prefix: a prefix of every metric's name.
    """

    def __init__(
        self,
        save_dir: str,
        name: str | None = "lightning_logs",
        version: int | str | None = None,
        default_hp_metric: bool = False,
        prefix: str = "",
        hparam_columns: Sequence[str] = ("model/optimizer/lr",),
    ) -> None:
        super().__init__(save_dir, name, version, default_hp_metric=default_hp_metric, prefix=prefix)
        self.hparam_columns = tuple(hparam_columns)
        self._file_second: int | None = None  # the creation second in the name of the latest events file

    @property
    def experiment(self) -> SummaryWriter:
        """Lightning's, except that a writer opened after ``finalize`` (a ``validate`` or ``test`` after ``fit`` in one
        process) starts a new events file in a later second than the previous one: TensorBoard reads a run's files in
        name order, and a name orders by its creation second, then by a counter compared as text ("10" < "9"), so a
        second file from the same second could be read first, and its steps would then purge the earlier ones."""
        if internals.opened_writer(self) is None and self._file_second is not None:
            time.sleep(max(0.0, self._file_second + 1 - time.time()))
        opening = internals.opened_writer(self) is None
        experiment = super().experiment
        if opening and internals.opened_writer(self) is not None:
            self._file_second = int(time.time())
        return experiment

    def finalize(self, status: str) -> None:
        super().finalize(status)
        internals.forget_writer(self)  # closed: the next log opens a new writer (through ``experiment``)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        kept = {
            f"{THROUGHPUT_GROUP}/{k}" if _THROUGHPUT.fullmatch(k) else k: v
            for k, v in metrics.items()
            if k.rsplit("/", 1)[-1] not in COUNTERS
        }
        if kept:
            super().log_metrics(kept, step)

    def log_hyperparams(self, params: Any, metrics: Any = None) -> None:
        """Lightning's (the run's ``hparams.yaml``), with the tokenizers of the task's ``data_facts`` named by their
        size instead of written out (a BPE tokenizer's JSON is megabytes; it is in every checkpoint and beside the
        run as ``tokenizer.json``)."""
        params = dict(params) if isinstance(params, Mapping) else dict(vars(params))
        if isinstance(params.get("data_facts"), Mapping):
            params["data_facts"] = {
                key: f"<{len(value):,} characters of JSON: in the checkpoints>" if key.endswith("tokenizer") and value
                else value
                for key, value in params["data_facts"].items()
            }  # fmt: skip
        super().log_hyperparams(params, metrics)

    def log_hparams_summary(self, params: Mapping[str, Any], metric_names: Sequence[str]) -> None:
        """Write the HParams tab's record of this run: ``params`` (nested dicts flattened to ``a/b``) and the names
        of the scalars to show beside them (their latest values, read from the run's curves). The table's columns
        are the metrics and the hyperparameters of ``hparam_columns`` (those of them the run has); TensorBoard's
        HParams table shows its first five hyperparameter columns before the metrics, so these are few."""
        flat = {k: v if isinstance(v, int | float | str | bool) else str(v) for k, v in _flatten(params).items()}
        metrics = {name: 0.0 for name in metric_names}
        columns = {k: flat[k] for k in self.hparam_columns if k in flat} or dict(list(flat.items())[:1])
        experiment, _, _ = hparams_summary(columns, metrics)  # the table's columns (it needs one hyperparameter)
        _, session_start, session_end = hparams_summary(flat, metrics)  # every hyperparameter of the run
        writer = internals.event_file_writer(self.experiment)
        for summary in (experiment, session_start, session_end):
            writer.add_summary(summary)


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in params.items():
        if str(key).startswith("_"):  # LightningCLI's _class_path and _instantiator
            continue
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value if value is not None else "None"
    return flat


def tensorboard_writer(module: L.LightningModule) -> SummaryWriter | None:
    """The run's ``SummaryWriter`` on global rank zero, or None (no TensorBoard logger, another rank, or inside
    ``samples_already_drawn``)."""
    logger = tensorboard_logger(module)
    return logger.experiment if logger is not None and module.trainer.is_global_zero else None


def tensorboard_logger(module: L.LightningModule) -> loggers.TensorBoardLogger | None:
    """The run's TensorBoard logger on every rank (what decides whether to draw: a forward pass under FSDP2 needs
    every process), or None (none, or inside ``samples_already_drawn``: nothing to draw)."""
    if internals.attached_trainer(module) is None or getattr(module, "_samples_already_drawn", False):
        return None
    return next((lg for lg in module.trainer.loggers if isinstance(lg, loggers.TensorBoardLogger)), None)


@contextmanager
def samples_already_drawn(module: L.LightningModule) -> Iterator[None]:
    """Inside the block, the tasks draw no pictures and write no text samples (``tensorboard_logger`` and
    ``tensorboard_writer`` are None): for a validation of weights whose samples a validation has already drawn (the
    whole-split validation that ends a run validated on a subset), so that TensorBoard shows one sample per step."""
    module._samples_already_drawn = True
    try:
        yield
    finally:
        module._samples_already_drawn = False


def logging_step(trainer: L.Trainer) -> int:
    """The step Lightning logs scalars at now (its count of optimizer steps taken before the current batch), so that
    a validation's images and text stand at the step of its metrics."""
    return internals.logging_step(trainer)


def set_logging_step(trainer: L.Trainer, step: int) -> None:
    """Make Lightning log at ``step`` (a test of a checkpoint, in a process that did not train it)."""
    internals.set_logging_step(trainer, step)


# --- figures (matplotlib's object API: no global state, no display) ------------------------------------------------


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def attention_figure(weights: Tensor, source_tokens: Sequence[str], target_tokens: Sequence[str], title: str):
    """Cross-attention ``(target_len, source_len)`` as a heatmap with the tokens on the axes and a colour scale."""
    weights = weights.detach().float().cpu().numpy()
    rows, cols = weights.shape
    figure = _figure(max(4.0, 0.38 * cols + 2.2), max(3.0, 0.32 * rows + 1.6))
    axes = figure.add_subplot()
    image = axes.imshow(weights, cmap="viridis", vmin=0.0, vmax=max(float(weights.max()), 1e-6), aspect="auto")
    axes.set_xticks(range(cols), labels=list(source_tokens), rotation=60, ha="right", fontsize=8)
    axes.set_yticks(range(rows), labels=list(target_tokens), fontsize=8)
    axes.set_xlabel("source (what is read)")
    axes.set_ylabel("target (what is written)")
    axes.set_title(title, fontsize=9)
    figure.colorbar(image, ax=axes, label="attention weight")
    return figure


def reading_figure(image: Tensor, maps: Tensor, tokens: Sequence[str], title: str):
    """Where a model looked as it wrote each token: one panel per token of ``tokens``, the image ``(C, H, W)``
    (normalised; shown min-max scaled) under that token's attention ``maps[i]`` ``(grid h, grid w)`` stretched to the
    image, the token beside it; a wide image (a text line) one panel a row, else six a row."""
    image, maps = image.detach().float().cpu(), maps.detach().float().cpu()
    shown = (image - image.min()) / (image.max() - image.min()).clamp_min(1e-8)
    shown = shown[0].numpy() if shown.shape[0] == 1 else shown.permute(1, 2, 0).numpy()
    height, width = image.shape[-2:]
    columns = 1 if width >= 4 * height else min(6, len(tokens))
    rows = -(-len(tokens) // columns)
    panel = (6.0, 6.0 * height / width) if columns == 1 else (1.6, 1.6 * height / width)
    figure = _figure(panel[0] * columns + 0.6, (panel[1] + 0.12) * rows + 0.5)
    grid = figure.subplots(rows, columns, squeeze=False)
    for axes, heat, token in zip(grid.flat, maps, tokens, strict=False):
        heat_up = torch.nn.functional.interpolate(heat[None, None], size=(height, width), mode="nearest")[0, 0]
        axes.imshow(shown, cmap="gray" if image.shape[0] == 1 else None)
        axes.imshow(heat_up.numpy(), cmap="inferno", alpha=0.6, vmin=0.0, vmax=max(float(heat.max()), 1e-6))
        axes.set_ylabel(repr(token), rotation=0, ha="right", va="center", fontsize=8)
        axes.set_xticks([])
        axes.set_yticks([])
    for axes in list(grid.flat)[len(tokens) :]:
        axes.set_axis_off()
    figure.suptitle(title, fontsize=9)
    return figure


def rollout_figure(images: Tensor, maps: Tensor, titles: Sequence[str]):
    """One row per image: the image, its attention rollout and the rollout over the image, titled ``titles[i]``
    (e.g. true and predicted class). images ``(n, C, H, W)`` normalised (shown min-max scaled), maps ``(n, g, g)``."""
    images = images.detach().float().cpu()
    maps = maps.detach().float().cpu()
    figure = _figure(6.6, 2.2 * len(images))
    grid = figure.subplots(len(images), 3, squeeze=False)
    for row, (image, heat, title) in enumerate(zip(images, maps, titles, strict=True)):
        shown = (image - image.min()) / (image.max() - image.min()).clamp_min(1e-8)
        shown = shown[0].numpy() if shown.shape[0] == 1 else shown.permute(1, 2, 0).numpy()
        heat_up = torch.nn.functional.interpolate(heat[None, None], size=image.shape[-2:], mode="bilinear")[0, 0]
        cmap = "gray" if image.shape[0] == 1 else None
        grid[row, 0].imshow(shown, cmap=cmap)
        grid[row, 0].set_title(title, fontsize=9, loc="left")
        grid[row, 1].imshow(heat.numpy(), cmap="inferno")
        grid[row, 1].set_title("attention rollout", fontsize=8)
        grid[row, 2].imshow(shown, cmap=cmap)
        grid[row, 2].imshow(heat_up.numpy(), cmap="inferno", alpha=0.55)
        grid[row, 2].set_title("over the image", fontsize=8)
        for axes in grid[row]:
            axes.set_axis_off()
    return figure


def confusion_figure(confusion: Tensor, class_names: Sequence[str], items: str):
    """A confusion matrix (rows: true class, columns: predicted) of `items` ("images", "passages"): cells shaded by
    the share of the true class (its recall on the diagonal) and labelled with the count and that share."""
    counts = confusion.detach().long().cpu().numpy()
    rates = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    n = len(class_names)
    side = max(4.5, 0.75 * n + 2.5)
    figure = _figure(side + 1.0, side)
    axes = figure.add_subplot()
    image = axes.imshow(rates, cmap="Blues", vmin=0.0, vmax=1.0)
    axes.set_xticks(range(n), labels=list(class_names), rotation=45, ha="right", fontsize=9)
    axes.set_yticks(range(n), labels=list(class_names), fontsize=9)
    axes.set_xlabel("predicted class")
    axes.set_ylabel("true class")
    for i in range(n):
        for j in range(n):
            if counts[i, j]:
                colour = "white" if rates[i, j] > 0.55 else "black"
                axes.text(
                    j, i, f"{counts[i, j]}\n{rates[i, j]:.0%}", ha="center", va="center", fontsize=7, color=colour
                )
    accuracy = np.trace(counts) / max(counts.sum(), 1)
    axes.set_title(f"{counts.sum():,} {items}, accuracy {accuracy:.1%}", fontsize=10)
    figure.colorbar(image, ax=axes, label="share of the true class", fraction=0.046)
    return figure


def similarity_figure(similarities: Tensor, captions: Sequence[str], title: str):
    """The cosine similarities ``(images, texts)`` of a batch's images (rows, numbered) and its captions (columns,
    ``captions``) as a heatmap on [-1, 1]: a model that pairs them shows a bright diagonal."""
    values = similarities.detach().float().cpu().numpy()
    rows, cols = values.shape
    figure = _figure(max(4.5, 0.28 * cols + 2.5), max(4.0, 0.28 * rows + 2.0))
    axes = figure.add_subplot()
    image = axes.imshow(values, cmap="viridis", vmin=-1.0, vmax=1.0, aspect="auto")
    shown = [text if len(text) <= 28 else text[:27] + "…" for text in captions]
    axes.set_xticks(range(cols), labels=shown, rotation=60, ha="right", fontsize=7)
    axes.set_yticks(range(rows), labels=[str(i) for i in range(rows)], fontsize=7)
    axes.set_xlabel("caption")
    axes.set_ylabel("image")
    axes.set_title(title, fontsize=9)
    figure.colorbar(image, ax=axes, label="cosine similarity")
    return figure


def unnormalised(image: Tensor, facts: Any) -> Tensor:
    """An image ``(C, H, W)`` normalised as the data's ``facts`` say (``DataFacts.normalize_mean`` and
    ``normalize_std``) back in [0, 1], to be shown."""
    mean, std = (torch.tensor(values).view(-1, 1, 1) for values in (facts.normalize_mean, facts.normalize_std))
    return (image.float() * std + mean).clamp(0, 1)


def markdown_text(text: str) -> str:
    """``text`` as literal Markdown on one line (a table cell): special characters escaped, line breaks as spaces."""
    text = re.sub(r"([\\`*_\[\]#|])", r"\\\1", text)
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def render_masked(
    tokenizer: Tokenizer, inputs: list[int], labels: list[int], predictions: list[int]
) -> tuple[str, str]:
    """Markdown of one masked example for a table cell: (the text with [MASK] at each selected position, the text
    with the model's prediction there in bold, followed by the original in italics where they differ).

    ``inputs`` are the model's input ids, ``labels`` the original ids at the selected positions (IGNORE_INDEX
    elsewhere), ``predictions`` the predicted ids there; padding and [CLS] are left out, an inner [SEP] shown.
    """
    special = {tokenizer.pad_id, tokenizer.bos_id}
    positions = [i for i, token in enumerate(inputs) if token not in special]
    if positions and inputs[positions[-1]] == tokenizer.eos_id and labels[positions[-1]] == IGNORE_INDEX:
        positions.pop()  # the closing [SEP]
    masked, filled, run = [], [], []

    def flush(*text: str) -> None:
        """End the current run of unselected tokens (shown as they are), then add ``text`` to both renderings."""
        plain = markdown_text(tokenizer.decode(run)) if run else ""
        masked.extend((plain, *text))
        filled.extend((plain, *text))
        run.clear()

    for i in positions:
        if labels[i] == IGNORE_INDEX:
            if inputs[i] == tokenizer.eos_id:
                flush(" [SEP] ")
            else:
                run.append(inputs[i])
            continue
        flush()
        space, original = _split_space(tokenizer.decode([labels[i]], skip_special=False))
        _, predicted = _split_space(tokenizer.decode([predictions[i]], skip_special=False))
        masked.append(f"{space}[MASK]")
        filled.append(f"{space}**{predicted}**" + ("" if predictions[i] == labels[i] else f" *({original})*"))
    flush()
    return "".join(masked).strip(), "".join(filled).strip()


def _split_space(text: str) -> tuple[str, str]:
    """(leading spaces as one space or nothing, the rest as Markdown); a token of whitespace only is shown as
    visible symbols (␣ for a space, ⏎ for a line break)."""
    core = text.lstrip()
    if not core:
        return "", "".join("⏎" if c == "\n" else "␣" for c in text)
    return (" " if core != text else ""), markdown_text(core)


MIN_SHOWN_SIZE = 64  # images in grids are upscaled (nearest) to at least this many screen pixels per side
GRID_PADDING = 2  # white pixels between the images of a grid


def image_grid(images: Tensor, columns: int, scale: int | None = None) -> Tensor:
    """uint8 images ``(n, C, S, S)`` (C = 1 or 3) → one uint8 RGB picture ``(3, H, W)``: ``columns`` per row, each
    image upscaled ``scale``× by repeating pixels (default: to at least 64 screen pixels), with 2 white pixels
    between images and around them. H = rows · (S·scale + 2) + 2, W = columns · (S·scale + 2) + 2."""
    n, _, height, width = images.shape
    scale = scale or max(1, math.ceil(MIN_SHOWN_SIZE / max(height, width)))
    columns = max(1, min(columns, n))
    rows = max(1, math.ceil(n / columns))
    cell_h, cell_w = height * scale + GRID_PADDING, width * scale + GRID_PADDING
    grid = torch.full((3, rows * cell_h + GRID_PADDING, columns * cell_w + GRID_PADDING), 255, dtype=torch.uint8)
    shown = images.cpu().repeat_interleave(scale, dim=-2).repeat_interleave(scale, dim=-1).expand(n, 3, -1, -1)
    for i, image in enumerate(shown):
        top, left = GRID_PADDING + (i // columns) * cell_h, GRID_PADDING + (i % columns) * cell_w
        grid[:, top : top + height * scale, left : left + width * scale] = image
    return grid
