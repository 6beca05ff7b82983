"""``DataModule``, the one data module every family subclasses (docs/data.md, "The data module")."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
from torch.utils.data import DataLoader, Dataset

from lightformer.data.loading.streaming import LoaderConfig
from lightformer.data.pieces import stage_splits
from lightformer.data.preparation.caching import SameDataOnResume, read_manifest
from lightformer.data.preparation.prepare import TOKENIZER, prepared_folder
from lightformer.facts import DataFacts
from lightformer.tokenization.text import Tokenizer

STAGE_OF = {"train": "fit", "val": "validate", "test": "test"}  # the stage whose set-up opens a split


@dataclass(frozen=True)
class ConfigFacts:
    """What a data module's config alone decides, before any data is prepared (``DataModule.facts_from_config``).

    Args:
        facts: the facts the options fix (None where only the prepared data tells).
        options: for a fact, the options that decide it as a user writes them (``"data.segment_tokens=64"``).
        within: for a fact, the options' values under which it is at most a bound (16 → ``"data.segment_tokens <= 8"``).
    """

    facts: DataFacts = field(default_factory=DataFacts)
    options: Mapping[str, str] = field(default_factory=dict)
    within: Mapping[str, Callable[[int], str]] = field(default_factory=dict)


class DataModule(SameDataOnResume, L.LightningDataModule):
    """A ``LightningDataModule`` that tells its task about the data through ``data_facts`` alone."""

    validates_on_a_subset = False  # whether ``fit`` validates on part of the validation split (``cli.after_fit``)
    validates_in_windows = False  # whether ``data.loader.val_windows`` applies (windows of text)
    counted = ""  # the manifest's entry of each split's records, by split ("": every split holds some)

    def __init__(self) -> None:
        super().__init__()
        self.datasets: dict[str, Dataset] = {}
        self._folder: Path | None = None
        self._manifest: dict | None = None
        self._tokenizers: dict[str, Tokenizer] = {}

    @property
    def prepared(self) -> Path:
        """The prepared folder, prepared on first use (once per job)."""
        if self._folder is None:
            self._folder = prepared_folder(self.prepare_config, self._stem(), self._fingerprint(), self._build)
        return self._folder

    @property
    def manifest(self) -> dict:
        """The prepared folder's ``prepared.json``: the fingerprint and what preparation counted (see each module)."""
        if self._manifest is None:
            self._manifest = read_manifest(self.prepared)
        return self._manifest

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer the records were prepared with (the folder's ``tokenizer.json``)."""
        return self._tokenizer_file(TOKENIZER)

    def _tokenizer_file(self, name: str) -> Tokenizer:
        """The prepared folder's tokenizer file ``name``, read once."""
        if name not in self._tokenizers:
            self._tokenizers[name] = Tokenizer.from_file(self.prepared / name)
        return self._tokenizers[name]

    def _stem(self) -> str:
        """The prepared folder's readable name, before its hash."""
        raise NotImplementedError

    def _fingerprint(self) -> dict:
        """Everything the prepared folder's content depends on."""
        raise NotImplementedError

    def _build(self, folder: Path) -> dict:
        """Prepare ``folder``; returns what goes into the manifest."""
        raise NotImplementedError

    def loader_config(self, loader: LoaderConfig | Mapping[str, Any]) -> LoaderConfig:
        """``data.loader``: a dict (a checkpoint's, or Python's) fills in over this class's own default; windows of
        validation (``val_windows``) are refused where the data is not windows of text."""
        default = inspect.signature(type(self).__init__).parameters["loader"].default
        config = dataclasses.replace(default, **loader) if isinstance(loader, Mapping) else loader
        if config.val_windows is not None and not self.validates_in_windows:
            raise ValueError(f"data.loader.val_windows={config.val_windows} is for windows of text: "
                             f"{type(self).__name__} validates on every example; leave it unset")  # fmt: skip
        return config

    def data_facts(self) -> DataFacts:
        """What the model needs to know about this data, once it is prepared (preparing it on first use)."""
        raise NotImplementedError(f"{type(self).__name__} does not say what its data is (data_facts)")

    @classmethod
    def facts_from_config(cls, init_args: Mapping[str, Any]) -> ConfigFacts:
        """The facts this module's init arguments decide before any data is prepared (docs/data.md); none here."""
        return ConfigFacts()

    def prepare_data(self) -> None:
        self.prepared  # noqa: B018 (prepares on first use)

    def dataset(self, split: str) -> Dataset:
        raise NotImplementedError

    def _dataloader(self, split: str, shuffle: bool = False) -> DataLoader:
        raise NotImplementedError

    def _has(self, split: str) -> bool:
        return not self.counted or bool(self.manifest[self.counted].get(split))

    def setup(self, stage: str | None = None) -> None:
        """Open the datasets of the splits that ``stage`` needs (all for None)."""
        for split in stage_splits(stage):
            if self._has(split):
                self.dataset(split)

    def predict_dataloader(self) -> DataLoader:
        return self.test_dataloader()

    def train_dataloader(self) -> DataLoader:
        return self._dataloader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader | list:
        return self._dataloader("val") if self._has("val") else []

    def test_dataloader(self) -> DataLoader:
        return self._dataloader("test")
