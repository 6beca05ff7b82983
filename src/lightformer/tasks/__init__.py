"""LightningModules: loss, metrics, optimisation and logging for each task."""

from lightformer.tasks.image_classification import ImageClassificationTask
from lightformer.tasks.language_model import LanguageModelTask
from lightformer.tasks.translation import TranslationTask

__all__ = ["ImageClassificationTask", "LanguageModelTask", "TranslationTask"]
