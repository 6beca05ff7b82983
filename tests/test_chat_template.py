"""The chat template of the vision-language models: ids and labels of one and several turns worked out by hand, the
image's placeholder where the marker stands (else first), the prompt a prefix of the encoding, and a question with
two image markers refused."""

from __future__ import annotations

import pytest

from lightformer.data.objectives.chat import IGNORE, ChatTemplate
from lightformer.errors import DataError
from lightformer.tokenization.text import BOS_ID, EOS_ID, Tokenizer

TOKENIZER = Tokenizer.train_char(["QA: ?\nabcdxyz<>image"])
IMAGE = TOKENIZER.vocab_size  # the placeholder: outside the tokenizer


def ids(text: str) -> list[int]:
    return TOKENIZER.encode(text)


def test_one_turn_by_hand():
    got, labels = ChatTemplate().encode(TOKENIZER, [("a?", "xy")], IMAGE)
    prompt = [BOS_ID, IMAGE, *ids("Q: a?"), *ids("\nA: ")]
    assert got == [*prompt, *ids("xy"), EOS_ID]
    # labels[t] = ids[t + 1] on the answer's tokens and its EOS; the prompt's last position predicts the first
    assert labels == [IGNORE] * (len(prompt) - 1) + [*ids("xy"), EOS_ID, IGNORE]
    assert ChatTemplate().prompt(TOKENIZER, "a?", IMAGE) == prompt


def test_several_turns_by_hand_every_answer_labelled():
    turns = [("a?", "x"), ("b?", "yz")]
    got, labels = ChatTemplate().encode(TOKENIZER, turns, IMAGE)
    first = [BOS_ID, IMAGE, *ids("Q: a?"), *ids("\nA: ")]
    second = [*ids("Q: b?"), *ids("\nA: ")]
    assert got == [*first, *ids("x"), EOS_ID, *second, *ids("yz"), EOS_ID]
    expected = ([IGNORE] * (len(first) - 1) + [*ids("x"), EOS_ID] + [IGNORE] * len(second) + [*ids("yz"), EOS_ID]
                + [IGNORE])  # fmt: skip
    assert labels == expected and len(labels) == len(got)
    # the prompt of the second question, after the first turn, is a prefix of the whole encoding
    prompt = ChatTemplate().prompt(TOKENIZER, "b?", IMAGE, history=turns[:1])
    assert got[: len(prompt)] == prompt and prompt == [*first, *ids("x"), EOS_ID, *second]


def test_the_placeholder_stands_where_the_marker_is_its_newline_dropped():
    got, _ = ChatTemplate().encode(TOKENIZER, [("<image>\nab?", "x")], IMAGE)
    assert got == [BOS_ID, *ids("Q: "), IMAGE, *ids("ab?"), *ids("\nA: "), *ids("x"), EOS_ID]
    middle, _ = ChatTemplate().encode(TOKENIZER, [("ab <image> cd?", "x")], IMAGE)
    assert middle[: len(ids("Q: ab ")) + 2] == [BOS_ID, *ids("Q: ab "), IMAGE]
    assert middle[len(ids("Q: ab ")) + 2 :][: len(ids(" cd?"))] == ids(" cd?")


@pytest.mark.parametrize("turns", [[("<image> a <image>", "x")], [("a", "x"), ("<image> b", "y")]])
def test_a_marker_twice_or_in_a_later_question_is_refused(turns):
    with pytest.raises(DataError, match="image marker"):
        ChatTemplate().encode(TOKENIZER, turns, IMAGE)


def test_the_template_round_trips_through_a_dict():
    template = ChatTemplate(user="User: ", assistant="\nBot: ")
    assert ChatTemplate.from_dict(template.as_dict()) == template
    assert template.as_dict() == {"user": "User: ", "assistant": "\nBot: ", "image": "<image>"}
