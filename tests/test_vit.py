"""The Vision Transformer: timm weight compatibility both ways, patch shapes, positions, init, optimiser groups."""

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer as TimmViT

from lightformer.models import VisionTransformer, ViTConfig, lightformer_to_timm, load_timm_weights, timm_to_lightformer
from lightformer.nn import record_attention
from lightformer.tasks.optim import OptimizerConfig, configure_adamw

SHAPE = dict(image_size=28, patch_size=4, in_channels=1, num_classes=10, d_model=64, n_layers=2, n_heads=4, d_ff=128)
TIMM_SHAPE = dict(
    img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2
)
POOLS = {"cls": dict(class_token=True, global_pool="token"), "mean": dict(class_token=False, global_pool="avg")}


def decayed(model) -> set[int]:
    """Ids of the parameters the tasks' AdamW decays."""
    optimizer = configure_adamw(model, OptimizerConfig(weight_decay=0.05), total_steps=10)["optimizer"]
    return {id(p) for group in optimizer.param_groups if group["weight_decay"] > 0 for p in group["params"]}


def small_vit(**kwargs) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(ViTConfig(**(SHAPE | kwargs))).eval()


def timm_vit(pool: str, seed: int = 1) -> TimmViT:
    torch.manual_seed(seed)
    return TimmViT(**TIMM_SHAPE, **POOLS[pool]).eval()


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_timm_weights_give_identical_logits_both_ways(pool):
    images = torch.randn(3, 1, 28, 28)
    theirs = timm_vit(pool)
    ours = load_timm_weights(small_vit(pool=pool), theirs.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(ours(images), theirs(images), atol=1e-6, rtol=1e-5)

    ours = small_vit(pool=pool)  # fresh weights of our own, into a differently seeded timm model
    theirs = timm_vit(pool, seed=2)
    theirs.load_state_dict(lightformer_to_timm(ours.state_dict()), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(theirs(images), ours(images), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(theirs.forward_features(images), ours.forward_features(images))
    assert timm_to_lightformer(lightformer_to_timm(ours.state_dict())).keys() == ours.state_dict().keys()


def test_sincos_positions_export_to_timm():
    ours = small_vit(position="sincos")
    theirs = timm_vit("cls")
    theirs.load_state_dict(lightformer_to_timm(ours.state_dict()), strict=True)
    images = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(theirs(images), ours(images), atol=1e-6, rtol=1e-5)


def test_timm_features_without_counterpart_are_refused():
    torch.manual_seed(0)
    avg_with_class_token = TimmViT(**TIMM_SHAPE, class_token=True, global_pool="avg")
    with pytest.raises(ValueError, match="cls_token with average pooling"):
        timm_to_lightformer(avg_with_class_token.state_dict())
    layer_scale = TimmViT(**TIMM_SHAPE, init_values=1e-5)
    with pytest.raises(ValueError, match="without a lightformer counterpart"):
        timm_to_lightformer(layer_scale.state_dict())


@pytest.mark.parametrize(("pool", "prefix"), [("cls", 1), ("mean", 0)])
def test_shapes(pool, prefix):
    model = small_vit(pool=pool)
    images = torch.randn(5, 1, 28, 28)
    assert model.patch_embed(images).shape == (5, 7 * 7, 64)  # (B, H/p·W/p, d)
    assert model.forward_features(images).shape == (5, prefix + 49, 64)
    assert model.forward_head(model.forward_features(images), pre_logits=True).shape == (5, 64)
    assert model(images).shape == (5, 10)
    rectangular = small_vit(image_size=32, patch_size=8, in_channels=3, num_classes=0)
    assert rectangular(torch.randn(2, 3, 32, 32)).shape == (2, 64)  # no head: pooled features


def test_image_size_must_be_a_multiple_of_the_patch_size():
    with pytest.raises(ValueError, match="image_size=28 is not a multiple of patch_size=5"):
        ViTConfig(**(SHAPE | dict(patch_size=5)))
    with pytest.raises(ValueError, match=r"expected images of shape \(batch, 1, 28, 28\)"):
        small_vit()(torch.randn(1, 1, 32, 32))


def test_sincos_table_is_fixed_and_two_dimensional():
    model = small_vit(position="sincos", pool="mean")
    table = model.pos_embed.weight
    assert not table.requires_grad
    grid = table.view(7, 7, 4, 16)  # (row, column, [sin x, sin y, cos x, cos y], frequency)
    for quarter, varies_along_rows in ((0, False), (1, True), (2, False), (3, True)):
        other_row_or_column = grid[3] if varies_along_rows else grid[:, 3]
        same_row_or_column = grid[:, 0] if varies_along_rows else grid[0]
        assert not torch.allclose(other_row_or_column[:, quarter], grid[0, 0, quarter].expand(7, 16))
        torch.testing.assert_close(same_row_or_column[:, quarter], grid[0, 0, quarter].expand(7, 16))
    torch.testing.assert_close(grid[2, 5, 0] ** 2 + grid[2, 5, 2] ** 2, torch.ones(16))  # sin² + cos² = 1
    assert id(table) not in decayed(model)
    with pytest.raises(ValueError, match="divisible by 4"):
        ViTConfig(**(SHAPE | dict(position="sincos", d_model=66, n_heads=2)))


def test_init_and_weight_decay_groups_follow_timm():
    model = small_vit(d_model=192, n_heads=3, d_ff=384)
    assert model.pos_embed.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert model.pos_embed.weight.abs().max().item() < 0.15  # timm truncates at ±2 absolute: in effect N(0, .02)
    assert model.cls_token.abs().max().item() < 1e-4
    qkv = model.encoder.layers[0].self_attn.qkv
    assert qkv.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert qkv.bias.abs().max().item() == 0
    assert model.no_weight_decay() == {"pos_embed.weight", "cls_token"}
    decayed_ids = decayed(model)
    assert id(model.pos_embed.weight) not in decayed_ids and id(model.cls_token) not in decayed_ids
    assert id(qkv.weight) in decayed_ids and id(model.patch_embed.proj.weight) in decayed_ids
    assert id(qkv.bias) not in decayed_ids


def test_drop_path_increases_linearly_over_depth():
    model = small_vit(n_layers=5, drop_path=0.2)
    rates = [getattr(layer.drop_path, "drop_prob", 0.0) for layer in model.encoder.layers]
    assert rates == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])
    model.train()
    images = torch.randn(4, 1, 28, 28)
    assert not torch.equal(model(images), model(images))  # stochastic in training
    model.eval()
    torch.testing.assert_close(model(images), model(images))


def test_attention_is_recorded_per_layer():
    model = small_vit(n_layers=3)
    with record_attention(model) as maps:
        model(torch.randn(2, 1, 28, 28))
    assert list(maps) == [f"encoder.layers.{i}.self_attn" for i in range(3)]
    for weights in maps.values():
        assert weights.shape == (2, 4, 50, 50)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 50))


