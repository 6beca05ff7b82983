"""Data modules and tokenizers: files → tokens or pixels → batches. Never imports a model."""

from lightformer.data.classification import TextClassificationDataModule
from lightformer.data.image_tokens import ImageTokenDataModule
from lightformer.data.images import ImageDataModule
from lightformer.data.pretraining import MaskedLMDataModule, SpanCorruptionDataModule
from lightformer.data.text import TextDataModule
from lightformer.data.tokenizers import Tokenizer
from lightformer.data.translation import TranslationDataModule

__all__ = [
    "ImageDataModule",
    "ImageTokenDataModule",
    "MaskedLMDataModule",
    "SpanCorruptionDataModule",
    "TextClassificationDataModule",
    "TextDataModule",
    "Tokenizer",
    "TranslationDataModule",
]
