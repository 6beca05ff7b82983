"""Data modules and tokenizers: files → tokens or pixels → batches. Never imports a model."""

from lightformer.data.images import ImageDataModule
from lightformer.data.text import TextDataModule
from lightformer.data.tokenizers import Tokenizer
from lightformer.data.translation import TranslationDataModule

__all__ = ["ImageDataModule", "TextDataModule", "Tokenizer", "TranslationDataModule"]
