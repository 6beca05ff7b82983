"""The contrastive model's Hugging Face layout: a ``CLIPModel`` folder that ``from_pretrained`` loads with our logits,
its tokenizer framing a caption as the data does (EOS exported as id 3), and the shapes CLIP cannot hold refused."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from lightformer.data.sources.image_files import fit_image, to_normalised_tensor
from lightformer.errors import ConfigError
from lightformer.io.hf_layouts import export_hf, read_hf_config, read_hf_state_dict
from lightformer.io.layouts.clip import (
    SWAP,
    check_clip_shape,
    clip_net_from_hf,
    clip_state_dict_to_lightformer,
    contrastive_model,
)
from lightformer.io.layouts.vit import vit_hf_config
from lightformer.models import ViTConfig
from lightformer.models.contrastive import ContrastiveConfig, ContrastiveModel
from lightformer.tokenization.text import Tokenizer

CAPTIONS = ["a red apple", "dog face", "an apple pie on a plate", "sheep"]
IMAGE = dict(image_size=16, patch_size=8, in_channels=3, d_model=32, n_layers=2, n_heads=4, d_ff=64, pre_norm=True)
TEXT = dict(d_model=48, n_layers=2, n_heads=4, d_ff=96, block_size=32)


def clip_model(tokenizer, image=None, text=None, **fields) -> ContrastiveModel:
    torch.manual_seed(0)
    config = ContrastiveConfig(image=IMAGE | (image or {}), text=TEXT | {"vocab_size": tokenizer.vocab_size} |
                               (text or {}), embed_dim=24, pad_id=tokenizer.pad_id, **fields)  # fmt: skip
    model = ContrastiveModel(config).eval()
    with torch.no_grad():  # random biases and norms, so that a tensor exported to the wrong place shows
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                parameter.normal_(0, 0.1 if name.endswith("bias") else 1.0)
        model.logit_scale.fill_(2.5)
    return model


def framed(tokenizer) -> torch.Tensor:
    """The captions as the data gives them: [BOS] ids [EOS], padded with PAD."""
    ids = tokenizer.encode_batch(CAPTIONS, add_bos=True, add_eos=True)
    longest = max(map(len, ids))
    return torch.tensor([row + [tokenizer.pad_id] * (longest - len(row)) for row in ids])


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.train_char(CAPTIONS)


def export(model, tokenizer, folder, in_channels=3):
    task = SimpleNamespace(model=model, tokenizer=tokenizer, hparams={},
                           data_facts=SimpleNamespace(normalize_mean=(0.5,) * in_channels,
                                                      normalize_std=(0.25,) * in_channels))  # fmt: skip
    return export_hf(task, str(folder.parent / "last.ckpt"), {}, str(folder), build=contrastive_model)


@pytest.mark.parametrize("in_channels", [3, 1])
def test_exported_clip_gives_our_logits(tmp_path, tokenizer, in_channels):
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

    model = clip_model(tokenizer, image={"in_channels": in_channels})
    export(model, tokenizer, tmp_path / "clip", in_channels)
    theirs = CLIPModel.from_pretrained(tmp_path / "clip").eval()
    hf_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "clip")

    ids = framed(tokenizer)
    torch.manual_seed(1)
    images = torch.randn(3, in_channels, 16, 16)
    exported_ids = ids.clone()  # our EOS (2) is the export's 3, and our UNK (3) its 2
    exported_ids[ids == SWAP[0]], exported_ids[ids == SWAP[1]] = SWAP[1], SWAP[0]
    encoded = hf_tokenizer(CAPTIONS, padding=True, return_tensors="pt")
    assert encoded["input_ids"].tolist() == exported_ids.tolist()  # the tokenizer frames a caption as the data does
    assert theirs.config.text_config.eos_token_id == 3 and hf_tokenizer.eos_token_id == 3

    with torch.no_grad():
        ours = model.logits(model.encode_image(images), model.encode_text(ids))
        output = theirs(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"],
                        pixel_values=images.expand(-1, 3, -1, -1))  # fmt: skip
    torch.testing.assert_close(output.logits_per_image, ours, atol=1e-4, rtol=1e-4)
    assert ours.std() > 0.1  # the captions differ, so equal logits say something

    pixels = np.random.default_rng(0).integers(0, 256, (40, 30, in_channels), dtype=np.uint8)
    image = Image.fromarray(pixels[..., 0] if in_channels == 1 else pixels)
    processor = AutoImageProcessor.from_pretrained(tmp_path / "clip", backend="pil")
    processed = processor(image, return_tensors="pt")["pixel_values"][0]
    ours = to_normalised_tensor([0.5] * in_channels, [0.25] * in_channels)(fit_image(image, 16, 16, "resize"))
    torch.testing.assert_close(processed, ours.expand(3, -1, -1), atol=1e-5, rtol=0)  # the data's pixels


def test_logit_scale_is_exported_clamped(tmp_path, tokenizer):
    from transformers import CLIPModel

    model = clip_model(tokenizer)
    with torch.no_grad():
        model.logit_scale.fill_(7.0)  # above log 100: ours clamps it, CLIPModel would not
    export(model, tokenizer, tmp_path / "clip")
    theirs = CLIPModel.from_pretrained(tmp_path / "clip")
    assert theirs.logit_scale.exp().item() == pytest.approx(100.0)


def test_biases_a_tower_lacks_are_exported_as_zeros(tmp_path, tokenizer):
    from transformers import CLIPModel

    model = clip_model(tokenizer, image={"qkv_bias": False, "bias": False}, text={"bias": False})
    export(model, tokenizer, tmp_path / "clip")
    theirs = CLIPModel.from_pretrained(tmp_path / "clip").eval()
    ids = framed(tokenizer)
    exported_ids = ids.clone()
    exported_ids[ids == SWAP[0]], exported_ids[ids == SWAP[1]] = SWAP[1], SWAP[0]
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ours = model.logits(model.encode_image(images), model.encode_text(ids))
        output = theirs(input_ids=exported_ids, attention_mask=ids != tokenizer.pad_id, pixel_values=images)
    torch.testing.assert_close(output.logits_per_image, ours, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("image", "text", "fields", "named"),
    [
        ({"pre_norm": False}, {}, {}, r"model\.net\.image\.pre_norm to true \(now False: CLIP normalises"),
        ({"pool": "mean"}, {}, {}, r"model\.net\.image\.pool to cls \(now 'mean'"),
        ({}, {"position": "rope"}, {}, r"model\.net\.text\.position to learned \(now 'rope'"),
        ({}, {"norm": "rmsnorm"}, {}, r"model\.net\.text\.norm to layernorm \(now 'rmsnorm'"),
        ({"activation": "swiglu"}, {}, {}, r"model\.net\.image\.activation to gelu\|gelu_tanh\|relu \(now 'swiglu'"),
        ({}, {}, {"loss": "sigmoid"}, r"model\.net\.loss to infonce \(now 'sigmoid': CLIPModel's logits have no bias"),
        ({}, {}, {"text_pool": "mean"}, r"model\.net\.text_pool to eos \(now 'mean': CLIP's text tower is causal"),
        ({"image_size": (16, 32)}, {}, {}, r"model\.net\.image\.image_size=\(16, 32\).*square"),
    ],
)
def test_shapes_clip_cannot_hold_are_refused_by_field(tokenizer, image, text, fields, named):
    model = clip_model(tokenizer, image=image, text=text, **fields)
    with pytest.raises(ConfigError, match=named):
        check_clip_shape(model.config)


def test_a_pre_norm_vit_classifier_is_refused_by_the_vit_layout():
    config = ViTConfig(**(IMAGE | {"num_classes": 3}))
    with pytest.raises(ConfigError, match=r"model\.net\.pre_norm \(now True\).*ViTForImageClassification"):
        vit_hf_config(config, None)


def test_the_zero_shot_pipeline_reads_the_export_as_our_model_classifies(tmp_path):
    import transformers

    prompts = {"dog": "This is a photo of dog.", "cat": "This is a photo of cat."}  # the pipeline's template
    tokenizer = Tokenizer.train_char([*CAPTIONS, *prompts.values()])
    model = clip_model(tokenizer)
    export(model, tokenizer, tmp_path / "clip")
    pixels = np.random.default_rng(1).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    found = transformers.pipeline("zero-shot-image-classification", model=str(tmp_path / "clip"))(
        Image.fromarray(pixels), candidate_labels=list(prompts)
    )
    ids = tokenizer.encode_batch(list(prompts.values()), add_bos=True, add_eos=True)
    images = to_normalised_tensor([0.5] * 3, [0.25] * 3)(Image.fromarray(pixels))[None]
    with torch.no_grad():
        probabilities = model.logits(model.encode_image(images), model.encode_text(torch.tensor(ids))).softmax(-1)[0]
    assert {guess["label"]: guess["score"] for guess in found} == pytest.approx(
        dict(zip(prompts, probabilities.tolist(), strict=True)), abs=1e-4
    )


def test_an_exported_folder_reads_back_into_the_same_model(tmp_path, tokenizer):
    model = clip_model(tokenizer, image={"in_channels": 3}, text={"activation": "gelu_tanh"})
    export(model, tokenizer, tmp_path / "clip")
    config = read_hf_config(tmp_path / "clip")
    fields = clip_net_from_hf(config)
    assert fields["image"]["pre_norm"] and fields["text"]["activation"] == "gelu_tanh"
    back = ContrastiveModel(ContrastiveConfig(**fields, pad_id=tokenizer.pad_id)).eval()
    back.load_state_dict(clip_state_dict_to_lightformer(read_hf_state_dict(tmp_path / "clip"), config), strict=True)
    ids, images = framed(tokenizer), torch.randn(2, 3, 16, 16)
    with torch.no_grad():  # our ids again: the swap is undone
        torch.testing.assert_close(back(images, ids), model(images, ids))
        torch.testing.assert_close(back.scale(), model.scale())


def test_a_clip_folder_of_another_vocabulary_or_activation_reads_as_it_is_or_is_refused_by_field(tmp_path):
    from transformers import CLIPConfig, CLIPModel

    towers = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    config = CLIPConfig(text_config=towers | dict(vocab_size=50, max_position_embeddings=16, hidden_act="gelu",
                                                  eos_token_id=2, bos_token_id=1, pad_token_id=0),
                        vision_config=towers | dict(image_size=16, patch_size=8, hidden_act="gelu"),
                        projection_dim=8).to_dict()  # fmt: skip
    torch.manual_seed(0)
    theirs = CLIPModel(CLIPConfig.from_dict(config)).eval()
    weights = clip_state_dict_to_lightformer(theirs.state_dict(), config)
    torch.testing.assert_close(weights["text.embed.weight"],
                               theirs.text_model.embeddings.token_embedding.weight)  # fmt: skip
    ours = ContrastiveModel(ContrastiveConfig(**clip_net_from_hf(config), pad_id=0)).eval()
    ours.load_state_dict(weights, strict=True)
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        features = theirs.get_image_features(pixel_values=images).pooler_output
        torch.testing.assert_close(ours.encode_image(images), features / features.norm(dim=-1, keepdim=True))

    config["vision_config"]["hidden_act"] = "quick_gelu"  # OpenAI's
    with pytest.raises(ConfigError, match=r"CLIP's image tower hidden_act='quick_gelu' has no lightformer counterpart"):
        clip_net_from_hf(config)
