"""Tokenizers: text (characters and byte-level BPE, one JSON format) and pixels (Image GPT's palettes). Below data/,
io/ and facts.py, which all read them; imports nothing of lightformer's but ``errors`` and ``io.files``."""

from lightformer.tokenization.pixels import PixelTokenizer
from lightformer.tokenization.text import Tokenizer

__all__ = ["PixelTokenizer", "Tokenizer"]
