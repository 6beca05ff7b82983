"""The contrastive model's Hugging Face layout: ``CLIPModel`` where the towers' shapes are CLIP's (an image tower with
``pre_norm``, class-token pooling, LayerNorm and a pointwise activation; a text tower with learned positions, LayerNorm
and a pointwise activation; the InfoNCE loss, whose logits have no bias); any other shape is refused, naming the
``model.net`` fields to change.

The end token's id. ``CLIPTextModel`` pools the features of each text's first ``eos_token_id``, except where the
config's ``eos_token_id`` is 2: then (checkpoints written before transformers' PR #24773) it pools at the *largest id*
of the text. Our vocabularies give EOS id 2 (PAD 0, BOS 1, EOS 2, UNK 3), so the export swaps ids 2 and 3 (``SWAP``):
the exported token embedding's rows 2 and 3, the exported tokenizer's vocabulary and its framing, and the config
(``eos_token_id`` 3, ``unk_token_id`` 2) all say EOS is 3 and UNK is 2; every other id is ours. Our model pools at a
text's last token that is not padding, its EOS as the data frames a caption ([BOS] ids [EOS] PAD…): the same token as
the first EOS wherever a caption holds one EOS, at its end (as every caption the data and the exported tokenizer give).

The logit scale is exported clamped as ours is (at 100): ``CLIPModel`` does not clamp it.

A ``CLIPModel`` folder reads back (``CLIP_READERS``, ``model.init.checkpoint=DIR``) in the shape its ``config.json``
gives; where its special ids are an export's (PAD 0, BOS 1, EOS 3) ids 2 and 3 are swapped back, and another
vocabulary (OpenAI's, whose tokenizer lightformer does not read) is copied as it is: its image tower still starts ours.
OpenAI's CLIPs use ``quick_gelu``, which lightformer lacks, and are refused by that field; OpenCLIP's use ``gelu``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from lightformer.errors import ConfigError
from lightformer.io.hf_layouts import (
    FROM_HF_ACTIVATIONS,
    HF_ACTIVATIONS,
    HFModel,
    fast_tokenizer,
    hf_activation,
    hf_layout,
    misfits,
)
from lightformer.io.layouts.vit import LUMA
from lightformer.models.contrastive import MAX_LOGIT_SCALE, ContrastiveConfig
from lightformer.nn.checks import as_pair
from lightformer.registry import HFReader

# What ``CLIPModel`` needs of each part of ``model.net`` (field → the values that fit).
CLIP_NEEDS: dict[str, dict[str, tuple]] = {
    "": {"loss": ("infonce",), "text_pool": ("eos",)},
    "image.": {"pool": ("cls",), "pre_norm": (True,), "norm": ("layernorm",), "activation": tuple(HF_ACTIVATIONS)},
    "text.": {"position": ("learned",), "norm": ("layernorm",), "activation": tuple(HF_ACTIVATIONS)},
}
WHY = {"loss": "CLIPModel's logits have no bias (SigLIP's)",
       "text_pool": "CLIP's text tower is causal and pools the end token", "pool": "CLIP pools the class token",
       "pre_norm": "CLIP normalises the image tokens before the first layer, and its patch embedding has no bias",
       "position": "CLIP's text positions are a learned table", "norm": "CLIP's norms are LayerNorm",
       "activation": "CLIP's MLP has a pointwise activation"}  # fmt: skip
# The ids swapped between our vocabulary and the exported one (module docstring): our EOS (2) is exported as 3.
SWAP = (2, 3)

_LAYER = {"norm1": "layer_norm1", "self_attn.proj": "self_attn.out_proj", "norm2": "layer_norm2",
          "ffn.fc1": "mlp.fc1", "ffn.fc2": "mlp.fc2"}  # fmt: skip


def tower_misfits(config: Any, needs: dict[str, dict[str, tuple]], why: dict[str, str]) -> list[str]:
    """What a Hugging Face layout cannot hold of a two-tower ``config`` whose image tower is ``image``: each field
    of ``needs`` (part, "" or "image." or "text." → field → the values that fit) with its value now and ``why``, and a
    non-square image or patch."""
    wrong = []
    for part, part_needs in needs.items():
        tower = getattr(config, part.rstrip(".")) if part else config
        for misfit in misfits(tower, part_needs):
            name, value = misfit.split("=", 1)
            fits = "|".join(str(v).lower() if isinstance(v, bool) else str(v) for v in part_needs[name])
            wrong.append(f"model.net.{part}{name} to {fits} (now {value}: {why[name]})")
    image, patch = as_pair(config.image.image_size), as_pair(config.image.patch_size)
    if image[0] != image[1] or patch[0] != patch[1]:
        wrong.append(f"model.net.image.image_size={config.image.image_size} and patch_size={config.image.patch_size} "
                     "to a square's side each (CLIP takes square images and patches)")  # fmt: skip
    return wrong


def check_clip_shape(config: Any) -> None:
    """``ConfigError`` naming every field of ``config`` (a ``ContrastiveConfig``) that ``CLIPModel`` cannot hold, and
    the value that would fit."""
    wrong = tower_misfits(config, CLIP_NEEDS, WHY)
    if wrong:
        raise ConfigError(f"--layout hf: this contrastive model's shape does not fit CLIPModel. Change "
                          f"{'; '.join(wrong)}")  # fmt: skip


def clip_hf_config(config: Any) -> Any:
    """The ``transformers.CLIPConfig`` of ``config`` (a ``ContrastiveConfig``), its special ids the exported
    vocabulary's (``SWAP``)."""
    from transformers import CLIPConfig

    check_clip_shape(config)
    image, text = config.image, config.text
    ids = dict(pad_token_id=config.pad_id, bos_token_id=1, eos_token_id=SWAP[1])
    return CLIPConfig(
        text_config=dict(vocab_size=text.vocab_size, hidden_size=text.d_model, intermediate_size=text.d_ff or
                         4 * text.d_model, num_hidden_layers=text.n_layers, num_attention_heads=text.n_heads,
                         max_position_embeddings=text.block_size, hidden_act=HF_ACTIVATIONS[text.activation],
                         layer_norm_eps=text.norm_eps, attention_dropout=text.attention_dropout,
                         projection_dim=config.embed_dim, **ids),
        vision_config=dict(hidden_size=image.d_model, intermediate_size=image.d_ff or 4 * image.d_model,
                           num_hidden_layers=image.n_layers, num_attention_heads=image.n_heads, num_channels=3,
                           image_size=as_pair(image.image_size)[0], patch_size=as_pair(image.patch_size)[0],
                           hidden_act=HF_ACTIVATIONS[image.activation], layer_norm_eps=image.norm_eps,
                           attention_dropout=image.attention_dropout, projection_dim=config.embed_dim),
        projection_dim=config.embed_dim, architectures=["CLIPModel"],
    )  # fmt: skip


