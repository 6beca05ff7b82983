"""The datasets and collates of image-and-text records, shared by the image-text and conversation families."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from lightformer.data.loading.sampling import Key, index_and_epoch
from lightformer.data.loading.streaming import Records
from lightformer.data.objectives.augment import jitter
from lightformer.data.objectives.chat import IGNORE, ChatTemplate
from lightformer.data.preparation.prepare import worker_tokenizer
from lightformer.data.sources import openclipart
from lightformer.data.sources.conversations import pad_square
from lightformer.data.sources.image_files import fit_image, load_image, to_normalised_tensor

STATS_LINES = 512  # train lines the pixels' mean and standard deviation are measured on


class LineImages(Dataset):
    """A prepared split by index: item i {"image": uint8, "ids": [BOS] + ids + [EOS], "text"}, jittered by the index."""

    mode = "L"

    def __init__(self, split_dir, tokenizer_json: str, augment: bool = False, seed: int = 0) -> None:
        self.records = Records(split_dir)
        self.tokenizer_json = tokenizer_json
        self.augment, self.seed = augment, seed

    def __len__(self) -> int:
        return len(self.records)

    def _item(self, record: dict, index: int, epoch: int) -> dict:
        return self._encoded(record["image"], record["text"], index, epoch)

    def _encoded(self, png: bytes, text: str, index: int, epoch: int) -> dict:
        image = np.asarray(Image.open(io.BytesIO(png)).convert(self.mode))
        if self.augment:
            image = jitter(image, np.random.default_rng(np.random.SeedSequence((self.seed, epoch, index))))
        ids = worker_tokenizer(self.tokenizer_json).encode(text, add_bos=True, add_eos=True)
        pixels = np.atleast_3d(image).transpose(2, 0, 1).copy()  # (H, W[, C]) -> (C, H, W), writable
        return {"image": torch.from_numpy(pixels), "ids": torch.tensor(ids, dtype=torch.int64), "text": text}

    def __getitem__(self, key: Key) -> dict:
        index, epoch = index_and_epoch(key)
        return self._item(self.records[index], index, epoch)

    def __getitems__(self, keys: list[Key]) -> list[dict]:
        pairs = [index_and_epoch(key) for key in keys]
        records = self.records.__getitems__([index for index, _ in pairs])
        return [self._item(record, *pair) for record, pair in zip(records, pairs, strict=True)]


def collate_lines(items: list[dict], mean: float | Sequence[float], std: float | Sequence[float], pad_id: int) -> dict:
    """Items → {"images" normalised, "tgt" padded with ``pad_id``, "text", "references" (the texts scored against)}."""
    if not isinstance(mean, float | int):
        mean, std = (torch.tensor(v, dtype=torch.float32).view(-1, 1, 1) for v in (mean, std))
    images = torch.stack([item["image"] for item in items]).float().div_(255).sub_(mean).div_(std)
    longest = max(len(item["ids"]) for item in items)
    tgt = torch.full((len(items), longest), pad_id, dtype=torch.int64)
    for row, item in enumerate(items):
        tgt[row, : len(item["ids"])] = item["ids"]
    texts = [item["text"] for item in items]
    references = [item.get("references", [text]) for item, text in zip(items, texts, strict=True)]
    return {"images": images, "tgt": tgt, "text": texts, "references": references}


def pixel_statistics(train: Path, count: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Each channel's mean and std of the pixels (on [0, 1]) of ``STATS_LINES`` images spread over a ``train`` split."""
    records = Records(str(train))
    indices = np.unique(np.linspace(0, count - 1, min(count, STATS_LINES)).round().astype(int))
    pixels = np.stack([np.asarray(Image.open(io.BytesIO(records[int(i)]["image"]))) for i in indices])
    pixels = pixels.astype(np.float64) / 255
    if pixels.ndim == 3:  # one channel
        return (round(float(pixels.mean()), 6),), (round(float(pixels.std()), 6),)
    flat = pixels.reshape(-1, pixels.shape[-1])
    return tuple(round(float(v), 6) for v in flat.mean(0)), tuple(round(float(v), 6) for v in flat.std(0))


class CaptionedImages(LineImages):
    """Captioned images: items as ``LineImages``'s with "references" (all its texts), "label" with ``labels``;
    "text" is, with ``cycle`` (training), the image's next text each epoch, else its first."""

    def __init__(self, split_dir, tokenizer_json: str, augment: bool, seed: int, channels: int, cycle: bool,
                 labels: bool = False) -> None:  # fmt: skip
        super().__init__(split_dir, tokenizer_json, augment, seed)
        self.mode, self.cycle, self.labels = ("L" if channels == 1 else "RGB"), cycle, labels

    def _item(self, record: dict, index: int, epoch: int) -> dict:
        texts = json.loads(record["texts"])
        text = texts[(self.seed + epoch + index) % len(texts)] if self.cycle else texts[0]
        item = {**self._encoded(record["image"], text, index, epoch), "references": texts}
        return {**item, "label": int(record["label"])} if self.labels else item


