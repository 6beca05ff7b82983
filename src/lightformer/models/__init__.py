"""Architectures assembled from ``lightformer.nn``: plain PyTorch, usable in any training loop."""

from lightformer.models.gpt import GPT, gpt2_state_dict_to_lightformer, load_gpt2_weights
from lightformer.models.seq2seq import EncoderDecoder
from lightformer.models.vit import VisionTransformer, lightformer_to_timm, load_timm_weights, timm_to_lightformer

__all__ = [
    "EncoderDecoder",
    "GPT",
    "gpt2_state_dict_to_lightformer",
    "load_gpt2_weights",
    "VisionTransformer",
    "lightformer_to_timm",
    "load_timm_weights",
    "timm_to_lightformer",
]
