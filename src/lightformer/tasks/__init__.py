"""LightningModules: one per objective, each a ``Task`` (shared optimizer and set-up) around a model."""

from lightformer.tasks.base import Task
from lightformer.tasks.image_classification import ImageClassificationTask
from lightformer.tasks.language_model import LanguageModelTask
from lightformer.tasks.optim import OptimizerConfig
from lightformer.tasks.translation import TranslationTask

__all__ = ["ImageClassificationTask", "LanguageModelTask", "OptimizerConfig", "Task", "TranslationTask"]
