"""Transformer building blocks in plain PyTorch, shared by the GPT, the translator and the ViT.

Masks are boolean and True means "may attend" / "real token" everywhere (see ``attention``).
"""

from lightformer.nn.attention import (
    AttentionKernel,
    KVCache,
    MultiHeadAttention,
    attention_kernel,
    causal_mask,
    explicit_attention,
    record_attention,
)
from lightformer.nn.config import LayerConfig
from lightformer.nn.dropout import Dropout, TokenDropout, dropout
from lightformer.nn.embedding import PatchEmbedding, TokenEmbedding
from lightformer.nn.feedforward import Activation, FeedForward, PointwiseActivation, pointwise_activation
from lightformer.nn.layers import Decoder, DecoderCache, DecoderLayer, Encoder, EncoderLayer
from lightformer.nn.norm import NormKind, make_norm
from lightformer.nn.position import (
    LearnedPositionalEmbedding,
    PositionKind,
    RopeScaling,
    RotaryEmbedding,
    SinusoidalPositionalEmbedding,
    absolute_position,
    sinusoidal_table,
)

__all__ = [
    "Activation",
    "AttentionKernel",
    "Decoder",
    "DecoderCache",
    "DecoderLayer",
    "Dropout",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "KVCache",
    "LayerConfig",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "NormKind",
    "PatchEmbedding",
    "PointwiseActivation",
    "PositionKind",
    "RopeScaling",
    "RotaryEmbedding",
    "SinusoidalPositionalEmbedding",
    "TokenDropout",
    "TokenEmbedding",
    "absolute_position",
    "attention_kernel",
    "causal_mask",
    "dropout",
    "explicit_attention",
    "make_norm",
    "pointwise_activation",
    "record_attention",
    "sinusoidal_table",
]
