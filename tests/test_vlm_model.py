"""The vision-language model and the blocks it added: a ViT read at any image size and up to any block, a GPT over
input embeddings with a span that attends both ways, the placeholder's expansion, decoding with the cache, errors."""

import copy
import math

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer as TimmViT

from lightformer.generation import beam_search, generate
from lightformer.models import GPT, GPTConfig, VisionTransformer, ViTConfig, lightformer_to_timm
from lightformer.models.contrastive import ContrastiveConfig, ContrastiveModel
from lightformer.models.vit import resample_positions
from lightformer.models.vlm import VisionLanguageConfig, VisionLanguageModel, pixel_shuffle

VOCAB = 20
IMAGE = dict(image_size=16, patch_size=4, d_model=32, n_layers=2, n_heads=2, d_ff=64)
TEXT = dict(vocab_size=VOCAB, block_size=40, d_model=32, n_layers=2, n_heads=2, d_ff=64)


def small_vlm(**kwargs) -> VisionLanguageModel:
    torch.manual_seed(0)
    config = VisionLanguageConfig(**({"image": IMAGE, "text": TEXT, "pixel_shuffle": 2} | kwargs))
    return VisionLanguageModel(config).eval()


def ids_with_placeholder(places: list[int], length: int, seed: int = 1) -> torch.Tensor:
    """Random text ids with the placeholder at ``places[row]`` in each row."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (len(places), length), generator=generator)
    ids[torch.arange(len(places)), torch.tensor(places)] = VOCAB
    return ids


# --- the ViT at any size, up to any block ------------------------------------------------------------------


def small_vit(**kwargs) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(ViTConfig(**(IMAGE | dict(num_classes=0, pre_norm=True) | kwargs))).eval()


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_vit_reads_other_sizes_as_timms_dynamic_img_size(pool):
    ours = small_vit(pool=pool)
    theirs = TimmViT(
        img_size=16,
        patch_size=4,
        in_chans=3,
        num_classes=0,
        embed_dim=32,
        depth=2,
        num_heads=2,
        mlp_ratio=2,
        class_token=pool == "cls",
        global_pool="token" if pool == "cls" else "avg",
        pre_norm=True,
        dynamic_img_size=True,
    ).eval()
    theirs.load_state_dict(lightformer_to_timm(ours.state_dict()), strict=True)
    with torch.no_grad():
        at_size = torch.randn(2, 3, 16, 16)
        assert torch.equal(ours.encoder.norm(ours.hidden_state(at_size)), ours.forward_features(at_size))
        for height, width in ((24, 32), (8, 12)):
            images = torch.randn(2, 3, height, width)
            x = theirs.norm_pre(theirs._pos_embed(theirs.patch_embed(images)))
            torch.testing.assert_close(ours.hidden_state(images, 0), theirs.blocks[0](x))
            final = ours.hidden_state(images, -1)
            if pool == "cls":
                final = ours.encoder.norm(final)
            torch.testing.assert_close(final, theirs.forward_features(images), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"images of 18×16 pixels are not tiled by patches of 4×4"):
        ours.hidden_state(torch.randn(1, 3, 18, 16))
    with pytest.raises(ValueError, match=r"layer=2 is not a block of this ViT's 2: give -2..1"):
        ours.hidden_state(torch.randn(1, 3, 16, 16), 2)
    with pytest.raises(ValueError, match=r"expected images of shape \(batch, 3, 16, 16\)"):
        ours(torch.randn(1, 3, 24, 32))  # the classifier's own path still reads its config's size alone


# --- the GPT over embeddings with a bidirectional span -------------------------------------------------------


def small_gpt(position: str = "learned") -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**(TEXT | dict(position=position)))).eval()


def reference_logits(model: GPT, x: torch.Tensor, span: torch.Tensor) -> torch.Tensor:
    """The GPT's logits in float64 written out: explicit mask (causal, or both ways inside the span), softmax."""
    model = copy.deepcopy(model).double()
    t, h = x.shape[1], model.config.n_heads
    x = x.double()
    if model.position is not None:
        x = model.position(x)
    allowed = torch.ones(t, t).tril().bool()[None] | (span[:, :, None] & span[:, None, :])
    for layer in model.decoder.layers:
        attn = layer.self_attn
        q, k, v = attn.qkv(layer.norm1(x)).chunk(3, dim=-1)
        q, k, v = (z.reshape(len(x), t, h, -1).transpose(1, 2) for z in (q, k, v))
        if attn.rotary is not None:
            q, k = attn.rotary(q), attn.rotary(k)
        scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~allowed[:, None], float("-inf"))
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(len(x), t, -1)
        x = x + attn.proj(out)
        x = x + layer.ffn(layer.norm2(x))
    return model.lm_head(model.decoder.norm(x))


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_gpt_over_embeddings_with_a_span_is_the_written_out_attention(position):
    model = small_gpt(position)
    ids = torch.randint(0, VOCAB, (3, 12))
    span = torch.zeros(3, 12, dtype=torch.bool)
    for row, (start, end) in enumerate(((0, 4), (3, 8), (5, 6))):
        span[row, start:end] = True
    with torch.no_grad():
        assert torch.equal(model(embeddings=model.embed(ids)), model(ids))  # the causal path as it was
        ours = model(embeddings=model.embed(ids), bidirectional=span)
        expected = reference_logits(model, model.embed(ids), span)
        torch.testing.assert_close(ours.double(), expected, atol=1e-5, rtol=1e-5)
        causal = model(ids)
        assert not torch.allclose(ours[0, :3], causal[0, :3])  # inside the span: it sees what follows
        torch.testing.assert_close(ours[1, :3], causal[1, :3])  # before the span: causal as ever

        cache = model.new_cache()
        steps = [model(embeddings=model.embed(ids[:, :8]), bidirectional=span[:, :8], cache=cache)]
        steps += [model(ids[:, i : i + 1], cache=cache) for i in range(8, 12)]
        torch.testing.assert_close(torch.cat(steps, dim=1), model(embeddings=model.embed(ids), bidirectional=span))
    with pytest.raises(ValueError, match="empty cache"):
        model(embeddings=model.embed(ids[:, :1]), bidirectional=span[:, :1], cache=cache)
    with pytest.raises(ValueError, match="either token ids or input embeddings"):
        model(ids, embeddings=model.embed(ids))


