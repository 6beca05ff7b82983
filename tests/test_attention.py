"""Multi-head attention against a float64 reference, torch.nn.MultiheadAttention, and the KV cache."""

import math

import pytest
import torch
from torch import nn

from lightformer.nn import (
    KVCache,
    MultiHeadAttention,
    RotaryEmbedding,
    attention_kernel,
    causal_mask,
    explicit_attention,
)
from lightformer.nn import attention as attention_module


def in_projection(mha: MultiHeadAttention) -> tuple[torch.Tensor, torch.Tensor]:
    """The input projection's weight and bias packed as rows [W^Q; W^K; W^V] (torch's ``in_proj_weight``)."""
    if mha.cross_attention:
        return torch.cat([mha.q.weight, mha.kv.weight]), torch.cat([mha.q.bias, mha.kv.bias])
    return mha.qkv.weight, mha.qkv.bias


def reference_attention(mha: MultiHeadAttention, x, context=None, mask=None):
    """softmax(QKᵀ/√d_k + M)V per head, heads concatenated, then W^O, in float64 loops."""
    context = x if context is None else context
    w, b = (t.double() for t in in_projection(mha))
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


@pytest.fixture
def cross_mha():
    torch.manual_seed(0)
    return MultiHeadAttention(d_model=32, n_heads=4, cross_attention=True).eval()


def padding_mask(lengths, max_len):
    return torch.arange(max_len)[None, :] < torch.tensor(lengths)[:, None]


@pytest.mark.parametrize("path", ["fast", "explicit"])
@pytest.mark.parametrize("kind", ["self", "causal", "cross"])
@pytest.mark.parametrize("padded", [False, True])
def test_attention_matches_float64_reference(mha, cross_mha, path, kind, padded):
    mha = cross_mha if kind == "cross" else mha
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
def test_attention_equals_torch_multihead_attention(mha, cross_mha, kind):
    mha = cross_mha if kind == "cross" else mha
    torch_mha = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    with torch.no_grad():
        torch_mha.in_proj_weight.copy_(in_projection(mha)[0])
        torch_mha.in_proj_bias.copy_(in_projection(mha)[1])
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


def test_cached_cross_attention_projects_memory_once(cross_mha):
    mha = cross_mha
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


def test_self_and_cross_attention_refuse_the_other_call():
    with pytest.raises(ValueError, match="self-attention: build MultiHeadAttention\\(cross_attention=True\\)"):
        MultiHeadAttention(32, 4)(torch.randn(1, 2, 32), torch.randn(1, 3, 32))
    with pytest.raises(ValueError, match="cross-attention: pass the sequence to attend to as `context`"):
        MultiHeadAttention(32, 4, cross_attention=True)(torch.randn(1, 2, 32))


def test_cross_attention_saved_with_one_packed_qkv_loads_split(cross_mha):
    packed_w, packed_b = in_projection(cross_mha)
    old = {"qkv.weight": packed_w.clone(), "qkv.bias": packed_b.clone()}
    old |= {k: v.clone() for k, v in cross_mha.state_dict().items() if k.startswith("proj.")}
    torch.manual_seed(5)
    fresh = MultiHeadAttention(32, 4, cross_attention=True).eval()
    fresh.load_state_dict(old, strict=True)
    x, memory = torch.randn(2, 3, 32), torch.randn(2, 5, 32)
    torch.testing.assert_close(fresh(x, memory), cross_mha(x, memory), atol=0, rtol=0)


BF16, FP32 = torch.bfloat16, torch.float32


@pytest.mark.parametrize(
    ("device", "dtype", "keys", "masked", "dropout", "need_weights", "kernel"),
    [
        # the weights are needed: only the written-out form has them, on every device
        ("cpu", FP32, 16, True, True, True, "explicit"),
        ("cuda", BF16, 4096, False, False, True, "explicit"),
        # GPUs: SDPA picks its kernel, whatever the mask, dtype, length or dropout
        ("cuda", BF16, 16, False, False, False, "sdpa"),
        ("cuda", FP32, 16, True, True, False, "sdpa"),
        ("mps", torch.float16, 64, False, True, False, "sdpa"),
        # CPU, 16 bits, short unmasked keys: written out in 16 bits (with or without dropout)
        ("cpu", BF16, 128, False, False, False, "explicit"),
        ("cpu", torch.float16, 16, False, True, False, "explicit"),
        # CPU with dropout otherwise: written out in fp32 with fast masks
        ("cpu", BF16, 129, False, True, False, "explicit_fp32"),
        ("cpu", BF16, 16, True, True, False, "explicit_fp32"),
        ("cpu", FP32, 16, False, True, False, "explicit_fp32"),
        # CPU with a mask tensor, no dropout: SDPA's math kernel (also in 16 bits)
        ("cpu", FP32, 16, True, False, False, "sdpa_math"),
        ("cpu", BF16, 16, True, False, False, "sdpa_math"),
        # CPU otherwise: SDPA's choice
        ("cpu", FP32, 16, False, False, False, "sdpa"),
        ("cpu", BF16, 512, False, False, False, "sdpa"),
    ],
)
def test_attention_kernel_choice(device, dtype, keys, masked, dropout, need_weights, kernel):
    assert attention_kernel(device, dtype, keys, masked=masked, dropout=dropout, need_weights=need_weights) == kernel


@pytest.mark.parametrize("kernel", ["explicit", "explicit_fp32", "sdpa_math", "sdpa"])
@pytest.mark.parametrize("kind", ["causal", "padded"])
def test_every_kernel_computes_the_same_attention(mha, monkeypatch, kernel, kind):
    x = torch.randn(3, 7, 32)
    key_mask = padding_mask([7, 5, 3], 7) if kind == "padded" else None
    mask = torch.ones(3, 7, 7, dtype=torch.bool)
    mask = mask & (key_mask[:, None, :] if kind == "padded" else causal_mask(7, 7))
    chosen = []
    monkeypatch.setattr(attention_module, "attention_kernel", lambda *args, **kwargs: chosen.append(1) or kernel)
    out = mha(x, key_mask=key_mask, causal=kind == "causal")
    assert chosen
    torch.testing.assert_close(out.double(), reference_attention(mha, x, None, mask), atol=1e-5, rtol=1e-5)


def test_fp32_kernel_under_bf16_autocast_computes_what_the_16_bit_kernel_does(mha, monkeypatch):
    """Autocast casts ``q.float() @ k.float()`` back to bf16: "explicit_fp32" is fp32 only outside autocast (its
    docstring says so; the translation recipe's figures were measured this way)."""
    x = torch.randn(3, 7, 32)
    outs = {}
    for kernel in ("explicit", "explicit_fp32"):
        monkeypatch.setattr(attention_module, "attention_kernel", lambda *args, kernel=kernel, **kwargs: kernel)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs[kernel] = mha(x, causal=True)
    torch.testing.assert_close(outs["explicit_fp32"], outs["explicit"], atol=0, rtol=0)
