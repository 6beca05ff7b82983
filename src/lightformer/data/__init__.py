"""Data modules and tokenizers: files → tokens or pixels → batches. Never imports a model."""

from lightformer.data.families.images import ImageDataModule, ImageTokenDataModule
from lightformer.data.families.labelled import TextClassificationDataModule
from lightformer.data.families.pairs import TranslationDataModule
from lightformer.data.families.text import MaskedLMDataModule, SpanCorruptionDataModule, TextData, TextDataModule
from lightformer.data.modules.captioned_images import ClipArtDataModule, EmojiDataModule
from lightformer.data.modules.conversation_files import ConversationFilesDataModule
from lightformer.data.modules.image_text import ImageTextDataModule
from lightformer.data.modules.image_text_files import ImageTextFilesDataModule
from lightformer.data.modules.visual_qa import VisualQADataModule
from lightformer.tokenization import Tokenizer

__all__ = [
    "ClipArtDataModule",
    "ConversationFilesDataModule",
    "EmojiDataModule",
    "ImageDataModule",
    "ImageTextDataModule",
    "ImageTextFilesDataModule",
    "ImageTokenDataModule",
    "MaskedLMDataModule",
    "SpanCorruptionDataModule",
    "TextClassificationDataModule",
    "TextData",
    "TextDataModule",
    "Tokenizer",
    "TranslationDataModule",
    "VisualQADataModule",
]
