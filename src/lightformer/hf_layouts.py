"""Hugging Face layouts: a lightformer model written as a ``transformers`` model folder (``config.json``,
``model.safetensors``, the tokenizer, a model card) that ``AutoModel*.from_pretrained`` loads, and such a folder read
back under lightformer's names (``model.init.checkpoint=DIR``).

Each layout is a config mapping and a weight renaming, both directions:

- GPT → ``GPT2LMHeadModel`` where the shape is GPT-2's (learned positions, LayerNorm, a pointwise activation,
  biases), ``LlamaForCausalLM`` where it is Llama's (rotary positions, RMSNorm, SwiGLU); any other shape is refused,
  naming the ``model.net`` fields to change.
- BERT pre-training (masked LM + NSP) → ``BertForPreTraining`` and the text classifier →
  ``BertForSequenceClassification`` (post-norm, learned positions).
- ViT → ``ViTForImageClassification`` (class-token pooling, LayerNorm, biases).
- The translator → ``MarianMTModel`` (post-norm, sinusoidal positions, one embedding shared and tied).

A shape that no layout fits is refused (``ConfigError``) naming the ``model.net`` fields to change and what each
layout needs; a folder whose ``config.json`` asks for what lightformer lacks (grouped-query attention, another rotary
base) is refused naming that field.

Activations: our "gelu" is the exact (erf) GELU, HF's "gelu"; our "gelu_tanh" is HF's "gelu_new". Rotary embeddings:
ours rotate the channel pairs (i, i + head_dim/2) with base 10000, as HF Llama's ``rotate_half`` does, so the query and
key weights are copied unpermuted. Sinusoidal positions: Marian's table holds the sines, then the cosines, ours
interleaves them, so a translator's residual channels are permuted on the way (``marian_to_hf``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lightformer.errors import ConfigError
from lightformer.nn.checks import as_pair

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

    from lightformer.models.gpt import GPTConfig
    from lightformer.tasks.base import Task

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")

# Our pointwise activations ↔ HF's ACT2FN names (import also takes HF's other name of the tanh approximation).
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
FROM_HF_ACTIVATIONS = {**{hf: ours for ours, hf in HF_ACTIVATIONS.items()}, "gelu_pytorch_tanh": "gelu_tanh"}
ROPE_BASE = 10000.0  # lightformer's RotaryEmbedding base (not a config field)

# What each GPT layout needs of ``model.net``: field → the values that fit.
GPT_LAYOUTS: dict[str, dict[str, tuple]] = {
    "gpt2": {"position": ("learned",), "norm": ("layernorm",), "activation": tuple(HF_ACTIVATIONS), "bias": (True,)},
    "llama": {"position": ("rope",), "norm": ("rmsnorm",), "activation": ("swiglu",)},
}
HF_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "vit": "ViTForImageClassification",
              "bert": "BertForPreTraining / BertForSequenceClassification", "marian": "MarianMTModel"}  # fmt: skip


def _fits(config: Any, needs: dict[str, tuple]) -> list[str]:
    """The fields of ``config`` whose values ``needs`` does not allow, as "field=value"."""
    return [f"{name}={getattr(config, name)!r}" for name, ok in needs.items() if getattr(config, name) not in ok]


def _describe(needs: dict[str, tuple]) -> str:
    return ", ".join(f"{name}={'|'.join(str(v).lower() if isinstance(v, bool) else str(v) for v in ok)}"
                     for name, ok in needs.items())  # fmt: skip


def refuse_shape(kind: str, config: Any, layouts: dict[str, dict[str, tuple]]) -> None:
    """``ConfigError`` for a ``kind`` model whose shape no layout of ``layouts`` fits: the fields to change for the
    nearest one, and what each layout needs."""
    misfits = {name: _fits(config, needs) for name, needs in layouts.items()}
    nearest = min(misfits, key=lambda name: len(misfits[name]))
    change = ", ".join(f"model.net.{m.split('=')[0]} (now {m.split('=', 1)[1]})" for m in misfits[nearest])
    fit = "; ".join(f"{HF_CLASSES.get(name, name)}: {_describe(needs)}" for name, needs in layouts.items())
    raise ConfigError(
        f"--layout hf: this {kind}'s shape fits no Hugging Face layout. Change {change} for the "
        f"{HF_CLASSES.get(nearest, nearest)} layout. The layouts that fit a {kind} (model.net fields): {fit}"
    )


# --- GPT ---------------------------------------------------------------------------------------------------


def gpt_layout(config: GPTConfig) -> str:
    """ "gpt2" or "llama": the layout ``config``'s shape fits; ``ConfigError`` naming the fields otherwise."""
    for name, needs in GPT_LAYOUTS.items():
        if not _fits(config, needs):
            return name
    refuse_shape("GPT", config, GPT_LAYOUTS)
    raise AssertionError  # refuse_shape raises


def gpt_hf_config(config: GPTConfig, special_ids: dict[str, int]) -> PretrainedConfig:
    """The ``transformers`` config of ``config``'s layout; ``special_ids``: bos/eos/pad token ids."""
    from transformers import GPT2Config, LlamaConfig

    c, ids = config, {f"{name}_token_id": value for name, value in special_ids.items()}
    if gpt_layout(c) == "gpt2":
        return GPT2Config(
            vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.d_model, n_layer=c.n_layers,
            n_head=c.n_heads, n_inner=c.d_ff, activation_function=HF_ACTIVATIONS[c.activation],
            resid_pdrop=c.dropout, embd_pdrop=c.dropout, attn_pdrop=c.attention_dropout,
            layer_norm_epsilon=c.norm_eps, tie_word_embeddings=c.tie_weights, architectures=["GPT2LMHeadModel"], **ids,
        )  # fmt: skip
    return LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff or 4 * c.d_model,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, num_key_value_heads=c.n_heads,
        head_dim=c.d_model // c.n_heads, hidden_act="silu", max_position_embeddings=c.block_size,
        rms_norm_eps=c.norm_eps, rope_parameters={"rope_type": "default", "rope_theta": ROPE_BASE},
        attention_bias=c.bias, mlp_bias=c.bias, attention_dropout=c.attention_dropout,
        tie_word_embeddings=c.tie_weights, architectures=["LlamaForCausalLM"], **ids,
    )  # fmt: skip


