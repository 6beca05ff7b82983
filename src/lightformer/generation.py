"""Decoding for the language model and the translator: greedy, temperature, top-k, top-p, and beam search.

Both work on any *incremental decoder*: a callable ``decoder(ids, cache=None) -> logits`` over token ids
``(batch, seq)`` giving ``(batch, seq, vocab)``, with ``decoder.new_cache(max_length)`` returning an
object that has ``length`` and ``reorder(index)`` (a :class:`lightformer.nn.DecoderCache`), and
``decoder.block_size``, the most positions it can take. ``GPT`` is one; the translation model gives one
per source batch with ``Seq2Seq.incremental_decoder(src)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor


class IncrementalDecoder(Protocol):
    block_size: int

    def __call__(self, ids: Tensor, cache: Any = None) -> Tensor: ...

    def new_cache(self, max_length: int | None = None) -> Any: ...


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set to -inf every logit outside the ``top_k`` largest and outside the smallest set with probability ≥ ``top_p``.

    logits: ``(batch, vocab)``.
    """
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the tokens before it already reach top_p (the first token always stays)
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_token(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick the next token ``(batch,)`` from ``(batch, vocab)`` logits; ``temperature=0`` is greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = filter_logits(logits.float() / temperature, top_k, top_p)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    decoder: IncrementalDecoder,
    prompt: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_tokens: Sequence[int] = (),
    use_cache: bool = True,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Extend ``prompt`` ``(batch, prompt_len)`` by up to ``max_new_tokens``; returns ``(batch, prompt_len + new)``.

    A row that emits one of ``stop_tokens`` is finished: its later positions repeat that stop token, and
    generation ends when every row has finished. Without the cache every step reruns the whole (cropped)
    context. With it, each step feeds one token; when the context outgrows ``block_size`` the cache is
    rebuilt from the last half block (the uncached path slides by one token instead, so beyond
    ``block_size`` the two may differ; within it they are identical).
    """
    block_size = decoder.block_size
    ids = prompt[:, -block_size:] if prompt.shape[1] > block_size else prompt
    out = prompt
    finished = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    stops = torch.tensor(list(stop_tokens), dtype=prompt.dtype, device=prompt.device)
    cache = decoder.new_cache(block_size) if use_cache else None
    for _ in range(max_new_tokens):
        if cache is None:
            logits = decoder(out[:, -block_size:])
        else:
            if cache.length == block_size:  # full: re-encode the most recent half block
                cache = decoder.new_cache(block_size)
                ids = out[:, -(block_size // 2) :]
            logits = decoder(ids, cache=cache)
        token = next_token(logits[:, -1], temperature, top_k, top_p, generator)
        if len(stops):
            token = torch.where(finished, out[:, -1], token)
            finished |= torch.isin(token, stops)
        out = torch.cat([out, token[:, None]], dim=1)
        ids = token[:, None]
        if len(stops) and finished.all():
            break
    return out
