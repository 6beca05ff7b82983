"""What the commands that take a checkpoint alone need, the tasks' own (``generate``, ``translate``, ...) and
``lightformer.commands``' alike: the checkpoint's task rebuilt for the command (``load_task``: another task's
checkpoint refused, naming the command that takes it) and their options' checks (``paths_of``, ``require``,
``check_sampling_options``). It imports none of the tasks' modules (only their base class, for types), so each
of them can import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightformer.checkpoints import CheckpointError, read_checkpoint
from lightformer.errors import ConfigError
from lightformer.files import expand_patterns
from lightformer.generation import check_sampling
from lightformer.registry import built_in, spec_of

if TYPE_CHECKING:
    from lightformer.tasks.base import Task

# Checkpoints written through the Python API before every checkpoint named its task: what they carry names it.
CARRIED_BY = {"tokenizer": "LanguageModelTask", "src_tokenizer": "TranslationTask",
              "image_classification": "ImageClassificationTask"}  # fmt: skip


def task_class_of(checkpoint: dict) -> type[Task] | None:
    """The task class that wrote ``checkpoint`` (its module imported: a task outside lightformer registers itself),
    or None if it was not written by a registered task."""
    class_path = str(checkpoint.get("hyper_parameters", {}).get("_class_path", ""))
    spec = spec_of(class_path) if class_path else None
    if spec is None:
        name = next((task for key, task in CARRIED_BY.items() if key in checkpoint), None)
        spec = built_in().get(name) if name else None
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
    return found.load_from_checkpoint(path, map_location=device, weights_only=True)


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
