"""GPT: a decoder-only transformer language model assembled from the shared blocks."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lightformer.nn import (
    Activation,
    Decoder,
    DecoderCache,
    DecoderLayer,
    NormKind,
    PositionKind,
    RotaryEmbedding,
    TokenEmbedding,
    absolute_position,
    make_norm,
)
from lightformer.nn.checks import check_heads


class GPT(nn.Module):
    """Token embedding + positions → pre-norm causal decoder stack (no cross-attention) → final norm → LM head.

    The LM head shares its weight with the token embedding when ``tie_weights``. Initialisation follows
    GPT-2: N(0, 0.02) everywhere, and N(0, 0.02/√(2·n_layers)) for the projections that write into the
    residual stream.
    """

    def __init__(
        self,
        vocab_size: int,
        block_size: int = 256,
        n_layers: int = 6,
        n_heads: int = 6,
        d_model: int = 384,
        d_ff: int | None = None,
        dropout: float = 0.0,
        position: PositionKind = "learned",
        activation: Activation = "gelu",
        norm: NormKind = "layernorm",
        norm_eps: float = 1e-5,
        bias: bool = True,
        tie_weights: bool = True,
    ) -> None:
        super().__init__()
        check_heads(d_model, n_heads)  # before the rotary table, whose head_dim assumes it
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.embed = TokenEmbedding(vocab_size, d_model)
        self.position = absolute_position(position, d_model, block_size)
        rotary = RotaryEmbedding(d_model // n_heads, block_size) if position == "rope" else None
        self.dropout = nn.Dropout(dropout)
        layers = [
            DecoderLayer(
                d_model,
                n_heads,
                d_ff,
                dropout=dropout,
                attn_dropout=dropout,
                activation=activation,
                norm=norm,
                norm_first=True,
                norm_eps=norm_eps,
                bias=bias,
                rotary=rotary,
                cross_attention=False,
            )
            for _ in range(n_layers)
        ]
        self.decoder = Decoder(layers, make_norm(norm, d_model, norm_eps, bias))
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_weights:
            self.lm_head.weight = self.embed.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith(("self_attn.proj.weight", "ffn.fc2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def new_cache(self, max_length: int | None = None) -> DecoderCache:
        """An empty KV cache for incremental decoding of up to ``max_length`` (default block_size) positions."""
        return self.decoder.new_cache(max_length or self.block_size)

    def forward(self, ids: Tensor, cache: DecoderCache | None = None) -> Tensor:
        """Token ids ``(batch, seq)`` → next-token logits ``(batch, seq, vocab_size)``.

        With ``cache``, ``ids`` continue the sequence already in the cache.
        """
        offset = cache.length if cache is not None else 0
        if offset + ids.shape[1] > self.block_size:
            raise ValueError(
                f"sequence of {offset + ids.shape[1]} tokens is longer than block_size={self.block_size}; "
                f"crop the input to the last {self.block_size} tokens"
            )
        x = self.embed(ids)
        if self.position is not None:
            x = self.position(x, offset)
        x = self.decoder(self.dropout(x), cache=cache)
        return self.lm_head(x)

    def num_parameters(self, exclude_embeddings: bool = True) -> int:
        """Parameter count; by default without position and (untied) token embeddings, as nanoGPT reports."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings and isinstance(self.position, nn.Module):
            n -= sum(p.numel() for p in self.position.parameters())
        return n


def gpt2_state_dict_to_lightformer(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Map a Hugging Face ``GPT2LMHeadModel`` state dict to our ``GPT`` layout.

    HF stores its projections as ``Conv1D`` with ``(in, out)`` weights, so they are transposed. Build the
    ``GPT`` with ``activation="gelu_tanh"``, ``position="learned"`` and ``norm_eps`` = HF's layer_norm_epsilon.
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