def _layers(out: dict[str, Tensor], prefix: str, index: str, module: str, leaf: str, value: Tensor) -> None:
    """One encoder layer's tensor (ours: ``module.leaf`` of layer ``index``) under CLIP's names."""
    layer = f"{prefix}.encoder.layers.{index}"
    if module == "self_attn.qkv":
        for part, tensor in zip("qkv", value.chunk(3), strict=True):
            out[f"{layer}.self_attn.{part}_proj.{leaf}"] = tensor.contiguous()
    else:
        out[f"{layer}.{_LAYER[module]}.{leaf}"] = value


def clip_to_hf(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    """Our ``ContrastiveModel`` state dict → ``CLIPModel``'s names: the token embedding's rows of ``SWAP`` swapped, a
    grey image tower's patch weights spread over RGB by ``LUMA``, the logit scale clamped as ours, and zeros for the
    biases a tower is built without (``qkv_bias`` or ``bias`` false: the same function)."""
    out: dict[str, Tensor] = {}
    for name, value in state.items():
        tower, _, rest = name.partition(".")
        module, _, leaf = rest.rpartition(".")
        if tower == "image" and rest.startswith("encoder.layers."):
            _, _, index, module = module.split(".", 3)
            _layers(out, "vision_model", index, module, leaf, value)
        elif tower == "text" and rest.startswith("decoder.layers."):
            _, _, index, module = module.split(".", 3)
            _layers(out, "text_model", index, module, leaf, value)
        elif name == "image.patch_embed.proj.weight":
            if value.shape[1] == 1:
                value = value * torch.tensor(LUMA, dtype=value.dtype).view(1, 3, 1, 1)
            out["vision_model.embeddings.patch_embedding.weight"] = value
        elif name == "text.embed.weight":
            value = value.clone()
            value[list(SWAP)] = value[list(reversed(SWAP))]
            out["text_model.embeddings.token_embedding.weight"] = value
        elif name == "logit_scale":
            out["logit_scale"] = value.clamp(max=MAX_LOGIT_SCALE)
        elif name != "text.lm_head.weight":  # the token embedding (tied), which CLIPTextModel has no use for
            top = {"image.cls_token": "vision_model.embeddings.class_embedding",
                   "image.pos_embed.weight": "vision_model.embeddings.position_embedding.weight",
                   "image.norm_pre": "vision_model.pre_layrnorm", "image.encoder.norm": "vision_model.post_layernorm",
                   "text.position.weight": "text_model.embeddings.position_embedding.weight",
                   "text.decoder.norm": "text_model.final_layer_norm",
                   "image_projection.weight": "visual_projection.weight",
                   "text_projection.weight": "text_projection.weight"}  # fmt: skip
            if name in top:
                out[top[name]] = value.reshape(-1) if name == "image.cls_token" else value
            elif f"{tower}.{module}" in top:
                out[f"{top[f'{tower}.{module}']}.{leaf}"] = value
            else:
                raise ConfigError(f"--layout hf: the contrastive model's {name!r} has no CLIPModel counterpart")
    for name, value in list(out.items()):  # a bias-free projection or norm: a zero bias
        bias = f"{name.removesuffix('.weight')}.bias"
        if name.endswith(".weight") and ("encoder.layers." in name or "norm" in name):
            out.setdefault(bias, torch.zeros(value.shape[0], dtype=value.dtype))
    return out


def clip_tokenizer(tokenizer: Any, block_size: int) -> Any:
    """Our ``tokenizer`` as the exported one: ids 2 and 3 swapped (``SWAP``: EOS is 3, UNK 2), framing a text as the
    data does, [BOS] text [EOS], within the model's ``block_size`` positions."""
    from tokenizers import processors

    from lightformer.tokenization.text import BOS, EOS

    data = json.loads(tokenizer.to_str())
    swap = {SWAP[0]: SWAP[1], SWAP[1]: SWAP[0]}
    for token in data.get("added_tokens") or []:
        token["id"] = swap.get(token["id"], token["id"])
    vocab = data["model"]["vocab"]
    for token, index in vocab.items():
        vocab[token] = swap.get(index, index)
    exported = SimpleNamespace(to_str=lambda: json.dumps(data), bos_id=tokenizer.bos_id, eos_id=SWAP[1])

    def frame(raw: Any, tok: Any) -> dict[str, Any]:
        raw.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A {EOS}", special_tokens=[(BOS, tok.bos_id), (EOS, tok.eos_id)]
        )
        return dict(model_max_length=block_size, model_input_names=["input_ids", "attention_mask"])

    return fast_tokenizer(exported, frame)


