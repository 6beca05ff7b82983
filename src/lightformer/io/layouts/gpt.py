"""The GPT's Hugging Face layouts: ``GPT2LMHeadModel`` where the shape is GPT-2's (learned positions, LayerNorm, a
pointwise activation, biases), ``LlamaForCausalLM`` where it is Llama's (rotary positions, RMSNorm, SwiGLU; grouped-
query attention, any rotary base, Llama 3's or linear rotary scaling), ``Qwen2ForCausalLM`` where the query, key and
value projections alone have biases, ``MistralForCausalLM`` where attention slides over a window; any other shape is
refused, naming the ``model.net`` fields to change. GPT-2, Llama, Qwen2 and Mistral folders read back
(``GPT_READERS``); what they hold that has no counterpart here is refused by name.

Rotary embeddings: ours rotate the channel pairs (i, i + head_dim/2), as HF Llama's ``rotate_half`` does, so the
query and key weights are copied unpermuted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lightformer.errors import ConfigError
from lightformer.io.hf_layouts import (
    FROM_HF_ACTIVATIONS,
    HF_ACTIVATIONS,
    HFModel,
    config_ids,
    fast_tokenizer,
    hf_layout,
    misfits,
    refuse_shape,
    special_ids,
)
from lightformer.models.gpt import GPTConfig, gpt2_state_dict_to_lightformer
from lightformer.registry import HFReader

if TYPE_CHECKING:
    from transformers import PretrainedConfig

ROPE_BASE = 10000.0  # transformers' default rotary base (``rope_theta``)
ROPE_KINDS = ("default", "linear", "llama3")  # transformers' rope types with a counterpart here (``RopeScaling``)

# What each GPT layout needs of ``model.net``: field → the values that fit.
ROTARY = {"position": ("rope",), "norm": ("rmsnorm",), "activation": ("swiglu",)}  # what the Llama family shares
GPT_LAYOUTS: dict[str, dict[str, tuple]] = {
    "gpt2": {"position": ("learned",), "norm": ("layernorm",), "activation": tuple(HF_ACTIVATIONS), "bias": (True,),
             "n_kv_heads": (None,)},
    "llama": ROTARY | {"qkv_bias": (None,), "sliding_window": (None,)},
    "qwen2": ROTARY | {"bias": (False,), "qkv_bias": (True,), "rope_scaling": (None,), "sliding_window": (None,)},
    "mistral": ROTARY | {"bias": (False,), "qkv_bias": (None,), "rope_scaling": (None,)},
}  # fmt: skip
HF_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
              "mistral": "MistralForCausalLM"}  # fmt: skip


def gpt_layout(config: GPTConfig) -> str:
    """The layout ``config``'s shape fits (``GPT_LAYOUTS``, the first); ``ConfigError`` naming the fields otherwise."""
    for name, needs in GPT_LAYOUTS.items():
        if not misfits(config, needs):
            return name
    refuse_shape("GPT", config, GPT_LAYOUTS, HF_CLASSES)
    raise AssertionError  # refuse_shape raises


def rope_parameters(config: GPTConfig) -> dict[str, Any]:
    """transformers' ``rope_parameters`` of a rotary GPT: its base, and its scaling's fields by their names there."""
    scaling = config.rope_scaling
    if scaling is None:
        return {"rope_type": "default", "rope_theta": config.rope_theta}
    if scaling.kind == "linear":
        return {"rope_type": "linear", "rope_theta": config.rope_theta, "factor": scaling.factor}
    return {"rope_type": "llama3", "rope_theta": config.rope_theta, "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor, "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_positions}  # fmt: skip