_GPT2_NAMES = {"ln_1": "norm1", "attn.c_attn": "self_attn.qkv", "attn.c_proj": "self_attn.proj", "ln_2": "norm2",
               "mlp.c_fc": "ffn.fc1", "mlp.c_proj": "ffn.fc2"}  # fmt: skip
_LLAMA_NAMES = {"input_layernorm": "norm1", "self_attn.o_proj": "self_attn.proj", "post_attention_layernorm": "norm2",
                "mlp.down_proj": "ffn.fc2"}  # fmt: skip


def gpt_to_hf(state: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """Our ``GPT`` state dict → the HF layout's (``gpt_layout``), every tensor of the HF model named."""
    layout, out = gpt_layout(config), {}
    for name, value in state.items():
        if name.startswith("decoder.layers."):
            _, _, index, rest = name.split(".", 3)
            module, _, leaf = rest.rpartition(".")
            if layout == "gpt2":
                hf = {ours: theirs for theirs, ours in _GPT2_NAMES.items()}[module]
                conv1d = leaf == "weight" and not hf.startswith("ln")  # HF's Conv1D stores (in, out)
                out[f"transformer.h.{index}.{hf}.{leaf}"] = value.t().contiguous() if conv1d else value
                continue
            prefix = f"model.layers.{index}"
            if module == "self_attn.qkv":
                for part, tensor in zip("qkv", value.chunk(3), strict=True):
                    out[f"{prefix}.self_attn.{part}_proj.{leaf}"] = tensor.contiguous()
            elif module == "ffn.fc1":  # packed [gate; value]: silu(gate) · value, HF's silu(gate_proj) · up_proj
                gate, up = value.chunk(2)
                out[f"{prefix}.mlp.gate_proj.{leaf}"], out[f"{prefix}.mlp.up_proj.{leaf}"] = gate, up
            else:
                out[f"{prefix}.{({v: k for k, v in _LLAMA_NAMES.items()})[module]}.{leaf}"] = value
        elif layout == "gpt2":
            top = {"embed.weight": "transformer.wte.weight", "position.weight": "transformer.wpe.weight",
                   "decoder.norm.weight": "transformer.ln_f.weight", "decoder.norm.bias": "transformer.ln_f.bias",
                   "lm_head.weight": "lm_head.weight"}  # fmt: skip
            out[top[name]] = value
        else:
            top = {"embed.weight": "model.embed_tokens.weight", "decoder.norm.weight": "model.norm.weight",
                   "lm_head.weight": "lm_head.weight"}  # fmt: skip
            out[top[name]] = value
    return out


def llama_state_dict_to_lightformer(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A Hugging Face ``LlamaForCausalLM`` (or ``LlamaModel``) state dict → our ``GPT``'s names; the head is the token
    embedding where the folder ties them (no ``lm_head.weight``)."""
    sd = {k if k.startswith(("model.", "lm_head.")) else f"model.{k}": v for k, v in state_dict.items()}
    out: dict[str, Tensor] = {}
    packed: dict[tuple[str, str, str], dict[str, Tensor]] = {}  # (layer, qkv|fc1, leaf) → parts
    for key, value in sd.items():
        if key.startswith("model.layers."):
            _, _, index, rest = key.split(".", 3)
            module, _, leaf = rest.rpartition(".")
            if module in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                packed.setdefault((index, "self_attn.qkv", leaf), {})[module[10]] = value
            elif module in ("mlp.gate_proj", "mlp.up_proj"):
                packed.setdefault((index, "ffn.fc1", leaf), {})[module[4:]] = value
            elif module in _LLAMA_NAMES:
                out[f"decoder.layers.{index}.{_LLAMA_NAMES[module]}.{leaf}"] = value
            elif not module.endswith("rotary_emb"):
                raise ConfigError(f"Hugging Face Llama parameter {key!r} has no lightformer counterpart")
        elif key in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
            ours = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "decoder.norm.weight"}
            out[ours.get(key, key)] = value
        elif "rotary_emb" not in key:
            raise ConfigError(f"Hugging Face Llama parameter {key!r} has no lightformer counterpart")
    for (index, module, leaf), parts in packed.items():
        order = ("q", "k", "v") if module == "self_attn.qkv" else ("gate_proj", "up_proj")
        out[f"decoder.layers.{index}.{module}.{leaf}"] = torch.cat([parts[p] for p in order])
    out.setdefault("lm_head.weight", out["embed.weight"])
    return out


def gpt_net_from_hf(config: dict) -> dict[str, Any]:
    """Our ``GPTConfig`` fields of a GPT-2 or Llama ``config.json``; ``ConfigError`` naming what has no
    counterpart here (grouped-query attention, another rotary base or scaling, another activation)."""
    kind = config.get("model_type")
    tie = bool(config.get("tie_word_embeddings", True))
    if kind == "gpt2":
        activation = config.get("activation_function", "gelu_new")
        if activation not in FROM_HF_ACTIVATIONS:
            raise ConfigError(f"GPT-2 activation_function={activation!r} has no lightformer counterpart "
                              f"(lightformer has {', '.join(FROM_HF_ACTIVATIONS)})")  # fmt: skip
        if config.get("scale_attn_by_inverse_layer_idx") or not config.get("scale_attn_weights", True):
            raise ConfigError("GPT-2 scale_attn_by_inverse_layer_idx=true or scale_attn_weights=false has no "
                              "lightformer counterpart (attention scores are scaled by 1/sqrt(head_dim))")  # fmt: skip
        return dict(vocab_size=config["vocab_size"], block_size=config["n_positions"], n_layers=config["n_layer"],
                    n_heads=config["n_head"], d_model=config["n_embd"], d_ff=config.get("n_inner"),
                    position="learned", activation=FROM_HF_ACTIVATIONS[activation], norm="layernorm",
                    norm_eps=config.get("layer_norm_epsilon", 1e-5), bias=True, tie_weights=tie)  # fmt: skip
    d_model, heads = config["hidden_size"], config["num_attention_heads"]
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = rope.get("rope_theta", config.get("rope_theta", ROPE_BASE))
    problems = []
    if config.get("num_key_value_heads", heads) != heads:
        problems.append(f"num_key_value_heads={config['num_key_value_heads']} (grouped-query attention; "
                        f"lightformer has one key/value head per query head, {heads})")  # fmt: skip
    if config.get("head_dim", d_model // heads) != d_model // heads:
        problems.append(f"head_dim={config['head_dim']} (lightformer's is hidden_size/num_attention_heads)")
    if theta != ROPE_BASE or rope.get("rope_type", rope.get("type", "default")) != "default":
        problems.append(f"rope {rope or {'rope_theta': theta}} (lightformer's rotary base is {ROPE_BASE:g}, unscaled)")
    if config.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={config['hidden_act']!r} (lightformer's SwiGLU gates with silu)")
    if bool(config.get("attention_bias", False)) != bool(config.get("mlp_bias", False)):
        problems.append("attention_bias != mlp_bias (lightformer's model.net.bias is one switch)")
    if problems:
        raise ConfigError(f"this Llama folder has no lightformer counterpart: {'; '.join(problems)}")
    return dict(vocab_size=config["vocab_size"], block_size=config.get("max_position_embeddings", 2048),
                n_layers=config["num_hidden_layers"], n_heads=heads, d_model=d_model,
                d_ff=config["intermediate_size"], position="rope", activation="swiglu", norm="rmsnorm",
                norm_eps=config.get("rms_norm_eps", 1e-6), bias=bool(config.get("attention_bias", False)),
                tie_weights=tie)  # fmt: skip


# --- BERT --------------------------------------------------------------------------------------------------

BERT_LAYOUTS = {"bert": {"position": ("learned",), "norm_first": (False,), "activation": tuple(HF_ACTIVATIONS)}}
_BERT_TOP = {"bert.embed": "bert.embeddings.word_embeddings", "bert.position": "bert.embeddings.position_embeddings",
             "bert.segment": "bert.embeddings.token_type_embeddings", "bert.embed_norm": "bert.embeddings.LayerNorm",
             "pooler.dense": "bert.pooler.dense", "mlm_head.dense": "cls.predictions.transform.dense",
             "mlm_head.norm": "cls.predictions.transform.LayerNorm", "mlm_head.decoder": "cls.predictions.decoder",
             "nsp_head": "cls.seq_relationship", "classifier": "classifier"}  # fmt: skip
_BERT_LAYER = {"self_attn.proj": "attention.output.dense", "norm1": "attention.output.LayerNorm",
               "ffn.fc1": "intermediate.dense", "ffn.fc2": "output.dense", "norm2": "output.LayerNorm"}  # fmt: skip


def bert_hf_config(config: Any, num_labels: int | None = None, class_names: list[str] | None = None) -> Any:
    """The ``transformers.BertConfig`` of our ``BertConfig`` (post-norm, learned positions only)."""
    from transformers import BertConfig

    c = config
    for name, needs in BERT_LAYOUTS.items():
        if _fits(c, needs):
            refuse_shape("BERT", c, {name: needs})
    names = list(class_names or [])
    labels = {"id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}
    return BertConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        intermediate_size=c.d_ff or 4 * c.d_model, hidden_act=HF_ACTIVATIONS[c.activation],
        hidden_dropout_prob=c.dropout, attention_probs_dropout_prob=c.attention_dropout,
        max_position_embeddings=c.max_len,
        type_vocab_size=c.type_vocab_size, layer_norm_eps=c.norm_eps, pad_token_id=c.pad_id,
        classifier_dropout=c.classifier_dropout, tie_word_embeddings=True,
        **(labels if class_names else {"num_labels": num_labels or 2}),
    )  # fmt: skip


def bert_to_hf(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our ``BertForPreTraining`` / ``BertForSequenceClassification`` state dict → HF's names (q, k, v apart)."""
    out = {}
    for name, value in state.items():
        module, _, leaf = name.rpartition(".")
        if module.startswith("bert.encoder.layers."):
            index, _, rest = module.removeprefix("bert.encoder.layers.").partition(".")
            prefix = f"bert.encoder.layer.{index}"
            if rest == "self_attn.qkv":
                for part, tensor in zip(("query", "key", "value"), value.chunk(3), strict=True):
                    out[f"{prefix}.attention.self.{part}.{leaf}"] = tensor.contiguous()
            else:
                out[f"{prefix}.{_BERT_LAYER[rest]}.{leaf}"] = value
        elif name == "mlm_head.bias":  # HF keeps the decoder's bias twice: the head's and the decoder's
            out["cls.predictions.bias"] = out["cls.predictions.decoder.bias"] = value
        else:
            out[f"{_BERT_TOP[module]}.{leaf}"] = value
    return out


def hf_activation(config: dict, model: str) -> str:
    """Our activation of a ``config.json``'s ``hidden_act`` (``model`` names the model in the error)."""
    activation = config.get("hidden_act", "gelu")
    if activation not in FROM_HF_ACTIVATIONS:
        raise ConfigError(f"{model} hidden_act={activation!r} has no lightformer counterpart "
                          f"(lightformer has {', '.join(FROM_HF_ACTIVATIONS)})")  # fmt: skip
    return activation


def bert_net_from_hf(config: dict) -> dict[str, Any]:
    """Our ``BertConfig`` fields of a BERT ``config.json``."""
    activation = hf_activation(config, "BERT")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError(f"BERT position_embedding_type={config['position_embedding_type']!r} has no lightformer "
                          "counterpart (lightformer's BERT has absolute learned positions or rope)")  # fmt: skip
    return dict(vocab_size=config["vocab_size"], max_len=config.get("max_position_embeddings", 512),
                type_vocab_size=config.get("type_vocab_size", 2), n_layers=config["num_hidden_layers"],
                n_heads=config["num_attention_heads"], d_model=config["hidden_size"],
                d_ff=config.get("intermediate_size"), dropout=config.get("hidden_dropout_prob", 0.1),
                attn_dropout=config.get("attention_probs_dropout_prob", 0.1),
                activation=FROM_HF_ACTIVATIONS[activation], norm_first=False, position="learned",
                norm_eps=config.get("layer_norm_eps", 1e-12), pad_id=config.get("pad_token_id") or 0,
                num_classes=len(config.get("id2label") or {0: 0, 1: 1}),
                classifier_dropout=config.get("classifier_dropout"))  # fmt: skip


def _import_bert(weights: dict[str, Tensor], config: dict) -> dict[str, Tensor]:
    from lightformer.models.bert import bert_state_dict_to_lightformer

    head = {name: weights.pop(name) for name in list(weights) if name.startswith("classifier.")}
    return bert_state_dict_to_lightformer(weights) | head


# --- ViT ---------------------------------------------------------------------------------------------------

VIT_LAYOUTS = {"vit": {"pool": ("cls",), "norm": ("layernorm",), "activation": tuple(HF_ACTIVATIONS), "bias": (True,)}}
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
    from transformers import ViTConfig

    c = config
    if not c.num_classes:
        raise ConfigError("--layout hf: a ViT without a head (model.net.num_classes=0) has no "
                          "ViTForImageClassification layout")  # fmt: skip
    if _fits(c, VIT_LAYOUTS["vit"]):
        refuse_shape("ViT", c, VIT_LAYOUTS)
    names = class_names or [f"LABEL_{i}" for i in range(c.num_classes)]
    image, patch = as_pair(c.image_size), as_pair(c.patch_size)
    if image[0] != image[1] or patch[0] != patch[1]:
        raise ConfigError(f"--layout hf: ViTForImageClassification takes square images and patches, not "
                          f"model.net.image_size={c.image_size}, patch_size={c.patch_size}")  # fmt: skip
    return ViTConfig(
        hidden_size=c.d_model, num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        intermediate_size=c.d_ff or 4 * c.d_model, hidden_act=HF_ACTIVATIONS[c.activation],
        hidden_dropout_prob=c.dropout, attention_probs_dropout_prob=c.attention_dropout,
        layer_norm_eps=c.norm_eps,
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


# --- Marian ------------------------------------------------------------------------------------------------

MARIAN_LAYOUTS = {"marian": {"position": ("sinusoidal",), "norm": ("layernorm",), "norm_first": (False,),
                             "activation": tuple(HF_ACTIVATIONS), "share_embeddings": (True,), "tie_weights": (True,),
                             "norm_eps": (1e-5,)}}  # fmt: skip
_MARIAN_LAYER = {"self_attn.proj": "self_attn.out_proj", "norm1": "self_attn_layer_norm",
                 "cross_attn.proj": "encoder_attn.out_proj", "norm_cross": "encoder_attn_layer_norm",
                 "ffn.fc1": "fc1", "ffn.fc2": "fc2", "norm2": "final_layer_norm"}  # fmt: skip


def marian_hf_config(config: Any, special_ids: dict[str, int]) -> Any:
    """The ``transformers.MarianConfig`` of our ``EncoderDecoderConfig``: post-norm, sinusoidal positions, one
    embedding shared by the source, the target and the output layer (Marian's LayerNorm epsilon is fixed, 1e-5)."""
    from transformers import MarianConfig

    c = config
    if _fits(c, MARIAN_LAYOUTS["marian"]):
        refuse_shape("translator", c, MARIAN_LAYOUTS)
    return MarianConfig(
        vocab_size=c.src_vocab_size, decoder_vocab_size=c.tgt_vocab_size, d_model=c.d_model,
        encoder_layers=c.n_encoder_layers, decoder_layers=c.n_decoder_layers, encoder_attention_heads=c.n_heads,
        decoder_attention_heads=c.n_heads, encoder_ffn_dim=c.d_ff or 4 * c.d_model,
        decoder_ffn_dim=c.d_ff or 4 * c.d_model, activation_function=HF_ACTIVATIONS[c.activation],
        dropout=c.dropout, attention_dropout=c.attention_dropout, activation_dropout=0.0,
        max_position_embeddings=c.max_len,
        scale_embedding=True, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        pad_token_id=c.pad_id, bos_token_id=special_ids["bos"], eos_token_id=special_ids["eos"],
        decoder_start_token_id=special_ids["bos"], forced_eos_token_id=None,
        architectures=["MarianMTModel"],
    )  # fmt: skip


def sinusoidal_order(d_model: int) -> Tensor:
    """Marian's channel h ↔ ours: its sinusoidal table puts the sines in the first half and the cosines in the
    second, ours interleaves them (sin, cos, sin, cos...); Marian's channel h is our channel ``order[h]``."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def marian_to_hf(state: dict[str, Tensor], hf_state: dict[str, Tensor], d_model: int) -> dict[str, Tensor]:
    """Our ``EncoderDecoder`` state dict → ``MarianMTModel``'s names, in Marian's order of the residual channels.

    Positions are added to the residual stream, so the two orders of the sinusoidal table are two bases of it: every
    weight that reads the stream has its input columns permuted, every weight that writes it (and every LayerNorm,
    which is indifferent to the channels' order) its output rows, so the model computes the same function.
    ``hf_state``: the Marian model's own, for its fixed position tables and zero ``final_logits_bias``.
    """
    order = sinusoidal_order(d_model)
    out = {k: v for k, v in hf_state.items() if "embed_positions" in k or k == "final_logits_bias"}
    for name, value in state.items():
        module, _, leaf = name.rpartition(".")
        if name in ("src_embed.weight", "tgt_embed.weight", "output.weight"):
            for hf in ("model.shared", "model.encoder.embed_tokens", "model.decoder.embed_tokens", "lm_head"):
                out[f"{hf}.weight"] = value[:, order].contiguous()
            continue
        side, _, index, rest = module.split(".", 3)  # encoder|decoder . layers . i . rest
        prefix = f"model.{side}.layers.{index}"
        if rest in ("self_attn.qkv", "cross_attn.q", "cross_attn.kv"):  # read the stream: permute the columns
            attn = "self_attn" if rest == "self_attn.qkv" else "encoder_attn"
            parts = {"self_attn.qkv": "qkv", "cross_attn.q": "q", "cross_attn.kv": "kv"}[rest]
            for part, tensor in zip(parts, value.chunk(len(parts)), strict=True):
                out[f"{prefix}.{attn}.{part}_proj.{leaf}"] = (
                    tensor[:, order] if leaf == "weight" else tensor
                ).contiguous()
        elif rest == "ffn.fc1":
            out[f"{prefix}.fc1.{leaf}"] = (value[:, order] if leaf == "weight" else value).contiguous()
        else:  # write the stream (output projections, fc2) or normalise it: permute the rows
            out[f"{prefix}.{_MARIAN_LAYER[rest]}.{leaf}"] = value[order].contiguous()
    return out


def marian_state_dict_to_lightformer(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A Hugging Face ``MarianMTModel`` state dict → our ``EncoderDecoder``'s names, in our order of the residual
    channels (the inverse of ``marian_to_hf``); its fixed position tables are dropped (ours are the same function)."""
    embed = next((state_dict[k] for k in ("model.shared.weight", "model.encoder.embed_tokens.weight",
                                          "lm_head.weight") if k in state_dict), None)  # fmt: skip
    if embed is None:
        raise ConfigError("a Marian model folder without its shared embedding (model.shared.weight)")
    bias = state_dict.get("final_logits_bias")
    if bias is not None and bias.abs().max() > 0:
        raise ConfigError("final_logits_bias is not zero: lightformer's output layer has no bias")
    inverse = torch.argsort(sinusoidal_order(embed.shape[1]))
    shared = embed[:, inverse].contiguous()  # one tensor: source, target and output layer
    out = {"src_embed.weight": shared, "tgt_embed.weight": shared, "output.weight": shared}
    layer_names = {theirs: ours for ours, theirs in _MARIAN_LAYER.items()}
    packed: dict[tuple[str, str, str], dict[str, Tensor]] = {}
    for key, value in state_dict.items():
        if not key.startswith(("model.encoder.layers.", "model.decoder.layers.")):
            continue  # the embeddings (one tensor, above), the fixed position tables, the zero output bias
        _, side, _, index, rest = key.split(".", 4)
        module, _, leaf = rest.rpartition(".")
        prefix = f"{side}.layers.{index}"
        if module.endswith(("q_proj", "k_proj", "v_proj")):  # read the stream: their columns back to our order
            attn, _, part = module.partition(".")
            packed.setdefault((prefix, attn, leaf), {})[part[0]] = value[:, inverse] if leaf == "weight" else value
        elif module == "fc1":
            out[f"{prefix}.ffn.fc1.{leaf}"] = (value[:, inverse] if leaf == "weight" else value).contiguous()
        elif module in layer_names:
            out[f"{prefix}.{layer_names[module]}.{leaf}"] = value[inverse].contiguous()
        else:
            raise ConfigError(f"Hugging Face Marian parameter {key!r} has no lightformer counterpart")
    for (prefix, attn, leaf), parts in packed.items():
        if attn == "self_attn":
            out[f"{prefix}.self_attn.qkv.{leaf}"] = torch.cat([parts["q"], parts["k"], parts["v"]]).contiguous()
        else:
            out[f"{prefix}.cross_attn.q.{leaf}"] = parts["q"].contiguous()
            out[f"{prefix}.cross_attn.kv.{leaf}"] = torch.cat([parts["k"], parts["v"]]).contiguous()
    return out


def marian_net_from_hf(config: dict) -> dict[str, Any]:
    """Our ``EncoderDecoderConfig`` fields of a Marian ``config.json``; ``ConfigError`` naming what has no
    counterpart here."""
    problems = []
    activation = config.get("activation_function", "swish")
    if activation not in FROM_HF_ACTIVATIONS:
        problems.append(f"activation_function={activation!r} (lightformer has {', '.join(FROM_HF_ACTIVATIONS)})")
    if not config.get("scale_embedding", False):
        problems.append("scale_embedding=false (lightformer's translator scales its embeddings by sqrt(d_model))")
    if config.get("encoder_attention_heads") != config.get("decoder_attention_heads"):
        problems.append("encoder_attention_heads != decoder_attention_heads (one model.net.n_heads)")
    if config.get("encoder_ffn_dim") != config.get("decoder_ffn_dim"):
        problems.append("encoder_ffn_dim != decoder_ffn_dim (one model.net.d_ff)")
    if config.get("decoder_vocab_size") not in (None, config["vocab_size"]) or not config.get(
        "share_encoder_decoder_embeddings", True
    ):
        problems.append("separate source and target vocabularies (lightformer's Marian layout shares one)")
    if problems:
        raise ConfigError(f"this Marian folder has no lightformer counterpart: {'; '.join(problems)}")
    return dict(src_vocab_size=config["vocab_size"], tgt_vocab_size=config["vocab_size"],
                pad_id=config.get("pad_token_id") or 0, max_len=config.get("max_position_embeddings", 512),
                n_encoder_layers=config["encoder_layers"], n_decoder_layers=config["decoder_layers"],
                d_model=config["d_model"], n_heads=config["encoder_attention_heads"], d_ff=config["encoder_ffn_dim"],
                dropout=config.get("dropout", 0.1), attn_dropout=config.get("attention_dropout", 0.0),
                activation=FROM_HF_ACTIVATIONS[activation], norm="layernorm", norm_first=False, norm_eps=1e-5,
                position="sinusoidal", share_embeddings=True, tie_weights=True)  # fmt: skip


def _import_marian(weights: dict[str, Tensor], config: dict) -> dict[str, Tensor]:
    return marian_state_dict_to_lightformer(weights)


# --- export ------------------------------------------------------------------------------------------------


def _special_ids(tokenizer: Any) -> dict[str, int]:
    return {"bos": tokenizer.bos_id, "eos": tokenizer.eos_id, "pad": tokenizer.pad_id}


def _language_model(task: Task) -> tuple[PreTrainedModel, dict[str, Any]]:
    from transformers import GenerationConfig, GPT2LMHeadModel, LlamaForCausalLM

    config = gpt_hf_config(task.model.config, _special_ids(task.tokenizer))
    model = (GPT2LMHeadModel if config.model_type == "gpt2" else LlamaForCausalLM)(config)
    block_size = task.model.config.block_size
    model.generation_config = GenerationConfig(  # `lightformer generate`'s defaults, within the position table
        do_sample=True, temperature=0.8, top_k=200, max_length=block_size, **config_ids(config)
    )
    usage = (
        "from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline\n\n"
        'model = AutoModelForCausalLM.from_pretrained("DIR")\n'
        'tokenizer = AutoTokenizer.from_pretrained("DIR")\n'
        f"# the prompt and the new tokens together: at most {block_size} (the model's positions)\n"
        'print(pipeline("text-generation", model="DIR")("It is a truth", max_new_tokens=40)[0]["generated_text"])'
    )
    return model, {"weights": gpt_to_hf(task.model.state_dict(), task.model.config), "usage": usage}


def config_ids(config: PretrainedConfig) -> dict[str, int]:
    return {k: getattr(config, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}


def _bert_pretraining(task: Task) -> tuple[PreTrainedModel, dict[str, Any]]:
    from transformers import BertForPreTraining

    model = BertForPreTraining(bert_hf_config(task.model.config))
    usage = (
        "from transformers import AutoModelForPreTraining, pipeline\n\n"
        'model = AutoModelForPreTraining.from_pretrained("DIR")  # masked LM + next sentence\n'
        'fill = pipeline("fill-mask", model="DIR")\n'
        'print(fill(f"Her {fill.tokenizer.mask_token} was very kind."))'
    )
    return model, {"weights": bert_to_hf(task.model.state_dict()), "usage": usage}


def _bert_classifier(task: Task) -> tuple[PreTrainedModel, dict[str, Any]]:
    from transformers import BertForSequenceClassification

    c = task.model.config
    model = BertForSequenceClassification(bert_hf_config(c, c.num_classes, task.class_names))
    usage = (
        "from transformers import AutoModelForSequenceClassification, pipeline\n\n"
        'model = AutoModelForSequenceClassification.from_pretrained("DIR")\n'
        'print(pipeline("text-classification", model="DIR")("A truth universally acknowledged."))'
    )
    return model, {"weights": bert_to_hf(task.model.state_dict()), "usage": usage}


def _vit_classifier(task: Task) -> tuple[PreTrainedModel, dict[str, Any]]:
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
    return model, {"weights": vit_to_hf(task.model.state_dict()), "usage": usage, "processor": processor}


def _translator(task: Task) -> tuple[PreTrainedModel, dict[str, Any]]:
    from transformers import GenerationConfig, MarianMTModel

    facts = task.data_facts
    if facts is not None and facts.src_tokenizer != facts.tgt_tokenizer:
        raise ConfigError("--layout hf: MarianMTModel's folder holds one tokenizer, but this translator's source "
                          "and target tokenizers differ (train it with the data's joint vocabulary)")  # fmt: skip
    c, hp = task.model.config, task.hparams
    config = marian_hf_config(c, _special_ids(task.tgt_tokenizer))
    model = MarianMTModel(config)
    model.generation_config = GenerationConfig(  # `lightformer translate`'s beam search
        num_beams=hp.beam_size, length_penalty=hp.length_penalty, **config_ids(config),
        decoder_start_token_id=config.decoder_start_token_id, max_length=c.max_len,
    )  # fmt: skip
    usage = (
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer\n\n"
        'model = AutoModelForSeq2SeqLM.from_pretrained("DIR")\n'
        'tokenizer = AutoTokenizer.from_pretrained("DIR")\n'
        'batch = tokenizer(["Guten Morgen."], return_tensors="pt", padding=True)\n'
        "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))"
    )
    weights = marian_to_hf(task.model.state_dict(), model.state_dict(), c.d_model)
    return model, {"weights": weights, "usage": usage}


# The tasks that have a Hugging Face layout, by class name → the function that builds the HF model and its weights.
EXPORTERS = {"LanguageModelTask": _language_model, "MaskedLanguageModelTask": _bert_pretraining,
             "TextClassificationTask": _bert_classifier, "ImageClassificationTask": _vit_classifier,
             "TranslationTask": _translator}  # fmt: skip


def hf_tokenizer(task: Task) -> Any:
    """The task's tokenizer as a ``PreTrainedTokenizerFast`` with its special tokens named; None without one."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    from lightformer.data.preparation.tokenizers import BOS, EOS, MASK, PAD, UNK

    tokenizer = getattr(task, "tokenizer", None) or getattr(task, "src_tokenizer", None)
    if tokenizer is None:
        return None
    raw = RawTokenizer.from_str(tokenizer.to_str())
    roles = dict(bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK)
    special = [(BOS, tokenizer.bos_id), (EOS, tokenizer.eos_id)]
    name = type(task).__name__
    if name == "TranslationTask":  # a source as the data frames it: A [EOS]
        raw.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=special[1:])
    elif name != "LanguageModelTask":  # BERT's [CLS] and [SEP] are BOS and EOS
        roles |= dict(cls_token=BOS, sep_token=EOS, model_input_names=["input_ids", "token_type_ids", "attention_mask"])
        if raw.token_to_id(MASK) is not None:
            roles["mask_token"] = MASK
        # As the data frames a text (or a pair): [BOS] A [EOS] (B [EOS]), B in segment 1.
        raw.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A {EOS}", pair=f"{BOS} $A {EOS} $B:1 {EOS}:1", special_tokens=special
        )
    return PreTrainedTokenizerFast(tokenizer_object=raw, **roles)


def _output_folder(output: str) -> Path:
    folder = Path(output)
    if folder.is_file():
        raise ConfigError(f"--output: {output} is a file; --layout hf writes a folder (config.json, model.safetensors, "
                          "tokenizer, README.md): give a new or empty folder")  # fmt: skip
    if folder.is_dir() and any(folder.iterdir()):
        raise ConfigError(f"--output: the folder {output} is not empty; give a new or empty folder")
    return folder


def export_hf(task: Task, ckpt_path: str, checkpoint: dict, output: str) -> str:
    """Write ``task``'s model in its Hugging Face layout to the folder ``output`` (config.json, model.safetensors,
    generation_config.json, the tokenizer, README.md); returns a one-line description. The HF model is built from the
    converted config and loads the converted weights strictly (nothing missing, nothing unexpected)."""
    name = type(task).__name__
    if name not in EXPORTERS:
        raise ConfigError(f"--layout hf: a {name} checkpoint has no Hugging Face layout here (layouts for: "
                          f"{', '.join(EXPORTERS)}); use --layout lightformer")  # fmt: skip
    folder = _output_folder(output)
    model, extra = EXPORTERS[name](task)
    model.load_state_dict(extra["weights"], strict=True)
    staging = folder.with_name(f"{folder.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        model.save_pretrained(staging)
        tokenizer = hf_tokenizer(task)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if extra.get("processor") is not None:
            extra["processor"].save_pretrained(staging)
        (staging / "README.md").write_text(
            model_card(task, ckpt_path, checkpoint, model, extra["usage"], folder, staging)
        )
        if folder.is_dir():
            folder.rmdir()  # empty: checked above
        staging.replace(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return f"wrote {folder}/ ({type(model).__name__}, {model.num_parameters():,} parameters, from {name} {ckpt_path})"


def _plain(value: Any, longest: int = 200) -> Any:
    """Hyperparameters for the model card: long strings (a tokenizer's JSON) shortened."""
    if isinstance(value, dict):
        return {k: _plain(v, longest) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, longest) for v in value]
    if isinstance(value, str) and len(value) > longest:
        return f"<{len(value):,} characters>"
    return value


def run_config(ckpt_path: str) -> Path | None:
    """The ``config.yaml`` LightningCLI wrote in the run folder of ``ckpt_path`` (its folder or the one above)."""
    for folder in Path(ckpt_path).resolve().parents[:2]:
        if (folder / "config.yaml").is_file():
            return folder / "config.yaml"
    return None


def model_card(
    task: Task, ckpt_path: str, checkpoint: dict, model: PreTrainedModel, usage: str, folder: Path, staging: Path
) -> str:
    """README.md of an exported folder (being written in ``staging``): what was trained, how (the run's config.yaml
    copied beside it), its final metrics, and how to load it."""
    from lightformer import __version__

    hparams = {k: v for k, v in task.hparams.items() if not k.startswith("_")}
    metrics = []
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if str(key).startswith("ModelCheckpoint") and isinstance(state, dict) and state.get("monitor"):
            score = state.get("best_model_score")
            if score is not None:
                metrics.append(f"- best {state['monitor']}: {float(score):.4g} ({state.get('best_model_path', '')})")
            current = state.get("current_score")
            if current is not None:
                metrics.append(f"- {state['monitor']} at this checkpoint: {float(current):.4g}")
            if score is None and current is None:
                metrics.append(f"- {state['monitor']}: not measured by this checkpoint's step")
    config = run_config(ckpt_path)
    if config is not None:  # the run's config travels with the weights
        shutil.copyfile(config, staging / "lightformer_config.yaml")
    command = ("python -m lightformer fit --config lightformer_config.yaml (the run's config, in this folder)"
               if config else "python -m lightformer fit --config <the run's config.yaml>")  # fmt: skip
    lines = [
        "---", "library_name: transformers", "tags: [lightformer]", "---", "",
        f"# {folder.name}", "",
        f"A lightformer `{type(task).__name__}` exported as `{type(model).__name__}` by lightformer {__version__}:",
        f"`lightformer export --ckpt_path {ckpt_path} --layout hf --output {folder}`.", "",
        "## Training", "",
        f"- task: `{type(task).__module__}.{type(task).__name__}`",
        f"- global step {checkpoint.get('global_step', '?')}, epoch {checkpoint.get('epoch', '?')}",
        f"- command: `{command}`", "",
        "## Final metrics", "", *(metrics or ["- none recorded in the checkpoint"]), "",
        "## How to load it", "", "```python", usage.replace("DIR", str(folder)), "```", "",
        "## Hyperparameters (the checkpoint's)", "", "```json", json.dumps(_plain(hparams), indent=2, default=str),
        "```", "",
    ]  # fmt: skip
    return "\n".join(lines)


# --- import ------------------------------------------------------------------------------------------------


def is_hf_folder(path: str) -> bool:
    """Whether ``path`` is a Hugging Face model folder: config.json and a weights file."""
    folder = Path(path)
    return (folder / "config.json").is_file() and any((folder / name).is_file() for name in WEIGHT_FILES)


def read_hf_config(path: str) -> dict:
    return json.loads((Path(path) / "config.json").read_text())


def read_hf_state_dict(path: str) -> dict[str, Tensor]:
    """The tensors of a Hugging Face model folder (safetensors, sharded safetensors, or pytorch_model.bin loaded
    with ``weights_only``)."""
    from safetensors.torch import load_file

    folder = Path(path)
    if (folder / "model.safetensors").is_file():
        return load_file(folder / "model.safetensors")
    if (folder / "model.safetensors.index.json").is_file():
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        weights: dict[str, Tensor] = {}
        for shard in sorted(set(index["weight_map"].values())):
            weights.update(load_file(folder / shard))
        return weights
    return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)


def hf_folder_to_lightformer(path: str, option: str = "model.init.checkpoint") -> dict[str, Tensor]:
    """The weights of a Hugging Face model folder (GPT-2, Llama, BERT, ViT, Marian) under lightformer's names."""
    config = read_hf_config(path)
    kind = config.get("model_type")
    importers = {"gpt2": _import_gpt2, "llama": _import_llama, "bert": _import_bert, "vit": _import_vit,
                 "marian": _import_marian}  # fmt: skip
    shapes = {"gpt2": gpt_net_from_hf, "llama": gpt_net_from_hf, "bert": bert_net_from_hf, "vit": vit_net_from_hf,
              "marian": marian_net_from_hf}  # fmt: skip
    if kind not in importers:
        raise ConfigError(f"{option}: {path} holds a Hugging Face {kind!r} model; lightformer reads "
                          f"{', '.join(importers)} folders")  # fmt: skip
    try:
        shapes[kind](config)  # refuse a shape lightformer cannot build, by name
        return importers[kind](read_hf_state_dict(path), config)
    except ConfigError as error:
        raise ConfigError(f"{option}: {path}: {error}") from None
    except (KeyError, ValueError) as error:
        raise ConfigError(f"{option}: {path} is not a {kind} model folder lightformer reads ({error})") from None


def _import_gpt2(weights: dict[str, Tensor], config: dict) -> dict[str, Tensor]:
    from lightformer.models.gpt import gpt2_state_dict_to_lightformer

    return gpt2_state_dict_to_lightformer(weights)


def _import_llama(weights: dict[str, Tensor], config: dict) -> dict[str, Tensor]:
    return llama_state_dict_to_lightformer(weights)


def net_from_hf_folder(path: str, net_class: type) -> dict[str, Any]:
    """The ``model.net`` fields (of ``net_class``) that a Hugging Face folder's config.json gives; {} for a model
    of another kind than ``net_class``'s."""
    config = read_hf_config(path)
    readers = {("gpt2", "GPTConfig"): gpt_net_from_hf, ("llama", "GPTConfig"): gpt_net_from_hf,
               ("bert", "BertConfig"): bert_net_from_hf, ("vit", "ViTConfig"): vit_net_from_hf,
               ("marian", "EncoderDecoderConfig"): marian_net_from_hf}  # fmt: skip
    reader = readers.get((config.get("model_type"), net_class.__name__))
    if reader is None:
        return {}
    names = {f.name for f in fields(net_class)}
    try:
        return {k: v for k, v in reader(config).items() if k in names}
    except ConfigError as error:
        raise ConfigError(f"model.init.checkpoint: {path}: {error}") from None
