"""Checkpoint operations: read a checkpoint safely, start a model from another run's weights (fine-tuning), average
checkpoints, the data's facts and tokenizer a checkpoint carries (also one written before checkpoints stored its
facts). This module knows checkpoints, not the tasks that write them: loading a task for a command, and
exporting its model, are ``lightformer.cli.commands``'.

A checkpoint written by ``fit`` is self-contained: the task's class and hyperparameters (so the model is rebuilt
with its shape), and what its data module taught it (tokenizers, class names, image normalisation). Every load is
``torch.load(weights_only=True)``: tensors, numbers, strings and containers of them, never code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from lightformer.errors import CheckpointError, ConfigError
from lightformer.facts import DataFacts
from lightformer.io.files import atomic_open
from lightformer.nn.checks import check_at_least
from lightformer.tokenization.text import Tokenizer
from lightformer.tokenization.vocabulary import TOKENIZER_FILES, Vocabulary, folder_vocabulary

TRAINING_STATE = ("optimizer_states", "lr_schedulers", "callbacks", "loops")


HF_FOLDER = (
    "a Hugging Face model folder holds config.json and its weights (model.safetensors, or "
    "model.safetensors.index.json with its shards, or pytorch_model.bin)"
)


def require_file(path: str, what: str) -> None:
    """Raise ``CheckpointError`` naming the option and the path when a local file is missing; a folder given to
    ``model.init`` is told what a folder it loads holds, and which of it is missing."""
    if "://" in path:  # a remote checkpoint (s3://, https://...): Lightning's fsspec reports its own errors
        return
    if Path(path).is_dir() and what.startswith("model.init"):
        from lightformer.io.hf_layouts import WEIGHT_FILES

        missing = (
            "config.json"
            if not (Path(path) / "config.json").is_file()
            else f"a weights file ({', '.join(WEIGHT_FILES)})"
        )
        raise CheckpointError(
            f"{what.partition(':')[0]}: the folder {path!r} has no {missing}, so it cannot be loaded: {HF_FOLDER}; "
            "or give a checkpoint file (.ckpt, .safetensors)"
        )
    if not Path(path).is_file():
        raise CheckpointError(f"{what} {path!r} {'is a folder' if Path(path).is_dir() else 'does not exist'}")


def safetensors_header(path: str | Path, option: str) -> dict:
    """The header of the safetensors file ``path`` (its tensors' dtypes, shapes and offsets), after checking that the
    file holds every byte the header promises; ``CheckpointError`` naming ``option`` and the file when it is cut
    short (a download or copy that stopped early) or no safetensors file at all."""
    size = Path(path).stat().st_size
    again = "download or copy it again"
    with open(path, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else None
        if length is None or 8 + length > size:
            if length is not None and length > 100_000_000:  # no header is that long: not safetensors
                raise CheckpointError(f"{option}: {path} is not a safetensors file (its first 8 bytes are no header)")
            raise CheckpointError(
                f"{option}: {path} is cut short: {size} bytes, less than its header alone "
                f"({'8 + ' + str(length) if length is not None else 8} bytes); {again}"
            )
        try:
            header = json.loads(f.read(length))
            end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError):
            raise CheckpointError(f"{option}: {path} is not a safetensors file (its header is not one)") from None
    if 8 + length + end > size:
        raise CheckpointError(
            f"{option}: {path} is cut short: {size:,} bytes of the {8 + length + end:,} its header promises (a "
            f"download or copy that stopped early?); {again}"
        )
    return header


# The embedding tables of the Hugging Face models lightformer loads: their rows are the vocabulary.
HF_EMBEDDINGS = ("wte.weight", "embed_tokens.weight", "word_embeddings.weight", "shared.weight")


def check_hf_folder(path: str, option: str) -> None:
    """Refuse a Hugging Face model folder whose safetensors weights are cut short (``safetensors_header``), or
    whose config.json's ``vocab_size`` is not the number of rows of its weights' embedding table."""
    folder = Path(path)
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif index.is_file():
        files = [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    else:
        return  # pytorch_model.bin: read_checkpoint's errors name it
    shapes = {}
    for file in files:
        require_file(str(file), f"{option}: the weights file")
        shapes.update({k: v.get("shape") for k, v in safetensors_header(file, option).items() if k != "__metadata__"})
    config = json.loads((folder / "config.json").read_text())
    rows = {name: shape[0] for name, shape in shapes.items() if name.endswith(HF_EMBEDDINGS) and shape}
    name = next(iter(sorted(rows)), None)
    if name is not None and isinstance(config.get("vocab_size"), int) and config["vocab_size"] != rows[name]:
        raise CheckpointError(
            f"{option}: {path}: config.json says vocab_size={config['vocab_size']}, but its weights' embedding table "
            f"{name} has {rows[name]} rows: the folder's config and weights do not belong together; set vocab_size "
            f"to {rows[name]} in config.json if these weights are the ones meant, or give the folder its own weights"
        )


def read_checkpoint(path: str, option: str = "--ckpt_path") -> dict:
    """The checkpoint at ``path`` (memory-mapped: reading its header costs little), or ``CheckpointError``."""
    require_file(path, f"{option}: the checkpoint file")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # torch raises pickle, zip and weights_only errors of many kinds, some of many lines
        reason = str(error).strip().split("\n", 1)[0]
        raise CheckpointError(f"{option}: {path} is not a readable lightformer checkpoint ({reason})") from None


@dataclass(frozen=True)
class InitConfig:
    """Start a task's model from another run's weights: pretraining, then fine-tuning (``model.init``).

    Args:
        checkpoint: a lightformer run's ``.ckpt`` or ``export``, HF BERT / GPT-2 or timm ViT safetensors, or a
            Hugging Face model folder (GPT-2, Llama, BERT, ViT, Marian; its config.json gives the shape). The
            parameters whose name and shape match load; the rest (a new head) start fresh. Not loaded on resuming.
        freeze: modules (paths as in ``model.named_parameters()``, e.g. "bert.embed", "bert.encoder.layers.0")
            whose weights stay as loaded. A parameter is under a path if its name is the path or continues it after
            a dot: "bert.encoder.layers.1" is not "bert.encoder.layers.10".
        skip: modules (paths as for ``freeze``) whose weights are not loaded: they keep their fresh initialisation,
            like a new head (e.g. "bert.encoder.layers.3": re-initialise the top layer, the one a pretraining
            objective specialises most; Zhang et al., "Revisiting Few-sample BERT Fine-tuning", 2021).
        pretrained_lr_scale: the learning rate of the loaded parameters relative to the new ones (e.g. 0.1: the
            pretrained encoder moves ten times more slowly than the new head).
        strict: refuse a start that loads no tensor, or that leaves a parameter fresh because the checkpoint's
            tensor of that name has another shape (name such modules in ``skip``, or set false to load what fits).
        modules: a module's path → a checkpoint (as ``checkpoint`` takes) whose model starts that module, e.g.
            {"decoder": "<a language model's run>.ckpt", "encoder": "<timm ViT>.safetensors"} (image to text).
    """

    checkpoint: str | None = None
    freeze: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    pretrained_lr_scale: float = 1.0
    strict: bool = True
    modules: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, empty in (("freeze", ()), ("skip", ()), ("modules", {})):
            if getattr(self, name) is None:  # null (``--model.init.modules null``): none, as [] or {} says
                object.__setattr__(self, name, empty)
        if not isinstance(self.strict, bool):
            raise ValueError(f"strict={self.strict}: give true (refuse a start that leaves tensors fresh) or false")
        if self.pretrained_lr_scale is None:
            raise ValueError("pretrained_lr_scale=None: give a number, at least 0 (1.0: the loaded weights learn at "
                             "the rate of the new ones)")  # fmt: skip
        check_at_least("pretrained_lr_scale", self.pretrained_lr_scale, 0.0)
        for path, file in self.modules.items():
            if not path or path.startswith(".") or path.endswith(".") or not file:
                raise ConfigError(
                    f"model.init.modules: {{{path!r}: {file!r}}} must map a module's path (e.g. 'decoder', "
                    "'encoder.layers.0') to a checkpoint file"
                )

    def sources(self) -> list[tuple[str, str, str]]:
        """Each start: (the module its weights go under, "" for the whole model; the checkpoint; its option)."""
        whole = [("", self.checkpoint, "model.init.checkpoint")] if self.checkpoint else []
        return whole + [(path, file, f"model.init.modules.{path}") for path, file in self.modules.items()]

    def describe(self) -> str:
        """The start in the words of a config: "model.init.checkpoint X, model.init.modules.decoder Y"."""
        return ", ".join(f"{option} {file}" for _, file, option in self.sources())


def pretrained_weights(path: str, option: str = "model.init.checkpoint") -> dict[str, Tensor]:
    """The model weights in ``path`` (the file ``option`` names), under lightformer's names: the model of a run's
    checkpoint (without the task's ``model.`` prefix), a lightformer export, Hugging Face BERT / GPT-2 or timm ViT
    weights, or a Hugging Face model folder (config.json and its weights: GPT-2, Llama, BERT, ViT, Marian;
    ``lightformer.io.hf_layouts``)."""
    from lightformer.io.hf_layouts import hf_folder_to_lightformer, is_hf_folder

    if is_hf_folder(path):
        check_hf_folder(path, option)
        return hf_folder_to_lightformer(path, option)
    require_file(path, f"{option}: the file")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        safetensors_header(path, option)
        weights = load_file(path)
    else:
        checkpoint = read_checkpoint(path, option)
        weights = checkpoint.get("state_dict", checkpoint)
        weights = {k.removeprefix("model."): v for k, v in weights.items() if isinstance(v, Tensor)}
    if any(k.startswith(("bert.embeddings.", "embeddings.word_embeddings")) for k in weights):
        from lightformer.models.bert import bert_state_dict_to_lightformer

        return bert_state_dict_to_lightformer(weights)
    if any(k.startswith(("transformer.h.", "h.0.")) for k in weights):
        from lightformer.models.gpt import gpt2_state_dict_to_lightformer

        return gpt2_state_dict_to_lightformer(weights)
    if any(k.startswith("blocks.") for k in weights):
        from lightformer.models.vit import timm_to_lightformer

        return timm_to_lightformer(weights)
    return weights


def under(name: str, path: str) -> bool:
    """Whether parameter ``name`` belongs to the module at ``path`` ("a.b" holds "a.b.w", not "a.bc.w")."""
    return name == path or name.startswith(f"{path}.")


def match_weights(state: dict[str, Tensor], weights: dict[str, Tensor]) -> dict[str, list[str]]:
    """What loading ``weights`` into a model of ``state`` (its ``state_dict()``) does, by name and shape: the names
    ``loaded``, ``new`` (in the model, not loaded), ``dropped`` (in the weights, not loaded) and ``reshaped`` (those
    of ``dropped`` that the model has with another shape)."""
    loaded = [name for name, value in weights.items() if name in state and state[name].shape == value.shape]
    taken = set(loaded)
    return {
        "loaded": loaded,
        "new": [name for name in state if name not in taken],
        "dropped": [name for name in weights if name not in taken],
        "reshaped": [name for name in weights if name in state and name not in taken],
    }


@torch.no_grad()
def load_matching(model: nn.Module, weights: dict[str, Tensor]) -> dict[str, list[str]]:
    """Copy into ``model`` each of ``weights`` whose name and shape match one of its parameters or buffers; returns
    what it did (``match_weights``)."""
    report = match_weights(model.state_dict(), weights)
    model.load_state_dict({name: weights[name] for name in report["loaded"]}, strict=False)
    return report


def module_names(names: list[str], most: int = 6) -> str:
    """The modules ``names`` (tensor names) belong to, two levels up, for one line: "bert.embed, head.weight"."""
    tops = sorted({name.rsplit(".", 2)[0] if name.count(".") > 1 else name for name in names})
    return ", ".join(tops[:most]) + (f" (+{len(tops) - most} more)" if len(tops) > most else "")


def describe_loading(report: dict[str, list[str]], source: str) -> str:
    """The one line a run prints about what it took from ``source``."""
    counts = {key: len(value) for key, value in report.items()}
    line = f"initialised from {source}: loaded {counts['loaded']} tensors"
    line += f"; new {counts['new']} ({module_names(report['new'])})" if report["new"] else "; nothing new"
    if report["dropped"]:
        line += f"; dropped {counts['dropped']} ({module_names(report['dropped'])})"
        line += f", {counts['reshaped']} of them for their shape" if report.get("reshaped") else ""
    else:
        line += "; nothing dropped"
    return line


def check_start(
    report: dict[str, list[str]], model: dict[str, torch.Size], weights: dict[str, torch.Size], init: InitConfig
) -> None:
    """Refuse (``ConfigError``) the start from ``init.checkpoint`` that ``report`` (``match_weights`` of the model's
    state and the weights, whose shapes ``model`` and ``weights`` hold) describes, when it is probably not the one
    meant and ``init.strict`` is on: nothing loaded, or a tensor left out for its shape (``InitConfig.strict`` says
    why). The message says what matched and what did not, and what to change."""
    if not init.strict or (report["loaded"] and not report["reshaped"]):
        return
    start = init.describe()
    summary = describe_loading(report, start).removeprefix(f"initialised from {start}: ")
    if not report["loaded"]:
        raise ConfigError(
            f"{start}: no tensor of it fits this model, so the run would start from "
            f"scratch ({summary}). Start from a checkpoint of this kind of model (a model of the same names "
            "and sizes), or set model.init.strict=false to train anyway"
        )
    name = max(report["reshaped"], key=lambda name: len(weights[name]))  # a matrix shows both sizes
    modules = sorted({name.rsplit(".", 1)[0] for name in report["reshaped"]})
    skip = f"model.init.skip=[{', '.join(modules)}]" if len(modules) <= 4 else "model.init.skip"
    raise ConfigError(
        f"{start}: {len(report['reshaped'])} of its tensors have another shape than "
        f"this model's, so those parameters would stay fresh (e.g. {name}: {list(weights[name])} in the "
        f"checkpoint, {list(model[name])} in the model; {summary}). Build the model with the checkpoint's sizes "
        f"(model.net), or keep those modules fresh on purpose with {skip}, or set model.init.strict=false to load "
        "what fits"
    )


def average(paths: list[str], output: str, last: int | None = None) -> str:
    """Write the mean of the model weights of ``paths`` (the ``last`` ones by global step, if given) to ``output``,
    as the Transformer paper averages its last checkpoints; returns a one-line description."""
    if not paths:
        raise CheckpointError("--ckpt_paths: no checkpoint file given")
    if last is not None and last < 1:
        raise CheckpointError(f"--last={last} must be at least 1")
    checkpoints = sorted(
        ((path, read_checkpoint(path, "--ckpt_paths")) for path in paths),
        key=lambda item: item[1].get("global_step", 0),
    )
    if last is not None:
        checkpoints = checkpoints[-last:]
    first_path, reference = checkpoints[0]
    shapes = {name: tensor.shape for name, tensor in reference["state_dict"].items()}
    for path, checkpoint in checkpoints[1:]:
        other = {name: tensor.shape for name, tensor in checkpoint["state_dict"].items()}
        if other != shapes:
            differing = sorted(set(other.items()) ^ set(shapes.items()))[:3]
            raise CheckpointError(f"{path} does not hold the same model as {first_path}: {differing} differ")
    averaged = dict(checkpoints[-1][1])  # the latest checkpoint's hyperparameters, tokenizers, step
    averaged["state_dict"] = {}
    for name, tensor in reference["state_dict"].items():
        if tensor.is_floating_point():
            total = sum(checkpoint["state_dict"][name].double() for _, checkpoint in checkpoints)
            averaged["state_dict"][name] = (total / len(checkpoints)).to(tensor.dtype)
        else:  # integer buffers (counters): the latest value
            averaged["state_dict"][name] = checkpoints[-1][1]["state_dict"][name]
    for key in TRAINING_STATE:
        averaged.pop(key, None)
    averaged["averaged_checkpoints"] = [path for path, _ in checkpoints]
    with atomic_open(output) as f:
        torch.save(averaged, f)
    steps = ", ".join(str(checkpoint.get("global_step", "?")) for _, checkpoint in checkpoints)
    return f"wrote {output}: the mean of {len(checkpoints)} checkpoints (global steps {steps})"


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
        from lightformer.tokenization.pixels import PixelTokenizer

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
    return Tokenizer.from_str(tokenizer_json, source="the checkpoint's tokenizer").vocab_size


def checkpoint_tokenizer(path: str, option: str = "model.init.checkpoint") -> Tokenizer | None:
    """The lightformer tokenizer a run's checkpoint (``.ckpt``: its facts) or a lightformer export (``.safetensors``:
    the hyperparameters in its metadata, or an older export's "lightformer.tokenizer") carries; None: it carries
    none (Hugging Face or timm weights, an image model)."""
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


def start_vocabulary(path: str, option: str = "model.init.checkpoint") -> tuple[Vocabulary | None, Path | None]:
    """The vocabulary a start's weights were trained with, whatever made it, and the lightformer tokenizer file that
    encodes data with it (None where there is none): a run's checkpoint or export (its tokenizer; the run's
    ``tokenizer.json`` beside its ``checkpoints/``), or a Hugging Face folder's tokenizer files of any kind (its
    ``tokenizer.json`` where it is lightformer's, as our exports write it). (None, None): no tokenizer there."""
    folder = Path(path)
    if folder.is_dir():
        file = folder / "tokenizer.json"
        try:
            return Tokenizer.from_file(file).vocabulary(), file
        except (FileNotFoundError, ValueError):  # none, or another library's: read as it is below
            pass
        try:
            return folder_vocabulary(folder), None
        except ValueError as error:
            raise CheckpointError(f"{option} {path}: {error}") from None
    saved = checkpoint_tokenizer(path, option)
    run_file = folder.parent.parent / "tokenizer.json"  # beside a run's checkpoints/ folder
    in_a_run = folder.parent.name == "checkpoints" and run_file.is_file()
    return (saved.vocabulary() if saved else None), (run_file if in_a_run else None)


def check_start_tokenizer(path: str, option: str, data_tokenizer: str) -> None:
    """Refuse to start from the checkpoint or folder ``path`` (the one ``option`` names) on data encoded with another
    tokenizer (JSON) than the one its weights were trained with, whatever that tokenizer's kind: the data's ids would
    stand for other tokens in its weights. A Hugging Face folder with no tokenizer file is started with a warning
    (nothing to compare)."""
    if "://" in path:  # a remote checkpoint: not read twice
        return
    saved, tokenizer_file = start_vocabulary(path, option)
    data = Tokenizer.from_str(data_tokenizer, source="the data's tokenizer").vocabulary()
    if saved is None:
        if Path(path).is_dir():
            rank_zero_warn(
                f"{option} {path} holds no tokenizer ({', '.join(TOKENIZER_FILES)}): lightformer cannot check that "
                "its token weights were trained on the ids of the data's tokenizer"
            )
        return
    difference = saved.difference(data)
    if difference is None:
        return
    if tokenizer_file is not None or not Path(path).is_dir():
        suggested = tokenizer_file or "<that run's tokenizer.json>"
        remedy = f"encode the data with that tokenizer: data.init_args.tokenizer.file={suggested}"
    else:
        remedy = (
            "lightformer's data is encoded with lightformer's own tokenizers (char, bpe) only, so this folder's "
            "token weights cannot start a model on it: start from a lightformer run, export or Hugging Face export "
            "whose tokenizer is the data's"
        )
    raise CheckpointError(
        f"{option} {path} was trained with another tokenizer than the data's (checkpoint vs data: {difference}), so "
        f"the ids of this data would stand for other tokens in the loaded weights; {remedy}"
    )
