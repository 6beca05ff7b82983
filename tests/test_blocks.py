"""Positions, embeddings, feed-forward, norms, and encoder/decoder stacks."""

import math

import pytest
import torch
from torch import nn

from lightformer.nn import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    PatchEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEmbedding,
    TokenDropout,
    TokenEmbedding,
    dropout,
    make_norm,
    sinusoidal_table,
)


def test_sinusoidal_table_matches_formula():
    d = 16
    table = sinusoidal_table(50, d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_absolute_positions_respect_offset_and_length():
    x = torch.zeros(1, 3, 8)
    for pe in (SinusoidalPositionalEmbedding(8, 10), LearnedPositionalEmbedding(8, 10)):
        full = pe(torch.zeros(1, 10, 8))
        torch.testing.assert_close(pe(x, offset=4), full[:, 4:7])
        with pytest.raises(ValueError, match="max_len=10"):
            pe(x, offset=8)


def test_rope_score_depends_only_on_offset():
    rope = RotaryEmbedding(head_dim=16, max_len=64)
    q, k = torch.randn(16), torch.randn(16)

    def score(m, n):
        qm = rope(q.expand(1, 1, 64, 16))[0, 0, m]
        kn = rope(k.expand(1, 1, 64, 16))[0, 0, n]
        return (qm @ kn).item()

    for delta in (0, 3, 10):
        scores = [score(m + delta, m) for m in (0, 5, 20, 40)]
        assert max(scores) - min(scores) < 1e-4
    assert abs(score(3, 0) - score(10, 0)) > 1e-3  # and it does depend on the offset


def test_rope_preserves_norm_and_needs_even_dim():
    rope = RotaryEmbedding(8)
    x = torch.randn(2, 3, 5, 8)
    torch.testing.assert_close(rope(x, offset=7).norm(dim=-1), x.norm(dim=-1))
    with pytest.raises(ValueError, match="head_dim=7"):
        RotaryEmbedding(7)


def test_token_embedding_scaling():
    emb = TokenEmbedding(1000, 16, scale=True)
    ids = torch.tensor([[1, 2]])
    torch.testing.assert_close(emb(ids), emb.weight[ids] * 4.0)
    assert emb(torch.arange(1000)).std().item() == pytest.approx(1.0, abs=0.05)  # unit variance once scaled


@pytest.mark.parametrize("p", [0.01, 0.1, 0.3, 0.5])
def test_dropout_drops_at_its_rate_keeps_the_expectation_and_backpropagates_through_its_mask(p):
    x = torch.full((1000, 999), 2.0, requires_grad=True)  # an odd size: the last 64-bit draw is partly used
    torch.manual_seed(0)
    out = dropout(x, p)
    kept = out != 0
    assert (1 - kept.float().mean()).item() == pytest.approx(p, abs=0.002)  # 1M elements: sd <= 0.0005
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 2.0 / (1 - p)), rtol=1e-4, atol=0)
    assert out.mean().item() == pytest.approx(2.0, rel=0.01)
    out.sum().backward()
    torch.testing.assert_close(x.grad, out.detach() / 2.0)  # gradient: the mask times the scale
    rows = (out != 0).float().mean(1)
    assert rows.std().item() < 3 * (p * (1 - p) / 999) ** 0.5  # no row is dropped more than chance allows
    torch.manual_seed(0)
    torch.testing.assert_close(dropout(x, p), out)  # torch's seeded generator: runs repeat
    assert dropout(x, p, training=False) is x
    half = dropout(x.detach().bfloat16(), p)
    assert half.dtype == torch.bfloat16


