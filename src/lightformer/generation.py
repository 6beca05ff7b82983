"""Decoding for the language model and the translator: greedy, temperature, top-k, top-p, and beam search.

Both work on any *incremental decoder*: a callable ``decoder(ids, cache=None) -> logits`` over token ids
``(batch, seq)`` giving ``(batch, seq, vocab)``, with ``decoder.new_cache(max_length)`` returning an
object that has ``length`` and ``reorder(index)`` (a :class:`lightformer.nn.DecoderCache`), and
``decoder.block_size``, the most positions it can take. ``GPT`` is one; the translation model gives one
per source batch with ``EncoderDecoder.incremental_decoder(src)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor


class IncrementalDecoder(Protocol):
    block_size: int

    def __call__(self, ids: Tensor, cache: Any = None) -> Tensor: ...

    def new_cache(self, max_length: int | None = None) -> Any: ...


class ConditionedDecoder:
    """The incremental decoder of an encoder-decoder model bound to one batch of encoded inputs: ``step(ids, cache)``
    gives the logits (the encoder's output bound in it), ``new_cache`` the decoder stack's caches."""

    def __init__(self, step: Callable[[Tensor, Any], Tensor], new_cache: Callable[[int], Any], block_size: int) -> None:
        self.step = step
        self.make_cache = new_cache
        self.block_size = block_size

    def __call__(self, ids: Tensor, cache: Any = None) -> Tensor:
        return self.step(ids, cache)

    def new_cache(self, max_length: int | None = None) -> Any:
        return self.make_cache(max_length or self.block_size)


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


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise ValueError naming the argument unless temperature >= 0, top_k >= 1 and 0 < top_p <= 1."""
    if not temperature >= 0:
        raise ValueError(f"temperature={temperature} must be at least 0 (0 is greedy decoding, 1 samples as trained)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k} must be at least 1 (or None: no top-k filter)")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1] (or None: no nucleus filter)")


