"""Multi-head attention against a float64 reference, torch.nn.MultiheadAttention, and the KV cache."""

import math

import pytest
import torch
from torch import nn

from lightformer.nn import KVCache, MultiHeadAttention, RotaryEmbedding, causal_mask, explicit_attention


def reference_attention(mha: MultiHeadAttention, x, context=None, mask=None):
    """softmax(QKᵀ/√d_k + M)V per head, heads concatenated, then W^O, in float64 loops."""
    context = x if context is None else context
    w = mha.qkv.weight.double()
    b = mha.qkv.bias.double()
    d, h = mha.d_model, mha.n_heads
    dk = d // h
    q = x.double() @ w[:d].T + b[:d]
    k = context.double() @ w[d : 2 * d].T + b[d : 2 * d]
    v = context.double() @ w[2 * d :].T + b[2 * d :]
    out = torch.zeros(x.shape[0], x.shape[1], d, dtype=torch.float64)
    for batch in range(x.shape[0]):
        heads = []
        for head in range(h):
            sl = slice(head * dk, (head + 1) * dk)
            scores = q[batch, :, sl] @ k[batch, :, sl].T / math.sqrt(dk)
            if mask is not None:
                scores = scores + torch.where(mask[batch], 0.0, float("-inf")).double()
            heads.append(scores.softmax(-1) @ v[batch, :, sl])
        out[batch] = torch.cat(heads, -1)
    return out @ mha.proj.weight.double().T + mha.proj.bias.double()


@pytest.fixture
def mha():
    torch.manual_seed(0)
    return MultiHeadAttention(d_model=32, n_heads=4).eval()


def padding_mask(lengths, max_len):
    return torch.arange(max_len)[None, :] < torch.tensor(lengths)[:, None]


@pytest.mark.parametrize("path", ["fast", "explicit"])
@pytest.mark.parametrize("kind", ["self", "causal", "cross"])
@pytest.mark.parametrize("padded", [False, True])
def test_attention_matches_float64_reference(mha, path, kind, padded):
    x = torch.randn(3, 7, 32)
    context = torch.randn(3, 5, 32) if kind == "cross" else None
    k_len = 5 if kind == "cross" else 7
    key_mask = padding_mask([k_len, k_len - 2, 3], k_len) if padded else None

    mask = torch.ones(3, 7, k_len, dtype=torch.bool)
    if kind == "causal":
        mask &= torch.ones(7, 7, dtype=torch.bool).tril()
    if padded:
        mask &= key_mask[:, None, :]
    expected = reference_attention(mha, x, context, mask)

    out = mha(x, context, key_mask=key_mask, causal=kind == "causal", return_weights=path == "explicit")
    if path == "explicit":
        out, weights = out
        assert weights.shape == (3, 4, 7, k_len)
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 7))
        assert (weights.masked_select(~mask[:, None]) == 0).all()
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["self", "causal", "cross"])
def test_attention_equals_torch_multihead_attention(mha, kind):
    torch_mha = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    with torch.no_grad():
        torch_mha.in_proj_weight.copy_(mha.qkv.weight)
        torch_mha.in_proj_bias.copy_(mha.qkv.bias)
        torch_mha.out_proj.weight.copy_(mha.proj.weight)
        torch_mha.out_proj.bias.copy_(mha.proj.bias)
    x = torch.randn(2, 6, 32)
    context = torch.randn(2, 9, 32) if kind == "cross" else x
    key_mask = padding_mask([context.shape[1], 4], context.shape[1])
    # torch's conventions are the inverse of ours: True means "masked out".
    torch_attn_mask = ~causal_mask(6, 6) if kind == "causal" else None
    expected, expected_weights = torch_mha(
        x, context, context, key_padding_mask=~key_mask, attn_mask=torch_attn_mask, average_attn_weights=False
    )
    out, weights = mha(
        x, None if kind != "cross" else context, key_mask=key_mask, causal=kind == "causal", return_weights=True
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)


