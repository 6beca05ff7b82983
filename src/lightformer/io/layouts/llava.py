"""The vision-language model's Hugging Face layout: ``LlavaForConditionalGeneration`` where the shapes are LLaVA's (a
Llama-shaped GPT, a CLIP-shaped ViT, the "mlp" projector, no pixel shuffle, causal attention over the image); any other
shape is refused, naming each ``model.net`` field to change and the value that would fit.

The parts are the other layouts' whole: the language model as ``io.layouts.gpt``'s Llama (rotary positions, RMSNorm,
SwiGLU), the image tower as ``io.layouts.clip``'s ``CLIPVisionModel`` (``pre_norm``, a class token), the projector as
LLaVA's ``multi_modal_projector`` (``linear_1``, GELU, ``linear_2``). ``image_layer`` is LLaVA's
``vision_feature_layer`` (hidden state 0 is the embeddings, so our block i ≥ 0 is its i + 1; negative indices are the
same); ``vision_feature_select_strategy`` "default" drops the class token as we do.

The image token. Our placeholder is one id equal to the vocabulary's size, outside the tokenizer; LLaVA's
``image_token_index`` is inside the vocabulary, and its ``input_ids`` hold one copy of it per image token (K, the
config's ``image_seq_length``). The export therefore has one more token: id ``vocab_size`` is ``<image>``, with a zero
row in the token embedding (LLaVA overwrites those positions with the image's features, so the row is never read) and a
zero row in the LM head: its logit is always 0, the score of a token the model never predicts; the exported generation
config suppresses it (``suppress_tokens``). Every other logit is ours.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightformer.errors import ConfigError
from lightformer.io.hf_layouts import HF_ACTIVATIONS, HFModel, config_ids, fast_tokenizer, hf_layout
from lightformer.io.layouts.clip import CLIP_NEEDS, clip_image_processor, clip_to_hf, tower_misfits
from lightformer.io.layouts.gpt import GPT_LAYOUTS, gpt_hf_config, gpt_to_hf
from lightformer.nn.checks import as_pair

# What ``LlavaForConditionalGeneration`` needs of each part of ``model.net`` (field → the values that fit).
LLAVA_NEEDS: dict[str, dict[str, tuple]] = {
    "": {"pixel_shuffle": (1,), "projector": ("mlp",), "image_attention": ("causal",), "image_norm": (False,)},
    "image.": CLIP_NEEDS["image."],
    "text.": GPT_LAYOUTS["llama"],
}
WHY = {
    "pixel_shuffle": "LLaVA puts every patch into the text",
    "projector": "LLaVA's projector is Linear, GELU, Linear",
    "image_attention": "LLaVA's language model is causal over the image's tokens too",
    "image_norm": "LLaVA reads the tower's hidden states, before its final norm",
    "pool": "LLaVA's CLIP tower has a class token, which it drops",
    "pre_norm": "CLIP normalises the image tokens before the first layer, and its patch embedding has no bias",
    "norm": "the part's norms are its Hugging Face model's",
    "activation": "the part's MLP is its Hugging Face model's",
    "position": "Llama's positions are rotary",
}
IMAGE_TOKEN = "<image>"


def check_llava_shape(config: Any) -> None:
    """``ConfigError`` naming every field of ``config`` (a ``VisionLanguageConfig``) that
    ``LlavaForConditionalGeneration`` cannot hold, and the value that would fit."""
    wrong = tower_misfits(config, LLAVA_NEEDS, WHY)
    if wrong:
        raise ConfigError(
            f"--layout hf: this vision-language model's shape does not fit LlavaForConditionalGeneration. Change "
            f"{'; '.join(wrong)}"
        )


def llava_hf_config(config: Any, special: dict[str, int]) -> Any:
    """The ``transformers.LlavaConfig`` of ``config`` (a ``VisionLanguageConfig``): the vocabulary one longer for the
    image token (id ``text.vocab_size``); ``special``: bos/eos/pad token ids."""
    from transformers import CLIPVisionConfig, LlavaConfig

    check_llava_shape(config)
    image, text = config.image, config.text
    vocab = text.vocab_size + 1
    text_config = gpt_hf_config(replace_vocab(text, vocab), special)
    side, patch = as_pair(image.image_size)[0], as_pair(image.patch_size)[0]
    vision_config = CLIPVisionConfig(
        hidden_size=image.d_model, intermediate_size=image.d_ff or 4 * image.d_model, num_hidden_layers=image.n_layers,
        num_attention_heads=image.n_heads, num_channels=3, image_size=side, patch_size=patch,
        hidden_act=HF_ACTIVATIONS[image.activation], layer_norm_eps=image.norm_eps,
        attention_dropout=image.attention_dropout,
    )  # fmt: skip
    layer = config.image_layer + 1 if config.image_layer >= 0 else config.image_layer
    return LlavaConfig(
        vision_config=vision_config, text_config=text_config, image_token_index=text.vocab_size,
        image_seq_length=(side // patch) ** 2, projector_hidden_act="gelu", vision_feature_select_strategy="default",
        vision_feature_layer=layer, multimodal_projector_bias=True, tie_word_embeddings=text.tie_weights,
        architectures=["LlavaForConditionalGeneration"],
    )  # fmt: skip


def replace_vocab(text: Any, vocab_size: int) -> Any:
    """``text`` (a ``GPTConfig``) with another ``vocab_size``."""
    from dataclasses import replace

    return replace(text, vocab_size=vocab_size)


def llava_to_hf(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    """Our ``VisionLanguageModel`` state dict → ``LlavaForConditionalGeneration``'s names, the token embedding and the
    LM head a zero row longer (the image token)."""
    image = {name: value for name, value in state.items() if name.startswith("image.")}
    text = {name.removeprefix("text."): value for name, value in state.items() if name.startswith("text.")}
    text = {name: _one_more_row(value) if name in ("embed.weight", "lm_head.weight") else value
            for name, value in text.items()}  # fmt: skip
    vision = clip_to_hf(image, config).items()  # CLIPModel's vision_model: LLaVA's vision_tower
    out = {f"model.vision_tower.{name.removeprefix('vision_model.')}": value for name, value in vision}
    for name, value in gpt_to_hf(text, replace_vocab(config.text, config.text.vocab_size + 1)).items():
        out[name if name.startswith("lm_head.") else f"model.language_model.{name.removeprefix('model.')}"] = value
    for name, value in state.items():
        if name.startswith("projector."):
            out[f"model.multi_modal_projector.{name.removeprefix('projector.')}"] = value
    return out


def _one_more_row(weight: Tensor) -> Tensor:
    return torch.cat([weight, weight.new_zeros(1, weight.shape[1])])


def vlm_hf_model(model: Any, facts: Any = None, tokenizer: Any = None) -> HFModel:
    """``model`` (a ``VisionLanguageModel``) as a ``LlavaForConditionalGeneration``, with our tokenizer (``<image>``
    added as id ``vocab_size``) and, given the data's ``facts``, a ``CLIPImageProcessor`` that resizes and normalises
    an image as the data does."""
    from transformers import GenerationConfig, LlavaForConditionalGeneration

    net = model.config
    special = {"bos": 1, "eos": 2, "pad": 0}
    if tokenizer is not None:
        special = {"bos": tokenizer.bos_id, "eos": tokenizer.eos_id, "pad": tokenizer.pad_id}
    config = llava_hf_config(net, special)
    hf = LlavaForConditionalGeneration(config)
    hf.generation_config = GenerationConfig(
        do_sample=False, max_length=net.text.block_size, suppress_tokens=[net.text.vocab_size],
        **config_ids(config.text_config),
    )  # fmt: skip
    exported = None
    if tokenizer is not None:
        exported = fast_tokenizer(tokenizer)
        exported.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
        if exported.convert_tokens_to_ids(IMAGE_TOKEN) != net.text.vocab_size:
            raise ConfigError(
                f"--layout hf: the tokenizer has {len(exported) - 1} tokens but the model's text.vocab_size is "
                f"{net.text.vocab_size}: export with the tokenizer the model was trained with"
            )
    processor = None
    if facts is not None and facts.normalize_mean is not None:
        processor = clip_image_processor(facts, as_pair(net.image.image_size)[0])
    k = config.image_seq_length
    usage = (
        "import torch\n"
        "from PIL import Image\n"
        "from transformers import AutoImageProcessor, AutoTokenizer, LlavaForConditionalGeneration\n\n"
        'model = LlavaForConditionalGeneration.from_pretrained("DIR")\n'
        'tokenizer = AutoTokenizer.from_pretrained("DIR")\n'
        'pixels = AutoImageProcessor.from_pretrained("DIR", backend="pil")(Image.open("photo.png"), '
        'return_tensors="pt").pixel_values\n'
        f"# the image's place in the prompt: {k} copies of the image token ({IMAGE_TOKEN}, id {net.text.vocab_size})\n"
        f'text = "{IMAGE_TOKEN}" * {k} + "Q: What is this?\\nA: "\n'
        "ids = torch.tensor([[tokenizer.bos_token_id] + tokenizer(text, add_special_tokens=False).input_ids])\n"
        "answer = model.generate(input_ids=ids, pixel_values=pixels, max_new_tokens=20)[0, ids.shape[1]:]\n"
        "print(tokenizer.decode(answer, skip_special_tokens=True))"
    )
    return HFModel(hf, llava_to_hf(model.state_dict(), net), usage, tokenizer=exported, processor=processor)


def vlm_model(task: Any) -> HFModel:
    """A vision-language task's ``LlavaForConditionalGeneration`` (``vlm_hf_model`` of its model, data facts and
    tokenizer)."""
    return vlm_hf_model(task.model, getattr(task, "data_facts", None), getattr(task, "tokenizer", None))


HF = hf_layout(vlm_model, "vision-language models (LLaVA)")
