"""The ViT's layouts: Hugging Face's ``ViTForImageClassification`` (class-token pooling, LayerNorm, biases), ViT folders
read back (``VIT_READERS``), and timm's ``VisionTransformer`` names in a safetensors file (``TIMM``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightformer.errors import ConfigError
from lightformer.io.files import atomic_write_bytes
from lightformer.io.hf_layouts import (
    FROM_HF_ACTIVATIONS,
    HF_ACTIVATIONS,
    HFModel,
    give_usual_mode,
    hf_activation,
    hf_layout,
    misfits,
    refuse_shape,
    safetensors_metadata,
)
from lightformer.models.vit import ViTConfig, lightformer_to_timm
from lightformer.nn.checks import as_pair
from lightformer.registry import HFReader, Layout

HF_CLASSES = {"vit": "ViTForImageClassification"}

VIT_LAYOUTS = {"vit": {"pool": ("cls",), "norm": ("layernorm",), "activation": tuple(HF_ACTIVATIONS), "bias": (True,),
                   "pre_norm": (False,)}}  # fmt: skip
_VIT_LAYER = {"norm1": "layernorm_before", "self_attn.proj": "attention.o_proj", "norm2": "layernorm_after",
              "ffn.fc1": "mlp.fc1", "ffn.fc2": "mlp.fc2"}  # fmt: skip
_VIT_TOP = {"patch_embed.proj": "vit.embeddings.patch_embeddings.projection", "encoder.norm": "vit.layernorm",
            "head": "classifier"}  # fmt: skip
# transformers < 5 named a layer's modules differently; their weights read back too.
_VIT_OLD_LAYER = {"attention.output.dense": "attention.o_proj", "intermediate.dense": "mlp.fc1",
                  "output.dense": "mlp.fc2", "attention.attention.query": "attention.q_proj",
                  "attention.attention.key": "attention.k_proj",
                  "attention.attention.value": "attention.v_proj"}  # fmt: skip


def vit_hf_config(config: Any, class_names: list[str] | None) -> Any:
    """The ``transformers.ViTConfig`` of our ``ViTConfig`` (class token, LayerNorm, biases; learned or sin-cos
    positions, the table copied)."""
    from transformers import ViTConfig as HFViTConfig

    c = config
    if not c.num_classes:
        raise ConfigError("--layout hf: a ViT without a head (model.net.num_classes=0) has no "
                          "ViTForImageClassification layout")  # fmt: skip
    if misfits(c, VIT_LAYOUTS["vit"]):
        refuse_shape("ViT", c, VIT_LAYOUTS, HF_CLASSES)
    names = class_names or [f"LABEL_{i}" for i in range(c.num_classes)]
    image, patch = as_pair(c.image_size), as_pair(c.patch_size)
    if image[0] != image[1] or patch[0] != patch[1]:
        raise ConfigError(f"--layout hf: ViTForImageClassification takes square images and patches, not "
                          f"model.net.image_size={c.image_size}, patch_size={c.patch_size}")  # fmt: skip
    return HFViTConfig(
        hidden_size=c.d_model, num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        intermediate_size=c.d_ff or 4 * c.d_model, hidden_act=HF_ACTIVATIONS[c.activation],
        hidden_dropout_prob=c.dropout, attention_probs_dropout_prob=c.attention_dropout, layer_norm_eps=c.norm_eps,
        image_size=image[0], patch_size=patch[0], num_channels=3, qkv_bias=c.qkv_bias,
        id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)},
    )  # fmt: skip


# A grey model reads RGB images as PIL's "L" conversion does: its patch weights spread over the three channels by
# these luma weights (they sum to 1, so normalising each channel with the grey mean and std is the same function).
LUMA = (0.299, 0.587, 0.114)


def vit_to_hf(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our ``VisionTransformer`` state dict (class-token pooling) → ``ViTForImageClassification``'s names; a grey
    model (one input channel) becomes an RGB one that sees the image's luma (``LUMA``), as ``transformers``'
    pipelines and image processors give every image in RGB."""
    out = {}
    for name, value in state.items():
        module, _, leaf = name.rpartition(".")
        if name == "patch_embed.proj.weight" and value.shape[1] == 1:
            value = value * torch.tensor(LUMA, dtype=value.dtype).view(1, 3, 1, 1)
        if name == "cls_token":
            out["vit.embeddings.cls_token"] = value
        elif name == "pos_embed.weight":
            out["vit.embeddings.position_embeddings"] = value[None]
        elif module.startswith("encoder.layers."):
            _, _, index, rest = module.split(".", 3)
            prefix = f"vit.layers.{index}"
            if rest == "self_attn.qkv":
                for part, tensor in zip("qkv", value.chunk(3), strict=True):
                    out[f"{prefix}.attention.{part}_proj.{leaf}"] = tensor.contiguous()
            else:
                out[f"{prefix}.{_VIT_LAYER[rest]}.{leaf}"] = value
        else:
            out[f"{_VIT_TOP[module]}.{leaf}"] = value
    return out


