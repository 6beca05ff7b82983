"""What the commands that take a checkpoint alone need, the tasks' own (``generate``, ``translate``, ``read``, ...)
and ``lightformer.cli.commands``' alike: the checkpoint's task rebuilt for the command on a device this machine has
(``load_task``: another task's checkpoint refused, naming the command that takes it), their options' checks
(``paths_of``, ``require``, ``check_sampling_options``, ``utf8_text``, ``read_stdin``), their warnings (``warn``: one
line on standard error), the one rule of the commands over texts (``check_texts``: characters outside the vocabulary
named, a text longer than the model's positions refused or cut with a warning) and the one rule of the commands that
take many images (``unreadable_images``). It imports none of the tasks' modules (only their base class, for types),
so each of them can import it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from lightformer.errors import CheckpointError, ConfigError, DataError
from lightformer.generation import check_sampling
from lightformer.io.checkpoints import read_checkpoint
from lightformer.io.files import expand_patterns, not_utf8
from lightformer.registry import built_in, spec_of

if TYPE_CHECKING:
    from lightformer.tasks.base import Task
    from lightformer.tokenization.text import Tokenizer

SHOWN = 10  # the texts a warning names one by one; the others are counted


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


def warn(message: str) -> None:
    """A command's warning: one line on standard error, after "warning: "; the command goes on."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def quote(text: str, most: int = 40) -> str:
    """``text`` quoted for a message, cut to its first ``most`` characters ("…" after them)."""
    return repr(text) if len(text) <= most else repr(text[:most]) + "…"


def check_texts(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    what: str,
    names: Sequence[str],
    positions: Sequence[int],
    limit: int,
    field: str,
    cut: str | None = None,
    counted: str = "",
) -> None:
    """The one rule of the commands over texts (``generate``, ``ask``, ``translate``, ``fill-mask``, ``zero-shot``,
    ``embed``), before the model reads them:

    - the characters of ``texts`` that the model's tokenizer lacks (they become <unk>) are named in one warning, "the
      prompt's characters '∑', 'é' are not in the model's vocabulary ..." (``what``: "the prompt's");
    - a text whose ``positions`` (each text's, named by ``names``; ``counted`` says what they count beside its own
      tokens, " with [CLS] and [SEP]") exceed the model's ``limit`` (set by the config's ``field``) is refused with
      ``cut=None``: ``ConfigError`` naming it, the limit and how much shorter it must be; else it is named in a warning
      saying what the command keeps, its start (``cut="end"``: its end is cut) or its end (``cut="start"``). Never an
      empty answer for it with nothing said.
    """
    if cut not in (None, "end", "start"):
        raise ValueError(f"cut={cut!r}: give None (refuse), 'end' or 'start'")
    unknown = list(dict.fromkeys(c for text in texts for c in tokenizer.unknown_characters(text)))
    if unknown:
        many = len(unknown) > 1
        warn(
            f"{what} character{'s' * many} {', '.join(map(repr, unknown))} {'are' if many else 'is'} not in the "
            "model's vocabulary (it never saw them in training): they become <unk>"
        )
    long = [(name, n) for name, n in zip(names, positions, strict=True) if n > limit]
    if not long:
        return
    unit = "characters" if tokenizer.kind == "char" else "tokens"
    if cut is None:
        name, n = long[0]
        more = f" (and {len(long) - 1} more)" if len(long) > 1 else ""
        raise ConfigError(
            f"{name} has {n} tokens{counted}; the model reads at most {limit} ({field}): shorten it by at least "
            f"{n - limit} {unit}{more}"
        )
    kept = "its end is cut" if cut == "end" else f"its start is cut: the model reads its last {limit}"
    for name, n in long[:SHOWN]:
        warn(f"{name} has {n} tokens{counted}; the model reads at most {limit} ({field}), so {kept}")
    if len(long) > SHOWN:
        warn(f"{len(long) - SHOWN} more texts have more than {limit} tokens{counted}: each is cut likewise")


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
