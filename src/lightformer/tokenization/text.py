"""Character-level and byte-level BPE tokenizers behind one class and one JSON format.

Both kinds wrap a Hugging Face `tokenizers.Tokenizer`, so saving, loading and storing a tokenizer in a
checkpoint is always `to_str()` / `from_str()` (no pickle). The kind is read back from the JSON's model
type: `WordLevel` is the character tokenizer, `BPE` the byte-level BPE.

Every vocabulary starts with the same four special tokens, ids 0..3: PAD, BOS, EOS, UNK. They only
ever come from `add_bos` / `add_eos` (and UNK for a character the char vocabulary lacks): the literal
text "<eos>" in the input is encoded as ordinary characters. So `decode(encode(text)) == text` holds for
any text with BPE, and for any text made of seen characters with the character tokenizer.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from lightformer.io.files import atomic_write_bytes
from lightformer.tokenization.vocabulary import Vocabulary, hf_vocabulary

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIAL_TOKENS))
# Extra special tokens a tokenizer can be trained with (ids after the four above, in the order given): the mask of
# masked language modelling, and T5's span sentinels. BERT's [CLS] and [SEP] are BOS and EOS (as in RoBERTa).
MASK = "<mask>"


def sentinel(i: int) -> str:
    """T5's i-th span sentinel, ``<extra_id_i>``."""
    return f"<extra_id_{i}>"


# The byte-level BPE vocabulary always holds the 256 byte symbols, so nothing is ever out of vocabulary.
MIN_BPE_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256

# For encoding a long text in parallel pieces: around a line break between two printable ASCII characters,
# "x\ny", the byte-level (GPT-2) pre-tokenizer always cuts after "x" and after "\n" (no pattern spans a
# newline and a visible character, and "\n" joins no whitespace run), so encoding the pieces separately
# gives exactly the ids of encoding the whole text.
_BPE_PIECE_BOUNDARY = re.compile(r"(?<=[!-~]\n)(?=[!-~])")
_BPE_PIECES_PER_BATCH = 4096


