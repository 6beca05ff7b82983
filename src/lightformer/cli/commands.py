"""What the commands that need a checkpoint alone (no config, no data) share: ``load_task`` rebuilds a task from its
checkpoint for a command, refusing another task's checkpoint by naming the command that takes it, and the options'
checks. Each task registers its own commands beside its class (``lightformer.registry``: ``generate``,
``translate``, ``classify``, ``fill-mask``, ``sample-images``, ``probe``); the two that take any task's checkpoint are
here: ``export`` writes weights to safetensors and ``average`` averages a run's last checkpoints.

Each is a function whose keyword arguments are its options (``jsonargparse.auto_cli`` reads them with their types
and docstrings), so it runs the same from Python; a bad option raises ``ConfigError`` naming it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import lightformer.tasks  # noqa: F401  (registers lightformer's own tasks, whose commands are listed here)
from lightformer.errors import CheckpointError, ConfigError
from lightformer.io import checkpoints
from lightformer.io.checkpoints import read_checkpoint
from lightformer.io.hf_layouts import give_usual_mode, safetensors_metadata
from lightformer.registry import built_in, layout_holders
from lightformer.tasks.command_support import (  # noqa: F401  (re-exported: a task of one's own may take them here)
    check_sampling_options,
    load_task,
    paths_of,
    require,
    task_class_of,
)


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


def export(*, ckpt_path: str, output: str, layout: str = "lightformer") -> None:
    """A model's weights to safetensors (also in timm's layout), or a Hugging Face model folder.

    Write a checkpoint's model weights to a safetensors file (no pickle: safe to share and to load).

    The file's metadata holds the task, its hyperparameters (JSON) and what travels with the model (tokenizer
    JSON, image preprocessing), so the model can be rebuilt; ``safetensors.torch.load_model(task.model, path)``
    loads the weights back (tied weights are stored once). Each task declares the other layouts of its model with
    its registration (``lightformer.registry.Layout``): ``layout="timm"`` writes a vision model under timm's
    ``VisionTransformer`` names, for ``timm.create_model(...).load_state_dict(load_file(path))``; ``layout="hf"``
    writes a folder that ``transformers``' ``from_pretrained`` loads (``lightformer.io.layouts``: GPT-2 or Llama for a
    language model, BERT, ViT, Marian), with the tokenizer and a model card.

    Args:
        ckpt_path: a checkpoint written by ``fit`` with any lightformer task.
        output: the ``.safetensors`` file to write (atomically); for ``hf``, a new or empty folder.
        layout: "lightformer" (our parameter names), or one the checkpoint's task declares: "timm" (image
            classification), "hf" (Hugging Face).
    """
    from safetensors.torch import save_model

    holders = layout_holders(layout) if layout != "lightformer" else []
    if not any(held.folder for _, held in holders):
        output_file(output, "model.safetensors")
    checkpoint = read_checkpoint(ckpt_path)
    task_class = task_class_of(checkpoint)
    if task_class is None:
        raise CheckpointError(f"{ckpt_path} was not written by a lightformer task (tasks: {', '.join(built_in())})")
    name = task_class.__name__
    spec = next(spec for spec in built_in().values() if spec.task is task_class)
    if layout != "lightformer" and layout not in spec.layouts:
        own = ", ".join(["lightformer", *spec.layouts])
        if not holders:
            raise ConfigError(f"--layout {layout}: no task has this layout; a {name} checkpoint's: {own}")
        fits = ", ".join(dict.fromkeys(held.applies_to for _, held in holders))
        raise CheckpointError(f"--layout {layout} applies to {fits}, not to a {name} checkpoint (its layouts: {own})")
    task = load_task(ckpt_path, task_class, "export")
    if layout != "lightformer":
        print(spec.layouts[layout].write(task, ckpt_path, checkpoint, output))
        return
    staging = Path(f"{output}.partial")
    try:
        save_model(task.model, str(staging), safetensors_metadata(task))  # stores tied weights once
        give_usual_mode(staging)
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


def checkpoint_commands() -> dict[str, tuple[Callable, str | tuple[str, ...] | None]]:
    """The commands that take a checkpoint alone: every registered task's (``lightformer.registry``), then
    ``export`` and ``average``; each with its option that takes several values, if any."""
    found = {
        name: (run, spec.list_options.get(name)) for spec in built_in().values() for name, run in spec.commands.items()
    }
    lists = {"average": "--ckpt_paths"}
    return found | {name: (run, lists.get(name)) for name, run in COMMANDS.items()}


def task_command(name: str, args: list[str]) -> tuple[Callable, str | tuple[str, ...] | None] | None:
    """The command ``name`` of a task outside lightformer, registered by its module, which the ``_class_path`` of the
    checkpoint that ``--ckpt_path`` names imports; None: no such command. The command's function (whose signature
    ``auto_cli`` parses the rest by) is known only from the checkpoint, so ``--ckpt_path`` alone is read first, as
    argparse reads it."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("--ckpt_path")
    try:
        ckpt_path = parser.parse_known_args(args)[0].ckpt_path
    except argparse.ArgumentError:  # the option without its value: auto_cli says so
        return None
    if ckpt_path is None or not Path(ckpt_path).is_file():
        return None
    found = task_class_of(read_checkpoint(ckpt_path))
    spec = built_in().get(found.__name__) if found is not None else None
    if spec is None or name not in spec.commands:
        return None
    return spec.commands[name], spec.list_options.get(name)