def test_masked_attention_quiz():
    """The lectures' quiz: causal softmax of the given score matrix has alpha_{2,2} = 0.5 (1-indexed)."""
    scores = torch.tensor([[1.0, 0, -1, -1], [1, 1, -1, 0], [0, 1, 1, -1], [-1, -1, 2, 1]])
    # q = 2·S and k = I make QKᵀ/√d_k equal S with d_k = 4.
    q, k = 2 * scores, torch.eye(4)
    _, weights = explicit_attention(q, k, torch.eye(4), causal_mask(4, 4))
    assert weights[1, 1].item() == pytest.approx(0.5)
    assert weights[1, 2:].abs().sum() == 0
    assert weights[0, 0].item() == 1.0


def test_causal_mask_is_bottom_right_aligned():
    assert causal_mask(1, 5).all()  # one new query after 4 cached keys sees everything
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]


def test_fully_cached_attention_matches_full_pass(mha):
    """Feeding a sequence one token at a time through the cache equals one causal pass."""
    x = torch.randn(2, 9, 32)
    full = mha(x, causal=True)
    for cache in (KVCache(), KVCache(max_length=12)):
        steps = [mha(x[:, :3], causal=True, cache=cache)]  # a prompt, then single tokens
        steps += [mha(x[:, t : t + 1], causal=True, cache=cache) for t in range(3, 9)]
        torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
        assert cache.length == 9


def test_cached_cross_attention_projects_memory_once(mha):
    memory, x = torch.randn(2, 5, 32), torch.randn(2, 4, 32)
    cache = KVCache()
    first = mha(x[:, :2], memory, cache=cache)
    keys = cache.keys
    second = mha(x[:, 2:], memory, cache=cache)
    assert cache.keys is keys and cache.length == 5  # the memory was projected once
    torch.testing.assert_close(torch.cat([first, second], 1), mha(x, memory), atol=1e-6, rtol=1e-5)


def test_kv_cache_overflow_and_reorder():
    cache = KVCache(max_length=3)
    k = torch.arange(2 * 1 * 2 * 1.0).view(2, 1, 2, 1)
    cache.append(k, k)
    cache.reorder(torch.tensor([1, 1]))
    assert cache.get()[0][:, 0, :, 0].tolist() == [[2.0, 3.0], [2.0, 3.0]]
    with pytest.raises(ValueError, match="max_length=3"):
        cache.append(k, k)


def test_rotary_cached_decoding_matches_full_pass():
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, rotary=RotaryEmbedding(8, max_len=16)).eval()
    x = torch.randn(2, 6, 32)
    cache = KVCache(max_length=6)
    steps = [mha(x[:, t : t + 1], causal=True, cache=cache) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), mha(x, causal=True), atol=1e-5, rtol=1e-5)


def test_heads_must_divide_d_model():
    with pytest.raises(ValueError, match="d_model=30 is not divisible by n_heads=4"):
        MultiHeadAttention(30, 4)


# (16, unpadded): attention written out in bf16 on CPU; (16, padded): SDPA's math kernel; (200, ...): SDPA
@pytest.mark.parametrize(("length", "padded"), [(16, False), (16, True), (200, False), (200, True)])
@pytest.mark.parametrize("causal", [False, True])
def test_bf16_autocast_on_cpu_matches_fp32(length, padded, causal):
    torch.manual_seed(0)
    attn = MultiHeadAttention(64, 4)
    x = torch.randn(2, length, 64, requires_grad=True)
    key_mask = None
    if padded:
        key_mask = torch.ones(2, length, dtype=torch.bool)
        key_mask[1, length - 5 :] = False
    reference = attn(x, key_mask=key_mask, causal=causal)
    (reference_grad,) = torch.autograd.grad(reference.square().sum(), x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attn(x, key_mask=key_mask, causal=causal)
    (grad,) = torch.autograd.grad(out.float().square().sum(), x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(grad, reference_grad, atol=5e-2, rtol=5e-2)