def _byte_symbols() -> dict[int, str]:
    """GPT-2's byte-level alphabet: the character that stands for each byte in a pre-tokenized word (printable
    Latin-1 bytes stand for themselves, the others for code points from 256 on)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [byte for byte in range(256) if byte not in printable]
    return {**{byte: chr(byte) for byte in printable}, **{byte: chr(256 + n) for n, byte in enumerate(others)}}


# The symbols of UTF-8 continuation bytes (10xxxxxx): a merge whose right symbol starts with one is inside a character.
_CONTINUATION_BYTES = frozenset(symbol for byte, symbol in _byte_symbols().items() if 0x80 <= byte < 0xC0)


def token_dtype(vocab_size: int) -> type[np.unsignedinteger]:
    """Smallest unsigned integer dtype that holds every id of a vocabulary of `vocab_size` tokens."""
    return np.uint16 if vocab_size <= 2**16 else np.uint32


class Tokenizer:
    """A character-level (`kind="char"`) or byte-level BPE (`kind="bpe"`) tokenizer.

    Build one with `Tokenizer.train_char(texts)` or `Tokenizer.train_bpe(texts, vocab_size)`, or load one
    with `Tokenizer.from_file(path)` / `Tokenizer.from_str(json_string)`.
    """

    # Every vocabulary starts with the same special tokens (``SPECIAL_TOKENS``), so their ids are fixed.
    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    def __init__(self, hf_tokenizer: HFTokenizer, source: str = "<in memory>") -> None:
        """Wrap a Hugging Face tokenizer; `source` names where it came from, for error messages."""
        model_type = type(hf_tokenizer.model).__name__
        kinds = {"WordLevel": "char", "BPE": "bpe"}
        ours = "lightformer encodes data with its own tokenizers only, as a run or an export writes them"
        if model_type not in kinds:
            raise ValueError(
                f"{source}: tokenizer model type {model_type!r} is not supported; expected WordLevel "
                f"(character level) or BPE (byte-level BPE), as written by lightformer's Tokenizer.save ({ours})"
            )
        for expected_id, token in enumerate(SPECIAL_TOKENS):
            found_id = hf_tokenizer.token_to_id(token)
            if found_id != expected_id:
                raise ValueError(
                    f"{source}: special token {token!r} has id {found_id}, expected {expected_id} "
                    f"(lightformer vocabularies start with {', '.join(SPECIAL_TOKENS)}: {ours}, not another "
                    "library's such as GPT-2's or BERT's)"
                )
        # Match special tokens only when added explicitly, never inside the text (see module docstring).
        hf_tokenizer.encode_special_tokens = True
        self._hf_tokenizer = hf_tokenizer
        self._kind = kinds[model_type]
        self._char_lookup: tuple[np.ndarray, np.ndarray] | None = None
        self._bpe_tables: tuple[dict[tuple[str, str], int], dict[str, int]] | None = None

    @classmethod
    def train_char(cls, texts: Iterable[str], extra_special_tokens: Sequence[str] = ()) -> Tokenizer:
        """One id per distinct character in `texts`, in sorted order after the special tokens (the four fixed
        ones, then `extra_special_tokens`).

        Characters not seen here encode to UNK. Newlines, tabs and all of Unicode are ordinary characters.
        """
        characters: set[str] = set()
        for text in texts:
            characters.update(text)
        specials = (*SPECIAL_TOKENS, *extra_special_tokens)
        vocab = {token: i for i, token in enumerate(specials)}
        for character in sorted(characters):
            vocab[character] = len(vocab)
        hf_tokenizer = HFTokenizer(models.WordLevel(vocab, unk_token=UNK))
        # Every character (newline included) is its own pre-token, looked up whole in the vocabulary;
        # Fuse joins the decoded characters without the spaces a WordLevel model would put between them.
        hf_tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        hf_tokenizer.decoder = decoders.Fuse()
        hf_tokenizer.add_special_tokens(list(specials))
        return cls(hf_tokenizer)

    @classmethod
    def train_bpe(
        cls, texts: Iterable[str], vocab_size: int, min_frequency: int = 2, extra_special_tokens: Sequence[str] = ()
    ) -> Tokenizer:
        """Byte-level BPE (as GPT-2) with `vocab_size` tokens, special tokens (the four fixed ones, then
        `extra_special_tokens`: `MASK`, T5's `sentinel(i)`) and all 256 bytes included.

        Any text encodes and decodes back exactly, including characters never seen in training.
        Pairs seen fewer than `min_frequency` times are not merged, so the vocabulary can be smaller.
        """
        if vocab_size < MIN_BPE_VOCAB_SIZE:
            raise ValueError(
                f"vocab_size={vocab_size} is too small for byte-level BPE: it needs at least "
                f"{MIN_BPE_VOCAB_SIZE} (256 byte symbols + {len(SPECIAL_TOKENS)} special tokens)"
            )
        hf_tokenizer = HFTokenizer(models.BPE())
        hf_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf_tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=[*SPECIAL_TOKENS, *extra_special_tokens],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        hf_tokenizer.train_from_iterator(texts, trainer=trainer)
        return cls(hf_tokenizer)

    @property
    def kind(self) -> str:
        """ "char" or "bpe"."""
        return self._kind

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included; ids are 0..vocab_size-1."""
        return self._hf_tokenizer.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int:
        """The id of a special token (``MASK``, ``sentinel(i)``, ...); ValueError naming it if the vocabulary has
        none (train the tokenizer with it among ``extra_special_tokens``)."""
        found = self._hf_tokenizer.token_to_id(token)
        if found is None:
            raise ValueError(f"the tokenizer has no token {token!r}: train it with extra_special_tokens=[{token!r}]")
        return found

    @property
    def special_ids(self) -> list[int]:
        """The ids of every special token (the four fixed ones and any extra)."""
        added = self._hf_tokenizer.get_added_tokens_decoder()
        return sorted(i for i, token in added.items() if token.special)

    @property
    def hf_tokenizer(self) -> HFTokenizer:
        """The wrapped Hugging Face tokenizer (for use with other libraries)."""
        return self._hf_tokenizer

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Token ids of `text`, optionally framed by BOS and EOS."""
        ids = self._hf_tokenizer.encode(text, add_special_tokens=False).ids
        return self._frame(ids, add_bos, add_eos)

    def encode_batch(self, texts: Sequence[str], add_bos: bool = False, add_eos: bool = False) -> list[list[int]]:
        """`encode` for many texts at once (in parallel threads)."""
        encodings = self._hf_tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [self._frame(encoding.ids, add_bos, add_eos) for encoding in encodings]

    def encode_batch_with_dropout(self, texts: Sequence[str], dropout: float, seed: int) -> list[list[int]]:
        """`encode_batch` with BPE-dropout (Provilkov et al. 2020): a random segmentation of each text, drawn from
        `seed` alone.

        Each word is split into bytes and merged as BPE does (the lowest-ranked merge first, all its places at once,
        as subword-nmt), except that at each step every candidate merge is skipped with probability `dropout`; when
        all are skipped the word is done. Merges inside a character are never skipped, so that, as in the paper's
        character-level BPE, a character that plain BPE encodes as one token (an "ä" or a "’" in a vocabulary
        trained on German) is never cut into bytes. `dropout=0` gives exactly `encode_batch`'s ids; `dropout=1`
        gives each character as plain BPE encodes it alone. The text always decodes back whole. Hugging Face's own
        `BPE(dropout=...)` draws from an unseeded generator, so its segmentations could not be repeated on resume
        or agreed between ranks; this one is pure Python.
        """
        if self.kind != "bpe":
            raise ValueError(f"BPE-dropout needs a BPE tokenizer; this one is {self.kind!r}")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"dropout={dropout} must be a probability in [0, 1]")
        ranks, vocab = self._merge_ranks()
        rng = random.Random(seed)
        pre_tokenize = self._hf_tokenizer.pre_tokenizer.pre_tokenize_str
        return [
            [
                vocab[token]
                for word, _ in pre_tokenize(text)
                for token in _merge_with_dropout(list(word), ranks, dropout, rng)
            ]
            for text in texts
        ]

    def encode_to_array(self, text: str) -> np.ndarray:
        """Ids of a long text (a whole corpus) as a 1-D array of `token_dtype(vocab_size)`.

        Same ids as `encode(text)`, much faster: a table lookup per code point for the character kind,
        parallel encoding of line-separated pieces for BPE.
        """
        dtype = token_dtype(self.vocab_size)
        if self.kind == "char":
            codepoints, ids = self._char_table()
            text_codepoints = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
            positions = np.searchsorted(codepoints, text_codepoints).clip(max=len(codepoints) - 1)
            known = codepoints[positions] == text_codepoints
            return np.where(known, ids[positions], UNK_ID).astype(dtype)
        pieces = _BPE_PIECE_BOUNDARY.split(text)
        arrays = [np.zeros(0, dtype=dtype)]
        for start in range(0, len(pieces), _BPE_PIECES_PER_BATCH):
            encodings = self._hf_tokenizer.encode_batch(
                pieces[start : start + _BPE_PIECES_PER_BATCH], add_special_tokens=False
            )
            arrays.extend(np.asarray(encoding.ids, dtype=dtype) for encoding in encodings)
        return np.concatenate(arrays)

    def unknown_characters(self, text: str) -> list[str]:
        """The distinct characters of ``text`` that a character tokenizer encodes as UNK, in order of appearance
        (none for byte-level BPE, which encodes anything)."""
        if self.kind != "char":
            return []
        vocab = self._hf_tokenizer.get_vocab(with_added_tokens=False)
        return list(dict.fromkeys(character for character in text if character not in vocab))

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of `ids` (a list, array or 1-D tensor); special tokens are dropped if `skip_special`."""
        ids = ids.tolist() if hasattr(ids, "tolist") else [int(i) for i in ids]
        return self._hf_tokenizer.decode(ids, skip_special_tokens=skip_special)

    def decode_batch(self, batch: Iterable[Iterable[int]], skip_special: bool = True) -> list[str]:
        """`decode` for many sequences (a list of lists, or a 2-D array or tensor)."""
        return [self.decode(ids, skip_special) for ids in batch]

    def to_str(self) -> str:
        """The tokenizer as one JSON string (what a checkpoint stores)."""
        return self._hf_tokenizer.to_str()

    @classmethod
    def from_str(cls, json_string: str, source: str = "<string>") -> Tokenizer:
        """Rebuild a tokenizer from `to_str()`'s JSON; `source` names its origin in error messages."""
        try:
            hf_tokenizer = HFTokenizer.from_str(json_string)
        except Exception as error:  # tokenizers raises a bare Exception for malformed JSON
            raise ValueError(f"{source} is not a valid tokenizer JSON: {error}") from error
        return cls(hf_tokenizer, source=source)

    def save(self, path: str | Path) -> Path:
        """Write the JSON to `path` (atomically, so concurrent readers never see half a file)."""
        return atomic_write_bytes(path, self._hf_tokenizer.to_str(pretty=True).encode("utf-8"))

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """Load a tokenizer written by `save`."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file {path} does not exist")
        try:
            json_string = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"tokenizer file {path} is not UTF-8 JSON text: {error}") from error
        return cls.from_str(json_string, source=f"tokenizer file {path}")

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size})"

    def vocabulary(self) -> Vocabulary:
        """Its ids (what a start's weights are compared by, against any tokenizer's: ``Vocabulary``)."""
        return hf_vocabulary(self._hf_tokenizer, self.kind, "")

    def difference(self, other: Tokenizer) -> str | None:
        """None when `other` maps the same tokens to the same ids (same kind and vocabulary), else what differs:
        the kinds and sizes, and the first id that stands for another token."""
        if other is self or other.to_str() == self.to_str():
            return None
        return self.vocabulary().difference(other.vocabulary())

    @staticmethod
    def _frame(ids: list[int], add_bos: bool, add_eos: bool) -> list[int]:
        return [BOS_ID] * add_bos + ids + [EOS_ID] * add_eos

    def _merge_ranks(self) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
        """({(left, right): rank} of the BPE merges, {token: id}) read from the tokenizer's JSON."""
        if self._bpe_tables is None:
            model = json.loads(self._hf_tokenizer.to_str())["model"]
            # tokenizers writes a merge as ["left", "right"] (0.20 on) or as "left right" (before)
            merges = [tuple(merge) if isinstance(merge, list) else tuple(merge.split(" ")) for merge in model["merges"]]
            self._bpe_tables = ({merge: rank for rank, merge in enumerate(merges)}, model["vocab"])
        return self._bpe_tables

    def _char_table(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted code points, their ids) of the character vocabulary, for `encode_to_array`."""
        if self._char_lookup is None:
            pairs = sorted(
                (ord(token), token_id)
                for token, token_id in self._hf_tokenizer.get_vocab(with_added_tokens=False).items()
                if len(token) == 1
            )
            codepoints = np.array([c for c, _ in pairs] or [0], dtype=np.uint32)
            ids = np.array([i for _, i in pairs] or [UNK_ID], dtype=np.int64)
            self._char_lookup = (codepoints, ids)
        return self._char_lookup


def _merge_with_dropout(
    symbols: list[str], ranks: dict[tuple[str, str], int], dropout: float, rng: random.Random
) -> list[str]:
    """BPE on one pre-tokenized word (its byte symbols), each candidate merge skipped with probability `dropout`,
    except merges inside a character (the right symbol starts with a UTF-8 continuation byte)."""
    while len(symbols) > 1:
        candidates = [
            (ranks[pair], i)
            for i, pair in enumerate(zip(symbols[:-1], symbols[1:], strict=True))
            if pair in ranks and (dropout == 0.0 or pair[1][0] in _CONTINUATION_BYTES or rng.random() >= dropout)
        ]
        if not candidates:
            break
        best = min(candidates)[0]
        merged, start = [], 0
        for rank, i in candidates:
            if rank == best and i >= start:  # not overlapping the previous merge ("a a a" -> "aa a")
                merged.extend(symbols[start:i])
                merged.append(symbols[i] + symbols[i + 1])
                start = i + 2
        merged.extend(symbols[start:])
        symbols = merged
    return symbols
