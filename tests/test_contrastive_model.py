"""The contrastive dual encoder: its embeddings, temperature and bias, the config's refusals, warm starts of either
tower by its names; and the image tower's CLIP/SigLIP options (``pre_norm``, attention pooling) against timm's."""

import math

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer as TimmViT

from lightformer.models import VisionTransformer, ViTConfig, lightformer_to_timm, load_timm_weights
from lightformer.models.contrastive import MAX_LOGIT_SCALE, ContrastiveConfig, ContrastiveModel
from lightformer.models.gpt import GPT, GPTConfig
from lightformer.models.vit import attention_rollout

IMAGE = dict(image_size=16, patch_size=8, d_model=32, n_layers=2, n_heads=4, d_ff=64)
TEXT = dict(vocab_size=40, block_size=16, d_model=48, n_layers=2, n_heads=4, d_ff=96)
PAD = 0


def model_of(**fields) -> ContrastiveModel:
    torch.manual_seed(0)
    image, text = fields.pop("image", {}), fields.pop("text", {})
    fields = dict(embed_dim=24, pad_id=PAD) | fields
    return ContrastiveModel(ContrastiveConfig(image=IMAGE | image, text=TEXT | text, **fields)).eval()


def captions(lengths, width=None, seed=0) -> torch.Tensor:
    """[BOS] ids [EOS] PAD… of the given numbers of ids (ids 4.. are ordinary tokens)."""
    generator = torch.Generator().manual_seed(seed)
    width = width or max(lengths) + 2
    rows = []
    for n in lengths:
        ids = torch.randint(4, TEXT["vocab_size"], (n,), generator=generator).tolist()
        rows.append([1, *ids, 2] + [PAD] * (width - n - 2))
    return torch.tensor(rows)


def test_embeddings_are_unit_vectors_of_embed_dim():
    model = model_of()
    images, ids = torch.randn(3, 3, 16, 16), captions([3, 5, 1, 7])
    with torch.no_grad():
        image_embeddings, text_embeddings = model(images, ids)
        logits = model.logits(image_embeddings, text_embeddings)
    assert image_embeddings.shape == (3, 24) and text_embeddings.shape == (4, 24)
    torch.testing.assert_close(image_embeddings.norm(dim=-1), torch.ones(3))
    torch.testing.assert_close(text_embeddings.norm(dim=-1), torch.ones(4))
    assert logits.shape == (3, 4)
    torch.testing.assert_close(logits, model.scale() * image_embeddings @ text_embeddings.T)


def test_logit_scale_starts_as_clip_and_is_clamped_at_100():
    model = model_of()
    assert model.scale().item() == pytest.approx(1 / 0.07)
    with torch.no_grad():
        model.logit_scale.fill_(MAX_LOGIT_SCALE + 1.0)
    assert model.scale().item() == pytest.approx(100.0)
    model.scale().backward()
    assert model.logit_scale.grad.item() == 0.0  # clamped: no gradient pushes it further


def test_sigmoid_bias_only_for_the_sigmoid_loss():
    assert model_of().logit_bias is None
    assert "logit_bias" not in model_of().state_dict()
    model = model_of(loss="sigmoid")
    assert model.logit_bias.item() == -10.0 and model.scale().item() == pytest.approx(10.0)
    image_embeddings, text_embeddings = torch.eye(2, 24), torch.eye(2, 24)
    torch.testing.assert_close(model.logits(image_embeddings, text_embeddings),
                               10.0 * torch.eye(2) - 10.0)  # fmt: skip


@pytest.mark.parametrize("text_pool", ["eos", "mean"])
def test_padding_after_the_end_token_changes_nothing(text_pool):
    model = model_of(text_pool=text_pool)
    ids = captions([3, 6])
    longer = torch.cat([ids, torch.full((2, 5), PAD)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model.encode_text(longer), model.encode_text(ids))


@pytest.mark.parametrize("text_pool", ["eos", "mean"])
def test_a_captions_features_do_not_depend_on_the_others_in_the_batch(text_pool):
    model = model_of(text_pool=text_pool)
    ids = captions([3, 6, 2, 9])
    with torch.no_grad():
        together = model.encode_text(ids)
        alone = torch.cat([model.encode_text(ids[i : i + 1, : 2 + n]) for i, n in enumerate([3, 6, 2, 9])])
    torch.testing.assert_close(together, alone)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(image={"num_classes": 10}), r"image\.num_classes=10: the image tower .* has no classifier head"),
        (dict(text={"tie_weights": False}), r"text\.tie_weights=false: the text tower .* uses no LM head"),
        (dict(loss="softmax"), r"loss='softmax' is not valid; valid: 'infonce', 'sigmoid'"),
        (dict(image={"dropout_rate": 0.1}), r"the image tower: .*dropout_rate"),
        (dict(embed_dim=0), r"embed_dim=0 must be at least 1"),
        (dict(text_pool="cls"), r"text_pool='cls' is not valid; valid: 'eos', 'mean'"),
    ],
)
def test_config_refusals_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        model_of(**fields)


