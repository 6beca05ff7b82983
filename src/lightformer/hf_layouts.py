"""Hugging Face layouts: a lightformer model written as a ``transformers`` model folder (``config.json``,
``model.safetensors``, the tokenizer, a model card) that ``AutoModel*.from_pretrained`` loads, and such a folder read
back under lightformer's names (``model.init.checkpoint=DIR``).

Each layout is a config mapping and a weight renaming, both directions:

- GPT → ``GPT2LMHeadModel`` where the shape is GPT-2's (learned positions, LayerNorm, a pointwise activation,
  biases), ``LlamaForCausalLM`` where it is Llama's (rotary positions, RMSNorm, SwiGLU); any other shape is refused,
  naming the ``model.net`` fields to change.
- BERT pre-training (masked LM + NSP) → ``BertForPreTraining``; the text classifier → ``BertForSequenceClassification``.
- ViT → ``ViTForImageClassification`` (class token, learned positions, LayerNorm, GELU).

Activations: our "gelu" is the exact (erf) GELU, HF's "gelu"; our "gelu_tanh" is HF's "gelu_new". Rotary embeddings:
ours rotate the channel pairs (i, i + head_dim/2) with base 10000, as HF Llama's ``rotate_half`` does, so the query and
key weights are copied unpermuted.
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
HF_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}


def _fits(config: Any, needs: dict[str, tuple]) -> list[str]:
    """The fields of ``config`` whose values ``needs`` does not allow, as "field=value"."""
    return [f"{name}={getattr(config, name)!r}" for name, ok in needs.items() if getattr(config, name) not in ok]


def _describe(needs: dict[str, tuple]) -> str:
    return ", ".join(f"{name}={'|'.join(str(v).lower() if isinstance(v, bool) else v for v in ok)}"
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
            resid_pdrop=c.dropout, embd_pdrop=c.dropout, attn_pdrop=c.dropout, layer_norm_epsilon=c.norm_eps,
            tie_word_embeddings=c.tie_weights, architectures=["GPT2LMHeadModel"], **ids,
        )  # fmt: skip
    return LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff or 4 * c.d_model,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, num_key_value_heads=c.n_heads,
        head_dim=c.d_model // c.n_heads, hidden_act="silu", max_position_embeddings=c.block_size,
        rms_norm_eps=c.norm_eps, rope_parameters={"rope_type": "default", "rope_theta": ROPE_BASE},
        attention_bias=c.bias, mlp_bias=c.bias, attention_dropout=c.dropout, tie_word_embeddings=c.tie_weights,
        architectures=["LlamaForCausalLM"], **ids,
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


# --- export ------------------------------------------------------------------------------------------------


def _special_ids(tokenizer: Any) -> dict[str, int]:
    return {"bos": tokenizer.bos_id, "eos": tokenizer.eos_id, "pad": tokenizer.pad_id}


def _language_model(task: Task) -> tuple[PreTrainedModel, dict[str, Any]]:
    from transformers import GenerationConfig, GPT2LMHeadModel, LlamaForCausalLM

    config = gpt_hf_config(task.model.config, _special_ids(task.tokenizer))
    model = (GPT2LMHeadModel if config.model_type == "gpt2" else LlamaForCausalLM)(config)
    model.generation_config = GenerationConfig(  # `lightformer generate`'s defaults
        do_sample=True, temperature=0.8, top_k=200, **config_ids(config)
    )
    usage = (
        "from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline\n\n"
        'model = AutoModelForCausalLM.from_pretrained("DIR")\n'
        'tokenizer = AutoTokenizer.from_pretrained("DIR")\n'
        'print(pipeline("text-generation", model="DIR")("It is a truth", max_new_tokens=40)[0]["generated_text"])'
    )
    return model, {"weights": gpt_to_hf(task.model.state_dict(), task.model.config), "usage": usage}


def config_ids(config: PretrainedConfig) -> dict[str, int]:
    return {k: getattr(config, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}


# The tasks that have a Hugging Face layout, by class name → the function that builds the HF model and its weights.
EXPORTERS = {"LanguageModelTask": _language_model}


def hf_tokenizer(task: Task) -> Any:
    """The task's tokenizer as a ``PreTrainedTokenizerFast`` with its special tokens named; None without one."""
    from tokenizers import Tokenizer as RawTokenizer
    from transformers import PreTrainedTokenizerFast

    from lightformer.data.preparation.tokenizers import BOS, EOS, MASK, PAD, UNK

    tokenizer = getattr(task, "tokenizer", None)
    if tokenizer is None:
        return None
    raw = RawTokenizer.from_str(tokenizer.to_str())
    roles = dict(bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK)
    if type(task).__name__ != "LanguageModelTask":  # BERT's [CLS] and [SEP] are BOS and EOS
        roles |= dict(cls_token=BOS, sep_token=EOS)
        if raw.token_to_id(MASK) is not None:
            roles["mask_token"] = MASK
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
        (staging / "README.md").write_text(model_card(task, ckpt_path, checkpoint, model, extra["usage"], folder))
        if folder.is_dir():
            folder.rmdir()  # empty: checked above
        staging.replace(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return f"wrote {folder}/ ({type(model).__name__}, {model.num_parameters():,} parameters, from a {name})"


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


def model_card(task: Task, ckpt_path: str, checkpoint: dict, model: PreTrainedModel, usage: str, folder: Path) -> str:
    """README.md of an exported folder: what was trained, how, its final metrics, and how to load it."""
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
    config = run_config(ckpt_path)
    command = (f"python -m lightformer fit --config {config}" if config else
               "python -m lightformer fit --config <the run's config.yaml>")  # fmt: skip
    lines = [
        "---", "library_name: transformers", "tags: [lightformer]", "---", "",
        f"# {folder.name}", "",
        f"A lightformer `{type(task).__name__}` exported as `{type(model).__name__}` by lightformer {__version__}:",
        f"`lightformer export --ckpt_path {ckpt_path} --layout hf --output {folder}`.", "",
        "## Training", "",
        f"- task: `{hparams and type(task).__module__}.{type(task).__name__}`",
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
    """The weights of a Hugging Face model folder (GPT-2, Llama, BERT, ViT) under lightformer's names."""
    config = read_hf_config(path)
    kind = config.get("model_type")
    importers = {"gpt2": _import_gpt2, "llama": _import_llama}
    if kind not in importers:
        raise ConfigError(f"{option}: {path} holds a Hugging Face {kind!r} model; lightformer reads "
                              f"{', '.join(importers)} folders")  # fmt: skip
    try:
        if kind in ("gpt2", "llama"):
            gpt_net_from_hf(config)  # refuse a shape lightformer cannot build, by name
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
    readers = {("gpt2", "GPTConfig"): gpt_net_from_hf, ("llama", "GPTConfig"): gpt_net_from_hf}
    reader = readers.get((config.get("model_type"), net_class.__name__))
    if reader is None:
        return {}
    names = {f.name for f in fields(net_class)}
    try:
        return {k: v for k, v in reader(config).items() if k in names}
    except ConfigError as error:
        raise ConfigError(f"model.init.checkpoint: {path}: {error}") from None
