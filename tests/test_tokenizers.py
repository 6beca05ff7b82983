"""Character and byte-level BPE tokenizers: round trips, special tokens, one JSON format, clear errors."""

import json

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from lightformer.tokenization.text import (
    BOS,
    BOS_ID,
    EOS,
    EOS_ID,
    PAD,
    PAD_ID,
    UNK,
    UNK_ID,
    Tokenizer,
    token_dtype,
)

TRAIN_TEXT = (
    "It is a truth universally acknowledged, that a single man in possession\n"
    "of a good fortune, must be in want of a wife.\n\n"
    "\tHowever little known the feelings or views of such a man may be on his\n"
    "first entering a neighbourhood, this truth is so well fixed in the minds\n"
    "of the surrounding families, that he is considered the rightful property\n"
    "of some one or other of their daughters. Café, naïve, £5 — “quoted”.\n"
) * 20
# Seen characters in awkward places: leading and trailing spaces, blank lines, tabs, non-ASCII.
SEEN_TEXT = "  of a wife.\n\n\n\tCafé £5 — “truth”  \n"
# Characters that TRAIN_TEXT never contains.
UNSEEN_TEXT = "emoji 😀🎉, CJK 世界你好, Greek αβγ, combining e\u0301, NUL \x00, CRLF \r\n end"


@pytest.fixture(scope="module")
def char_tokenizer() -> Tokenizer:
    return Tokenizer.train_char([TRAIN_TEXT])


@pytest.fixture(scope="module")
def bpe_tokenizer() -> Tokenizer:
    return Tokenizer.train_bpe(TRAIN_TEXT.splitlines(keepends=True), vocab_size=320)


@pytest.fixture(params=["char", "bpe"])
def tokenizer(request, char_tokenizer, bpe_tokenizer) -> Tokenizer:
    return {"char": char_tokenizer, "bpe": bpe_tokenizer}[request.param]


def test_special_tokens_have_ids_0_to_3(tokenizer):
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id) == (0, 1, 2, 3)
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    hf = tokenizer.hf_tokenizer
    assert [hf.token_to_id(token) for token in (PAD, BOS, EOS, UNK)] == [0, 1, 2, 3]


def test_kinds_and_vocab_sizes(char_tokenizer, bpe_tokenizer):
    assert char_tokenizer.kind == "char"
    assert char_tokenizer.vocab_size == 4 + len(set(TRAIN_TEXT))
    assert bpe_tokenizer.kind == "bpe"
    assert 4 + 256 < bpe_tokenizer.vocab_size <= 320


def test_round_trip_of_seen_text(tokenizer):
    ids = tokenizer.encode(SEEN_TEXT)
    assert all(0 <= i < tokenizer.vocab_size for i in ids)
    assert UNK_ID not in ids
    assert tokenizer.decode(ids) == SEEN_TEXT
    assert tokenizer.decode(tokenizer.encode(TRAIN_TEXT)) == TRAIN_TEXT


def test_char_vocabulary_is_sorted_and_deterministic(char_tokenizer):
    shuffled = Tokenizer.train_char(reversed(TRAIN_TEXT.splitlines(keepends=True)))
    assert shuffled.to_str() == char_tokenizer.to_str()
    ids = [char_tokenizer.encode(c)[0] for c in sorted(set(TRAIN_TEXT))]
    assert ids == list(range(4, char_tokenizer.vocab_size))
    assert char_tokenizer.encode("\n") == [char_tokenizer.encode("\n")[0]]  # one id for a newline


def test_char_maps_unseen_characters_to_unk(char_tokenizer):
    ids = char_tokenizer.encode("a😀b世")
    assert len(ids) == 4
    assert ids[1] == ids[3] == UNK_ID
    assert char_tokenizer.decode(ids) == "ab"
    assert char_tokenizer.decode(ids, skip_special=False) == f"a{UNK}b{UNK}"


