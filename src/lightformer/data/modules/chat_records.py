"""What the vision-language data modules share once their question-answer records are prepared: records
{"image": PNG, "question", "answer", "group", "text"} (or {"image", "turns": JSON}) read by index and laid out by the
chat template, batches of one canvas (``CanvasBatchSampler``: one small integer per record held, its canvas's index,
read from the manifest's runs), normalised with the training images' mean and standard deviation of each channel.

    records ──decode, jitter (train), ChatTemplate.encode──> {"images": (B, 3, H, W) float32, "ids", "labels",
      "prompt_length", "group", "answer", "question", "transcript"}
"""

from __future__ import annotations

from functools import partial

import numpy as np

from lightformer.data.loading.pictures import QARecords, collate_qa
from lightformer.data.loading.sampling import CanvasBatchSampler, map_loader
from lightformer.data.modules.image_text import ImageTextRecords
from lightformer.data.objectives.chat import ChatTemplate
from lightformer.data.preparation.prepare import split_location
from lightformer.errors import DataError
from lightformer.tokenization.text import PAD_ID


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
