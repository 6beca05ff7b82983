"""Hugging Face layouts, the parts every family shares: a lightformer model written as a ``transformers`` model folder
(``config.json``, ``model.safetensors``, the tokenizer, a model card) that ``AutoModel*.from_pretrained`` loads, and
such a folder read back under lightformer's names (``model.init.checkpoint=DIR``).

Each family's layout (its config mapping and weight renaming, both directions) lives beside the others in
``lightformer.io.layouts`` (GPT-2 / Llama, BERT, ViT, Marian), and each task declares the layouts of its model with its
registration (``lightformer.registry``: ``Layout``, ``HFReader``); this module writes and reads the folder, whatever the
family: a family gives ``hf_layout`` the function that builds its ``transformers`` model and converted weights, and
a folder is read by the registered reader of its ``config.json``'s ``model_type``.

A shape that no layout fits is refused (``ConfigError``, ``refuse_shape``) naming the ``model.net`` fields to change
and what each layout needs; a folder whose ``config.json`` asks for what lightformer lacks is refused naming that field.

Activations: our "gelu" is the exact (erf) GELU, HF's "gelu"; our "gelu_tanh" is HF's "gelu_new".
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor, nn

from lightformer.errors import ConfigError
from lightformer.registry import HFReader, Layout, hf_readers

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")

# Our pointwise activations ↔ HF's ACT2FN names (import also takes HF's other name of the tanh approximation).
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
FROM_HF_ACTIVATIONS = {**{hf: ours for ours, hf in HF_ACTIVATIONS.items()}, "gelu_pytorch_tanh": "gelu_tanh"}


class ExportedTask(Protocol):
    """What every export reads of a task (a ``lightformer.tasks.base.Task``, which this module, below the tasks, does
    not import): its model and its hyperparameters; a family's layout reads what its task has besides (tokenizer,
    class names, data facts)."""

    model: nn.Module
    hparams: Mapping[str, Any]


def misfits(config: Any, needs: dict[str, tuple]) -> list[str]:
    """The fields of ``config`` whose values ``needs`` does not allow, as "field=value"."""
    return [f"{name}={getattr(config, name)!r}" for name, ok in needs.items() if getattr(config, name) not in ok]


def _describe(needs: dict[str, tuple]) -> str:
    return ", ".join(f"{name}={'|'.join(str(v).lower() if isinstance(v, bool) else str(v) for v in ok)}"
                     for name, ok in needs.items())  # fmt: skip


def refuse_shape(kind: str, config: Any, layouts: dict[str, dict[str, tuple]], hf_classes: Mapping[str, str]) -> None:
    """``ConfigError`` for a ``kind`` model whose shape no layout of ``layouts`` fits: the fields to change for the
    nearest one, and what each layout needs (``hf_classes``: a layout's name → its ``transformers`` class)."""
    wrong = {name: misfits(config, needs) for name, needs in layouts.items()}
    nearest = min(wrong, key=lambda name: len(wrong[name]))
    change = ", ".join(f"model.net.{m.split('=')[0]} (now {m.split('=', 1)[1]})" for m in wrong[nearest])
    fit = "; ".join(f"{hf_classes.get(name, name)}: {_describe(needs)}" for name, needs in layouts.items())
    raise ConfigError(
        f"--layout hf: this {kind}'s shape fits no Hugging Face layout. Change {change} for the "
        f"{hf_classes.get(nearest, nearest)} layout. The layouts that fit a {kind} (model.net fields): {fit}"
    )


def hf_activation(config: dict, model: str) -> str:
    """Our activation of a ``config.json``'s ``hidden_act`` (``model`` names the model in the error)."""
    activation = config.get("hidden_act", "gelu")
    if activation not in FROM_HF_ACTIVATIONS:
        raise ConfigError(f"{model} hidden_act={activation!r} has no lightformer counterpart "
                          f"(lightformer has {', '.join(FROM_HF_ACTIVATIONS)})")  # fmt: skip
    return activation


# --- export ------------------------------------------------------------------------------------------------


@dataclass
class HFModel:
    """What a family's layout builds of a task: the ``transformers`` model, the converted weights it loads strictly,
    the model card's code to load it (``DIR`` for the folder), and what else the folder holds."""

    model: PreTrainedModel
    weights: dict[str, Tensor]
    usage: str
    tokenizer: Any = None  # a PreTrainedTokenizerFast (``fast_tokenizer``)
    processor: Any = None  # an image processor


def special_ids(tokenizer: Any) -> dict[str, int]:
    return {"bos": tokenizer.bos_id, "eos": tokenizer.eos_id, "pad": tokenizer.pad_id}


def config_ids(config: PretrainedConfig) -> dict[str, int]:
    return {k: getattr(config, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}


def fast_tokenizer(tokenizer: Any, frame: Callable[[Any, Any], dict[str, Any]] | None = None) -> Any:
    """Our ``tokenizer`` as a ``PreTrainedTokenizerFast`` with its special tokens named; ``frame(raw, tokenizer)``
    sets the raw ``tokenizers.Tokenizer``'s post-processor as the data frames a text, and returns the roles it adds."""
    from tokenizers import Tokenizer as RawTokenizer
    from transformers import PreTrainedTokenizerFast

    from lightformer.tokenization.text import BOS, EOS, PAD, UNK

    raw = RawTokenizer.from_str(tokenizer.to_str())
    roles = dict(bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK)
    if frame is not None:
        roles |= frame(raw, tokenizer)
    return PreTrainedTokenizerFast(tokenizer_object=raw, **roles)


def safetensors_metadata(task: ExportedTask) -> dict[str, str]:
    """The metadata of an exported safetensors file: the task and its hyperparameters (JSON), from which the model
    is rebuilt (what travels with the model, such as the tokenizer, is in them)."""
    hparams = {k: v for k, v in task.hparams.items() if not k.startswith("_")}  # data_facts: an old one's too
    return {"format": "pt", "lightformer.task": type(task).__name__,
            "lightformer.hyper_parameters": json.dumps(hparams)}  # fmt: skip


def usual_mode() -> int:
    """The mode the process's umask gives a new file (0644 under umask 022)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def give_usual_mode(path: str | Path) -> None:
    """Give ``path`` the mode of a file this process opens: ``safetensors`` writes its files 0600 whatever the umask,
    so an export's weights would be unreadable to the others who read the rest of the folder."""
    os.chmod(path, usual_mode())


def _output_folder(output: str) -> Path:
    folder = Path(output)
    if folder.is_file():
        raise ConfigError(f"--output: {output} is a file; --layout hf writes a folder (config.json, model.safetensors, "
                          "tokenizer, README.md): give a new or empty folder")  # fmt: skip
    if folder.is_dir() and any(folder.iterdir()):
        raise ConfigError(f"--output: the folder {output} is not empty; give a new or empty folder")
    return folder


def hf_layout(build: Callable[[Any], HFModel], applies_to: str, reads: Mapping[str, HFReader] | None = None) -> Layout:
    """The ``hf`` layout of a family: ``export --layout hf`` writes the folder of what ``build(task)`` gives
    (``export_hf``); ``reads``: the ``model_type`` of each folder that starts this family's model."""
    return Layout(partial(export_hf, build=build), applies_to, folder=True, reads=dict(reads or {}))


def export_hf(
    task: ExportedTask, ckpt_path: str, checkpoint: dict, output: str, *, build: Callable[[Any], HFModel]
) -> str:
    """Write ``task``'s model in its Hugging Face layout (``build``) to the folder ``output`` (config.json,
    model.safetensors, generation_config.json, the tokenizer, README.md); returns a one-line description. The HF model
    is built from the converted config and loads the converted weights strictly (nothing missing, nothing
    unexpected)."""
    folder = _output_folder(output)
    built = build(task)
    model = built.model
    model.load_state_dict(built.weights, strict=True)
    staging = folder.with_name(f"{folder.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        model.save_pretrained(staging)
        for weights in staging.glob("*.safetensors"):
            give_usual_mode(weights)
        if built.tokenizer is not None:
            built.tokenizer.save_pretrained(staging)
        if built.processor is not None:
            built.processor.save_pretrained(staging)
        (staging / "README.md").write_text(model_card(task, ckpt_path, checkpoint, model, built.usage, folder, staging))
        if folder.is_dir():
            folder.rmdir()  # empty: checked above
        staging.replace(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    name = type(task).__name__
    return f"wrote {folder}/ ({type(model).__name__}, {model.num_parameters():,} parameters, from {name} {ckpt_path})"


def _plain(value: Any, longest: int = 200) -> Any:
    """Hyperparameters for the model card: long strings (a tokenizer's JSON) shortened."""
    if isinstance(value, dict):
        return {k: _plain(v, longest) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, longest) for v in value]
    if isinstance(value, str) and len(value) > longest:
        return f"<{len(value):,} characters>"
    return value


def run_config(ckpt_path: str) -> Path | None:
    """The ``config.yaml`` LightningCLI wrote in the run folder of ``ckpt_path`` (its folder or the one above)."""
    for folder in Path(ckpt_path).resolve().parents[:2]:
        if (folder / "config.yaml").is_file():
            return folder / "config.yaml"
    return None


def model_card(
    task: ExportedTask, ckpt_path: str, checkpoint: dict, model: PreTrainedModel, usage: str, folder: Path,
    staging: Path,
) -> str:  # fmt: skip
    """README.md of an exported folder (being written in ``staging``): what was trained, how (the run's config.yaml
    copied beside it), its final metrics, and how to load it."""
    from lightformer import __version__

    hparams = {k: v for k, v in task.hparams.items() if not k.startswith("_")}
    metrics = []
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if str(key).startswith("ModelCheckpoint") and isinstance(state, dict) and state.get("monitor"):
            score = state.get("best_model_score")
            if score is not None:
                metrics.append(f"- best {state['monitor']}: {float(score):.4g} ({state.get('best_model_path', '')})")
            current = state.get("current_score")
            if current is not None:
                metrics.append(f"- {state['monitor']} at this checkpoint: {float(current):.4g}")
            if score is None and current is None:
                metrics.append(f"- {state['monitor']}: not measured by this checkpoint's step")
    config = run_config(ckpt_path)
    if config is not None:  # the run's config travels with the weights
        shutil.copyfile(config, staging / "lightformer_config.yaml")
    command = ("python -m lightformer fit --config lightformer_config.yaml (the run's config, in this folder)"
               if config else "python -m lightformer fit --config <the run's config.yaml>")  # fmt: skip
    lines = [
        "---", "library_name: transformers", "tags: [lightformer]", "---", "",
        f"# {folder.name}", "",
        f"A lightformer `{type(task).__name__}` exported as `{type(model).__name__}` by lightformer {__version__}:",
        f"`lightformer export --ckpt_path {ckpt_path} --layout hf --output {folder}`.", "",
        "## Training", "",
        f"- task: `{type(task).__module__}.{type(task).__name__}`",
        f"- global step {checkpoint.get('global_step', '?')}, epoch {checkpoint.get('epoch', '?')}",
        f"- command: `{command}`", "",
        "## Final metrics", "", *(metrics or ["- none recorded in the checkpoint"]), "",
        "## How to load it", "", "```python", usage.replace("DIR", str(folder)), "```", "",
        "## Hyperparameters (the checkpoint's)", "", "```json", json.dumps(_plain(hparams), indent=2, default=str),
        "```", "",
    ]  # fmt: skip
    return "\n".join(lines)


# --- import ------------------------------------------------------------------------------------------------


def is_hf_folder(path: str) -> bool:
    """Whether ``path`` is a Hugging Face model folder: config.json and a weights file."""
    folder = Path(path)
    return (folder / "config.json").is_file() and any((folder / name).is_file() for name in WEIGHT_FILES)


def read_hf_config(path: str) -> dict:
    return json.loads((Path(path) / "config.json").read_text())


def read_hf_state_dict(path: str) -> dict[str, Tensor]:
    """The tensors of a Hugging Face model folder (safetensors, sharded safetensors, or pytorch_model.bin loaded
    with ``weights_only``)."""
    from safetensors.torch import load_file

    folder = Path(path)
    if (folder / "model.safetensors").is_file():
        return load_file(folder / "model.safetensors")
    if (folder / "model.safetensors.index.json").is_file():
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        weights: dict[str, Tensor] = {}
        for shard in sorted(set(index["weight_map"].values())):
            weights.update(load_file(folder / shard))
        return weights
    return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)


def hf_folder_to_lightformer(path: str, option: str = "model.init.checkpoint") -> dict[str, Tensor]:
    """The weights of a Hugging Face model folder under lightformer's names, by the reader that a registered task's
    layout declares for its ``model_type`` (GPT-2, Llama, BERT, ViT, Marian: ``lightformer.io.layouts``)."""
    config = read_hf_config(path)
    kind = config.get("model_type")
    readers = hf_readers()
    if kind not in readers:
        raise ConfigError(f"{option}: {path} holds a Hugging Face {kind!r} model; lightformer reads "
                          f"{', '.join(readers)} folders")  # fmt: skip
    try:
        readers[kind].net_fields(config)  # refuse a shape lightformer cannot build, by name
        return readers[kind].weights(read_hf_state_dict(path), config)
    except ConfigError as error:
        raise ConfigError(f"{option}: {path}: {error}") from None
    except (KeyError, ValueError) as error:
        raise ConfigError(f"{option}: {path} is not a {kind} model folder lightformer reads ({error})") from None


def net_from_hf_folder(path: str, net_class: type) -> dict[str, Any]:
    """The ``model.net`` fields (of ``net_class``) that a Hugging Face folder's config.json gives; {} for a model
    of another kind than ``net_class``'s."""
    config = read_hf_config(path)
    reader = hf_readers().get(config.get("model_type"))
    if reader is None or reader.net is not net_class:
        return {}
    names = {f.name for f in fields(net_class)}
    try:
        return {k: v for k, v in reader.net_fields(config).items() if k in names}
    except ConfigError as error:
        raise ConfigError(f"model.init.checkpoint: {path}: {error}") from None
