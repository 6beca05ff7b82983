"""Contrastive image-text (CLIP, SigLIP): a ViT and a text transformer trained so that an image and its caption agree,
each image against every text of the global batch (gathered from every process); evaluated while it trains by
zero-shot classification (prompts built from the data's class names) and by image→text and text→image retrieval.

    images, captions ──ContrastiveModel──> unit embeddings (B, D) each, on every process
      ──gather_with_grad──> every process's texts and images (N = the global batch), gradients to the local rows
      ──contrastive_loss──> InfoNCE (CLIP) or the pairwise sigmoid loss (SigLIP) of the local rows against all N

The commands ``zero-shot`` (an image's likeliest labels, by prompts) and ``embed`` (unit embeddings of images or texts
as safetensors) take a checkpoint of this task alone: its tokenizer and normalisation travel inside.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torchmetrics import MeanMetric

from lightformer.data.families.image_text import ImageTextData
from lightformer.data.loading.pictures import image_input
from lightformer.errors import ConfigError
from lightformer.io.layouts import clip
from lightformer.models.contrastive import ContrastiveConfig, ContrastiveModel
from lightformer.registry import register
from lightformer.tasks.base import Task
from lightformer.tasks.command_support import (
    check_texts,
    load_task,
    paths_of,
    quote,
    require,
    unreadable_images,
    utf8_text,
    warn,
)
from lightformer.tasks.data_contract import PositionTable
from lightformer.tokenization.text import Tokenizer
from lightformer.training.callbacks import raise_if_non_finite
from lightformer.training.tensorboard import (
    logging_step,
    markdown_text,
    similarity_figure,
    tensorboard_writer,
    unnormalised,
)

Batch = dict[str, Any]

# CLIP's way of saying a class to a text tower: each class's name in a few sentences whose embeddings are averaged.
# These suit drawings, clip art and photos alike ("{}" is the class's name).
DEFAULT_TEMPLATES = (
    "{}",
    "a drawing of {}.",
    "a picture of {}.",
    "a photo of {}.",
    "an illustration of {}.",
    "clip art of {}.",
)
RECALL_AT = (1, 5, 10)
TOP_TEXTS = 3  # the texts shown beside each logged validation image


def gather_with_grad(x: Tensor) -> tuple[Tensor, int]:
    """Every process's rows of ``x`` concatenated in rank order (batches of unequal sizes too), gradients flowing
    back to each process's own rows (``torch.distributed.nn``'s all-gather sums them over the processes), and the
    index of this process's first row among them; ``x`` and 0 outside a process group of more than one."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x, 0
    from torch.distributed.nn.functional import all_gather

    world, rank = dist.get_world_size(), dist.get_rank()
    size = torch.tensor([len(x)], device=x.device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    counts = [int(s) for s in sizes]
    most = max(counts)
    padded = F.pad(x, (0, 0, 0, most - len(x))) if len(x) < most else x
    parts = all_gather(padded)
    return torch.cat([part[:n] for part, n in zip(parts, counts, strict=True)]), sum(counts[:rank])


def contrastive_loss(
    image_embeddings: Tensor, text_embeddings: Tensor, scale: Tensor, bias: Tensor | None, kind: str
) -> tuple[Tensor, int]:
    """The loss of this process's images and texts (unit rows ``(B, D)``, pair i the i-th of each) against the global
    batch's (``gather_with_grad``), and the global batch's size N. "infonce": CLIP's symmetric cross-entropy, the mean
    of image→text and text→image; "sigmoid": SigLIP's, -Σ_j log σ(z_ij (scale·x_i·y_j + bias)) over every text j of
    the global batch, z = 1 for the image's own caption and -1 for the others, divided by the batch size. Each
    process's loss is the mean over its rows, so the mean over processes (DDP's averaging of the gradients) is the
    loss of one process on the whole batch, gradients alike."""
    all_texts, offset = gather_with_grad(text_embeddings)
    local = len(image_embeddings)
    labels = torch.arange(local, device=image_embeddings.device) + offset
    per_image = scale * image_embeddings.float() @ all_texts.float().T
    if kind == "infonce":
        all_images, _ = gather_with_grad(image_embeddings)
        per_text = scale * text_embeddings.float() @ all_images.float().T
        loss = (F.cross_entropy(per_image, labels) + F.cross_entropy(per_text, labels)) / 2
    else:
        logits = per_image + bias if bias is not None else per_image
        signs = torch.full_like(logits, -1.0)
        signs[torch.arange(local, device=logits.device), labels] = 1.0
        loss = -F.logsigmoid(signs * logits).sum() / local
    return loss, len(all_texts)


def recalls(similarities: Tensor, relevant: Tensor, ks: Sequence[int] = RECALL_AT) -> dict[str, float]:
    """Retrieval's recall@k both ways from ``similarities`` ``(images, captions)`` and ``relevant`` (bool, same
    shape: the caption is one of the image's): image→text, the share of images with one of their captions among
    their k most similar; text→image, the share of captions with one of their images among their k most similar (k
    at most the candidates)."""
    found = {}
    for k in ks:
        top = similarities.topk(min(k, similarities.shape[1]), dim=1).indices
        found[f"i2t_r{k}"] = relevant.gather(1, top).any(1).float().mean().item()
        top = similarities.topk(min(k, similarities.shape[0]), dim=0).indices
        found[f"t2i_r{k}"] = relevant.gather(0, top).any(0).float().mean().item()
    return found


class ContrastiveTask(Task):
    """CLIP's or SigLIP's loss (``net.loss``) on a ViT and a GPT, each image against the texts of every process's
    batch; zero-shot accuracy and retrieval recall@1/5/10 on validation and test; the temperature's curve.

    The model's image size, channels, vocabulary and padding id come from the data's facts; the tokenizer, the
    normalisation and the class names travel inside the checkpoint, so a checkpoint alone classifies images by
    their labels (``lightformer zero-shot``) and embeds images or texts (``lightformer embed``).

    Args:
        net: the model's shape (``ContrastiveConfig``).
        templates: the prompts that say a class to the text tower ("{}" is the class's name): zero-shot classifies
            an image by the class whose prompts' embeddings (each normalised, averaged, renormalised) are nearest.
        num_logged_samples: validation images shown in TensorBoard with their likeliest texts.
    """

    model_class = ContrastiveModel
    net_from_data = {
        "image.image_size": "image_size",
        "image.in_channels": "in_channels",
        "text.vocab_size": "vocab_size",
        "pad_id": "pad_id",
    }
    position_table = PositionTable("text.block_size", "captions", counted="BOS and EOS included")
    items_name = "images"
    variable_shapes = True  # captions padded to the batch's longest
    hparam_metrics = (
        "val/zero_shot_top1",
        "val/i2t_r5",
        "val/loss",
        "test/zero_shot_top1",
        "test/i2t_r5",
        "test/t2i_r5",
        "train/contrasted_batch",
    )

    def __init__(
        self,
        net: ContrastiveConfig = ContrastiveConfig(),
        templates: tuple[str, ...] = DEFAULT_TEMPLATES,
        num_logged_samples: int = 4,
        **common: Any,
    ) -> None:
        super().__init__(net, **common)
        self.templates = check_templates(templates, "model.templates")
        if num_logged_samples < 0:
            raise ConfigError(f"model.num_logged_samples={num_logged_samples} must be at least 0")
        self.metrics = torch.nn.ModuleDict({f"{split}_loss": MeanMetric() for split in ("val", "test")})
        self._kept: dict[str, dict[str, Any]] = {}  # split → what its evaluation gathered (``_keep``)
        self._samples: tuple[Tensor, list[str]] | None = None  # the first validation batch's images and texts
        self.contrasted: int | None = None  # the global batch of the first training step

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.fact_tokenizer("tokenizer")

    # --- training ------------------------------------------------------------------------------------------

    def model_inputs(self, batch: Batch) -> tuple[Tensor, Tensor]:
        return batch["images"], batch["tgt"]

    def throughput_counts(self, batch: Batch) -> tuple[int, int]:
        return len(batch["images"]), len(batch["images"])

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        images, texts = self(batch["images"], batch["tgt"])
        model = self.model
        loss, contrasted = contrastive_loss(images, texts, model.scale(), model.logit_bias, model.config.loss)
        if self.contrasted is None:
            self._log_contrasted(contrasted, len(images))
        metrics = {"train/loss": loss, "train/temperature": 1 / model.scale()}
        if model.logit_bias is not None:
            metrics["train/bias"] = model.logit_bias
        self.log_train(metrics)
        return loss

    def _log_contrasted(self, contrasted: int, local: int) -> None:
        """Say once how many images and texts each step contrasts (the global batch), in the log and TensorBoard
        (``train/contrasted_batch``, a column of the HParams tab)."""
        self.contrasted = contrasted
        world = self.trainer.world_size if self._trainer is not None else 1
        rank_zero_info(
            f"contrasting each image against the {contrasted} texts of the global batch "
            f"({local} per process × {world} process{'es' if world > 1 else ''})"
        )
        writer = tensorboard_writer(self) if self._trainer is not None else None
        if writer is not None:
            writer.add_scalar("train/contrasted_batch", contrasted, self.trainer.global_step)

    # --- evaluation ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def encode_texts(self, texts: Sequence[str], batch_size: int = 256) -> Tensor:
        """Unit embeddings ``(len(texts), embed_dim)`` of ``texts``, encoded as the data encodes captions ([BOS] ids
        [EOS], cut to the text tower's positions with EOS kept last)."""
        if self.tokenizer is None:
            raise RuntimeError("this model has no tokenizer: train it on image-text data or load a checkpoint")
        tokenizer, block, pad = self.tokenizer, self.model.config.text.block_size, self.data_facts.pad_id
        found = []
        for start in range(0, len(texts), batch_size):
            ids = tokenizer.encode_batch(list(texts[start : start + batch_size]), add_bos=True, add_eos=True)
            ids = [row if len(row) <= block else [*row[: block - 1], row[-1]] for row in ids]
            tgt = torch.full((len(ids), max(map(len, ids))), pad, dtype=torch.int64)
            for i, row in enumerate(ids):
                tgt[i, : len(row)] = torch.tensor(row)
            found.append(self.model.encode_text(tgt.to(self.device)).float())
        return torch.cat(found) if found else torch.zeros(0, self.model.config.embed_dim, device=self.device)

    def text_positions(self, texts: Sequence[str]) -> list[int]:
        """The positions each text takes in the text tower, BOS and EOS counted (``encode_texts`` keeps the first
        ``text.block_size``, EOS last)."""
        return [len(ids) for ids in self.tokenizer.encode_batch(list(texts), add_bos=True, add_eos=True)]

    @torch.no_grad()
    def class_embeddings(self, names: Sequence[str], templates: Sequence[str] | None = None) -> Tensor:
        """Each class's unit embedding ``(classes, embed_dim)``, as CLIP makes them: its name in every template,
        each prompt's embedding (unit) averaged over the templates, renormalised."""
        templates = list(templates or self.templates)
        prompts = [template.replace("{}", name) for name in names for template in templates]
        embeddings = self.encode_texts(prompts).view(len(names), len(templates), -1)
        return F.normalize(embeddings.mean(1), dim=-1)

    def _evaluate(self, batch: Batch, split: str) -> tuple[Tensor, Tensor]:
        """``split``'s loss (this process's batch against itself) and what its metrics need: the images' embeddings,
        their captions (``references``), their labels where the data has classes, and the embedding of each caption
        string not met yet."""
        images, texts = self(batch["images"], batch["tgt"])
        model = self.model
        scale, bias = model.scale(), model.logit_bias
        per_image = scale * images.float() @ texts.float().T + (0 if bias is None else bias)
        if model.config.loss == "infonce":
            labels = torch.arange(len(images), device=images.device)
            loss = (F.cross_entropy(per_image, labels) + F.cross_entropy(per_image.T, labels)) / 2
        else:
            signs = 2 * torch.eye(len(images), device=images.device) - 1
            loss = -F.logsigmoid(signs * per_image).sum() / len(images)
        self.metrics[f"{split}_loss"].update(loss, weight=len(images))
        kept = self._kept.setdefault(split, {"images": [], "references": [], "labels": [], "captions": {}})
        references = batch.get("references") or [[text] for text in batch["text"]]
        kept["images"].append(images.float().cpu())
        kept["references"] += [list(refs) for refs in references]
        if "labels" in batch:
            kept["labels"].append(batch["labels"].cpu())
        captions = kept["captions"]
        for text, embedding in zip(batch["text"], texts.float().cpu(), strict=True):
            captions.setdefault(text, embedding)
        new = sorted({ref for refs in references for ref in refs} - captions.keys())
        if new:
            captions.update(zip(new, self.encode_texts(new).cpu(), strict=True))
        return images, texts

    def _gathered(self, split: str) -> dict[str, Any]:
        """What every process kept of ``split`` (``_evaluate``), together: the images in rank order, the distinct
        captions."""
        kept = self._kept.pop(split, None) or {"images": [], "references": [], "labels": [], "captions": {}}
        mine = {
            "images": torch.cat(kept["images"]) if kept["images"] else torch.zeros(0, self.model.config.embed_dim),
            "references": kept["references"],
            "labels": torch.cat(kept["labels"]) if kept["labels"] else None,
            "captions": kept["captions"],
        }
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return mine
        parts: list[dict[str, Any]] = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(parts, mine)
        labels = [part["labels"] for part in parts if part["labels"] is not None]
        return {
            "images": torch.cat([part["images"] for part in parts]),
            "references": [refs for part in parts for refs in part["references"]],
            "labels": torch.cat(labels) if len(labels) == len(parts) else None,
            "captions": {text: e for part in parts for text, e in part["captions"].items()},
        }

    def _log_evaluation(self, split: str) -> dict[str, Tensor]:
        """``split``'s loss, retrieval recall@1/5/10 both ways over its images and distinct captions (a caption equal
        to any of an image's counts), and, where the data has classes, zero-shot top-1 (and top-5 over more than 5
        classes) of the images that have one."""
        values = {f"{split}/loss": self.metrics[f"{split}_loss"].compute()}
        self.metrics[f"{split}_loss"].reset()
        found = self._gathered(split)
        images, captions = found["images"].to(self.device), found["captions"]
        if len(images) and captions:
            texts = list(captions)
            index = {text: i for i, text in enumerate(texts)}
            relevant = torch.zeros(len(images), len(texts), dtype=torch.bool)
            for row, refs in enumerate(found["references"]):
                relevant[row, [index[ref] for ref in refs]] = True
            similarities = images @ torch.stack([captions[text] for text in texts]).to(self.device).T
            for name, value in recalls(similarities, relevant.to(self.device)).items():
                values[f"{split}/{name}"] = torch.tensor(value)
            if split == "val":
                self._log_samples(similarities, texts)
        names, labels = self.class_names, found["labels"]
        if names and labels is not None and bool((labels >= 0).any()):
            labelled = labels >= 0
            logits = images[labelled.to(self.device)] @ self.class_embeddings(names).T
            truth = labels[labelled].to(self.device)
            top = logits.topk(min(5, len(names)), dim=1).indices
            values[f"{split}/zero_shot_top1"] = (top[:, 0] == truth).float().mean()
            if len(names) > 5:
                values[f"{split}/zero_shot_top5"] = (top == truth[:, None]).any(1).float().mean()
        self.log_dict(values, prog_bar=split == "val", sync_dist=False)
        return values

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        images, texts = self._evaluate(batch, "val")
        if batch_idx == 0 and self.global_rank == 0:
            n = self.hparams.num_logged_samples
            self._samples = (batch["images"][:n].cpu(), list(batch["text"][:n]))
            self._log_similarity(images, texts, list(batch["text"]))

    def on_validation_epoch_end(self) -> None:
        values = self._log_evaluation("val")
        raise_if_non_finite(self.trainer, "val/loss", values["val/loss"])

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._log_evaluation("test")

    # --- TensorBoard ---------------------------------------------------------------------------------------

    def _log_similarity(self, images: Tensor, texts: Tensor, captions: list[str]) -> None:
        """The cosine similarities of the first validation batch's images and captions as a picture
        (``val/similarity``): a clear diagonal is a model that pairs them."""
        writer = tensorboard_writer(self)
        if writer is None or self.trainer.sanity_checking:
            return
        n = min(len(images), 32)
        similarities = (images[:n].float() @ texts[:n].float().T).cpu()
        title = f"cosine similarity of {n} validation images (rows) and their captions (columns)"
        writer.add_figure("val/similarity", similarity_figure(similarities, captions[:n], title),
                          logging_step(self.trainer))  # fmt: skip

    def _log_samples(self, similarities: Tensor, texts: list[str]) -> None:
        """The first validation images (``num_logged_samples``) and, in a table, each one's caption and its likeliest
        texts among the split's captions, with their probabilities (softmax of the scaled similarities; the
        sigmoid for a sigmoid model)."""
        writer = tensorboard_writer(self)
        if writer is None or self._samples is None or self.trainer.sanity_checking:
            return
        images, captions = self._samples
        step = logging_step(self.trainer)
        rows = ["| image | caption | likeliest texts |", "|---|---|---|"]
        probabilities = self.probabilities(similarities[: len(images)])
        for i, (image, caption) in enumerate(zip(images, captions, strict=True)):
            writer.add_image(f"val/sample_{i}", unnormalised(image, self.data_facts), step)
            values, indices = probabilities[i].topk(min(TOP_TEXTS, len(texts)))
            pairs = zip(values.tolist(), indices.tolist(), strict=True)
            top = ", ".join(f"{markdown_text(texts[j])} ({p:.0%})" for p, j in pairs)
            rows.append(f"| sample_{i} | {markdown_text(caption)} | {top} |")
        writer.add_text("val/top_texts", "\n".join(rows), step)

    # --- the commands' work --------------------------------------------------------------------------------

    def probabilities(self, similarities: Tensor) -> Tensor:
        """Cosine similarities ``(images, candidates)`` → each candidate's probability for each image: the softmax
        of the scaled similarities (InfoNCE), or each one's sigmoid with the bias (sigmoid: candidates are judged
        one by one, as trained)."""
        logits = self.model.scale().float() * similarities.float()
        if self.model.logit_bias is None:
            return logits.softmax(-1)
        return (logits + self.model.logit_bias.float()).sigmoid()

    def image_tensor(self, path: str) -> Tensor:
        """An image file as the model's input ``(C, H, W)``: loaded, fitted to the canvas as in training
        (``image_fit``) and normalised."""
        facts, config = self.data_facts, self.model.config.image
        size = config.image_size
        height, width = (size, size) if isinstance(size, int) else size
        return image_input(path, facts.image_fit or "resize", height, width, config.in_channels, facts.normalize_mean,
                           facts.normalize_std)  # fmt: skip

    @torch.no_grad()
    def encode_image_files(self, paths: Sequence[str], batch_size: int = 32) -> list[Tensor | Exception]:
        """Each image file's unit embedding ``(embed_dim,)``, in order; a file that cannot be read is its error
        instead, and the others are embedded all the same."""
        loaded: list[Tensor | Exception] = []
        for path in paths:
            try:
                loaded.append(self.image_tensor(path))
            except (OSError, ValueError) as error:  # missing, not an image: named, the others go on
                loaded.append(error)
        images = [item for item in loaded if isinstance(item, Tensor)]
        embedded = [self.model.encode_image(torch.stack(images[start : start + batch_size]).to(self.device)).float()
                    for start in range(0, len(images), batch_size)]  # fmt: skip
        found = iter(torch.cat(embedded).cpu() if embedded else [])
        return [item if isinstance(item, Exception) else next(found) for item in loaded]


def check_templates(templates: Sequence[str] | str, option: str) -> tuple[str, ...]:
    """Prompt templates, each holding "{}" (where the class's name goes), at least one; ``ConfigError`` otherwise."""
    templates = (templates,) if isinstance(templates, str) else tuple(templates)
    if not templates:
        raise ConfigError(f"{option} is empty: give at least one prompt template, such as 'a photo of {{}}.'")
    for template in templates:
        if "{}" not in str(template):
            raise ConfigError(
                f"{option}: the template {template!r} has no '{{}}' where the class's name goes; "
                "write it as 'a photo of {}.'"
            )
    return tuple(str(t) for t in templates)


def read_labels(labels: str) -> list[str]:
    """``--labels``: a file of one label a line (blank lines left out), or labels separated by commas."""
    path = Path(labels)
    if "," not in labels and path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"--labels: {labels} is not UTF-8 text; give one label a line in UTF-8") from None
        names = [line.strip() for line in text.splitlines()]
    else:
        names = [name.strip() for name in utf8_text(labels, "--labels").split(",")]
    given = [name for name in names if name]
    names = list(dict.fromkeys(given))  # each label once: copies would split its probability and take --top places
    repeated = [f"{name!r} ({given.count(name)} times)" for name in names if given.count(name) > 1]
    require(
        len(names) >= 2,
        f"--labels={labels!r} gives {len(names)} label(s){' once repeats are left out' * bool(repeated)}: give at "
        "least two, separated by commas ('cat,dog,bird'), or a file of one label a line",
    )
    if repeated:
        warn(f"--labels gives {', '.join(repeated)}: each label is kept once (a copy would split its probability)")
    return names


