"""``DataFacts``: everything the data tells the model, the one contract between a data module and a task.

A data module returns its facts from ``data_facts()`` once its data is prepared (``lightformer.data.DataModule``).
The command line hands them to the task as its ``data_facts`` argument (one argument link, ``cli/main.py``); the task
sizes its model from them (``Task.sizes_from_data``), stores them in its hyperparameters, so that a checkpoint
rebuilds its model and its tokenizers with no data, and at set-up compares them with the data it is given in one
check that names each fact that differs (``DataFacts.check_same``).

The facts are plain values (strings, numbers, tuples, a dict of lists): checkpoints load with
``torch.load(weights_only=True)``. A tokenizer travels as its JSON; a palette as ``PixelTokenizer.to_dict()``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from lightformer.errors import CheckpointError

TOKENIZERS = ("tokenizer", "src_tokenizer", "tgt_tokenizer")


@dataclass(frozen=True)
class DataFacts:
    """What the data tells the model. A fact the data has not is None.

    Args:
        tokenizer: the text tokenizer's JSON (language model, masked LM, text classification).
        src_tokenizer: a translator's source tokenizer (JSON); the same as ``tgt_tokenizer`` for a joint vocabulary.
        tgt_tokenizer: a translator's target tokenizer (JSON).
        palette: an Image GPT's pixel palette (``PixelTokenizer.to_dict()``).
        vocab_size: ids of the tokenizer or palette (the model's embedding and output size).
        src_vocab_size: ids of the source tokenizer.
        tgt_vocab_size: ids of the target tokenizer.
        pad_id: the id that pads a batch (masked out of attention).
        class_names: the classes, in the order of the classifier's outputs.
        image_size: side length of square images, or (height, width) of rectangular ones (a text line's).
        in_channels: channels of the images (1 grey, 3 colour).
        normalize_mean: per-channel mean the images are normalised with.
        normalize_std: per-channel standard deviation the images are normalised with.
        image_fit: how an image of another size is brought to ``image_size`` when a model reads it: "line" (a text
            line: scaled to the height, at most the width, at the left on its own background), "resize" (stretched
            to the size, as a photo) or "drawing" (transparent parts on white, cropped to its ink, scaled to fit and
            centred on white: ``raw.openclipart.drawing_image``, the clip art's and the emoji's way); None: the task's
            way (an image classifier resizes, image to text fits a line).
        max_length: the longest sequence of an example (tokens or pixels): the model's positions must hold it.
            Not compared between data and checkpoint: a model evaluates shorter examples than it was trained on.
        length_multiple: the batches' lengths are multiples of this (a few shapes: a compiled model compiles each
            static); None: any length. Not compared: it says how the batches are padded, not what they mean.
        chat_template: a vision-language model's chat template (``data.objectives.chat.ChatTemplate.as_dict()``):
            how an image, a question and an answer are laid out in ids; the model answers in that layout only.
        groups: the names of the groups a batch's "group" indexes ("clipart/category/held-out", ...). Not compared:
            they say how evaluation is broken down, not what the data means.
        canvases: for each kind of image (an ``image_fit`` name: "drawing", "line", ...), the [height, width] its
            images are fitted to; ``image_size`` and ``image_fit`` are the default kind's.
    """

    tokenizer: str | None = None
    src_tokenizer: str | None = None
    tgt_tokenizer: str | None = None
    palette: dict[str, Any] | None = None
    vocab_size: int | None = None
    src_vocab_size: int | None = None
    tgt_vocab_size: int | None = None
    pad_id: int | None = None
    class_names: tuple[str, ...] | None = None
    image_size: int | tuple[int, int] | None = None
    in_channels: int | None = None
    normalize_mean: tuple[float, ...] | None = None
    normalize_std: tuple[float, ...] | None = None
    image_fit: str | None = None
    max_length: int | None = field(default=None, compare=False)
    length_multiple: int | None = field(default=None, compare=False)
    chat_template: dict[str, str] | None = None
    groups: tuple[str, ...] | None = field(default=None, compare=False)
    canvases: dict[str, list[int]] | None = None

    def __post_init__(self) -> None:  # lists (YAML, a checkpoint's hyperparameters) become tuples
        for name in ("class_names", "normalize_mean", "normalize_std", "image_size", "groups"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        if self.canvases is not None:
            object.__setattr__(self, "canvases", {kind: [int(v) for v in hw] for kind, hw in self.canvases.items()})

    @property
    def num_classes(self) -> int | None:
        return len(self.class_names) if self.class_names is not None else None

    def differences(self, data: DataFacts) -> list[str]:
        """What ``data``'s facts say otherwise than these (a model's): one line per fact, empty when they agree.
        Tokenizers agree when they map the same tokens to the same ids, whatever their JSON's formatting."""
        from lightformer.tokenization.text import Tokenizer

        found = []
        for item in dataclasses.fields(self):
            mine, theirs = getattr(self, item.name), getattr(data, item.name)
            if not item.compare or mine == theirs or mine is None or theirs is None:
                continue
            if item.name in TOKENIZERS:
                saved, given = (Tokenizer.from_str(text, source=item.name) for text in (mine, theirs))
                difference = saved.difference(given)
                if difference is not None:
                    found.append(f"{item.name}: {difference}")
            elif item.name == "palette":
                found.append("palette: another palette of colours (dataset, image_size, palette, levels or seed)")
            elif not _close(mine, theirs):
                found.append(f"{item.name}: {_short(mine)} vs {_short(theirs)}")
        return found

    def check_same(self, data: DataFacts) -> None:
        """Refuse data whose facts differ from these, which a checkpoint's model was trained with: naming each."""
        found = self.differences(data)
        if found:
            raise CheckpointError(
                "the data differs from what the checkpoint's model was trained with (the checkpoint's model vs the "
                "data: " + "; ".join(found) + "), "
                "so its ids, classes or pixels would mean other things to the model; use the data settings and "
                "tokenizer the model was trained with (data.tokenizer.file=<run dir>/tokenizer.json keeps a tokenizer)"
            )

    def as_dict(self) -> dict[str, Any]:
        """Plain values (tuples as lists), as hyperparameters and exports store them."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def of(cls, value: DataFacts | dict[str, Any] | None) -> DataFacts | None:
        """Facts from themselves or from the dict a checkpoint stores; None stays None."""
        if value is None or isinstance(value, DataFacts):
            return value
        known = {item.name for item in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in dict(value).items() if k in known})


def _close(mine: Any, theirs: Any) -> bool:
    """Equal, floats within float32 rounding: a normalisation computed on another machine (another number of threads
    sums the pixels in another order) is the same normalisation."""
    if isinstance(mine, tuple) and isinstance(theirs, tuple) and len(mine) == len(theirs):
        return all(_close(a, b) for a, b in zip(mine, theirs, strict=True))
    if isinstance(mine, float) and isinstance(theirs, float):
        return math.isclose(mine, theirs, rel_tol=1e-5, abs_tol=1e-7)
    return mine == theirs


def _short(value: Any) -> str:
    text = repr(list(value) if isinstance(value, tuple) else value)
    return text if len(text) <= 120 else text[:117] + "..."
