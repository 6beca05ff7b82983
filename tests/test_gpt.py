"""The GPT model: causality, caching, initial loss, overfitting, Hugging Face GPT-2 interop, generation."""

import math

import pytest
import torch
import torch.nn.functional as F

from lightformer.generation import filter_logits, generate, next_token
from lightformer.models import GPT, GPTConfig, load_gpt2_weights


def small_gpt(**kwargs) -> GPT:
    torch.manual_seed(0)
    args = dict(vocab_size=50, block_size=32, n_layers=2, n_heads=4, d_model=32) | kwargs
    return GPT(GPTConfig(**args)).eval()


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "rope"])
def test_gpt_is_causal_and_caches(position):
    model = small_gpt(position=position)
    ids = torch.randint(0, 50, (2, 12))
    logits = model(ids)
    changed = ids.clone()
    changed[:, 6:] = torch.randint(0, 50, (2, 6))
    torch.testing.assert_close(model(changed)[:, :6], logits[:, :6])

    cache = model.new_cache()
    steps = [model(ids[:, :4], cache=cache)] + [model(ids[:, t : t + 1], cache=cache) for t in range(4, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), logits, atol=1e-5, rtol=1e-5)


def test_tied_weights_and_scaled_init():
    model = small_gpt(n_layers=4)
    assert model.lm_head.weight is model.embed.weight
    untied = small_gpt(tie_weights=False)
    assert untied.lm_head.weight is not untied.embed.weight
    proj = model.decoder.layers[0].self_attn.proj.weight
    assert proj.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.15)
    assert model.decoder.layers[0].self_attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_initial_loss_is_log_vocab_size():
    model = small_gpt(vocab_size=500)
    ids = torch.randint(0, 500, (8, 33))
    loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    assert loss.item() == pytest.approx(math.log(500), abs=0.1)


def test_overfits_a_tiny_batch():
    model = small_gpt().train()
    ids = torch.randint(0, 50, (4, 17))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05


def test_block_size_is_enforced():
    with pytest.raises(ValueError, match="longer than block_size=32"):
        small_gpt()(torch.zeros(1, 33, dtype=torch.long))


def test_matches_hugging_face_gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=97, n_positions=40, n_embd=48, n_layer=3, n_head=4, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0
    )
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(config).eval()
    ours = GPT(GPTConfig(vocab_size=97, block_size=40, n_layers=3, n_heads=4, d_model=48, activation="gelu_tanh"))
    ours.eval()
    load_gpt2_weights(ours, hf.state_dict())
    ids = torch.randint(0, 97, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)


def test_load_gpt2_from_safetensors(tmp_path):
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    config = transformers.GPT2Config(vocab_size=31, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(tmp_path)  # writes model.safetensors
    ours = GPT(GPTConfig(vocab_size=31, block_size=16, n_layers=2, n_heads=2, d_model=32, activation="gelu_tanh"))
    ours.eval()
    load_gpt2_weights(ours, load_file(tmp_path / "model.safetensors"))
    ids = torch.randint(0, 31, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)


def test_cached_and_uncached_greedy_generation_are_identical():
    model = small_gpt(block_size=64)
    prompt = torch.randint(0, 50, (3, 5))
    cached = generate(model, prompt, 40, temperature=0)
    uncached = generate(model, prompt, 40, temperature=0, use_cache=False)
    assert cached.shape == (3, 45)
    assert torch.equal(cached, uncached)
    assert torch.equal(cached[:, :5], prompt)


def test_generation_beyond_block_size_keeps_going():
    model = small_gpt(block_size=16)
    out = generate(model, torch.randint(0, 50, (1, 20)), 30, temperature=0)
    assert out.shape == (1, 50)


def test_stop_tokens_end_rows():
    model = small_gpt()
    prompt = torch.randint(0, 50, (2, 3))
    first = generate(model, prompt, 1, temperature=0)[:, -1]
    out = generate(model, prompt, 10, temperature=0, stop_tokens=[first[0].item()])
    assert out.shape[1] <= 13
    assert (out[0, 3:] == first[0]).all()  # row 0 stopped at once; its later positions repeat the stop token


def test_sampling_filters():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[True, False, False, True]]
    # probabilities ≈ [0.09, 0.64, 0.24, 0.03]: top_p=0.7 keeps the two most likely
    assert torch.isinf(filter_logits(logits, top_p=0.7)).tolist() == [[True, False, False, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.5)).tolist() == [[True, False, True, True]]
    assert next_token(logits, temperature=0).item() == 1
    generator = torch.Generator().manual_seed(0)
    draws = {next_token(logits, 1.0, top_k=2, generator=generator).item() for _ in range(50)}
    assert draws == {1, 2}