def vit_state_dict_to_lightformer(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A Hugging Face ``ViTForImageClassification`` / ``ViTModel`` state dict → our ``VisionTransformer``'s names."""
    out: dict[str, Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, Tensor]] = {}
    layer_names = {theirs: ours for ours, theirs in _VIT_LAYER.items()}
    top_names = {theirs: ours for ours, theirs in _VIT_TOP.items()}
    for key, value in state_dict.items():
        key = key if key.startswith(("vit.", "classifier.")) else f"vit.{key}"
        key = key.replace("vit.encoder.layer.", "vit.layers.")
        module, _, leaf = key.rpartition(".")
        if key == "vit.embeddings.cls_token":
            out["cls_token"] = value
        elif key == "vit.embeddings.position_embeddings":
            out["pos_embed.weight"] = value[0]
        elif module.startswith("vit.layers."):
            _, _, index, rest = module.split(".", 3)
            rest = _VIT_OLD_LAYER.get(rest, rest)
            if rest in ("attention.q_proj", "attention.k_proj", "attention.v_proj"):
                qkv.setdefault((index, leaf), {})[rest[10]] = value
            elif rest in layer_names:
                out[f"encoder.layers.{index}.{layer_names[rest]}.{leaf}"] = value
            else:
                raise ConfigError(f"Hugging Face ViT parameter {key!r} has no lightformer counterpart")
        elif module in top_names:
            out[f"{top_names[module]}.{leaf}"] = value
        elif not key.startswith("vit.pooler."):  # ViTModel's pooler: no counterpart, not needed by a classifier
            raise ConfigError(f"Hugging Face ViT parameter {key!r} has no lightformer counterpart")
    for (index, leaf), parts in qkv.items():
        out[f"encoder.layers.{index}.self_attn.qkv.{leaf}"] = torch.cat([parts[p] for p in "qkv"])
    return out


def vit_net_from_hf(config: dict) -> dict[str, Any]:
    """Our ``ViTConfig`` fields of a ViT ``config.json``."""
    activation = hf_activation(config, "ViT")
    return dict(image_size=config.get("image_size", 224), in_channels=config.get("num_channels", 3),
                num_classes=len(config.get("id2label") or {0: 0, 1: 1}), patch_size=config.get("patch_size", 16),
                d_model=config["hidden_size"], n_layers=config["num_hidden_layers"],
                n_heads=config["num_attention_heads"], d_ff=config.get("intermediate_size"),
                dropout=config.get("hidden_dropout_prob", 0.0),
                attn_dropout=config.get("attention_probs_dropout_prob", 0.0), pool="cls", position="learned",
                norm="layernorm", norm_eps=config.get("layer_norm_eps", 1e-12),
                activation=FROM_HF_ACTIVATIONS[activation],
                qkv_bias=config.get("qkv_bias", True), bias=True)  # fmt: skip


def _import_vit(weights: dict[str, Tensor], config: dict) -> dict[str, Tensor]:
    return vit_state_dict_to_lightformer(weights)


def image_classifier(task: Any) -> HFModel:
    """An image classifier's ``ViTForImageClassification``, its labels the class names, with a ``ViTImageProcessor``
    of the data's normalisation."""
    from transformers import ViTForImageClassification, ViTImageProcessor

    config = vit_hf_config(task.model.config, task.class_names)
    model = ViTForImageClassification(config)
    facts = task.data_facts
    processor = None
    if facts is not None and facts.normalize_mean is not None:
        side = {"height": config.image_size, "width": config.image_size}
        repeat = 3 // len(facts.normalize_mean)  # a grey model's statistics, for each of the RGB channels
        processor = ViTImageProcessor(size=side, image_mean=list(facts.normalize_mean) * repeat,
                                      image_std=list(facts.normalize_std) * repeat)  # fmt: skip
    usage = (
        "from transformers import AutoModelForImageClassification, pipeline\n\n"
        'model = AutoModelForImageClassification.from_pretrained("DIR")\n'
        'print(pipeline("image-classification", model="DIR")("shoe.png"))'
    )
    return HFModel(model, vit_to_hf(task.model.state_dict()), usage, processor=processor)


def write_timm(task: Any, ckpt_path: str, checkpoint: dict, output: str) -> str:
    """``export --layout timm``: the ViT's weights under timm's ``VisionTransformer`` names, in a safetensors file."""
    from safetensors.torch import save

    tensors = {k: v.contiguous() for k, v in lightformer_to_timm(task.model.state_dict()).items()}
    atomic_write_bytes(output, save(tensors, safetensors_metadata(task)))
    give_usual_mode(output)
    return f"wrote {output} ({type(task).__name__}, {sum(p.numel() for p in task.model.parameters()):,} parameters)"


VIT_READERS = {"vit": HFReader(ViTConfig, vit_net_from_hf, _import_vit)}
HF = hf_layout(image_classifier, "image classification (ViT)", VIT_READERS)
TIMM = Layout(write_timm, "image classification")