def gpt_hf_config(config: GPTConfig, special: dict[str, int]) -> PretrainedConfig:
    """The ``transformers`` config of ``config``'s layout; ``special_ids``: bos/eos/pad token ids."""
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    c, ids = config, {f"{name}_token_id": value for name, value in special.items()}
    layout = gpt_layout(c)
    if layout == "mistral":
        return MistralConfig(
            vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff or 4 * c.d_model,
            num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads or c.n_heads,
            head_dim=c.d_model // c.n_heads, hidden_act="silu", max_position_embeddings=c.block_size,
            rms_norm_eps=c.norm_eps, rope_parameters=rope_parameters(c), sliding_window=c.sliding_window,
            attention_dropout=c.attention_dropout, tie_word_embeddings=c.tie_weights,
            architectures=["MistralForCausalLM"], **ids,
        )  # fmt: skip
    if layout == "qwen2":
        return Qwen2Config(
            vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff or 4 * c.d_model,
            num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads or c.n_heads,
            hidden_act="silu", max_position_embeddings=c.block_size, rms_norm_eps=c.norm_eps,
            rope_parameters=rope_parameters(c), use_sliding_window=False, attention_dropout=c.attention_dropout,
            tie_word_embeddings=c.tie_weights, architectures=["Qwen2ForCausalLM"], **ids,
        )  # fmt: skip
    if layout == "gpt2":
        return GPT2Config(
            vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.d_model, n_layer=c.n_layers,
            n_head=c.n_heads, n_inner=c.d_ff, activation_function=HF_ACTIVATIONS[c.activation],
            resid_pdrop=c.dropout, embd_pdrop=c.dropout, attn_pdrop=c.attention_dropout, layer_norm_epsilon=c.norm_eps,
            tie_word_embeddings=c.tie_weights, architectures=["GPT2LMHeadModel"], **ids,
        )  # fmt: skip
    return LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff or 4 * c.d_model,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads or c.n_heads,
        head_dim=c.d_model // c.n_heads, hidden_act="silu", max_position_embeddings=c.block_size,
        rms_norm_eps=c.norm_eps, rope_parameters=rope_parameters(c),
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
            if module == "self_attn.qkv":  # rows [W^Q; W^K; W^V], the key and value rows n_kv_heads' worth each
                kv = (config.n_kv_heads or config.n_heads) * (config.d_model // config.n_heads)
                for part, tensor in zip("qkv", value.split([config.d_model, kv, kv]), strict=True):
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
    rope_kind = rope.get("rope_type", rope.get("type", "default"))
    kv_heads = config.get("num_key_value_heads") or heads
    problems = []
    if heads % kv_heads:
        problems.append(f"num_key_value_heads={kv_heads} (it must divide num_attention_heads={heads})")
    if config.get("head_dim", d_model // heads) != d_model // heads:
        problems.append(f"head_dim={config['head_dim']} (lightformer's is hidden_size/num_attention_heads)")
    if rope_kind not in ROPE_KINDS:
        problems.append(f"rope_type={rope_kind!r} (lightformer scales rotary positions as {', '.join(ROPE_KINDS)})")
    if config.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={config['hidden_act']!r} (lightformer's SwiGLU gates with silu)")
    if kind == "qwen2":  # its query, key and value projections have biases, no other layer has
        bias, qkv_bias = False, True
    else:
        bias, qkv_bias = bool(config.get("attention_bias", False)), None
        if bias != bool(config.get("mlp_bias", False)):
            problems.append("attention_bias != mlp_bias (lightformer's model.net.bias is one switch)")
    positions = config.get("max_position_embeddings", 2048)
    window = config.get("sliding_window") if kind == "mistral" else None  # at or past the positions: no window
    window = window if window is not None and window < positions else None
    if kind == "qwen2" and config.get("use_sliding_window"):
        problems.append("use_sliding_window=true (Qwen2 windows its upper layers alone; lightformer windows all or "
                        "none)")  # fmt: skip
    if problems:
        raise ConfigError(f"this {kind} folder has no lightformer counterpart: {'; '.join(problems)}")
    scaling = None
    if rope_kind == "linear":
        scaling = {"kind": "linear", "factor": rope["factor"]}
    elif rope_kind == "llama3":
        scaling = {"kind": "llama3", "factor": rope["factor"], "low_freq_factor": rope["low_freq_factor"],
                   "high_freq_factor": rope["high_freq_factor"],
                   "original_max_positions": rope["original_max_position_embeddings"]}  # fmt: skip
    return dict(vocab_size=config["vocab_size"], block_size=positions, n_layers=config["num_hidden_layers"],
                n_heads=heads, n_kv_heads=kv_heads if kv_heads != heads else None, d_model=d_model,
                d_ff=config["intermediate_size"], position="rope", activation="swiglu", norm="rmsnorm",
                norm_eps=config.get("rms_norm_eps", 1e-6), bias=bias, qkv_bias=qkv_bias, tie_weights=tie,
                rope_theta=float(theta), rope_scaling=scaling, sliding_window=window)  # fmt: skip


def language_model(task: Any) -> HFModel:
    """A language model's ``GPT2LMHeadModel``, ``LlamaForCausalLM`` or ``Qwen2ForCausalLM``, with ``generate``'s
    defaults."""
    import transformers
    from transformers import GenerationConfig

    config = gpt_hf_config(task.model.config, special_ids(task.tokenizer))
    model = getattr(transformers, HF_CLASSES[config.model_type])(config)
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
    weights = gpt_to_hf(task.model.state_dict(), task.model.config)
    return HFModel(model, weights, usage, tokenizer=fast_tokenizer(task.tokenizer))


LLAMA_READER = HFReader(GPTConfig, gpt_net_from_hf, lambda weights, config: llama_state_dict_to_lightformer(weights))
GPT_READERS = {
    "gpt2": HFReader(GPTConfig, gpt_net_from_hf, lambda weights, config: gpt2_state_dict_to_lightformer(weights)),
    "llama": LLAMA_READER,
    "qwen2": LLAMA_READER,  # Llama's parameter names, with biases on q, k and v
    "mistral": LLAMA_READER,  # Llama's, with a sliding window
}
HF = hf_layout(language_model, "language models (GPT-2, Llama, Qwen2, Mistral)", GPT_READERS)