def clip_image_processor(facts: Any, side: int) -> Any:
    """A ``CLIPImageProcessor`` that stretches an image to ``side`` × ``side`` as the data does (Lanczos) and normalises
    it with the data's statistics (``facts``; a grey model's for each of the RGB channels)."""
    from PIL import Image
    from transformers import CLIPImageProcessor

    repeat = 3 // len(facts.normalize_mean)
    return CLIPImageProcessor(size={"height": side, "width": side}, do_center_crop=False,
                              resample=Image.Resampling.LANCZOS,  # the data's "resize" (fit_image)
                              image_mean=list(facts.normalize_mean) * repeat,
                              image_std=list(facts.normalize_std) * repeat)  # fmt: skip


def contrastive_model(task: Any) -> HFModel:
    """A contrastive model's ``CLIPModel``, with its tokenizer (``clip_tokenizer``) and a ``CLIPImageProcessor`` that
    stretches an image to the model's size as the data does (Lanczos: exactly the data's pixels with ``backend="pil"``,
    within a grey level with the default torchvision backend) and normalises it with the data's statistics."""
    from transformers import CLIPModel

    net = task.model.config
    model = CLIPModel(clip_hf_config(net))
    tokenizer = getattr(task, "tokenizer", None)
    facts = getattr(task, "data_facts", None)
    processor = None
    if facts is not None and facts.normalize_mean is not None:
        processor = clip_image_processor(facts, as_pair(net.image.image_size)[0])
    usage = (
        "import torch\n"
        "from PIL import Image\n"
        "from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel\n\n"
        'model = CLIPModel.from_pretrained("DIR")\n'
        'tokenizer = AutoTokenizer.from_pretrained("DIR")  # frames a text as training did: <bos> text <eos>\n'
        'images = AutoImageProcessor.from_pretrained("DIR", backend="pil")  # resized as training did\n'
        'texts = tokenizer(["a dog", "a cat"], padding=True, return_tensors="pt")\n'
        'pixels = images(Image.open("photo.png"), return_tensors="pt")\n'
        "with torch.no_grad():\n"
        "    print(model(**texts, **pixels).logits_per_image.softmax(-1))"
    )
    weights = clip_to_hf(task.model.state_dict(), net)
    exported = clip_tokenizer(tokenizer, net.text.block_size) if tokenizer is not None else None
    return HFModel(model, weights, usage, tokenizer=exported, processor=processor)


