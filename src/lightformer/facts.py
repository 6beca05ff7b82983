"""``DataFacts``: everything the data tells the model, the one contract between a data module and a task.

A data module returns its facts from ``data_facts()`` once its data is prepared (``lightformer.data.DataModule``).
The command line hands them to the task as its ``data_facts`` argument (one argument link, ``cli.py``); the task
sizes its model from them (``Task.sizes_from_data``), stores them in its hyperparameters, so that a checkpoint
rebuilds its model and its tokenizers with no data, and at set-up compares them with the data it is given in one
check that names each fact that differs (``DataFacts.check_same``).

The facts are plain values (strings, numbers, tuples, a dict of lists): checkpoints load with
``torch.load(weights_only=True)``. A tokenizer travels as its JSON; a palette as ``PixelTokenizer.to_dict()``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightformer.checkpoints import CheckpointError

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
            line: scaled to the height, at most the width, at the left on its own background) or "resize" (stretched
            to the size, as a photo); None: the task's way (an image classifier resizes, image to text fits a line).
        max_length: the longest sequence of an example (tokens or pixels): the model's positions must hold it.
            Not compared between data and checkpoint: a model evaluates shorter examples than it was trained on.
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

    def __post_init__(self) -> None:  # lists (YAML, a checkpoint's hyperparameters) become tuples
        for name in ("class_names", "normalize_mean", "normalize_std", "image_size"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    @property
    def num_classes(self) -> int | None:
        return len(self.class_names) if self.class_names is not None else None

    def differences(self, data: DataFacts) -> list[str]:
        """What ``data``'s facts say otherwise than these (a model's): one line per fact, empty when they agree.
        Tokenizers agree when they map the same tokens to the same ids, whatever their JSON's formatting."""
        from lightformer.data.preparation.tokenizers import Tokenizer

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


def facts_of_checkpoint(checkpoint: dict[str, Any]) -> DataFacts | None:
    """The facts a checkpoint's model was trained with: its hyperparameters' ``data_facts``, or for a checkpoint
    written before they existed (up to commit 51eef69), the same facts read from the keys it stored them under
    ("tokenizer", "src_tokenizer" and "tgt_tokenizer", "pixel_tokenizer", "image_classification",
    "text_classification") and from its model's sizes (``hyper_parameters["net"]``). None: it holds none."""
    hparams = checkpoint.get("hyper_parameters") or {}
    if hparams.get("data_facts") is not None:
        return DataFacts.of(hparams["data_facts"])
    net = dict(hparams.get("net") or {})
    facts: dict[str, Any] = {}
    if isinstance(checkpoint.get("tokenizer"), str):
        facts["tokenizer"] = checkpoint["tokenizer"]
        facts["vocab_size"] = _vocab_size(checkpoint["tokenizer"])
    for side in ("src", "tgt"):
        if isinstance(checkpoint.get(f"{side}_tokenizer"), str):
            facts[f"{side}_tokenizer"] = checkpoint[f"{side}_tokenizer"]
            facts[f"{side}_vocab_size"] = _vocab_size(checkpoint[f"{side}_tokenizer"])
    if isinstance(checkpoint.get("pixel_tokenizer"), dict):
        from lightformer.data.objectives.pixels import PixelTokenizer

        facts["palette"] = checkpoint["pixel_tokenizer"]
        facts["vocab_size"] = PixelTokenizer.from_dict(checkpoint["pixel_tokenizer"]).vocab_size
    images = checkpoint.get("image_classification") or {}
    for name in ("class_names", "normalize_mean", "normalize_std", "image_size", "in_channels"):
        if images.get(name) is not None:
            facts[name] = images[name]
    texts = checkpoint.get("text_classification") or {}
    if texts.get("class_names"):
        facts["class_names"] = texts["class_names"]
    if texts.get("max_tokens"):
        facts["max_length"] = texts["max_tokens"]
    if "block_size" in net and ("tokenizer" in facts or "palette" in facts):
        facts.setdefault("max_length", net["block_size"])
    if net.get("pad_id") is not None and facts:
        facts["pad_id"] = net["pad_id"]
    return DataFacts(**facts) if facts else None


def _vocab_size(tokenizer_json: str) -> int:
    from lightformer.data.preparation.tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json, source="the checkpoint's tokenizer").vocab_size


def checkpoint_tokenizer(path: str, option: str = "model.init.checkpoint"):
    """The tokenizer (a ``Tokenizer``) a run's checkpoint (``.ckpt``: its facts) or a lightformer export
    (``.safetensors``: the hyperparameters in its metadata, or an older export's "lightformer.tokenizer") carries, or
    None (no tokenizer there: Hugging Face weights, an image model)."""
    from lightformer.checkpoints import read_checkpoint
    from lightformer.data.preparation.tokenizers import Tokenizer

    if Path(path).is_dir():  # a Hugging Face model folder (``export --layout hf``): its tokenizer.json, if ours
        file = Path(path) / "tokenizer.json"
        try:
            return Tokenizer.from_file(file) if file.is_file() else None
        except ValueError:  # another vocabulary layout (GPT-2's, BERT's WordPiece): nothing lightformer encodes with
            return None
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, framework="pt") as weights:
            metadata = weights.metadata() or {}
        hparams = json.loads(metadata.get("lightformer.hyper_parameters", "{}"))
        stored = (hparams.get("data_facts") or {}).get("tokenizer") or metadata.get("lightformer.tokenizer")
    else:
        facts = facts_of_checkpoint(read_checkpoint(path, option))
        stored = facts.tokenizer if facts is not None else None
    return Tokenizer.from_str(stored, source=f"the tokenizer of {path}") if isinstance(stored, str) else None


def check_start_tokenizer(path: str, option: str, data_tokenizer: str) -> None:
    """Refuse to start from the checkpoint ``path`` (the one ``option`` names) on data encoded with another tokenizer
    (JSON) than the one it was trained with: the data's ids would stand for other tokens in its weights."""
    if "://" in path:  # a remote checkpoint: not read twice
        return
    from lightformer.data.preparation.tokenizers import Tokenizer

    saved = checkpoint_tokenizer(path, option)
    difference = saved.difference(Tokenizer.from_str(data_tokenizer, source="the data's tokenizer")) if saved else None
    if difference is None:
        return
    run_file = Path(path).parent.parent / "tokenizer.json"  # beside a run's checkpoints/ folder
    in_a_run = Path(path).parent.name == "checkpoints" and run_file.is_file()
    suggested = run_file if in_a_run else "<that run's tokenizer.json>"
    raise CheckpointError(
        f"{option} {path} was trained with another tokenizer than the data's (checkpoint vs data: {difference}), so "
        f"the ids of this data would stand for other tokens in the loaded weights; encode the data with that run's "
        f"tokenizer: data.init_args.tokenizer.file={suggested}"
    )
