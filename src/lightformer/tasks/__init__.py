"""LightningModules: one per objective, each a ``Task`` (shared optimizer and set-up) around a model."""

from lightformer.tasks.base import Task
from lightformer.tasks.contrastive import ContrastiveTask
from lightformer.tasks.denoising import DenoisingTask
from lightformer.tasks.image_classification import ImageClassificationTask
from lightformer.tasks.image_gpt import ImageGPTTask
from lightformer.tasks.image_text import ImageToTextTask
from lightformer.tasks.language_model import LanguageModelTask
from lightformer.tasks.masked_lm import MaskedLanguageModelTask
from lightformer.tasks.optim import OptimizerConfig
from lightformer.tasks.text_classification import TextClassificationTask
from lightformer.tasks.translation import TranslationTask
from lightformer.tasks.vision_language import VisionLanguageTask

__all__ = [
    "ContrastiveTask",
    "DenoisingTask",
    "ImageClassificationTask",
    "ImageGPTTask",
    "ImageToTextTask",
    "LanguageModelTask",
    "MaskedLanguageModelTask",
    "OptimizerConfig",
    "Task",
    "TextClassificationTask",
    "TranslationTask",
    "VisionLanguageTask",
]