# --- the vision-language model ------------------------------------------------------------------------------


def test_pixel_shuffle_joins_each_block_of_neighbours_row_then_column_then_channel():
    tokens = torch.randn(2, 4 * 6, 3)
    out = pixel_shuffle(tokens, (4, 6), 2)
    grid = tokens.view(2, 4, 6, 3)
    assert out.shape == (2, 6, 12)
    for r in range(2):
        for c in range(3):
            block = [grid[:, 2 * r + i, 2 * c + j] for i in range(2) for j in range(2)]
            assert torch.equal(out[:, r * 3 + c], torch.cat(block, dim=-1))


def test_text_logits_are_the_gpt_fed_the_joined_embeddings():
    model = small_vlm()
    images = torch.randn(3, 3, 16, 16)
    places = [0, 3, 7]
    ids = ids_with_placeholder(places, 10)
    assert model.num_image_tokens(16, 16) == 4 and model.image_token_id == VOCAB
    with torch.no_grad():
        logits = model(ids, images)
        patches = model.image.hidden_state(images, -1)[:, 1:]  # the class token dropped
        tokens = model.projector(pixel_shuffle(patches, (4, 4), 2))
        for row, p in enumerate(places):
            embeddings = torch.cat([model.text.embed(ids[row, :p]), tokens[row], model.text.embed(ids[row, p + 1 :])])
            span = torch.zeros(1, 13, dtype=torch.bool)
            span[0, p : p + 4] = True
            full = model.text(embeddings=embeddings[None], bidirectional=span)[0]
            aligned = torch.cat([full[:p], full[p + 3 : p + 4], full[p + 4 :]])  # the placeholder: the image's last
            torch.testing.assert_close(logits[row], aligned)
    assert logits.shape == (3, 10, VOCAB)


