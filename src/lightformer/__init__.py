"""lightformer: one set of transformer blocks for text, translation and vision, trained with Lightning."""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

# The modules that moved (out of the package root after b1bd12e; the tokenizers out of data/ after 42e7f06), by
# their old names: a config or a script written before (``class_path: lightformer.callbacks.ModelCheckpoint``) still
# imports them, with a warning that gives the new name.
MOVED_MODULES = {
    "lightformer.callbacks": "lightformer.training.callbacks",
    "lightformer.distributed": "lightformer.training.distributed",
    "lightformer.flops": "lightformer.training.flops",
    "lightformer.internals": "lightformer.training.internals",
    "lightformer.peaks": "lightformer.training.peaks",
    "lightformer.progress": "lightformer.training.progress",
    "lightformer.tensorboard": "lightformer.training.tensorboard",
    "lightformer.trainer": "lightformer.training.trainer",
    "lightformer.checkpoints": "lightformer.io.checkpoints",
    "lightformer.files": "lightformer.io.files",
    "lightformer.hf_layouts": "lightformer.io.hf_layouts",
    "lightformer.config_checks": "lightformer.cli.checks",
    "lightformer.runs": "lightformer.cli.runs",
    "lightformer.commands": "lightformer.cli.commands",
    # the tokenizers left data/ for a package of their own, below data/, io/ and facts.py (after 42e7f06)
    "lightformer.data.preparation.tokenizers": "lightformer.tokenization.text",
    "lightformer.data.objectives.pixels": "lightformer.tokenization.pixels",
    # where data comes from: data/raw/ became data/sources/ (its text files' pieces data/pieces.py)
    "lightformer.data.raw": "lightformer.data.sources",
    "lightformer.data.raw.sources": "lightformer.data.pieces",
    "lightformer.data.raw.corpora": "lightformer.data.sources.corpora",
    "lightformer.data.raw.emoji": "lightformer.data.sources.emoji",
    "lightformer.data.raw.image_files": "lightformer.data.sources.image_files",
    "lightformer.data.raw.openclipart": "lightformer.data.sources.openclipart",
    "lightformer.data.raw.rendering": "lightformer.data.sources.rendering",
    # the data modules: one generic module, a family per batch shape, the public names presets of a family
    "lightformer.data.modules": "lightformer.data.families",
    "lightformer.data.modules.base": "lightformer.data.module",
    "lightformer.data.modules.text": "lightformer.data.families.text",
    "lightformer.data.modules.pretraining": "lightformer.data.families.text",
    "lightformer.data.modules.translation": "lightformer.data.families.pairs",
    "lightformer.data.modules.classification": "lightformer.data.families.labelled",
    "lightformer.data.modules.images": "lightformer.data.families.images",
    "lightformer.data.modules.image_tokens": "lightformer.data.families.images",
    "lightformer.data.modules.image_text": "lightformer.data.families.image_text",
    "lightformer.data.modules.image_text_files": "lightformer.data.families.image_text",
    "lightformer.data.modules.captioned_images": "lightformer.data.families.image_text",
    "lightformer.data.modules.chat_records": "lightformer.data.families.chat",
    "lightformer.data.modules.conversation_files": "lightformer.data.families.chat",
    "lightformer.data.modules.visual_qa": "lightformer.data.families.chat",
}


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a module of ``MOVED_MODULES`` by its old name as the module of its new name, warning once."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED_MODULES else None

    def create_module(self, spec):
        new = MOVED_MODULES[spec.name]
        warnings.warn(f"{spec.name} is now {new}: use that name (the old one will go)", FutureWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module) -> None:
        """The new module ran already, when it was imported under its own name."""


# First of the finders: an old name inside a package that still exists under it (``lightformer.data.raw.corpora`` once
# ``lightformer.data.raw`` is the sources package) would otherwise load the module a second time under the old name.
if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, MovedModuleFinder())