def test_a_gpt_loads_into_the_text_tower_by_its_names():
    torch.manual_seed(3)
    gpt = GPT(GPTConfig(**TEXT))
    model = model_of()
    missing, unexpected = model.text.load_state_dict(gpt.state_dict(), strict=True)
    assert not missing and not unexpected
    ids = captions([4, 2])
    with torch.no_grad():
        torch.testing.assert_close(model.text.features(ids), gpt.features(ids))


def test_the_mean_pooled_text_tower_is_bidirectional_and_pools_the_real_tokens():
    model = model_of(text_pool="mean")
    assert not model.text.causal and model_of().text.causal
    ids = captions([5])
    changed = ids.clone()
    changed[0, 5] = 4 if ids[0, 5] != 4 else 5  # the last id before EOS
    with torch.no_grad():
        features, other = model.text.features(ids), model.text.features(changed)
        assert not torch.allclose(features[0, 1], other[0, 1])  # the first word reads what follows it
        expected = model.text_projection(features[0, :7].mean(0))
    torch.testing.assert_close(model.encode_text(ids)[0], torch.nn.functional.normalize(expected, dim=-1))


def test_a_gpt_loads_into_the_bidirectional_text_tower_by_its_names():
    torch.manual_seed(3)
    gpt = GPT(GPTConfig(**TEXT))
    model = model_of(text_pool="mean")
    model.text.load_state_dict(gpt.state_dict(), strict=True)
    assert model.text.state_dict().keys() == gpt.state_dict().keys()


def test_a_bidirectional_gpt_neither_decodes_incrementally_nor_cross_attends():
    gpt = GPT(GPTConfig(**TEXT), causal=False)
    with pytest.raises(ValueError, match="no cache"):
        gpt.new_cache()
    with pytest.raises(ValueError, match="causal=True"):
        GPT(GPTConfig(**TEXT), cross_attention=True, causal=False)


def test_a_vit_classifier_without_its_head_loads_into_the_image_tower():
    torch.manual_seed(3)
    vit = VisionTransformer(ViTConfig(**IMAGE, in_channels=3, num_classes=7)).eval()
    model = model_of(image={"pre_norm": False})  # a classifier's shape: a patch bias, no pre-norm
    weights = {k: v for k, v in vit.state_dict().items() if not k.startswith("head.")}
    model.image.load_state_dict(weights, strict=True)
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(model.image(images), vit.forward_head(vit.forward_features(images), True))


# --- the image tower's options, against timm ------------------------------------------------------------------

SHAPE = dict(image_size=28, patch_size=4, in_channels=1, num_classes=10, d_model=64, n_layers=2, n_heads=4, d_ff=128)
TIMM_SHAPE = dict(img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=64, depth=2, num_heads=4,
                  mlp_ratio=2)  # fmt: skip
TIMM_POOLS = {"cls": dict(class_token=True, global_pool="token"), "map": dict(class_token=False, global_pool="map")}


@pytest.mark.parametrize(("pool", "pre_norm"), [("cls", True), ("map", False), ("map", True)])
def test_image_tower_options_match_timm_both_ways(pool, pre_norm):
    images = torch.randn(3, 1, 28, 28)
    torch.manual_seed(1)
    theirs = TimmViT(**TIMM_SHAPE, **TIMM_POOLS[pool], pre_norm=pre_norm).eval()
    torch.manual_seed(0)
    ours = VisionTransformer(ViTConfig(**SHAPE, pool=pool, pre_norm=pre_norm)).eval()
    assert lightformer_to_timm(ours.state_dict()).keys() == theirs.state_dict().keys()
    assert (ours.patch_embed.proj.bias is None) == pre_norm  # as timm's: no patch bias before a pre-norm
    load_timm_weights(ours, theirs.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(ours(images), theirs(images), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.forward_head(ours.forward_features(images), pre_logits=True),
                                   theirs.forward_head(theirs.forward_features(images), pre_logits=True),
                                   atol=1e-5, rtol=1e-5)  # fmt: skip

    torch.manual_seed(2)
    ours = VisionTransformer(ViTConfig(**SHAPE, pool=pool, pre_norm=pre_norm)).eval()
    theirs.load_state_dict(lightformer_to_timm(ours.state_dict()), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(theirs(images), ours(images), atol=1e-5, rtol=1e-5)


def test_defaults_keep_the_vit_as_it_was():
    vit = VisionTransformer(ViTConfig(**SHAPE))
    assert not any(name.startswith(("norm_pre", "attn_pool")) for name in vit.state_dict())
    assert vit.patch_embed.proj.bias is not None and isinstance(vit.norm_pre, torch.nn.Identity)


def test_attention_rollout_through_the_attention_pool_sums_to_one():
    torch.manual_seed(0)
    vit = VisionTransformer(ViTConfig(**SHAPE, pool="map"))
    relevance = attention_rollout(vit, torch.randn(2, 1, 28, 28))
    assert relevance.shape == (2, 7, 7)
    torch.testing.assert_close(relevance.sum(dim=(1, 2)), torch.ones(2))


def test_an_attention_pooled_image_tower_embeds():
    model = model_of(image={"pool": "map", "pre_norm": True})
    with torch.no_grad():
        embeddings = model.encode_image(torch.randn(2, 3, 16, 16))
    assert embeddings.shape == (2, 24) and math.isclose(embeddings[0].norm().item(), 1.0, rel_tol=1e-5)