def collate_captions(items: list[dict], mean: Iterable[float], std: Iterable[float], pad_id: int) -> dict:
    """``collate_lines``'s batch, with "labels" (B,) int64 where the items have a "label" (-1: of no class)."""
    batch = collate_lines(items, mean, std, pad_id)
    if "label" in items[0]:
        batch["labels"] = torch.tensor([item["label"] for item in items], dtype=torch.int64)
    return batch


STATS_IMAGES = 512  # training images the pixels' mean and standard deviation are measured on


class QARecords(LineImages):
    """A prepared split by index: item i is a record's image and its chat template's ids and labels (docs/data.md)."""

    mode = "RGB"

    def __init__(self, split_dir, tokenizer_json: str, template: ChatTemplate, augment: bool, seed: int) -> None:
        super().__init__(split_dir, tokenizer_json, augment, seed)
        self.template = template

    def _item(self, record: dict, index: int, epoch: int) -> dict:
        image = np.asarray(Image.open(io.BytesIO(record["image"])).convert("RGB"))
        if self.augment:
            image = jitter(image, np.random.default_rng(np.random.SeedSequence((self.seed, epoch, index))))
        tokenizer = worker_tokenizer(self.tokenizer_json)
        turns = json.loads(record["turns"]) if "turns" in record else [(record["question"], record["answer"])]
        ids, labels = self.template.encode(tokenizer, turns, tokenizer.vocab_size)
        prompt = self.template.prompt(tokenizer, turns[0][0], tokenizer.vocab_size)
        return {"image": torch.from_numpy(image.transpose(2, 0, 1).copy()), "ids": ids, "labels": labels,
                "prompt_length": len(prompt), "group": int(record["group"]), "question": turns[0][0],
                "answer": turns[0][1], "transcript": tokenizer.encode(record.get("text") or "")}  # fmt: skip


def collate_qa(items: list[dict], mean, std, pad_id: int) -> dict:
    """Items of one canvas → the vision-language batch (docs/data.md, "Batches"); "transcript_length" 0: unknown."""
    mean, std = (torch.tensor(v, dtype=torch.float32).view(-1, 1, 1) for v in (mean, std))
    images = torch.stack([item["image"] for item in items]).float().div_(255).sub_(mean).div_(std)
    longest = max(len(item["ids"]) for item in items)
    ids = torch.full((len(items), longest), pad_id, dtype=torch.int64)
    labels = torch.full((len(items), longest), IGNORE, dtype=torch.int64)
    transcripts = [item["transcript"] for item in items]
    transcript = torch.full((len(items), max(1, *map(len, transcripts))), pad_id, dtype=torch.int64)
    for row, item in enumerate(items):
        ids[row, : len(item["ids"])] = torch.tensor(item["ids"])
        labels[row, : len(item["labels"])] = torch.tensor(item["labels"])
        transcript[row, : len(transcripts[row])] = torch.tensor(transcripts[row], dtype=torch.int64)
    return {"images": images, "ids": ids, "labels": labels,
            "prompt_length": torch.tensor([item["prompt_length"] for item in items], dtype=torch.int64),
            "group": torch.tensor([item["group"] for item in items], dtype=torch.int64),
            "answer": [item["answer"] for item in items], "question": [item["question"] for item in items],
            "transcript": transcript,
            "transcript_length": torch.tensor([len(t) for t in transcripts], dtype=torch.int64)}  # fmt: skip


def channel_statistics(split_dir: Path, count: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Each channel's mean and std (pixels on [0, 1]) of ``STATS_IMAGES`` records spread over a split of any canvas."""
    records = Records(str(split_dir))
    total, squares, pixels = np.zeros(3), np.zeros(3), 0
    for i in np.unique(np.linspace(0, count - 1, min(count, STATS_IMAGES)).round().astype(int)):
        image = np.asarray(Image.open(io.BytesIO(records[int(i)]["image"])).convert("RGB"), np.float64) / 255
        total, squares = total + image.sum((0, 1)), squares + (image**2).sum((0, 1))
        pixels += image[..., 0].size
    mean = total / pixels
    std = np.sqrt(np.maximum(squares / pixels - mean**2, 1e-12))
    return tuple(round(float(v), 6) for v in mean), tuple(round(float(v), 6) for v in std)


def image_input(path: str, fit: str, height: int, width: int, channels: int, mean, std) -> torch.Tensor:
    """An image file as a model's input ``(C, H, W)``, fitted as the records are (``fit``), then normalised."""
    if fit == "drawing":
        image = openclipart.drawing_image(path, height, trusted_pixels=None)  # a user's file
    elif fit == "pad":
        image = fit_image(pad_square(load_image(path, 3)), height, width, "resize")
    else:
        image = fit_image(load_image(path, channels), height, width, fit)
    return to_normalised_tensor(mean, std)(image)
