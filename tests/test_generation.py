"""generation.beam_search from a prompt: beams start from given ids, hypotheses come back without them."""

import pytest
import torch

from lightformer.generation import beam_search, generate
from lightformer.models import GPT, GPTConfig

EOS = 1


def small_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=12, block_size=32, d_model=32, n_heads=2, n_layers=2)).eval()


def test_beam_of_one_from_a_prompt_is_greedy_generation_after_it():
    model = small_gpt()
    prompt = torch.randint(2, 12, (5, 4))
    hyps, _ = beam_search(model, 5, 1, bos_id=0, eos_id=EOS, max_new_tokens=10, prompt=prompt)
    greedy = generate(model, prompt, 10, temperature=0, stop_tokens=(EOS,))[:, 4:].tolist()
    expected = [row[: row.index(EOS)] if EOS in row else row for row in greedy]
    assert hyps == expected


def test_beams_from_a_prompt_score_their_continuations():
    model = small_gpt()
    prompt = torch.randint(2, 12, (3, 4))
    hyps, scores = beam_search(model, 3, 4, bos_id=0, eos_id=EOS, max_new_tokens=6, length_penalty=0.0, prompt=prompt)
    for row, hyp, score in zip(prompt, hyps, scores, strict=True):
        full = torch.cat([row, torch.tensor(hyp + [EOS] * (len(hyp) < 6))])
        log_probs = model(full[None, :-1])[0].log_softmax(-1)
        own = log_probs[3:].gather(1, full[4:, None]).sum().item()
        assert score == pytest.approx(own, abs=1e-4)  # the reported score is of the continuation alone


def test_a_prompt_of_another_batch_is_refused():
    with pytest.raises(ValueError, match=r"prompt of shape \(2, 3\): give \(batch_size=4"):
        beam_search(small_gpt(), 4, 1, 0, EOS, 5, prompt=torch.zeros(2, 3, dtype=torch.long))