# --- the commands that take this task's checkpoints alone ---------------------------------------------------


def zero_shot(
    ckpt_path: str | None = None,
    labels: str | None = None,
    images: list[str] | str | None = None,
    top: int = 3,
    prompts: list[str] | str | None = None,
    batch_size: int = 32,
    device: str = "cpu",
) -> None:
    """The likeliest labels of images, by a contrastive model's agreement of image and text.

    Print one line per image, in the order given: its ``top`` likeliest labels and their probabilities (the softmax
    over the labels of the scaled similarities; for a sigmoid model, each label's own sigmoid), with a contrastive
    checkpoint alone. Each label is said to the text tower in every prompt template (averaged, as CLIP does); a label
    given twice is kept once (with a warning).
    A file that is not a readable image prints an empty line (and its reason on standard error), and the others
    are classified all the same; when no image could be read, the command fails (exit status 1).

    Example: ``zero-shot --ckpt_path best.ckpt --labels "cat,dog,bird" --images "photos/*.jpg" --top 2``.

    Args:
        ckpt_path: a checkpoint written by ``fit`` with the contrastive task.
        labels: the labels, separated by commas, or a file of one label a line.
        images: image files (PNG, JPEG, ...) or glob patterns, classified in the order given (a pattern's matches
            sorted); each is fitted to the model's canvas as in training.
        top: how many labels to print per image, likeliest first.
        prompts: prompt templates, "{}" where the label goes (default: the model's ``templates``).
        batch_size: images embedded together.
        device: "cpu", "cuda", "cuda:1", ...
    """
    require(
        ckpt_path is not None and bool(labels) and bool(images),
        "zero-shot needs --ckpt_path CHECKPOINT, --labels 'a,b,...' (or a file) and --images FILE ...",
    )
    require(top >= 1, f"--top={top} must be at least 1")
    require(batch_size >= 1, f"--batch_size={batch_size} must be at least 1")
    templates = check_templates(prompts, "--prompts") if prompts is not None else None
    names = read_labels(str(labels))
    task = load_task(ckpt_path, ContrastiveTask, "zero-shot", device)
    task.eval()
    said = [(name, template.replace("{}", name)) for name in names for template in templates or task.templates]
    check_texts(task.tokenizer, [text for _, text in said], "the prompts'",
                [f"--labels: the prompt {quote(text)} of {quote(name)}" for name, text in said],
                task.text_positions([text for _, text in said]), task.model.config.text.block_size,
                "model.net.text.block_size", cut="end", counted=" with BOS and EOS")  # fmt: skip
    paths = paths_of(images, "--images", "image file", ".png")
    classes = task.class_embeddings(names, templates)
    held: list[tuple[str, Tensor | Exception]] = []  # the unreadable images before the first one read
    for start in range(0, len(paths), batch_size):
        batch = paths[start : start + batch_size]
        answers = held + list(zip(batch, task.encode_image_files(batch, batch_size), strict=True))
        if all(isinstance(answer, Exception) for _, answer in answers):
            held = answers
            continue
        held = []
        unreadable_images(*zip(*answers, strict=True), "zero-shot")
        for path, answer in answers:
            if isinstance(answer, Exception):
                print("", flush=True)
                continue
            probabilities = task.probabilities(answer.to(task.device)[None] @ classes.T)[0]
            values, indices = probabilities.topk(min(top, len(names)))
            ranked = ", ".join(f"{names[i]} ({p:.1%})" for p, i in zip(values.tolist(), indices.tolist(), strict=True))
            print(f"{path}: {ranked}", flush=True)
    if held:
        unreadable_images(*zip(*held, strict=True), "zero-shot")  # none could be read: refused