def next_token(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick the next token ``(batch,)`` from ``(batch, vocab)`` logits; ``temperature=0`` is greedy (argmax)."""
    check_sampling(temperature, top_k, top_p)
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
    check_sampling(temperature, top_k, top_p)
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


def sequence_score(log_prob: Tensor | float, length: int, length_penalty: float) -> Tensor | float:
    """Length-normalised log-probability: log p(y) / |y|^length_penalty (fairseq's convention)."""
    return log_prob / length**length_penalty


@torch.no_grad()
def beam_search(
    decoder: IncrementalDecoder,
    batch_size: int,
    beam_size: int,
    bos_id: int,
    eos_id: int,
    max_new_tokens: int,
    length_penalty: float = 1.0,
    device: torch.device | str = "cpu",
    prompt: Tensor | None = None,
) -> tuple[list[list[int]], list[float]]:
    """Batched beam search; returns, per source, the best hypothesis (without BOS/EOS) and its score.

    ``decoder`` must hold ``batch_size · beam_size`` rows, the beams of source b in rows
    ``b·beam_size … (b+1)·beam_size - 1`` (``EncoderDecoder.incremental_decoder(src, beam_size)``).
    A hypothesis ends when it emits ``eos_id`` (which counts in its length) or reaches ``max_new_tokens``
    tokens (then without EOS, as ``generate`` does).
    Scores are ``sequence_score``; a source is done once ``beam_size`` hypotheses have ended and no live
    beam can still beat the best of them. With ``beam_size=1`` this is greedy decoding.

    With ``prompt`` ``(batch_size, P)`` the beams start from its ids instead of ``[bos_id]`` (a vision-language
    model's question, its image placeholder in it); the hypotheses come back without it.
    """
    k = beam_size
    if prompt is None:
        tokens = torch.full((batch_size * k, 1), bos_id, dtype=torch.long, device=device)
    else:
        if prompt.ndim != 2 or prompt.shape[0] != batch_size:
            raise ValueError(f"prompt of shape {tuple(prompt.shape)}: give (batch_size={batch_size}, prompt length)")
        tokens = prompt.to(device=device, dtype=torch.long).repeat_interleave(k, dim=0)
    start = tokens.shape[1]
    # Only the first beam of each source is live at the start, so the k beams do not all repeat it.
    beam_log_probs = torch.zeros(batch_size, k, device=device)
    beam_log_probs[:, 1:] = float("-inf")
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch_size)]
    done = [False] * batch_size
    cache = decoder.new_cache(max_new_tokens + start)
    step_input = tokens
    for step in range(1, max_new_tokens + 1):
        log_probs = decoder(step_input, cache=cache)[:, -1].float().log_softmax(-1)  # (batch·k, vocab)
        vocab = log_probs.shape[-1]
        candidates = (beam_log_probs.view(-1, 1) + log_probs).view(batch_size, k * vocab)
        top_log_probs, top_index = candidates.topk(2 * k, dim=-1)  # 2k: enough to keep k going after k ends
        top_beam, top_token = top_index // vocab, top_index % vocab

        next_beams = torch.zeros(batch_size, k, dtype=torch.long, device=device)
        next_tokens = torch.full((batch_size, k), eos_id, dtype=torch.long, device=device)
        next_log_probs = torch.full((batch_size, k), float("-inf"), device=device)
        for b in range(batch_size):
            live = 0
            for log_prob, beam, token in zip(
                top_log_probs[b].tolist(), top_beam[b].tolist(), top_token[b].tolist(), strict=True
            ):
                if done[b] or log_prob == float("-inf"):
                    break
                if token == eos_id:
                    hypothesis = tokens[b * k + beam, start:].tolist()
                    finished[b].append((sequence_score(log_prob, step, length_penalty), hypothesis))
                    if len(finished[b]) >= k:
                        break
                else:
                    next_beams[b, live], next_tokens[b, live], next_log_probs[b, live] = beam, token, log_prob
                    live += 1
                    if live == k:
                        break
            if not done[b] and len(finished[b]) >= k:
                best = max(score for score, _ in finished[b])
                bound = _best_possible(next_log_probs[b], step, max_new_tokens, length_penalty)
                done[b] = bound <= best
            if done[b]:
                next_log_probs[b] = float("-inf")
        if all(done):
            break
        if k > 1:  # the live beams' rows; with one beam each row stays its source's (greedy: nothing to move)
            rows = (torch.arange(batch_size, device=device)[:, None] * k + next_beams).view(-1)
            tokens = tokens[rows]
            cache.reorder(rows)
        tokens = torch.cat([tokens, next_tokens.view(-1, 1)], dim=1)
        beam_log_probs = next_log_probs
        step_input = next_tokens.view(-1, 1)
    else:  # out of steps: the live beams end here, without end of sentence
        for b in range(batch_size):
            for beam, log_prob in enumerate(beam_log_probs[b].tolist()):
                if log_prob > float("-inf"):
                    score = sequence_score(log_prob, max_new_tokens, length_penalty)
                    finished[b].append((score, tokens[b * k + beam, start:].tolist()))

    best = [max(hyps, key=lambda h: h[0]) if hyps else (float("-inf"), []) for hyps in finished]
    return [hyp for _, hyp in best], [score for score, _ in best]


def _best_possible(log_probs: Tensor, step: int, max_new_tokens: int, length_penalty: float) -> float:
    """Upper bound on the final score of live beams with these log-probabilities after ``step`` tokens."""
    best = log_probs.max().item()
    if best == float("-inf"):
        return best
    # log-probabilities only fall; the normaliser |y|^lp grows with length, which helps a negative score most
    # at the longest possible length when lp > 0, and at the current length when lp ≤ 0.
    length = max_new_tokens if length_penalty > 0 else step + 1
    return sequence_score(best, length, length_penalty)
