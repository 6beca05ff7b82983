"""What the commands that need a checkpoint alone (no config, no data) share: ``load_task`` rebuilds a task from its
checkpoint for a command, refusing another task's checkpoint by naming the command that takes it, and the options'
checks. Each task registers its own commands beside its class (``lightformer.registry``: ``generate``,
``translate``, ``classify``, ``fill-mask``, ``sample-images``, ``probe``); the two that take any task's checkpoint are
here: ``export`` writes weights to safetensors and ``average`` averages a run's last checkpoints.

Each is a function whose keyword arguments are its options (``jsonargparse.auto_cli`` reads them with their types
and docstrings), so it runs the same from Python; a bad option raises ``ConfigError`` naming it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from lightformer import checkpoints
from lightformer.checkpoints import CheckpointError, read_checkpoint
from lightformer.errors import ConfigError, DataError
from lightformer.files import expand_patterns, not_utf8
from lightformer.generation import check_sampling
from lightformer.hf_layouts import give_usual_mode, safetensors_metadata
from lightformer.registry import built_in, layout_holders, spec_of

if TYPE_CHECKING:
    from lightformer.tasks.base import Task


def task_class_of(checkpoint: dict) -> type[Task] | None:
    """The task class that wrote ``checkpoint`` (its module imported: a task outside lightformer registers itself),
    or None if it was not written by a registered task."""
    class_path = str(checkpoint.get("hyper_parameters", {}).get("_class_path", ""))
    spec = spec_of(class_path) if class_path else None
    if spec is None:  # written through the Python API before every checkpoint named its task: what it carries does
        spec = next((spec for spec in built_in().values() if any(key in checkpoint for key in spec.carried)), None)
    return spec.task if spec is not None else None


def load_task(path: str, expected: type[Task], command: str, device: str = "cpu") -> Task:
    """The ``expected`` task rebuilt from the checkpoint at ``path``, on ``device``, for ``command``; a checkpoint of
    another task is refused, naming the command that takes it."""
    found = task_class_of(read_checkpoint(path))
    if found is not expected:
        spec = built_in().get(found.__name__) if found is not None else None
        other = f" (use `lightformer {next(iter(spec.commands))}`)" if spec is not None and spec.commands else ""
        written_by = f"a {found.__name__} checkpoint{other}" if found else "not written by a lightformer task"
        raise CheckpointError(
            f"--ckpt_path: {path} is {written_by}; `lightformer {command}` needs a {expected.__name__} one"
        )
    check_device(device)
    return found.load_from_checkpoint(path, map_location=device, weights_only=True)


def available_devices() -> list[str]:
    """The devices this machine has for ``--device``: "cpu", then each CUDA device, then "mps" where there is one."""
    found = ["cpu", *(f"cuda:{index}" for index in range(torch.cuda.device_count()))]
    return found + (["mps"] if torch.backends.mps.is_available() else [])


def check_device(device: str) -> None:
    """Refuse (``ConfigError``) a ``--device`` that is not one, or that this machine lacks, naming the ones it has."""
    try:
        wanted = torch.device(device)
    except RuntimeError:
        raise ConfigError(
            f"--device={device!r} is not a device: give cpu, cuda, cuda:1, mps, ... (here: "
            f"{', '.join(available_devices())})"
        ) from None
    if wanted.type == "cpu":
        return
    have = available_devices()
    if wanted.type == "cuda" and torch.cuda.is_available() and (wanted.index or 0) < torch.cuda.device_count():
        return
    if wanted.type == "mps" and "mps" in have:
        return
    kind = "CUDA" if wanted.type == "cuda" else wanted.type
    none = f"no {kind} device is available" if not any(d.startswith(wanted.type) for d in have) else "no such device"
    raise ConfigError(f"--device={device}: {none} on this machine; the devices here: {', '.join(have)}")


def utf8_text(text: str, option: str) -> str:
    """``text`` that ``option`` gave (the command line or standard input), refused (``ConfigError``) naming the byte
    and its line when it is not UTF-8: Python keeps such bytes of the command line as lone surrogates, which no
    tokenizer takes."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as error:  # a lone surrogate given from Python, not a byte of the command line
        raise ConfigError(
            f"{option} holds a lone surrogate (U+{ord(text[error.start]):04X}) at character {error.start}, which is "
            "not text: give it as UTF-8 text"
        ) from None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(str(not_utf8(option, data, error, line=data.count(b"\n", 0, error.start) + 1))) from None
    return text


def read_stdin(option: str = "standard input") -> str:
    """Standard input as UTF-8 text, or ``ConfigError`` naming the byte that is not, its line and a conversion."""
    stream = getattr(sys.stdin, "buffer", None)
    data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as error:
        raise ConfigError(str(not_utf8(option, data, error, line=data.count(b"\n", 0, error.start) + 1))) from None


def unreadable_images(paths: Sequence[str], answers: Sequence[object], command: str) -> None:
    """The one rule of the commands that take many images: each answer that is an error (an image that cannot be
    read) is named on standard error, the others are answered in order by the command; when no image could be read,
    ``DataError`` naming them (a script must not take an empty answer for a reading)."""
    failed = [(path, answer) for path, answer in zip(paths, answers, strict=True) if isinstance(answer, Exception)]
    if failed and len(failed) == len(paths):
        if len(failed) == 1:
            raise DataError(f"--images: {failed[0][1]}")
        reasons = "; ".join(str(error) for _, error in failed[:3]) + ("; ..." if len(failed) > 3 else "")
        raise DataError(f"--images: none of the {len(paths)} images could be read: {reasons}")
    for path, error in failed:
        print(f"{command}: {path}: {error}", file=sys.stderr)


def paths_of(patterns: list[str] | str, option: str, noun: str, suffix: str) -> list[str]:
    """The files that an option's paths and glob patterns name (``files.expand_patterns``), or ``ConfigError``."""
    try:
        return [str(path) for path in expand_patterns(patterns, option, noun, suffix)]
    except OSError as error:  # a missing file, a folder, a pattern that matches nothing
        raise ConfigError(str(error)) from None


def require(condition: bool, message: str) -> None:
    """``ConfigError(message)`` unless ``condition``: an option's check."""
    if not condition:
        raise ConfigError(message)


def check_sampling_options(temperature: float, top_k: int | None, top_p: float | None) -> None:
    try:
        check_sampling(temperature, top_k, top_p)
    except ValueError as error:
        raise ConfigError(f"--{error}") from None


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
    writes a folder that ``transformers``' ``from_pretrained`` loads (``lightformer.layouts``: GPT-2 or Llama for a
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