def test_bpe_round_trips_characters_never_seen_in_training(bpe_tokenizer):
    ids = bpe_tokenizer.encode(UNSEEN_TEXT)
    assert UNK_ID not in ids
    assert bpe_tokenizer.decode(ids) == UNSEEN_TEXT


def test_special_token_text_in_the_input_is_plain_text(tokenizer):
    text = f"a {EOS} b {PAD}"
    ids = tokenizer.encode(text)
    assert EOS_ID not in ids and PAD_ID not in ids  # (the char vocabulary lacks "<" and ">": UNK)
    if tokenizer.kind == "bpe":
        assert tokenizer.decode(ids) == text


def test_bos_and_eos_are_added_and_skipped(tokenizer):
    ids = tokenizer.encode("of a wife", add_bos=True, add_eos=True)
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID
    assert ids[1:-1] == tokenizer.encode("of a wife")
    assert tokenizer.decode(ids) == "of a wife"
    assert tokenizer.decode(ids, skip_special=False) == f"{BOS}of a wife{EOS}"


def test_batch_methods_match_single_calls(tokenizer):
    texts = ["of a wife.", "", SEEN_TEXT]
    batch = tokenizer.encode_batch(texts, add_eos=True)
    assert batch == [tokenizer.encode(t, add_eos=True) for t in texts]
    assert tokenizer.decode_batch(batch) == texts


def test_decode_accepts_arrays_and_tensors(tokenizer):
    ids = tokenizer.encode(SEEN_TEXT)
    assert tokenizer.decode(np.array(ids, dtype=np.uint16)) == SEEN_TEXT
    assert tokenizer.decode(torch.tensor(ids)) == SEEN_TEXT
    assert tokenizer.decode_batch(torch.tensor([ids, ids])) == [SEEN_TEXT, SEEN_TEXT]


@pytest.mark.parametrize(
    "text",
    [
        TRAIN_TEXT,
        SEEN_TEXT,
        "x\ny\n\nz  \nw\n \nv\t\nu",  # line breaks next to blanks: where BPE pieces must not be cut
        "",
    ],
)
def test_encode_to_array_equals_encode(tokenizer, text):
    array = tokenizer.encode_to_array(text)
    assert array.dtype == np.uint16
    assert array.tolist() == tokenizer.encode(text)


def test_encode_to_array_of_unseen_text(tokenizer):
    assert tokenizer.encode_to_array(UNSEEN_TEXT).tolist() == tokenizer.encode(UNSEEN_TEXT)


def test_token_dtype():
    assert token_dtype(85) == np.uint16
    assert token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32


def test_save_load_and_string_round_trip(tokenizer, tmp_path):
    path = tokenizer.save(tmp_path / "tokenizer.json")
    for loaded in (Tokenizer.from_file(path), Tokenizer.from_str(tokenizer.to_str())):
        assert loaded.kind == tokenizer.kind
        assert loaded.vocab_size == tokenizer.vocab_size
        for text in (TRAIN_TEXT, SEEN_TEXT, UNSEEN_TEXT, f"{EOS}"):
            assert loaded.encode(text) == tokenizer.encode(text)
        assert loaded.decode(tokenizer.encode(SEEN_TEXT)) == SEEN_TEXT
    assert json.loads(path.read_text())["model"]["type"] in ("WordLevel", "BPE")


def test_bpe_vocab_size_too_small():
    with pytest.raises(ValueError, match=r"vocab_size=100 .* at least 260"):
        Tokenizer.train_bpe([TRAIN_TEXT], vocab_size=100)


def test_missing_tokenizer_file_names_the_path(tmp_path):
    path = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError, match="nope.json"):
        Tokenizer.from_file(path)


def test_bad_tokenizer_file_names_the_path(tmp_path):
    path = tmp_path / "garbage.json"
    path.write_text("this is not json")
    with pytest.raises(ValueError, match=r"garbage\.json is not a valid tokenizer JSON"):
        Tokenizer.from_file(path)