def test_image_layer_reads_that_block_before_the_final_norm_or_after_it():
    model = small_vlm(image_layer=-2, projector="linear", pixel_shuffle=1)
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        x = model.image.embed(images)
        x = model.image.encoder.layers[0](x)[:, 1:]
        torch.testing.assert_close(model.image_tokens(images), model.projector.linear_1(x))
        normed = small_vlm(image_layer=-2, projector="linear", pixel_shuffle=1, image_norm=True)  # the same weights
        expected = normed.projector.linear_1(normed.image.encoder.norm(x))
        torch.testing.assert_close(normed.image_tokens(images), expected)
    assert model.num_image_tokens(16, 16) == 16


def test_bidirectional_and_causal_image_attention_differ_only_from_the_image_on():
    ids = ids_with_placeholder([2, 5], 9)
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        both = small_vlm()(ids, images)
        causal = small_vlm(image_attention="causal")(ids, images)
    for row, p in enumerate([2, 5]):
        torch.testing.assert_close(both[row, :p], causal[row, :p])
        assert not torch.isclose(both[row, p:], causal[row, p:]).all(dim=-1).any()


def test_other_image_sizes_take_other_numbers_of_tokens():
    model = small_vlm()
    ids = ids_with_placeholder([1, 1], 6)
    with torch.no_grad():
        assert model(ids, torch.randn(2, 3, 24, 32)).shape == (2, 6, VOCAB)
    assert model.num_image_tokens(24, 32) == 12
    assert model.image_tokens(torch.randn(1, 3, 24, 32)).shape == (1, 12, 32)


@pytest.mark.parametrize("image_attention", ["bidirectional", "causal"])
def test_decoding_with_the_cache_is_the_full_forward(image_attention):
    model = small_vlm(image_attention=image_attention)
    images = torch.randn(2, 3, 16, 16)
    ids = ids_with_placeholder([1, 1], 12)
    with torch.no_grad():
        full = model(ids, images)
        decoder = model.incremental_decoder(images)
        cache = decoder.new_cache()
        steps = [decoder(ids[:, :5], cache)] + [decoder(ids[:, i : i + 1], cache) for i in range(5, 12)]
        torch.testing.assert_close(torch.cat(steps, dim=1), full)
        assert cache.length == 12
    prompt = ids[:, :5]
    cached = generate(model.incremental_decoder(images), prompt, 20, temperature=0)
    uncached = generate(model.incremental_decoder(images), prompt, 20, temperature=0, use_cache=False)
    assert torch.equal(cached, uncached) and cached.shape == (2, 25)
    hyps, _ = beam_search(model.incremental_decoder(images), 2, 1, 0, eos_id=1, max_new_tokens=20, prompt=prompt)
    greedy = [row[: row.index(1)] if 1 in row else row for row in cached[:, 5:].tolist()]
    assert hyps == greedy
    beams, scores = beam_search(model.incremental_decoder(images, 3), 2, 3, 0, 1, 20, prompt=prompt)
    assert len(beams) == 2 and all(math.isfinite(s) for s in scores)


def test_image_attention_gives_each_text_position_its_weights_on_the_image():
    model = small_vlm(image_attention="causal")
    ids = ids_with_placeholder([2, 4], 8)
    weights = model.image_attention(ids, torch.randn(2, 3, 16, 16))
    assert weights.shape == (2, 8, 4)
    assert torch.equal(weights[0, :2], torch.zeros(2, 4)) and torch.equal(weights[1, :4], torch.zeros(4, 4))
    assert (weights[0, 2:].sum(-1) > 0).all() and (weights.sum(-1) <= 1 + 1e-6).all()
    assert torch.equal(weights[0, 2, :3] > 0, torch.ones(3, dtype=torch.bool))  # the image's last token sees it all


def test_image_tower_starts_from_a_contrastive_models_by_names():
    torch.manual_seed(3)
    contrastive = ContrastiveModel(
        ContrastiveConfig(image=IMAGE | dict(image_size=24), text=TEXT | dict(vocab_size=VOCAB - 1), pad_id=0)
    )
    model = small_vlm()
    tower = {name: value for name, value in contrastive.state_dict().items() if name.startswith("image.")}
    report = model.load_state_dict(resample_positions(model, tower), strict=False)
    assert not report.unexpected_keys
    assert {name.split(".")[0] for name in report.missing_keys} == {"projector", "text"}
    images = torch.randn(2, 3, 16, 16)  # the table resampled at load as the contrastive tower resamples it here
    with torch.no_grad():
        torch.testing.assert_close(model.image.hidden_state(images), contrastive.image.hidden_state(images))


