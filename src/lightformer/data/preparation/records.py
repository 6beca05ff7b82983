"""The one pipeline that prepares a folder of records (classification, translation, image to text): a module gives
its tokenizers and record splits, ``prepare_records`` the rest (docs/data.md, "One pipeline for records")."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightformer.data.preparation.prepare import TokenizerConfig, load_or_train_tokenizer, write_records
from lightformer.tokenization.text import Tokenizer


@dataclass(frozen=True)
class TokenizerJob:
    """A tokenizer a preparation loads (``config.file``) or trains, and saves into the folder as ``name``.
    ``sample(splits)``: the texts of those splits it trains on (every split's for "char", train's for "bpe"), a bounded
    sample that the module draws from its sources; ``extra_special_tokens``: trained after PAD, BOS, EOS, UNK;
    ``needed``: the special tokens a loaded file must have (default: the extra ones); ``what``: how training is
    announced."""

    name: str
    config: TokenizerConfig
    sample: Callable[[tuple[str, ...]], Iterable[str]]
    extra_special_tokens: tuple[str, ...] = ()
    needed: tuple[str, ...] | None = None
    what: str | None = None


@dataclass(frozen=True)
class RecordSplit:
    """A record split a preparation writes into ``<folder>/<name>``: its ``inputs`` (what one preparing process reads
    at a time: pieces of files, ranges of lines, lists of examples) and ``records_of(input)``, which yields the
    input's records and may return a summary of it (a module-level function or a ``functools.partial`` of one: the
    workers get it by pickling); ``expected``: the records it must hold, when known beforehand."""

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
    """Prepare ``folder`` (inside ``prepared_folder``'s build): each tokenizer of ``tokenizers`` loaded or trained on
    its sample and saved, then each split of ``splits({name: tokenizer JSON})`` written in parallel pieces
    (``write_records``, ``length_fields`` measured, on ``workers`` processes). Returns the tokenizers by name, and
    each split's statistics: ``{"records": count, **the inputs' summaries summed}`` (``summed``; keys in ``maxima``
    take the largest)."""
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
    """What the inputs' encoders returned, added up: numbers added, lists element by element, dicts key by key (keys
    in the order first met; a key in ``maxima`` takes the largest, element by element); None (an encoder that returns
    nothing) is left out."""
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
