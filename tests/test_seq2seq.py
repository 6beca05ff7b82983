"""The encoder-decoder model and its decoding: masks, cache, greedy vs beam search."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from lightformer.generation import beam_search, generate, sequence_score
from lightformer.models import EncoderDecoder, EncoderDecoderConfig

BOS, EOS, PAD = 1, 2, 0


def small_model(**kwargs) -> EncoderDecoder:
    torch.manual_seed(0)
    args = dict(
        src_vocab_size=20, tgt_vocab_size=20, max_len=40, n_encoder_layers=2, n_decoder_layers=2, d_model=32, n_heads=4
    )
    return EncoderDecoder(EncoderDecoderConfig(**(args | dict(d_ff=64) | kwargs))).eval()


def greedy(model, src, max_new_tokens=15, use_cache=True):
    prompt = torch.full((src.shape[0], 1), BOS)
    return generate(
        model.incremental_decoder(src), prompt, max_new_tokens, temperature=0, stop_tokens=[EOS], use_cache=use_cache
    )


def hypotheses(out):
    """Rows of generate's output → token lists without BOS, cut before the first EOS."""
    rows = []
    for row in out[:, 1:].tolist():
        rows.append(row[: row.index(EOS)] if EOS in row else row)
    return rows


def score_of(model, src, hyps, length_penalty=1.0):
    """Length-normalised log-probability of each hypothesis (+ EOS unless it ran to the length limit)."""
    scores = []
    for b, hyp in enumerate(hyps):
        ids = torch.tensor([[BOS] + hyp + [EOS]])
        log_probs = model(src[b : b + 1], ids[:, :-1]).log_softmax(-1)
        token_log_probs = log_probs.gather(-1, ids[:, 1:, None])[0, :, 0]
        n = len(hyp) + 1 if len(hyp) < 15 else len(hyp)
        scores.append(sequence_score(token_log_probs[:n].sum().item(), n, length_penalty))
    return scores


@pytest.mark.parametrize("norm_first", [False, True])
def test_source_padding_never_changes_the_translation(norm_first):
    model = small_model(norm_first=norm_first)
    src = torch.randint(3, 20, (1, 6))
    padded = torch.cat([src, torch.full((1, 4), PAD)], 1)
    batch = torch.cat([padded, torch.randint(3, 20, (1, 10))])
    tgt = torch.randint(3, 20, (1, 7))
    torch.testing.assert_close(model(batch, tgt.expand(2, -1))[:1], model(src, tgt), atol=1e-5, rtol=1e-5)
    assert greedy(model, batch)[0].tolist() == greedy(model, src)[0].tolist()


def test_decoder_never_sees_future_target_tokens():
    model = small_model()
    src, tgt = torch.randint(3, 20, (2, 6)), torch.randint(3, 20, (2, 9))
    logits = model(src, tgt)
    changed = tgt.clone()
    changed[:, 5:] = torch.randint(3, 20, (2, 4))
    torch.testing.assert_close(model(src, changed)[:, :5], logits[:, :5])


def test_cached_and_uncached_decoding_are_identical():
    model = small_model()
    src = torch.randint(3, 20, (4, 7))
    assert torch.equal(greedy(model, src), greedy(model, src, use_cache=False))


def test_beam_size_one_is_greedy():
    model = small_model()
    src = torch.randint(3, 20, (8, 7))
    hyps, _ = beam_search(model.incremental_decoder(src, 1), 8, 1, BOS, EOS, 15)
    assert hyps == hypotheses(greedy(model, src))


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_larger_beams_never_score_lower_than_greedy(length_penalty):
    model = small_model()
    src = torch.randint(3, 20, (16, 7))
    greedy_scores = score_of(model, src, hypotheses(greedy(model, src)), length_penalty)
    for beam_size in (2, 4, 8):
        hyps, scores = beam_search(
            model.incremental_decoder(src, beam_size), 16, beam_size, BOS, EOS, 15, length_penalty
        )
        # the scores beam search reports are the model's own scores of its hypotheses
        assert scores == pytest.approx(score_of(model, src, hyps, length_penalty), abs=1e-4)
        assert all(b >= g - 1e-5 for b, g in zip(scores, greedy_scores, strict=True))
    assert any(b > g + 1e-3 for b, g in zip(scores, greedy_scores, strict=True))  # and beams do find better ones


def test_shared_embeddings_need_one_vocabulary():
    with pytest.raises(ValueError, match="src_vocab_size=20 and tgt_vocab_size=30"):
        small_model(tgt_vocab_size=30, share_embeddings=True)
    model = small_model(share_embeddings=True)
    assert model.src_embed is model.tgt_embed and model.output.weight is model.tgt_embed.weight


def test_token_dropout_hides_source_and_target_tokens_in_training_only():
    """In training, a dropped token's embedding is zero (its position remains): the logits equal those of the
    model without token dropout given the same inputs with those embeddings zeroed. Eval mode is unaffected."""
    src, tgt_in = torch.randint(3, 20, (4, 9)), torch.randint(3, 20, (4, 7))
    plain, dropping = small_model(dropout=0.0), small_model(dropout=0.0, token_dropout=0.3)
    dropping.load_state_dict(plain.state_dict())
    torch.testing.assert_close(dropping(src, tgt_in), plain(src, tgt_in))  # eval mode

    dropped = []  # (batch, len) masks, source then target
    hook = dropping.token_dropout.register_forward_hook(lambda m, i, out: dropped.append((out == 0).all(-1)))
    torch.manual_seed(1)
    logits = dropping.train()(src, tgt_in)
    hook.remove()
    assert [m.shape for m in dropped] == [src.shape, tgt_in.shape]
    assert all(m.any() and not m.all() for m in dropped)

    masks = iter(dropped)
    plain.token_dropout.register_forward_hook(lambda m, i, out: out * ~next(masks).unsqueeze(-1))
    torch.testing.assert_close(logits, plain(src, tgt_in))
    with pytest.raises(ValueError, match="token_dropout=1.5"):
        small_model(token_dropout=1.5)


def test_initial_logits_have_unit_variance():
    """Tied output over N(0, 1/d) embeddings gives logits ~ N(0, 1), so the first loss is ln V + 1/2."""
    model = small_model(src_vocab_size=300, tgt_vocab_size=300)
    src, tgt = torch.randint(3, 300, (16, 10)), torch.randint(3, 300, (16, 11))
    logits = model(src, tgt[:, :-1])
    assert logits.std().item() == pytest.approx(1.0, abs=0.15)
    loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
    assert loss.item() == pytest.approx(math.log(300) + 0.5, abs=0.2)


def test_hyperparameters_saved_under_the_former_name_tie_output_still_build_the_same_model():
    saved = {"src_vocab_size": 20, "tgt_vocab_size": 20, "d_model": 32, "n_heads": 4, "tie_output": False}
    config = EncoderDecoderConfig(**saved)  # as a task rebuilds it from a checkpoint's hyperparameters
    assert config.tie_weights is False and "tie_output" not in dataclasses.asdict(config)
    model = EncoderDecoder(config)
    assert model.output.weight is not model.tgt_embed.weight
    assert EncoderDecoderConfig(**(saved | {"tie_output": True})).tie_weights is True
    with pytest.raises(ValueError, match="tie_output=True .* contradicts tie_weights=False; give tie_weights only"):
        EncoderDecoderConfig(tie_weights=False, tie_output=True)
