"""The translator's Hugging Face layout: ``MarianMTModel`` (post-norm, sinusoidal positions, one embedding shared and
tied); Marian folders read back (``MARIAN_READERS``). The tokenizer frames a source as the data does: A [EOS].

Sinusoidal positions: Marian's table holds the sines, then the cosines, ours interleaves them, so a translator's
residual channels are permuted on the way (``marian_to_hf``).
"""

from __future__ import annotations

from typing import Any

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
from lightformer.models.seq2seq import EncoderDecoderConfig
from lightformer.registry import HFReader

HF_CLASSES = {"marian": "MarianMTModel"}

MARIAN_LAYOUTS = {"marian": {"position": ("sinusoidal",), "norm": ("layernorm",), "norm_first": (False,),
                             "activation": tuple(HF_ACTIVATIONS), "share_embeddings": (True,), "tie_weights": (True,),
                             "norm_eps": (1e-5,)}}  # fmt: skip
_MARIAN_LAYER = {"self_attn.proj": "self_attn.out_proj", "norm1": "self_attn_layer_norm",
                 "cross_attn.proj": "encoder_attn.out_proj", "norm_cross": "encoder_attn_layer_norm",
                 "ffn.fc1": "fc1", "ffn.fc2": "fc2", "norm2": "final_layer_norm"}  # fmt: skip


def marian_hf_config(config: Any, special: dict[str, int]) -> Any:
    """The ``transformers.MarianConfig`` of our ``EncoderDecoderConfig``: post-norm, sinusoidal positions, one
    embedding shared by the source, the target and the output layer (Marian's LayerNorm epsilon is fixed, 1e-5)."""
    from transformers import MarianConfig

    c = config
    if misfits(c, MARIAN_LAYOUTS["marian"]):
        refuse_shape("translator", c, MARIAN_LAYOUTS, HF_CLASSES)
    return MarianConfig(
        vocab_size=c.src_vocab_size, decoder_vocab_size=c.tgt_vocab_size, d_model=c.d_model,
        encoder_layers=c.n_encoder_layers, decoder_layers=c.n_decoder_layers, encoder_attention_heads=c.n_heads,
        decoder_attention_heads=c.n_heads, encoder_ffn_dim=c.d_ff or 4 * c.d_model,
        decoder_ffn_dim=c.d_ff or 4 * c.d_model, activation_function=HF_ACTIVATIONS[c.activation],
        dropout=c.dropout, attention_dropout=c.attention_dropout, activation_dropout=0.0,
        max_position_embeddings=c.max_len,
        scale_embedding=True, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        pad_token_id=c.pad_id, bos_token_id=special["bos"], eos_token_id=special["eos"],
        decoder_start_token_id=special["bos"], forced_eos_token_id=None,
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


def source_frame(raw: Any, tokenizer: Any) -> dict[str, Any]:
    """A source as the data frames it, A [EOS] (``fast_tokenizer``'s ``frame``)."""
    from tokenizers import processors

    from lightformer.tokenization.text import EOS

    raw.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, tokenizer.eos_id)])
    return {}


def translator(task: Any) -> HFModel:
    """A translator's ``MarianMTModel``, with ``translate``'s beam search as its generation config; one joint
    tokenizer only."""
    from transformers import GenerationConfig, MarianMTModel

    facts = task.data_facts
    if facts is not None and facts.src_tokenizer != facts.tgt_tokenizer:
        raise ConfigError("--layout hf: MarianMTModel's folder holds one tokenizer, but this translator's source "
                          "and target tokenizers differ (train it with the data's joint vocabulary)")  # fmt: skip
    c, hp = task.model.config, task.hparams
    config = marian_hf_config(c, special_ids(task.tgt_tokenizer))
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
    return HFModel(model, weights, usage, tokenizer=fast_tokenizer(task.src_tokenizer, source_frame))


MARIAN_READERS = {"marian": HFReader(EncoderDecoderConfig, marian_net_from_hf, _import_marian)}
HF = hf_layout(translator, "translation (Marian)", MARIAN_READERS)
