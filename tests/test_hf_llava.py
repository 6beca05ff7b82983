"""The vision-language model's Hugging Face layout: a ``LlavaForConditionalGeneration`` folder that ``from_pretrained``
loads with our logits at the text positions (the image token one more id), and the shapes LLaVA cannot hold refused."""

from types import SimpleNamespace

import pytest
import torch

from lightformer.errors import ConfigError
from lightformer.io.hf_layouts import export_hf
from lightformer.io.layouts.llava import IMAGE_TOKEN, check_llava_shape, vlm_hf_model, vlm_model
from lightformer.models.vlm import VisionLanguageConfig, VisionLanguageModel
from lightformer.tokenization.text import Tokenizer

TEXTS = ["Q: what is this?\nA: a red apple", "Q: what does it say?\nA: dog face"]
IMAGE = dict(image_size=16, patch_size=4, in_channels=3, d_model=32, n_layers=3, n_heads=4, d_ff=64, pre_norm=True)
LLAMA = dict(block_size=64, d_model=48, n_layers=2, n_heads=4, d_ff=96, position="rope", norm="rmsnorm",
             activation="swiglu")  # fmt: skip
LLAVA = dict(pixel_shuffle=1, projector="mlp", image_attention="causal", image_norm=False)


def llava_shaped(tokenizer, image_layer: int = -2, **fields) -> VisionLanguageModel:
    torch.manual_seed(0)
    config = VisionLanguageConfig(image=IMAGE, text=LLAMA | {"vocab_size": tokenizer.vocab_size},
                                  image_layer=image_layer, **(LLAVA | fields))  # fmt: skip
    model = VisionLanguageModel(config).eval()
    with torch.no_grad():  # random biases and norms, so that a tensor exported to the wrong place shows
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                parameter.normal_(0, 0.1 if name.endswith("bias") else 1.0)
    return model


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.train_char(TEXTS)


@pytest.mark.parametrize("image_layer", [-2, 0])
def test_exported_llava_gives_our_logits_at_the_text_positions(tmp_path, tokenizer, image_layer):
    from transformers import AutoImageProcessor, AutoTokenizer, LlavaForConditionalGeneration

    model = llava_shaped(tokenizer, image_layer)
    facts = SimpleNamespace(normalize_mean=(0.5, 0.5, 0.5), normalize_std=(0.25, 0.25, 0.25))
    task = SimpleNamespace(model=model, tokenizer=tokenizer, hparams={}, data_facts=facts)
    export_hf(task, str(tmp_path / "last.ckpt"), {}, str(tmp_path / "llava"), build=vlm_model)
    theirs = LlavaForConditionalGeneration.from_pretrained(tmp_path / "llava").eval()
    vocab, k = tokenizer.vocab_size, model.num_image_tokens(16, 16)
    assert theirs.config.image_token_id == vocab and theirs.config.image_seq_length == k == 16

    places = [1, 4]
    ids = torch.tensor([[tokenizer.bos_id] + tokenizer.encode(text)[:20] for text in TEXTS])
    ids = torch.stack(
        [torch.cat([row[:p], torch.tensor([vocab]), row[p:]]) for row, p in zip(ids, places, strict=True)]
    )
    image = torch.full((k,), vocab)  # HF's ids hold the image token once per image token
    expanded = torch.stack([torch.cat([row[:p], image, row[p + 1 :]]) for row, p in zip(ids, places, strict=True)])
    torch.manual_seed(1)
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ours = model(ids, images)
        hf = theirs(input_ids=expanded, pixel_values=images).logits
    assert hf.shape == (2, ids.shape[1] + k - 1, vocab + 1)
    for row, p in enumerate(places):
        aligned = [t if t < p else t + k - 1 for t in range(ids.shape[1])]
        torch.testing.assert_close(hf[row, aligned, :vocab], ours[row], atol=1e-4, rtol=1e-4)
    assert torch.equal(hf[..., vocab], torch.zeros_like(hf[..., vocab]))  # the image token's logit: always 0

    hf_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "llava")
    assert hf_tokenizer.convert_tokens_to_ids(IMAGE_TOKEN) == vocab
    text = IMAGE_TOKEN * 2 + "what"
    assert hf_tokenizer(text, add_special_tokens=False).input_ids == [vocab, vocab] + tokenizer.encode("what")
    processor = AutoImageProcessor.from_pretrained(tmp_path / "llava")
    assert list(processor.image_mean) == [0.5] * 3 and theirs.generation_config.suppress_tokens == [vocab]


def test_shapes_llava_cannot_hold_are_refused_by_field(tokenizer):
    gpt2 = VisionLanguageConfig(image=IMAGE, text=dict(vocab_size=tokenizer.vocab_size, block_size=64, d_model=48,
                                                       n_heads=4, n_layers=2))  # fmt: skip
    with pytest.raises(ConfigError) as error:
        check_llava_shape(gpt2)
    message = str(error.value)
    for field in ("model.net.pixel_shuffle to 1 (now 2", "model.net.image_attention to causal (now 'bidirectional'",
                  "model.net.text.position to rope (now 'learned'", "model.net.text.norm to rmsnorm (now 'layernorm'",
                  "model.net.text.activation to swiglu (now 'gelu'"):  # fmt: skip
        assert field in message
    assert "projector" not in message and "image.pool" not in message and "image_norm" not in message
    with pytest.raises(ConfigError, match=r"model.net.image_norm to false \(now True: LLaVA reads the tower's hidden"):
        check_llava_shape(
            VisionLanguageConfig(image=IMAGE, text=LLAMA | {"vocab_size": 9}, **(LLAVA | {"image_norm": True}))
        )
    mean = VisionLanguageConfig(image=IMAGE | dict(pool="mean"), text=LLAMA | {"vocab_size": 9},
                                **(LLAVA | dict(projector="linear")))  # fmt: skip
    with pytest.raises(ConfigError, match=r"model.net.projector to mlp \(now 'linear'.*model.net.image.pool to cls"):
        vlm_hf_model(VisionLanguageModel(mean))
