"""What the vision-language data modules share once their question-answer records are prepared: records
{"image": PNG, "question", "answer", "group", "text"} (or {"image", "turns": JSON}) read by index and laid out by the
chat template, batches of one canvas (``CanvasBatchSampler``: one small integer per record held, its canvas's index,
read from the manifest's runs), normalised with the training images' mean and standard deviation of each channel.

    records ──decode, jitter (train), ChatTemplate.encode──> {"images": (B, 3, H, W) float32, "ids", "labels",
      "prompt_length", "group", "answer", "question", "transcript"}
"""

from __future__ import annotations

import io
import json
from functools import partial
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lightformer.data.loading.sampling import CanvasBatchSampler, map_loader
from lightformer.data.loading.streaming import Records
from lightformer.data.modules.image_text import ImageTextRecords, LineImages, jitter
from lightformer.data.objectives.chat import IGNORE, ChatTemplate
from lightformer.data.preparation.prepare import split_location, worker_tokenizer
from lightformer.errors import DataError
from lightformer.tokenization.text import PAD_ID

STATS_IMAGES = 512  # training images the pixels' mean and standard deviation are measured on


class QARecords(LineImages):
    """A prepared split by index: item i is {"image": uint8 (3, H, W), "ids", "labels" (int64, the chat template's),
    "prompt_length", "group", "question", "answer" (the first turn's), "transcript" (the ids of the text the image
    shows; none where unknown)}: of a record's question and answer, or of its "turns" (JSON [[question, answer],
    ...]); with ``augment``, the image jittered by draws from (seed, epoch, i)."""

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
    """Items of one canvas → the vision-language batch: "images" (B, 3, H, W) float32 normalised, "ids" right-padded
    with ``pad_id``, "labels" padded with -100, "prompt_length", "group" (int64), "answer", "question", "transcript"
    (B, at least 1) padded with ``pad_id`` and "transcript_length" (0: the image's text is unknown)."""
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
    """Each channel's mean and standard deviation (pixels on [0, 1]) of ``STATS_IMAGES`` records spread evenly over a
    prepared split of ``count`` RGB images of any canvases."""
    records = Records(str(split_dir))
    total, squares, pixels = np.zeros(3), np.zeros(3), 0
    for i in np.unique(np.linspace(0, count - 1, min(count, STATS_IMAGES)).round().astype(int)):
        image = np.asarray(Image.open(io.BytesIO(records[int(i)]["image"])).convert("RGB"), np.float64) / 255
        total, squares = total + image.sum((0, 1)), squares + (image**2).sum((0, 1))
        pixels += image[..., 0].size
    mean = total / pixels
    std = np.sqrt(np.maximum(squares / pixels - mean**2, 1e-12))
    return tuple(round(float(v), 6) for v in mean), tuple(round(float(v), 6) for v in std)


class ChatRecords(ImageTextRecords):
    """A data module of prepared question-answer records: its manifest holds each split's "records", its "runs"
    ([[canvas index, records], ...] in the records' order), the pixels' "mean" and "std"; ``template`` lays them
    out."""

    counted = "records"
    template: ChatTemplate
    tokenizer: object

    def canvases_of(self, split: str) -> np.ndarray:
        """Each record's canvas index (uint8): all a sampler holds per record."""
        runs = self.manifest["runs"][split]
        return np.repeat(np.asarray([c for c, _ in runs], np.uint8), [n for _, n in runs])

    def dataset(self, split: str) -> QARecords:
        """A prepared split's records, its shards checked."""
        if split not in self.datasets:
            if not self.manifest["records"][split]:
                raise DataError(f"data.source: the {split} split holds no record; give it images")
            self.datasets[split] = QARecords(split_location(self.prepared, split), self.tokenizer.to_str(),
                                             self.template, self.augment and split == "train", self.seed)  # fmt: skip
        return self.datasets[split]

    def _dataloader(self, split: str, shuffle: bool = False):
        dataset = self.dataset(split)
        sampler = CanvasBatchSampler(self.canvases_of(split), self.loader.batch_size, shuffle, self.seed,
                                     with_epoch=shuffle)  # fmt: skip
        collate = partial(collate_qa, mean=self.manifest["mean"], std=self.manifest["std"], pad_id=PAD_ID)
        return map_loader(dataset, self.loader, resumable=shuffle, batch_sampler=sampler, collate_fn=collate)
