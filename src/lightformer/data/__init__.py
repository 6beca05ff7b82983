"""Data: where examples come from (``sources``), prepared once per job (``preparation``), loaded on every process
(``loading``), each objective's transforms (``objectives``), and the data modules: ``module.DataModule``, one family
per batch shape (``families``), the public names presets of a family and a source. Never imports a model."""

from lightformer.data.families.chat import ConversationFilesDataModule, VisualQADataModule
from lightformer.data.families.image_text import (
    ClipArtDataModule,
    EmojiDataModule,
    ImageTextData,
    ImageTextDataModule,
    ImageTextFilesDataModule,
)
from lightformer.data.families.images import ImageDataModule, ImageTokenDataModule
from lightformer.data.families.labelled import TextClassificationDataModule
from lightformer.data.families.pairs import TranslationDataModule
from lightformer.data.families.text import MaskedLMDataModule, SpanCorruptionDataModule, TextData, TextDataModule
from lightformer.data.module import DataModule
from lightformer.data.sources import Source
from lightformer.tokenization import Tokenizer

__all__ = [
    "ClipArtDataModule",
    "ConversationFilesDataModule",
    "DataModule",
    "EmojiDataModule",
    "ImageDataModule",
    "ImageTextData",
    "ImageTextDataModule",
    "ImageTextFilesDataModule",
    "ImageTokenDataModule",
    "MaskedLMDataModule",
    "Source",
    "SpanCorruptionDataModule",
    "TextClassificationDataModule",
    "TextData",
    "TextDataModule",
    "Tokenizer",
    "TranslationDataModule",
    "VisualQADataModule",
]