def test_overfits_a_tiny_batch():
    model = small_vit(n_layers=1).train()
    images, labels = torch.randn(16, 1, 28, 28), torch.arange(16) % 10
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(60):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05


def test_qkv_bias_switches_off_the_qkv_bias_only_as_timms():
    ours = small_vit(qkv_bias=False)
    names = ours.state_dict().keys()
    assert "encoder.layers.0.self_attn.qkv.bias" not in names
    layer = "encoder.layers.0."
    assert {f"{layer}self_attn.proj.bias", f"{layer}ffn.fc1.bias", f"{layer}norm1.bias"} <= names
    torch.manual_seed(1)
    theirs = TimmViT(**TIMM_SHAPE, **POOLS["cls"], qkv_bias=False).eval()
    load_timm_weights(ours, theirs.state_dict())
    images = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), theirs(images), atol=1e-6, rtol=1e-5)

    no_bias = small_vit(bias=False).state_dict().keys()
    assert "encoder.layers.0.self_attn.qkv.bias" in no_bias
    layer_biases = [name for name in no_bias if name.startswith("encoder.layers.") and name.endswith(".bias")]
    assert layer_biases == ["encoder.layers.0.self_attn.qkv.bias", "encoder.layers.1.self_attn.qkv.bias"]


def test_weights_saved_when_qkv_bias_switched_off_every_layer_bias_load_and_compute_the_same():
    # Before `bias` existed, qkv_bias=False built the layers of today's qkv_bias=False, bias=False.
    old = small_vit(qkv_bias=False, bias=False)
    with torch.no_grad():
        for p in old.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    saved = {f"model.{k}": v for k, v in old.state_dict().items()}  # as a task's checkpoint holds them
    ours = small_vit(qkv_bias=False)  # the saved config, {"qkv_bias": False, ...}, read today
    holder = torch.nn.Module()
    holder.model = ours
    holder.load_state_dict(saved, strict=True)
    assert ours.encoder.layers[0].ffn.fc1.bias.abs().max().item() == 0
    images = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), old(images))


def test_resuming_a_run_saved_before_bias_existed_asks_for_bias_false_by_name():
    # Its optimizer state has no entry for the layer biases a qkv_bias=False model has today: Lightning would fail
    # on mismatched parameter groups; the task says so, and how to go on from the weights.
    from lightformer.errors import ConfigError
    from lightformer.tasks import ImageClassificationTask

    shape = {"image_size": 28, "patch_size": 7, "in_channels": 1, "num_classes": 10, "d_model": 32, "n_layers": 2}
    shape |= {"n_heads": 2, "d_ff": 64}
    old = ImageClassificationTask(net={**shape, "qkv_bias": False, "bias": False})
    saved = {"state_dict": old.state_dict(), "optimizer_states": [{}]}
    resumed = ImageClassificationTask(net={**shape, "qkv_bias": False})
    with pytest.raises(ConfigError, match="cannot be resumed.*--model.init.checkpoint"):
        resumed.on_load_checkpoint(saved)
    resumed.on_load_checkpoint({"state_dict": saved["state_dict"]})  # weights alone (test, predict): they load
    ImageClassificationTask(net={**shape, "qkv_bias": False, "bias": False}).on_load_checkpoint(saved)