def embed(
    ckpt_path: str | None = None,
    images: list[str] | str | None = None,
    texts: str | None = None,
    output: str | None = None,
    batch_size: int = 64,
    device: str = "cpu",
) -> None:
    """Unit embeddings of images or texts, for search and clustering.

    Write the embeddings of images (or of texts, one a line) by a contrastive checkpoint alone, as a safetensors
    file: the tensor "embeddings" ``(N, embed_dim)`` of unit rows (an image's and a text's dot product is their
    cosine similarity), and in its metadata "images" or "texts", a JSON list of the files or texts, in the rows'
    order. An image that cannot be read is named on standard error and left out (and out of the list); when none
    could be read, the command fails (exit status 1).

    Example: ``embed --ckpt_path best.ckpt --images "photos/*.jpg" --output photos.safetensors``.

    Args:
        ckpt_path: a checkpoint written by ``fit`` with the contrastive task.
        images: image files or glob patterns (not with ``texts``).
        texts: a UTF-8 file of one text a line (not with ``images``); every line is embedded, a blank one too.
        output: the ``.safetensors`` file to write (its folder is made).
        batch_size: images or texts embedded together.
        device: "cpu", "cuda", "cuda:1", ...
    """
    require(
        ckpt_path is not None and output is not None and (images is not None) != (texts is not None),
        "embed needs --ckpt_path CHECKPOINT, --output FILE.safetensors and one of --images FILE ... or --texts FILE",
    )
    require(
        str(output).endswith(".safetensors"), f"--output={output}: give a .safetensors file, such as out.safetensors"
    )
    require(batch_size >= 1, f"--batch_size={batch_size} must be at least 1")
    from safetensors.torch import save_file

    if texts is not None:
        path = paths_of([texts], "--texts", "text file", ".txt")[0]
        try:
            names = Path(path).read_text(encoding="utf-8").removeprefix("\ufeff").splitlines()
        except UnicodeDecodeError:
            raise ConfigError(f"--texts: {path} is not UTF-8 text; give one text a line in UTF-8") from None
        require(bool(names), f"--texts: {path} is empty; give one text a line")
    task = load_task(ckpt_path, ContrastiveTask, "embed", device)
    task.eval()
    if texts is not None:
        lines = [f"line {number} of --texts {path}" for number in range(1, len(names) + 1)]
        check_texts(task.tokenizer, names, "the texts'", lines, task.text_positions(names),
                    task.model.config.text.block_size, "model.net.text.block_size", cut="end",
                    counted=" with BOS and EOS")  # fmt: skip
        kind, rows = "texts", task.encode_texts(names, batch_size).cpu()
    else:
        kind, paths = "images", paths_of(images, "--images", "image file", ".png")
        answers = task.encode_image_files(paths, batch_size)
        unreadable_images(paths, answers, "embed")
        names = [path for path, answer in zip(paths, answers, strict=True) if isinstance(answer, Tensor)]
        rows = torch.stack([answer for answer in answers if isinstance(answer, Tensor)])
    target = Path(output)
    target.parent.mkdir(parents=True, exist_ok=True)
    save_file({"embeddings": rows.contiguous()}, str(target), metadata={kind: json.dumps(names, ensure_ascii=False)})
    print(f"wrote {target}: {len(names)} {kind[:-1]} embeddings of {rows.shape[1]} dimensions", file=sys.stderr)


register(
    ContrastiveTask,
    data=ImageTextData,
    commands={"zero-shot": zero_shot, "embed": embed},
    list_options={"zero-shot": "--images", "embed": "--images"},
    layouts={"hf": clip.HF},
)