# Our names of CLIP's outside the encoder layers (``clip_to_hf``'s, read right to left).
_FROM_HF_TOP = {"vision_model.embeddings.class_embedding": "image.cls_token",
                "vision_model.embeddings.patch_embedding.weight": "image.patch_embed.proj.weight",
                "vision_model.embeddings.position_embedding.weight": "image.pos_embed.weight",
                "vision_model.pre_layrnorm": "image.norm_pre", "vision_model.post_layernorm": "image.encoder.norm",
                "text_model.embeddings.token_embedding.weight": "text.embed.weight",
                "text_model.embeddings.position_embedding.weight": "text.position.weight",
                "text_model.final_layer_norm": "text.decoder.norm",
                "visual_projection.weight": "image_projection.weight",
                "text_projection.weight": "text_projection.weight", "logit_scale": "logit_scale"}  # fmt: skip


def _hf_config(config: dict) -> Any:
    """A ``config.json`` as a ``transformers.CLIPConfig``: the fields ``save_pretrained`` leaves out (those at their
    defaults) filled in."""
    from transformers import CLIPConfig

    return CLIPConfig.from_dict(config)


def clip_net_from_hf(config: dict) -> dict[str, Any]:
    """Our ``ContrastiveConfig`` fields of a CLIP ``config.json``; ``ConfigError`` naming an activation that lightformer
    lacks (``quick_gelu``)."""
    c = _hf_config(config)
    towers = {}
    for name, tower in (("image", c.vision_config), ("text", c.text_config)):
        activation = FROM_HF_ACTIVATIONS[hf_activation(tower.to_dict(), f"CLIP's {name} tower")]
        towers[name] = dict(d_model=tower.hidden_size, n_layers=tower.num_hidden_layers,
                            n_heads=tower.num_attention_heads, d_ff=tower.intermediate_size, activation=activation,
                            norm="layernorm", norm_eps=tower.layer_norm_eps, attn_dropout=tower.attention_dropout,
                            bias=True)  # fmt: skip
    vision, text = c.vision_config, c.text_config
    towers["image"] |= dict(image_size=vision.image_size, patch_size=vision.patch_size, in_channels=vision.num_channels,
                            pool="cls", pre_norm=True, position="learned", qkv_bias=True)  # fmt: skip
    towers["text"] |= dict(vocab_size=text.vocab_size, block_size=text.max_position_embeddings, position="learned",
                           tie_weights=True)  # fmt: skip
    return dict(**towers, embed_dim=c.projection_dim, loss="infonce", text_pool="eos")


def clip_state_dict_to_lightformer(state_dict: dict[str, Tensor], config: dict) -> dict[str, Tensor]:
    """A ``CLIPModel`` state dict → our ``ContrastiveModel``'s names (the token embedding's rows of ``SWAP`` swapped
    back where the folder's special ids are an export's)."""
    text = _hf_config(config).text_config
    exported = (text.pad_token_id, text.bos_token_id, text.eos_token_id) == (0, 1, SWAP[1])
    layer = {theirs: ours for ours, theirs in _LAYER.items()}
    out: dict[str, Tensor] = {}
    qkv: dict[tuple[str, str, str], dict[str, Tensor]] = {}
    for key, value in state_dict.items():
        module, _, leaf = key.rpartition(".")
        tower = {"vision_model": "image", "text_model": "text"}.get(key.split(".")[0])
        if tower is not None and ".encoder.layers." in key:
            index, _, rest = module.split(".encoder.layers.")[1].partition(".")
            stack = "encoder" if tower == "image" else "decoder"
            if rest in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                qkv.setdefault((f"{tower}.{stack}.layers.{index}", leaf, ""), {})[rest[10]] = value
            elif rest in layer:
                out[f"{tower}.{stack}.layers.{index}.{layer[rest]}.{leaf}"] = value
            else:
                raise ConfigError(f"Hugging Face CLIP parameter {key!r} has no lightformer counterpart")
        elif key in _FROM_HF_TOP:
            ours = _FROM_HF_TOP[key]
            if ours == "image.cls_token":
                value = value.reshape(1, 1, -1)
            elif ours == "text.embed.weight" and exported:
                value = value.clone()
                value[list(SWAP)] = value[list(reversed(SWAP))]
            out[ours] = value
        elif module in _FROM_HF_TOP:
            out[f"{_FROM_HF_TOP[module]}.{leaf}"] = value
        elif not key.endswith("position_ids"):
            raise ConfigError(f"Hugging Face CLIP parameter {key!r} has no lightformer counterpart")
    for (prefix, leaf, _), parts in qkv.items():
        out[f"{prefix}.self_attn.qkv.{leaf}"] = torch.cat([parts[p] for p in "qkv"])
    out["text.lm_head.weight"] = out["text.embed.weight"]  # tied (tie_weights true)
    return out


CLIP_READERS = {"clip": HFReader(ContrastiveConfig, clip_net_from_hf, clip_state_dict_to_lightformer)}
HF = hf_layout(contrastive_model, "contrastive image-text models (CLIP)", CLIP_READERS)
