"""Architectures assembled from ``lightformer.nn``: plain PyTorch, usable in any training loop.

Each model is built from one config dataclass (``GPT(GPTConfig(...))``) that declares its shape and defaults.
"""

from lightformer.models.gpt import GPT, GPTConfig, gpt2_state_dict_to_lightformer, load_gpt2_weights
from lightformer.models.seq2seq import EncoderDecoder, EncoderDecoderConfig
from lightformer.models.vit import (
    VisionTransformer,
    ViTConfig,
    lightformer_to_timm,
    load_timm_weights,
    timm_to_lightformer,
)
from lightformer.models.vlm import VisionLanguageConfig, VisionLanguageModel

__all__ = [
    "GPT",
    "EncoderDecoder",
    "EncoderDecoderConfig",
    "GPTConfig",
    "ViTConfig",
    "VisionLanguageConfig",
    "VisionLanguageModel",
    "VisionTransformer",
    "gpt2_state_dict_to_lightformer",
    "lightformer_to_timm",
    "load_gpt2_weights",
    "load_timm_weights",
    "timm_to_lightformer",
]