def test_refusals_name_what_is_wrong():
    model = small_vlm()
    images = torch.randn(2, 3, 16, 16)
    two = ids_with_placeholder([1, 1], 6)
    two[1, 3] = VOCAB
    with pytest.raises(ValueError, match=r"row 1 of the ids holds 2 image placeholders \(id 20\)"):
        model(two, images)
    with pytest.raises(ValueError, match=r"row 0 of the ids holds 0 image placeholders"):
        model(torch.randint(2, VOCAB, (2, 6)), images)
    with pytest.raises(RuntimeError, match=r"every row of the ids holds exactly one image placeholder \(id 20\)"):
        model.train()(two, images)  # in training: an assertion that does not wait for the device
    model.eval()
    with pytest.raises(
        ValueError,
        match=r"38 ids with an image of 4 tokens .* 41 positions, more than "
        r"text.block_size=40: shorten the text to at most 37 ids",
    ):
        model(ids_with_placeholder([0, 0], 38), images)
    model(ids_with_placeholder([0, 0], 37), images)
    with pytest.raises(ValueError, match=r"pixel_shuffle=2 does not divide the image tower's grid of 5×4 patches"):
        model(ids_with_placeholder([0, 0], 5), torch.randn(2, 3, 20, 16))
    with pytest.raises(ValueError, match=r"pixel_shuffle=3 does not divide the image tower's grid of 4×4 patches"):
        small_vlm(pixel_shuffle=3)
    with pytest.raises(ValueError, match="pixel_shuffle=0 must be at least 1"):
        small_vlm(pixel_shuffle=0)
    with pytest.raises(ValueError, match=r"image_layer=-3 is not a block of the image tower's image.n_layers=2"):
        small_vlm(image_layer=-3)
    with pytest.raises(ValueError, match="projector='conv' is not valid"):
        small_vlm(projector="conv")
    with pytest.raises(ValueError, match="image.num_classes=10: the image tower of a vision-language model"):
        small_vlm(image=IMAGE | dict(num_classes=10))
    with pytest.raises(ValueError, match="the text tower: .*unexpected keyword argument 'depth'"):
        small_vlm(text=TEXT | dict(depth=2))


def test_the_ctc_head_reads_the_projectors_patches_column_by_column_from_the_top():
    model = small_vlm(ctc_head=True)
    images = torch.randn(2, 3, 16, 32)  # a grid of 4 × 8 patches
    ids = ids_with_placeholder([1, 2], 6)
    logits, reading = model(ids, images, ctc=True)
    torch.testing.assert_close(logits, model(ids, images), rtol=0, atol=0)  # the same pass as without it
    patches = model.patch_tokens(images)  # row-major
    assert reading.shape == (2, 32, VOCAB)
    for row, column in [(0, 0), (3, 0), (0, 1), (2, 5), (3, 7)]:
        torch.testing.assert_close(reading[:, column * 4 + row], model.ctc_head(patches[:, row * 8 + column]))
    with pytest.raises(ValueError, match="this model has no CTC head: build it with ctc_head=true"):
        small_vlm()(ids, images, ctc=True)


def test_a_training_step_reaches_every_part():
    model = small_vlm().train()
    ids = ids_with_placeholder([1, 3], 8)
    logits = model(ids, torch.randn(2, 3, 16, 16))
    torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].clamp(max=VOCAB - 1).reshape(-1)
    ).backward()
    unreached = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    assert unreached == frozen == ["image.encoder.norm.weight", "image.encoder.norm.bias"]  # the final norm: not read
    normed = small_vlm(image_norm=True)  # the final norm is read
    assert [name for name, p in normed.named_parameters() if not p.requires_grad] == []
    earlier = small_vlm(image_layer=-2)  # the blocks after image_layer are not read either
    unread = {name.split(".")[3] for name, p in earlier.named_parameters() if "layers" in name and not p.requires_grad}
    assert unread == {str(earlier.config.image.n_layers - 1)}