def test_foreign_tokenizer_file_is_rejected(tmp_path, char_tokenizer):
    # A valid Hugging Face tokenizer whose special tokens are not at lightformer's ids.
    spec = json.loads(char_tokenizer.to_str())
    spec["model"]["vocab"] = {"a": 0, "b": 1, PAD: 2, BOS: 3, EOS: 4, UNK: 5}
    spec["added_tokens"] = []
    path = tmp_path / "foreign.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=r"foreign\.json.*'<pad>' has id 2, expected 0"):
        Tokenizer.from_file(path)
    wordpiece = HFTokenizer(models.WordPiece({PAD: 0, BOS: 1, EOS: 2, UNK: 3}, unk_token=UNK))
    path.write_text(wordpiece.to_str())
    with pytest.raises(ValueError, match=r"foreign\.json.*'WordPiece' is not supported"):
        Tokenizer.from_file(path)


# --- BPE-dropout ------------------------------------------------------------------------------------------------

# Words with multi-byte characters (ä, ß, ’, “) that TRAIN_TEXT and these lines repeat often enough to be merged.
DROPOUT_TEXT = "Die Straße, naïve Cafés — “Bär’s” große Brücke.\n" * 30


@pytest.fixture(scope="module")
def dropout_tokenizer() -> Tokenizer:
    return Tokenizer.train_bpe([*TRAIN_TEXT.splitlines(keepends=True), *DROPOUT_TEXT.splitlines()], vocab_size=400)


def test_bpe_dropout_zero_is_plain_bpe(dropout_tokenizer):
    texts = [*TRAIN_TEXT.splitlines(keepends=True), *DROPOUT_TEXT.splitlines(), UNSEEN_TEXT, SEEN_TEXT, "aaaa  a"]
    assert dropout_tokenizer.encode_batch_with_dropout(texts, 0.0, seed=0) == dropout_tokenizer.encode_batch(texts)


def test_bpe_dropout_one_splits_into_characters_never_bytes(dropout_tokenizer):
    text = "Die große Straße — “Bär’s”"
    ids = dropout_tokenizer.encode_batch_with_dropout([text], 1.0, seed=0)[0]
    # each character as plain BPE encodes it alone: one token where the vocabulary has it (ä, ’), else its bytes
    assert ids == [i for character in text for i in dropout_tokenizer.encode(character)]
    assert len(dropout_tokenizer.encode("’")) == 1  # three bytes merged into one token, and never cut


def test_bpe_dropout_draws_from_the_seed_and_decodes_back(dropout_tokenizer):
    texts = [*DROPOUT_TEXT.splitlines(), *TRAIN_TEXT.splitlines(), UNSEEN_TEXT]
    first = dropout_tokenizer.encode_batch_with_dropout(texts, 0.1, seed=1)
    assert dropout_tokenizer.encode_batch_with_dropout(texts, 0.1, seed=1) == first
    assert dropout_tokenizer.encode_batch_with_dropout(texts, 0.1, seed=2) != first
    assert dropout_tokenizer.decode_batch(first) == texts
    assert len(set(map(tuple, first[:30]))) > 1  # the same line is segmented in several ways
    lengths = [sum(map(len, dropout_tokenizer.encode_batch_with_dropout(texts, p, seed=1))) for p in (0, 0.1, 0.5)]
    assert lengths[0] < lengths[1] < lengths[2]


def test_bpe_dropout_refuses_a_char_tokenizer_and_bad_probabilities(char_tokenizer, bpe_tokenizer):
    with pytest.raises(ValueError, match="BPE-dropout needs a BPE tokenizer; this one is 'char'"):
        char_tokenizer.encode_batch_with_dropout(["a"], 0.1, seed=0)
    with pytest.raises(ValueError, match=r"dropout=1.5 must be a probability in \[0, 1\]"):
        bpe_tokenizer.encode_batch_with_dropout(["a"], 1.5, seed=0)
