"""The BERT model: Hugging Face parity and weight import, tied MLM head, fine-tuning by name, config checks,
padding, pre-norm, and a few steps of masked-LM training."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from lightformer.models.bert import (
    BertConfig,
    BertEncoder,
    BertForPreTraining,
    BertForSequenceClassification,
    bert_state_dict_to_lightformer,
    load_bert_weights,
)

transformers = pytest.importorskip("transformers")


def tiny_config(**kwargs) -> BertConfig:
    args = dict(vocab_size=50, max_len=32, n_layers=2, n_heads=2, d_model=32, d_ff=64, dropout=0.0, attn_dropout=0.0)
    return BertConfig(**(args | kwargs))


def hf_pair(vocab, d_model, heads, layers, max_len, d_ff=None, act="gelu", pad_id=0, masked_lm=False):
    """A random HF model (no download) and our BertForPreTraining loaded from it, both in eval mode."""
    torch.manual_seed(0)
    d_ff = d_ff or 4 * d_model
    config = transformers.BertConfig(
        vocab_size=vocab,
        hidden_size=d_model,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=d_ff,
        max_position_embeddings=max_len,
        hidden_act=act,
        pad_token_id=pad_id,
    )
    hf = (transformers.BertForMaskedLM if masked_lm else transformers.BertForPreTraining)(config).eval()
    ours_config = BertConfig(
        vocab_size=vocab,
        max_len=max_len,
        n_layers=layers,
        n_heads=heads,
        d_model=d_model,
        d_ff=d_ff,
        activation="gelu_tanh" if act == "gelu_new" else act,
        pad_id=pad_id,
    )
    ours = BertForPreTraining(ours_config).eval()
    missing = load_bert_weights(ours, hf.state_dict(), strict=not masked_lm)
    return hf, ours, missing


CASES = {
    # (vocab, d_model, heads, layers, max_len, d_ff, HF activation, pad id), batch, padded
    "d32-2heads-2layers": ((97, 32, 2, 2, 40, None, "gelu", 0), (2, 40), False),
    "d48-4heads-3layers-ff96-gelu_new": ((50, 48, 4, 3, 24, 96, "gelu_new", 0), (3, 24), False),
    "padded-pairs-pad1": ((60, 32, 4, 2, 20, 48, "gelu", 1), (4, 20), True),
}


def batch(vocab, pad_id, shape, padded):
    """Ids without padding ids (unless ``padded``: rows of decreasing length) and A/B segment ids."""
    ids = torch.randint(2, vocab, shape)
    segments = torch.zeros_like(ids)
    segments[:, shape[1] // 2 :] = 1
    if padded:
        for row, length in enumerate(torch.linspace(shape[1], 5, shape[0]).long().tolist()):
            ids[row, length:] = pad_id
            segments[row, length:] = 0
    return ids, segments


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_matches_hugging_face_bert_for_pretraining(case):
    shape_args, shape, padded = CASES[case]
    hf, ours, missing = hf_pair(*shape_args)
    assert missing == []
    vocab, pad_id = shape_args[0], shape_args[7]
    ids, segments = batch(vocab, pad_id, shape, padded)
    key_mask = ids != pad_id
    assert key_mask.all() != padded
    with torch.no_grad():
        expected = hf(ids, token_type_ids=segments, attention_mask=key_mask.long())
        mlm, nsp = ours(ids, segments)
    assert mlm.shape == (*shape, vocab) and nsp.shape == (shape[0], 2)
    # Only keys are masked, so padded query rows agree too; compare the real tokens' rows to be safe about HF.
    torch.testing.assert_close(mlm[key_mask], expected.prediction_logits[key_mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nsp, expected.seq_relationship_logits, atol=1e-5, rtol=1e-5)


def test_matches_hugging_face_bert_for_masked_lm():
    with pytest.raises(ValueError, match="strict=False"):  # strict loading refuses the missing heads
        load_bert_weights(BertForPreTraining(tiny_config(vocab_size=40, max_len=16)), _masked_lm_state_dict())
    hf, ours, missing = hf_pair(40, 32, 2, 2, 16, masked_lm=True)
    assert missing == ["nsp_head.bias", "nsp_head.weight", "pooler.dense.bias", "pooler.dense.weight"]
    ids, segments = batch(40, 0, (2, 16), padded=True)
    with torch.no_grad():
        expected = hf(ids, token_type_ids=segments, attention_mask=(ids != 0).long()).logits
        mlm, _ = ours(ids, segments)
    torch.testing.assert_close(mlm, expected, atol=1e-5, rtol=1e-5)


def _masked_lm_state_dict():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
    )
    return transformers.BertForMaskedLM(config).state_dict()


def test_mlm_head_is_tied_to_token_embedding():
    hf, ours, _ = hf_pair(97, 32, 2, 2, 40)
    embed, decoder = ours.bert.embed.weight, ours.mlm_head.decoder.weight
    assert decoder is embed and decoder.data_ptr() == embed.data_ptr()
    torch.testing.assert_close(embed, hf.bert.embeddings.word_embeddings.weight)  # loaded, still one tensor
    with torch.no_grad():
        embed[3] += 1.0
    assert torch.equal(ours.mlm_head.decoder.weight[3], embed[3])
    assert "mlm_head.decoder.weight" not in dict(ours.named_parameters())  # one parameter for the optimizer


def test_conversion_handles_old_names_and_rejects_unknown_or_untied():
    state = _masked_lm_state_dict()
    old = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in state.items()
    }
    old["bert.embeddings.position_ids"] = torch.arange(16)[None]
    assert bert_state_dict_to_lightformer(old).keys() == bert_state_dict_to_lightformer(state).keys()
    with pytest.raises(ValueError, match="classifier.weight"):
        bert_state_dict_to_lightformer(state | {"classifier.weight": torch.zeros(2, 32)})
    untied = state | {"cls.predictions.decoder.weight": torch.randn(40, 32)}
    with pytest.raises(ValueError, match="tied"):
        bert_state_dict_to_lightformer(untied)
    with pytest.raises(ValueError, match="lacks"):  # a 2-layer checkpoint into a 3-layer model
        load_bert_weights(BertForPreTraining(tiny_config(vocab_size=40, max_len=16, n_layers=3)), state, strict=False)


def test_masked_lm_logits_at_selected_positions_only():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config()).eval()
    ids, segments = batch(50, 0, (3, 10), padded=True)
    positions = torch.rand(ids.shape) < 0.3
    with torch.no_grad():
        every, nsp = model(ids, segments)
        selected, nsp_selected = model(ids, segments, mlm_positions=positions)
    assert selected.shape == (int(positions.sum()), 50)
    torch.testing.assert_close(selected, every[positions])
    torch.testing.assert_close(nsp_selected, nsp)


def test_classifier_loads_encoder_and_pooler_of_a_pretraining_checkpoint():
    torch.manual_seed(0)
    config = tiny_config()
    pretrained = BertForPreTraining(config).eval()
    classifier = BertForSequenceClassification(replace(config, num_classes=3)).eval()
    fresh = classifier.classifier.weight.clone()
    result = classifier.load_state_dict(pretrained.state_dict(), strict=False)
    assert sorted(result.missing_keys) == ["classifier.bias", "classifier.weight"]
    assert result.unexpected_keys and all(k.startswith(("mlm_head.", "nsp_head.")) for k in result.unexpected_keys)
    assert torch.equal(classifier.classifier.weight, fresh)
    ids, segments = batch(50, 0, (4, 12), padded=True)
    with torch.no_grad():
        torch.testing.assert_close(
            classifier.pooler(classifier.bert(ids, segments)), pretrained.pooler(pretrained.bert(ids, segments))
        )
        logits = classifier(ids, segments)
    assert logits.shape == (4, 3) and torch.isfinite(logits).all()


def test_config_validation():
    with pytest.raises(ValueError, match=r"d_model=50 .*n_heads=4"):
        BertConfig(vocab_size=10, d_model=50, n_heads=4)
    with pytest.raises(ValueError, match="vocab_size is not set"):
        BertEncoder(BertConfig())
    with pytest.raises(ValueError, match="pad_id=10"):
        BertConfig(vocab_size=10, pad_id=10)
    with pytest.raises(ValueError, match="activation='swiglu'"):
        BertConfig(activation="swiglu")
    with pytest.raises(ValueError, match="dropout=1.5"):
        BertConfig(dropout=1.5)
    with pytest.raises(ValueError, match="num_classes=0"):
        BertConfig(num_classes=0)
    with pytest.raises(ValueError, match="classifier_dropout=-0.1"):
        BertConfig(classifier_dropout=-0.1)


def test_initialisation_follows_bert():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config(vocab_size=2000, d_model=64, n_heads=4, d_ff=256))
    assert model.bert.embed.weight[1:].std().item() == pytest.approx(0.02, rel=0.05)
    assert model.bert.encoder.layers[0].ffn.fc1.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert not model.bert.embed.weight[0].any()  # the padding row, as HF
    assert not model.bert.encoder.layers[0].self_attn.qkv.bias.any() and not model.mlm_head.bias.any()
    assert torch.equal(model.bert.embed_norm.weight, torch.ones(64))


def test_padding_is_masked_out_of_attention():
    torch.manual_seed(0)
    model = BertEncoder(tiny_config()).eval()
    ids = torch.randint(1, 50, (2, 10))
    padded = torch.cat([ids, torch.zeros(2, 6, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded)[:, :10], model(ids), atol=1e-5, rtol=1e-5)
        explicit = model(padded, torch.zeros_like(padded), key_mask=padded != 0)
    torch.testing.assert_close(explicit, model(padded))


def test_pre_norm_variant_builds_and_runs():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config(norm_first=True)).eval()
    assert isinstance(model.bert.encoder.norm, torch.nn.LayerNorm)
    ids, segments = batch(50, 0, (2, 12), padded=True)
    mlm, nsp = model(ids, segments)
    assert mlm.shape == (2, 12, 50) and nsp.shape == (2, 2)
    assert torch.isfinite(mlm).all() and torch.isfinite(nsp).all()
    with pytest.raises(ValueError, match="post-norm"):
        load_bert_weights(model, _masked_lm_state_dict())


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_rotary_positions_make_the_encoder_see_distances_only(position):
    """With rotary positions a text reads the same wherever it starts (after padding that no token attends to);
    with BERT's learned table it does not."""
    torch.manual_seed(0)
    encoder = BertEncoder(tiny_config(position=position, norm_first=True)).eval()
    ids = torch.randint(4, 50, (1, 10))
    shifted = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)  # 3 pads (pad_id 0) first
    same = torch.allclose(encoder(shifted)[:, 3:], encoder(ids), atol=1e-5)
    assert same == (position == "rope")
    assert (encoder.position is None) == (position == "rope")


def test_masked_lm_training_lowers_the_loss():
    torch.manual_seed(0)
    vocab, mask_id = 20, 1
    model = BertForPreTraining(tiny_config(vocab_size=vocab, max_len=16)).train()
    ids = (torch.arange(16)[None] % 6 + 2).repeat(8, 1)  # 2..7 repeated
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        masked = torch.rand(ids.shape) < 0.15
        masked[:, 0] = True
        inputs = ids.masked_fill(masked, mask_id)
        labels = ids.masked_fill(~masked, -100)
        mlm, nsp = model(inputs)
        loss = F.cross_entropy(mlm.flatten(0, 1), labels.flatten()) + F.cross_entropy(nsp, torch.zeros(8).long())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert model.bert.embed.weight.grad is not None and model.bert.position.weight.grad is not None
    assert sum(losses[-5:]) / 5 < 0.4 * sum(losses[:5]) / 5  # about 3.2 → 0.6
