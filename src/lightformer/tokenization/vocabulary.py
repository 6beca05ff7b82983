"""What a tokenizer's ids stand for, whatever made it: lightformer's own, or the files of a Hugging Face folder
(``tokenizer.json`` of any model, BERT's ``vocab.txt``, GPT-2's or CLIP's ``vocab.json``). A start compares the
vocabulary its weights were trained with against the data's (``io.checkpoints.check_start_tokenizer``): the same
tokens at the same ids, or a refusal naming both."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

# A Hugging Face folder's tokenizer files, in the order they are read: the first one present decides.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model")


@dataclass(frozen=True)
class Vocabulary:
    """A tokenizer's ids: each token's id (``tokens``; None where the file cannot be read as one, a SentencePiece
    ``tokenizer.model``), its kind (ours: "char", "bpe"; Hugging Face's model type: "WordPiece", "BPE", "Unigram",
    ...) and where it was read (the file; "" for a tokenizer in memory)."""

    kind: str
    tokens: Mapping[str, int] | None
    source: str

    def describe(self) -> str:
        size = f" of {len(self.tokens)} tokens" if self.tokens is not None else ""
        return f"{self.kind} tokenizer{size}" + (f" ({self.source})" if self.source else "")

    def difference(self, other: Vocabulary) -> str | None:
        """None when ``other`` maps the same tokens to the same ids, else what differs: both tokenizers, and the
        first id that stands for another token."""
        if self.tokens is not None and self.kind == other.kind and self.tokens == other.tokens:
            return None
        described = f"{self.describe()} vs {other.describe()}"
        if self.tokens is None or other.tokens is None:
            return described
        tokens = {i: token for token, i in self.tokens.items()}
        other_tokens = {i: token for token, i in other.tokens.items()}
        for i in sorted(tokens.keys() & other_tokens.keys()):
            if tokens[i] != other_tokens[i]:
                return f"{described}; id {i} is {tokens[i]!r} in the first, {other_tokens[i]!r} in the second"
        return described


def hf_vocabulary(tokenizer: HFTokenizer, kind: str, source: str) -> Vocabulary:
    """The vocabulary of a ``tokenizers.Tokenizer`` (its added tokens included)."""
    return Vocabulary(kind, tokenizer.get_vocab(with_added_tokens=True), source)


def folder_vocabulary(folder: str | Path) -> Vocabulary | None:
    """The vocabulary of a Hugging Face model folder's tokenizer (the first of ``TOKENIZER_FILES`` it holds, with
    ``added_tokens.json`` beside a ``vocab.txt`` or ``vocab.json``); None where it holds no tokenizer file. A file
    that cannot be read as a tokenizer is a ``ValueError`` naming it."""
    folder = Path(folder)
    present = [folder / name for name in TOKENIZER_FILES if (folder / name).is_file()]
    if not present:
        return None
    file = present[0]
    try:
        if file.name == "tokenizer.json":
            tokenizer = HFTokenizer.from_file(str(file))
            return hf_vocabulary(tokenizer, type(tokenizer.model).__name__, str(file))
        if file.name == "tokenizer.model":  # SentencePiece's protobuf: its pieces are not read here
            return Vocabulary("SentencePiece", None, str(file))
        if file.name == "vocab.txt":  # WordPiece: a token a line, its id the line's number
            lines = file.read_text(encoding="utf-8").split("\n")
            tokens = {token: i for i, token in enumerate(lines[:-1] if lines[-1] == "" else lines)}
            kind = "WordPiece"
        else:
            tokens = {str(token): int(i) for token, i in json.loads(file.read_text(encoding="utf-8")).items()}
            kind = "BPE"
        added = folder / "added_tokens.json"
        if added.is_file():
            tokens |= {str(token): int(i) for token, i in json.loads(added.read_text(encoding="utf-8")).items()}
    except Exception as error:  # tokenizers raises a bare Exception for a malformed file
        raise ValueError(f"{file} cannot be read as a tokenizer: {error}") from None
    return Vocabulary(kind, tokens, str(file))
