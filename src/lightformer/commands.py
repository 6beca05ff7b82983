"""The commands that take any task's checkpoint alone (no config, no data): ``export`` writes weights to safetensors
and ``average`` averages a run's last checkpoints; and the list of every checkpoint command, each task's own
(``lightformer.registry``: ``generate``, ``translate``, ``classify``, ``fill-mask``, ``sample-images``, ``probe``)
with these two. What they all share (``load_task``, the options' checks) is ``lightformer.command_support``,
which the tasks' modules import; this module imports the tasks, and names those helpers too.

Each is a function whose keyword arguments are its options (``jsonargparse.auto_cli`` reads them with their types
and docstrings), so it runs the same from Python; a bad option raises ``ConfigError`` naming it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import lightformer.tasks  # noqa: F401  (registers lightformer's own tasks, whose commands are listed here)
from lightformer import checkpoints
from lightformer.checkpoints import CheckpointError, read_checkpoint
from lightformer.command_support import (  # noqa: F401  (re-exported: a task of one's own may take them here)
    CARRIED_BY,
    check_sampling_options,
    load_task,
    paths_of,
    require,
    task_class_of,
)
from lightformer.errors import ConfigError
from lightformer.files import atomic_write_bytes
from lightformer.registry import built_in


def output_file(path: str, example: str) -> Path:
    """The file ``--output`` names, its folder made if missing (before any work: a typo in the folder fails fast, not
    after minutes); a folder is refused, with ``example`` as the kind of file to give."""
    output = Path(path)
    if output.is_dir():
        raise ConfigError(f"--output: {path} is a folder; give the file to write in it, such as {output / example}")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"--output: the folder {output.parent} cannot be made ({error.strerror})") from None
    return output


def export(*, ckpt_path: str, output: str, layout: Literal["lightformer", "timm", "hf"] = "lightformer") -> None:
    """A model's weights to safetensors (also in timm's layout), or a Hugging Face model folder.

    Write a checkpoint's model weights to a safetensors file (no pickle: safe to share and to load).

    The file's metadata holds the task, its hyperparameters (JSON) and what travels with the model (tokenizer
    JSON, image preprocessing), so the model can be rebuilt; ``safetensors.torch.load_model(task.model, path)``
    loads the weights back (tied weights are stored once). ``layout="timm"`` writes a vision model under timm's
    ``VisionTransformer`` names instead, for ``timm.create_model(...).load_state_dict(load_file(path))``.
    ``layout="hf"`` writes a folder that ``transformers``' ``from_pretrained`` loads (``lightformer.hf_layouts``:
    GPT-2 or Llama for a language model, BERT, ViT, Marian), with the tokenizer and a model card.

    Args:
        ckpt_path: a checkpoint written by ``fit`` with any lightformer task.
        output: the ``.safetensors`` file to write (atomically); for ``hf``, a new or empty folder.
        layout: "lightformer" (our parameter names), "timm" (image classification only) or "hf" (Hugging Face).
    """
    from safetensors.torch import save, save_model

    from lightformer.models.vit import lightformer_to_timm

    if layout != "hf":
        output_file(output, "model.safetensors")
    checkpoint = read_checkpoint(ckpt_path)
    task_class = task_class_of(checkpoint)
    if task_class is None:
        raise CheckpointError(f"{ckpt_path} was not written by a lightformer task (tasks: {', '.join(built_in())})")
    name = task_class.__name__
    if layout == "timm" and name != "ImageClassificationTask":
        raise CheckpointError(f"--layout timm applies to image classification, not to a {name} checkpoint")
    task = load_task(ckpt_path, task_class, "export")
    if layout == "hf":
        from lightformer.hf_layouts import export_hf

        print(export_hf(task, ckpt_path, checkpoint, output))
        return
    hparams = {k: v for k, v in task.hparams.items() if not k.startswith("_")}  # data_facts: an old one's too
    metadata = {"format": "pt", "lightformer.task": name, "lightformer.hyper_parameters": json.dumps(hparams)}
    if layout == "timm":
        tensors = {k: v.contiguous() for k, v in lightformer_to_timm(task.model.state_dict()).items()}
        atomic_write_bytes(output, save(tensors, metadata))
    else:
        staging = Path(f"{output}.partial")
        try:
            save_model(task.model, str(staging), metadata)  # stores tied weights once
            staging.replace(output)
        finally:
            staging.unlink(missing_ok=True)
    print(f"wrote {output} ({name}, {sum(p.numel() for p in task.model.parameters()):,} parameters)")


def average(*, ckpt_paths: list[str] | str, output: str, last: int | None = None) -> None:
    """The mean of a run's last checkpoints.

    Average the model weights of checkpoints of one run, as "Attention Is All You Need" averages its last
    checkpoints (fairseq's ``average_checkpoints.py``): the mean of nearby weights usually scores better than
    each. The result evaluates, translates, generates and exports like any checkpoint (``test --ckpt_path``);
    it has no optimizer state, so it cannot resume training.

    Example: ``average --ckpt_paths "runs/ding_de_en/version_0/checkpoints/step=*.ckpt" --last 5 --output avg.ckpt``

    Args:
        ckpt_paths: checkpoint files or glob patterns (quote them), all of one model shape.
        output: the averaged checkpoint to write (atomically).
        last: average only the ``last`` checkpoints with the highest global step.
    """
    paths = sorted(set(paths_of(ckpt_paths, "--ckpt_paths", "checkpoint file", ".ckpt")))
    if not paths:
        raise ConfigError("--ckpt_paths: no checkpoint file given")
    output_file(output, "averaged.ckpt")
    print(checkpoints.average(paths, output, last))


# The commands that take any task's checkpoint (each task registers its own: ``lightformer.registry``).
COMMANDS = {"export": export, "average": average}


def checkpoint_commands() -> dict[str, tuple[Callable, str | None]]:
    """The commands that take a checkpoint alone: every registered task's (``lightformer.registry``), then
    ``export`` and ``average``; each with its option that takes several values, if any."""
    found = {
        name: (run, spec.list_options.get(name)) for spec in built_in().values() for name, run in spec.commands.items()
    }
    lists = {"average": "--ckpt_paths"}
    return found | {name: (run, lists.get(name)) for name, run in COMMANDS.items()}


def task_command(name: str, args: list[str]) -> tuple[Callable, str | None] | None:
    """The command ``name`` of a task outside lightformer, registered by its module, which the ``_class_path`` of the
    checkpoint that ``--ckpt_path`` names imports; None: no such command."""
    ckpt_path = next((arg.partition("=")[2] for arg in args if arg.startswith("--ckpt_path=")), None)
    if ckpt_path is None and "--ckpt_path" in args[:-1]:
        ckpt_path = args[args.index("--ckpt_path") + 1]
    if ckpt_path is None or not Path(ckpt_path).is_file():
        return None
    found = task_class_of(read_checkpoint(ckpt_path))
    spec = built_in().get(found.__name__) if found is not None else None
    if spec is None or name not in spec.commands:
        return None
    return spec.commands[name], spec.list_options.get(name)
