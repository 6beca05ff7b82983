"""The fields of an encoder or decoder layer, declared once: every model config extends ``LayerConfig``.

A model config declares no layer field of its own. It takes the fields whole, with its own defaults
(``LayerConfig.with_defaults``), so its YAML stays flat (``model.net.d_model``), and refuses in its ``__post_init__``
the values its model cannot build (its ``supported`` values). Its model builds each layer from ``layer_args()``.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, get_args

from lightformer.nn.checks import check_at_least, check_choice, check_fraction, check_heads, check_kv_heads
from lightformer.nn.feedforward import Activation
from lightformer.nn.norm import NormKind


@dataclass(frozen=True)
class LayerConfig:
    """The shape of the encoder and decoder layers (``nn.EncoderLayer``, ``nn.DecoderLayer``) of a model.

    Args:
        d_model: width of the residual stream.
        n_heads: attention heads; must divide d_model (each head gets d_model / n_heads dimensions).
        d_ff: hidden width of the feed-forward networks; None: 4·d_model (SwiGLU: the same width per branch).
        dropout: dropout on each sublayer's output (and, by the model, on its embeddings).
        attn_dropout: dropout on the attention weights; None: the rate of ``dropout``.
        activation: feed-forward activation (``nn.Activation``).
        norm: the norm layers (``nn.NormKind``).
        norm_first: pre-norm (x + f(norm(x)), the stack ends with a final norm); False: the paper's post-norm
            (norm(x + f(x))).
        norm_eps: epsilon of every norm.
        bias: biases in every linear layer and norm of the layers.
        qkv_bias: biases in the attention's query, key and value projections; None: ``bias``.
        n_kv_heads: key/value heads of self-attention, dividing n_heads (grouped-query attention; 1: multi-query);
            None: n_heads.
        sliding_window: causal self-attention sees only this many positions up to its own (Mistral); None: all.
    """

    d_model: int
    n_heads: int
    d_ff: int | None = None
    dropout: float = 0.1
    attn_dropout: float | None = 0.0
    activation: Activation = "relu"
    norm: NormKind = "layernorm"
    norm_first: bool = True
    norm_eps: float = 1e-5
    bias: bool = True
    qkv_bias: bool | None = None
    n_kv_heads: int | None = None
    sliding_window: int | None = None
    # The values of the fields a model can build where they are fewer than a layer's (a BERT's norm is a LayerNorm):
    # any other is refused, naming the field, the model and the valid values.
    supported: ClassVar[Mapping[str, tuple[Any, ...]]] = {}

    def __post_init__(self) -> None:
        check_heads(self.d_model, self.n_heads)
        check_kv_heads(self.n_heads, self.n_kv_heads)
        check_at_least("sliding_window", self.sliding_window, 1)
        check_at_least("d_ff", self.d_ff, 1)
        check_fraction("dropout", self.dropout)
        if self.attn_dropout is not None:
            check_fraction("attn_dropout", self.attn_dropout)
        check_choice("activation", self.activation, get_args(Activation))
        check_choice("norm", self.norm, get_args(NormKind))
        for name, values in self.supported.items():  # what this model's layers can build of what a layer can
            if getattr(self, name) not in values:
                valid = ", ".join(map(repr, values))
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is not valid for {type(self).__name__}; valid: {valid}"
                )

    @classmethod
    def with_defaults(cls, **defaults: Any) -> type[LayerConfig]:
        """``LayerConfig`` with other defaults, for a model config to extend
        (``class GPTConfig(LayerConfig.with_defaults(dropout=0.0, ...))``): a model's own defaults of the layer's
        fields, declared without declaring the fields again."""
        hints = {f.name: typing.get_type_hints(LayerConfig)[f.name] for f in fields(LayerConfig)}
        unknown = sorted(set(defaults) - set(hints))
        if unknown:
            raise TypeError(f"{unknown} are not fields of LayerConfig")
        own = [(name, hints[name], dataclasses.field(default=value)) for name, value in defaults.items()]
        name = f"LayerConfig({', '.join(f'{k}={v!r}' for k, v in defaults.items())})"
        defaulted = dataclasses.make_dataclass(name, own, bases=(cls,), frozen=True)
        defaulted.__module__ = __name__
        return defaulted

    @property
    def attention_dropout(self) -> float:
        """The dropout rate on the attention weights: ``attn_dropout``, or where it is None ``dropout``."""
        return self.dropout if self.attn_dropout is None else self.attn_dropout

    def layer_args(self) -> dict[str, Any]:
        """The arguments of an ``EncoderLayer`` or ``DecoderLayer`` that this config decides: every field of
        ``LayerConfig`` (``attn_dropout`` as ``attention_dropout``)."""
        args = {f.name: getattr(self, f.name) for f in fields(LayerConfig)}
        return args | {"attn_dropout": self.attention_dropout}
