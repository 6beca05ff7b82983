"""The vision-language chat template: how an image, questions and answers are laid out as ids (docs/data.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from lightformer.errors import DataError

IGNORE = -100  # a label the loss skips


@dataclass(frozen=True)
class ChatTemplate:
    """The text around each question and answer; ``image``: the marker of the image's place in a user's question."""

    user: str = "Q: "
    assistant: str = "\nA: "
    image: str = "<image>"

    def _question_ids(self, tokenizer, question: str, image_token_id: int, first: bool) -> list[int]:
        """The ids of a turn's user part: user + question (+ the placeholder where the first one's marker stands)."""
        count = question.count(self.image)
        if count > 1 or (count and not first):
            where = "a later question" if not first else "the question"
            raise DataError(f"{where} {question!r} holds the image marker {self.image!r} {count} time(s): one image "
                            "per record, marked at most once, in its first question")  # fmt: skip
        if not first:
            return tokenizer.encode(self.user + question)
        if not count:
            return [image_token_id, *tokenizer.encode(self.user + question)]
        before, after = question.split(self.image)
        after = after[1:] if after.startswith("\n") else after
        return [*tokenizer.encode(self.user + before), image_token_id, *tokenizer.encode(after)]

    def prompt(
        self, tokenizer, question: str, image_token_id: int, history: Sequence[tuple[str, str]] = ()
    ) -> list[int]:
        """The ids up to the assistant prefix of ``question``'s turn, after ``history``: generation goes on there."""
        ids = self.encode(tokenizer, history, image_token_id)[0] if history else [tokenizer.bos_id]
        ids += self._question_ids(tokenizer, question, image_token_id, first=not history)
        return ids + tokenizer.encode(self.assistant)

    def encode(self, tokenizer, turns: Sequence[tuple[str, str]], image_token_id: int) -> tuple[list[int], list[int]]:
        """(ids, labels) of the ``turns``: labels[t] = ids[t + 1] on an answer's tokens and its EOS, else -100."""
        ids, answer = [tokenizer.bos_id], [False]
        for number, (question, reply) in enumerate(turns):
            prompt = self._question_ids(tokenizer, question, image_token_id, first=number == 0)
            prompt += tokenizer.encode(self.assistant)
            ids += prompt
            answer += [False] * len(prompt)
            reply_ids = [*tokenizer.encode(reply), tokenizer.eos_id]
            ids += reply_ids
            answer += [True] * len(reply_ids)
        labels = [ids[t + 1] if answer[t + 1] else IGNORE for t in range(len(ids) - 1)] + [IGNORE]
        return ids, labels

    def as_dict(self) -> dict[str, str]:
        """Plain strings, as the facts and a checkpoint store them."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, str]) -> ChatTemplate:
        return cls(**dict(d))
