"""GPT: a decoder-only transformer language model assembled from the shared blocks."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, get_args

import torch
from torch import Tensor, nn

from lightformer.nn import (
    Decoder,
    DecoderCache,
    DecoderLayer,
    Dropout,
    Encoder,
    EncoderLayer,
    LayerConfig,
    PositionKind,
    RopeScaling,
    RotaryEmbedding,
    TokenEmbedding,
    absolute_position,
    causal_mask,
    make_norm,
)
from lightformer.nn.checks import check_at_least, check_choice, check_set


@dataclass(frozen=True)
class GPTConfig(LayerConfig.with_defaults(d_model=384, n_heads=6, dropout=0.0, attn_dropout=None, activation="gelu")):
    """The shape of a GPT: every hyperparameter and its default, declared once.

    The layer's fields are ``nn.LayerConfig``'s (``d_model``, ``n_heads``, ``d_ff``, ``dropout``, ``attn_dropout``,
    ``activation``, ``norm``, ``norm_eps``, ``bias``), with GPT's defaults: width 384, 6 heads, no dropout (on the
    attention weights too: ``attn_dropout`` None takes ``dropout``'s rate), GELU. A GPT is pre-norm
    (``norm_first`` true); ``qkv_bias`` true with ``bias`` false is Qwen2's; GPT-2's activation is "gelu_tanh".

    Args:
        vocab_size: token ids 0..vocab_size-1 (a task fills it from the data's tokenizer).
        block_size: the longest sequence, the size of the position table (a task fills it from the data's block_size).
        n_layers: decoder layers.
        position: how positions are given (``nn.PositionKind``): "learned" absolute positions (GPT-2), "rope"
            rotary embeddings in every attention layer, fixed "sinusoidal" ones, or "none".
        tie_weights: the output layer shares the token embedding's weight.
        rope_theta: the rotary base (position "rope"): 10000 in the RoPE paper and Llama 2, 500000 in Llama 3.
        rope_scaling: how the rotary frequencies stretch past the trained positions (``nn.RopeScaling``); None: not.
    """

    vocab_size: int | None = None
    block_size: int = 256
    n_layers: int = 6
    position: PositionKind = "learned"
    tie_weights: bool = True
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    supported: ClassVar[Mapping[str, tuple]] = {"norm_first": (True,)}

    def __post_init__(self) -> None:
        super().__post_init__()
        check_at_least("vocab_size", self.vocab_size, 1)
        check_at_least("block_size", self.block_size, 1)
        check_at_least("n_layers", self.n_layers, 1)
        check_choice("position", self.position, get_args(PositionKind))
        if isinstance(self.rope_scaling, Mapping):  # a checkpoint's saved config, or a config file's
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        if self.position != "rope" and (self.rope_theta != 10000.0 or self.rope_scaling is not None):
            raise ValueError(f"rope_theta and rope_scaling are for rotary positions; position={self.position!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta={self.rope_theta} must be above 0")


class GPT(nn.Module):
    """Token embedding + positions → pre-norm causal decoder stack → final norm → LM head.

    With ``cross_attention``, every block also attends to an encoder's output (``memory``) after its self-attention:
    the text decoder of an image-to-text model (TrOCR, ``models.vision_text``). A GPT checkpoint's weights load into
    such a decoder by their names; the cross-attention starts fresh.

    With ``causal=False`` every token attends to every other (``features``' ``key_mask`` hides the padding): the
    bidirectional text tower of a contrastive model that pools all its tokens (``models.contrastive``). Its blocks are
    encoder layers of the same names in the same stack (``decoder``), so a GPT's weights load into it by their names;
    it neither decodes incrementally nor cross-attends, and its LM head is no language model.

    The LM head shares its weight with the token embedding when ``tie_weights``. Initialisation follows
    GPT-2: N(0, 0.02) everywhere, and N(0, 0.02/√(2·n_layers)) for the projections that write into the
    residual stream.
    """

    layer_stacks = ("decoder",)  # its units' stacks: lightformer.training.distributed

    def __init__(self, config: GPTConfig, cross_attention: bool = False, causal: bool = True) -> None:
        super().__init__()
        check_set(config, "vocab_size")
        if cross_attention and not causal:
            raise ValueError("a GPT with cross_attention decodes causally: build it with causal=True")
        if config.sliding_window is not None and not causal:
            raise ValueError(
                f"sliding_window={config.sliding_window} is for causal attention; this GPT attends both ways"
            )
        self.config = config
        c = config
        self.vocab_size = c.vocab_size
        self.block_size = c.block_size
        self.causal = causal
        self.embed = TokenEmbedding(c.vocab_size, c.d_model)
        self.position = absolute_position(c.position, c.d_model, c.block_size)
        rotary = None
        if c.position == "rope":
            rotary = RotaryEmbedding(c.d_model // c.n_heads, c.block_size, c.rope_theta, c.rope_scaling)
        self.dropout = Dropout(c.dropout)
        final_norm = make_norm(c.norm, c.d_model, c.norm_eps, c.bias)
        if causal:
            layers = [
                DecoderLayer(**c.layer_args(), rotary=rotary, cross_attention=cross_attention)
                for _ in range(c.n_layers)
            ]
            self.decoder: Decoder | Encoder = Decoder(layers, final_norm)
        else:  # the same names as a causal GPT's blocks: decoder.layers.{i}.norm1, self_attn, norm2, ffn
            self.decoder = Encoder(
                [EncoderLayer(**c.layer_args(), rotary=rotary) for _ in range(c.n_layers)], final_norm
            )
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_weights:
            self.lm_head.weight = self.embed.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "ffn.fc2.weight")):  # self_attn, cross_attn
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def new_cache(self, max_length: int | None = None) -> DecoderCache:
        """An empty KV cache for incremental decoding of up to ``max_length`` (default block_size) positions."""
        if not self.causal:
            raise ValueError("a bidirectional GPT (causal=False) reads whole texts: it has no cache to decode with")
        return self.decoder.new_cache(max_length or self.block_size)

    def forward(
        self,
        ids: Tensor | None = None,
        cache: DecoderCache | None = None,
        memory: Tensor | None = None,
        memory_key_mask: Tensor | None = None,
        *,
        embeddings: Tensor | None = None,
        bidirectional: Tensor | None = None,
    ) -> Tensor:
        """Token ids ``(batch, seq)`` → next-token logits ``(batch, seq, vocab_size)``.

        With ``cache``, ``ids`` continue the sequence already in the cache. With ``cross_attention``, ``memory``
        ``(batch, memory_len, d_model)`` is the encoder's output, ``memory_key_mask`` ``(batch, memory_len)`` True at
        its real positions (None: all). ``embeddings`` and ``bidirectional``: as ``features``'.
        """
        features = self.features(
            ids, cache, memory, memory_key_mask, embeddings=embeddings, bidirectional=bidirectional
        )
        return self.lm_head(features)

    def features(
        self,
        ids: Tensor | None = None,
        cache: DecoderCache | None = None,
        memory: Tensor | None = None,
        memory_key_mask: Tensor | None = None,
        key_mask: Tensor | None = None,
        *,
        embeddings: Tensor | None = None,
        bidirectional: Tensor | None = None,
    ) -> Tensor:
        """Token ids ``(batch, seq)`` → the last block's outputs after the final norm ``(batch, seq, d_model)``: what
        the LM head reads (``forward``'s arguments), and what a contrastive text tower pools; ``key_mask``
        ``(batch, seq)``, True at real tokens, hides the others from attention (a bidirectional GPT's padding).

        ``embeddings`` ``(batch, seq, d_model)`` stand in for the token embeddings of ``ids`` (a vision-language
        model's text with an image's tokens in it; positions are added as to ids). ``bidirectional`` ``(batch, seq)``,
        True on one span of positions per row, lets those positions attend to each other both ways (the image prefix,
        PaliGemma's) while every other stays causal; only on a call that starts the sequence (empty cache)."""
        if (ids is None) == (embeddings is None):
            raise ValueError("give the GPT either token ids or input embeddings, not both or neither")
        offset = cache.length if cache is not None else 0
        length = (ids if ids is not None else embeddings).shape[1]
        if offset + length > self.block_size:
            raise ValueError(
                f"sequence of {offset + length} tokens is longer than block_size={self.block_size}; "
                f"crop the input to the last {self.block_size} tokens"
            )
        x = self.embed(ids) if ids is not None else embeddings
        if self.position is not None:
            x = self.position(x, offset)
        if not self.causal:
            return self.decoder(self.dropout(x), key_mask=key_mask)
        attn_mask = None
        if bidirectional is not None:
            if offset:
                raise ValueError("a bidirectional span is given on the call that starts a sequence (empty cache)")
            both_ways = bidirectional[:, :, None] & bidirectional[:, None, :]
            attn_mask = (causal_mask(length, length, x.device) | both_ways)[:, None]
        return self.decoder(
            self.dropout(x),
            memory,
            key_mask=key_mask,
            memory_key_mask=memory_key_mask,
            cache=cache,
            attn_mask=attn_mask,
        )


def gpt2_state_dict_to_lightformer(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Map a Hugging Face ``GPT2LMHeadModel`` state dict to our ``GPT`` layout.

    HF stores its projections as ``Conv1D`` with ``(in, out)`` weights, so they are transposed. Build the
    ``GPT`` with ``GPTConfig(activation="gelu_tanh", position="learned", norm_eps=<HF's layer_norm_epsilon>)``.
    """
    sd = {k.removeprefix("transformer."): v for k, v in state_dict.items()}
    out = {"embed.weight": sd["wte.weight"], "position.weight": sd["wpe.weight"]}
    n_layers = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("h."))
    names = {
        "ln_1": "norm1",
        "attn.c_attn": "self_attn.qkv",
        "attn.c_proj": "self_attn.proj",
        "ln_2": "norm2",
        "mlp.c_fc": "ffn.fc1",
        "mlp.c_proj": "ffn.fc2",
    }
    for i in range(n_layers):
        for hf, ours in names.items():
            w, b = sd[f"h.{i}.{hf}.weight"], sd[f"h.{i}.{hf}.bias"]
            out[f"decoder.layers.{i}.{ours}.weight"] = w if hf.startswith("ln") else w.t().contiguous()
            out[f"decoder.layers.{i}.{ours}.bias"] = b
    out["decoder.norm.weight"], out["decoder.norm.bias"] = sd["ln_f.weight"], sd["ln_f.bias"]
    out["lm_head.weight"] = sd.get("lm_head.weight", sd["wte.weight"])
    return out


@torch.no_grad()
def load_gpt2_weights(model: GPT, state_dict: dict[str, Tensor]) -> GPT:
    """Load a Hugging Face GPT-2 state dict (e.g. ``safetensors.torch.load_file``) into ``model``, strictly."""
    model.load_state_dict(gpt2_state_dict_to_lightformer(state_dict), strict=True)
    return model


@torch.no_grad()
def extend_positions(model: nn.Module, weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """``weights`` (to be loaded into ``model``) with the learned position table of each GPT of ``model`` that holds
    more positions than the table given extended: the given rows first, the model's own fresh rows after them, as a
    language model of 64 positions starts the text tower of a vision-language model of 128."""
    weights = dict(weights)
    for path, module in model.named_modules():
        name = f"{path}.position.weight" if path else "position.weight"
        if not isinstance(module, GPT) or module.config.position != "learned" or name not in weights:
            continue
        table, own = weights[name], module.position.weight
        if table.ndim == 2 and table.shape[1] == own.shape[1] and len(table) < len(own):
            fresh = own[len(table) :].detach()  # (a model on the meta device, checked before it is built: its shape)
            fresh = torch.zeros(fresh.shape, dtype=table.dtype) if fresh.is_meta else fresh.to(table.dtype)
            weights[name] = torch.cat([table, fresh])
    return weights