def test_attention_dropout_keeps_the_expected_output_on_the_cpu_path():
    """With a padding mask and dropout on CPU, attention is written out in fp32 with `dropout`'s masks (SDPA's
    CPU masks are slow): averaged over many draws it equals attention without dropout."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2, dropout=0.3).train()
    x = torch.randn(2, 5, 16)
    key_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    with torch.no_grad():
        exact = attn.eval()(x, key_mask=key_mask)
        attn.train()
        draws = torch.stack([attn(x, key_mask=key_mask) for _ in range(3000)])
    assert not torch.allclose(draws[0], exact, atol=1e-3)
    torch.testing.assert_close(draws.mean(0), exact, atol=0.03, rtol=0)


def test_token_dropout_zeroes_whole_tokens_at_its_rate_and_only_in_training():
    drop = TokenDropout(0.2)
    x = torch.randn(400, 250, 8) + 3.0  # no vector is zero by chance
    torch.manual_seed(0)
    out = drop(x)
    dropped = (out == 0).all(-1)
    assert ((out == 0) == dropped.unsqueeze(-1)).all()  # a token is dropped whole or kept whole
    assert dropped.float().mean().item() == pytest.approx(0.2, abs=0.005)  # 100k tokens: sd 0.0013
    torch.testing.assert_close(out[~dropped], x[~dropped], rtol=0, atol=0)  # kept tokens are not rescaled
    torch.manual_seed(0)
    torch.testing.assert_close(drop(x), out)  # drawn from torch's seeded generator: resume stays exact
    drop.eval()
    assert drop(x) is x
    with pytest.raises(ValueError, match=r"token_dropout=1.0 must be in \[0, 1\)"):
        TokenDropout(1.0)


def test_patch_embedding_shapes_and_errors():
    pe = PatchEmbedding(image_size=28, patch_size=4, in_channels=1, d_model=32)
    assert pe(torch.randn(2, 1, 28, 28)).shape == (2, 49, 32)
    with pytest.raises(ValueError, match="image_size=28 is not a multiple of patch_size=5"):
        PatchEmbedding(28, 5, 1, 32)
    with pytest.raises(ValueError, match=r"expected images of shape \(batch, 1, 28, 28\), got \(2, 3, 28, 28\)"):
        pe(torch.randn(2, 3, 28, 28))


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "swiglu"])
def test_feedforward(activation):
    ffn = FeedForward(16, activation=activation)
    assert ffn.fc2.in_features == 64  # d_ff defaults to 4·d_model
    assert ffn(torch.randn(2, 3, 16)).shape == (2, 3, 16)
    x = torch.randn(5, 16, dtype=torch.float64)
    ffn = ffn.double()
    h = x @ ffn.fc1.weight.T + ffn.fc1.bias  # the activations written out from their definitions, in float64
    expected = {
        "relu": lambda: torch.where(h > 0, h, torch.zeros_like(h)),
        "gelu": lambda: 0.5 * h * (1 + torch.erf(h / math.sqrt(2))),  # x·Φ(x)
        "gelu_tanh": lambda: 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3))),
        "swiglu": lambda: h[:, :64] / (1 + torch.exp(-h[:, :64])) * h[:, 64:],  # silu(gate) · value
    }[activation]()
    torch.testing.assert_close(ffn(x), expected @ ffn.fc2.weight.T + ffn.fc2.bias)


def test_norms():
    assert isinstance(make_norm("layernorm", 8), nn.LayerNorm)
    rms = make_norm("rmsnorm", 8)
    x = torch.randn(4, 8)
    torch.testing.assert_close(rms(x), x / x.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt())
    with pytest.raises(ValueError, match="'layernorm', 'rmsnorm'"):
        make_norm("batchnorm", 8)


def make_stacks(norm_first: bool, n_layers: int = 2, d_model: int = 32, norm: str = "layernorm", rope: bool = False):
    kwargs = dict(d_model=d_model, n_heads=4, d_ff=64, dropout=0.0, norm=norm, norm_first=norm_first)
    final = make_norm(norm, d_model) if norm_first else None
    rotary = RotaryEmbedding(d_model // 4) if rope else None
    encoder = Encoder([EncoderLayer(**kwargs) for _ in range(n_layers)], final)
    decoder = Decoder([DecoderLayer(**kwargs, rotary=rotary) for _ in range(n_layers)], final)
    return encoder.eval(), decoder.eval()


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_is_causal(norm_first):
    torch.manual_seed(0)
    _, decoder = make_stacks(norm_first)
    memory, x = torch.randn(2, 5, 32), torch.randn(2, 8, 32)
    out = decoder(x, memory)
    for t in (0, 3, 6):
        changed = x.clone()
        changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :])
        torch.testing.assert_close(decoder(changed, memory)[:, : t + 1], out[:, : t + 1])
        assert not torch.allclose(decoder(changed, memory)[:, t + 1 :], out[:, t + 1 :])


@pytest.mark.parametrize("norm_first", [True, False])
def test_padding_never_changes_real_positions(norm_first):
    torch.manual_seed(0)
    encoder, decoder = make_stacks(norm_first)
    src = torch.randn(2, 6, 32)
    key_mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    memory = encoder(src, key_mask=key_mask)
    tgt = torch.randn(2, 3, 32)
    out = decoder(tgt, memory, memory_key_mask=key_mask)

    noisy = src.clone()
    noisy[1, 4:] = 100 * torch.randn(2, 32)
    noisy_memory = encoder(noisy, key_mask=key_mask)
    torch.testing.assert_close(noisy_memory[1, :4], memory[1, :4])
    torch.testing.assert_close(decoder(tgt, noisy_memory, memory_key_mask=key_mask), out)
    # and the unpadded sentence alone gives the same result as inside the padded batch
    alone = decoder(tgt[1:], encoder(src[1:, :4]))
    torch.testing.assert_close(alone, out[1:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("norm_first", [True, False])
def test_cached_decoding_equals_full_pass(norm_first, rope):
    torch.manual_seed(0)
    _, decoder = make_stacks(norm_first, rope=rope)
    memory, x = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    full = decoder(x, memory)
    cache = decoder.new_cache(max_length=7)
    steps = [decoder(x[:, :2], memory, cache=cache)]
    steps += [decoder(x[:, t : t + 1], memory, cache=cache) for t in range(2, 7)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 7


def test_decoder_with_cross_attention_needs_memory():
    _, decoder = make_stacks(True)
    with pytest.raises(ValueError, match="pass the encoder output as `memory`"):
        decoder(torch.randn(1, 2, 32))


class TinySeq2Seq(nn.Module):
    """Embeddings + sinusoidal positions + the shared stacks + a linear head: enough to learn to reverse."""

    def __init__(self, vocab: int, norm_first: bool, norm: str):
        super().__init__()
        self.embed = TokenEmbedding(vocab, 64, scale=True)
        self.pos = SinusoidalPositionalEmbedding(64, 32)
        self.encoder, self.decoder = make_stacks(norm_first, n_layers=2, d_model=64, norm=norm)
        self.head = nn.Linear(64, vocab)

    def forward(self, src, tgt_in):
        memory = self.encoder(self.pos(self.embed(src)))
        return self.head(self.decoder(self.pos(self.embed(tgt_in)), memory))


@pytest.mark.parametrize(("norm_first", "norm"), [(True, "layernorm"), (False, "layernorm"), (True, "rmsnorm")])
def test_pre_and_post_norm_stacks_learn_to_reverse(norm_first, norm):
    torch.manual_seed(0)
    vocab, bos, length = 12, 1, 8  # tokens 2..11 are symbols
    model = TinySeq2Seq(vocab, norm_first, norm).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=optimizer.param_groups[0]["lr"], total_steps=300)
    for _ in range(300):
        src = torch.randint(2, vocab, (64, length))
        tgt = src.flip(1)
        tgt_in = torch.cat([torch.full((64, 1), bos), tgt[:, :-1]], 1)
        loss = nn.functional.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    src = torch.randint(2, vocab, (256, length))
    tgt_in = torch.cat([torch.full((256, 1), bos), src.flip(1)[:, :-1]], 1)
    accuracy = (model(src, tgt_in).argmax(-1) == src.flip(1)).float().mean().item()
    assert accuracy >= 0.95, f"token accuracy {accuracy:.3f}"
