"""The one pipeline that prepares a folder of records (docs/data.md, "One pipeline for records")."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightformer.data.preparation.prepare import TokenizerConfig, load_or_train_tokenizer, write_records
from lightformer.tokenization.text import Tokenizer


@dataclass(frozen=True)
class TokenizerJob:
    """A tokenizer loaded or trained on ``sample(splits)`` (``load_or_train_tokenizer``), saved as ``name``."""

    name: str
    config: TokenizerConfig
    sample: Callable[[tuple[str, ...]], Iterable[str]]
    extra_special_tokens: tuple[str, ...] = ()
    needed: tuple[str, ...] | None = None
    what: str | None = None


@dataclass(frozen=True)
class RecordSplit:
    """A record split into ``<folder>/<name>``: ``records_of(input)`` (picklable) yields an input's records, summary."""

    name: str
    inputs: list
    records_of: Callable[[Any], Iterable[dict]]
    expected: int | None = None


def prepare_records(
    folder: Path,
    tokenizers: Sequence[TokenizerJob],
    splits: Callable[[dict[str, str]], Iterable[RecordSplit]],
    length_fields: tuple[str, ...],
    workers: int | None,
    maxima: tuple[str, ...] = (),
) -> tuple[dict[str, Tokenizer], dict[str, dict]]:
    """Prepare ``folder``: the tokenizers, then each split; returns them by name, and each split's ``summed`` counts."""
    trained: dict[str, Tokenizer] = {}
    for job in tokenizers:
        trained[job.name] = load_or_train_tokenizer(job.config, job.sample, job.extra_special_tokens, job.needed,
                                                    job.what)  # fmt: skip
        trained[job.name].save(folder / job.name)
    statistics: dict[str, dict] = {}
    for split in splits({name: tokenizer.to_str() for name, tokenizer in trained.items()}):
        summaries: list = []
        count = write_records(folder / split.name, split.records_of, split.inputs, workers, length_fields,
                              expected=split.expected, summaries=summaries)  # fmt: skip
        statistics[split.name] = {"records": count, **summed(summaries, maxima)}
    return trained, statistics


def summed(parts: Iterable, maxima: tuple[str, ...] = ()) -> dict:
    """What the inputs' encoders returned, added up (element by element, key by key; ``maxima``: the largest)."""
    total: dict = {}
    for part in parts:
        if part is not None:
            total = _combined(total, dict(part), maxima, largest=False)
    return total


def _combined(a: Any, b: Any, maxima: tuple[str, ...], largest: bool) -> Any:
    if isinstance(a, dict):
        out = dict(a)
        for key, value in b.items():
            out[key] = _combined(out[key], value, maxima, largest or key in maxima) if key in out else value
        return out
    if isinstance(a, list | tuple):
        return [_combined(x, y, maxima, largest) for x, y in zip(a, b, strict=True)]
    return max(a, b) if largest else a + b
